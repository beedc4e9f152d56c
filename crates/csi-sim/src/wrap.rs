//! mount-utils' seams over the world's fakes: every effect is a step that
//! the plan may fail or crash; queries pass through.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mount_utils::{
    AttachedLoop, BlockDevices, DeviceNumber, Errno, Exec, ExecError, ExecOutput, FsUsage,
    LoopDeviceInfo, LoopDevices, LoopError, LoopOptions, MountArgs, MountError, MountInfo,
    MountSource, Mounter, RedactedOptions,
};

use crate::world::{Effect, World};

/// The world's mount table as one driver process sees it.
pub struct SimMounter {
    world: World,
    generation: u64,
}

impl SimMounter {
    /// For the world's current process.
    pub fn new(world: &World) -> Self {
        SimMounter {
            world: world.clone(),
            generation: world.generation(),
        }
    }

    fn step(&self, effect: Effect, what: &Path) -> Result<(), Errno> {
        self.world
            .step(self.generation, effect, &what.display().to_string())
    }

    fn mounter(&self) -> &dyn Mounter {
        &**self.world.mounter()
    }
}

fn mount_failed(source: &str, target: &Path, fstype: &str, errno: Errno) -> MountError {
    MountError::Mount {
        device: source.to_owned(),
        target: target.to_owned(),
        fstype: fstype.to_owned(),
        options: RedactedOptions::new::<&str>(&[], &[]),
        errno,
    }
}

impl Mounter for SimMounter {
    fn mount_with(&self, args: &MountArgs<'_>) -> Result<(), MountError> {
        self.step(Effect::Mount, args.target)
            .map_err(|e| mount_failed(args.source, args.target, args.fstype, e))?;
        self.mounter().mount_with(args)
    }

    fn bind_mount(&self, source: &Path, target: &Path, read_only: bool) -> Result<(), MountError> {
        self.step(Effect::Mount, target)
            .map_err(|e| mount_failed(&source.to_string_lossy(), target, "", e))?;
        self.mounter().bind_mount(source, target, read_only)
    }

    fn remount(&self, target: &Path, options: &[&str]) -> Result<(), MountError> {
        self.step(Effect::Mount, target)
            .map_err(|errno| MountError::Remount {
                target: target.to_owned(),
                options: RedactedOptions::new(options, &[]),
                errno,
            })?;
        self.mounter().remount(target, options)
    }

    fn unmount(&self, target: &Path, lazy: bool) -> Result<(), MountError> {
        self.step(Effect::Unmount, target)
            .map_err(|errno| MountError::Unmount {
                target: target.to_owned(),
                errno,
            })?;
        self.mounter().unmount(target, lazy)
    }

    fn mount_points(&self) -> Result<Vec<MountInfo>, MountError> {
        self.mounter().mount_points()
    }

    fn mount_points_where(
        &self,
        keep: &dyn Fn(u32, DeviceNumber) -> bool,
    ) -> Result<Vec<MountInfo>, MountError> {
        self.mounter().mount_points_where(keep)
    }

    fn mounted_at(&self, path: &Path) -> Result<Option<MountInfo>, MountError> {
        self.mounter().mounted_at(path)
    }

    fn block_device_at(&self, path: &Path) -> Result<Option<DeviceNumber>, MountError> {
        self.mounter().block_device_at(path)
    }

    fn bind_source(&self, source: &Path) -> Result<MountSource, MountError> {
        self.mounter().bind_source(source)
    }

    fn is_mount_point(&self, path: &Path) -> Result<bool, MountError> {
        self.mounter().is_mount_point(path)
    }

    fn is_likely_not_mount_point(&self, path: &Path) -> Result<bool, MountError> {
        self.mounter().is_likely_not_mount_point(path)
    }

    fn mount_refs(&self, path: &Path) -> Result<Vec<PathBuf>, MountError> {
        self.mounter().mount_refs(path)
    }

    fn cleanup_mount_point(&self, path: &Path) -> Result<(), MountError> {
        // Unmounts through this wrapper, so each is a step.
        self.unmount_all(path)?;
        self.remove_mount_point(path)
    }

    fn remove_mount_point(&self, path: &Path) -> Result<(), MountError> {
        self.mounter().remove_mount_point(path)
    }

    fn fs_usage(&self, path: &Path) -> Result<FsUsage, MountError> {
        self.mounter().fs_usage(path)
    }
}

/// The world's loop devices as one driver process sees them.
pub struct SimLoops {
    world: World,
    generation: u64,
}

impl SimLoops {
    /// For the world's current process.
    pub fn new(world: &World) -> Self {
        SimLoops {
            world: world.clone(),
            generation: world.generation(),
        }
    }

    fn step(&self, what: &Path, op: &'static str) -> Result<(), LoopError> {
        self.world
            .step(self.generation, Effect::Loop, &what.display().to_string())
            .map_err(|errno| LoopError::Ioctl {
                op,
                path: what.to_owned(),
                errno,
            })
    }
}

