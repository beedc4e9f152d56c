//! The Node service: csi-node's `NodeService` (the record of what this
//! node staged and published, the spec's rules, stats, expansion) with what
//! is loop-block's own: the disk appears as a loop device of the backing
//! file ControllerPublish named, formatted on first use only (a disk
//! formatted before that now shows no filesystem is refused, never
//! formatted again), tuned (read-ahead, direct I/O) each time it is
//! attached, and staged only while no group snapshot is being cut.
//!
//! Everything the node needs comes from the request's publish context
//! ([`crate::context`]), so it runs without a controller in its process
//! (`--mode node`). With one (`--mode both`), that controller's records
//! still answer for volumes staged before the publish context carried the
//! disk's facts, and give the tuning changed since the attach.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock, Weak};

use csi_controller::{Access, IdKind, WeakControllerService};
use csi_node::{
    Device, NodeBackend, NodeError, NodeInfo, NodeService, NodeVolumes, VolumeContexts, VolumeInfo,
    VolumeSource,
};
use csi_proto::v1::NodeStageVolumeRequest;
use csi_server::{CsiError, CsiResult};
use csi_store::FileStore;
use mount_utils::{Exec, LoopDevices, Mounter, ResizeFs, SafeFormatAndMount};

use crate::backend::Backend;
use crate::config::Config;
use crate::context::{self, BACKING_FILE_KEY};

/// loop-block's half of the node service.
pub struct NodeSide {
    /// The controller service when it runs in this process (weak: the
    /// controller's backend holds the node side).
    pub engine: Option<WeakControllerService<Backend>>,
    /// The disks' directory (shared with the controller) and the attach
    /// lock ([`Backend::for_node_side`]).
    pub backend: Backend,
    /// This node's record once opened (weak: the record holds this side).
    pub records: Weak<OnceLock<NodeVolumes>>,
}

/// What the node runs on: mounts, loop devices, mkfs and fsck, and the
/// filesystem resizer.
pub type NodeSeams = (
    Arc<dyn Mounter>,
    Arc<dyn LoopDevices>,
    Arc<dyn Exec>,
    ResizeFs,
);

/// The node service, its record in this process's state store (under
/// `statedir/node` for a state dir from before they shared one).
pub fn open_node(
    config: &Config,
    side: NodeSide,
    (mounter, loops, exec, resize): NodeSeams,
    files: &FileStore,
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
        .resize_filesystems(resize)
        .open_shared(files, &config.statedir.join("node"))
        .map_err(|e| e.to_string())?;
    Ok(Arc::new(service))
}

impl NodeSide {
    /// The controller service in this process, if any.
    fn controller(&self) -> Option<csi_controller::ControllerService<Backend>> {
        self.engine.as_ref()?.upgrade()
    }
}

impl csi_node::VolumeLocator for NodeSide {
    /// For a volume whose record was lost (its devices are found by this
    /// backing file) and for unstage and unpublish, which carry no context.
    /// Without a controller here, a disk is there when its backing file is.
    fn source(&self, volume_id: &str) -> Option<VolumeSource> {
        let image = self.backend.volume_path(volume_id);
        match &self.engine {
            Some(engine) => {
                engine.upgrade()?.known_volume(volume_id).ok()?;
                Some(VolumeSource::Image(image))
            }
            None => (IdKind::Volume.is_valid(volume_id) && image.is_file())
                .then_some(VolumeSource::Image(image)),
        }
    }

    /// NodeStage and NodePublish learn the backing file from the publish
    /// context (ControllerPublishVolume's answer), and it must be this
    /// volume's.
    fn source_in(
        &self,
        volume_id: &str,
        contexts: &VolumeContexts,
    ) -> Result<Option<VolumeSource>, NodeError> {
        match contexts.publish_context.get(BACKING_FILE_KEY) {
            Some(file) => {
                let path = PathBuf::from(file);
                self.check_backing_file(volume_id, &path)?;
                Ok(Some(VolumeSource::Image(path)))
            }
            None => Ok(self.source(volume_id)),
        }
    }

