//! Crash-safe state files for drivers that keep their own records.
//!
//! A state file is replaced atomically: the new contents go to a temporary
//! file in the same directory, which is fsynced, renamed over the old file,
//! and then the directory is fsynced so the rename itself is durable. A crash
//! at any point leaves either the old or the new file, never a torn one.

use std::fs::{self, File};
use std::io::{self, Write};
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Why a state file could not be read or written.
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
    /// The file exists but is not valid JSON for the expected type. Contents
    /// are not echoed: they may hold volume parameters.
    #[error("state file {path} is not valid: {reason}")]
    Corrupt {
        /// The state file.
        path: PathBuf,
        /// What the decoder said (line and column, no contents).
        reason: String,
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

/// A JSON state file holding one value of type `T`.
///
/// ```
/// use csi_driver::persist::JsonStateFile;
/// use std::collections::BTreeMap;
///
/// let dir = tempfile::tempdir().unwrap();
/// let file = JsonStateFile::<BTreeMap<String, u64>>::new(dir.path().join("state.json"));
/// let mut state = file.load().unwrap(); // missing file: the default value
/// state.insert("vol-1".into(), 1 << 30);
/// file.save(&state).unwrap();
/// assert_eq!(file.load().unwrap(), state);
/// ```
#[derive(Debug, Clone)]
pub struct JsonStateFile<T> {
    path: PathBuf,
    _value: PhantomData<fn() -> T>,
}

impl<T: Serialize + DeserializeOwned + Default> JsonStateFile<T> {
    /// A state file at `path` (its directory must exist when saving).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            _value: PhantomData,
        }
    }

    /// Where the state lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the state; a missing file is the default value. Temporary files
    /// left by a crash during an earlier save are removed.
    pub fn load(&self) -> Result<T, PersistError> {
        self.remove_stale_temporaries();
        let bytes = match fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(T::default()),
            Err(source) => {
                return Err(PersistError::Io {
                    path: self.path.clone(),
                    source,
                });
            }
        };
        serde_json::from_slice(&bytes).map_err(|e| PersistError::Corrupt {
            path: self.path.clone(),
            reason: format!(
                "{:?} at line {} column {}",
                e.classify(),
                e.line(),
                e.column()
            ),
        })
    }

    /// Replaces the state atomically.
    pub fn save(&self, value: &T) -> Result<(), PersistError> {
        let bytes = serde_json::to_vec_pretty(value).map_err(|e| PersistError::Io {
            path: self.path.clone(),
            source: io::Error::other(e),
        })?;
        write_atomic(&self.path, &bytes)
    }

    fn remove_stale_temporaries(&self) {
        let Some(dir) = self.path.parent() else {
            return;
        };
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with(".tmp-state-")
            {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn save_replaces_and_load_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let file = JsonStateFile::<BTreeMap<String, i64>>::new(dir.path().join("s.json"));
        assert!(file.load().unwrap().is_empty());
        let mut v = BTreeMap::new();
        for i in 0..5 {
            v.insert(format!("k{i}"), i);
            file.save(&v).unwrap();
        }
        assert_eq!(file.load().unwrap(), v);
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["s.json"], "no temporary files remain");
    }

    #[test]
    fn crash_leftovers_are_cleaned_and_corruption_is_reported_without_contents() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.json");
        fs::write(dir.path().join(".tmp-state-abc"), b"half").unwrap();
        let file = JsonStateFile::<BTreeMap<String, i64>>::new(&path);
        assert!(file.load().unwrap().is_empty());
        assert!(!dir.path().join(".tmp-state-abc").exists());
        fs::write(&path, b"{\"password\": \"hunter2\"").unwrap();
        let err = file.load().unwrap_err().to_string();
        assert!(
            err.contains("not valid") && !err.contains("hunter2"),
            "{err}"
        );
    }
}
