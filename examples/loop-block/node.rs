//! The Node service: the disk appears on the node as a loop device, on
//! csi-node's record of what this node staged and published (the spec's
//! repeat and ownership rules before any syscall, the intent saved before
//! mounting, what is mounted checked in mountinfo).
//!
//! Mount access: NodeStage attaches the backing file (named by the publish
//! context), formats it on first use only (a disk formatted before that now
//! shows no filesystem is refused, never formatted again) and mounts it at
//! the staging path; NodePublish bind-mounts the staging path at the
//! target. Block access: NodeStage attaches the file and NodePublish
//! bind-mounts the device node on a file at the target; NodeUnstage of a
//! disk still published is refused, so its device is never reused under a
//! live target.

use std::path::PathBuf;

use csi_proto::v1::*;
use csi_server::{CallContext, CsiError, CsiResult, Node};

use csi_controller::{Access, VolumeRecord, internal};
use csi_server::blocking;

use crate::backend::BACKING_FILE_KEY;
use crate::common::{node_stats, on_node};
use crate::driver::LoopBlock;

/// Whether the capability fits a volume of the given access type.
fn check_access(volume: &VolumeRecord, cap: Option<&VolumeCapability>) -> CsiResult<()> {
    let Some(cap) = cap else {
        return Ok(()); // csi-node names the missing field
    };
    if cap.is_block() == (volume.access == Access::Block) {
        return Ok(());
    }
    Err(CsiError::FailedPrecondition(format!(
        "volume {} was created for {:?} access, not {}",
        volume.id,
        volume.access,
        if cap.is_block() { "block" } else { "mount" }
    )))
}

impl LoopBlock {
    /// The backing file named by the publish context must be this volume's
    /// own file (csi-node attaches the one the backend names).
    fn check_backing_file(&self, req: &NodeStageVolumeRequest) -> CsiResult<()> {
        let field = format!("publish_context[{BACKING_FILE_KEY}]");
        let path = req.publish_context.get(BACKING_FILE_KEY).ok_or_else(|| {
            CsiError::invalid(&field, "required: ControllerPublishVolume returns it")
        })?;
        let path = PathBuf::from(path);
        if self.backend.volume_of(&path).as_deref() != Some(req.volume_id.as_str()) {
            return Err(CsiError::invalid(
                field,
                format!("not the backing file of volume {}", req.volume_id),
            ));
        }
        if !path.is_file() {
            return Err(CsiError::NotFound(format!(
                "backing file of volume {} is missing",
                req.volume_id
            )));
        }
        Ok(())
    }

    /// Refreshes the loop device's size and grows the filesystem on it;
    /// returns the device's new size.
    fn expand_blocking(&self, stage: &csi_node::StageRecord) -> CsiResult<i64> {
        let dev = stage
            .device
            .as_ref()
            .map(|d| d.path.clone())
            .ok_or_else(|| {
                CsiError::FailedPrecondition(format!(
                    "volume {} has no loop device",
                    stage.volume_id
                ))
            })?;
        let size = self
            .loops
            .set_capacity(&dev)
            .map_err(|e| internal("refreshing the size of", &dev, e))?;
        if !stage.capability.is_block() {
            let device = dev.to_string_lossy();
            let grow = self
                .resizer
                .need_resize(&device, &stage.path)
                .map_err(|e| internal("inspecting the filesystem on", &dev, e))?;
            if grow {
                self.resizer
                    .resize(&device, &stage.path)
                    .map_err(|e| internal("growing the filesystem on", &dev, e))?;
            }
        }
        Ok(size as i64)
    }
}

#[csi_server::async_trait]
impl Node for LoopBlock {
    async fn node_stage_volume(
        &self,
        _ctx: &CallContext,
        req: NodeStageVolumeRequest,
    ) -> CsiResult<NodeStageVolumeResponse> {
        let _attaching = self.attachments.read().await;
        let volume = self.known_volume(&req.volume_id)?;
        check_access(&volume, req.volume_capability.as_ref())?;
        self.check_backing_file(&req)?;
        on_node(&self.node, move |node| node.stage(&req)).await?;
        Ok(NodeStageVolumeResponse {})
    }

