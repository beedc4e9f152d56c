//! [`LinuxMounter`]: the [`Mounter`] trait on real syscalls.

use std::ffi::{CStr, CString};
use std::mem::MaybeUninit;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags};
use nix::sys::statvfs::{FsFlags, statvfs};

use crate::error::{MountError, io_errno, is_corrupted_mount_errno};
use crate::mounter::Mounter;
use crate::mountinfo::{MountInfo, parse_mountinfo};
use crate::options::{MountOptions, Sensitive};

/// Upper bound on unmounts in `cleanup_mount_point`; mounts can be stacked.
const MAX_STACKED_UNMOUNTS: u32 = 32;

/// [`Mounter`] for Linux using `mount(2)`, `umount2(2)` and `statx(2)`.
///
/// The mount table is read from `/proc/thread-self/mountinfo`, not
/// `/proc/self/...`: a thread that called `unshare(CLONE_NEWNS)` has its own
/// namespace, while `self` names the main thread's.
#[derive(Debug, Clone)]
pub struct LinuxMounter {
    mountinfo_path: PathBuf,
}

impl Default for LinuxMounter {
    fn default() -> Self {
        Self::new()
    }
}

impl LinuxMounter {
    /// A mounter reading the calling thread's mount table.
    pub fn new() -> Self {
        let thread = Path::new("/proc/thread-self/mountinfo");
        // thread-self exists since Linux 3.17.
        let path = if thread.exists() {
            thread
        } else {
            Path::new("/proc/self/mountinfo")
        };
        LinuxMounter {
            mountinfo_path: path.to_path_buf(),
        }
    }

    /// A mounter reading the mount table from `path` (for example another
    /// process's `/proc/<pid>/mountinfo`).
    pub fn with_mountinfo_path(path: impl Into<PathBuf>) -> Self {
        LinuxMounter {
            mountinfo_path: path.into(),
        }
    }

    /// Where the mount table is read from.
    pub fn mountinfo_path(&self) -> &Path {
        &self.mountinfo_path
    }

    /// O(1) mount point check with `statx` `STATX_ATTR_MOUNT_ROOT`.
    /// `Ok(None)` when the kernel does not report that attribute (before
    /// Linux 5.8, or `statx` unavailable).
    pub fn is_mount_point_statx(&self, path: &Path) -> Result<Option<bool>, MountError> {
        match statx(path, 0) {
            Ok(stx) => {
                let bit = libc::STATX_ATTR_MOUNT_ROOT as u64;
                if stx.stx_attributes_mask & bit == 0 {
                    Ok(None)
                } else {
                    Ok(Some(stx.stx_attributes & bit != 0))
                }
            }
            Err(Errno::ENOSYS) => Ok(None),
            Err(errno) => Err(stat_error(path, errno)),
        }
    }

    /// Mount point check by scanning the mount table for the canonical
    /// path: O(number of mounts). The fallback for old kernels.
    pub fn is_mount_point_by_scan(&self, path: &Path) -> Result<bool, MountError> {
        let canonical = canonicalize(path)?;
        Ok(self
            .mount_points()?
            .iter()
            .any(|m| m.mount_point == canonical))
    }

