//! The driver value shared by every service, and small shared helpers.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use csi_server::CsiError;
use mount_utils::{LoopDevices, Mounter};

use crate::backend::Backend;
use crate::common::{open_node, restore_node};
use crate::config::Config;
use crate::store::{Access, Store};

/// The hostpath driver: cheap to clone (everything shared is behind `Arc`).
#[derive(Clone)]
pub struct HostPath {
    pub config: Arc<Config>,
    pub node_id: String,
    pub store: Arc<Store>,
    pub backend: Backend,
    /// Loop devices (NodeExpand refreshes a block volume's size).
    pub loops: Arc<dyn LoopDevices>,
    /// What this node staged and published (csi-node's record).
    pub node: csi_node::NodeVolumes,
}

impl HostPath {
    /// Opens (or creates) the state directory.
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
        // A crash during a group snapshot can leave the state filesystem
        // frozen; thaw it before anything below writes to it.
        let dedicated = csi_kit::mount::freeze::same_filesystem(&config.statedir, Path::new("/"))
            .is_ok_and(|on_root| !on_root);
        if dedicated && csi_kit::mount::freeze::thaw(&config.statedir).unwrap_or(false) {
            tracing::warn!(statedir = %config.statedir.display(), "thawed a filesystem left frozen by a crash");
        }
        let backend = Backend::new(&config.statedir, config.snapshotdir.as_deref())
            .map_err(|e| format!("preparing {}: {e}", config.statedir.display()))?;
        let store = Store::open(&config.statedir).map_err(|e| e.to_string())?;
        let node_id = config.node_id();
        let store = Arc::new(store);
        let locator = Arc::new(Locator {
            store: store.clone(),
            backend: backend.clone(),
        });
        let node = open_node(&config.statedir, mounter, loops.clone(), locator, None)?;
        Ok(Self {
            node,
            config: Arc::new(config),
            node_id,
            store,
            backend,
            loops,
        })
    }

    /// Startup reconciliation: puts back what the node record says is
    /// staged and published (a volume that cannot be restored is reported
    /// abnormal) and returns volume data no record owns.
    pub fn reconcile_on_start(&self) -> Result<Vec<PathBuf>, CsiError> {
        restore_node(&self.node);
        let known = self.store.read(|s| {
            s.volumes
                .keys()
                .cloned()
                .collect::<std::collections::BTreeSet<_>>()
        });
        Ok(self.backend.orphans(|id| known.contains(id)))
    }
}

/// Where a volume's data is, for csi-node: only ids the controller
/// recorded (an inline ephemeral volume by the name the CO gave it).
struct Locator {
    store: Arc<Store>,
    backend: Backend,
}

impl csi_node::VolumeLocator for Locator {
    fn source(&self, volume_id: &str) -> Option<csi_node::Source> {
        let volume = self.store.read(|s| {
            s.volumes.get(volume_id).cloned().or_else(|| {
                s.volumes
                    .values()
                    .find(|v| v.ephemeral && v.name == volume_id)
                    .cloned()
            })
        })?;
        let path = self.backend.volume_path(&volume.id, volume.access);
        Some(match volume.access {
            Access::Mount => csi_node::Source::Directory(path),
            Access::Block => csi_node::Source::Image(path),
        })
    }
}

pub use crate::common::blocking;

impl csi_server::Identity for HostPath {}
