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

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;

use crate::block::DeviceNumber;

const LO_NAME_SIZE: usize = 64;
const LO_KEY_SIZE: usize = 32;

const LO_FLAGS_READ_ONLY: u32 = 1;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
const LO_FLAGS_PARTSCAN: u32 = 8;
const LO_FLAGS_DIRECT_IO: u32 = 16;

/// How often to retry when another process grabs the free device first.
const MAX_ATTACH_ATTEMPTS: u32 = 64;

/// `struct loop_info64`.
#[repr(C)]
#[derive(Clone, Copy)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; LO_NAME_SIZE],
    lo_crypt_name: [u8; LO_NAME_SIZE],
    lo_encrypt_key: [u8; LO_KEY_SIZE],
    lo_init: [u64; 2],
}

/// `struct loop_config` (Linux 5.8+).
#[repr(C)]
#[derive(Clone, Copy)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

const _: () = assert!(std::mem::size_of::<LoopInfo64>() == 232);
const _: () = assert!(std::mem::size_of::<LoopConfig>() == 304);

impl LoopInfo64 {
    fn zeroed() -> Self {
        LoopInfo64 {
            lo_device: 0,
            lo_inode: 0,
            lo_rdevice: 0,
            lo_offset: 0,
            lo_sizelimit: 0,
            lo_number: 0,
            lo_encrypt_type: 0,
            lo_encrypt_key_size: 0,
            lo_flags: 0,
            lo_file_name: [0; LO_NAME_SIZE],
            lo_crypt_name: [0; LO_NAME_SIZE],
            lo_encrypt_key: [0; LO_KEY_SIZE],
            lo_init: [0; 2],
        }
    }
}

mod ioctls {
    use super::{LoopConfig, LoopInfo64};
    nix::ioctl_write_int_bad!(loop_set_fd, 0x4C00);
    nix::ioctl_none_bad!(loop_clr_fd, 0x4C01);
    nix::ioctl_write_ptr_bad!(loop_set_status64, 0x4C04, LoopInfo64);
    nix::ioctl_read_bad!(loop_get_status64, 0x4C05, LoopInfo64);
    nix::ioctl_none_bad!(loop_set_capacity, 0x4C07);
    nix::ioctl_write_int_bad!(loop_set_direct_io, 0x4C08);
    nix::ioctl_write_ptr_bad!(loop_configure, 0x4C0A, LoopConfig);
    nix::ioctl_none_bad!(loop_ctl_get_free, 0x4C82);
}

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
    number: u32,
    path: PathBuf,
    file: File,
    detach_on_drop: bool,
}

impl LoopDevice {
    /// Attaches `backing_file` to a free loop device.
    ///
    /// Uses `LOOP_CONFIGURE` (one atomic ioctl), falling back to
    /// `LOOP_SET_FD` + `LOOP_SET_STATUS64` on kernels without it. Retries
    /// when another process binds the free device first (`EBUSY`).
    pub fn attach(
        backing_file: impl AsRef<Path>,
        opts: &LoopOptions,
    ) -> Result<LoopDevice, LoopError> {
        let backing_path = backing_file.as_ref();
        let backing = open_backing(backing_path, opts)?;
        let control = Path::new("/dev/loop-control");
        let ctl = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(control)
            .map_err(|e| open_err(control, &e))?;
        let mut flags = 0;
        if opts.autoclear {
            flags |= LO_FLAGS_AUTOCLEAR;
        }
        if opts.partscan {
            flags |= LO_FLAGS_PARTSCAN;
        }
        if opts.read_only {
            flags |= LO_FLAGS_READ_ONLY;
        }
        if opts.direct_io {
            flags |= LO_FLAGS_DIRECT_IO;
        }
        let mut info = LoopInfo64::zeroed();
        info.lo_flags = flags;
        let name = backing_path.as_os_str().as_bytes();
        let n = name.len().min(LO_NAME_SIZE - 1);
        info.lo_file_name[..n].copy_from_slice(&name[..n]);

        for _ in 0..MAX_ATTACH_ATTEMPTS {
            // SAFETY: LOOP_CTL_GET_FREE takes no argument.
            let number = unsafe { ioctls::loop_ctl_get_free(ctl.as_raw_fd()) }.map_err(|errno| {
                LoopError::Ioctl {
                    op: "LOOP_CTL_GET_FREE",
                    path: control.to_path_buf(),
                    errno,
                }
            })? as u32;
            let dev = match open_device(number) {
                Ok(dev) => dev,
                // A device still being torn down (autoclear of another
                // user's device) is handed out as free but cannot be
                // opened yet: give it a moment, then ask again.
                Err(LoopError::Open {
                    errno: Errno::ENXIO,
                    ..
                }) => {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                    continue;
                }
                Err(e) => return Err(e),
            };
            let path = device_path(number);
            match configure(&dev, &backing, info, opts) {
                Ok(()) => {
                    tracing::debug!(device = ?path, backing = ?backing_path, "loop device attached");
                    return Ok(LoopDevice {
                        number,
                        path,
                        file: dev,
                        detach_on_drop: true,
                    });
                }
                // Someone bound it between GET_FREE and our ioctl: try again.
                Err((_, Errno::EBUSY)) => continue,
                Err((op, errno)) => return Err(LoopError::Ioctl { op, path, errno }),
            }
        }
        Err(LoopError::NoFreeDevice {
            attempts: MAX_ATTACH_ATTEMPTS,
        })
    }

