//! Where the disks live: `<statedir>/volumes/<id>.img` (sparse backing
//! files) and `<statedir>/snapshots/<id>.img` (sparse, reflinked where the
//! filesystem can, copies). Callers validate ids first
//! ([`IdKind::is_valid`](csi_controller::IdKind::is_valid)), so every path
//! here is `root/<kind>/<generated id>.img`.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};

use csi_controller::{
    Access, AttachBackend, AttachState, BackendResult, ContentSource, ControllerBackend,
    DataOnDisk, ExpandBackend, GroupSnapshotBackend, IdKind, ModifyBackend, SnapshotBackend,
    SnapshotRecord, VolumeRecord, copy_sparse, create_sparse, data_by_id, grow_file, remove_path,
    to_map,
};
use csi_server::v1::VolumeCapability;
use csi_server::{CsiError, CsiResult};

use mount_utils::LoopDevices;

use crate::tuning::{TuneError, Tuning};

/// Filesystems NodeStage can create (SafeFormatAndMount's list).
const SUPPORTED_FS: [&str; 4] = ["ext3", "ext4", "xfs", "btrfs"];

/// The directory layout of one driver instance, and what the storage side
/// needs of the node side.
#[derive(Clone)]
pub struct Backend {
    root: PathBuf,
    /// The node side's record, once opened (DeleteVolume is refused while
    /// it holds the disk; a group snapshot freezes what it staged).
    pub node: Arc<OnceLock<csi_node::NodeVolumes>>,
    /// Held shared by NodeStage/NodeUnstage and exclusively while a group
    /// snapshot is cut or a modification is applied, so neither sees a disk
    /// half attached.
    pub attachments: Arc<tokio::sync::RwLock<()>>,
    /// Whether the backing files' filesystem takes O_DIRECT (the
    /// `directIO` mutable parameter needs it).
    pub direct_io_supported: bool,
    /// The loop devices, asked which are attached to a disk (fakes in
    /// tests never read /sys).
    pub loops: Arc<dyn LoopDevices>,
}

/// Removes a file; an absent one is fine (true if there was one).
fn remove_file_if_present(path: &Path) -> CsiResult<bool> {
    remove_path(path)
}

impl Backend {
    /// Creates the layout under `root` (mode 0750: the state file records
    /// volume parameters, the images hold user data); `loops` tells which
    /// disks are attached.
    pub fn new(root: &Path, loops: Arc<dyn LoopDevices>) -> io::Result<Self> {
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
            node: Arc::default(),
            attachments: Arc::default(),
            direct_io_supported: crate::tuning::direct_io_supported(&root.join("volumes")),
            loops,
        })
    }

    /// A copy for the node side: the same layout and attach lock, without
    /// the node record (that record holds the node side: no cycle).
    pub fn for_node_side(&self) -> Self {
        Self {
            node: Arc::default(),
            ..self.clone()
        }
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
        let made = crash_points::effect("create-image", || {
            create_sparse(&self.volume_path(id), size)
        });
        if made.is_err() {
            let _ = self.delete(id);
        }
        made
    }

    /// Removes a disk's backing file; an absent one is fine.
    pub fn delete(&self, id: &str) -> CsiResult<bool> {
        crash_points::effect("remove", || remove_file_if_present(&self.volume_path(id)))
    }

    /// Grows a disk (never shrinks it).
    pub fn grow(&self, id: &str, size: i64) -> CsiResult<()> {
        crash_points::effect("truncate", || grow_file(&self.volume_path(id), size))
    }

    /// Copies a disk into a snapshot (nothing is left on error).
    pub fn snapshot(&self, volume_id: &str, snapshot_id: &str) -> CsiResult<()> {
        crash_points::effect("copy-image", || {
            copy_sparse(
                &self.volume_path(volume_id),
                &self.snapshot_path(snapshot_id),
            )
        })
    }

    /// Fills a new disk from a snapshot or another disk, then grows it to
    /// `size`; nothing is left on error.
    pub fn copy_into(&self, src: &Path, volume_id: &str, size: i64) -> CsiResult<()> {
        let dst = self.volume_path(volume_id);
        let made = crash_points::effect("copy-image", || copy_sparse(src, &dst))
            .and_then(|()| crash_points::effect("truncate", || grow_file(&dst, size)));
        if made.is_err() {
            let _ = self.delete(volume_id);
        }
        made
    }

    /// Removes a snapshot's copy; an absent one is fine.
    pub fn remove_snapshot(&self, id: &str) -> CsiResult<bool> {
        crash_points::effect("remove", || remove_file_if_present(&self.snapshot_path(id)))
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
    pub fn data(&self) -> DataOnDisk {
        let (volumes, mut foreign) = data_by_id(&self.volumes_dir(), IdKind::Volume, &[".img"]);
        let (snapshots, other_snaps) =
            data_by_id(&self.root.join("snapshots"), IdKind::Snapshot, &[".img"]);
        foreign.extend(other_snaps);
        DataOnDisk {
            volumes,
            snapshots,
            foreign,
        }
    }

    /// The disk's tuning from its record's mutable parameters.
    pub fn tuning(&self, params: &BTreeMap<String, String>) -> CsiResult<Tuning> {
        Tuning::default().with(&to_map(params), self.direct_io_supported)
    }
}

