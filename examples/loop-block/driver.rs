//! The driver value shared by every service, and startup reconciliation.

use std::sync::Arc;

use csi_server::{CsiError, CsiResult};
use mount_utils::{Exec, LinuxLoopDevices, LoopDevices, Mounter, SystemExec};

use crate::backend::Backend;
use crate::common::state::{InFlight, open_state, remove_path};
use crate::common::{IdKind, internal};
use crate::config::Config;
use crate::node::{NodeSide, open_node};
use crate::store::{Store, VolumeRecord};

/// The loop-block driver: cheap to clone (everything shared is behind `Arc`).
#[derive(Clone)]
pub struct LoopBlock {
    pub config: Arc<Config>,
    pub node_id: String,
    pub store: Arc<Store>,
    pub backend: Backend,
    pub mounter: Arc<dyn Mounter>,
    /// The node service (csi-node's, over what this node staged and published).
    pub node: Arc<csi_node::NodeService<NodeSide>>,
    /// Whether the backing files' filesystem takes O_DIRECT (the
    /// `directIO` mutable parameter needs it).
    pub direct_io_supported: bool,
    /// Held shared by NodeStage/NodeUnstage and exclusively while a group
    /// snapshot is cut or a modification is applied, so neither sees a disk
    /// half attached.
    pub attachments: Arc<tokio::sync::RwLock<()>>,
    /// Disks, snapshots and names with work running on them.
    pub in_flight: Arc<InFlight>,
}

impl LoopBlock {
    /// Opens (or creates) the state directory and locks it for the life of
    /// the process: a second instance on it gets an error naming the first.
    pub fn open(config: Config, mounter: Arc<dyn Mounter>) -> Result<Self, String> {
        let exec: Arc<dyn Exec> = Arc::new(SystemExec::new());
        Self::open_with(config, mounter, Arc::new(LinuxLoopDevices::new()), exec)
    }

    /// [`open`](Self::open) with the loop devices and the program runner
    /// to use (fakes in tests).
    pub fn open_with(
        config: Config,
        mounter: Arc<dyn Mounter>,
        loops: Arc<dyn LoopDevices>,
        exec: Arc<dyn Exec>,
    ) -> Result<Self, String> {
        let files = open_state(&config.statedir, || {})?;
        let backend = Backend::new(&config.statedir)
            .map_err(|e| format!("preparing {}: {e}", config.statedir.display()))?;
        let store = Arc::new(crate::store::open(&files)?);
        let direct_io_supported = crate::tuning::direct_io_supported(&backend.volumes_dir());
        let attachments = Arc::new(tokio::sync::RwLock::new(()));
        let side = NodeSide {
            store: store.clone(),
            backend: backend.clone(),
            attachments: attachments.clone(),
        };
        let node = open_node(&config, side, mounter.clone(), loops, exec)?;
        Ok(Self {
            direct_io_supported,
            attachments,
            in_flight: InFlight::new(),
            node_id: config.node_id(),
            config: Arc::new(config),
            store,
            backend,
            mounter,
            node,
        })
    }

    /// The record of a volume, or NOT_FOUND (ids this driver could not have
    /// generated never reach the filesystem).
    pub fn known_volume(&self, id: &str) -> CsiResult<VolumeRecord> {
        if !IdKind::Volume.is_valid(id) {
            return Err(CsiError::NotFound(format!("volume {id:?} does not exist")));
        }
        self.store
            .volumes
            .get(id)
            .ok_or_else(|| CsiError::NotFound(format!("volume {id} does not exist")))
    }

    /// Startup reconciliation, before serving: thaws filesystems a crash
    /// left frozen, then puts back what the node record says is staged and
    /// published (a volume that cannot be restored, e.g. its image is gone
    /// or its first blocks are damaged, is reported abnormal, never
    /// formatted); finishes group snapshots a crash left half saved or half
    /// removed; removes backing files and snapshot copies no record owns
    /// (unacknowledged creates, half-done deletes), each logged, except
    /// those of records set aside as unreadable.
    pub fn reconcile_on_start(&self) -> CsiResult<()> {
        self.thaw_after_crash();
        self.node.restore();
        let cut = crate::common::settle_groups(
            &self.store.groups,
            &self.store.snapshots,
            |s| s.group_snapshot_id.as_deref(),
            &self.store.quarantined_snapshots,
        )?;
        for snap in cut {
            self.backend.delete_snapshot(&snap.id)?;
        }
        self.sweep()
    }

    /// Removes data with no record (see [`Self::reconcile_on_start`]).
    fn sweep(&self) -> CsiResult<()> {
        let (disks, snapshots, foreign) = self.backend.data();
        let unowned = disks
            .into_iter()
            .filter(|(id, _)| {
                !self.store.volumes.contains(id) && !self.store.quarantined_volumes.contains(id)
            })
            .chain(snapshots.into_iter().filter(|(id, _)| {
                !self.store.snapshots.contains(id) && !self.store.quarantined_snapshots.contains(id)
            }));
        for (_, path) in unowned {
            tracing::warn!(path = %path.display(), "data with no record (left by a crash); removing it");
            remove_path(&path).map_err(|e| internal("removing", &path, e))?;
        }
        for path in foreign {
            tracing::warn!(path = %path.display(), "not this driver's data; not touched");
        }
        Ok(())
    }

    /// A crash during a group snapshot can leave members frozen, and every
    /// writer in their pods blocked: thaw them before anything else.
    fn thaw_after_crash(&self) {
        for (id, record) in self.node.volumes().records() {
            let Some(stage) = record.stage.filter(|s| !s.capability.is_block()) else {
                continue;
            };
            if !self.mounter.is_mount_point(&stage.path).unwrap_or(false) {
                continue;
            }
            match mount_utils::freeze::thaw(&stage.path) {
                Ok(true) => {
                    tracing::warn!(volume = %id, "thawed a filesystem left frozen by a crash")
                }
                Ok(false) => {}
                Err(e) => tracing::error!(volume = %id, error = %e, "thawing after a crash"),
            }
        }
    }
}

impl csi_server::Identity for LoopBlock {}