    fn bind(
        &self,
        source: &Path,
        target: &Path,
        recursive: bool,
        extra: MsFlags,
    ) -> Result<(), MountError> {
        let src = cpath(source, "source")?;
        let tgt = cpath(target, "target")?;
        let rec = if recursive {
            MsFlags::MS_REC
        } else {
            MsFlags::empty()
        };
        tracing::debug!(source = ?source, target = ?target, ?extra, "bind mount");
        sys_mount(Some(&src), &tgt, None, MsFlags::MS_BIND | rec, None).map_err(|errno| {
            MountError::Mount {
                device: source.display().to_string(),
                target: target.to_path_buf(),
                fstype: String::new(),
                options: if recursive { "rbind" } else { "bind" }.into(),
                errno,
            }
        })?;
        if extra.is_empty() {
            return Ok(());
        }
        // The kernel ignores flags on the initial bind; they need a remount.
        // Per-mount nosuid/nodev/noexec of the source must be kept or the
        // remount fails on locked mounts (user namespaces) or loosens them.
        let mut flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | extra;
        match statvfs(source) {
            Ok(vfs) => {
                let f = vfs.flags();
                for (st, ms) in [
                    (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
                    (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
                    (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
                ] {
                    if f.contains(st) {
                        flags.insert(ms);
                    }
                }
            }
            Err(errno) => {
                let _ = nix::mount::umount2(target, MntFlags::MNT_DETACH);
                return Err(stat_error(source, errno));
            }
        }
        if let Err(errno) = sys_mount(None, &tgt, None, flags, None) {
            let _ = nix::mount::umount2(target, MntFlags::MNT_DETACH);
            return Err(MountError::Remount {
                target: target.to_path_buf(),
                flags: format!("{flags:?}"),
                errno,
            });
        }
        Ok(())
    }

    fn set_propagation(&self, target: &Path, propagation: MsFlags) -> Result<(), MountError> {
        let tgt = cpath(target, "target")?;
        sys_mount(None, &tgt, None, propagation, None).map_err(|errno| MountError::Propagation {
            target: target.to_path_buf(),
            propagation: format!("{propagation:?}"),
            errno,
        })
    }
}

impl Mounter for LinuxMounter {
    fn mount_sensitive(
        &self,
        source: &str,
        target: &Path,
        fstype: &str,
        options: &[&str],
        sensitive_options: &[Sensitive],
    ) -> Result<(), MountError> {
        let opts = MountOptions::parse(options);
        let shown = shown_options(options, sensitive_options);
        // "remount,bind,ro" changes an existing bind in place: one call.
        if opts.is_bind() && !opts.flags.contains(MsFlags::MS_REMOUNT) {
            let extra = opts.flags - MsFlags::MS_BIND - MsFlags::MS_REC;
            self.bind(
                Path::new(source),
                target,
                opts.flags.contains(MsFlags::MS_REC),
                extra,
            )?;
        } else {
            let src =
                CString::new(source).map_err(|_| MountError::InvalidArgument { what: "source" })?;
            let tgt = cpath(target, "target")?;
            let fs = if fstype.is_empty() {
                None
            } else {
                Some(
                    CString::new(fstype)
                        .map_err(|_| MountError::InvalidArgument { what: "fstype" })?,
                )
            };
            let data = SecretBuf::build(&opts.data, sensitive_options)?;
            tracing::debug!(source, target = ?target, fstype, options = %shown, "mount");
            sys_mount(Some(&src), &tgt, fs.as_deref(), opts.flags, data.as_cstr()).map_err(
                |errno| MountError::Mount {
                    device: source.to_owned(),
                    target: target.to_path_buf(),
                    fstype: fstype.to_owned(),
                    options: shown.clone(),
                    errno,
                },
            )?;
        }
        if !opts.propagation.is_empty() {
            self.set_propagation(target, opts.propagation)?;
        }
        Ok(())
    }

    fn bind_mount(&self, source: &Path, target: &Path, read_only: bool) -> Result<(), MountError> {
        let extra = if read_only {
            MsFlags::MS_RDONLY
        } else {
            MsFlags::empty()
        };
        self.bind(source, target, false, extra)
    }

    fn unmount(&self, target: &Path, lazy: bool) -> Result<(), MountError> {
        let flags = if lazy {
            MntFlags::MNT_DETACH
        } else {
            MntFlags::empty()
        };
        tracing::debug!(target = ?target, lazy, "unmount");
        match nix::mount::umount2(target, flags) {
            // EINVAL: not a mount point; ENOENT: nothing there. Both mean done.
            Ok(()) | Err(Errno::EINVAL) | Err(Errno::ENOENT) => Ok(()),
            Err(errno) => Err(MountError::Unmount {
                target: target.to_path_buf(),
                errno,
            }),
        }
    }

    fn mount_points(&self) -> Result<Vec<MountInfo>, MountError> {
        let data = std::fs::read(&self.mountinfo_path).map_err(|e| MountError::ReadMountInfo {
            path: self.mountinfo_path.clone(),
            errno: io_errno(&e),
        })?;
        Ok(parse_mountinfo(&data)?)
    }

    fn is_mount_point(&self, path: &Path) -> Result<bool, MountError> {
        match self.is_mount_point_statx(path)? {
            Some(answer) => Ok(answer),
            None => self.is_mount_point_by_scan(path),
        }
    }

    fn is_likely_not_mount_point(&self, path: &Path) -> Result<bool, MountError> {
        let canonical = canonicalize(path)?;
        let Some(parent) = canonical.parent() else {
            return Ok(false); // "/" is always a mount point.
        };
        let dev = std::fs::metadata(&canonical)
            .map_err(|e| stat_error(&canonical, io_errno(&e)))?
            .dev();
        let parent_dev = std::fs::metadata(parent)
            .map_err(|e| stat_error(parent, io_errno(&e)))?
            .dev();
        Ok(dev == parent_dev)
    }

    fn mount_refs(&self, path: &Path) -> Result<Vec<PathBuf>, MountError> {
        let canonical = match canonicalize(path) {
            Ok(p) => p,
            Err(MountError::Stat {
                errno: Errno::ENOENT,
                ..
            }) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        Ok(refs_in(&self.mount_points()?, &canonical))
    }

    fn cleanup_mount_point(&self, path: &Path) -> Result<(), MountError> {
        for _ in 0..MAX_STACKED_UNMOUNTS {
            let mounted = match self.is_mount_point(path) {
                Ok(m) => m,
                Err(MountError::Stat {
                    errno: Errno::ENOENT,
                    ..
                }) => return Ok(()),
                Err(MountError::Stat { errno, .. }) if is_corrupted_mount_errno(errno) => {
                    tracing::warn!(path = ?path, %errno, "corrupted mount point, unmounting");
                    true
                }
                Err(e) => return Err(e),
            };
            if !mounted {
                return remove_mount_point(path);
            }
            self.unmount(path, false)?;
        }
        Err(MountError::StillMounted {
            path: path.to_path_buf(),
            attempts: MAX_STACKED_UNMOUNTS,
        })
    }
}

/// Mount points other than `path` with the same device and root as the
/// topmost mount at `path`.
pub(crate) fn refs_in(mounts: &[MountInfo], path: &Path) -> Vec<PathBuf> {
    let Some(this) = mounts.iter().rev().find(|m| m.mount_point == path) else {
        return Vec::new();
    };
    let mut refs: Vec<PathBuf> = Vec::new();
    for m in mounts {
        if m.mount_point != path
            && m.major == this.major
            && m.minor == this.minor
            && m.root == this.root
            && !refs.contains(&m.mount_point)
        {
            refs.push(m.mount_point.clone());
        }
    }
    refs
}

/// Removes an unmounted mount point: an empty directory, or an empty file
/// (block-volume targets are files). Anything else is left alone.
pub(crate) fn remove_mount_point(path: &Path) -> Result<(), MountError> {
    let err = |e: std::io::Error| MountError::Remove {
        path: path.to_path_buf(),
        errno: io_errno(&e),
    };
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(err(e)),
    };
    let result = if meta.is_dir() {
        std::fs::remove_dir(path)
    } else if meta.is_file() && meta.len() == 0 {
        std::fs::remove_file(path)
    } else {
        return Err(MountError::Remove {
            path: path.to_path_buf(),
            errno: if meta.is_file() {
                Errno::ENOTEMPTY
            } else {
                Errno::ENOTDIR
            },
        });
    };
    match result {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(err(e)),
        _ => Ok(()),
    }
}

/// Options as they may be shown: sensitive ones replaced by `<redacted>`.
pub(crate) fn shown_options(options: &[&str], sensitive: &[Sensitive]) -> String {
    let mut parts: Vec<&str> = options.to_vec();
    if !sensitive.is_empty() {
        parts.push("<redacted>");
    }
    parts.join(",")
}

fn stat_error(path: &Path, errno: Errno) -> MountError {
    MountError::Stat {
        path: path.to_path_buf(),
        errno,
    }
}

fn canonicalize(path: &Path) -> Result<PathBuf, MountError> {
    std::fs::canonicalize(path).map_err(|e| stat_error(path, io_errno(&e)))
}

fn cpath(path: &Path, what: &'static str) -> Result<CString, MountError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| MountError::InvalidArgument { what })
}

fn statx(path: &Path, flags: libc::c_int) -> Result<libc::statx, Errno> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
    let mut buf = MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: valid NUL-terminated path and a buffer of the right type.
    let r = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            flags | libc::AT_NO_AUTOMOUNT,
            libc::STATX_TYPE,
            buf.as_mut_ptr(),
        )
    };
    Errno::result(r)?;
    // SAFETY: statx succeeded, so the kernel filled the buffer (and it was
    // zeroed before).
    Ok(unsafe { buf.assume_init() })
}

