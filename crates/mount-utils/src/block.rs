//! Block device queries: device numbers, size, read-only flag, "is this the
//! same device", and which device backs a mount.

use std::fmt;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use crate::error::MountError;
use crate::mounter::Mounter;

/// A device number (`major:minor`): a block device's `st_rdev`, or the
/// `st_dev` of a filesystem as mountinfo shows it.
///
/// ```
/// use mount_utils::DeviceNumber;
/// let d = DeviceNumber::new(7, 3);
/// assert_eq!(d.to_string(), "7:3");
/// assert_eq!(DeviceNumber::from_dev_t(d.as_dev_t()), d);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct DeviceNumber {
    /// Major number (the driver: 7 for loop devices, 8 for SCSI disks).
    pub major: u32,
    /// Minor number (the device within the driver).
    pub minor: u32,
}

impl DeviceNumber {
    /// `major:minor`.
    pub const fn new(major: u32, minor: u32) -> Self {
        DeviceNumber { major, minor }
    }

    /// Splits a kernel `dev_t`.
    pub fn from_dev_t(dev: libc::dev_t) -> Self {
        DeviceNumber::new(libc::major(dev), libc::minor(dev))
    }

    /// The kernel `dev_t`.
    pub fn as_dev_t(self) -> libc::dev_t {
        libc::makedev(self.major, self.minor)
    }

    /// The `st_rdev` of the block device node at `path` (symlinks such as
    /// `/dev/disk/by-id/...` are followed). `ENOTBLK` if it is not one.
    pub fn of_block_device(path: impl AsRef<Path>) -> std::io::Result<DeviceNumber> {
        let meta = std::fs::metadata(path)?;
        if !meta.file_type().is_block_device() {
            return Err(std::io::Error::from_raw_os_error(libc::ENOTBLK));
        }
        Ok(DeviceNumber::from_dev_t(meta.rdev()))
    }
}

impl fmt::Display for DeviceNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

/// Whether `a` and `b` are the same device or file: two block (or
/// character) device nodes with the same `st_rdev`, whatever their names
/// (`/dev/loop3`, a bind mount of it on a publish target, a
/// `/dev/disk/by-*` link); otherwise the same inode on the same filesystem.
/// A device node and a regular file are never the same. Symlinks are
/// followed, as device paths are usually links.
pub fn same_device(a: impl AsRef<Path>, b: impl AsRef<Path>) -> std::io::Result<bool> {
    let (a, b) = (std::fs::metadata(a)?, std::fs::metadata(b)?);
    let node = |m: &std::fs::Metadata| {
        let t = m.file_type();
        if t.is_block_device() {
            Some((true, m.rdev()))
        } else if t.is_char_device() {
            Some((false, m.rdev()))
        } else {
            None
        }
    };
    Ok(match (node(&a), node(&b)) {
        (Some(x), Some(y)) => x == y,
        (None, None) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    })
}

mod ioctls {
    // BLKGETSIZE64 is _IOR(0x12, 114, size_t) but the kernel always writes a
    // u64, so encode with size_t and read into a u64.
    nix::ioctl_read_bad!(
        blkgetsize64,
        nix::request_code_read!(0x12, 114, std::mem::size_of::<libc::size_t>()),
        u64
    );
    // BLKROGET is _IO(0x12, 94) and writes an int.
    nix::ioctl_read_bad!(blkroget, nix::request_code_none!(0x12, 94), libc::c_int);
}

/// Size in bytes of the block device at `path` (`BLKGETSIZE64`).
pub fn device_size(path: impl AsRef<Path>) -> std::io::Result<u64> {
    let f = File::open(path)?;
    device_size_fd(&f)
}

pub(crate) fn device_size_fd(f: &File) -> std::io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: valid fd and a u64 out-parameter, as BLKGETSIZE64 expects.
    unsafe { ioctls::blkgetsize64(f.as_raw_fd(), &mut size) }.map_err(std::io::Error::from)?;
    Ok(size)
}

/// Whether the block device at `path` is read-only (`BLKROGET`).
pub fn is_read_only(path: impl AsRef<Path>) -> std::io::Result<bool> {
    let f = File::open(path)?;
    let mut ro: libc::c_int = 0;
    // SAFETY: valid fd and an int out-parameter, as BLKROGET expects.
    unsafe { ioctls::blkroget(f.as_raw_fd(), &mut ro) }.map_err(std::io::Error::from)?;
    Ok(ro != 0)
}

/// The source (usually a device path such as `/dev/sdb`) of the topmost
/// mount at `mount_path`, or `None` if nothing is mounted there. A path
/// through a symbolic link is refused ([`MountError::Symlink`]).
pub fn device_from_mount(
    mounter: &dyn Mounter,
    mount_path: &Path,
) -> Result<Option<String>, MountError> {
    Ok(mounter.mounted_at(mount_path)?.map(|m| m.source))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_device_compares_nodes_by_rdev_and_files_by_inode() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, b"x").unwrap();
        std::fs::write(&b, b"x").unwrap();
        std::os::unix::fs::symlink(&a, dir.path().join("link")).unwrap();
        assert!(same_device(&a, dir.path().join("link")).unwrap());
        assert!(!same_device(&a, &b).unwrap());
        // /dev/null and /dev/zero: both char devices, different rdev.
        assert!(same_device("/dev/null", "/dev/null").unwrap());
        assert!(!same_device("/dev/null", "/dev/zero").unwrap());
        assert!(!same_device("/dev/null", &a).unwrap());
        assert!(same_device(&a, dir.path().join("absent")).is_err());
        let err = DeviceNumber::of_block_device("/dev/null").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOTBLK));
    }
}
