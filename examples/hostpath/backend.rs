//! Where volume and snapshot data lives under the state directory, and the
//! blocking file operations on it. Callers validate ids first
//! ([`IdKind::is_valid`](crate::store::IdKind::is_valid)), so every path here
//! is `root/<kind>/<generated id>`.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::common::{copy_sparse, create_sparse, grow_file, internal, remove_file_if_present};
use crate::store::Access;
use csi_server::CsiError;

/// The directory layout of one driver instance.
#[derive(Debug, Clone)]
pub struct Backend {
    root: PathBuf,
    snapshots: PathBuf,
    /// The state filesystem enforces project quotas: directory volumes get
    /// their capacity as a hard limit.
    quotas: bool,
}

/// The quota project of a directory volume: a stable hash of its id (never
/// 0, the default project).
fn project_id(volume_id: &str) -> u32 {
    let hash = volume_id.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    hash | 1
}

impl Backend {
    /// Creates the layout: volumes under `root/volumes`, snapshots under
    /// `snapshots` (default `root/snapshots`); mode 0750 directories.
    pub fn new(root: &Path, snapshots: Option<&Path>) -> io::Result<Self> {
        let snapshots = snapshots.map_or_else(|| root.join("snapshots"), Path::to_owned);
        // The state file records volume parameters: keep the tree private.
        for dir in [root.to_owned(), root.join("volumes"), snapshots.clone()] {
            fs::create_dir_all(&dir)?;
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o750))?;
        }
        let quotas = csi_kit::mount::quota::supported(root);
        Ok(Self {
            root: root.to_owned(),
            snapshots,
            quotas,
        })
    }

    /// Whether a group snapshot can be write-order consistent: the volumes'
    /// filesystem can be frozen (it is not the root filesystem) and the
    /// copies go to another filesystem, which stays writable meanwhile.
    pub fn consistent_group_snapshots(&self) -> bool {
        use csi_kit::mount::freeze::same_filesystem;
        matches!(
            (
                same_filesystem(&self.root, Path::new("/")),
                same_filesystem(&self.root, &self.snapshots)
            ),
            (Ok(false), Ok(false))
        )
    }

    /// The state directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory (mount access) or file (block access) holding a volume.
    pub fn volume_path(&self, id: &str, access: Access) -> PathBuf {
        match access {
            Access::Mount => self.root.join("volumes").join(id),
            Access::Block => self.root.join("volumes").join(format!("{id}.img")),
        }
    }

    /// The archive (mount access) or image copy (block access) of a snapshot.
    pub fn snapshot_path(&self, id: &str, access: Access) -> PathBuf {
        match access {
            Access::Mount => self.snapshots.join(format!("{id}.tar")),
            Access::Block => self.snapshots.join(format!("{id}.img")),
        }
    }

    /// Whether directory volumes are limited by project quotas.
    pub fn quotas(&self) -> bool {
        self.quotas
    }

    /// Creates a directory volume's directory, in its own quota project
    /// limited to `size` when quotas are on (before any data goes in, so
    /// everything inside inherits the project).
    fn volume_dir(&self, id: &str, size: i64) -> Result<PathBuf, CsiError> {
        use csi_kit::mount::quota;
        let path = self.volume_path(id, Access::Mount);
        fs::create_dir_all(&path).map_err(|e| internal("creating", &path, e))?;
        if self.quotas {
            quota::set_project(&path, project_id(id))
                .map_err(|e| internal("quota project of", &path, e))?;
            self.grow_mount(id, size)?;
        }
        Ok(path)
    }

    /// Sets a directory volume's quota to `size` (no-op without quotas).
    pub fn grow_mount(&self, id: &str, size: i64) -> Result<(), CsiError> {
        if self.quotas {
            csi_kit::mount::quota::set_limit(&self.root, project_id(id), size.max(0) as u64)
                .map_err(|e| internal("quota of", &self.volume_path(id, Access::Mount), e))?;
        }
        Ok(())
    }

    /// Creates an empty volume of `size` bytes (block: a sparse file).
    pub fn create_volume(&self, id: &str, access: Access, size: i64) -> Result<(), CsiError> {
        let path = self.volume_path(id, access);
        match access {
            Access::Mount => self.volume_dir(id, size).map(drop),
            Access::Block => create_sparse(&path, size),
        }
    }

    /// Removes a volume's data; absent data is fine (idempotent delete).
    pub fn delete_volume(&self, id: &str, access: Access) -> Result<(), CsiError> {
        let path = self.volume_path(id, access);
        match access {
            Access::Mount => {
                match fs::remove_dir_all(&path) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => {
                        return Err(internal("removing", &path, e));
                    }
                    _ => {}
                }
                if self.quotas {
                    let _ = csi_kit::mount::quota::clear(&self.root, project_id(id));
                }
                Ok(())
            }
            Access::Block => remove_file_if_present(&path),
        }
    }

    /// Grows a block volume's backing file (never shrinks it).
    pub fn grow_block(&self, id: &str, size: i64) -> Result<(), CsiError> {
        grow_file(&self.volume_path(id, Access::Block), size)
    }

    /// Cuts a snapshot of a volume: a tar archive of a directory, or a sparse
    /// (reflinked where the filesystem can) copy of an image.
    pub fn snapshot(
        &self,
        volume_id: &str,
        snapshot_id: &str,
        access: Access,
    ) -> Result<(), CsiError> {
        let src = self.volume_path(volume_id, access);
        let dst = self.snapshot_path(snapshot_id, access);
        match access {
            Access::Mount => {
                let tmp = dst.with_extension("tar.partial");
                let file = File::create(&tmp).map_err(|e| internal("creating", &tmp, e))?;
                let mut builder = tar::Builder::new(file);
                builder.follow_symlinks(false);
                builder
                    .append_dir_all(".", &src)
                    .map_err(|e| internal("archiving", &src, e))?;
                let file = builder
                    .into_inner()
                    .map_err(|e| internal("archiving", &src, e))?;
                file.sync_all().map_err(|e| internal("syncing", &tmp, e))?;
                fs::rename(&tmp, &dst).map_err(|e| internal("renaming", &tmp, e))
            }
            Access::Block => copy_sparse(&src, &dst),
        }
    }

    /// Fills a new volume from a snapshot, then grows it to `size`.
    pub fn restore(
        &self,
        snapshot_id: &str,
        volume_id: &str,
        access: Access,
        size: i64,
    ) -> Result<(), CsiError> {
        let src = self.snapshot_path(snapshot_id, access);
        let dst = self.volume_path(volume_id, access);
        match access {
            Access::Mount => {
                let dst = self.volume_dir(volume_id, size)?;
                let file = File::open(&src).map_err(|e| internal("opening", &src, e))?;
                let mut archive = tar::Archive::new(file);
                archive.set_preserve_permissions(true);
                archive
                    .unpack(&dst)
                    .map_err(|e| internal("restoring into", &dst, e))
            }
            Access::Block => {
                copy_sparse(&src, &dst)?;
                self.grow_block(volume_id, size)
            }
        }
    }

    /// Fills a new volume with a copy of another.
    pub fn clone_volume(
        &self,
        source_id: &str,
        volume_id: &str,
        access: Access,
        size: i64,
    ) -> Result<(), CsiError> {
        let src = self.volume_path(source_id, access);
        let dst = self.volume_path(volume_id, access);
        match access {
            Access::Mount => {
                // A tar stream through memory-bounded pipes would be fancier; a
                // temporary archive keeps it simple and restartable.
                let tmp_id = format!("clone-{volume_id}");
                self.snapshot(source_id, &tmp_id, access)?;
                let result = self.restore(&tmp_id, volume_id, access, size);
                let _ = fs::remove_file(self.snapshot_path(&tmp_id, access));
                result
            }
            Access::Block => {
                copy_sparse(&src, &dst)?;
                self.grow_block(volume_id, size)
            }
        }
    }

    /// Removes a snapshot's data; absent data is fine.
    pub fn delete_snapshot(&self, id: &str, access: Access) -> Result<(), CsiError> {
        remove_file_if_present(&self.snapshot_path(id, access))
    }

    /// Entries in `volumes/` that no record knows about.
    pub fn orphans(&self, known: impl Fn(&str) -> bool) -> Vec<PathBuf> {
        let Ok(entries) = fs::read_dir(self.root.join("volumes")) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                !known(name.strip_suffix(".img").unwrap_or(&name))
            })
            .map(|e| e.path())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::IdKind;

    #[test]
    fn mount_volumes_snapshot_restore_and_clone() {
        let dir = tempfile::tempdir().unwrap();
        let b = Backend::new(dir.path(), None).unwrap();
        let (v1, v2, v3, s1) = (
            IdKind::Volume.generate(),
            IdKind::Volume.generate(),
            IdKind::Volume.generate(),
            IdKind::Snapshot.generate(),
        );
        b.create_volume(&v1, Access::Mount, 1 << 20).unwrap();
        fs::create_dir(b.volume_path(&v1, Access::Mount).join("sub")).unwrap();
        fs::write(b.volume_path(&v1, Access::Mount).join("sub/data"), b"hello").unwrap();
        b.snapshot(&v1, &s1, Access::Mount).unwrap();
        b.restore(&s1, &v2, Access::Mount, 1 << 20).unwrap();
        assert_eq!(
            fs::read(b.volume_path(&v2, Access::Mount).join("sub/data")).unwrap(),
            b"hello"
        );
        b.clone_volume(&v1, &v3, Access::Mount, 1 << 20).unwrap();
        assert_eq!(
            fs::read(b.volume_path(&v3, Access::Mount).join("sub/data")).unwrap(),
            b"hello"
        );
        let known = [v1.clone(), v2.clone()];
        assert_eq!(
            b.orphans(|id| known.iter().any(|k| k == id)),
            vec![b.volume_path(&v3, Access::Mount)]
        );
        for v in [&v1, &v2, &v3] {
            b.delete_volume(v, Access::Mount).unwrap();
            b.delete_volume(v, Access::Mount).unwrap();
        }
        b.delete_snapshot(&s1, Access::Mount).unwrap();
        b.delete_snapshot(&s1, Access::Mount).unwrap();
    }

    #[test]
    fn block_volumes_are_sparse_and_grow() {
        let dir = tempfile::tempdir().unwrap();
        let b = Backend::new(dir.path(), None).unwrap();
        let (v1, v2, s1) = (
            IdKind::Volume.generate(),
            IdKind::Volume.generate(),
            IdKind::Snapshot.generate(),
        );
        b.create_volume(&v1, Access::Block, 64 << 20).unwrap();
        let len = |p: PathBuf| fs::metadata(p).unwrap().len();
        assert_eq!(len(b.volume_path(&v1, Access::Block)), 64 << 20);
        use std::os::unix::fs::MetadataExt;
        assert!(
            fs::metadata(b.volume_path(&v1, Access::Block))
                .unwrap()
                .blocks()
                * 512
                < 1 << 20,
            "sparse"
        );
        b.grow_block(&v1, 128 << 20).unwrap();
        b.grow_block(&v1, 1 << 20).unwrap();
        assert_eq!(
            len(b.volume_path(&v1, Access::Block)),
            128 << 20,
            "never shrinks"
        );
        b.snapshot(&v1, &s1, Access::Block).unwrap();
        b.restore(&s1, &v2, Access::Block, 256 << 20).unwrap();
        assert_eq!(len(b.volume_path(&v2, Access::Block)), 256 << 20);
    }
}