    async fn node_unstage_volume(
        &self,
        _ctx: &CallContext,
        req: NodeUnstageVolumeRequest,
    ) -> CsiResult<NodeUnstageVolumeResponse> {
        let _detaching = self.attachments.read().await;
        on_node(&self.node, move |node| node.unstage(&req)).await?;
        Ok(NodeUnstageVolumeResponse {})
    }

    async fn node_publish_volume(
        &self,
        _ctx: &CallContext,
        req: NodePublishVolumeRequest,
    ) -> CsiResult<NodePublishVolumeResponse> {
        let volume = self.known_volume(&req.volume_id)?;
        check_access(&volume, req.volume_capability.as_ref())?;
        on_node(&self.node, move |node| node.publish(&req)).await?;
        Ok(NodePublishVolumeResponse {})
    }

    async fn node_unpublish_volume(
        &self,
        _ctx: &CallContext,
        req: NodeUnpublishVolumeRequest,
    ) -> CsiResult<NodeUnpublishVolumeResponse> {
        on_node(&self.node, move |node| node.unpublish(&req)).await?;
        Ok(NodeUnpublishVolumeResponse {})
    }

    async fn node_get_volume_stats(
        &self,
        _ctx: &CallContext,
        req: NodeGetVolumeStatsRequest,
    ) -> CsiResult<NodeGetVolumeStatsResponse> {
        self.known_volume(&req.volume_id)?;
        node_stats(&self.node, req.volume_id, req.volume_path, |record| {
            let dev = record.stage.as_ref()?.device.as_ref()?;
            mount_utils::block::device_size(&dev.path).ok()
        })
        .await
    }

    async fn node_expand_volume(
        &self,
        _ctx: &CallContext,
        req: NodeExpandVolumeRequest,
    ) -> CsiResult<NodeExpandVolumeResponse> {
        let volume = self.known_volume(&req.volume_id)?;
        let (id, path) = (req.volume_id.clone(), req.volume_path.clone());
        let record = on_node(&self.node, move |node| node.record_at(&id, &path)).await?;
        let Some(stage) = record.stage else {
            return Err(CsiError::FailedPrecondition(format!(
                "volume {} is not staged",
                volume.id
            )));
        };
        if stage.readonly {
            return Err(CsiError::FailedPrecondition(format!(
                "volume {} is staged read-only",
                volume.id
            )));
        }
        let this = self.clone();
        let capacity_bytes = blocking(move || this.expand_blocking(&stage)).await?;
        tracing::info!(volume = %volume.id, capacity_bytes, "expanded volume on the node");
        Ok(NodeExpandVolumeResponse { capacity_bytes })
    }

    async fn node_get_info(
        &self,
        _ctx: &CallContext,
        _req: NodeGetInfoRequest,
    ) -> CsiResult<NodeGetInfoResponse> {
        Ok(NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            max_volumes_per_node: self.config.attach_limit,
            accessible_topology: None,
        })
    }
}

#[cfg(test)]
mod tests {
    //! The node service on a fake host (csi-node's FakeHost: FakeMounter
    //! and FakeLoopDevices) and a FakeExec for blkid/mkfs/fsck, without
    //! root: one test per case of issue 13.
    use std::path::Path;
    use std::sync::Arc;

    use clap::Parser;
    use csi_node::testing::FakeHost;
    use csi_proto::v1::volume_capability::access_mode::Mode;
    use csi_server::Method;
    use csi_server::{Controller, PluginInfo};
    use mount_utils::{Errno, ExecOutput, FakeExec, FakeOp, LoopDevices, LoopOptions, Mounter};

    use super::*;
    use crate::common::requests::*;
    use crate::config::Config;

    fn driver(dir: &Path, host: &FakeHost, exec: &Arc<FakeExec>) -> LoopBlock {
        let statedir = dir.join("state").to_string_lossy().into_owned();
        let config = Config::parse_from(["loop-block", "--statedir", &statedir, "--nodeid", "n1"]);
        LoopBlock::open_with(config, host.mounter(), host.loops(), exec.clone()).unwrap()
    }

    fn ctx(method: Method) -> CallContext {
        let info = PluginInfo::new("loop-block.csi.csi-kit.dev", "test").unwrap();
        CallContext::for_test(
            method,
            info,
            crate::capabilities(&Config::parse_from(["loop-block"])),
        )
    }

