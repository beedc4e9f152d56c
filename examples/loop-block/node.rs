//! The Node service: csi-node's `NodeService` (the record of what this
//! node staged and published, the spec's rules, stats, expansion) with what
//! is loop-block's own: the disk appears as a loop device of the backing
//! file ControllerPublish named, formatted on first use only (a disk
//! formatted before that now shows no filesystem is refused, never
//! formatted again), tuned (read-ahead, direct I/O) each time it is
//! attached, and staged only while no group snapshot is being cut.

use std::path::PathBuf;
use std::sync::Arc;

use csi_controller::{Access, WeakEngine};
use csi_node::{Device, NodeBackend, NodeError, NodeInfo, NodeService, VolumeSource, VolumeInfo};
use csi_proto::v1::NodeStageVolumeRequest;
use csi_server::{CsiError, CsiResult};
use csi_store::FileStore;
use mount_utils::{Exec, LoopDevices, Mounter, ResizeFs, SafeFormatAndMount};

use crate::backend::{BACKING_FILE_KEY, Backend};
use crate::config::Config;

/// loop-block's half of the node service. Weak: the engine's backend
/// holds the node side.
pub struct NodeSide {
    pub engine: WeakEngine<Backend>,
    /// The backend's attach lock (see `Backend::attachments`).
    pub attachments: Arc<tokio::sync::RwLock<()>>,
}

/// The node service, its record in the driver's state store (under
/// `statedir/node` for a state dir from before they shared one).
pub fn open_node(
    config: &Config,
    side: NodeSide,
    mounter: Arc<dyn Mounter>,
    loops: Arc<dyn LoopDevices>,
    files: &FileStore,
    exec: Arc<dyn Exec>,
) -> Result<Arc<NodeService<NodeSide>>, String> {
    let info = NodeInfo::new(config.common.node_id()).max_volumes(config.attach_limit);
    // mkfs is I/O heavy: a burst of first-time stages formats two at a time.
    let formatter = SafeFormatAndMount::new(mounter.clone(), exec.clone());
    let service = NodeService::builder(Arc::new(side), info, mounter)
        .volumes(|v| {
            v.loop_devices(loops)
                .filesystem_mount(Arc::new(formatter.with_max_concurrent_formats(2)))
                .single_node_multi_writer(true)
        })
        .resize_filesystems(ResizeFs::new(exec))
        .open_shared(files, &config.statedir.join("node"))
        .map_err(|e| e.to_string())?;
    Ok(Arc::new(service))
}

impl csi_node::VolumeLocator for NodeSide {
    fn source(&self, volume_id: &str) -> Option<VolumeSource> {
        let engine = self.engine.upgrade()?;
        engine.known_volume(volume_id).ok()?;
        Some(VolumeSource::Image(engine.backend().volume_path(volume_id)))
    }

    fn prepare_device(&self, volume_id: &str, device: &Device) -> Result<(), NodeError> {
        let Some(engine) = self.engine.upgrade() else {
            return Ok(());
        };
        let volume = engine.known_volume(volume_id).ok();
        let params = volume.map(|v| v.mutable_parameters).unwrap_or_default();
        let tuning = engine.backend().tuning(&params)?;
        let applied = tuning.apply(&device.path);
        applied.map_err(|e| NodeError::Csi(e.into()))
    }
}

impl NodeBackend for NodeSide {
    fn volume(&self, volume_id: &str) -> Option<VolumeInfo> {
        let v = self.engine.upgrade()?.known_volume(volume_id).ok()?;
        Some(VolumeInfo::new(v.access == Access::Block, v.capacity_bytes))
    }

    /// The backing file named by the publish context must be this volume's.
    fn check_stage(&self, req: &NodeStageVolumeRequest) -> CsiResult<()> {
        let field = format!("publish_context[{BACKING_FILE_KEY}]");
        let path = req.publish_context.get(BACKING_FILE_KEY).ok_or_else(|| {
            CsiError::invalid(&field, "required: ControllerPublishVolume returns it")
        })?;
        let path = PathBuf::from(path);
        let engine = self.engine.upgrade();
        let owner = engine.and_then(|e| e.backend().volume_of(&path));
        if owner.as_deref() != Some(req.volume_id.as_str()) {
            let why = format!("not the backing file of volume {}", req.volume_id);
            return Err(CsiError::invalid(field, why));
        }
        let missing =
            || CsiError::NotFound(format!("volume {} has no backing file", req.volume_id));
        path.is_file().then_some(()).ok_or_else(missing)
    }

    fn stage_lock(&self) -> Option<&tokio::sync::RwLock<()>> {
        Some(&self.attachments)
    }
}

#[cfg(test)]
mod tests {
    //! loop-block's own node bits on a fake host; the record's rules are
    //! csi-node's and tested there.
    use std::path::Path;

    use clap::Parser;
    use csi_node::testing::{FakeHost, requests::*};
    use csi_proto::v1::volume_capability::access_mode::Mode;
    use csi_proto::v1::*;
    use csi_server::{CallContext, Controller, Method, Node};
    use mount_utils::{ExecOutput, FakeExec};

    use super::*;
    use crate::driver::LoopBlock;

    #[tokio::test]
    async fn a_disk_is_staged_from_its_own_backing_file_formatted_once_and_kept_while_staged() {
        let (dir, host, exec) = (
            tempfile::tempdir().unwrap(),
            FakeHost::new(),
            Arc::new(FakeExec::new()),
        );
        let statedir = dir.path().join("state").to_string_lossy().into_owned();
        let config = Config::parse_from(["loop-block", "--statedir", &statedir, "--nodeid", "n1"]);
        let d = LoopBlock::open_with(config, host.mounter(), host.loops(), exec.clone()).unwrap();
        let ctx = CallContext::detached(0, Method::NodeStageVolume);
        let (c, mut files) = (cap(false, Mode::SingleNodeWriter, &[]), Vec::new());
        for name in ["d1", "d2"] {
            let req = CreateVolumeRequest {
                name: name.into(),
                volume_capabilities: vec![c.clone()],
                ..Default::default()
            };
            let v = d.engine.create_volume(&ctx, req).await.unwrap().volume;
            let id = v.unwrap().volume_id;
            files.push((id.clone(), d.backend.volume_path(&id)));
        }
        let (id, staging) = (files[0].0.clone(), dir.path().join("staging"));
        let stage = |file: &Path| NodeStageVolumeRequest {
            publish_context: [(BACKING_FILE_KEY.into(), file.to_string_lossy().into())].into(),
            ..stage_req(&id, &staging, c.clone())
        };
        for file in [Path::new(""), &files[1].1] {
            let e = d.node.node_stage_volume(&ctx, stage(file)).await;
            let code = e.unwrap_err().code();
            assert_eq!(code, tonic::Code::InvalidArgument, "{file:?}");
        }
        assert_eq!(host.attached(), 0);

        exec.expect("blkid", ExecOutput::exit(2, ""));
        exec.expect("mkfs.ext4", ExecOutput::ok(""));
        let req = stage(&files[0].1);
        d.node.node_stage_volume(&ctx, req).await.unwrap();
        let formatted = (host.mounts_at(&staging).len(), exec.pending());
        assert_eq!(formatted, (1, 0), "formatted on first use");
        let delete = DeleteVolumeRequest {
            volume_id: id.clone(),
            ..Default::default()
        };
        let e = d.engine.delete_volume(&ctx, delete).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "still staged");
    }
}
