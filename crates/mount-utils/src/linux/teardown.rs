//! Removing unmounted mount points, and telling absent paths apart.

use std::path::Path;

use nix::errno::Errno;
use nix::sys::stat::SFlag;

use crate::error::MountError;
use crate::nofollow::PinnedPath;

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

pub(super) fn file_type(mode: libc::mode_t) -> SFlag {
    SFlag::from_bits_truncate(mode) & SFlag::S_IFMT
}

/// An `ENOENT` while resolving becomes the operation's own error, as the
/// kernel would have reported it; other errors (symlinks) stay.
pub(super) fn enoent_as(e: MountError, op: impl Fn(Errno) -> MountError) -> MountError {
    if is_absent(&e) { op(Errno::ENOENT) } else { e }
}
