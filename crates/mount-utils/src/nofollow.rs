//! Resolving paths without following symbolic links.
//!
//! A node plugin gets its target and staging paths from the CO, and some of
//! their parents can be written by others (a pod's volume directory, a
//! confused operator). Following a symlink there would mount, unmount or
//! remove somewhere else. Every mount, bind, unmount and cleanup entry point
//! of [`LinuxMounter`](crate::LinuxMounter) therefore resolves its paths
//! here: with `openat2(RESOLVE_NO_SYMLINKS)` where the kernel has it (5.6+),
//! otherwise by a walk from `/` that opens one component at a time with
//! `O_NOFOLLOW`. A symlink anywhere in the path is
//! [`MountError::Symlink`], never followed.
//!
//! The result is a file descriptor, not a string, so the path cannot be
//! swapped between the check and the syscall: mounts go onto
//! `/proc/self/fd/N` of the pinned target ([`fd_path`]), unmounts and
//! removals name the last component relative to the pinned parent
//! ([`PinnedPath`]).
//!
//! Deployment note: the plugin's own directories (the kubelet root, a state
//! directory) must be reached without symlinks too. If a node links
//! `/var/lib/kubelet` elsewhere, configure the real path.
//!
//! ```
//! use mount_utils::{MountError, nofollow};
//!
//! let dir = tempfile::tempdir().unwrap();
//! std::fs::create_dir(dir.path().join("real")).unwrap();
//! std::os::unix::fs::symlink("real", dir.path().join("link")).unwrap();
//!
//! assert!(nofollow::open(&dir.path().join("real")).is_ok());
//! let err = nofollow::open(&dir.path().join("link/sub")).unwrap_err();
//! assert!(matches!(err, MountError::Symlink { .. }));
//! ```

use std::ffi::{CStr, OsStr, OsString};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{FileStat, SFlag};

use crate::error::MountError;

/// Set once `openat2` turned out to be missing (ENOSYS, or refused by a
/// seccomp filter), so later calls go straight to the walk.
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

/// `openat2` may fail with EAGAIN when a rename races the lookup.
const OPENAT2_RETRIES: u32 = 8;

/// How a path is resolved; [`Resolver::Auto`] outside tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resolver {
    /// `openat2` if the kernel has it, else the walk.
    Auto,
    /// Always the component-wise `O_NOFOLLOW` walk (the old-kernel path,
    /// forced in tests).
    #[cfg_attr(not(test), allow(dead_code))]
    Walk,
}

/// Lexical normalisation, touching no filesystem: drops `.` and trailing
/// `/`, resolves `..`; a relative path stays relative.
pub fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// `path` made absolute (relative to the current directory) and lexically
/// normalised: `.` dropped, `..` applied, trailing `/` removed. Exact when
/// the path has no symlinks, which is all this module accepts.
pub fn absolute(path: &Path) -> Result<PathBuf, MountError> {
    check_nul(path)?;
    let joined;
    let path = if path.is_absolute() {
        path
    } else {
        let cwd = std::env::current_dir().map_err(|e| MountError::Stat {
            path: PathBuf::from("."),
            errno: crate::error::io_errno(&e),
        })?;
        joined = cwd.join(path);
        &joined
    };
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    Ok(out)
}

/// Opens `path` itself as an `O_PATH` descriptor without following any
/// symlink (mounts on top are followed, as any lookup does: the descriptor
/// is the root of the topmost mount there). `ENOENT` is
/// [`MountError::Stat`]; a symlink anywhere is [`MountError::Symlink`].
pub fn open(path: &Path) -> Result<OwnedFd, MountError> {
    open_with(path, Resolver::Auto)
}

pub(crate) fn open_with(path: &Path, resolver: Resolver) -> Result<OwnedFd, MountError> {
    let abs = absolute(path)?;
    let fail = |errno: Errno| resolve_error(path, errno);
    if resolver == Resolver::Auto && !NO_OPENAT2.load(Ordering::Relaxed) {
        match openat2_no_symlinks(&abs) {
            Ok(fd) => return Ok(fd),
            // seccomp profiles of older runtimes answer EPERM for syscalls
            // they do not know; the walk uses only openat.
            Err(Errno::ENOSYS | Errno::EPERM) => NO_OPENAT2.store(true, Ordering::Relaxed),
            Err(errno) => return Err(fail(errno)),
        }
    }
    walk(&abs).map_err(fail)
}