    /// Opens an existing loop device (for example found with
    /// [`find_by_backing_file`]). The handle does not detach on drop.
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

/// Loop device operations a node plugin needs, behind a trait so its node
/// code can be unit tested without root (with `FakeLoopDevices`, feature `testing`).
///
/// Device numbers are reused: after a detach the next attach may get the
/// same `/dev/loopN` for another file. Check [`info`](LoopDevices::info)'s
/// backing file before trusting a recorded device path.
pub trait LoopDevices: Send + Sync {
    /// Attaches `backing_file` to a free device. The returned handle holds
    /// the device open, so autoclear cannot release it before the caller has
    /// mounted it; dropping the handle detaches it, [`AttachedLoop::keep`]
    /// leaves it attached.
    fn attach(&self, backing_file: &Path, options: &LoopOptions)
    -> Result<AttachedLoop, LoopError>;

    /// Devices attached to `backing_file` (after a crash between attach and
    /// saving a record, this finds the device to clean up).
    fn find_by_backing_file(&self, backing_file: &Path) -> Result<Vec<PathBuf>, LoopError>;

    /// The device at `device`, or `None` if nothing is attached there.
    fn info(&self, device: &Path) -> Result<Option<LoopDeviceInfo>, LoopError>;

    /// Re-reads the backing file's size after it grew; returns the new size.
    fn set_capacity(&self, device: &Path) -> Result<u64, LoopError>;

    /// Detaches `device` (deferred by the kernel while it is in use); not
    /// attached or absent is success.
    fn detach(&self, device: &Path) -> Result<(), LoopError>;
}

type Release = Box<dyn FnOnce(bool) -> Result<(), LoopError> + Send>;

/// A device attached by [`LoopDevices::attach`]: detached when dropped
/// unless [`kept`](AttachedLoop::keep).
pub struct AttachedLoop {
    info: LoopDeviceInfo,
    release: Option<Release>,
}

impl AttachedLoop {
    /// For [`LoopDevices`] implementations: `release(true)` must detach the
    /// device, `release(false)` let go of it leaving it attached.
    pub fn new(
        info: LoopDeviceInfo,
        release: impl FnOnce(bool) -> Result<(), LoopError> + Send + 'static,
    ) -> Self {
        AttachedLoop {
            info,
            release: Some(Box::new(release)),
        }
    }

    /// The device.
    pub fn info(&self) -> &LoopDeviceInfo {
        &self.info
    }

    /// Device path, for example `/dev/loop3`.
    pub fn path(&self) -> &Path {
        &self.info.path
    }

    /// Leaves the device attached (with autoclear: until nothing uses it).
    pub fn keep(mut self) -> LoopDeviceInfo {
        if let Some(release) = self.release.take() {
            let _ = release(false);
        }
        self.info.clone()
    }

