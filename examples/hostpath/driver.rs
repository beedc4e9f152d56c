//! The driver value shared by every service, and small shared helpers.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use csi_server::CsiError;
use mount_utils::Mounter;

use crate::backend::Backend;
use crate::config::Config;
use crate::store::Store;

/// The hostpath driver: cheap to clone (everything shared is behind `Arc`).
#[derive(Clone)]
pub struct HostPath {
    pub config: Arc<Config>,
    pub node_id: String,
    pub store: Arc<Store>,
    pub backend: Backend,
    pub mounter: Arc<dyn Mounter>,
}

impl HostPath {
    /// Opens (or creates) the state directory.
    pub fn open(config: Config, mounter: Arc<dyn Mounter>) -> Result<Self, String> {
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
        Ok(Self {
            config: Arc::new(config),
            node_id,
            store: Arc::new(store),
            backend,
            mounter,
        })
    }

    /// Whether SINGLE_NODE_MULTI_WRITER is advertised (it is: the driver
    /// honours the repeat table for every access mode).
    pub fn single_node_multi_writer(&self) -> bool {
        true
    }

    /// Startup reconciliation: re-attaches the loop devices of staged block
    /// volumes (lost on reboot) and returns volume data no record owns.
    pub fn reconcile_on_start(&self) -> Result<Vec<PathBuf>, CsiError> {
        let staged = self.store.read(|s| s.staged.clone());
        for (id, record) in staged {
            let Some(old) = record.loop_device.clone() else {
                continue;
            };
            let image = self.backend.volume_path(&id, crate::store::Access::Block);
            let attached = mount_utils::loopdev::find_by_backing_file(&image).unwrap_or_default();
            if attached.contains(&old) {
                continue;
            }
            let opts = mount_utils::LoopOptions {
                autoclear: false,
                ..Default::default()
            };
            let dev = mount_utils::LoopDevice::attach(&image, &opts)
                .map_err(|e| CsiError::Internal(format!("re-attaching {}: {e}", image.display())))?
                .keep();
            tracing::info!(volume = %id, device = %dev.display(), "re-attached loop device of a staged volume");
            self.store.update(|s| {
                if let Some(r) = s.staged.get_mut(&id) {
                    r.loop_device = Some(dev);
                }
                Ok(())
            })?;
        }
        let known = self.store.read(|s| {
            s.volumes
                .keys()
                .cloned()
                .collect::<std::collections::BTreeSet<_>>()
        });
        Ok(self.backend.orphans(|id| known.contains(id)))
    }
}

pub use crate::common::blocking;

impl csi_server::Identity for HostPath {}