/// `mount(2)` with caller-owned C strings, so the data buffer holding
/// secrets is one we can wipe afterwards.
fn sys_mount(
    source: Option<&CStr>,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: MsFlags,
    data: Option<&CStr>,
) -> Result<(), Errno> {
    let p = |s: Option<&CStr>| s.map_or(std::ptr::null(), CStr::as_ptr);
    // SAFETY: all pointers are NUL-terminated strings or null, as mount(2)
    // accepts, and outlive the call.
    let r = unsafe {
        libc::mount(
            p(source),
            target.as_ptr(),
            p(fstype),
            flags.bits(),
            data.map_or(std::ptr::null(), |d| d.as_ptr().cast()),
        )
    };
    Errno::result(r).map(drop)
}

/// The mount data string; zeroed on drop because it may hold secrets.
struct SecretBuf(Vec<u8>);

impl SecretBuf {
    fn build(plain: &[String], sensitive: &[Sensitive]) -> Result<SecretBuf, MountError> {
        let mut buf = Vec::new();
        for opt in plain
            .iter()
            .map(String::as_str)
            .chain(sensitive.iter().map(Sensitive::expose))
        {
            if opt.is_empty() {
                continue;
            }
            if opt.as_bytes().contains(&0) {
                return Err(MountError::InvalidArgument {
                    what: "mount option",
                });
            }
            if !buf.is_empty() {
                buf.push(b',');
            }
            buf.extend_from_slice(opt.as_bytes());
        }
        if !buf.is_empty() {
            buf.push(0);
        }
        Ok(SecretBuf(buf))
    }

