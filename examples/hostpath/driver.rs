//! The driver value shared by every service, and small shared helpers.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_server::{CsiError, CsiResult};
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
        let backend = Backend::new(&config.statedir)
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

/// Runs blocking file and mount work off the async runtime.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> CsiResult<T> + Send + 'static,
) -> CsiResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(CsiError::Internal(format!("blocking task failed: {e}"))))
}

/// The spec's NodePublish repeat table (RULES.md §5): `existing` are the
/// targets (with argument fingerprints) the volume is published at on this node.
pub fn publish_repeat_check(
    volume_id: &str,
    target: &Path,
    args: &[u8],
    existing: &[(PathBuf, Vec<u8>)],
    mode: Mode,
    snmw_advertised: bool,
) -> CsiResult<()> {
    if let Some((_, other_args)) = existing.iter().find(|(t, _)| t == target) {
        if other_args.as_slice() == args {
            return Ok(());
        }
        return Err(CsiError::AlreadyExists(format!(
            "volume {volume_id} is already published at {} with different arguments",
            target.display()
        )));
    }
    let shareable =
        mode.is_multi_node() || (mode == Mode::SingleNodeMultiWriter && snmw_advertised);
    match existing.first() {
        Some((other, _)) if !shareable => Err(CsiError::FailedPrecondition(format!(
            "volume {volume_id} is already published at {} and its access mode {mode:?} allows one target",
            other.display()
        ))),
        _ => Ok(()),
    }
}

/// One page of a sorted list: `starting_token` is the index to start at.
pub fn page<'a, T>(
    all: &'a [T],
    max_entries: i32,
    starting_token: &str,
) -> CsiResult<(&'a [T], String)> {
    if max_entries < 0 {
        return Err(CsiError::invalid("max_entries", "must not be negative"));
    }
    let start = if starting_token.is_empty() {
        0
    } else {
        starting_token
            .parse::<usize>()
            .ok()
            .filter(|i| *i <= all.len())
            .ok_or_else(|| {
                CsiError::Aborted(format!("starting_token {starting_token:?} is not valid"))
            })?
    };
    let end = if max_entries == 0 {
        all.len()
    } else {
        (start + max_entries as usize).min(all.len())
    };
    let next = if end < all.len() {
        end.to_string()
    } else {
        String::new()
    };
    Ok((&all[start..end], next))
}

impl csi_server::Identity for HostPath {}