    /// A disk created and ControllerPublished to this node; its id and
    /// publish context.
    async fn disk(d: &LoopBlock, name: &str, block: bool) -> (String, Vec<(String, String)>) {
        let req = CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(CapacityRange::at_least(1 << 20)),
            volume_capabilities: vec![cap(block, Mode::SingleNodeWriter, &[])],
            ..Default::default()
        };
        let id = (d.engine)
            .create_volume(&ctx(Method::CreateVolume), req)
            .await
            .unwrap()
            .volume
            .unwrap()
            .volume_id;
        let req = ControllerPublishVolumeRequest {
            volume_id: id.clone(),
            node_id: "n1".into(),
            volume_capability: Some(cap(block, Mode::SingleNodeWriter, &[])),
            ..Default::default()
        };
        let context = (d.engine)
            .controller_publish_volume(&ctx(Method::ControllerPublishVolume), req)
            .await
            .unwrap()
            .publish_context;
        (id, context.into_iter().collect())
    }

    /// NodeStage with the publish context ControllerPublish returned.
    fn stage_req(
        id: &str,
        context: &[(String, String)],
        staging: &Path,
        cap: VolumeCapability,
    ) -> NodeStageVolumeRequest {
        NodeStageVolumeRequest {
            publish_context: context.iter().cloned().collect(),
            ..crate::common::requests::stage_req(id, staging, cap)
        }
    }

    /// blkid finds nothing, mkfs succeeds: a first stage.
    fn fresh_disk(exec: &FakeExec) {
        exec.expect("blkid", ExecOutput::exit(2, ""));
        exec.expect("mkfs.ext4", ExecOutput::ok(""));
    }

    fn node() -> Method {
        Method::NodeStageVolume
    }

    #[tokio::test]
    async fn unstage_of_a_published_block_disk_is_refused_and_keeps_the_device() {
        let (dir, host, exec) = (
            tempfile::tempdir().unwrap(),
            FakeHost::new(),
            Arc::new(FakeExec::new()),
        );
        let d = driver(dir.path(), &host, &exec);
        let (id, context) = disk(&d, "d1", true).await;
        let (staging, target) = (dir.path().join("staging"), dir.path().join("target"));
        let c = cap(true, Mode::SingleNodeWriter, &[]);
        d.node_stage_volume(&ctx(node()), stage_req(&id, &context, &staging, c.clone()))
            .await
            .unwrap();
        d.node_publish_volume(&ctx(node()), publish_req(&id, &staging, &target, c))
            .await
            .unwrap();
        let e = d
            .node_unstage_volume(&ctx(node()), unstage_req(&id, &staging))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert_eq!(host.attached(), 1, "the device stays attached");
        // Nor can the controller delete it meanwhile.
        let e = (d.engine)
            .delete_volume(
                &ctx(Method::DeleteVolume),
                DeleteVolumeRequest {
                    volume_id: id.clone(),
                    ..Default::default()
                },
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    }

    #[tokio::test]
    async fn an_rw_flag_cannot_make_a_read_only_disk_writable() {
        let (dir, host, exec) = (
            tempfile::tempdir().unwrap(),
            FakeHost::new(),
            Arc::new(FakeExec::new()),
        );
        let d = driver(dir.path(), &host, &exec);
        let (id, context) = disk(&d, "d1", false).await;
        let (staging, target) = (dir.path().join("staging"), dir.path().join("target"));
        // A disk formatted before, staged reader-only with an rw flag.
        exec.expect("blkid", ExecOutput::ok("TYPE=ext4\n"));
        let reader = cap(false, Mode::MultiNodeReaderOnly, &["rw"]);
        d.node_stage_volume(
            &ctx(node()),
            stage_req(&id, &context, &staging, reader.clone()),
        )
        .await
        .unwrap();
        assert!(host.mounts_at(&staging)[0].is_read_only());
        let mut req = publish_req(&id, &staging, &target, reader);
        req.readonly = true;
        d.node_publish_volume(&ctx(node()), req).await.unwrap();
        assert!(host.mounts_at(&target)[0].is_read_only());
    }

    #[tokio::test]
    async fn mount_flag_values_appear_in_no_error() {
        let (dir, host, exec) = (
            tempfile::tempdir().unwrap(),
            FakeHost::new(),
            Arc::new(FakeExec::new()),
        );
        let d = driver(dir.path(), &host, &exec);
        let (id, context) = disk(&d, "d1", false).await;
        let staging = dir.path().join("staging");
        fresh_disk(&exec);
        host.fake()
            .inject_error(FakeOp::Mount, &staging, Errno::EINVAL);
        let c = cap(false, Mode::SingleNodeWriter, &["password=SECRET"]);
        let e = d
            .node_stage_volume(&ctx(node()), stage_req(&id, &context, &staging, c))
            .await
            .unwrap_err();
        assert!(!format!("{e} {e:?}").contains("SECRET"), "{e}");
        assert_eq!(host.attached(), 0, "a failed first stage detaches");
    }

    #[tokio::test]
    async fn paths_the_driver_did_not_record_are_not_touched() {
        let (dir, host, exec) = (
            tempfile::tempdir().unwrap(),
            FakeHost::new(),
            Arc::new(FakeExec::new()),
        );
        let d = driver(dir.path(), &host, &exec);
        let (a, ctx_a) = disk(&d, "a", true).await;
        let (b, _) = disk(&d, "b", true).await;
        let (sa, ta) = (dir.path().join("sa"), dir.path().join("ta"));
        let c = cap(true, Mode::SingleNodeWriter, &[]);
        d.node_stage_volume(&ctx(node()), stage_req(&a, &ctx_a, &sa, c.clone()))
            .await
            .unwrap();
        d.node_publish_volume(&ctx(node()), publish_req(&a, &sa, &ta, c.clone()))
            .await
            .unwrap();
        let e = d
            .node_unpublish_volume(&ctx(node()), unpublish_req(&b, &ta))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound);
        assert_eq!(host.mounts_at(&ta).len(), 1);
        let foreign = dir.path().join("foreign");
        std::fs::create_dir(&foreign).unwrap();
        host.add_mount("tmpfs", &foreign, "tmpfs");
        let _ = d
            .node_unpublish_volume(&ctx(node()), unpublish_req(&a, &foreign))
            .await;
        assert_eq!(host.mounts_at(&foreign).len(), 1, "the tmpfs stays");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&foreign, &link).unwrap();
        assert!(
            d.node_publish_volume(&ctx(node()), publish_req(&a, &sa, &link, c))
                .await
                .is_err()
        );
        assert_eq!(host.mounts_at(&foreign).len(), 1);
    }

    #[tokio::test]
    async fn block_publish_onto_a_non_empty_file_is_refused() {
        let (dir, host, exec) = (
            tempfile::tempdir().unwrap(),
            FakeHost::new(),
            Arc::new(FakeExec::new()),
        );
        let d = driver(dir.path(), &host, &exec);
        let (id, context) = disk(&d, "d1", true).await;
        let (staging, target) = (dir.path().join("staging"), dir.path().join("user-file"));
        std::fs::write(&target, b"the user's data").unwrap();
        let c = cap(true, Mode::SingleNodeWriter, &[]);
        d.node_stage_volume(&ctx(node()), stage_req(&id, &context, &staging, c.clone()))
            .await
            .unwrap();
        assert!(
            d.node_publish_volume(&ctx(node()), publish_req(&id, &staging, &target, c))
                .await
                .is_err()
        );
        assert!(host.mounts_at(&target).is_empty());
        assert_eq!(std::fs::read(&target).unwrap(), b"the user's data");
    }

    #[tokio::test]
    async fn a_staged_disk_with_damaged_first_blocks_is_abnormal_never_reformatted() {
        let (dir, host, exec) = (
            tempfile::tempdir().unwrap(),
            FakeHost::new(),
            Arc::new(FakeExec::new()),
        );
        let (staging, s_ok) = (dir.path().join("staging"), dir.path().join("s-ok"));
        let (id, ok) = {
            let d = driver(dir.path(), &host, &exec);
            let (id, context) = disk(&d, "d1", false).await;
            let (ok, ok_ctx) = disk(&d, "d2", true).await;
            fresh_disk(&exec);
            let c = cap(false, Mode::SingleNodeWriter, &[]);
            d.node_stage_volume(&ctx(node()), stage_req(&id, &context, &staging, c))
                .await
                .unwrap();
            let b = cap(true, Mode::SingleNodeWriter, &[]);
            d.node_stage_volume(&ctx(node()), stage_req(&ok, &ok_ctx, &s_ok, b))
                .await
                .unwrap();
            // A reboot: mounts and devices are gone.
            host.unmount(&staging, false).unwrap();
            for image in [d.backend.volume_path(&id), d.backend.volume_path(&ok)] {
                for dev in host.loops().find_by_backing_file(&image).unwrap() {
                    host.loops().detach(&dev).unwrap();
                }
            }
            (id, ok)
        };
        // Its first blocks are damaged: blkid finds nothing.
        exec.expect("blkid", ExecOutput::exit(2, ""));
        let before = exec.calls().len();
        let d = driver(dir.path(), &host, &exec);
        d.reconcile_on_start().unwrap();
        let after = &exec.calls()[before..];
        assert!(after.iter().any(|c| c.program == "blkid"), "{after:?}");
        assert!(
            !after.iter().any(|c| c.program.starts_with("mkfs")),
            "{after:?}"
        );
        assert!(host.mounts_at(&staging).is_empty());
        let r = d
            .node_get_volume_stats(&ctx(node()), stats_req(&id, &staging))
            .await
            .unwrap();
        assert!(r.volume_condition.unwrap().abnormal);
        // The other disk is served.
        let r = d
            .node_get_volume_stats(&ctx(node()), stats_req(&ok, &s_ok))
            .await
            .unwrap();
        assert!(!r.volume_condition.unwrap().abnormal);
    }

    #[tokio::test]
    async fn unstage_without_a_record_detaches_the_device_by_backing_file() {
        let (dir, host, exec) = (
            tempfile::tempdir().unwrap(),
            FakeHost::new(),
            Arc::new(FakeExec::new()),
        );
        let d = driver(dir.path(), &host, &exec);
        let (id, _) = disk(&d, "d1", true).await;
        host.loops()
            .attach(&d.backend.volume_path(&id), &LoopOptions::default())
            .unwrap()
            .keep();
        d.node_unstage_volume(&ctx(node()), unstage_req(&id, &dir.path().join("staging")))
            .await
            .unwrap();
        assert_eq!(host.attached(), 0);
    }

    #[tokio::test]
    async fn mount_flag_values_reach_no_log_line_at_trace_level() {
        let logs = capture_all_logs();
        let (dir, host, exec) = (
            tempfile::tempdir().unwrap(),
            FakeHost::new(),
            Arc::new(FakeExec::new()),
        );
        let d = driver(dir.path(), &host, &exec);
        let (id, context) = disk(&d, "d1", false).await;
        let (staging, target) = (dir.path().join("staging"), dir.path().join("target"));
        let c = cap(false, Mode::SingleNodeWriter, &["password=SECRET"]);
        // A failing staging mount, then a good one; a failing publish, then a good one.
        fresh_disk(&exec);
        host.fake()
            .inject_error(FakeOp::Mount, &staging, Errno::EINVAL);
        let mut errors = vec![
            d.node_stage_volume(&ctx(node()), stage_req(&id, &context, &staging, c.clone()))
                .await
                .unwrap_err(),
        ];
        host.fake().clear_errors();
        fresh_disk(&exec);
        d.node_stage_volume(&ctx(node()), stage_req(&id, &context, &staging, c.clone()))
            .await
            .unwrap();
        host.fake()
            .inject_error(FakeOp::Mount, &target, Errno::EINVAL);
        errors.push(
            d.node_publish_volume(&ctx(node()), publish_req(&id, &staging, &target, c.clone()))
                .await
                .unwrap_err(),
        );
        host.fake().clear_errors();
        d.node_publish_volume(&ctx(node()), publish_req(&id, &staging, &target, c))
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
        assert!(text.contains("published"), "events are captured: {text}");
        assert!(!text.contains("SECRET"), "{text}");
        for e in errors {
            assert!(!format!("{e} {e:?}").contains("SECRET"), "{e}");
        }
    }
}
