//! Where volume and snapshot data lives under the state directory, and the
//! blocking file operations on it. Callers validate ids first
//! ([`IdKind::is_valid`](csi_controller::IdKind::is_valid)), so every path here
//! is `root/<kind>/<generated id>`.
//!
//! Directory volumes are copied (snapshots, restores, clones) with
//! [`tree_copy::copy_tree`], which keeps owners, modes, xattrs (ACLs,
//! capabilities), hard links and holes: a restored volume must work for a
//! non-root pod as the original did. A snapshot of a directory volume is a
//! directory `snapshots/<id>`; archives (`<id>.tar`) cut by earlier
//! versions still restore. Every operation that fails removes what it made.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use std::sync::{Arc, OnceLock};

use csi_controller::{
    Access, AttachBackend, AttachState, BackendResult, ContentSource, ControllerBackend,
    DataOnDisk, ExpandBackend, GroupSnapshotBackend, IdKind, ModifyBackend, SnapshotBackend,
    SnapshotRecord, VolumeRecord, copy_failure, copy_sparse, create_sparse, data_by_id, grow_file,
    internal, io_failure, remove_path,
};
use csi_server::v1::VolumeCondition;
use csi_server::{CsiError, CsiResult};

/// Removes a file; an absent one is fine.
fn remove_file_if_present(path: &Path) -> CsiResult<()> {
    remove_path(path).map(drop)
}

/// The directory layout of one driver instance.
#[derive(Clone)]
pub struct Backend {
    root: PathBuf,
    snapshots: PathBuf,
    /// The state filesystem enforces project quotas: directory volumes get
    /// their capacity as a hard limit.
    quotas: bool,
    /// The node side's record, once opened: DeleteVolume is refused while
    /// it holds the volume.
    pub node: Arc<OnceLock<csi_node::NodeVolumes>>,
    /// ControllerPublish/Unpublish are offered (`--enable-attach`).
    pub attach: bool,
}

/// Copies a directory tree as one crash point: a crash inside leaves a
/// partial copy that no record owns, which the start-up sweep removes.
fn copy_tree(src: &Path, dst: &Path) -> Result<(), CsiError> {
    crash_points::effect("copy-tree", || tree_copy::copy_tree(src, dst))
        .map(drop)
        .map_err(copy_failure)
}

