//! Mount table queries: mountinfo reads, `statx` and `statmount` lookups.

use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use nix::errno::Errno;

use super::LinuxMounter;
use crate::error::{MountError, io_errno};
use crate::mounter::MAX_STACKED_UNMOUNTS;
use crate::mountinfo::{MountInfo, find_by_id, read_until_id};
use crate::nofollow::statx_at;
use crate::source::MountSource;
use crate::statmount;

impl LinuxMounter {
    pub(super) fn read_mountinfo(&self) -> Result<Vec<u8>, MountError> {
        use std::io::Read;
        // A proc file reports size 0, so a plain read grows its buffer from
        // a few bytes with a read(2) per step; start at the last size seen.
        static LAST_LEN: AtomicUsize = AtomicUsize::new(0);
        let mut data = Vec::with_capacity(LAST_LEN.load(Ordering::Relaxed) + 4096);
        std::fs::File::open(&self.mountinfo_path)
            .and_then(|mut f| f.read_to_end(&mut data))
            .map_err(|e| MountError::ReadMountInfo {
                path: self.mountinfo_path.clone(),
                errno: io_errno(&e),
            })?;
        LAST_LEN.store(data.len(), Ordering::Relaxed);
        Ok(data)
    }

    /// [`Mounter::mounts_at`] from `statx` and `statmount` (the mounts at
    /// `abs` only); `None` when the kernel cannot say, or a mount went away
    /// while walking down the stack: then the caller reads the table.
    pub(super) fn mounts_at_by_id(&self, abs: &Path) -> Option<Vec<MountInfo>> {
        if !self.statmount_agrees() {
            return None;
        }
        let (mut id, root) = match unique_mount(abs) {
            Ok(Some(found)) => found,
            Err(Errno::ENOENT | Errno::ENOTDIR) => return Some(Vec::new()),
            Ok(None) | Err(_) => return None,
        };
        if !root {
            return Some(Vec::new());
        }
        let mut stack = Vec::new();
        for _ in 0..MAX_STACKED_UNMOUNTS {
            let e = statmount::entry(id).ok().flatten()?;
            if e.info.mount_point != abs || e.parent == id {
                if e.info.mount_point == abs {
                    stack.push(e.info);
                }
                stack.reverse();
                return Some(stack);
            }
            stack.push(e.info);
            id = e.parent;
        }
        None // a stack deeper than this: the table says it all
    }

    /// Whether statmount's entries equal this table's (checked once), and
    /// this mounter uses them.
    pub(super) fn statmount_agrees(&self) -> bool {
        self.statmount
            && statmount::agrees_with_table(
                || {
                    unique_mount(Path::new("/"))
                        .ok()
                        .flatten()
                        .map(|(id, _)| id)
                },
                // `/`'s mount comes first in a namespace's table: its line
                // alone is read, not the whole table.
                |id| {
                    let file = std::fs::File::open(&self.mountinfo_path).ok()?;
                    read_until_id(file, id).ok().flatten()
                },
            )
    }

    /// The mount an open descriptor is on, from its mount id; `None` when
    /// the kernel does not say (then callers scan by path).
    pub(super) fn mount_of_fd(&self, fd: BorrowedFd<'_>) -> Result<Option<MountInfo>, Errno> {
        let stx = statx_fd(fd, libc::STATX_TYPE | libc::STATX_MNT_ID)?;
        if stx.stx_mask & libc::STATX_MNT_ID == 0 {
            return Ok(None);
        }
        let Ok(data) = self.read_mountinfo() else {
            return Ok(None);
        };
        Ok(find_by_id(&data, stx.stx_mnt_id as u32).ok().flatten())
    }
}

impl LinuxMounter {
    /// Whether the mount `fd` is on is read-only (its own flag or its
    /// superblock's), from the mount table alone: never a request to the
    /// filesystem (the `statx` does not sync attributes). `None` when the
    /// kernel does not give the mount's id.
    pub(super) fn read_only_in_table(&self, fd: BorrowedFd<'_>) -> Option<bool> {
        let unique = statx_fd(fd, libc::STATX_MNT_ID_UNIQUE).ok()?;
        let by_statmount = (unique.stx_mask & libc::STATX_MNT_ID_UNIQUE != 0
            && self.statmount_agrees())
        .then(|| statmount::entry(unique.stx_mnt_id).ok().flatten())
        .flatten();
        let info = match by_statmount {
            Some(entry) => entry.info,
            None => {
                let stx = statx_fd(fd, libc::STATX_MNT_ID).ok()?;
                if stx.stx_mask & libc::STATX_MNT_ID == 0 {
                    return None;
                }
                let data = self.read_mountinfo().ok()?;
                find_by_id(&data, stx.stx_mnt_id as u32).ok().flatten()?
            }
        };
        let ro = |options: &[String]| options.iter().any(|o| o == "ro");
        Some(ro(&info.mount_options) || ro(&info.super_options))
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

/// What a bind of `abs`, which is inside `mount`, shows in mountinfo.
pub(crate) fn bind_source_in(mount: &MountInfo, abs: &Path) -> MountSource {
    let rel = abs
        .strip_prefix(&mount.mount_point)
        .unwrap_or(Path::new(""));
    let root = if rel.as_os_str().is_empty() {
        mount.root.clone()
    } else {
        mount.root.join(rel)
    };
    MountSource::Bind {
        device: mount.device(),
        root,
    }
}

/// `Some(is mount root)` when the kernel reports `STATX_ATTR_MOUNT_ROOT`.
pub(super) fn mount_root_attr(stx: &libc::statx) -> Option<bool> {
    let bit = libc::STATX_ATTR_MOUNT_ROOT as u64;
    (stx.stx_attributes_mask & bit != 0).then_some(stx.stx_attributes & bit != 0)
}

/// `statx` of an open descriptor (`AT_EMPTY_PATH`), from cached attributes
/// (`AT_STATX_DONT_SYNC`): what the mount code asks (type, mount id, mount
/// root) never changes, and a fresh `statx` of a network or FUSE mount
/// waits on its server or daemon.
pub(super) fn statx_fd(fd: BorrowedFd<'_>, mask: libc::c_uint) -> Result<libc::statx, Errno> {
    let flags = libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC;
    statx_at(fd.as_raw_fd(), c"", flags, mask)
}

/// The unique id of the mount `path` is on (the topmost at `path` when it
/// is a mount root; `path` not followed if a symlink) and whether `path`
/// is that mount's root. `Ok(None)` when the kernel gives no unique ids.
pub(super) fn unique_mount(path: &Path) -> Result<Option<(u64, bool)>, Errno> {
    let stx = statx(path, libc::AT_SYMLINK_NOFOLLOW, libc::STATX_MNT_ID_UNIQUE)?;
    if stx.stx_mask & libc::STATX_MNT_ID_UNIQUE == 0 {
        return Ok(None);
    }
    Ok(mount_root_attr(&stx).map(|root| (stx.stx_mnt_id, root)))
}

/// `statx` of `path`, from cached attributes, as [`statx_fd`].
pub(super) fn statx(
    path: &Path,
    flags: libc::c_int,
    mask: libc::c_uint,
) -> Result<libc::statx, Errno> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
    statx_at(libc::AT_FDCWD, &c, flags | libc::AT_STATX_DONT_SYNC, mask)
}
