//! A fake node for drivers' unit tests, runnable without root:
//! [`FakeHost`], mount-utils' `FakeMounter` with `/` mounted (so a bind of
//! any directory shows in mountinfo as it would on Linux: the root
//! filesystem's device and the directory as root) and its
//! `FakeLoopDevices` (devices `7:N`, which `FakeMounter` shows for a
//! filesystem mounted from `/dev/loopN`).
//!
//! ```
//! use csi_node::testing::FakeHost;
//! use mount_utils::{LoopDevices, LoopOptions, Mounter};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let image = dir.path().join("disk.img");
//! std::fs::write(&image, b"").unwrap();
//! let host = FakeHost::new();
//! let dev = host.loops().attach(&image, &LoopOptions::default()).unwrap().keep();
//! host.mount(&dev.path.to_string_lossy(), &dir.path().join("mnt"), "ext4", &[]).unwrap();
//! let entry = host.mount_points().unwrap().pop().unwrap();
//! assert_eq!((entry.major, entry.minor), (dev.device.major, dev.device.minor));
//! ```

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mount_utils::{FakeLoopAction, FakeLoopDevices, FakeMounter, MountInfo, Mounter};

use crate::observe::normalize;

/// A fake node: a [`FakeMounter`] with `/` mounted and [`FakeLoopDevices`].
/// Derefs to the mounter; [`mounter`](Self::mounter) and
/// [`loops`](Self::loops) hand them to the code under test.
#[derive(Debug, Clone)]
pub struct FakeHost {
    mounter: Arc<FakeMounter>,
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
            mounter: Arc::new(mounter),
            loops: Arc::new(FakeLoopDevices::new()),
        }
    }

    /// The mounter, for the code under test.
    pub fn mounter(&self) -> Arc<dyn Mounter> {
        self.mounter.clone()
    }

    /// The underlying fake, for its action log and error injection.
    pub fn fake(&self) -> &FakeMounter {
        &self.mounter
    }

    /// The loop devices.
    pub fn loops(&self) -> Arc<FakeLoopDevices> {
        self.loops.clone()
    }

    /// How many loop devices are attached.
    pub fn attached(&self) -> usize {
        self.loops.attached().len()
    }

    /// The loop devices detached so far, oldest first.
    pub fn detached(&self) -> Vec<PathBuf> {
        self.loops
            .actions()
            .into_iter()
            .filter_map(|a| match a {
                FakeLoopAction::Detach { device } => Some(device),
                _ => None,
            })
            .collect()
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

impl Deref for FakeHost {
    type Target = FakeMounter;

    fn deref(&self) -> &FakeMounter {
        &self.mounter
    }
}