/// Copies a block volume's image: one crash point.
fn copy_image(src: &Path, dst: &Path) -> Result<(), CsiError> {
    crash_points::effect("copy-image", || copy_sparse(src, dst))
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
        let quotas = mount_utils::quota::supported(root);
        Ok(Self {
            root: root.to_owned(),
            snapshots,
            quotas,
            node: Arc::default(),
            attach: false,
        })
    }

    /// Whether a group snapshot can be write-order consistent: the volumes'
    /// filesystem can be frozen (it is not the root filesystem) and the
    /// copies go to another filesystem, which stays writable meanwhile.
    pub fn consistent_group_snapshots(&self) -> bool {
        use mount_utils::freeze::same_filesystem;
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

    /// The directory of volumes.
    pub fn volumes_dir(&self) -> PathBuf {
        self.root.join("volumes")
    }

    /// The copy (mount access: a directory) or image copy (block access) of
    /// a snapshot.
    pub fn snapshot_path(&self, id: &str, access: Access) -> PathBuf {
        match access {
            Access::Mount => self.snapshots.join(id),
            Access::Block => self.snapshots.join(format!("{id}.img")),
        }
    }

    /// The archive an earlier version cut of a directory volume.
    fn legacy_archive(&self, id: &str) -> PathBuf {
        self.snapshots.join(format!("{id}.tar"))
    }

    /// Whether directory volumes are limited by project quotas.
    pub fn quotas(&self) -> bool {
        self.quotas
    }

    /// Creates a directory volume's directory, in its own quota project
    /// limited to `size` when quotas are on (before any data goes in, so
    /// everything inside inherits the project).
    fn volume_dir(&self, id: &str, size: i64) -> Result<PathBuf, CsiError> {
        use mount_utils::quota;
        let path = self.volume_path(id, Access::Mount);
        crash_points::effect("mkdir", || fs::create_dir_all(&path))
            .map_err(|e| io_failure("creating", &path, e))?;
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
            mount_utils::quota::set_limit(&self.root, project_id(id), size.max(0) as u64)
                .map_err(|e| internal("quota of", &self.volume_path(id, Access::Mount), e))?;
        }
        Ok(())
    }

    /// Creates an empty volume of `size` bytes (block: a sparse file).
    pub fn create_volume(&self, id: &str, access: Access, size: i64) -> Result<(), CsiError> {
        let path = self.volume_path(id, access);
        let made = match access {
            Access::Mount => self.volume_dir(id, size).map(drop),
            Access::Block => crash_points::effect("create-image", || create_sparse(&path, size)),
        };
        self.undo_on_error(made, || self.delete_volume(id, access))
    }

    /// `result`, after running `undo` if it is an error (whose own failure
    /// is logged: the sweep at the next start removes what is left).
    fn undo_on_error(
        &self,
        result: Result<(), CsiError>,
        undo: impl FnOnce() -> Result<(), CsiError>,
    ) -> Result<(), CsiError> {
        if result.is_err()
            && let Err(e) = undo()
        {
            tracing::error!(error = %e, "removing the remains of a failed operation");
        }
        result
    }

    /// Removes a volume's data; absent data is fine (idempotent delete).
    pub fn delete_volume(&self, id: &str, access: Access) -> Result<(), CsiError> {
        crash_points::effect("remove", || remove_path(&self.volume_path(id, access)))?;
        if access == Access::Mount && self.quotas {
            let _ = mount_utils::quota::clear(&self.root, project_id(id));
        }
        Ok(())
    }

    /// Removes whatever data volume `id` has, of either access type (its
    /// record is gone or was never saved); true if there was some.
    pub fn delete_volume_data(&self, id: &str) -> Result<bool, CsiError> {
        let mut found = false;
        for access in [Access::Mount, Access::Block] {
            if fs::symlink_metadata(self.volume_path(id, access)).is_ok() {
                found = true;
                self.delete_volume(id, access)?;
            }
        }
        Ok(found)
    }

    /// Grows a block volume's backing file (never shrinks it).
    pub fn grow_block(&self, id: &str, size: i64) -> Result<(), CsiError> {
        crash_points::effect("truncate", || {
            grow_file(&self.volume_path(id, Access::Block), size)
        })
    }

    /// Cuts a snapshot of a volume: a copy of a directory, or a sparse
    /// (reflinked where the filesystem can) copy of an image.
    pub fn snapshot(
        &self,
        volume_id: &str,
        snapshot_id: &str,
        access: Access,
    ) -> Result<(), CsiError> {
        let src = self.volume_path(volume_id, access);
        let dst = self.snapshot_path(snapshot_id, access);
        let made = match access {
            Access::Mount => copy_tree(&src, &dst),
            Access::Block => copy_image(&src, &dst),
        };
        self.undo_on_error(made, || self.delete_snapshot(snapshot_id, access))
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
        let made = match access {
            Access::Mount => self.volume_dir(volume_id, size).and_then(|dst| {
                let archive = self.legacy_archive(snapshot_id);
                if !src.exists() && archive.exists() {
                    return unpack_archive(&archive, &dst);
                }
                copy_tree(&src, &dst)
            }),
            Access::Block => copy_image(&src, &self.volume_path(volume_id, access))
                .and_then(|()| self.grow_block(volume_id, size)),
        };
        self.undo_on_error(made, || self.delete_volume(volume_id, access))
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
        let made = match access {
            Access::Mount => self
                .volume_dir(volume_id, size)
                .and_then(|dst| copy_tree(&src, &dst)),
            Access::Block => copy_image(&src, &dst).and_then(|()| self.grow_block(volume_id, size)),
        };
        self.undo_on_error(made, || self.delete_volume(volume_id, access))
    }

    /// Removes a snapshot's data; absent data is fine.
    pub fn delete_snapshot(&self, id: &str, access: Access) -> Result<(), CsiError> {
        let path = self.snapshot_path(id, access);
        crash_points::effect("remove", || remove_path(&path))?;
        if access == Access::Mount {
            remove_file_if_present(&self.legacy_archive(id))?;
        }
        Ok(())
    }

    /// Removes whatever data snapshot `id` has (its record is gone or was
    /// never saved); true if there was some.
    pub fn delete_snapshot_data(&self, id: &str) -> Result<bool, CsiError> {
        let paths = [
            self.snapshot_path(id, Access::Mount),
            self.snapshot_path(id, Access::Block),
            self.legacy_archive(id),
        ];
        let mut found = false;
        for path in paths {
            if fs::symlink_metadata(&path).is_ok() {
                found = true;
                crash_points::effect("remove", || remove_path(&path))?;
            }
        }
        Ok(found)
    }

    /// Data in `volumes/` and the snapshot directory: (volume ids with data,
    /// snapshot ids with data, entries that are not this driver's).
    /// Leftovers of interrupted copies of earlier versions count as
    /// snapshot data of no id (empty string).
    pub fn data(&self) -> DataOnDisk {
        let (volumes, mut other) = data_by_id(&self.volumes_dir(), IdKind::Volume, &["", ".img"]);
        let (mut snapshots, other_snaps) =
            data_by_id(&self.snapshots, IdKind::Snapshot, &["", ".img", ".tar"]);
        for path in other_snaps {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            if name.ends_with(".partial") || name.starts_with("clone-vol-") {
                snapshots.push((String::new(), path));
            } else {
                other.push(path);
            }
        }
        DataOnDisk {
            volumes,
            snapshots,
            foreign: other,
        }
    }
}