fn openat2_no_symlinks(abs: &Path) -> Result<OwnedFd, Errno> {
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS);
    let mut attempts = 0;
    loop {
        match nix::fcntl::openat2(nix::fcntl::AT_FDCWD, abs, how) {
            Err(Errno::EAGAIN) if attempts < OPENAT2_RETRIES => attempts += 1,
            other => return other,
        }
    }
}

/// Opens each component with `O_NOFOLLOW` from `/`; a symlink is ELOOP.
fn walk(abs: &Path) -> Result<OwnedFd, Errno> {
    let mut cur = nix::fcntl::open(
        "/",
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    for c in abs.components() {
        let Component::Normal(name) = c else {
            continue;
        };
        // The previous component must be a directory to look this one up.
        if !is_dir(&nix::sys::stat::fstat(&cur)?) {
            return Err(Errno::ENOTDIR);
        }
        cur = open_leaf(cur.as_fd(), name)?;
    }
    Ok(cur)
}

/// `openat(dir, name, O_PATH|O_NOFOLLOW)`; a symlink there is ELOOP.
fn open_leaf(dir: BorrowedFd<'_>, name: &OsStr) -> Result<OwnedFd, Errno> {
    let fd = nix::fcntl::openat(
        dir,
        name,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    if is_symlink_fd(fd.as_fd())? {
        return Err(Errno::ELOOP);
    }
    Ok(fd)
}

/// Whether `fd` is a symlink ([`lstat_cached`] of the descriptor).
fn is_symlink_fd(fd: BorrowedFd<'_>) -> Result<bool, Errno> {
    let st = stat_cached(fd.as_raw_fd(), c"", libc::AT_EMPTY_PATH)?;
    Ok(SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK)
}

/// `lstat` of `path` from what the kernel has cached (`statx` with
/// `AT_STATX_DONT_SYNC`): a plain `lstat` asks a network or FUSE
/// filesystem for fresh attributes, which waits as long as its server or
/// daemon does not answer (a FUSE mount before its daemon serves it, a
/// hung NFS server), while what a node asks of a path (its type, device,
/// inode, whether it is a mount root) never changes under it. Sizes and
/// times may be stale on such filesystems. Errors are the kernel's.
pub fn lstat_cached(path: &Path) -> Result<FileStat, Errno> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
    stat_cached(libc::AT_FDCWD, &c, libc::AT_SYMLINK_NOFOLLOW)
}

/// `statx(2)` of `name` relative to `dir` (`AT_FDCWD`, or a descriptor
/// with an empty name and `AT_EMPTY_PATH`), never triggering an automount:
/// the one place this crate calls it.
pub(crate) fn statx_at(
    dir: RawFd,
    name: &CStr,
    flags: libc::c_int,
    mask: libc::c_uint,
) -> Result<libc::statx, Errno> {
    let mut buf = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: a directory fd (or AT_FDCWD), a NUL-terminated name and a
    // buffer of the right type.
    let r = unsafe {
        libc::statx(
            dir,
            name.as_ptr(),
            flags | libc::AT_NO_AUTOMOUNT,
            mask,
            buf.as_mut_ptr(),
        )
    };
    Errno::result(r)?;
    // SAFETY: statx succeeded, so the kernel filled the (zeroed) buffer.
    Ok(unsafe { buf.assume_init() })
}

/// `statx(dir, name, flags | AT_STATX_DONT_SYNC)` as a `stat`.
fn stat_cached(dir: RawFd, name: &CStr, flags: libc::c_int) -> Result<FileStat, Errno> {
    let flags = flags | libc::AT_STATX_DONT_SYNC;
    let x = statx_at(dir, name, flags, libc::STATX_BASIC_STATS)?;
    // SAFETY: `stat` is plain old data; every field is set or zero.
    let mut st: FileStat = unsafe { std::mem::zeroed() };
    st.st_mode = x.stx_mode.into();
    st.st_size = x.stx_size as libc::off_t;
    st.st_ino = x.stx_ino;
    st.st_nlink = x.stx_nlink.into();
    st.st_uid = x.stx_uid;
    st.st_gid = x.stx_gid;
    st.st_dev = libc::makedev(x.stx_dev_major, x.stx_dev_minor);
    st.st_rdev = libc::makedev(x.stx_rdev_major, x.stx_rdev_minor);
    st.st_blocks = x.stx_blocks as libc::blkcnt_t;
    st.st_blksize = x.stx_blksize.into();
    Ok(st)
}

fn is_dir(st: &FileStat) -> bool {
    SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR
}

/// ELOOP means a symlink (nothing else loops without following links);
/// anything else is a failed lookup.
fn resolve_error(path: &Path, errno: Errno) -> MountError {
    if errno == Errno::ELOOP {
        MountError::Symlink {
            path: path.to_path_buf(),
        }
    } else {
        MountError::Stat {
            path: path.to_path_buf(),
            errno,
        }
    }
}

fn check_nul(path: &Path) -> Result<(), MountError> {
    if path.as_os_str().as_bytes().contains(&0) {
        return Err(MountError::InvalidArgument {
            what: "path",
            reason: "contains a NUL byte",
        });
    }
    Ok(())
}

/// `/proc/self/fd/N`: a path naming exactly what `fd` refers to, for
/// syscalls that take only paths (`mount(2)`). The kernel jumps to the
/// descriptor's file instead of walking a name that could have changed.
pub fn fd_path(fd: &impl AsRawFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// A path whose parent directory is open (resolved without symlinks), so
/// its last component can be looked up, unmounted or removed relative to
/// that directory even if someone renames or relinks the path meanwhile.
///
/// ```
/// use mount_utils::nofollow::PinnedPath;
///
/// let dir = tempfile::tempdir().unwrap();
/// let target = dir.path().join("target");
/// std::fs::create_dir(&target).unwrap();
/// let pinned = PinnedPath::new(&target).unwrap();
/// assert_eq!(pinned.name(), "target");
/// assert!(pinned.open().unwrap().is_some());
/// std::fs::remove_dir(&target).unwrap();
/// assert!(pinned.open().unwrap().is_none());
/// ```
#[derive(Debug)]
pub struct PinnedPath {
    path: PathBuf,
    parent: OwnedFd,
    name: OsString,
}

impl PinnedPath {
    /// Pins the parent of `path`. A missing parent is [`MountError::Stat`]
    /// with `ENOENT`; `/` has no parent and is refused.
    pub fn new(path: &Path) -> Result<PinnedPath, MountError> {
        Self::new_with(path, Resolver::Auto)
    }

    pub(crate) fn new_with(path: &Path, resolver: Resolver) -> Result<PinnedPath, MountError> {
        let abs = absolute(path)?;
        let (Some(parent), Some(name)) = (abs.parent(), abs.file_name()) else {
            return Err(MountError::InvalidArgument {
                what: "path",
                reason: "is the root directory",
            });
        };
        let parent_fd = open_with(parent, resolver).map_err(|e| with_path(e, path))?;
        let st = nix::sys::stat::fstat(&parent_fd).map_err(|errno| resolve_error(path, errno))?;
        if !is_dir(&st) {
            return Err(resolve_error(path, Errno::ENOTDIR));
        }
        Ok(PinnedPath {
            name: name.to_owned(),
            path: abs,
            parent: parent_fd,
        })
    }

    /// The absolute, normalised path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The last component.
    pub fn name(&self) -> &OsStr {
        &self.name
    }

    /// The open parent directory (`O_PATH`).
    pub fn parent_fd(&self) -> BorrowedFd<'_> {
        self.parent.as_fd()
    }

    /// Opens the last component (`O_PATH|O_NOFOLLOW`); `None` if it does
    /// not exist, [`MountError::Symlink`] if it is a symlink.
    pub fn open(&self) -> Result<Option<OwnedFd>, MountError> {
        match open_leaf(self.parent.as_fd(), &self.name) {
            Ok(fd) => Ok(Some(fd)),
            Err(Errno::ENOENT) => Ok(None),
            Err(errno) => Err(resolve_error(&self.path, errno)),
        }
    }

    /// `lstat` of the last component relative to the parent, from cached
    /// attributes ([`lstat_cached`]); `None` if it does not exist.
    pub fn lstat(&self) -> Result<Option<FileStat>, MountError> {
        let name = std::ffi::CString::new(self.name.as_bytes())
            .map_err(|_| resolve_error(&self.path, Errno::EINVAL))?;
        let flags = libc::AT_SYMLINK_NOFOLLOW;
        match stat_cached(self.parent.as_fd().as_raw_fd(), &name, flags) {
            Ok(st) => Ok(Some(st)),
            Err(Errno::ENOENT) => Ok(None),
            Err(errno) => Err(resolve_error(&self.path, errno)),
        }
    }

    /// `/proc/self/fd/P/NAME`: the last component looked up in the pinned
    /// parent. Use with `UMOUNT_NOFOLLOW` (or after [`open`](Self::open)
    /// checked it is no symlink): the kernel follows a symlink in the last
    /// component unless told not to.
    pub fn proc_path(&self) -> PathBuf {
        let mut p = fd_path(&self.parent);
        p.push(&self.name);
        p
    }
}

/// Re-labels an error about the parent with the path the caller gave.
fn with_path(err: MountError, path: &Path) -> MountError {
    match err {
        MountError::Symlink { .. } => MountError::Symlink {
            path: path.to_path_buf(),
        },
        MountError::Stat { errno, .. } => MountError::Stat {
            path: path.to_path_buf(),
            errno,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("real/sub")).unwrap();
        std::fs::write(d.join("real/file"), b"x").unwrap();
        std::os::unix::fs::symlink("real", d.join("link")).unwrap();
        std::os::unix::fs::symlink("real/file", d.join("filelink")).unwrap();
        std::os::unix::fs::symlink("/nonexistent", d.join("dangling")).unwrap();
        dir
    }

    #[test]
    fn both_resolvers_refuse_symlinks_anywhere() {
        let dir = tree();
        let d = dir.path();
        for resolver in [Resolver::Auto, Resolver::Walk] {
            for ok in [
                "real",
                "real/sub",
                "real/file",
                "real/sub/../file",
                "real/./sub/",
            ] {
                open_with(&d.join(ok), resolver).unwrap_or_else(|e| panic!("{ok}: {e}"));
            }
            for bad in ["link", "link/sub", "filelink", "dangling", "dangling/x"] {
                let err = open_with(&d.join(bad), resolver).unwrap_err();
                assert!(
                    matches!(&err, MountError::Symlink { path } if path == &d.join(bad)),
                    "{resolver:?} {bad}: {err}"
                );
                assert_eq!(err.errno(), Some(Errno::ELOOP));
            }
            let err = open_with(&d.join("real/absent/x"), resolver).unwrap_err();
            assert_eq!(err.errno(), Some(Errno::ENOENT), "{err}");
            let err = open_with(&d.join("real/file/x"), resolver).unwrap_err();
            assert_eq!(err.errno(), Some(Errno::ENOTDIR), "{err}");
            // A symlink skipped by `..` is never looked at, so never followed.
            open_with(&d.join("link/../real"), resolver).unwrap();
        }
    }

    #[test]
    fn pinned_path_checks_parent_and_leaf() {
        let dir = tree();
        let d = dir.path();
        for resolver in [Resolver::Auto, Resolver::Walk] {
            let p = PinnedPath::new_with(&d.join("real/sub"), resolver).unwrap();
            assert_eq!(p.path(), d.join("real/sub"));
            assert!(p.open().unwrap().is_some());
            assert!(p.lstat().unwrap().is_some());
            let p = PinnedPath::new_with(&d.join("real/none"), resolver).unwrap();
            assert!(p.open().unwrap().is_none());
            assert!(p.lstat().unwrap().is_none());
            // The leaf itself a symlink: pinned fine, refused when opened.
            let p = PinnedPath::new_with(&d.join("link"), resolver).unwrap();
            assert!(matches!(p.open(), Err(MountError::Symlink { .. })));
            // A symlink in a parent: refused at once, naming the full path.
            let err = PinnedPath::new_with(&d.join("link/sub"), resolver).unwrap_err();
            assert!(
                matches!(&err, MountError::Symlink { path } if path == &d.join("link/sub")),
                "{err}"
            );
            let err = PinnedPath::new_with(&d.join("real/file/x"), resolver).unwrap_err();
            assert_eq!(err.errno(), Some(Errno::ENOTDIR));
        }
        assert!(matches!(
            PinnedPath::new(Path::new("/")),
            Err(MountError::InvalidArgument { .. })
        ));
        assert!(matches!(
            open(Path::new("/tmp/a\0b")),
            Err(MountError::InvalidArgument { .. })
        ));
    }

    #[test]
    fn proc_path_names_the_leaf_in_the_pinned_parent() {
        let dir = tree();
        let p = PinnedPath::new(&dir.path().join("real/file")).unwrap();
        assert_eq!(std::fs::read(p.proc_path()).unwrap(), b"x");
        let fd = p.open().unwrap().unwrap();
        assert!(fd_path(&fd).starts_with("/proc/self/fd/"));
    }

    #[test]
    fn absolute_is_lexical() {
        assert_eq!(
            absolute(Path::new("/a/./b/../c/")).unwrap(),
            Path::new("/a/c")
        );
        assert_eq!(absolute(Path::new("/../..")).unwrap(), Path::new("/"));
        let rel = absolute(Path::new("x/y")).unwrap();
        assert_eq!(rel, std::env::current_dir().unwrap().join("x/y"));
    }
}
