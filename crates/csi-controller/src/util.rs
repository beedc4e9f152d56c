//! Small pieces every controller needs: ids that are safe as paths, the
//! access type and content source of a volume, error classification of
//! I/O failures, sparse files, time stamps and wire maps.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};

use csi_driver::helpers::paging::{Page, paginate};
use csi_driver::{CsiError, CsiResult};
use csi_proto::v1::{VolumeCapability, VolumeContentSource, volume_content_source};
use serde::{Deserialize, Serialize};

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

/// clap value parser for sizes in bytes or with a suffix (10Gi).
pub fn parse_size(text: &str) -> Result<i64, String> {
    csi_proto::size::parse_bytes(text).ok_or_else(|| format!("{text:?} is not a size like 10Gi"))
}

/// Nanoseconds since the epoch (0 if the clock is before it).
pub fn now_nanos() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0)
}

/// A protobuf timestamp from [`now_nanos`]-style nanoseconds.
pub fn timestamp(nanos: i128) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: (nanos / 1_000_000_000) as i64,
        nanos: (nanos % 1_000_000_000) as i32,
    }
}

/// A wire map from a stored (sorted) one.
pub fn to_map(m: &BTreeMap<String, String>) -> HashMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// A stored (sorted, so records are stable) map from a wire one.
pub fn sorted(m: &HashMap<String, String>) -> BTreeMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// How a volume is consumed: the access type it was created for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Access {
    /// Through a filesystem.
    Mount,
    /// As a raw block device.
    Block,
}

impl Access {
    /// The one access type of a set of capabilities (mixing is INVALID_ARGUMENT).
    pub fn of(caps: &[VolumeCapability]) -> CsiResult<Access> {
        let block = caps.iter().any(VolumeCapability::is_block);
        let mount = caps.iter().any(|c| !c.is_block());
        match (block, mount) {
            (true, true) => Err(CsiError::invalid(
                "volume_capabilities",
                "cannot mix block and mount access for one volume",
            )),
            (true, false) => Ok(Access::Block),
            _ => Ok(Access::Mount),
        }
    }

    /// Whether `cap` asks for this access type.
    pub fn fits(self, cap: &VolumeCapability) -> bool {
        cap.is_block() == (self == Access::Block)
    }
}

/// Where a volume's initial contents came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Source {
    /// Restored from a snapshot.
    Snapshot(String),
    /// Cloned from a volume.
    Volume(String),
}

impl Source {
    /// The source a CreateVolume request names, if any.
    pub fn of(content: Option<&VolumeContentSource>) -> Option<Source> {
        match content?.r#type.as_ref()? {
            volume_content_source::Type::Snapshot(s) => {
                Some(Source::Snapshot(s.snapshot_id.clone()))
            }
            volume_content_source::Type::Volume(v) => Some(Source::Volume(v.volume_id.clone())),
        }
    }

    /// The wire form.
    pub fn message(&self) -> VolumeContentSource {
        use volume_content_source::{SnapshotSource, Type, VolumeSource};
        VolumeContentSource {
            r#type: Some(match self {
                Source::Snapshot(id) => Type::Snapshot(SnapshotSource {
                    snapshot_id: id.clone(),
                }),
                Source::Volume(id) => Type::Volume(VolumeSource {
                    volume_id: id.clone(),
                }),
            }),
        }
    }
}

pub use csi_driver::helpers::confirm::confirmed;

/// One page of `all` (csi-driver's paging rules), each entry mapped by `entry`.
pub fn page<T, E>(
    all: Vec<&T>,
    max_entries: i32,
    starting_token: &str,
    entry: impl Fn(&T) -> E,
) -> CsiResult<(Vec<E>, String)> {
    paginate(all, max_entries, starting_token).map(
        |Page {
             entries,
             next_token,
         }| (entries.into_iter().map(entry).collect(), next_token),
    )
}

/// Kinds of generated ids, each with its prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdKind {
    /// `vol-<32 hex>`.
    Volume,
    /// `snap-<32 hex>`.
    Snapshot,
    /// `group-<32 hex>`.
    GroupSnapshot,
}

impl IdKind {
    fn prefix(self) -> &'static str {
        match self {
            IdKind::Volume => "vol-",
            IdKind::Snapshot => "snap-",
            IdKind::GroupSnapshot => "group-",
        }
    }

    /// A fresh id.
    pub fn generate(self) -> String {
        format!("{}{}", self.prefix(), uuid::Uuid::new_v4().simple())
    }

    /// Whether `id` is one the engine could have generated. Ids become
    /// paths, so anything else (`../../etc`, `a/b`, NUL) is rejected before
    /// it touches the filesystem.
    pub fn is_valid(self, id: &str) -> bool {
        id.strip_prefix(self.prefix()).is_some_and(|hex| {
            hex.len() == 32
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        })
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
    fn ids_are_validated_before_use_as_paths() {
        let id = IdKind::Volume.generate();
        assert!(IdKind::Volume.is_valid(&id));
        assert!(!IdKind::Snapshot.is_valid(&id));
        for bad in [
            "../../etc",
            "vol-../../etc",
            "vol-",
            "vol-a/b",
            "vol-\0",
            &format!("{id}x"),
            &id.to_uppercase(),
        ] {
            assert!(!IdKind::Volume.is_valid(bad), "{bad:?}");
        }
    }

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