#[csi_server::async_trait]
impl ControllerBackend for Backend {
    async fn create_volume(&self, v: &mut VolumeRecord) -> BackendResult<()> {
        let (id, access, size) = (v.id.as_str(), v.access, v.capacity_bytes);
        Ok(match &v.source {
            None => self.create_volume(id, access, size),
            Some(ContentSource::Snapshot(snap)) => self.restore(snap, id, access, size),
            Some(ContentSource::Volume(src)) => self.clone_volume(src, id, access, size),
        }?)
    }

    async fn delete_volume(&self, id: &str) -> BackendResult<bool> {
        Ok(self.delete_volume_data(id)?)
    }

    csi_controller::offer_abilities!(snapshots, expansion, modification);
    fn group_snapshots(&self) -> Option<&dyn GroupSnapshotBackend> {
        self.consistent_group_snapshots().then_some(self as _)
    }
    fn attacher(&self) -> Option<&dyn AttachBackend> {
        self.attach.then_some(self as _)
    }
    fn clones_volumes(&self) -> bool {
        true
    }
    fn reports_volume_condition(&self) -> bool {
        true
    }

    fn data(&self) -> DataOnDisk {
        Backend::data(self)
    }

    fn free_space(&self) -> Option<i64> {
        Some(csi_controller::free_space(&self.root))
    }

    /// A healthy volume has its data in place.
    fn volume_condition(&self, v: &VolumeRecord) -> Option<VolumeCondition> {
        let path = self.volume_path(&v.id, v.access);
        let (abnormal, message) = match path.exists() {
            true => (false, "volume data is present".to_owned()),
            false => (true, format!("volume data {} is missing", path.display())),
        };
        Some(VolumeCondition { abnormal, message })
    }

    fn in_use(&self, id: &str) -> Option<String> {
        let held = self.node.get().is_some_and(|n| n.record(id).is_some());
        held.then(|| "is in use on this node".to_owned())
    }
}

