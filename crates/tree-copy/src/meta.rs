//! Owner, mode, extended attributes and timestamps of one copied node.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::Path;

use rustix::fs::{self as rfs, AtFlags, Gid, Mode, Stat, Timespec, Timestamps, Uid, XattrFlags};
use rustix::io::Errno;

use crate::CopyError;

/// A node whose metadata is read or written.
#[derive(Clone, Copy)]
pub(crate) enum Node<'a> {
    /// Through an open descriptor (directories and regular files).
    Fd(BorrowedFd<'a>),
    /// By name in an open directory, the last component never followed
    /// (symlinks and special files, which are not opened).
    At { dir: BorrowedFd<'a>, name: &'a CStr },
}

impl Node<'_> {
    /// `/proc/self/fd/DIR/NAME`: the `l*xattr` calls take paths, and this
    /// one resolves through the open directory, not through the tree.
    fn proc_path(dir: BorrowedFd<'_>, name: &CStr) -> CString {
        let mut path = format!("/proc/self/fd/{}/", dir.as_raw_fd()).into_bytes();
        path.extend_from_slice(name.to_bytes());
        CString::new(path).expect("no NUL in a file name")
    }

    fn stat(self) -> rustix::io::Result<Stat> {
        match self {
            Node::Fd(fd) => rfs::fstat(fd),
            Node::At { dir, name } => rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW),
        }
    }

    fn list_xattrs(self) -> rustix::io::Result<Vec<u8>> {
        loop {
            let size = match self {
                Node::Fd(fd) => rfs::flistxattr_query(fd),
                Node::At { dir, name } => rfs::llistxattr_query(Self::proc_path(dir, name)),
            };
            let size = match size {
                Ok(n) => n,
                // The filesystem keeps no xattrs: there are none to copy.
                Err(Errno::OPNOTSUPP) => return Ok(Vec::new()),
                Err(e) => return Err(e),
            };
            if size == 0 {
                return Ok(Vec::new());
            }
            let mut buf = vec![0u8; size];
            let got = match self {
                Node::Fd(fd) => rfs::flistxattr(fd, &mut buf[..]),
                Node::At { dir, name } => rfs::llistxattr(Self::proc_path(dir, name), &mut buf[..]),
            };
            match got {
                Ok(n) => {
                    buf.truncate(n);
                    return Ok(buf);
                }
                // Grew between the two calls: ask again.
                Err(Errno::RANGE) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// The value of xattr `key`; `None` if it went away meanwhile.
    fn get_xattr(self, key: &CStr) -> rustix::io::Result<Option<Vec<u8>>> {
        loop {
            let size = match self {
                Node::Fd(fd) => rfs::fgetxattr_query(fd, key),
                Node::At { dir, name } => rfs::lgetxattr_query(Self::proc_path(dir, name), key),
            };
            let size = match size {
                Ok(n) => n,
                Err(Errno::NODATA) => return Ok(None),
                Err(e) => return Err(e),
            };
            let mut buf = vec![0u8; size];
            if size == 0 {
                return Ok(Some(buf));
            }
            let got = match self {
                Node::Fd(fd) => rfs::fgetxattr(fd, key, &mut buf[..]),
                Node::At { dir, name } => {
                    rfs::lgetxattr(Self::proc_path(dir, name), key, &mut buf[..])
                }
            };
            match got {
                Ok(n) => {
                    buf.truncate(n);
                    return Ok(Some(buf));
                }
                Err(Errno::RANGE) => continue,
                Err(Errno::NODATA) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
    }

    fn set_xattr(self, key: &CStr, value: &[u8]) -> rustix::io::Result<()> {
        match self {
            Node::Fd(fd) => rfs::fsetxattr(fd, key, value, XattrFlags::empty()),
            Node::At { dir, name } => {
                rfs::lsetxattr(Self::proc_path(dir, name), key, value, XattrFlags::empty())
            }
        }
    }
}

/// Gives `dst` the metadata of `src` (whose `lstat` is `st`): owner and
/// group, then mode (a chown clears setuid/setgid), then xattrs (after the
/// chown, which drops file capabilities; an ACL set after the mode keeps
/// them consistent, as the source's are), then timestamps (last, since the
/// other changes touch them). `dst_path` names the node in errors.
pub(crate) fn copy_metadata(
    src: Node<'_>,
    dst: Node<'_>,
    st: &Stat,
    symlink: bool,
    dst_path: &Path,
) -> Result<(), CopyError> {
    let fail = |op: &str, e: Errno| CopyError::new(op.to_owned(), dst_path, io::Error::from(e));
    let now = dst.stat().map_err(|e| fail("inspecting", e))?;
    if (now.st_uid, now.st_gid) != (st.st_uid, st.st_gid) {
        let (uid, gid) = (Uid::from_raw(st.st_uid), Gid::from_raw(st.st_gid));
        match dst {
            Node::Fd(fd) => rfs::fchown(fd, Some(uid), Some(gid)),
            Node::At { dir, name } => {
                rfs::chownat(dir, name, Some(uid), Some(gid), AtFlags::SYMLINK_NOFOLLOW)
            }
        }
        .map_err(|e| fail("setting the owner of", e))?;
    }
    if !symlink {
        let mode = Mode::from_raw_mode(st.st_mode & 0o7777);
        match dst {
            Node::Fd(fd) => rfs::fchmod(fd, mode),
            Node::At { dir, name } => rfs::chmodat(dir, name, mode, AtFlags::empty()),
        }
        .map_err(|e| fail("setting the mode of", e))?;
    }
    copy_xattrs(src, dst, dst_path)?;
    let times = Timestamps {
        last_access: Timespec {
            tv_sec: st.st_atime as _,
            tv_nsec: st.st_atime_nsec as _,
        },
        last_modification: Timespec {
            tv_sec: st.st_mtime as _,
            tv_nsec: st.st_mtime_nsec as _,
        },
    };
    match dst {
        Node::Fd(fd) => rfs::futimens(fd, &times),
        Node::At { dir, name } => rfs::utimensat(dir, name, &times, AtFlags::SYMLINK_NOFOLLOW),
    }
    .map_err(|e| fail("setting the times of", e))
}

/// Every xattr of `src` onto `dst`. A value that cannot be set is an error
/// naming the attribute (never its value): a copy that silently lost an
/// ACL or a capability would look complete and not work.
fn copy_xattrs(src: Node<'_>, dst: Node<'_>, dst_path: &Path) -> Result<(), CopyError> {
    let names = src
        .list_xattrs()
        .map_err(|e| CopyError::new("listing the xattrs for", dst_path, io::Error::from(e)))?;
    for key in names.split(|&b| b == 0).filter(|k| !k.is_empty()) {
        let key = CString::new(key).expect("split at NUL");
        let shown = key.to_string_lossy();
        let Some(value) = src.get_xattr(&key).map_err(|e| {
            CopyError::new(
                format!("reading xattr {shown} for"),
                dst_path,
                io::Error::from(e),
            )
        })?
        else {
            continue;
        };
        dst.set_xattr(&key, &value).map_err(|e| {
            CopyError::new(
                format!("setting xattr {shown} on"),
                dst_path,
                io::Error::from(e),
            )
        })?;
    }
    Ok(())
}
