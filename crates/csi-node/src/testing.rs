//! Fakes for drivers' unit tests, runnable without root: [`FakeHost`]
//! (mount-utils' `FakeMounter` with loop devices that have real-looking
//! device numbers) and [`FakeLoopDevices`].
//!
//! ```
//! use std::sync::Arc;
//! use csi_node::testing::FakeHost;
//! use csi_node::LoopDevices;
//! use mount_utils::Mounter;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let image = dir.path().join("disk.img");
//! std::fs::write(&image, b"").unwrap();
//! let host = Arc::new(FakeHost::new());
//! let dev = host.loops().attach(&image).unwrap();
//! host.mount(&dev.path.to_string_lossy(), &dir.path().join("mnt"), "ext4", &[]).unwrap();
//! let entry = host.mount_points().unwrap().pop().unwrap();
//! assert_eq!((entry.major, entry.minor), (dev.major, dev.minor));
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use mount_utils::{Errno, FakeMounter, MountError, MountInfo, Mounter, Sensitive};

use crate::error::NodeError;
use crate::observe::normalize;
use crate::record::Device;
use crate::seams::LoopDevices;

/// The major number of loop devices.
const LOOP_MAJOR: u32 = 7;

/// In-memory [`LoopDevices`]: `/dev/loopN` with device number `7:N`.
#[derive(Debug, Default)]
pub struct FakeLoopDevices {
    state: Mutex<LoopState>,
}

#[derive(Debug, Default)]
struct LoopState {
    attached: BTreeMap<u32, PathBuf>,
    fail_attach: bool,
    detached: Vec<PathBuf>,
}

impl FakeLoopDevices {
    /// No devices attached.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, LoopState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn device(n: u32) -> Device {
        Device {
            path: PathBuf::from(format!("/dev/loop{n}")),
            major: LOOP_MAJOR,
            minor: n,
        }
    }

    /// Devices attached now, with their backing files.
    pub fn attached(&self) -> Vec<(Device, PathBuf)> {
        self.lock()
            .attached
            .iter()
            .map(|(n, f)| (Self::device(*n), f.clone()))
            .collect()
    }

    /// Devices detached so far, oldest first.
    pub fn detached(&self) -> Vec<PathBuf> {
        self.lock().detached.clone()
    }

    /// Makes [`LoopDevices::attach`] fail (no free device) until called
    /// with `false`.
    pub fn fail_attach(&self, fail: bool) {
        self.lock().fail_attach = fail;
    }

    /// The device number of a fake device node, if it is one of ours.
    pub fn number_of(&self, path: &str) -> Option<(u32, u32)> {
        let n: u32 = path.strip_prefix("/dev/loop")?.parse().ok()?;
        Some((LOOP_MAJOR, n))
    }
}

impl LoopDevices for FakeLoopDevices {
    fn attach(&self, backing_file: &Path) -> Result<Device, NodeError> {
        let mut st = self.lock();
        let fail = |errno| NodeError::Loop {
            action: "attaching",
            path: backing_file.to_path_buf(),
            errno: Some(errno),
        };
        if st.fail_attach {
            return Err(fail(Errno::EBUSY));
        }
        if !backing_file.is_file() {
            return Err(fail(Errno::ENOENT));
        }
        let n = (0..).find(|n| !st.attached.contains_key(n)).unwrap_or(0);
        st.attached.insert(n, normalize(backing_file));
        Ok(Self::device(n))
    }

    fn find(&self, backing_file: &Path) -> Result<Vec<Device>, NodeError> {
        let wanted = normalize(backing_file);
        Ok(self
            .lock()
            .attached
            .iter()
            .filter(|(_, f)| **f == wanted)
            .map(|(n, _)| Self::device(*n))
            .collect())
    }

    fn detach(&self, device: &Device) -> Result<(), NodeError> {
        let mut st = self.lock();
        if st.attached.remove(&device.minor).is_some() {
            st.detached.push(device.path.clone());
        }
        Ok(())
    }
}

/// A fake node: mount-utils' [`FakeMounter`] with `/` mounted (so bind
/// mounts resolve like the kernel's) and [`FakeLoopDevices`] whose device
/// numbers show up in the mount table as they would on Linux. Use it as the
/// driver's `Arc<dyn Mounter>` and loop devices.
#[derive(Debug)]
pub struct FakeHost {
    mounter: FakeMounter,
    loops: Arc<FakeLoopDevices>,
}

impl Default for FakeHost {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeHost {
    /// A host with only `/` mounted and no loop devices.
    pub fn new() -> Self {
        let mounter = FakeMounter::new();
        mounter.add_mount("/dev/root", "/", "ext4");
        Self {
            mounter,
            loops: Arc::new(FakeLoopDevices::new()),
        }
    }

    /// The underlying fake, for its action log and error injection.
    pub fn fake(&self) -> &FakeMounter {
        &self.mounter
    }

    /// The loop devices.
    pub fn loops(&self) -> Arc<FakeLoopDevices> {
        self.loops.clone()
    }

    /// Mount points other than `/`.
    pub fn mounted(&self) -> Vec<PathBuf> {
        self.mount_points()
            .unwrap_or_default()
            .into_iter()
            .map(|m| m.mount_point)
            .filter(|p| p != Path::new("/"))
            .collect()
    }

    /// The mounts at `path`, bottom first.
    pub fn mounts_at(&self, path: &Path) -> Vec<MountInfo> {
        let path = normalize(path);
        self.mount_points()
            .unwrap_or_default()
            .into_iter()
            .filter(|m| m.mount_point == path)
            .collect()
    }
}

impl Mounter for FakeHost {
    fn mount_sensitive(
        &self,
        source: &str,
        target: &Path,
        fstype: &str,
        options: &[&str],
        sensitive_options: &[Sensitive],
    ) -> Result<(), MountError> {
        self.mounter
            .mount_sensitive(source, target, fstype, options, sensitive_options)
    }

    fn bind_mount(&self, source: &Path, target: &Path, read_only: bool) -> Result<(), MountError> {
        self.mounter.bind_mount(source, target, read_only)
    }

    fn unmount(&self, target: &Path, lazy: bool) -> Result<(), MountError> {
        self.mounter.unmount(target, lazy)
    }

    fn mount_points(&self) -> Result<Vec<MountInfo>, MountError> {
        let mut table = self.mounter.mount_points()?;
        for m in &mut table {
            if let Some((major, minor)) = self.loops.number_of(&m.source) {
                (m.major, m.minor) = (major, minor);
            }
        }
        Ok(table)
    }

    fn is_mount_point(&self, path: &Path) -> Result<bool, MountError> {
        self.mounter.is_mount_point(path)
    }

    fn is_likely_not_mount_point(&self, path: &Path) -> Result<bool, MountError> {
        self.mounter.is_likely_not_mount_point(path)
    }

    fn mount_refs(&self, path: &Path) -> Result<Vec<PathBuf>, MountError> {
        self.mounter.mount_refs(path)
    }

    fn cleanup_mount_point(&self, path: &Path) -> Result<(), MountError> {
        self.mounter.cleanup_mount_point(path)
    }
}
