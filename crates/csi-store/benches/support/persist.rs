//! Crash-safe whole-state JSON files: the one-file-per-driver way of keeping
//! records that the store benchmark compares csi-store against (formerly
//! `csi_driver::persist`).
//!
//! A state file is replaced atomically: the new contents go to a temporary
//! file in the same directory, which is fsynced, renamed over the old file,
//! and then the directory is fsynced so the rename itself is durable. A crash
//! at any point leaves either the old or the new file, never a torn one.

use std::fs::File;
use std::io::{self, Write};
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// Why a state file could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// Reading, writing, syncing or renaming failed.
    #[error("state file {path}: {source}")]
    Io {
        /// The state file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

/// Replaces `path` with `contents` atomically and durably.
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<(), PersistError> {
    let io_err = |source| PersistError::Io {
        path: path.to_owned(),
        source,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".tmp-state-")
        .tempfile_in(dir)
        .map_err(io_err)?;
    tmp.write_all(contents).map_err(io_err)?;
    tmp.as_file().sync_all().map_err(io_err)?;
    tmp.persist(path).map_err(|e| io_err(e.error))?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_err)?;
    Ok(())
}

/// A JSON state file holding one value of type `T`, rewritten whole on
/// every save.
#[derive(Debug, Clone)]
pub struct JsonStateFile<T> {
    path: PathBuf,
    _value: PhantomData<fn() -> T>,
}

impl<T: Serialize> JsonStateFile<T> {
    /// A state file at `path` (its directory must exist when saving).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            _value: PhantomData,
        }
    }

    /// Replaces the state atomically.
    pub fn save(&self, value: &T) -> Result<(), PersistError> {
        let bytes = serde_json::to_vec_pretty(value).map_err(|e| PersistError::Io {
            path: self.path.clone(),
            source: io::Error::other(e),
        })?;
        write_atomic(&self.path, &bytes)
    }
}
