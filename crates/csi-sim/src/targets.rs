//! The library's own services as a target: csi-controller's engine and
//! csi-node's node service over a directory-volume driver (the README's
//! walkthrough) on the world's fakes. The only file that constructs those
//! services, so their renames change this file alone.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use csi_controller::{
    AttachBackend, AttachState, BackendResult, Config, ControllerBackend, ControllerService,
    DataOnDisk, ExpandBackend, GroupSnapshotBackend, IdKind, SnapshotBackend, SnapshotRecord,
    VolumeRecord,
};
use csi_driver::{CsiError, CsiResult, async_trait};
use csi_node::{NodeBackend, NodeInfo, NodeService, VolumeInfo, VolumeLocator, VolumeSource};
use csi_store::FileStore;
use mount_utils::Mounter;

use crate::runner::{DataView, Services};
use crate::world::{Effect, World};
use crate::wrap::SimMounter;

/// The node id of the simulated node.
pub const NODE_ID: &str = "node-1";

/// Directory volumes kept by a simulated storage provider: each call to it
/// is one step (it either happens whole or not at all), and its data
/// outlives any crash of the driver. Every volume and snapshot directory
/// holds an `owner` file naming the id it was made for, so data showing
/// through another id's path is seen.
#[derive(Clone)]
pub struct SimDirs {
    world: World,
    generation: u64,
    root: PathBuf,
}

impl SimDirs {
    /// The provider as the world's current process reaches it.
    pub fn new(world: &World) -> Self {
        let root = world.host_dir().join("provider");
        for kind in ["volumes", "snapshots"] {
            let _ = std::fs::create_dir_all(root.join(kind));
        }
        SimDirs {
            world: world.clone(),
            generation: world.generation(),
            root,
        }
    }

    fn dir(&self, kind: &str, id: &str) -> PathBuf {
        self.root.join(kind).join(id)
    }

    fn call(&self, what: &str) -> CsiResult<()> {
        self.world
            .step(self.generation, Effect::Provider, what)
            .map_err(|e| CsiError::from(std::io::Error::from_raw_os_error(e as i32)))
    }

    fn make(&self, kind: &str, id: &str) -> CsiResult<()> {
        let dir = self.dir(kind, id);
        std::fs::create_dir(&dir)
            .and_then(|()| std::fs::write(dir.join("owner"), id))
            .map_err(|e| csi_controller::io_failure("creating", &dir, e))
    }

    fn remove(&self, kind: &str, id: &str) -> CsiResult<bool> {
        csi_controller::remove_path(&self.dir(kind, id))
    }

    fn owners(&self, kind: &str) -> BTreeMap<String, String> {
        let Ok(entries) = std::fs::read_dir(self.root.join(kind)) else {
            return BTreeMap::new();
        };
        entries
            .flatten()
            .map(|e| {
                let owner = std::fs::read_to_string(e.path().join("owner")).unwrap_or_default();
                (e.file_name().to_string_lossy().into_owned(), owner)
            })
            .collect()
    }
}

impl DataView for SimDirs {
    fn volumes(&self) -> BTreeMap<String, String> {
        self.owners("volumes")
    }
    fn snapshots(&self) -> BTreeMap<String, String> {
        self.owners("snapshots")
    }
}

#[async_trait]
impl ControllerBackend for SimDirs {
    async fn create_volume(&self, v: &mut VolumeRecord) -> BackendResult<()> {
        self.call(&format!("create volume {}", v.id))?;
        Ok(self.make("volumes", &v.id)?)
    }
    async fn delete_volume(&self, id: &str) -> BackendResult<bool> {
        self.call(&format!("delete volume {id}"))?;
        Ok(self.remove("volumes", id)?)
    }
    fn snapshots(&self) -> Option<&dyn SnapshotBackend> {
        Some(self)
    }
    fn expansion(&self) -> Option<&dyn ExpandBackend> {
        Some(self)
    }
    fn group_snapshots(&self) -> Option<&dyn GroupSnapshotBackend> {
        Some(self)
    }
    fn attacher(&self) -> Option<&dyn AttachBackend> {
        Some(self)
    }
    fn clones_volumes(&self) -> bool {
        true
    }
    fn data(&self) -> DataOnDisk {
        let mut data = DataOnDisk::default();
        for (kind, id_kind) in [("volumes", IdKind::Volume), ("snapshots", IdKind::Snapshot)] {
            let (ours, foreign) = csi_controller::data_by_id(&self.root.join(kind), id_kind, &[""]);
            data.foreign.extend(foreign);
            match kind {
                "volumes" => data.volumes = ours,
                _ => data.snapshots = ours,
            }
        }
        data
    }
    fn free_space(&self) -> Option<i64> {
        Some(1 << 40)
    }
}