    /// The tuning of the controller here when there is one (it has the
    /// changes made since the attach), else the one the disk was staged
    /// with.
    fn prepare_device(&self, volume_id: &str, device: &Device) -> Result<(), NodeError> {
        let direct_io = self.backend.direct_io_supported;
        let tuning = match self.controller() {
            Some(engine) => {
                let volume = engine.known_volume(volume_id).ok();
                let params = volume.map(|v| v.mutable_parameters).unwrap_or_default();
                self.backend.tuning(&params)?
            }
            None => {
                let records = self.records.upgrade();
                let record = records.as_ref().and_then(|r| r.get()?.record(volume_id));
                match record.and_then(|r| r.stage) {
                    Some(stage) => context::tuning(&stage.publish_context, direct_io)?,
                    None => crate::tuning::Tuning::default(),
                }
            }
        };
        let applied = tuning.apply(&device.path);
        applied.map_err(|e| NodeError::Csi(e.into()))
    }
}

impl NodeSide {
    /// The publish context's backing file must be `volume_id`'s (the node
    /// only attaches files it owns, whatever a publish context says).
    fn check_backing_file(&self, volume_id: &str, path: &std::path::Path) -> CsiResult<()> {
        if self.backend.volume_of(path).as_deref() != Some(volume_id) {
            let field = format!("publish_context[{BACKING_FILE_KEY}]");
            let why = format!("not the backing file of volume {volume_id}");
            return Err(CsiError::invalid(field, why));
        }
        Ok(())
    }
}

impl NodeBackend for NodeSide {
    /// The controller's record here, for volumes staged before the publish
    /// context described the disk.
    fn volume(&self, volume_id: &str) -> Option<VolumeInfo> {
        let v = self.controller()?.known_volume(volume_id).ok()?;
        Some(VolumeInfo::new(v.access == Access::Block, v.capacity_bytes))
    }

    /// Access type and size from the publish context. No contexts at all
    /// (stats or expansion of a volume not staged here): NOT_FOUND, unless
    /// the controller here knows it.
    fn volume_in(
        &self,
        volume_id: &str,
        contexts: &VolumeContexts,
    ) -> Result<Option<VolumeInfo>, NodeError> {
        let described = context::describes_volume(contexts);
        if described || (self.engine.is_none() && *contexts != VolumeContexts::default()) {
            return context::volume_info(contexts).map(Some);
        }
        Ok(self.volume(volume_id))
    }

    /// The publish context must name this volume's backing file, and it
    /// must be there.
    fn check_stage(&self, req: &NodeStageVolumeRequest) -> CsiResult<()> {
        let field = format!("publish_context[{BACKING_FILE_KEY}]");
        let path = req.publish_context.get(BACKING_FILE_KEY).ok_or_else(|| {
            CsiError::invalid(&field, "required: ControllerPublishVolume returns it")
        })?;
        let path = PathBuf::from(path);
        self.check_backing_file(&req.volume_id, &path)?;
        let missing =
            || CsiError::NotFound(format!("volume {} has no backing file", req.volume_id));
        path.is_file().then_some(()).ok_or_else(missing)
    }

    fn stage_lock(&self) -> Option<&tokio::sync::RwLock<()>> {
        Some(&self.backend.attachments)
    }
}

#[cfg(test)]
mod tests {
    //! loop-block's own node bits on a fake host; the record's rules are
    //! csi-node's and tested there.
    use std::collections::HashMap;
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
        let (controller, node) = (d.controller.as_ref().unwrap(), d.node.as_ref().unwrap());
        let ctx = CallContext::detached(0, Method::NodeStageVolume);
        let (c, mut files) = (cap(false, Mode::SingleNodeWriter, &[]), Vec::new());
        for name in ["d1", "d2"] {
            let req = CreateVolumeRequest {
                name: name.into(),
                volume_capabilities: vec![c.clone()],
                ..Default::default()
            };
            let v = controller.create_volume(&ctx, req).await.unwrap().volume;
            let id = v.unwrap().volume_id;
            files.push((id.clone(), d.backend.volume_path(&id)));
        }
        let (id, staging) = (files[0].0.clone(), dir.path().join("staging"));
        let stage = |file: &Path| NodeStageVolumeRequest {
            publish_context: [(BACKING_FILE_KEY.into(), file.to_string_lossy().into())].into(),
            ..stage_req(&id, &staging, c.clone())
        };
        for file in [Path::new(""), &files[1].1] {
            let e = node.node_stage_volume(&ctx, stage(file)).await;
            let code = e.unwrap_err().code();
            assert_eq!(code, tonic::Code::InvalidArgument, "{file:?}");
        }
        assert_eq!(host.attached(), 0);

