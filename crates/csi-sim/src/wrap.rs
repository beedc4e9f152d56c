//! mount-utils' seams over the world's fakes: every effect is a step that
//! the plan may fail or crash; queries pass through.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use mount_utils::{
    AttachedLoop, DeviceNumber, Errno, Exec, ExecError, ExecOutput, FsUsage, LoopDeviceInfo,
    LoopDevices, LoopError, LoopOptions, MountError, MountInfo, MountSource, Mounter,
    RedactedOptions, Sensitive,
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
    fn mount_sensitive(
        &self,
        source: &str,
        target: &Path,
        fstype: &str,
        options: &[&str],
        sensitive_options: &[Sensitive],
    ) -> Result<(), MountError> {
        self.step(Effect::Mount, target)
            .map_err(|e| mount_failed(source, target, fstype, e))?;
        self.mounter()
            .mount_sensitive(source, target, fstype, options, sensitive_options)
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