#[csi_server::async_trait]
impl ControllerBackend for Backend {
    async fn create_volume(&self, v: &mut VolumeRecord) -> BackendResult<()> {
        Ok(match &v.source {
            None => self.create(&v.id, v.capacity_bytes),
            Some(ContentSource::Snapshot(id)) => {
                self.copy_into(&self.snapshot_path(id), &v.id, v.capacity_bytes)
            }
            Some(ContentSource::Volume(id)) => {
                self.copy_into(&self.volume_path(id), &v.id, v.capacity_bytes)
            }
        }?)
    }

    async fn delete_volume(&self, id: &str) -> BackendResult<bool> {
        Ok(self.delete(id)?)
    }

    csi_controller::offer_abilities!(
        snapshots,
        expansion,
        modification,
        group_snapshots,
        attacher
    );
    fn clones_volumes(&self) -> bool {
        true
    }

    fn data(&self) -> DataOnDisk {
        Backend::data(self)
    }

    fn free_space(&self) -> Option<i64> {
        Some(csi_controller::free_space(&self.root))
    }

    /// The filesystem must be one NodeStage can create.
    fn check_capabilities(&self, caps: &[VolumeCapability]) -> CsiResult<()> {
        let fs = caps
            .iter()
            .filter_map(|c| c.mount_volume())
            .map(|m| m.fs_type.as_str())
            .find(|fs| !fs.is_empty() && !SUPPORTED_FS.contains(fs));
        match fs {
            Some(fs) => Err(CsiError::invalid(
                "volume_capabilities.mount.fs_type",
                format!("{fs:?} is not supported (supported: {SUPPORTED_FS:?})"),
            )),
            None => Ok(()),
        }
    }

    fn in_use(&self, id: &str) -> Option<String> {
        let Some(node) = self.node.get() else {
            // `--mode controller`: a loop device of the disk on this host is
            // a node's, whatever the attach records say.
            let devices = self.loops.find_by_backing_file(&self.volume_path(id));
            let device = devices.ok()?.into_iter().next()?;
            return Some(format!("is attached as {} on this host", device.display()));
        };
        let held = node.record(id).is_some();
        held.then(|| "is in use on this node".to_owned())
    }
}

#[csi_server::async_trait]
impl SnapshotBackend for Backend {
    async fn create_snapshot(&self, s: &mut SnapshotRecord) -> BackendResult<()> {
        Ok(self.snapshot(&s.source_volume_id, &s.id)?)
    }

    async fn delete_snapshot(&self, id: &str) -> BackendResult<bool> {
        Ok(self.remove_snapshot(id)?)
    }
}

#[csi_server::async_trait]
impl ExpandBackend for Backend {
    async fn expand_volume(&self, v: &VolumeRecord, size: i64) -> BackendResult<()> {
        Ok(self.grow(&v.id, size)?)
    }

    /// The loop device does not see the file grow until LOOP_SET_CAPACITY,
    /// and a filesystem must be grown too.
    fn node_expansion_required(&self, _: Access) -> bool {
        true
    }
}

#[csi_server::async_trait]
impl ModifyBackend for Backend {
    fn mutable_parameters(
        &self,
        current: &BTreeMap<String, String>,
        requested: &HashMap<String, String>,
    ) -> CsiResult<BTreeMap<String, String>> {
        let tuning = self.tuning(current)?;
        Ok(tuning.with(requested, self.direct_io_supported)?.to_map())
    }

    /// Attached on this host: the change takes effect now (a cloud disk
    /// changes its IOPS while attached too); otherwise at the next attach.
    async fn modify_volume(
        &self,
        v: &VolumeRecord,
        new: &BTreeMap<String, String>,
    ) -> BackendResult<()> {
        // Exclusive: no NodeStage attaches the disk with the old values meanwhile.
        let _exclusive = self.attachments.write().await;
        let tuning = self.tuning(new)?;
        let devices = self
            .loops
            .find_by_backing_file(&self.volume_path(&v.id))
            .map_err(|e| CsiError::Internal(format!("looking up loop devices: {e}")))?;
        for d in &devices {
            tuning.apply(d).map_err(TuneError::for_modify)?;
        }
        Ok(())
    }
}

#[csi_server::async_trait]
impl GroupSnapshotBackend for Backend {
    async fn cut_group(&self, members: &[(SnapshotRecord, VolumeRecord)]) -> BackendResult<()> {
        // No member gets attached or detached meanwhile.
        let _exclusive = self.attachments.write().await;
        Ok(crate::group::cut_consistently(self, members)?)
    }
}

/// The backing file is the "device" (what a cloud driver would return as
/// the attached disk's path or serial); the publish context also tells the
/// node the disk's access type, size and tuning ([`crate::context`]).
#[csi_server::async_trait]
impl AttachBackend for Backend {
    async fn attach(&self, v: &VolumeRecord, _: &str, _: bool) -> BackendResult<AttachState> {
        let context = crate::context::publish_context(v, &self.volume_path(&v.id));
        Ok(AttachState::Attached(context))
    }

    async fn detach(&self, _: &str, _: &str) -> BackendResult<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disks_are_sparse_grow_copy_and_only_own_files_map_to_ids() {
        let dir = tempfile::tempdir().unwrap();
        let b = Backend::new(dir.path(), Arc::new(mount_utils::FakeLoopDevices::new())).unwrap();
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
        let DataOnDisk {
            volumes: disks,
            snapshots,
            foreign: other,
        } = b.data();
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
        b.remove_snapshot(&s1).unwrap();
        b.remove_snapshot(&s1).unwrap();
    }
}
