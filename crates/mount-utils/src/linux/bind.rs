//! Bind mounts (new mount API or `mount(2)`), remount flags, propagation.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags};
use nix::sys::statvfs::{FsFlags, fstatvfs};

use super::LinuxMounter;
use super::newapi;
use super::sys::{cpath, stat_error, sys_mount};
use super::teardown::enoent_as;
use crate::error::MountError;
use crate::mountinfo::MountInfo;
use crate::nofollow::{self, PinnedPath, fd_path};
use crate::options::{MountOptions, RedactedOptions};

impl LinuxMounter {
    pub(super) fn bind(
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
            ensure_read_only(self, &pinned, true)?;
        }
        Ok(())
    }

    pub(super) fn set_propagation(
        &self,
        target: &Path,
        propagation: MsFlags,
    ) -> Result<(), MountError> {
        let err = |errno| MountError::Propagation {
            target: target.to_path_buf(),
            propagation: format!("{propagation:?}"),
            errno,
        };
        let fd = nofollow::open(target)?;
        sys_mount(None, &cpath(&fd_path(&fd))?, None, propagation, None).map_err(err)
    }
}

/// The flags of a remount: the options', plus the current per-mount flags
/// they do not mention (the kernel would reset those; atime it keeps by
/// itself). A read-only mount stays read-only unless `rw` is given.
pub(super) fn remount_flags(opts: &MountOptions, current: &MountInfo) -> MsFlags {
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

/// Checks the mount at `pinned` is read-only; if not, unmounts it when
/// `undo` (we just made it) and fails either way.
pub(super) fn ensure_read_only(
    mounter: &LinuxMounter,
    pinned: &PinnedPath,
    undo: bool,
) -> Result<(), MountError> {
    let fd = pinned
        .open()?
        .ok_or_else(|| stat_error(pinned.path(), Errno::ENOENT))?;
    // The table first: statvfs asks the filesystem, which may not answer
    // yet (a FUSE mount its daemon serves only after this returns) or at
    // all (a network server that is down).
    let read_only = match mounter.read_only_in_table(fd.as_fd()) {
        Some(read_only) => read_only,
        None => {
            let vfs = fstatvfs(&fd).map_err(|errno| stat_error(pinned.path(), errno))?;
            vfs.flags().contains(FsFlags::ST_RDONLY)
        }
    };
    if read_only {
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