#[csi_server::async_trait]
impl SnapshotBackend for Backend {
    async fn create_snapshot(&self, s: &mut SnapshotRecord) -> BackendResult<()> {
        Ok(self.snapshot(&s.source_volume_id, &s.id, s.access)?)
    }

    async fn delete_snapshot(&self, id: &str) -> BackendResult<bool> {
        Ok(self.delete_snapshot_data(id)?)
    }
}

#[csi_server::async_trait]
impl ExpandBackend for Backend {
    /// Block: grow the backing file; directory: raise its quota (if any).
    async fn expand_volume(&self, v: &VolumeRecord, size: i64) -> BackendResult<()> {
        Ok(match v.access {
            Access::Block => self.grow_block(&v.id, size),
            Access::Mount => self.grow_mount(&v.id, size),
        }?)
    }
}

/// Mutable parameters are only recorded (the server admits the keys of
/// `--accepted-mutable-parameter-name`).
impl ModifyBackend for Backend {}

#[csi_server::async_trait]
impl GroupSnapshotBackend for Backend {
    async fn cut_group(&self, members: &[(SnapshotRecord, VolumeRecord)]) -> BackendResult<()> {
        Ok(crate::group::cut_consistently(self, members)?)
    }
}

#[csi_server::async_trait]
impl AttachBackend for Backend {
    async fn attach(&self, v: &VolumeRecord, _: &str, _: bool) -> BackendResult<AttachState> {
        let access = format!("{:?}", v.access).to_lowercase();
        let context = [("hostpath.csi-kit.dev/access".to_owned(), access)].into();
        Ok(AttachState::Attached(context))
    }

    async fn detach(&self, _: &str, _: &str) -> BackendResult<()> {
        Ok(())
    }
}