    fn as_cstr(&self) -> Option<&CStr> {
        if self.0.is_empty() {
            None
        } else {
            CStr::from_bytes_with_nul(&self.0).ok()
        }
    }
}

impl Drop for SecretBuf {
    fn drop(&mut self) {
        for b in self.0.iter_mut() {
            // SAFETY: writing a valid u8 through a valid &mut; volatile so the
            // wipe is not optimised away.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mountinfo::MountInfo;

    #[test]
    fn refs_match_device_and_root() {
        let lines = [
            "1 0 8:1 / / rw - ext4 /dev/sda1 rw",
            "2 1 8:16 / /staging rw - ext4 /dev/sdb rw",
            "3 1 8:16 / /pod/a rw - ext4 /dev/sdb rw",
            "4 1 8:16 /sub /pod/b rw - ext4 /dev/sdb rw",
            "5 1 8:16 / /pod/c ro - ext4 /dev/sdb rw",
        ];
        let mounts: Vec<MountInfo> = lines
            .iter()
            .map(|l| MountInfo::parse_line(l.as_bytes()).unwrap())
            .collect();
        assert_eq!(
            refs_in(&mounts, Path::new("/staging")),
            vec![PathBuf::from("/pod/a"), PathBuf::from("/pod/c")]
        );
        assert!(refs_in(&mounts, Path::new("/nothing")).is_empty());
    }

    #[test]
    fn shown_options_redact() {
        let s = shown_options(&["ro", "vers=4"], &[Sensitive::new("password=x")]);
        assert_eq!(s, "ro,vers=4,<redacted>");
        assert!(!s.contains("password"));
    }

    #[test]
    fn secret_buf_joins_plain_and_sensitive() {
        let b = SecretBuf::build(&["a=1".into()], &[Sensitive::new("k=v")]).unwrap();
        assert_eq!(b.as_cstr().unwrap().to_bytes(), b"a=1,k=v");
        assert!(SecretBuf::build(&[], &[]).unwrap().as_cstr().is_none());
        assert!(SecretBuf::build(&["a\0b".into()], &[]).is_err());
    }
}