#[async_trait]
impl SnapshotBackend for SimDirs {
    async fn create_snapshot(&self, s: &mut SnapshotRecord) -> BackendResult<()> {
        self.call(&format!("create snapshot {}", s.id))?;
        Ok(self.make("snapshots", &s.id)?)
    }
    async fn delete_snapshot(&self, id: &str) -> BackendResult<bool> {
        self.call(&format!("delete snapshot {id}"))?;
        Ok(self.remove("snapshots", id)?)
    }
}

#[async_trait]
impl ExpandBackend for SimDirs {
    async fn expand_volume(&self, v: &VolumeRecord, size: i64) -> BackendResult<()> {
        Ok(self.call(&format!("expand volume {} to {size}", v.id))?)
    }
}

#[async_trait]
impl GroupSnapshotBackend for SimDirs {
    async fn cut_group(&self, members: &[(SnapshotRecord, VolumeRecord)]) -> BackendResult<()> {
        self.call(&format!("cut group of {} members", members.len()))?;
        for (i, (snap, _)) in members.iter().enumerate() {
            if let Err(e) = self.make("snapshots", &snap.id) {
                for (done, _) in &members[..i] {
                    let _ = self.remove("snapshots", &done.id);
                }
                return Err(e.into());
            }
        }
        Ok(())
    }
}

/// Attachments are only recorded (the data is on the node already).
#[async_trait]
impl AttachBackend for SimDirs {
    async fn attach(&self, _: &VolumeRecord, _: &str, _: bool) -> BackendResult<AttachState> {
        Ok(AttachState::Attached(Default::default()))
    }
    async fn detach(&self, _: &str, _: &str) -> BackendResult<()> {
        Ok(())
    }
}

impl VolumeLocator for SimDirs {
    fn source(&self, id: &str) -> Option<VolumeSource> {
        let dir = self.dir("volumes", id);
        (IdKind::Volume.is_valid(id) && dir.is_dir()).then_some(VolumeSource::Directory(dir))
    }
}

impl NodeBackend for SimDirs {
    fn volume(&self, id: &str) -> Option<VolumeInfo> {
        self.source(id).map(|_| VolumeInfo::new(false, 0))
    }
}

/// Starts the library's services on `world` as a driver's main would:
/// the engine on its state directory with the startup sweep, the node
/// service on its own with the restore of what was staged and published.
pub async fn library(world: &World) -> Result<Services, String> {
    let dirs = Arc::new(SimDirs::new(world));
    let fs = world.fs().handle();
    let store = FileStore::open_on(fs.clone(), "/state/controller").map_err(|e| e.to_string())?;
    let engine =
        ControllerService::with_store(Arc::new(store), Config::new(NODE_ID), dirs.clone())?;
    engine.reconcile().await.map_err(|e| e.to_string())?;
    let node_store = FileStore::open_on(fs, "/state/node").map_err(|e| e.to_string())?;
    let mounter: Arc<dyn Mounter> = Arc::new(SimMounter::new(world));
    let node = NodeService::builder(dirs.clone(), NodeInfo::new(NODE_ID), mounter)
        .open(Arc::new(node_store))
        .map_err(|e| e.to_string())?;
    let report = node.restore();
    if !report.abnormal.is_empty() {
        return Err(format!("abnormal after restore: {:?}", report.abnormal));
    }
    Ok(Services {
        controller: Arc::new(engine.clone()),
        group: Some(Arc::new(engine)),
        node: Arc::new(node),
        data: dirs,
    })
}
