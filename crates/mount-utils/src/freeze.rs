//! Freezing a filesystem (`FIFREEZE`/`FITHAW`) so that a set of files can be
//! copied at one point in time: every write to the filesystem blocks until
//! it is thawed, and freezing flushes dirty data first. This is what makes a
//! snapshot of several volumes write-order consistent.
//!
//! Never freeze the filesystem you are writing to (logs, state, the copy's
//! destination) or the root filesystem: the process would block on its own
//! freeze. [`FrozenFilesystem`] thaws on drop, so a panic or an early return
//! cannot leave it frozen; [`thaw`] recovers after a crash.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;

mod ioctl {
    // linux/fs.h: FIFREEZE _IOWR('X', 119, int), FITHAW _IOWR('X', 120, int).
    nix::ioctl_readwrite!(fifreeze, b'X', 119, libc::c_int);
    nix::ioctl_readwrite!(fithaw, b'X', 120, libc::c_int);
}
use ioctl::{fifreeze, fithaw};

/// Why a filesystem could not be frozen or thawed.
#[derive(Debug, thiserror::Error)]
pub enum FreezeError {
    /// The path could not be opened or inspected.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The path is on the root filesystem, which must never be frozen.
    #[error("{0} is on the root filesystem, which is never frozen")]
    RootFilesystem(PathBuf),
    /// The kernel refused (`EOPNOTSUPP`: the filesystem cannot freeze;
    /// `EBUSY`: already frozen; `EPERM`: needs CAP_SYS_ADMIN).
    #[error("{op} {path}: {errno}")]
    Ioctl {
        /// FIFREEZE or FITHAW.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// What the kernel said.
        errno: Errno,
    },
}

fn open(path: &Path) -> Result<File, FreezeError> {
    File::open(path).map_err(|source| FreezeError::Io {
        path: path.to_owned(),
        source,
    })
}

/// The device number of the filesystem holding `path`.
pub fn filesystem_id(path: &Path) -> Result<u64, FreezeError> {
    std::fs::metadata(path)
        .map(|m| m.dev())
        .map_err(|source| FreezeError::Io {
            path: path.to_owned(),
            source,
        })
}

/// Whether `a` and `b` are on the same filesystem.
pub fn same_filesystem(a: &Path, b: &Path) -> Result<bool, FreezeError> {
    Ok(filesystem_id(a)? == filesystem_id(b)?)
}

/// A frozen filesystem; thawed when dropped.
#[derive(Debug)]
pub struct FrozenFilesystem {
    file: File,
    path: PathBuf,
    /// Set by [`FrozenFilesystem::thaw`], so the drop that closes the file
    /// does not thaw again.
    thawed: bool,
}

impl FrozenFilesystem {
    /// Freezes the filesystem that holds `path` (refusing the root filesystem).
    pub fn freeze(path: &Path) -> Result<Self, FreezeError> {
        if same_filesystem(path, Path::new("/"))? {
            return Err(FreezeError::RootFilesystem(path.to_owned()));
        }
        let file = open(path)?;
        let mut arg: libc::c_int = 0;
        // SAFETY: FIFREEZE takes an int argument; the fd is valid.
        unsafe { fifreeze(file.as_raw_fd(), &mut arg) }.map_err(|errno| FreezeError::Ioctl {
            op: "FIFREEZE",
            path: path.to_owned(),
            errno,
        })?;
        Ok(Self {
            file,
            path: path.to_owned(),
            thawed: false,
        })
    }

    /// Thaws now, reporting an error the drop would have to ignore.
    pub fn thaw(mut self) -> Result<(), FreezeError> {
        self.thawed = true;
        // Dropping `self` closes the file: an open fd would keep the
        // filesystem busy (EBUSY on unmount).
        thaw_file(&self.file, &self.path)
    }
}

impl Drop for FrozenFilesystem {
    fn drop(&mut self) {
        if self.thawed {
            return;
        }
        if let Err(e) = thaw_file(&self.file, &self.path) {
            tracing::error!(error = %e, "thawing a frozen filesystem failed");
        }
    }
}

fn thaw_file(file: &File, path: &Path) -> Result<(), FreezeError> {
    let mut arg: libc::c_int = 0;
    // SAFETY: FITHAW takes an int argument; the fd is valid.
    unsafe { fithaw(file.as_raw_fd(), &mut arg) }
        .map(drop)
        .map_err(|errno| FreezeError::Ioctl {
            op: "FITHAW",
            path: path.to_owned(),
            errno,
        })
}

/// Thaws the filesystem holding `path` if it is frozen (after a crash while
/// frozen); returns whether it was. Idempotent.
pub fn thaw(path: &Path) -> Result<bool, FreezeError> {
    let file = open(path)?;
    match thaw_file(&file, path) {
        Ok(()) => Ok(true),
        // EINVAL: not frozen.
        Err(FreezeError::Ioctl {
            errno: Errno::EINVAL,
            ..
        }) => Ok(false),
        Err(e) => Err(e),
    }
}