        exec.expect("blkid", ExecOutput::exit(2, ""));
        exec.expect("mkfs.ext4", ExecOutput::ok(""));
        let req = stage(&files[0].1);
        node.node_stage_volume(&ctx, req).await.unwrap();
        let formatted = (host.mounts_at(&staging).len(), exec.pending());
        assert_eq!(formatted, (1, 0), "formatted on first use");
        let delete = DeleteVolumeRequest {
            volume_id: id.clone(),
            ..Default::default()
        };
        let e = controller.delete_volume(&ctx, delete).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "still staged");
    }

    /// `--mode controller` and `--mode node` on one data dir, each with its
    /// own state dir: the node learns the disk from the publish context.
    #[tokio::test]
    async fn apart_the_node_learns_the_disk_from_the_publish_context() {
        let (dir, host, exec) = (
            tempfile::tempdir().unwrap(),
            FakeHost::new(),
            Arc::new(FakeExec::new()),
        );
        let path = |p: &str| dir.path().join(p).to_string_lossy().into_owned();
        let open = |mode: &str, state: &str| {
            let config = Config::for_test(mode, &path(state), &path("data"));
            LoopBlock::open_with(config, host.mounter(), host.loops(), exec.clone()).unwrap()
        };
        let (ctl, nd) = (open("controller", "ctl"), open("node", "node"));
        assert!(ctl.node.is_none() && nd.controller.is_none());
        let (controller, node) = (ctl.controller.unwrap(), nd.node.unwrap());
        let ctx = CallContext::detached(0, Method::NodeStageVolume);
        let c = cap(false, Mode::SingleNodeWriter, &[]);
        let req = CreateVolumeRequest {
            name: "pvc".into(),
            capacity_range: Some(CapacityRange::at_least(8 << 20)),
            volume_capabilities: vec![c.clone()],
            ..Default::default()
        };
        let v = controller.create_volume(&ctx, req).await.unwrap().volume;
        let id = v.unwrap().volume_id;
        let publish = ControllerPublishVolumeRequest {
            volume_id: id.clone(),
            node_id: "n1".into(),
            volume_capability: Some(c.clone()),
            ..Default::default()
        };
        let published = controller.controller_publish_volume(&ctx, publish).await;
        let context = published.unwrap().publish_context;
        assert_eq!(context[context::ACCESS_KEY], "mount");
        assert_eq!(context[context::CAPACITY_KEY], (8 << 20).to_string());
        assert!(context[BACKING_FILE_KEY].starts_with(&path("data")));

        let staging = dir.path().join("staging");
        let stage =
            |cap: VolumeCapability, context: &HashMap<String, String>| NodeStageVolumeRequest {
                publish_context: context.clone(),
                ..stage_req(&id, &staging, cap)
            };
        // A block stage of a mount disk: the access type came with the context.
        let block = cap(true, Mode::SingleNodeWriter, &[]);
        let e = node.node_stage_volume(&ctx, stage(block, &context)).await;
        assert_eq!(e.unwrap_err().code(), tonic::Code::FailedPrecondition);
        let mut partial = context.clone();
        partial.remove(context::ACCESS_KEY);
        let e = node
            .node_stage_volume(&ctx, stage(c.clone(), &partial))
            .await;
        let e = e.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.to_string().contains(context::ACCESS_KEY), "{e}");
        assert_eq!(host.attached(), 0);

        exec.expect("blkid", ExecOutput::exit(2, ""));
        exec.expect("mkfs.ext4", ExecOutput::ok(""));
        node.node_stage_volume(&ctx, stage(c.clone(), &context))
            .await
            .unwrap();
        assert_eq!((host.attached(), exec.pending()), (1, 0));
        assert_eq!(host.mounts_at(&staging).len(), 1);
        // Stats of a disk not staged here: NOT_FOUND, with no controller to ask.
        let stats = NodeGetVolumeStatsRequest {
            volume_id: format!("vol-{}", "0".repeat(32)),
            volume_path: staging.to_string_lossy().into(),
            ..Default::default()
        };
        let e = node.node_get_volume_stats(&ctx, stats).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound);
        let unstage = NodeUnstageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.to_string_lossy().into(),
        };
        node.node_unstage_volume(&ctx, unstage).await.unwrap();
        assert_eq!((host.attached(), host.mounts_at(&staging).len()), (0, 0));
    }
}
