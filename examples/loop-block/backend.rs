//! Where the disks live: `<statedir>/volumes/<id>.img` (sparse backing
//! files) and `<statedir>/snapshots/<id>.img` (sparse, reflinked where the
//! filesystem can, copies). Callers validate ids first
//! ([`IdKind::is_valid`](crate::common::IdKind::is_valid)), so every path
//! here is `root/<kind>/<generated id>.img`.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use csi_server::CsiResult;

use crate::common::state::data_by_id;
use crate::common::{IdKind, copy_sparse, create_sparse, grow_file, remove_file_if_present};

/// The directory layout of one driver instance.
#[derive(Debug, Clone)]
pub struct Backend {
    root: PathBuf,
}

impl Backend {
    /// Creates the layout under `root` (mode 0750: the state file records
    /// volume parameters, the images hold user data).
    pub fn new(root: &Path) -> io::Result<Self> {
        for dir in [
            root.to_owned(),
            root.join("volumes"),
            root.join("snapshots"),
        ] {
            fs::create_dir_all(&dir)?;
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o750))?;
        }
        Ok(Self {
            root: root.to_owned(),
        })
    }

    /// The state directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory holding the backing files.
    pub fn volumes_dir(&self) -> PathBuf {
        self.root.join("volumes")
    }

    /// The backing file of a volume.
    pub fn volume_path(&self, id: &str) -> PathBuf {
        self.volumes_dir().join(format!("{id}.img"))
    }

    /// The copy holding a snapshot.
    pub fn snapshot_path(&self, id: &str) -> PathBuf {
        self.root.join("snapshots").join(format!("{id}.img"))
    }

    /// Creates an empty (sparse) disk of `size` bytes; nothing is left on
    /// error.
    pub fn create(&self, id: &str, size: i64) -> CsiResult<()> {
        let made = create_sparse(&self.volume_path(id), size);
        if made.is_err() {
            let _ = self.delete(id);
        }
        made
    }

    /// Removes a disk's backing file; an absent one is fine.
    pub fn delete(&self, id: &str) -> CsiResult<()> {
        remove_file_if_present(&self.volume_path(id))
    }

    /// Grows a disk (never shrinks it).
    pub fn grow(&self, id: &str, size: i64) -> CsiResult<()> {
        grow_file(&self.volume_path(id), size)
    }

    /// Copies a disk into a snapshot (nothing is left on error).
    pub fn snapshot(&self, volume_id: &str, snapshot_id: &str) -> CsiResult<()> {
        copy_sparse(
            &self.volume_path(volume_id),
            &self.snapshot_path(snapshot_id),
        )
    }

    /// Fills a new disk from a snapshot or another disk, then grows it to
    /// `size`; nothing is left on error.
    pub fn copy_into(&self, src: &Path, volume_id: &str, size: i64) -> CsiResult<()> {
        let dst = self.volume_path(volume_id);
        let made = copy_sparse(src, &dst).and_then(|()| grow_file(&dst, size));
        if made.is_err() {
            let _ = self.delete(volume_id);
        }
        made
    }

    /// Removes a snapshot's copy; an absent one is fine.
    pub fn delete_snapshot(&self, id: &str) -> CsiResult<()> {
        remove_file_if_present(&self.snapshot_path(id))
    }

    /// The volume id whose backing file is `path`, if `path` is one (the
    /// node only attaches files it owns, whatever a publish context says).
    pub fn volume_of(&self, path: &Path) -> Option<String> {
        let id = path
            .strip_prefix(self.volumes_dir())
            .ok()?
            .to_str()?
            .strip_suffix(".img")?;
        IdKind::Volume.is_valid(id).then(|| id.to_owned())
    }

    /// Backing files and snapshot copies by id, and entries that are not
    /// this driver's: (disks, snapshots, other).
    pub fn data(&self) -> crate::common::state::DataOnDisk {
        let (disks, mut other) = data_by_id(&self.volumes_dir(), IdKind::Volume, &[".img"]);
        let (snapshots, other_snaps) =
            data_by_id(&self.root.join("snapshots"), IdKind::Snapshot, &[".img"]);
        other.extend(other_snaps);
        (disks, snapshots, other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disks_are_sparse_grow_copy_and_only_own_files_map_to_ids() {
        let dir = tempfile::tempdir().unwrap();
        let b = Backend::new(dir.path()).unwrap();
        let (v1, v2, s1) = (
            IdKind::Volume.generate(),
            IdKind::Volume.generate(),
            IdKind::Snapshot.generate(),
        );
        b.create(&v1, 64 << 20).unwrap();
        use std::os::unix::fs::MetadataExt;
        let meta = fs::metadata(b.volume_path(&v1)).unwrap();
        assert_eq!(meta.len(), 64 << 20);
        assert!(meta.blocks() * 512 < 1 << 20, "sparse");
        b.grow(&v1, 128 << 20).unwrap();
        b.snapshot(&v1, &s1).unwrap();
        b.copy_into(&b.snapshot_path(&s1), &v2, 256 << 20).unwrap();
        assert_eq!(fs::metadata(b.volume_path(&v2)).unwrap().len(), 256 << 20);

        assert_eq!(b.volume_of(&b.volume_path(&v1)), Some(v1.clone()));
        for bad in [
            b.snapshot_path(&s1),
            PathBuf::from("/etc/passwd"),
            b.volumes_dir().join("../state.json"),
            b.volumes_dir().join(format!("{v1}.img/../{v2}.img")),
        ] {
            assert_eq!(b.volume_of(&bad), None, "{}", bad.display());
        }
        let (disks, snapshots, other) = b.data();
        let mut want = vec![
            (v1.clone(), b.volume_path(&v1)),
            (v2.clone(), b.volume_path(&v2)),
        ];
        want.sort();
        assert_eq!(disks, want);
        assert_eq!(snapshots, vec![(s1.clone(), b.snapshot_path(&s1))]);
        assert!(other.is_empty(), "{other:?}");
        b.delete(&v2).unwrap();
        b.delete(&v2).unwrap();
        b.delete_snapshot(&s1).unwrap();
        b.delete_snapshot(&s1).unwrap();
    }
}
