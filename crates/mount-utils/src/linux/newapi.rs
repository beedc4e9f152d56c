//! `open_tree(2)`, `mount_setattr(2)` and `move_mount(2)` (Linux 5.2 and
//! 5.12), which libc does not wrap.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use nix::errno::Errno;
use nix::mount::MsFlags;

use crate::mount_attr;

const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x04;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;

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
        (MsFlags::MS_RDONLY, mount_attr::RDONLY),
        (MsFlags::MS_NOSUID, mount_attr::NOSUID),
        (MsFlags::MS_NODEV, mount_attr::NODEV),
        (MsFlags::MS_NOEXEC, mount_attr::NOEXEC),
        (MsFlags::MS_NODIRATIME, mount_attr::NODIRATIME),
    ] {
        if flags.contains(ms) {
            attr.attr_set |= a;
        }
    }
    // One atime mode at a time: clear the field, set the first given.
    for (ms, a) in [
        (MsFlags::MS_NOATIME, mount_attr::NOATIME),
        (MsFlags::MS_STRICTATIME, mount_attr::STRICTATIME),
        (MsFlags::MS_RELATIME, mount_attr::RELATIME),
    ] {
        if flags.contains(ms) {
            attr.attr_clr |= mount_attr::ATIME_MASK;
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
    let r = unsafe { libc::syscall(libc::SYS_open_tree, source.as_raw_fd(), c"".as_ptr(), flags) };
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
