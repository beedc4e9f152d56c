//! Attaching a backing file to a free device: `LOOP_CONFIGURE`, or the
//! older `LOOP_SET_FD` + `LOOP_SET_STATUS64`.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;

use super::abi::*;
use super::{LoopDevice, LoopError, LoopOptions};

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
}

pub(super) fn device_path(number: u32) -> PathBuf {
    PathBuf::from(format!("/dev/loop{number}"))
}

pub(super) fn open_err(path: &Path, e: &std::io::Error) -> LoopError {
    LoopError::Open {
        path: path.to_path_buf(),
        errno: crate::error::io_errno(e),
    }
}

pub(super) fn open_backing(path: &Path, opts: &LoopOptions) -> Result<File, LoopError> {
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
pub(super) fn open_device(number: u32) -> Result<File, LoopError> {
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
pub(super) fn configure(
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
