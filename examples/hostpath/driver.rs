//! The driver value shared by every service, and startup reconciliation.

use std::path::Path;
use std::sync::Arc;

use csi_server::CsiError;
use mount_utils::{LoopDevices, Mounter};

use crate::backend::Backend;
use crate::common::state::{InFlight, Ledger, open_state};
use crate::config::Config;
use crate::node::{NodeSide, open_node};
use crate::store::Store;

/// The hostpath driver: cheap to clone (everything shared is behind `Arc`).
#[derive(Clone)]
pub struct HostPath {
    pub config: Arc<Config>,
    pub node_id: String,
    pub store: Arc<Store>,
    pub backend: Backend,
    /// The node service (csi-node's, over what this node staged and published).
    pub node: Arc<csi_node::NodeService<NodeSide>>,
    /// Volumes, snapshots and names with work running on them.
    pub in_flight: Arc<InFlight>,
    /// Bytes promised to volumes, against `--capacity`.
    pub ledger: Arc<Ledger>,
}

impl HostPath {
    /// Opens (or creates) the state directory and locks it for the life of
    /// the process: a second instance on it gets an error naming the first.
    pub fn open(config: Config, mounter: Arc<dyn Mounter>) -> Result<Self, String> {
        Self::open_with(
            config,
            mounter,
            Arc::new(mount_utils::LinuxLoopDevices::new()),
        )
    }

    /// [`open`](Self::open) with the loop devices to use (a fake in tests).
    pub fn open_with(
        config: Config,
        mounter: Arc<dyn Mounter>,
        loops: Arc<dyn LoopDevices>,
    ) -> Result<Self, String> {
        let statedir = config.statedir.clone();
        let files = open_state(&statedir, || {
            // A crash during a group snapshot can leave the state filesystem
            // frozen; thaw it before anything below writes to it.
            let dedicated = csi_kit::mount::freeze::same_filesystem(&statedir, Path::new("/"))
                .is_ok_and(|on_root| !on_root);
            if dedicated && csi_kit::mount::freeze::thaw(&statedir).unwrap_or(false) {
                tracing::warn!(statedir = %statedir.display(), "thawed a filesystem left frozen by a crash");
            }
        })?;
        let backend = Backend::new(&config.statedir, config.snapshotdir.as_deref())
            .map_err(|e| format!("preparing {}: {e}", config.statedir.display()))?;
        let store = Arc::new(Store::open(files)?);
        let used = store
            .volumes
            .read(|all| all.values().map(|v| v.capacity_bytes).sum());
        let ledger = Ledger::new(used);
        let side = NodeSide {
            store: store.clone(),
            backend: backend.clone(),
            ledger: ledger.clone(),
        };
        let node = open_node(&config, side, mounter, loops)?;
        Ok(Self {
            node,
            node_id: config.node_id(),
            config: Arc::new(config),
            store,
            backend,
            in_flight: InFlight::new(),
            ledger,
        })
    }

    /// Startup reconciliation, before serving: puts back what the node
    /// record says is staged and published (a volume that cannot be
    /// restored is reported abnormal), finishes group snapshots a crash
    /// left half saved or half removed, and removes data no record owns
    /// (unacknowledged creates, half-done deletes), logging each; the data
    /// of records that were set aside as unreadable is kept.
    pub fn reconcile_on_start(&self) -> Result<(), CsiError> {
        self.node.restore();
        let cut = crate::common::settle_groups(
            &self.store.groups,
            &self.store.snapshots,
            |s| s.group_snapshot_id.as_deref(),
            &self.store.quarantined_snapshots,
        )?;
        for snap in cut {
            self.backend.delete_snapshot(&snap.id, snap.access)?;
        }
        self.sweep()
    }

    /// Removes data with no record (see [`Self::reconcile_on_start`]).
    fn sweep(&self) -> Result<(), CsiError> {
        let (volumes, snapshots, foreign) = self.backend.data();
        for (id, path) in volumes {
            if self.store.volumes.contains(&id) || self.store.quarantined_volumes.contains(&id) {
                continue;
            }
            tracing::warn!(path = %path.display(), "volume data with no record (left by a crash); removing it");
            self.backend.delete_volume_data(&id)?;
        }
        for (id, path) in snapshots {
            if self.store.snapshots.contains(&id) || self.store.quarantined_snapshots.contains(&id)
            {
                continue;
            }
            tracing::warn!(path = %path.display(), "snapshot data with no record (left by a crash); removing it");
            crate::common::state::remove_path(&path)
                .map_err(|e| crate::common::internal("removing", &path, e))?;
        }
        for path in foreign {
            tracing::warn!(path = %path.display(), "not this driver's data; not touched");
        }
        Ok(())
    }
}

pub use crate::common::blocking;

impl csi_server::Identity for HostPath {}
