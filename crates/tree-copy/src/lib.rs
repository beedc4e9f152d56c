//! Copies that keep what a pod's data needs to stay usable: owner, group,
//! mode (with setuid, setgid and sticky bits), timestamps, extended
//! attributes (user xattrs, POSIX ACLs, file capabilities, security
//! labels), hard links, symlinks, FIFOs, sockets, device nodes and holes.
//! A CSI driver snapshots, restores and clones volumes with it; a restored
//! volume that lost its owner or ACLs is unreadable to a non-root pod.
//!
//! - [`copy_tree`] copies a directory tree. It walks with `openat`-family
//!   calls relative to open directories and never follows a symlink, so
//!   links inside a volume (`evil -> /etc`) are copied as links and nothing
//!   outside the source is read. Files with several links in the tree are
//!   linked again in the copy. Directories on other filesystems (mount
//!   points inside the tree) are skipped and counted. The copy's data is
//!   flushed with `syncfs` before it returns.
//! - [`copy_file`] copies one file, sharing extents (`FICLONE`) where the
//!   filesystem can and keeping holes otherwise (`SEEK_DATA`/`SEEK_HOLE`
//!   with `copy_file_range`), then syncs it.
//!
//! Keeping another user's ownership needs `CAP_CHOWN` (root); without it a
//! file that is not the caller's fails to copy rather than changing owner.
//! Errors name the operation and the path; [`CopyError::is_no_space`] tells
//! a full filesystem from other failures.
//!
//! ```
//! use std::os::unix::fs::{MetadataExt, PermissionsExt};
//!
//! let tmp = tempfile::tempdir().unwrap();
//! let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
//! std::fs::create_dir_all(src.join("sub")).unwrap();
//! std::fs::write(src.join("sub/data"), b"hello").unwrap();
//! std::fs::set_permissions(src.join("sub/data"), std::fs::Permissions::from_mode(0o640)).unwrap();
//! std::fs::hard_link(src.join("sub/data"), src.join("again")).unwrap();
//! std::os::unix::fs::symlink("/etc/passwd", src.join("link")).unwrap();
//!
//! let stats = tree_copy::copy_tree(&src, &dst).unwrap();
//! assert_eq!((stats.files, stats.hard_links, stats.symlinks), (1, 1, 1));
//! let copied = std::fs::metadata(dst.join("sub/data")).unwrap();
//! assert_eq!(copied.mode() & 0o7777, 0o640);
//! assert_eq!(copied.ino(), std::fs::metadata(dst.join("again")).unwrap().ino());
//! assert_eq!(std::fs::read_link(dst.join("link")).unwrap().to_str(), Some("/etc/passwd"));
//! ```
mod data;
mod meta;
mod tree;

use std::io;
use std::path::PathBuf;

pub use data::copy_file;
pub use tree::{TreeStats, copy_tree};

/// A copy that failed: what was being done, to which path, and why.
#[derive(Debug, thiserror::Error)]
#[error("{op} {}: {source}", path.display())]
pub struct CopyError {
    /// What was being done ("copying data of", "setting xattr ... on", ...).
    pub op: String,
    /// The source or destination path concerned.
    pub path: PathBuf,
    /// The error.
    #[source]
    pub source: io::Error,
}

impl CopyError {
    pub(crate) fn new(
        op: impl Into<String>,
        path: impl Into<PathBuf>,
        e: impl Into<io::Error>,
    ) -> Self {
        CopyError {
            op: op.into(),
            path: path.into(),
            source: e.into(),
        }
    }

    /// Whether the destination filesystem (or a quota on it) is full.
    pub fn is_no_space(&self) -> bool {
        matches!(
            self.source.raw_os_error(),
            Some(code) if code == rustix::io::Errno::NOSPC.raw_os_error()
                || code == rustix::io::Errno::DQUOT.raw_os_error()
        )
    }
}