/// Unpacks a snapshot archive of an earlier version with owners, modes and
/// xattrs.
fn unpack_archive(archive: &Path, dst: &Path) -> Result<(), CsiError> {
    let file = File::open(archive).map_err(|e| internal("opening", archive, e))?;
    let mut archive = tar::Archive::new(file);
    archive.set_preserve_permissions(true);
    archive.set_preserve_ownerships(true);
    archive.set_unpack_xattrs(true);
    archive
        .unpack(dst)
        .map_err(|e| io_failure("restoring into", dst, e))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let DataOnDisk {
            volumes,
            snapshots,
            foreign: other,
        } = b.data();
        let ids: Vec<&str> = volumes.iter().map(|(id, _)| id.as_str()).collect();
        let mut want = vec![v1.as_str(), v2.as_str(), v3.as_str()];
        want.sort();
        assert_eq!(ids, want);
        assert_eq!(
            snapshots,
            vec![(s1.clone(), b.snapshot_path(&s1, Access::Mount))]
        );
        assert!(other.is_empty(), "{other:?}");
        // A restore from a snapshot that is gone leaves no volume behind.
        let v4 = IdKind::Volume.generate();
        let missing = IdKind::Snapshot.generate();
        assert!(b.restore(&missing, &v4, Access::Mount, 1 << 20).is_err());
        assert!(!b.volume_path(&v4, Access::Mount).exists());
        for v in [&v1, &v2, &v3] {
            b.delete_volume(v, Access::Mount).unwrap();
            b.delete_volume(v, Access::Mount).unwrap();
        }
        b.delete_snapshot(&s1, Access::Mount).unwrap();
        b.delete_snapshot(&s1, Access::Mount).unwrap();
    }

    /// Snapshots, restores and clones keep ownership, xattrs and hard
    /// links (they once went through tar without them, and a non-root pod
    /// could not read its restored data).
    #[test]
    #[ignore = "needs root: run by scripts/test.sh's root pass"]
    fn copies_keep_owner_mode_xattrs_and_hard_links() {
        mount_utils::require_root!("copies_keep_owner_mode_xattrs_and_hard_links");
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let b = Backend::new(dir.path(), None).unwrap();
        let (v1, s1) = (IdKind::Volume.generate(), IdKind::Snapshot.generate());
        b.create_volume(&v1, Access::Mount, 1 << 20).unwrap();
        let root = b.volume_path(&v1, Access::Mount);
        fs::create_dir(root.join("home")).unwrap();
        fs::write(root.join("home/data"), b"for uid 1000 only").unwrap();
        fs::hard_link(root.join("home/data"), root.join("also")).unwrap();
        std::os::unix::fs::chown(root.join("home/data"), Some(1000), Some(2000)).unwrap();
        std::os::unix::fs::chown(root.join("home"), Some(1000), Some(2000)).unwrap();
        std::os::unix::fs::chown(&root, Some(1000), Some(2000)).unwrap();
        fs::set_permissions(root.join("home/data"), fs::Permissions::from_mode(0o600)).unwrap();
        fs::set_permissions(root.join("home"), fs::Permissions::from_mode(0o2770)).unwrap();
        let cpath = |p: &Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        let name = c"user.app";
        // SAFETY: valid C strings and a value of the given length.
        let xattr_set = unsafe {
            libc::setxattr(
                cpath(&root.join("home/data")).as_ptr(),
                name.as_ptr(),
                b"kept".as_ptr().cast(),
                4,
                0,
            )
        } == 0;
        let check = |v: &str| {
            let r = b.volume_path(v, Access::Mount);
            let m = |p: &str| fs::symlink_metadata(r.join(p)).unwrap();
            assert_eq!(
                (m("home/data").uid(), m("home/data").gid()),
                (1000, 2000),
                "{v}"
            );
            assert_eq!(m("home/data").mode() & 0o7777, 0o600);
            assert_eq!((m("home").uid(), m("home").mode() & 0o7777), (1000, 0o2770));
            assert_eq!((m("").uid(), m("").gid()), (1000, 2000), "the volume root");
            assert_eq!(
                m("home/data").ino(),
                m("also").ino(),
                "hard link kept in {v}"
            );
            assert_eq!(fs::read(r.join("also")).unwrap(), b"for uid 1000 only");
            if xattr_set {
                let mut buf = [0u8; 16];
                // SAFETY: valid C strings and a buffer of the given length.
                let n = unsafe {
                    libc::getxattr(
                        cpath(&r.join("home/data")).as_ptr(),
                        name.as_ptr(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                    )
                };
                assert_eq!(&buf[..n.max(0) as usize], b"kept", "xattr kept in {v}");
            }
        };
        b.snapshot(&v1, &s1, Access::Mount).unwrap();
        let (v2, v3) = (IdKind::Volume.generate(), IdKind::Volume.generate());
        b.restore(&s1, &v2, Access::Mount, 1 << 20).unwrap();
        b.clone_volume(&v1, &v3, Access::Mount, 1 << 20).unwrap();
        check(&v2);
        check(&v3);
        if !xattr_set {
            eprintln!(
                "xattr part skipped: {} takes no user xattrs",
                dir.path().display()
            );
        }
    }

    #[test]
    fn archives_of_earlier_versions_still_restore() {
        let dir = tempfile::tempdir().unwrap();
        let b = Backend::new(dir.path(), None).unwrap();
        let (s1, v1) = (IdKind::Snapshot.generate(), IdKind::Volume.generate());
        let src = dir.path().join("src");
        fs::create_dir_all(src.join("sub")).unwrap();
        fs::write(src.join("sub/data"), b"old format").unwrap();
        let mut builder = tar::Builder::new(File::create(b.legacy_archive(&s1)).unwrap());
        builder.append_dir_all(".", &src).unwrap();
        builder.into_inner().unwrap();
        b.restore(&s1, &v1, Access::Mount, 1 << 20).unwrap();
        assert_eq!(
            fs::read(b.volume_path(&v1, Access::Mount).join("sub/data")).unwrap(),
            b"old format"
        );
        assert!(b.delete_snapshot_data(&s1).unwrap());
        assert!(!b.delete_snapshot_data(&s1).unwrap());
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
