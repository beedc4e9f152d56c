//! The driver value shared by every service, and startup reconciliation.
//! The controller side is csi-controller's engine over [`Backend`].

use std::path::Path;
use std::sync::Arc;

use csi_controller::{Access, Engine, WeakEngine, open_state};
use csi_server::CsiError;
use mount_utils::{LoopDevices, Mounter};

use crate::backend::Backend;
use crate::common::{open_node, restore_node};
use crate::config::{Config, TOPOLOGY_KEY};

/// The hostpath driver: cheap to clone (everything shared is behind `Arc`).
#[derive(Clone)]
pub struct HostPath {
    pub config: Arc<Config>,
    pub node_id: String,
    /// The Controller and GroupController, and the records.
    pub engine: Engine<Backend>,
    pub backend: Backend,
    /// Loop devices (NodeExpand refreshes a block volume's size).
    pub loops: Arc<dyn LoopDevices>,
    /// What this node staged and published (csi-node's record).
    pub node: csi_node::NodeVolumes,
}

/// The engine's configuration from the flags.
pub fn engine_config(config: &Config, group_snapshots: bool) -> csi_controller::Config {
    csi_controller::Config {
        capacity: config.capacity,
        max_size: config.max_volume_size,
        topology_key: config.enable_topology.then(|| TOPOLOGY_KEY.to_owned()),
        attach: config.enable_attach,
        attach_limit: config.attach_limit,
        group_snapshots,
        keep_snapshot_sources: true,
        volume_condition: true,
        ..csi_controller::Config::new(config.node_id())
    }
}

impl HostPath {
    /// Opens (or creates) the state directory and locks it for the life of
    /// the process: a second instance on it gets an error naming the first.
    pub fn open(config: Config, mounter: Arc<dyn Mounter>) -> Result<Self, String> {
        let loops = Arc::new(mount_utils::LinuxLoopDevices::new());
        Self::open_with(config, mounter, loops)
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
        let group = backend.consistent_group_snapshots();
        let engine = Engine::open(files, engine_config(&config, group), backend.clone())?;
        let locator = Arc::new(Locator(engine.downgrade()));
        let node = open_node(&config.statedir, mounter, loops.clone(), locator, None)?;
        let _ = backend.node.set(node.clone());
        Ok(Self {
            node,
            node_id: config.node_id(),
            config: Arc::new(config),
            engine,
            backend,
            loops,
        })
    }

    /// Startup reconciliation, before serving: puts back what the node
    /// record says is staged and published (a volume that cannot be
    /// restored is reported abnormal), then the engine's (group snapshots
    /// a crash left half done, data no record owns).
    pub fn reconcile_on_start(&self) -> Result<(), CsiError> {
        restore_node(&self.node);
        self.engine.reconcile()
    }
}

/// Where a volume's data is, for csi-node: only ids the controller
/// recorded (an inline ephemeral volume by the name the CO gave it). Weak:
/// the engine's backend holds the node side.
struct Locator(WeakEngine<Backend>);

impl csi_node::VolumeLocator for Locator {
    fn source(&self, volume_id: &str) -> Option<csi_node::Source> {
        let engine = self.0.upgrade()?;
        let volume = (engine.tables().volumes.get(volume_id))
            .or_else(|| engine.ephemeral_named(volume_id))?;
        let path = engine.backend().volume_path(&volume.id, volume.access);
        Some(match volume.access {
            Access::Mount => csi_node::Source::Directory(path),
            Access::Block => csi_node::Source::Image(path),
        })
    }
}

impl csi_server::Identity for HostPath {}
