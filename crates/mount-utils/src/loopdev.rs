//! Loop devices with raw ioctls (no libclang, no `losetup`).
//!
//! [`LoopDevices`] is the seam drivers hold (`Arc<dyn LoopDevices>`):
//! [`LinuxLoopDevices`] in production, `FakeLoopDevices` (feature `testing`)
//! in unit tests. [`LoopDevice`] is the handle-based API underneath.
//! The kernel structures from `<linux/loop.h>` are defined here by hand.
//!
//! ```
//! use std::{path::Path, sync::Arc};
//! use mount_utils::{FakeLoopDevices, LoopDevices, LoopOptions};
//!
//! let fake = Arc::new(FakeLoopDevices::new());
//! fake.set_backing_file("/images/a.img", 1 << 20);
//! let loops: Arc<dyn LoopDevices> = fake.clone();
//! let dev = loops.attach(Path::new("/images/a.img"), &LoopOptions::default()).unwrap();
//! assert_eq!(dev.path(), Path::new("/dev/loop0"));
//! let info = dev.keep(); // leave it attached (a mount will hold it)
//! assert_eq!(loops.find_by_backing_file(Path::new("/images/a.img")).unwrap(), vec![info.path.clone()]);
//! loops.detach(&info.path).unwrap();
//! assert!(loops.info(&info.path).unwrap().is_none());
//! ```

mod abi;
mod attach;
mod device;
mod find;
mod seam;

pub use device::{LoopDevice, detach};
pub use find::find_by_backing_file;
pub use seam::{AttachedLoop, LinuxLoopDevices, LoopDevices};

use std::path::PathBuf;

use nix::errno::Errno;

use crate::block::DeviceNumber;

/// A loop device operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LoopError {
    /// Opening the backing file failed.
    #[error("open backing file {path:?}: {errno}")]
    BackingFile {
        /// Backing file.
        path: PathBuf,
        /// Kernel error.
        errno: Errno,
    },
    /// Opening `/dev/loop-control` or a loop device failed.
    #[error("open {path:?}: {errno}")]
    Open {
        /// Device path.
        path: PathBuf,
        /// Kernel error.
        errno: Errno,
    },
    /// An ioctl on a loop device failed.
    #[error("{op} on {path:?}: {errno}")]
    Ioctl {
        /// The ioctl (for example `LOOP_CONFIGURE`).
        op: &'static str,
        /// Device path.
        path: PathBuf,
        /// Kernel error.
        errno: Errno,
    },
    /// Every free device was taken by someone else before we could bind it.
    #[error("no free loop device after {attempts} attempts")]
    NoFreeDevice {
        /// Attempts made.
        attempts: u32,
    },
    /// Reading `/sys/block` failed.
    #[error("read {path:?}: {errno}")]
    Sysfs {
        /// The sysfs path.
        path: PathBuf,
        /// Kernel error.
        errno: Errno,
    },
}

impl LoopError {
    /// The kernel error, if any.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            LoopError::BackingFile { errno, .. }
            | LoopError::Open { errno, .. }
            | LoopError::Ioctl { errno, .. }
            | LoopError::Sysfs { errno, .. } => Some(*errno),
            LoopError::NoFreeDevice { .. } => None,
        }
    }
}

/// Options for [`LoopDevice::attach`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopOptions {
    /// Attach read-only.
    pub read_only: bool,
    /// Let the kernel detach the device when its last user closes it
    /// (`LO_FLAGS_AUTOCLEAR`). Default `true`, so a crashed process leaks
    /// nothing once its mounts are gone.
    pub autoclear: bool,
    /// Bypass the page cache of the backing file (`LO_FLAGS_DIRECT_IO`).
    pub direct_io: bool,
    /// Scan for partitions (`LO_FLAGS_PARTSCAN`).
    pub partscan: bool,
    /// Logical block size; 0 for the kernel default (512).
    pub block_size: u32,
    /// Skip `LOOP_CONFIGURE` and use the pre-5.8 `LOOP_SET_FD` +
    /// `LOOP_SET_STATUS64` sequence (to exercise the fallback path).
    pub legacy_ioctls: bool,
}

impl Default for LoopOptions {
    fn default() -> Self {
        LoopOptions {
            read_only: false,
            autoclear: true,
            direct_io: false,
            partscan: false,
            block_size: 0,
            legacy_ioctls: false,
        }
    }
}

/// What is known about an attached loop device ([`LoopDevices::info`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopDeviceInfo {
    /// Device path, for example `/dev/loop3`.
    pub path: PathBuf,
    /// N of `/dev/loopN`.
    pub number: u32,
    /// The device's `st_rdev`: what mountinfo shows for a filesystem on it
    /// ([`MountSource::Device`](crate::MountSource::Device)).
    pub device: DeviceNumber,
    /// The backing file.
    pub backing_file: PathBuf,
    /// Current size in bytes.
    pub size: u64,
    /// Attached read-only.
    pub read_only: bool,
    /// Detached by the kernel when its last user goes.
    pub autoclear: bool,
    /// Direct I/O to the backing file.
    pub direct_io: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_autoclear() {
        let o = LoopOptions::default();
        assert!(o.autoclear && !o.read_only && !o.direct_io);
    }
}