    /// Detaches now (deferred by the kernel while in use).
    pub fn detach(mut self) -> Result<(), LoopError> {
        self.release.take().map_or(Ok(()), |release| release(true))
    }
}

impl Drop for AttachedLoop {
    fn drop(&mut self) {
        if let Some(release) = self.release.take()
            && let Err(e) = release(true)
        {
            tracing::warn!(error = %e, "detaching loop device on drop");
        }
    }
}

impl std::fmt::Debug for AttachedLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachedLoop")
            .field("info", &self.info)
            .field("kept", &self.release.is_none())
            .finish()
    }
}

/// [`LoopDevices`] on the kernel's loop driver.
#[derive(Debug, Clone, Copy, Default)]
pub struct LinuxLoopDevices;

impl LinuxLoopDevices {
    /// The real thing.
    pub fn new() -> Self {
        LinuxLoopDevices
    }
}

impl LoopDevices for LinuxLoopDevices {
    fn attach(
        &self,
        backing_file: &Path,
        options: &LoopOptions,
    ) -> Result<AttachedLoop, LoopError> {
        let dev = LoopDevice::attach(backing_file, options)?;
        let info = dev.info()?;
        Ok(AttachedLoop::new(info, move |detach| {
            if detach {
                dev.detach()
            } else {
                dev.keep();
                Ok(())
            }
        }))
    }

    fn find_by_backing_file(&self, backing_file: &Path) -> Result<Vec<PathBuf>, LoopError> {
        find_by_backing_file(backing_file)
    }

