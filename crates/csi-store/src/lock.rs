//! The exclusive lock on a state directory.

use std::path::{Path, PathBuf};

use crate::error::StoreError;
use crate::fs::{FileSystem, FsFile, OpenMode, RealFs};

/// The lock file's name inside the state directory.
pub const LOCK_FILE: &str = "LOCK";

/// An exclusive `flock` on `DIR/LOCK`, held until dropped (or the process
/// ends, however it ends: the kernel releases it).
///
/// The holder writes its pid into the file so a second instance can say
/// who has the directory. Two locks on one directory conflict even inside
/// one process, since `flock` belongs to the open file.
#[derive(Debug)]
pub struct DirLock {
    // Held open for the lock; closing it releases the lock.
    _file: Box<dyn FsFile>,
    path: PathBuf,
}

impl DirLock {
    /// Takes the lock on `dir` (which must exist), or returns
    /// [`StoreError::Locked`] at once if another holder has it.
    pub fn acquire(dir: &Path) -> Result<DirLock, StoreError> {
        Self::acquire_on(&RealFs, dir)
    }

    /// [`acquire`](Self::acquire) on the filesystem `fs`.
    pub fn acquire_on(fs: &dyn FileSystem, dir: &Path) -> Result<DirLock, StoreError> {
        let path = dir.join(LOCK_FILE);
        let mut file = fs
            .open(&path, OpenMode::CreateKeep)
            .map_err(|e| StoreError::io("opening lock file", &path, e))?;
        match file.try_lock_exclusive() {
            Ok(true) => {}
            Ok(false) => {
                let mut text = Vec::new();
                let pid = file
                    .read_to_end(&mut text)
                    .ok()
                    .and_then(|_| String::from_utf8_lossy(&text).trim().parse().ok());
                return Err(StoreError::Locked {
                    dir: dir.to_owned(),
                    pid,
                });
            }
            Err(e) => return Err(StoreError::io("locking", &path, e)),
        }
        // Who holds it, for the next instance's message. Best effort: on a
        // full disk the lock still counts, only the pid is missing.
        let pid = format!("{}\n", std::process::id());
        if let Err(e) = file
            .set_len(0)
            .and_then(|_| file.write_all_at(pid.as_bytes(), 0))
        {
            tracing::debug!(path = %path.display(), error = %e, "could not record the pid in the lock file");
        }
        Ok(DirLock { _file: file, path })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_with_the_holders_pid_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path()).unwrap();
        match DirLock::acquire(dir.path()) {
            Err(StoreError::Locked { dir: d, pid }) => {
                assert_eq!(d, dir.path());
                assert_eq!(pid, Some(std::process::id()));
            }
            other => panic!("expected Locked, got {other:?}"),
        }
        assert_eq!(first.path(), dir.path().join(LOCK_FILE));
        drop(first);
        let again = DirLock::acquire(dir.path()).unwrap();
        let text = std::fs::read_to_string(again.path()).unwrap();
        assert_eq!(text.trim(), std::process::id().to_string());
    }

    #[test]
    fn a_missing_directory_is_an_io_error_naming_the_lock_file() {
        let dir = tempfile::tempdir().unwrap();
        let err = DirLock::acquire(&dir.path().join("absent")).unwrap_err();
        assert!(err.to_string().contains("absent/LOCK"), "{err}");
    }
}