impl LoopDevices for SimLoops {
    fn attach(
        &self,
        backing_file: &Path,
        options: &LoopOptions,
    ) -> Result<AttachedLoop, LoopError> {
        self.step(backing_file, "attach")?;
        let attached = self.world.loops().attach(backing_file, options)?;
        // Detaching on drop is an effect too: through this wrapper.
        let info: LoopDeviceInfo = attached.keep();
        let (world, generation) = (self.world.clone(), self.generation);
        let path = info.path.clone();
        Ok(AttachedLoop::new(info, move |detach| {
            if detach {
                SimLoops { world, generation }.detach(&path)
            } else {
                Ok(())
            }
        }))
    }

    fn find_by_backing_file(&self, backing_file: &Path) -> Result<Vec<PathBuf>, LoopError> {
        self.world.loops().find_by_backing_file(backing_file)
    }

    fn attached(&self) -> Result<Vec<LoopDeviceInfo>, LoopError> {
        // The fake's own `attached` cannot fail; the seam's honours its
        // injected errors.
        LoopDevices::attached(self.world.loops().as_ref())
    }

    fn info(&self, device: &Path) -> Result<Option<LoopDeviceInfo>, LoopError> {
        self.world.loops().info(device)
    }

    fn set_capacity(&self, device: &Path) -> Result<u64, LoopError> {
        self.step(device, "set capacity")?;
        self.world.loops().set_capacity(device)
    }

    fn detach(&self, device: &Path) -> Result<(), LoopError> {
        self.step(device, "detach")?;
        self.world.loops().detach(device)
    }
}

/// Commands run through `inner`, each a step.
pub struct SimExec {
    world: World,
    generation: u64,
    inner: Arc<dyn Exec>,
}

impl SimExec {
    /// `inner` (usually mount-utils' `FakeExec`) for the world's current process.
    pub fn new(world: &World, inner: Arc<dyn Exec>) -> Self {
        SimExec {
            world: world.clone(),
            generation: world.generation(),
            inner,
        }
    }
}

impl Exec for SimExec {
    fn run(&self, program: &str, args: &[&str]) -> Result<ExecOutput, ExecError> {
        self.world
            .step(self.generation, Effect::Exec, program)
            .map_err(|errno| ExecError::Io {
                program: program.to_owned(),
                message: errno.desc().to_owned(),
            })?;
        self.inner.run(program, args)
    }
}

/// The filesystems on the world's disks (a loop device's backing file, or
/// a provider's device by its path): their type and size. Kept outside
/// the driver, as a disk keeps its filesystem across a crash.
#[derive(Debug, Default)]
struct Filesystems(Mutex<BTreeMap<PathBuf, (String, u64)>>);

/// The filesystem tools a node runs (`blkid`, `mkfs.*`, `e2fsck`,
/// `dumpe2fs`, `resize2fs`) over the world's disks; wrap it in
/// [`SimExec`] so that each run is a step. A disk is what a loop device
/// is attached to, or a device a provider attached.
pub struct SimFsTools {
    world: World,
}

impl SimFsTools {
    /// The tools over `world`'s disks.
    pub fn new(world: &World) -> Self {
        SimFsTools {
            world: world.clone(),
        }
    }

    /// The disk behind `device`.
    fn disk(&self, device: &Path) -> PathBuf {
        match self.world.loops().info(device) {
            Ok(Some(info)) => info.backing_file,
            _ => device.to_owned(),
        }
    }

    /// The size of `device` now (what `ResizeFs` compares with its
    /// filesystem's size), from the loop devices or the provider's devices.
    pub fn device_size(&self, device: &str) -> std::io::Result<u64> {
        let path = Path::new(device);
        if let Ok(Some(info)) = self.world.loops().info(path) {
            return Ok(info.size);
        }
        match self.world.block_devices().find(path) {
            Ok(Some(found)) => Ok(found.size),
            _ => Err(std::io::Error::from_raw_os_error(Errno::ENOENT as i32)),
        }
    }

    fn filesystems(&self) -> Arc<Filesystems> {
        self.world.kept::<Filesystems>()
    }
}

/// ext4's block size, as the tools report it.
const BLOCK_SIZE: u64 = 4096;

