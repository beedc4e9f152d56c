//! Files for local-data backends: I/O failures classified (a full disk is
//! RESOURCE_EXHAUSTED), sparse images, removal that never follows a
//! symlink, free space, and what a data directory holds for the startup
//! sweep.

use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};

use csi_driver::{CsiError, CsiResult};

use crate::ids::IdKind;

/// An INTERNAL error naming the path it happened on.
pub fn internal(what: &str, path: &Path, e: impl std::fmt::Display) -> CsiError {
    CsiError::Internal(format!("{what} {}: {e}", path.display()))
}

/// An I/O failure on `path`: RESOURCE_EXHAUSTED when the filesystem (or a
/// quota) is full, so the CO backs off instead of retrying at once;
/// INTERNAL otherwise.
pub fn io_failure(what: &str, path: &Path, e: std::io::Error) -> CsiError {
    if matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)) {
        return CsiError::ResourceExhausted(format!("{what} {}: {e}", path.display()));
    }
    internal(what, path, e)
}

/// A failed copy, as [`io_failure`] classifies it.
pub fn copy_failure(e: tree_copy::CopyError) -> CsiError {
    if e.is_no_space() {
        CsiError::ResourceExhausted(e.to_string())
    } else {
        CsiError::Internal(e.to_string())
    }
}

/// Creates (or keeps) a sparse file of `size` bytes, synced.
pub fn create_sparse(path: &Path, size: i64) -> CsiResult<()> {
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| io_failure("creating", path, e))?;
    f.set_len(size as u64)
        .map_err(|e| io_failure("sizing", path, e))?;
    f.sync_all().map_err(|e| io_failure("syncing", path, e))
}

/// Grows a file to `size` bytes (never shrinks it).
pub fn grow_file(path: &Path, size: i64) -> CsiResult<()> {
    let f = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| internal("opening", path, e))?;
    let current = f
        .metadata()
        .map_err(|e| internal("reading", path, e))?
        .len();
    if (size as u64) > current {
        f.set_len(size as u64)
            .map_err(|e| io_failure("growing", path, e))?;
        f.sync_all().map_err(|e| io_failure("syncing", path, e))?;
    }
    Ok(())
}

/// Copies an image to a new file, sharing extents where the filesystem can
/// and keeping holes otherwise, synced. Nothing is left at `dst` on error.
pub fn copy_sparse(src: &Path, dst: &Path) -> CsiResult<()> {
    tree_copy::copy_file(src, dst)
        .map(drop)
        .map_err(copy_failure)
}

/// Removes a file or a whole directory (symlinks are removed, never
/// followed); true if there was one.
pub fn remove_path(path: &Path) -> CsiResult<bool> {
    let result = match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) => Err(e),
    };
    match result {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(internal("removing", path, e)),
    }
}

/// Free bytes of the filesystem holding `dir` (0 when it cannot be read).
pub fn free_space(dir: &Path) -> i64 {
    nix::sys::statvfs::statvfs(dir)
        .map(|s| s.blocks_available() as i64 * s.fragment_size() as i64)
        .unwrap_or(0)
}

/// Data by id: (id, path) pairs.
pub type DataById = Vec<(String, PathBuf)>;

/// What a backend's data directories hold, for the startup sweep.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct DataOnDisk {
    /// Volume data by id.
    pub volumes: DataById,
    /// Snapshot data by id (an empty id: leftovers of no id, always removed).
    pub snapshots: DataById,
    /// Entries that are not this driver's: logged, never touched.
    pub foreign: Vec<PathBuf>,
}

/// What a data directory holds: entries named `<id><suffix>` for an id of
/// `kind` (with the id), and every other entry.
pub fn data_by_id(dir: &Path, kind: IdKind, suffixes: &[&str]) -> (DataById, Vec<PathBuf>) {
    let (mut ours, mut other) = (Vec::new(), Vec::new());
    let Ok(entries) = fs::read_dir(dir) else {
        return (ours, other);
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let id = name.to_str().and_then(|n| {
            suffixes
                .iter()
                .filter_map(|s| n.strip_suffix(s))
                .find(|id| kind.is_valid(id))
        });
        match id {
            Some(id) => ours.push((id.to_owned(), entry.path())),
            None => other.push(entry.path()),
        }
    }
    ours.sort();
    other.sort();
    (ours, other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_files_grow_never_shrink_and_removal_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        create_sparse(&a, 8 << 20).unwrap();
        grow_file(&a, 16 << 20).unwrap();
        grow_file(&a, 1 << 20).unwrap();
        assert_eq!(fs::metadata(&a).unwrap().len(), 16 << 20);
        copy_sparse(&a, &b).unwrap();
        assert_eq!(fs::metadata(&b).unwrap().len(), 16 << 20);
        assert!(remove_path(&b).unwrap());
        assert!(!remove_path(&b).unwrap());
        assert!(!b.exists());
    }

    #[test]
    fn data_is_sorted_by_id_and_foreign_names_are_set_apart() {
        let dir = tempfile::tempdir().unwrap();
        let id = IdKind::Volume.generate();
        fs::create_dir(dir.path().join(&id)).unwrap();
        fs::write(dir.path().join(format!("{id}.img")), b"").unwrap();
        fs::write(dir.path().join("lost+found"), b"").unwrap();
        fs::write(dir.path().join(format!("{id}.bak")), b"").unwrap();
        let (ours, other) = data_by_id(dir.path(), IdKind::Volume, &["", ".img"]);
        assert_eq!(ours.len(), 2);
        assert!(ours.iter().all(|(i, _)| i == &id));
        assert_eq!(other.len(), 2);
    }

    #[test]
    fn full_disks_are_resource_exhausted() {
        let e = io_failure(
            "w",
            Path::new("/x"),
            std::io::Error::from_raw_os_error(libc::ENOSPC),
        );
        assert!(matches!(e, CsiError::ResourceExhausted(_)));
        let e = io_failure(
            "w",
            Path::new("/x"),
            std::io::Error::from_raw_os_error(libc::EIO),
        );
        assert!(matches!(e, CsiError::Internal(_)));
    }
}
