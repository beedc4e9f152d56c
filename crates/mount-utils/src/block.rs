//! Block device queries: size, read-only flag, and which device backs a
//! mount.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

use nix::errno::Errno;

use crate::error::MountError;
use crate::mounter::Mounter;

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
/// mount at `mount_path`, or `None` if nothing is mounted there.
pub fn device_from_mount(
    mounter: &dyn Mounter,
    mount_path: &Path,
) -> Result<Option<String>, MountError> {
    let canonical = match std::fs::canonicalize(mount_path) {
        Ok(p) => p,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(MountError::Stat {
                path: mount_path.to_path_buf(),
                errno: e.raw_os_error().map_or(Errno::EIO, Errno::from_raw),
            });
        }
    };
    Ok(mounter
        .mount_points()?
        .into_iter()
        .rev()
        .find(|m| m.mount_point == canonical)
        .map(|m| m.source))
}
