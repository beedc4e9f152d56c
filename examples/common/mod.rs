//! The node-side pieces shared by the example drivers (hostpath,
//! loop-block), included from each `main.rs` with
//! `#[path = "../common/mod.rs"] mod common;`. The controller side is
//! csi-controller's.
// Each example uses a different subset of these helpers.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use csi_proto::v1::{VolumeUsage, volume_usage};
use csi_server::{CsiError, CsiResult, blocking};
use mount_utils::Mounter;

/// The node side's records live here, under the state directory, in
/// csi-store (one file per stage and per publication).
pub const NODE_RECORDS_DIR: &str = "node";

/// Opens the node record of a driver (under `statedir/node`): csi-node's
/// `NodeVolumes`, which both drivers' node services go through.
pub fn open_node(
    statedir: &Path,
    mounter: Arc<dyn Mounter>,
    loops: Arc<dyn mount_utils::LoopDevices>,
    locator: Arc<dyn csi_node::VolumeLocator>,
    filesystems: Option<Arc<dyn csi_node::FilesystemMount>>,
) -> Result<csi_node::NodeVolumes, String> {
    let dir = statedir.join(NODE_RECORDS_DIR);
    let store = csi_store::FileStore::open(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut builder = csi_node::NodeVolumes::builder(mounter, Arc::new(store), locator)
        .loop_devices(loops)
        .single_node_multi_writer(true);
    if let Some(f) = filesystems {
        builder = builder.filesystem_mount(f);
    }
    builder.open().map_err(|e| e.to_string())
}

/// Puts back the mounts and devices of what the node record says is
/// staged and published; a volume that cannot be restored is logged and
/// reported abnormal, never stops the plugin.
pub fn restore_node(node: &csi_node::NodeVolumes) {
    let report = node.restore();
    for (volume, why) in &report.abnormal {
        tracing::warn!(%volume, %why, "volume is abnormal");
    }
}

/// Runs a node-record call off the async runtime; its errors carry the
/// spec's codes.
pub async fn on_node<T: Send + 'static>(
    node: &csi_node::NodeVolumes,
    f: impl FnOnce(&csi_node::NodeVolumes) -> Result<T, csi_node::NodeError> + Send + 'static,
) -> CsiResult<T> {
    let node = node.clone();
    blocking(move || f(&node).map_err(CsiError::from)).await
}

/// NodeGetVolumeStats for a volume of the node record: the condition from
/// the record and mountinfo, and the usage (statvfs of a healthy mounted
/// filesystem, `block_size` bytes for a block volume's device).
pub async fn node_stats(
    node: &csi_node::NodeVolumes,
    volume_id: String,
    path: String,
    block_size: impl FnOnce(&csi_node::VolumeRecord) -> Option<u64> + Send + 'static,
) -> CsiResult<csi_proto::v1::NodeGetVolumeStatsResponse> {
    on_node(node, move |node| {
        let condition = node.volume_condition(&volume_id, &path)?;
        let record = node.record(&volume_id);
        let block = record
            .as_ref()
            .and_then(|r| r.stage.as_ref())
            .is_some_and(|s| s.capability.is_block());
        let usage = if block {
            let total = record.as_ref().and_then(block_size).unwrap_or(0);
            vec![VolumeUsage {
                total: total as i64,
                unit: volume_usage::Unit::Bytes as i32,
                ..Default::default()
            }]
        } else if condition.abnormal {
            Vec::new()
        } else {
            fs_usage(Path::new(&path)).unwrap_or_default()
        };
        Ok(csi_proto::v1::NodeGetVolumeStatsResponse {
            usage,
            volume_condition: Some(condition),
        })
    })
    .await
}

/// Byte and inode usage of the filesystem at `path` (statvfs).
fn fs_usage(path: &Path) -> CsiResult<Vec<VolumeUsage>> {
    let st = nix::sys::statvfs::statvfs(path)
        .map_err(|e| csi_controller::internal("statfs", path, e))?;
    let frsize = st.fragment_size() as i64;
    let total = st.blocks() as i64 * frsize;
    let available = st.blocks_available() as i64 * frsize;
    let used = (st.blocks() as i64 - st.blocks_free() as i64) * frsize;
    let (inodes, inodes_free) = (st.files() as i64, st.files_free() as i64);
    Ok(vec![
        VolumeUsage {
            available,
            total,
            used,
            unit: volume_usage::Unit::Bytes as i32,
        },
        VolumeUsage {
            available: inodes_free,
            total: inodes,
            used: inodes - inodes_free,
            unit: volume_usage::Unit::Inodes as i32,
        },
    ])
}

/// Node requests for the examples' unit tests.
#[cfg(test)]
pub mod requests {
    use std::path::Path;

    use csi_proto::v1::volume_capability::access_mode::Mode;
    use csi_proto::v1::*;

    /// A block or mount capability with `mode` (and mount `flags`).
    pub fn cap(block: bool, mode: Mode, flags: &[&str]) -> VolumeCapability {
        let cap = if block {
            VolumeCapability::block()
        } else {
            VolumeCapability::mount("").with_mount_flags(flags.iter().copied())
        };
        cap.with_access_mode(mode)
    }

    pub fn stage_req(id: &str, staging: &Path, cap: VolumeCapability) -> NodeStageVolumeRequest {
        NodeStageVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.to_string_lossy().into(),
            volume_capability: Some(cap),
            ..Default::default()
        }
    }

    pub fn publish_req(
        id: &str,
        staging: &Path,
        target: &Path,
        cap: VolumeCapability,
    ) -> NodePublishVolumeRequest {
        NodePublishVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.to_string_lossy().into(),
            target_path: target.to_string_lossy().into(),
            volume_capability: Some(cap),
            ..Default::default()
        }
    }

    pub fn unpublish_req(id: &str, target: &Path) -> NodeUnpublishVolumeRequest {
        NodeUnpublishVolumeRequest {
            volume_id: id.into(),
            target_path: target.to_string_lossy().into(),
        }
    }

    pub fn unstage_req(id: &str, staging: &Path) -> NodeUnstageVolumeRequest {
        NodeUnstageVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.to_string_lossy().into(),
        }
    }

    /// Sends every event of this process, at every level, to the
    /// returned buffer (once per test binary: it is the global subscriber,
    /// so the blocking tasks' threads are captured too).
    pub fn capture_all_logs() -> std::sync::Arc<std::sync::Mutex<Vec<u8>>> {
        use std::sync::{Arc, Mutex};
        #[derive(Clone)]
        struct Buffer(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buffer {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                let mut b = self.0.lock().unwrap_or_else(|e| e.into_inner());
                b.extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer(Arc::new(Mutex::new(Vec::new())));
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("one capture per binary");
        buffer.0
    }

    pub fn stats_req(id: &str, path: &Path) -> NodeGetVolumeStatsRequest {
        NodeGetVolumeStatsRequest {
            volume_id: id.into(),
            volume_path: path.to_string_lossy().into(),
            ..Default::default()
        }
    }
}