    fn info(&self, device: &Path) -> Result<Option<LoopDeviceInfo>, LoopError> {
        let dev = match LoopDevice::open(device) {
            Ok(d) => d,
            Err(LoopError::Open {
                errno: Errno::ENOENT | Errno::ENXIO,
                ..
            }) => return Ok(None),
            Err(e) => return Err(e),
        };
        match dev.info() {
            Ok(info) => Ok(Some(info)),
            // Not bound to a file.
            Err(LoopError::Ioctl {
                errno: Errno::ENXIO,
                ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn set_capacity(&self, device: &Path) -> Result<u64, LoopError> {
        let dev = LoopDevice::open(device)?;
        dev.set_capacity()?;
        dev.size()
    }

    fn detach(&self, device: &Path) -> Result<(), LoopError> {
        match detach(device) {
            Err(LoopError::Open {
                errno: Errno::ENOENT | Errno::ENXIO,
                ..
            }) => Ok(()),
            other => other,
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

/// Loop devices whose backing file is `file` (compared after resolving
/// symlinks), from `/sys/block/loopN/loop/backing_file`.
pub fn find_by_backing_file(file: impl AsRef<Path>) -> Result<Vec<PathBuf>, LoopError> {
    let file = file.as_ref();
    let wanted = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_path_buf());
    let sys = Path::new("/sys/block");
    let entries = std::fs::read_dir(sys).map_err(|e| LoopError::Sysfs {
        path: sys.to_path_buf(),
        errno: crate::error::io_errno(&e),
    })?;
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(number) = name
            .to_str()
            .and_then(|n| n.strip_prefix("loop"))
            .and_then(|n| n.parse().ok())
        else {
            continue;
        };
        if backing_file_of(number)?.is_some_and(|b| b == wanted) {
            found.push(device_path(number));
        }
    }
    found.sort();
    Ok(found)
}

fn backing_file_of(number: u32) -> Result<Option<PathBuf>, LoopError> {
    let p = PathBuf::from(format!("/sys/block/loop{number}/loop/backing_file"));
    match std::fs::read(&p) {
        Ok(mut bytes) => {
            while bytes.last() == Some(&b'\n') {
                bytes.pop();
            }
            Ok(Some(PathBuf::from(OsString::from_vec(bytes))))
        }
        // The loop/ directory only exists while bound; a device detached
        // while we read it (by another process) answers ENODEV.
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                || e.raw_os_error() == Some(libc::ENODEV) =>
        {
            Ok(None)
        }
        Err(e) => Err(LoopError::Sysfs {
            path: p,
            errno: crate::error::io_errno(&e),
        }),
    }
}

fn device_path(number: u32) -> PathBuf {
    PathBuf::from(format!("/dev/loop{number}"))
}

fn open_err(path: &Path, e: &std::io::Error) -> LoopError {
    LoopError::Open {
        path: path.to_path_buf(),
        errno: crate::error::io_errno(e),
    }
}

fn open_backing(path: &Path, opts: &LoopOptions) -> Result<File, LoopError> {
    let open = |extra: libc::c_int| {
        OpenOptions::new()
            .read(true)
            .write(!opts.read_only)
            .custom_flags(libc::O_CLOEXEC | extra)
            .open(path)
    };
    let result = if opts.direct_io {
        // Some filesystems refuse O_DIRECT; the kernel then falls back to
        // buffered I/O, which is still correct.
        open(libc::O_DIRECT).or_else(|_| open(0))
    } else {
        open(0)
    };
    result.map_err(|e| LoopError::BackingFile {
        path: path.to_path_buf(),
        errno: crate::error::io_errno(&e),
    })
}

/// Opens `/dev/loopN`, creating the node if devtmpfs has not (some
/// containers have a static /dev).
fn open_device(number: u32) -> Result<File, LoopError> {
    let path = device_path(number);
    let open = || {
        OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)
    };
    match open() {
        Ok(f) => Ok(f),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let dev = libc::makedev(7, number);
            match nix::sys::stat::mknod(
                &path,
                nix::sys::stat::SFlag::S_IFBLK,
                nix::sys::stat::Mode::from_bits_truncate(0o660),
                dev,
            ) {
                Ok(()) | Err(Errno::EEXIST) => open().map_err(|e| open_err(&path, &e)),
                Err(errno) => Err(LoopError::Open { path, errno }),
            }
        }
        Err(e) => Err(open_err(&path, &e)),
    }
}

/// Binds `backing` to `dev`. Errors carry the ioctl name for the message.
fn configure(
    dev: &File,
    backing: &File,
    info: LoopInfo64,
    opts: &LoopOptions,
) -> Result<(), (&'static str, Errno)> {
    let config = LoopConfig {
        fd: backing.as_raw_fd() as u32,
        block_size: opts.block_size,
        info,
        reserved: [0; 8],
    };
    if !opts.legacy_ioctls {
        // SAFETY: valid fds and a correctly laid out loop_config.
        match unsafe { ioctls::loop_configure(dev.as_raw_fd(), &config) } {
            Ok(_) => return Ok(()),
            // Kernels before 5.8 do not know LOOP_CONFIGURE.
            Err(Errno::EINVAL) | Err(Errno::ENOTTY) => {}
            Err(errno) => return Err(("LOOP_CONFIGURE", errno)),
        }
    }
    // SAFETY: valid fds.
    unsafe { ioctls::loop_set_fd(dev.as_raw_fd(), backing.as_raw_fd()) }
        .map_err(|e| ("LOOP_SET_FD", e))?;
    let mut status = info;
    // LOOP_SET_STATUS64 cannot set READ_ONLY (it follows the fd's mode) nor
    // DIRECT_IO (separate ioctl).
    status.lo_flags &= LO_FLAGS_AUTOCLEAR | LO_FLAGS_PARTSCAN;
    // SAFETY: valid fd and a correctly laid out loop_info64.
    let set = unsafe { ioctls::loop_set_status64(dev.as_raw_fd(), &status) }
        .map_err(|e| ("LOOP_SET_STATUS64", e));
    let dio = || {
        if opts.direct_io {
            // SAFETY: valid fd; the argument is a boolean.
            unsafe { ioctls::loop_set_direct_io(dev.as_raw_fd(), 1) }
                .map_err(|e| ("LOOP_SET_DIRECT_IO", e))?;
        }
        Ok(())
    };
    if let Err(e) = set.and_then(|_| dio()) {
        // Do not leave a half-configured device behind.
        // SAFETY: LOOP_CLR_FD takes no argument.
        let _ = unsafe { ioctls::loop_clr_fd(dev.as_raw_fd()) };
        return Err(e);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_layout_matches_kernel_abi() {
        assert_eq!(std::mem::offset_of!(LoopInfo64, lo_flags), 52);
        assert_eq!(std::mem::offset_of!(LoopInfo64, lo_file_name), 56);
        assert_eq!(std::mem::offset_of!(LoopInfo64, lo_init), 216);
        assert_eq!(std::mem::offset_of!(LoopConfig, info), 8);
    }

    #[test]
    fn defaults_autoclear() {
        let o = LoopOptions::default();
        assert!(o.autoclear && !o.read_only && !o.direct_io);
    }
}
