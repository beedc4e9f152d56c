//! [`LoopDevice`]: a handle on an attached device, its queries and detach.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;

use super::abi::*;
use super::attach::open_err;
use super::find::backing_file_of;
use super::{LoopDeviceInfo, LoopError};
use crate::block::DeviceNumber;

/// An attached loop device.
///
/// Dropping the handle detaches the device (`LOOP_CLR_FD`). The kernel
/// defers that while the device is still in use, for example mounted, and
/// detaches it on last close, so dropping the handle of a mounted device is
/// safe. Call [`LoopDevice::keep`] to leave it attached.
///
/// ```no_run
/// use mount_utils::{LoopDevice, LoopOptions};
/// let dev = LoopDevice::attach("/var/lib/images/disk.img", &LoopOptions::default()).unwrap();
/// println!("attached at {}", dev.path().display());
/// dev.detach().unwrap();
/// ```
#[derive(Debug)]
pub struct LoopDevice {
    pub(super) number: u32,
    pub(super) path: PathBuf,
    pub(super) file: File,
    pub(super) detach_on_drop: bool,
}

impl LoopDevice {
    /// Opens an existing loop device (for example found with
    /// [`find_by_backing_file`](super::find_by_backing_file)). The handle does not detach on drop.
    pub fn open(path: impl AsRef<Path>) -> Result<LoopDevice, LoopError> {
        let path = path.as_ref().to_path_buf();
        let number = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("loop"))
            .and_then(|n| n.parse().ok())
            .ok_or(LoopError::Open {
                path: path.clone(),
                errno: Errno::EINVAL,
            })?;
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| open_err(&path, &e))?;
        Ok(LoopDevice {
            number,
            path,
            file,
            detach_on_drop: false,
        })
    }

    /// Device path, for example `/dev/loop3`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Device number N of `/dev/loopN`.
    pub fn number(&self) -> u32 {
        self.number
    }

    /// Current size in bytes (`BLKGETSIZE64`).
    pub fn size(&self) -> Result<u64, LoopError> {
        crate::block::device_size_fd(&self.file).map_err(|e| LoopError::Ioctl {
            op: "BLKGETSIZE64",
            path: self.path.clone(),
            errno: crate::error::io_errno(&e),
        })
    }

    /// The backing file, from sysfs; `None` once detached.
    pub fn backing_file(&self) -> Result<Option<PathBuf>, LoopError> {
        backing_file_of(self.number)
    }

    /// The device's `loop_info64`.
    fn status(&self) -> Result<LoopInfo64, LoopError> {
        let mut info = LoopInfo64::zeroed();
        // SAFETY: valid fd and a correctly sized loop_info64 out-parameter.
        unsafe { ioctls::loop_get_status64(self.file.as_raw_fd(), &mut info) }.map_err(
            |errno| LoopError::Ioctl {
                op: "LOOP_GET_STATUS64",
                path: self.path.clone(),
                errno,
            },
        )?;
        Ok(info)
    }

    /// The `LO_FLAGS_*` the device currently has.
    fn flags(&self) -> Result<u32, LoopError> {
        Ok(self.status()?.lo_flags)
    }

    /// Everything about the device at once; fails (`ENXIO`) once detached.
    pub fn info(&self) -> Result<LoopDeviceInfo, LoopError> {
        let status = self.status()?;
        let rdev = nix::sys::stat::fstat(&self.file)
            .map_err(|errno| LoopError::Open {
                path: self.path.clone(),
                errno,
            })?
            .st_rdev;
        let backing_file = match self.backing_file()? {
            Some(b) => b,
            // sysfs hidden (some containers): the kernel's copy, at most 63 bytes.
            None => {
                let n = status.lo_file_name.iter().position(|&b| b == 0);
                let name = &status.lo_file_name[..n.unwrap_or(LO_NAME_SIZE)];
                PathBuf::from(OsString::from_vec(name.to_vec()))
            }
        };
        Ok(LoopDeviceInfo {
            path: self.path.clone(),
            number: self.number,
            device: DeviceNumber::from_dev_t(rdev),
            backing_file,
            size: self.size()?,
            read_only: status.lo_flags & LO_FLAGS_READ_ONLY != 0,
            autoclear: status.lo_flags & LO_FLAGS_AUTOCLEAR != 0,
            direct_io: status.lo_flags & LO_FLAGS_DIRECT_IO != 0,
        })
    }

    /// Whether autoclear is set.
    pub fn is_autoclear(&self) -> Result<bool, LoopError> {
        Ok(self.flags()? & LO_FLAGS_AUTOCLEAR != 0)
    }

    /// Whether the device is read-only.
    pub fn is_read_only(&self) -> Result<bool, LoopError> {
        Ok(self.flags()? & LO_FLAGS_READ_ONLY != 0)
    }

    /// Whether direct I/O is in effect.
    pub fn is_direct_io(&self) -> Result<bool, LoopError> {
        Ok(self.flags()? & LO_FLAGS_DIRECT_IO != 0)
    }

    /// Re-reads the backing file's size after it grew (`LOOP_SET_CAPACITY`).
    pub fn set_capacity(&self) -> Result<(), LoopError> {
        // SAFETY: LOOP_SET_CAPACITY takes no argument.
        unsafe { ioctls::loop_set_capacity(self.file.as_raw_fd()) }.map_err(|errno| {
            LoopError::Ioctl {
                op: "LOOP_SET_CAPACITY",
                path: self.path.clone(),
                errno,
            }
        })?;
        Ok(())
    }

    /// Detaches now, or when its last user closes it if it is busy.
    pub fn detach(mut self) -> Result<(), LoopError> {
        self.detach_on_drop = false;
        clear_fd(&self.file, &self.path)
    }

    /// Leaves the device attached and returns its path. With autoclear it
    /// still goes away once nothing (no mount, no open file) uses it.
    pub fn keep(mut self) -> PathBuf {
        self.detach_on_drop = false;
        self.path.clone()
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        if self.detach_on_drop
            && let Err(e) = clear_fd(&self.file, &self.path)
        {
            tracing::warn!(error = %e, "detaching loop device on drop");
        }
    }
}

/// Detaches the loop device at `path` (deferred while it is in use).
/// A device that is not attached is success.
pub fn detach(path: impl AsRef<Path>) -> Result<(), LoopError> {
    let path = path.as_ref();
    let f = File::open(path).map_err(|e| open_err(path, &e))?;
    clear_fd(&f, path)
}

fn clear_fd(f: &File, path: &Path) -> Result<(), LoopError> {
    // SAFETY: LOOP_CLR_FD takes no argument.
    match unsafe { ioctls::loop_clr_fd(f.as_raw_fd()) } {
        // ENXIO: not bound (already detached).
        Ok(_) | Err(Errno::ENXIO) => Ok(()),
        Err(errno) => Err(LoopError::Ioctl {
            op: "LOOP_CLR_FD",
            path: path.to_path_buf(),
            errno,
        }),
    }
}