impl Exec for SimFsTools {
    fn run(&self, program: &str, args: &[&str]) -> Result<ExecOutput, ExecError> {
        let device = args.last().copied().unwrap_or_default();
        let disk = self.disk(Path::new(device));
        let kept = self.filesystems();
        let mut filesystems = kept.0.lock().unwrap_or_else(|e| e.into_inner());
        let on_disk = filesystems.get(&disk).cloned();
        Ok(match (program, on_disk) {
            ("blkid", None) => ExecOutput::exit(2, ""),
            ("blkid", Some((fs, _))) => ExecOutput::ok(format!("TYPE={fs}\n")),
            ("e2fsck", Some(_)) => ExecOutput::ok(""),
            ("dumpe2fs", Some((_, size))) => ExecOutput::ok(format!(
                "Block count:              {}\nBlock size:               {BLOCK_SIZE}\n",
                size / BLOCK_SIZE
            )),
            ("resize2fs", Some((fs, _))) => {
                let size = self.device_size(device).unwrap_or(0);
                filesystems.insert(disk, (fs, size));
                ExecOutput::ok("")
            }
            (mkfs, _) if mkfs.starts_with("mkfs.") => {
                let size = self.device_size(device).unwrap_or(0);
                filesystems.insert(disk, (mkfs["mkfs.".len()..].to_owned(), size));
                ExecOutput::ok("")
            }
            ("e2fsck" | "dumpe2fs" | "resize2fs", None) => {
                ExecOutput::exit(8, format!("{device}: no filesystem"))
            }
            _ => {
                return Err(ExecError::NotFound {
                    program: program.to_owned(),
                });
            }
        })
    }
}

/// volume-state's clock over the world: time moves only when someone
/// sleeps, and each sleep is a step.
#[derive(Debug, Clone)]
pub struct SimClock {
    world: World,
    generation: u64,
    start: Instant,
    elapsed: Arc<Mutex<Duration>>,
}

impl SimClock {
    /// A clock at zero for the world's current process.
    pub fn new(world: &World) -> Self {
        SimClock {
            world: world.clone(),
            generation: world.generation(),
            start: Instant::now(),
            elapsed: Arc::default(),
        }
    }

    /// Moves time on by `d`; `Err` when the plan fails or crashes this step.
    pub fn sleep(&self, d: Duration) -> Result<(), Errno> {
        self.world
            .step(self.generation, Effect::Sleep, &format!("{d:?}"))?;
        *self.elapsed.lock().unwrap_or_else(|e| e.into_inner()) += d;
        Ok(())
    }
}

impl volume_state::Clock for SimClock {
    fn now(&self) -> Instant {
        self.start + *self.elapsed.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::world::SimFault;
    use volume_state::Clock;

    #[test]
    fn every_effect_is_a_step_and_the_planned_one_fails_alone() {
        let world = World::new(Some((1, SimFault::Fail(Errno::EBUSY)))).unwrap();
        let m = SimMounter::new(&world);
        let target = world.host_dir().join("t");
        m.bind_mount(&world.host_dir(), &target, false).unwrap();
        let e = m.unmount(&target, false).unwrap_err();
        assert!(
            matches!(
                e,
                MountError::Unmount {
                    errno: Errno::EBUSY,
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            m.mounted_at(&target).unwrap().is_some(),
            "a failed unmount changes nothing"
        );
        m.unmount(&target, false).unwrap();
        let clock = SimClock::new(&world);
        let t0 = clock.now();
        clock.sleep(Duration::from_secs(5)).unwrap();
        assert_eq!(clock.now() - t0, Duration::from_secs(5));
        assert_eq!(world.steps(), 4);
        assert_eq!(world.fired(), Some(SimFault::Fail(Errno::EBUSY)));
    }

    #[test]
    fn after_a_crash_the_old_process_changes_nothing_and_mounts_stay() {
        let world = World::new(Some((1, SimFault::Crash))).unwrap();
        let m = SimMounter::new(&world);
        let loops = SimLoops::new(&world);
        let target = world.host_dir().join("t");
        m.bind_mount(&world.host_dir(), &target, true).unwrap();
        let image = world.host_dir().join("disk.img");
        std::fs::write(&image, b"").unwrap();
        assert!(loops.attach(&image, &LoopOptions::default()).is_err());
        assert!(world.crashed());
        assert!(m.unmount(&target, false).is_err(), "the dead process");
        world.restart();
        assert!(!world.crashed());
        let m2 = SimMounter::new(&world);
        assert!(
            m2.mounted_at(&target).unwrap().is_some(),
            "mounts outlive the crash"
        );
        assert!(m.unmount(&target, false).is_err(), "still dead");
        let dev = loops.attach(&image, &LoopOptions::default());
        assert!(dev.is_err(), "the dead process attaches nothing");
        let dev = SimLoops::new(&world)
            .attach(&image, &LoopOptions::default())
            .unwrap()
            .keep();
        assert_eq!(world.loops().attached().len(), 1);
        SimLoops::new(&world).detach(&dev.path).unwrap();
        m2.unmount(&target, false).unwrap();
        assert!(world.loops().attached().is_empty());
    }

    #[test]
    fn faults_read_back_from_their_names() {
        for f in crate::world::FAULTS {
            assert_eq!(f.to_string().parse::<SimFault>().unwrap(), f);
        }
        assert!("sigkill".parse::<SimFault>().is_err());
    }
}
