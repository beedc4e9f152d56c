//! [`LinuxMounter`]: the [`Mounter`] trait on real syscalls.

use std::ffi::CString;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags};
use nix::sys::stat::SFlag;
use nix::sys::statvfs::fstatvfs;

use crate::block::DeviceNumber;
use crate::error::{MountError, is_corrupted_mount_errno};
use crate::mounter::{MAX_STACKED_UNMOUNTS, MountArgs, Mounter};
use crate::mountinfo::{MountInfo, containing_mount, parse_mountinfo, stacked_at_in};
use crate::nofollow::{self, PinnedPath, absolute, fd_path};
use crate::options::{MountOptions, RedactedOptions};
use crate::source::{FsUsage, MountSource};
use crate::statmount;

mod bind;
mod newapi;
mod query;
mod sys;
mod teardown;
#[cfg(test)]
mod tests;

pub(crate) use query::{bind_source_in, refs_in};
pub(crate) use teardown::{is_absent, remove_mount_point};

use bind::{ensure_read_only, remount_flags};
use query::{mount_root_attr, statx, statx_fd, unique_mount};
use sys::{SecretBuf, cpath, nul_error, stat_error, sys_mount};
use teardown::{enoent_as, file_type};

/// Waits before an `EBUSY` unmount is tried again (31 ms in all). A child
/// that any thread of this program forks holds a copy of every descriptor
/// open then until it execs (descriptors are per process), one inside the
/// mount included: busy for that moment only. A mount that stays busy
/// (an open file, a mount below it) still fails with `EBUSY`.
const BUSY_UNMOUNT_WAITS: [std::time::Duration; 5] = [
    std::time::Duration::from_millis(1),
    std::time::Duration::from_millis(2),
    std::time::Duration::from_millis(4),
    std::time::Duration::from_millis(8),
    std::time::Duration::from_millis(16),
];

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
    statmount: bool,
}

/// Set to `off`, [`LinuxMounter::new`] reads the whole mount table for
/// questions about one mount, as on kernels before 6.8, even where the
/// kernel has `statmount(2)`: for a kernel whose `statmount` misbehaves, and
/// to run a driver on the older kernels' path.
pub const STATMOUNT_ENV: &str = "CSI_KIT_STATMOUNT";

impl Default for LinuxMounter {
    fn default() -> Self {
        Self::new()
    }
}

impl LinuxMounter {
    /// A mounter reading the calling thread's mount table (using
    /// `statmount(2)` where the kernel has it, unless [`STATMOUNT_ENV`] is
    /// `off`).
    pub fn new() -> Self {
        let thread = Path::new("/proc/thread-self/mountinfo");
        // thread-self exists since Linux 3.17.
        let path = if thread.exists() {
            thread
        } else {
            Path::new("/proc/self/mountinfo")
        };
        let statmount = std::env::var_os(STATMOUNT_ENV).is_none_or(|v| v != "off");
        Self::with_mountinfo_path(path).with_statmount(statmount)
    }

    /// A mounter reading the mount table from `path` (for example another
    /// process's `/proc/<pid>/mountinfo`).
    pub fn with_mountinfo_path(path: impl Into<PathBuf>) -> Self {
        LinuxMounter {
            mountinfo_path: path.into(),
            legacy_mount_api: false,
            statmount: true,
        }
    }

    /// With `true`, bind mounts use only `mount(2)` (bind, then remount
    /// read-only) even where the kernel has `open_tree`/`mount_setattr`/
    /// `move_mount`: the path older kernels take, selectable to test it.
    pub fn with_legacy_mount_api(mut self, legacy: bool) -> Self {
        self.legacy_mount_api = legacy;
        self
    }

    /// With `false`, questions about one mount read the whole mount table
    /// even where the kernel answers them with `statmount(2)`: the path
    /// kernels before 6.8 take, selectable to test it.
    pub fn with_statmount(mut self, statmount: bool) -> Self {
        self.statmount = statmount;
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
        Ok(!stacked_at_in(&self.read_mountinfo()?, &abs)?.is_empty())
    }
}

impl Mounter for LinuxMounter {
    fn mount_with(&self, args: &MountArgs<'_>) -> Result<(), MountError> {
        let (source, target, fstype, options) =
            (args.source, args.target, args.fstype, args.options);
        let opts = MountOptions::parse(options);
        let shown = args.redacted_options();
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
            let data = SecretBuf::build(&opts.data, args.sensitive_options)?;
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
                ensure_read_only(self, &pinned, !opts.is_remount())?;
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
        let err = |errno| MountError::moving(from, to, errno);
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
            ensure_read_only(self, &pinned, false)?;
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
        let mut waits = BUSY_UNMOUNT_WAITS.iter();
        loop {
            // The last component relative to the pinned parent, not followed.
            match nix::mount::umount2(&pinned.proc_path(), flags) {
                // EINVAL: not a mount point; ENOENT: nothing there. Both mean done.
                Ok(()) | Err(Errno::EINVAL) | Err(Errno::ENOENT) => return Ok(()),
                Err(errno) => match (errno, waits.next()) {
                    (Errno::EBUSY, Some(wait)) => std::thread::sleep(*wait),
                    _ => {
                        return Err(MountError::Unmount {
                            target: target.to_path_buf(),
                            errno,
                        });
                    }
                },
            }
        }
    }

    fn mount_points(&self) -> Result<Vec<MountInfo>, MountError> {
        Ok(parse_mountinfo(&self.read_mountinfo()?)?)
    }

    fn mount_points_where(
        &self,
        keep: &dyn Fn(u32, DeviceNumber) -> bool,
    ) -> Result<Vec<MountInfo>, MountError> {
        let data = self.read_mountinfo()?;
        Ok(crate::mountinfo::parse_mountinfo_where(&data, keep)?)
    }

    fn path_queries_read_whole_table(&self) -> bool {
        !self.statmount_agrees()
    }

    fn mounts_at(&self, path: &Path) -> Result<Vec<MountInfo>, MountError> {
        let abs = absolute(path)?;
        if let Some(found) = self.mounts_at_by_id(&abs) {
            return Ok(found);
        }
        Ok(stacked_at_in(&self.read_mountinfo()?, &abs)?)
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
        Ok(stacked_at_in(&self.read_mountinfo()?, &abs)?.pop())
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
