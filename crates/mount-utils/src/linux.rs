//! [`LinuxMounter`]: the [`Mounter`] trait on real syscalls.

use std::ffi::{CStr, CString};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags};
use nix::sys::stat::SFlag;
use nix::sys::statvfs::{FsFlags, fstatvfs};

use crate::block::DeviceNumber;
use crate::error::{MountError, io_errno, is_corrupted_mount_errno};
use crate::mounter::{MAX_STACKED_UNMOUNTS, Mounter};
use crate::mountinfo::{MountInfo, containing_mount, find_by_id, parse_mountinfo, stacked_at};
use crate::nofollow::{self, PinnedPath, absolute, fd_path};
use crate::options::{MountOptions, RedactedOptions, Sensitive};
use crate::source::{FsUsage, MountSource};
use crate::statmount;

/// [`Mounter`] for Linux using `mount(2)`, the new mount API, `umount2(2)`
/// and `statx(2)`.
///
/// Paths are resolved without following symlinks and acted on through file
/// descriptors (see [`nofollow`](crate::nofollow)). The mount table is read
/// from `/proc/thread-self/mountinfo`, not `/proc/self/...`: a thread that
/// called `unshare(CLONE_NEWNS)` has its own namespace, while `self` names
/// the main thread's.
#[derive(Debug, Clone)]
pub struct LinuxMounter {
    mountinfo_path: PathBuf,
    legacy_mount_api: bool,
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
        Self::with_mountinfo_path(path)
    }

    /// A mounter reading the mount table from `path` (for example another
    /// process's `/proc/<pid>/mountinfo`).
    pub fn with_mountinfo_path(path: impl Into<PathBuf>) -> Self {
        LinuxMounter {
            mountinfo_path: path.into(),
            legacy_mount_api: false,
        }
    }

    /// With `true`, bind mounts use only `mount(2)` (bind, then remount
    /// read-only) even where the kernel has `open_tree`/`mount_setattr`/
    /// `move_mount`: the path older kernels take, selectable to test it.
    pub fn with_legacy_mount_api(mut self, legacy: bool) -> Self {
        self.legacy_mount_api = legacy;
        self
    }

    /// Where the mount table is read from.
    pub fn mountinfo_path(&self) -> &Path {
        &self.mountinfo_path
    }

    /// O(1) mount point check with `statx` `STATX_ATTR_MOUNT_ROOT` on the
    /// path as given (symlinks followed: a raw query, while
    /// [`Mounter::is_mount_point`] refuses them). `Ok(None)` when the kernel
    /// does not report that attribute (before Linux 5.8, or no `statx`).
    pub fn is_mount_point_statx(&self, path: &Path) -> Result<Option<bool>, MountError> {
        match statx(path, 0, libc::STATX_TYPE) {
            Ok(stx) => Ok(mount_root_attr(&stx)),
            Err(Errno::ENOSYS) => Ok(None),
            Err(errno) => Err(stat_error(path, errno)),
        }
    }

    /// Mount point check by scanning the mount table for the path:
    /// O(number of mounts). The fallback for old kernels.
    pub fn is_mount_point_by_scan(&self, path: &Path) -> Result<bool, MountError> {
        nofollow::open(path)?;
        let abs = absolute(path)?;
        Ok(self.mount_points()?.iter().any(|m| m.mount_point == abs))
    }

    fn read_mountinfo(&self) -> Result<Vec<u8>, MountError> {
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
    fn mounts_at_by_id(&self, abs: &Path) -> Option<Vec<MountInfo>> {
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

    /// Whether statmount's entries equal this table's (checked once).
    fn statmount_agrees(&self) -> bool {
        statmount::agrees_with_table(
            || {
                unique_mount(Path::new("/"))
                    .ok()
                    .flatten()
                    .map(|(id, _)| id)
            },
            || self.mount_points().ok(),
        )
    }

    /// The mount an open descriptor is on, from its mount id; `None` when
    /// the kernel does not say (then callers scan by path).
    fn mount_of_fd(&self, fd: BorrowedFd<'_>) -> Result<Option<MountInfo>, Errno> {
        let stx = statx_fd(fd, libc::STATX_TYPE | libc::STATX_MNT_ID)?;
        if stx.stx_mask & libc::STATX_MNT_ID == 0 {
            return Ok(None);
        }
        let Ok(data) = self.read_mountinfo() else {
            return Ok(None);
        };
        Ok(find_by_id(&data, stx.stx_mnt_id as u32).ok().flatten())
    }

    fn bind(
        &self,
        source: &Path,
        target: &Path,
        recursive: bool,
        extra: MsFlags,
        shown: &RedactedOptions,
    ) -> Result<(), MountError> {
        let mount_err = |errno| MountError::Mount {
            device: source.display().to_string(),
            target: target.to_path_buf(),
            fstype: String::new(),
            options: shown.clone(),
            errno,
        };
        let src = nofollow::open(source).map_err(|e| enoent_as(e, mount_err))?;
        let pinned = PinnedPath::new(target).map_err(|e| enoent_as(e, mount_err))?;
        let tgt = pinned.open()?.ok_or_else(|| mount_err(Errno::ENOENT))?;
        let read_only = extra.contains(MsFlags::MS_RDONLY);
        tracing::debug!(source = ?source, target = ?target, read_only, recursive, "bind mount");
        let mut done = false;
        if !self.legacy_mount_api {
            match bind_new_api(src.as_fd(), tgt.as_fd(), recursive, extra) {
                Ok(()) => done = true,
                Err(NewApiError::Unsupported) => {}
                Err(NewApiError::SetAttr(errno)) => {
                    return Err(MountError::Remount {
                        target: target.to_path_buf(),
                        options: shown.clone(),
                        errno,
                    });
                }
                Err(NewApiError::Mount(errno)) => return Err(mount_err(errno)),
            }
        }
        if !done {
            let rec = if recursive {
                MsFlags::MS_REC
            } else {
                MsFlags::empty()
            };
            let (s, t) = (cpath(&fd_path(&src))?, cpath(&fd_path(&tgt))?);
            sys_mount(Some(&s), &t, None, MsFlags::MS_BIND | rec, None).map_err(mount_err)?;
            drop(tgt);
            if !extra.is_empty() {
                remount_new_bind(src.as_fd(), &pinned, extra, shown)?;
            }
        }
        if read_only {
            ensure_read_only(&pinned, true)?;
        }
        Ok(())
    }

    fn set_propagation(&self, target: &Path, propagation: MsFlags) -> Result<(), MountError> {
        let err = |errno| MountError::Propagation {
            target: target.to_path_buf(),
            propagation: format!("{propagation:?}"),
            errno,
        };
        let fd = nofollow::open(target)?;
        sys_mount(None, &cpath(&fd_path(&fd))?, None, propagation, None).map_err(err)
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
        let shown = RedactedOptions::new(options, sensitive_options);
        if opts.is_bind() && !opts.is_remount() {
            let extra = opts.flags - MsFlags::MS_BIND - MsFlags::MS_REC;
            self.bind(
                Path::new(source),
                target,
                opts.flags.contains(MsFlags::MS_REC),
                extra,
                &shown,
            )?;
        } else {
            let mount_err = |errno| MountError::Mount {
                device: source.to_owned(),
                target: target.to_path_buf(),
                fstype: fstype.to_owned(),
                options: shown.clone(),
                errno,
            };
            let src = CString::new(source).map_err(|_| nul_error("source"))?;
            let fs = if fstype.is_empty() {
                None
            } else {
                Some(CString::new(fstype).map_err(|_| nul_error("fstype"))?)
            };
            let data = SecretBuf::build(&opts.data, sensitive_options)?;
            let pinned = PinnedPath::new(target).map_err(|e| enoent_as(e, mount_err))?;
            let tgt = pinned.open()?.ok_or_else(|| mount_err(Errno::ENOENT))?;
            tracing::debug!(source, target = ?target, fstype, options = %shown, "mount");
            // Onto the descriptor: the path cannot be swapped for a symlink
            // between the check and the mount.
            let t = cpath(&fd_path(&tgt))?;
            sys_mount(Some(&src), &t, fs.as_deref(), opts.flags, data.as_cstr())
                .map_err(mount_err)?;
            drop(tgt);
            if opts.is_read_only() {
                // A remount changed an existing mount: report, do not unmount.
                ensure_read_only(&pinned, !opts.is_remount())?;
            }
        }
        if !opts.propagation.is_empty() {
            self.set_propagation(target, opts.propagation)?;
        }
        Ok(())
    }

    fn bind_mount(&self, source: &Path, target: &Path, read_only: bool) -> Result<(), MountError> {
        let (extra, shown) = if read_only {
            (MsFlags::MS_RDONLY, vec!["bind", "ro"])
        } else {
            (MsFlags::empty(), vec!["bind"])
        };
        let shown = RedactedOptions::from_flag_names(shown);
        self.bind(source, target, false, extra, &shown)
    }

    fn move_mount(&self, from: &Path, to: &Path) -> Result<(), MountError> {
        let err = |errno| MountError::Mount {
            device: from.display().to_string(),
            target: to.to_path_buf(),
            fstype: String::new(),
            options: RedactedOptions::from_flag_names(vec!["move"]),
            errno,
        };
        // Both resolved without following a symlink, then named by descriptor.
        let src = nofollow::open(from)?;
        let tgt = nofollow::open(to)?;
        let (s, t) = (cpath(&fd_path(&src))?, cpath(&fd_path(&tgt))?);
        tracing::debug!(from = ?from, to = ?to, "move mount");
        sys_mount(Some(&s), &t, None, MsFlags::MS_MOVE, None).map_err(err)
    }

    fn remount(&self, target: &Path, options: &[&str]) -> Result<(), MountError> {
        let opts = MountOptions::parse(options);
        let shown = RedactedOptions::new(options, &[]);
        if opts.is_bind() && !opts.data.is_empty() {
            return Err(MountError::InvalidArgument {
                what: "options",
                reason: "filesystem options need a remount without bind",
            });
        }
        let err = |errno| MountError::Remount {
            target: target.to_path_buf(),
            options: shown.clone(),
            errno,
        };
        let pinned = PinnedPath::new(target)?;
        let fd = pinned.open()?.ok_or_else(|| err(Errno::ENOENT))?;
        let current = self.mounted_at(target)?.ok_or_else(|| err(Errno::EINVAL))?;
        let flags = remount_flags(&opts, &current);
        let data = SecretBuf::build(&opts.data, &[])?;
        tracing::debug!(target = ?target, options = %shown, "remount");
        sys_mount(None, &cpath(&fd_path(&fd))?, None, flags, data.as_cstr()).map_err(err)?;
        drop(fd);
        if flags.contains(MsFlags::MS_RDONLY) {
            ensure_read_only(&pinned, false)?;
        }
        Ok(())
    }

    fn unmount(&self, target: &Path, lazy: bool) -> Result<(), MountError> {
        let mut flags = MntFlags::UMOUNT_NOFOLLOW;
        if lazy {
            flags |= MntFlags::MNT_DETACH;
        }
        let pinned = match PinnedPath::new(target) {
            Ok(p) => p,
            Err(e) if is_absent(&e) => return Ok(()),
            Err(e) => return Err(e),
        };
        match pinned.lstat() {
            Ok(None) => return Ok(()),
            Ok(Some(st)) if file_type(st.st_mode) == SFlag::S_IFLNK => {
                return Err(MountError::Symlink {
                    path: target.to_path_buf(),
                });
            }
            // The stat reached a dead filesystem: a mount, not a symlink.
            Err(e) if e.is_corrupted_mount() => {}
            Err(e) => return Err(e),
            Ok(Some(_)) => {}
        }
        tracing::debug!(target = ?target, lazy, "unmount");
        // The last component relative to the pinned parent, not followed.
        match nix::mount::umount2(&pinned.proc_path(), flags) {
            // EINVAL: not a mount point; ENOENT: nothing there. Both mean done.
            Ok(()) | Err(Errno::EINVAL) | Err(Errno::ENOENT) => Ok(()),
            Err(errno) => Err(MountError::Unmount {
                target: target.to_path_buf(),
                errno,
            }),
        }
    }

    fn mount_points(&self) -> Result<Vec<MountInfo>, MountError> {
        Ok(parse_mountinfo(&self.read_mountinfo()?)?)
    }

    fn mounts_at(&self, path: &Path) -> Result<Vec<MountInfo>, MountError> {
        let abs = absolute(path)?;
        if let Some(found) = self.mounts_at_by_id(&abs) {
            return Ok(found);
        }
        Ok(stacked_at(self.mount_points()?, &abs))
    }

    fn containing_mount(&self, path: &Path) -> Result<Option<MountInfo>, MountError> {
        let abs = absolute(path)?;
        if self.statmount_agrees()
            && let Ok(Some((id, _))) = unique_mount(&abs)
            && let Ok(Some(e)) = statmount::entry(id)
            && abs.starts_with(&e.info.mount_point)
        {
            return Ok(Some(e.info));
        }
        Ok(containing_mount(&self.mount_points()?, &abs).cloned())
    }

    fn mounted_at(&self, path: &Path) -> Result<Option<MountInfo>, MountError> {
        let fd = match nofollow::open(path) {
            Ok(fd) => Some(fd),
            Err(e) if is_absent(&e) => return Ok(None),
            // A dead FUSE daemon or stale NFS handle: look it up by path.
            Err(e) if e.is_corrupted_mount() => None,
            Err(e) => return Err(e),
        };
        if let Some(fd) = fd {
            match statx_fd(fd.as_fd(), libc::STATX_TYPE) {
                Ok(stx) if mount_root_attr(&stx) == Some(false) => return Ok(None),
                Ok(stx) if mount_root_attr(&stx) == Some(true) => {
                    if let Ok(Some(m)) = self.mount_of_fd(fd.as_fd()) {
                        return Ok(Some(m));
                    }
                }
                Ok(_) | Err(Errno::ENOSYS) => {}
                Err(errno) if is_corrupted_mount_errno(errno) => {}
                Err(errno) => return Err(stat_error(path, errno)),
            }
        }
        let abs = absolute(path)?;
        Ok(self
            .mount_points()?
            .into_iter()
            .rev()
            .find(|m| m.mount_point == abs))
    }

    fn block_device_at(&self, path: &Path) -> Result<Option<DeviceNumber>, MountError> {
        let fd = match nofollow::open(path) {
            Ok(fd) => fd,
            Err(e) if is_absent(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        let st = nix::sys::stat::fstat(&fd).map_err(|errno| stat_error(path, errno))?;
        Ok((file_type(st.st_mode) == SFlag::S_IFBLK).then(|| DeviceNumber::from_dev_t(st.st_rdev)))
    }

    fn bind_source(&self, source: &Path) -> Result<MountSource, MountError> {
        let fd = nofollow::open(source)?;
        let st = nix::sys::stat::fstat(&fd).map_err(|errno| stat_error(source, errno))?;
        if file_type(st.st_mode) == SFlag::S_IFBLK {
            return Ok(MountSource::DeviceNode(DeviceNumber::from_dev_t(
                st.st_rdev,
            )));
        }
        let abs = absolute(source)?;
        let by_fd = self
            .mount_of_fd(fd.as_fd())
            .map_err(|errno| stat_error(source, errno))?;
        let mount = match by_fd {
            Some(m) if abs.starts_with(&m.mount_point) => m,
            _ => containing_mount(&self.mount_points()?, &abs)
                .cloned()
                .ok_or_else(|| stat_error(source, Errno::ENOENT))?,
        };
        Ok(bind_source_in(&mount, &abs))
    }

    fn is_mount_point(&self, path: &Path) -> Result<bool, MountError> {
        let fd = nofollow::open(path)?;
        match statx_fd(fd.as_fd(), libc::STATX_TYPE) {
            Ok(stx) => {
                if let Some(answer) = mount_root_attr(&stx) {
                    return Ok(answer);
                }
            }
            Err(Errno::ENOSYS) => {}
            Err(errno) => return Err(stat_error(path, errno)),
        }
        drop(fd);
        self.is_mount_point_by_scan(path)
    }

    fn is_likely_not_mount_point(&self, path: &Path) -> Result<bool, MountError> {
        let fd = nofollow::open(path)?;
        let stat =
            |st: nix::Result<nix::sys::stat::FileStat>| st.map_err(|errno| stat_error(path, errno));
        let st = stat(nix::sys::stat::fstat(&fd))?;
        let parent_dev = if file_type(st.st_mode) == SFlag::S_IFDIR {
            // `..` of a mount root is the directory it is mounted on:
            // exactly the parent to compare with, without another lookup.
            stat(nix::sys::stat::fstatat(
                &fd,
                "..",
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            ))?
            .st_dev
        } else {
            let pinned = PinnedPath::new(path)?;
            stat(nix::sys::stat::fstat(pinned.parent_fd()))?.st_dev
        };
        // "/" is its own parent, and always a mount point.
        if absolute(path)? == Path::new("/") {
            return Ok(false);
        }
        Ok(st.st_dev == parent_dev)
    }

    fn mount_refs(&self, path: &Path) -> Result<Vec<PathBuf>, MountError> {
        match nofollow::open(path) {
            Ok(_) => {}
            Err(e) if is_absent(&e) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        }
        Ok(refs_in(&self.mount_points()?, &absolute(path)?))
    }

    fn cleanup_mount_point(&self, path: &Path) -> Result<(), MountError> {
        for _ in 0..MAX_STACKED_UNMOUNTS {
            let mounted = match self.is_mount_point(path) {
                Ok(m) => m,
                Err(e) if is_absent(&e) => return Ok(()),
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

    fn remove_mount_point(&self, path: &Path) -> Result<(), MountError> {
        match self.is_mount_point(path) {
            Ok(false) => remove_mount_point(path),
            Ok(true) => Err(MountError::Remove {
                path: path.to_path_buf(),
                errno: Errno::EBUSY,
            }),
            Err(e) if is_absent(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn fs_usage(&self, path: &Path) -> Result<FsUsage, MountError> {
        let fd = nofollow::open(path)?;
        let st = fstatvfs(&fd).map_err(|errno| stat_error(path, errno))?;
        Ok(FsUsage::from_statvfs(&st))
    }
}

/// The flags of a remount: the options', plus the current per-mount flags
/// they do not mention (the kernel would reset those; atime it keeps by
/// itself). A read-only mount stays read-only unless `rw` is given.
fn remount_flags(opts: &MountOptions, current: &MountInfo) -> MsFlags {
    let mut flags = MsFlags::MS_REMOUNT | (opts.flags - MsFlags::MS_REC - MsFlags::MS_REMOUNT);
    for (name, flag) in [
        ("ro", MsFlags::MS_RDONLY),
        ("nosuid", MsFlags::MS_NOSUID),
        ("nodev", MsFlags::MS_NODEV),
        ("noexec", MsFlags::MS_NOEXEC),
    ] {
        if !(opts.flags | opts.cleared).contains(flag) && current.has_mount_option(name) {
            flags.insert(flag);
        }
    }
    flags
}

/// Second step of a legacy bind: the kernel ignores flags on the initial
/// bind, they need a remount. Per-mount nosuid/nodev/noexec of the source
/// must be kept or the remount fails on locked mounts (user namespaces) or
/// loosens them. Undoes the bind on failure.
fn remount_new_bind(
    source: BorrowedFd<'_>,
    pinned: &PinnedPath,
    extra: MsFlags,
    shown: &RedactedOptions,
) -> Result<(), MountError> {
    let undo = || {
        let _ = nix::mount::umount2(
            &pinned.proc_path(),
            MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW,
        );
    };
    let mut flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | extra;
    match fstatvfs(source) {
        Ok(vfs) => flags |= locked_flags(vfs.flags()),
        Err(errno) => {
            undo();
            return Err(stat_error(pinned.path(), errno));
        }
    }
    // The new mount's root: the descriptor taken before the bind still
    // names the directory underneath.
    let result = match pinned.open() {
        Ok(Some(new_root)) => sys_mount(None, &cpath(&fd_path(&new_root))?, None, flags, None),
        Ok(None) => Err(Errno::ENOENT),
        Err(e) => {
            undo();
            return Err(e);
        }
    };
    result.map_err(|errno| {
        undo();
        MountError::Remount {
            target: pinned.path().to_path_buf(),
            options: shown.clone(),
            errno,
        }
    })
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

/// Checks the mount at `pinned` is read-only; if not, unmounts it when
/// `undo` (we just made it) and fails either way.
fn ensure_read_only(pinned: &PinnedPath, undo: bool) -> Result<(), MountError> {
    let fd = pinned
        .open()?
        .ok_or_else(|| stat_error(pinned.path(), Errno::ENOENT))?;
    let vfs = fstatvfs(&fd).map_err(|errno| stat_error(pinned.path(), errno))?;
    if vfs.flags().contains(FsFlags::ST_RDONLY) {
        return Ok(());
    }
    drop(fd);
    if undo {
        let _ = nix::mount::umount2(
            &pinned.proc_path(),
            MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW,
        );
    }
    tracing::warn!(target = ?pinned.path(), "mount is writable although read-only was requested");
    Err(MountError::NotReadOnly {
        target: pinned.path().to_path_buf(),
    })
}

/// Per-mount flags of a source a bind must keep.
fn locked_flags(f: FsFlags) -> MsFlags {
    let mut out = MsFlags::empty();
    for (st, ms) in [
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
    ] {
        if f.contains(st) {
            out.insert(ms);
        }
    }
    out
}

enum NewApiError {
    /// The kernel (or a seccomp filter) lacks a syscall: use `mount(2)`.
    Unsupported,
    /// `mount_setattr` failed; nothing was attached.
    SetAttr(Errno),
    /// `open_tree` or `move_mount` failed; nothing was attached.
    Mount(Errno),
}

/// Bind with the new mount API: clone the source tree detached, set its
/// attributes (read-only before anyone can see it), then attach it.
fn bind_new_api(
    source: BorrowedFd<'_>,
    target: BorrowedFd<'_>,
    recursive: bool,
    extra: MsFlags,
) -> Result<(), NewApiError> {
    let tree = newapi::open_tree(source, recursive).map_err(|errno| match errno {
        // seccomp profiles of older runtimes answer EPERM for syscalls they
        // do not know; mount(2) then says whether it is really EPERM.
        Errno::ENOSYS | Errno::EPERM => NewApiError::Unsupported,
        other => NewApiError::Mount(other),
    })?;
    let attr = newapi::attr_for(extra);
    if attr.attr_set != 0 || attr.attr_clr != 0 {
        // Dropping `tree` on error dissolves the detached copy.
        newapi::mount_setattr(tree.as_fd(), recursive, &attr).map_err(|errno| match errno {
            Errno::ENOSYS => NewApiError::Unsupported,
            other => NewApiError::SetAttr(other),
        })?;
    }
    newapi::move_mount(tree.as_fd(), target).map_err(NewApiError::Mount)
}

/// `open_tree(2)`, `mount_setattr(2)` and `move_mount(2)` (Linux 5.2 and
/// 5.12), which libc does not wrap.
mod newapi {
    use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

    use nix::errno::Errno;
    use nix::mount::MsFlags;

    const OPEN_TREE_CLONE: libc::c_uint = 1;
    const AT_RECURSIVE: libc::c_uint = 0x8000;
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x04;
    const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
    const MOUNT_ATTR_RDONLY: u64 = 0x01;
    const MOUNT_ATTR_NOSUID: u64 = 0x02;
    const MOUNT_ATTR_NODEV: u64 = 0x04;
    const MOUNT_ATTR_NOEXEC: u64 = 0x08;
    const MOUNT_ATTR_ATIME_MASK: u64 = 0x70;
    const MOUNT_ATTR_RELATIME: u64 = 0x00;
    const MOUNT_ATTR_NOATIME: u64 = 0x10;
    const MOUNT_ATTR_STRICTATIME: u64 = 0x20;
    const MOUNT_ATTR_NODIRATIME: u64 = 0x80;

    /// `struct mount_attr` (version 0, 32 bytes).
    #[repr(C)]
    pub(super) struct MountAttr {
        pub attr_set: u64,
        pub attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }

    const _: () = assert!(std::mem::size_of::<MountAttr>() == 32);

    /// The per-mount attributes among `flags`; superblock flags cannot be
    /// set on a bind and are left out, as `mount(2)` ignores them too.
    pub(super) fn attr_for(flags: MsFlags) -> MountAttr {
        let mut attr = MountAttr {
            attr_set: 0,
            attr_clr: 0,
            propagation: 0,
            userns_fd: 0,
        };
        for (ms, a) in [
            (MsFlags::MS_RDONLY, MOUNT_ATTR_RDONLY),
            (MsFlags::MS_NOSUID, MOUNT_ATTR_NOSUID),
            (MsFlags::MS_NODEV, MOUNT_ATTR_NODEV),
            (MsFlags::MS_NOEXEC, MOUNT_ATTR_NOEXEC),
            (MsFlags::MS_NODIRATIME, MOUNT_ATTR_NODIRATIME),
        ] {
            if flags.contains(ms) {
                attr.attr_set |= a;
            }
        }
        // One atime mode at a time: clear the field, set the first given.
        for (ms, a) in [
            (MsFlags::MS_NOATIME, MOUNT_ATTR_NOATIME),
            (MsFlags::MS_STRICTATIME, MOUNT_ATTR_STRICTATIME),
            (MsFlags::MS_RELATIME, MOUNT_ATTR_RELATIME),
        ] {
            if flags.contains(ms) {
                attr.attr_clr |= MOUNT_ATTR_ATIME_MASK;
                attr.attr_set |= a;
                break;
            }
        }
        attr
    }

    fn at_flags(recursive: bool) -> libc::c_uint {
        let mut f = libc::AT_EMPTY_PATH as libc::c_uint;
        if recursive {
            f |= AT_RECURSIVE;
        }
        f
    }

    pub(super) fn open_tree(source: BorrowedFd<'_>, recursive: bool) -> Result<OwnedFd, Errno> {
        let flags = OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | at_flags(recursive);
        // SAFETY: a valid fd, an empty NUL-terminated path and plain flags.
        let r =
            unsafe { libc::syscall(libc::SYS_open_tree, source.as_raw_fd(), c"".as_ptr(), flags) };
        let fd = Errno::result(r)?;
        // SAFETY: open_tree returned a new descriptor that we now own.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
    }

    pub(super) fn mount_setattr(
        tree: BorrowedFd<'_>,
        recursive: bool,
        attr: &MountAttr,
    ) -> Result<(), Errno> {
        // SAFETY: a valid fd, an empty path, and a mount_attr of the size passed.
        let r = unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                tree.as_raw_fd(),
                c"".as_ptr(),
                at_flags(recursive),
                attr as *const MountAttr,
                std::mem::size_of::<MountAttr>(),
            )
        };
        Errno::result(r).map(drop)
    }

    pub(super) fn move_mount(tree: BorrowedFd<'_>, target: BorrowedFd<'_>) -> Result<(), Errno> {
        // SAFETY: valid fds and empty NUL-terminated paths.
        let r = unsafe {
            libc::syscall(
                libc::SYS_move_mount,
                tree.as_raw_fd(),
                c"".as_ptr(),
                target.as_raw_fd(),
                c"".as_ptr(),
                MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
            )
        };
        Errno::result(r).map(drop)
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
/// (block-volume targets are files), relative to its pinned parent. A
/// symlink is refused; anything else is left alone.
pub(crate) fn remove_mount_point(path: &Path) -> Result<(), MountError> {
    let err = |errno| MountError::Remove {
        path: path.to_path_buf(),
        errno,
    };
    let pinned = match PinnedPath::new(path) {
        Ok(p) => p,
        Err(e) if is_absent(&e) => return Ok(()),
        Err(e) => return Err(e),
    };
    let Some(st) = pinned.lstat()? else {
        return Ok(());
    };
    let how = match file_type(st.st_mode) {
        SFlag::S_IFDIR => nix::unistd::UnlinkatFlags::RemoveDir,
        SFlag::S_IFREG if st.st_size == 0 => nix::unistd::UnlinkatFlags::NoRemoveDir,
        SFlag::S_IFREG => return Err(err(Errno::ENOTEMPTY)),
        SFlag::S_IFLNK => {
            return Err(MountError::Symlink {
                path: path.to_path_buf(),
            });
        }
        _ => return Err(err(Errno::ENOTDIR)),
    };
    match nix::unistd::unlinkat(pinned.parent_fd(), pinned.name(), how) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(errno) => Err(err(errno)),
    }
}

/// The path (or a parent) does not exist: nothing to do for teardown.
pub(crate) fn is_absent(e: &MountError) -> bool {
    matches!(
        e,
        MountError::Stat {
            errno: Errno::ENOENT,
            ..
        }
    )
}

fn file_type(mode: libc::mode_t) -> SFlag {
    SFlag::from_bits_truncate(mode) & SFlag::S_IFMT
}

/// An `ENOENT` while resolving becomes the operation's own error, as the
/// kernel would have reported it; other errors (symlinks) stay.
fn enoent_as(e: MountError, op: impl Fn(Errno) -> MountError) -> MountError {
    if is_absent(&e) { op(Errno::ENOENT) } else { e }
}

fn nul_error(what: &'static str) -> MountError {
    MountError::InvalidArgument {
        what,
        reason: "contains a NUL byte",
    }
}

fn stat_error(path: &Path, errno: Errno) -> MountError {
    MountError::Stat {
        path: path.to_path_buf(),
        errno,
    }
}

fn cpath(path: &Path) -> Result<CString, MountError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| nul_error("path"))
}

/// `Some(is mount root)` when the kernel reports `STATX_ATTR_MOUNT_ROOT`.
fn mount_root_attr(stx: &libc::statx) -> Option<bool> {
    let bit = libc::STATX_ATTR_MOUNT_ROOT as u64;
    (stx.stx_attributes_mask & bit != 0).then_some(stx.stx_attributes & bit != 0)
}

/// `statx` of an open descriptor (`AT_EMPTY_PATH`).
fn statx_fd(fd: BorrowedFd<'_>, mask: libc::c_uint) -> Result<libc::statx, Errno> {
    let mut buf = MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: a valid fd, an empty NUL-terminated path and a buffer of the
    // right type.
    let r = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_NO_AUTOMOUNT,
            mask,
            buf.as_mut_ptr(),
        )
    };
    Errno::result(r)?;
    // SAFETY: statx succeeded, so the kernel filled the (zeroed) buffer.
    Ok(unsafe { buf.assume_init() })
}

/// The unique id of the mount `path` is on (the topmost at `path` when it
/// is a mount root; `path` not followed if a symlink) and whether `path`
/// is that mount's root. `Ok(None)` when the kernel gives no unique ids.
fn unique_mount(path: &Path) -> Result<Option<(u64, bool)>, Errno> {
    let stx = statx(path, libc::AT_SYMLINK_NOFOLLOW, libc::STATX_MNT_ID_UNIQUE)?;
    if stx.stx_mask & libc::STATX_MNT_ID_UNIQUE == 0 {
        return Ok(None);
    }
    Ok(mount_root_attr(&stx).map(|root| (stx.stx_mnt_id, root)))
}

fn statx(path: &Path, flags: libc::c_int, mask: libc::c_uint) -> Result<libc::statx, Errno> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
    let mut buf = MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: valid NUL-terminated path and a buffer of the right type.
    let r = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            flags | libc::AT_NO_AUTOMOUNT,
            mask,
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
                return Err(nul_error("mount option"));
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
    fn bind_source_inside_a_mount() {
        let m = MountInfo::parse_line(b"2 1 8:16 /vol /staging rw - ext4 /dev/sdb rw").unwrap();
        let dev = DeviceNumber::new(8, 16);
        assert_eq!(
            bind_source_in(&m, Path::new("/staging")),
            MountSource::Bind {
                device: dev,
                root: "/vol".into()
            }
        );
        assert_eq!(
            bind_source_in(&m, Path::new("/staging/a/b")),
            MountSource::Bind {
                device: dev,
                root: "/vol/a/b".into()
            }
        );
    }

    #[test]
    fn remount_keeps_unmentioned_flags() {
        let cur = MountInfo::parse_line(b"2 1 0:5 / /t ro,nosuid,noexec - tmpfs t rw").unwrap();
        let f = remount_flags(&MountOptions::parse(&["bind", "exec"]), &cur);
        assert_eq!(
            f,
            MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID
        );
        let f = remount_flags(&MountOptions::parse(&["rw"]), &cur);
        assert_eq!(
            f,
            MsFlags::MS_REMOUNT | MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC
        );
    }

    #[test]
    fn new_api_attributes() {
        let a = newapi::attr_for(MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_SYNCHRONOUS);
        assert_eq!((a.attr_set, a.attr_clr), (0x01 | 0x02, 0));
        let a = newapi::attr_for(MsFlags::MS_NOATIME);
        assert_eq!((a.attr_set, a.attr_clr), (0x10, 0x70));
        let a = newapi::attr_for(MsFlags::empty());
        assert_eq!((a.attr_set, a.attr_clr), (0, 0));
    }

    #[test]
    fn secret_buf_joins_plain_and_sensitive() {
        let b = SecretBuf::build(&["a=1".into()], &[Sensitive::new("k=v")]).unwrap();
        assert_eq!(b.as_cstr().unwrap().to_bytes(), b"a=1,k=v");
        assert!(SecretBuf::build(&[], &[]).unwrap().as_cstr().is_none());
        assert!(SecretBuf::build(&["a\0b".into()], &[]).is_err());
    }
}
