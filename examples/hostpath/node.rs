//! The Node service, on csi-node's record of what this node staged and
//! published: it applies the spec's repeat and ownership rules before any
//! syscall, saves the intent before mounting, and checks in mountinfo that
//! what is mounted is this volume (see `csi_node::NodeVolumes`).
//!
//! Mount volumes: NodeStage bind-mounts the volume directory at the staging
//! path; NodePublish bind-mounts the staging path at the target (read-only
//! wins over any `rw` flag). Block volumes: NodeStage attaches the image as
//! a loop device; NodePublish bind-mounts the device node on a file at the
//! target. This file adds what is the driver's own: which volumes exist,
//! their access type, and inline ephemeral volumes.

use std::path::PathBuf;

use csi_proto::v1::*;
use csi_server::request::EPHEMERAL_CONTEXT_KEY;
use csi_server::{CallContext, CsiError, CsiResult, Node};

use csi_controller::{Access, VolumeRecord, internal};
use csi_server::blocking;

use crate::common::{node_stats, on_node};
use crate::config::TOPOLOGY_KEY;
use crate::driver::HostPath;

/// Whether the capability fits a volume of the given access type.
fn check_access(volume: &VolumeRecord, cap: Option<&VolumeCapability>) -> CsiResult<()> {
    let Some(cap) = cap else {
        return Ok(()); // csi-node names the missing field
    };
    match (volume.access, cap.is_block()) {
        (Access::Block, true) | (Access::Mount, false) => Ok(()),
        (Access::Block, false) => Err(CsiError::FailedPrecondition(format!(
            "volume {} is a block volume and cannot be used with mount access",
            volume.id
        ))),
        (Access::Mount, true) => Err(CsiError::FailedPrecondition(format!(
            "volume {} is a filesystem volume and cannot be used with block access",
            volume.id
        ))),
    }
}

impl HostPath {
    /// The record of a volume this node may use, or NOT_FOUND.
    pub(crate) fn known_volume(&self, id: &str) -> CsiResult<VolumeRecord> {
        self.engine.known_volume(id)
    }
}

#[csi_server::async_trait]
impl Node for HostPath {
    async fn node_stage_volume(
        &self,
        _ctx: &CallContext,
        req: NodeStageVolumeRequest,
    ) -> CsiResult<NodeStageVolumeResponse> {
        let volume = self.known_volume(&req.volume_id)?;
        check_access(&volume, req.volume_capability.as_ref())?;
        on_node(&self.node, move |node| node.stage(&req)).await?;
        Ok(NodeStageVolumeResponse {})
    }

    async fn node_unstage_volume(
        &self,
        _ctx: &CallContext,
        req: NodeUnstageVolumeRequest,
    ) -> CsiResult<NodeUnstageVolumeResponse> {
        on_node(&self.node, move |node| node.unstage(&req)).await?;
        Ok(NodeUnstageVolumeResponse {})
    }

    async fn node_publish_volume(
        &self,
        _ctx: &CallContext,
        req: NodePublishVolumeRequest,
    ) -> CsiResult<NodePublishVolumeResponse> {
        let ephemeral = req
            .volume_context
            .get(EPHEMERAL_CONTEXT_KEY)
            .is_some_and(|v| v == "true");
        let (volume, created) = if ephemeral {
            self.engine.create_ephemeral(&req.volume_id)?
        } else {
            (self.known_volume(&req.volume_id)?, false)
        };
        check_access(&volume, req.volume_capability.as_ref())?;
        let result = on_node(&self.node, move |node| node.publish(&req)).await;
        if let (Err(e), true) = (&result, created) {
            // Nothing references a volume created for a publish that failed.
            tracing::debug!(volume = %volume.id, code = ?e.code(), "removing the ephemeral volume of a failed publish");
            self.engine.remove_ephemeral(&volume)?;
        }
        result?;
        Ok(NodePublishVolumeResponse {})
    }

    async fn node_unpublish_volume(
        &self,
        _ctx: &CallContext,
        req: NodeUnpublishVolumeRequest,
    ) -> CsiResult<NodeUnpublishVolumeResponse> {
        let ephemeral = self.engine.ephemeral_named(&req.volume_id);
        let retired = ephemeral.is_none() && self.engine.was_retired(&req.volume_id);
        let target = PathBuf::from(&req.target_path);
        let id = req.volume_id.clone();
        let outcome = on_node(&self.node, move |node| node.unpublish(&req)).await;
        match outcome {
            // A repeat for an ephemeral volume already removed.
            Err(CsiError::NotFound(_)) if retired => {}
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        if let Some(v) = ephemeral {
            let still = self.node.record(&id).is_some();
            if !still {
                self.engine.remove_ephemeral(&v)?;
            } else {
                tracing::debug!(volume = %v.id, target = %target.display(), "ephemeral volume still published elsewhere");
            }
        }
        Ok(NodeUnpublishVolumeResponse {})
    }

    async fn node_get_volume_stats(
        &self,
        _ctx: &CallContext,
        req: NodeGetVolumeStatsRequest,
    ) -> CsiResult<NodeGetVolumeStatsResponse> {
        let volume = self.known_volume(&req.volume_id)?;
        let image = self.backend.volume_path(&volume.id, Access::Block);
        node_stats(&self.node, req.volume_id, req.volume_path, move |_| {
            image.metadata().ok().map(|m| m.len())
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
        let device = record.stage.and_then(|s| s.device);
        if let Some(dev) = device.filter(|_| volume.access == Access::Block) {
            let loops = self.loops.clone();
            blocking(move || {
                loops
                    .set_capacity(&dev.path)
                    .map(drop)
                    .map_err(|e| internal("refreshing the size of", &dev.path, e))
            })
            .await?;
        }
        Ok(NodeExpandVolumeResponse {
            capacity_bytes: volume.capacity_bytes,
        })
    }

    async fn node_get_info(
        &self,
        _ctx: &CallContext,
        _req: NodeGetInfoRequest,
    ) -> CsiResult<NodeGetInfoResponse> {
        Ok(NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            max_volumes_per_node: self.config.max_volumes_per_node(),
            accessible_topology: self.config.enable_topology.then(|| Topology {
                segments: [(TOPOLOGY_KEY.to_owned(), self.node_id.clone())].into(),
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    //! The node service on a fake host (csi-node's FakeHost: FakeMounter
    //! and FakeLoopDevices), without root: one test per case of issue 13.
    use std::path::Path;

    use clap::Parser;
    use csi_node::testing::FakeHost;
    use csi_proto::v1::volume_capability::access_mode::Mode;
    use csi_server::Method;
    use csi_server::PluginInfo;
    use mount_utils::{Errno, FakeOp, LoopDevices, LoopOptions, Mounter};

    use super::*;
    use crate::common::requests::*;
    use crate::config::Config;

    fn driver(dir: &Path, host: &FakeHost) -> HostPath {
        let statedir = dir.join("state").to_string_lossy().into_owned();
        let config = Config::parse_from(["hostpath", "--statedir", &statedir, "--nodeid", "n1"]);
        HostPath::open_with(config, host.mounter(), host.loops()).unwrap()
    }

    fn ctx() -> CallContext {
        let info = PluginInfo::new("hostpath.csi.csi-kit.dev", "test").unwrap();
        let config = Config::parse_from(["hostpath"]);
        CallContext::for_test(
            Method::NodePublishVolume,
            info,
            crate::capabilities(&config, false),
        )
    }

    /// A volume the controller would have created.
    fn volume(d: &HostPath, id: &str, access: Access) -> String {
        d.backend.create_volume(id, access, 1 << 20).unwrap();
        let record = VolumeRecord {
            id: id.into(),
            name: id.into(),
            capacity_bytes: 1 << 20,
            access,
            source: None,
            parameters: Default::default(),
            mutable_parameters: Default::default(),
            topology: Default::default(),
            request: Vec::new(),
            ephemeral: false,
        };
        d.engine.tables().volumes.put(id, record).unwrap();
        id.into()
    }

    fn code(e: CsiError) -> tonic::Code {
        e.code()
    }

    #[tokio::test]
    async fn unstage_of_a_published_block_volume_is_refused_and_keeps_the_device() {
        let (dir, host) = (tempfile::tempdir().unwrap(), FakeHost::new());
        let d = driver(dir.path(), &host);
        let id = volume(&d, "vol-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", Access::Block);
        let (staging, target) = (dir.path().join("staging"), dir.path().join("target"));
        let c = cap(true, Mode::SingleNodeWriter, &[]);
        d.node_stage_volume(&ctx(), stage_req(&id, &staging, c.clone()))
            .await
            .unwrap();
        d.node_publish_volume(&ctx(), publish_req(&id, &staging, &target, c))
            .await
            .unwrap();
        let e = d
            .node_unstage_volume(&ctx(), unstage_req(&id, &staging))
            .await
            .unwrap_err();
        assert_eq!(code(e), tonic::Code::FailedPrecondition);
        assert_eq!(host.attached(), 1, "the device stays attached");
        d.node_unpublish_volume(&ctx(), unpublish_req(&id, &target))
            .await
            .unwrap();
        d.node_unstage_volume(&ctx(), unstage_req(&id, &staging))
            .await
            .unwrap();
        assert_eq!(host.attached(), 0);
    }

    #[tokio::test]
    async fn an_rw_flag_cannot_make_a_read_only_publish_writable() {
        let (dir, host) = (tempfile::tempdir().unwrap(), FakeHost::new());
        let d = driver(dir.path(), &host);
        let id = volume(&d, "vol-bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", Access::Mount);
        let staging = dir.path().join("staging");
        let reader = cap(false, Mode::MultiNodeReaderOnly, &["rw"]);
        d.node_stage_volume(&ctx(), stage_req(&id, &staging, reader.clone()))
            .await
            .unwrap();
        let t1 = dir.path().join("t1");
        d.node_publish_volume(&ctx(), publish_req(&id, &staging, &t1, reader))
            .await
            .unwrap();
        assert!(
            host.mounts_at(&t1)[0].is_read_only(),
            "reader-only mode wins"
        );
        assert!(host.mounts_at(&staging)[0].is_read_only());

        let id2 = volume(&d, "vol-cccccccccccccccccccccccccccccccc", Access::Mount);
        let (s2, t2) = (dir.path().join("s2"), dir.path().join("t2"));
        let writer = cap(false, Mode::SingleNodeWriter, &["rw"]);
        d.node_stage_volume(&ctx(), stage_req(&id2, &s2, writer.clone()))
            .await
            .unwrap();
        let mut req = publish_req(&id2, &s2, &t2, writer);
        req.readonly = true;
        d.node_publish_volume(&ctx(), req).await.unwrap();
        assert!(host.mounts_at(&t2)[0].is_read_only(), "readonly=true wins");
    }

    #[tokio::test]
    async fn mount_flag_values_appear_in_no_error() {
        let (dir, host) = (tempfile::tempdir().unwrap(), FakeHost::new());
        let d = driver(dir.path(), &host);
        let id = volume(&d, "vol-dddddddddddddddddddddddddddddddd", Access::Mount);
        let staging = dir.path().join("staging");
        let c = cap(false, Mode::SingleNodeWriter, &["password=SECRET"]);
        d.node_stage_volume(&ctx(), stage_req(&id, &staging, c.clone()))
            .await
            .unwrap();
        let remount = cap(
            false,
            Mode::SingleNodeWriter,
            &["remount", "password=SECRET"],
        );
        let e = d
            .node_publish_volume(
                &ctx(),
                publish_req(&id, &staging, &dir.path().join("t0"), remount),
            )
            .await
            .unwrap_err();
        assert!(!format!("{e} {e:?}").contains("SECRET"), "{e}");
        let target = dir.path().join("t1");
        host.fake()
            .inject_error(FakeOp::Mount, &target, Errno::EINVAL);
        let e = d
            .node_publish_volume(&ctx(), publish_req(&id, &staging, &target, c))
            .await
            .unwrap_err();
        assert!(!format!("{e} {e:?}").contains("SECRET"), "{e}");
    }

    #[tokio::test]
    async fn paths_the_driver_did_not_record_are_not_touched() {
        let (dir, host) = (tempfile::tempdir().unwrap(), FakeHost::new());
        let d = driver(dir.path(), &host);
        let a = volume(&d, "vol-eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee", Access::Mount);
        let b = volume(&d, "vol-ffffffffffffffffffffffffffffffff", Access::Mount);
        let c = cap(false, Mode::SingleNodeWriter, &[]);
        let (sa, sb, ta) = (
            dir.path().join("sa"),
            dir.path().join("sb"),
            dir.path().join("ta"),
        );
        d.node_stage_volume(&ctx(), stage_req(&a, &sa, c.clone()))
            .await
            .unwrap();
        d.node_stage_volume(&ctx(), stage_req(&b, &sb, c.clone()))
            .await
            .unwrap();
        d.node_publish_volume(&ctx(), publish_req(&a, &sa, &ta, c.clone()))
            .await
            .unwrap();

        // A foreign tmpfs where nothing of ours is published.
        let foreign = dir.path().join("foreign");
        std::fs::create_dir(&foreign).unwrap();
        host.add_mount("tmpfs", &foreign, "tmpfs");
        let _ = d
            .node_unpublish_volume(&ctx(), unpublish_req(&a, &foreign))
            .await;
        assert_eq!(host.mounts_at(&foreign).len(), 1, "the tmpfs stays");
        assert!(foreign.is_dir());

        // Another volume's target, and another volume's staging path.
        let e = d
            .node_unpublish_volume(&ctx(), unpublish_req(&b, &ta))
            .await
            .unwrap_err();
        assert_eq!(code(e), tonic::Code::NotFound);
        assert!(
            d.node_unstage_volume(&ctx(), unstage_req(&a, &sb))
                .await
                .is_err()
        );
        assert_eq!(host.mounts_at(&ta).len(), 1);
        assert_eq!(host.mounts_at(&sb).len(), 1);

        // B published where A is mounted.
        let e = d
            .node_publish_volume(&ctx(), publish_req(&b, &sb, &ta, c.clone()))
            .await
            .unwrap_err();
        assert_eq!(code(e), tonic::Code::AlreadyExists);

        // A target that is a symlink is refused, its destination untouched.
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
        assert!(
            d.node_publish_volume(&ctx(), publish_req(&b, &sb, &link, c))
                .await
                .is_err()
        );
        assert!(host.mounts_at(&elsewhere).is_empty());
        assert!(host.mounts_at(&link).is_empty());
    }

    #[tokio::test]
    async fn block_publish_onto_a_non_empty_file_is_refused() {
        let (dir, host) = (tempfile::tempdir().unwrap(), FakeHost::new());
        let d = driver(dir.path(), &host);
        let id = volume(&d, "vol-11111111111111111111111111111111", Access::Block);
        let (staging, target) = (dir.path().join("staging"), dir.path().join("user-file"));
        std::fs::write(&target, b"the user's data").unwrap();
        let c = cap(true, Mode::SingleNodeWriter, &[]);
        d.node_stage_volume(&ctx(), stage_req(&id, &staging, c.clone()))
            .await
            .unwrap();
        assert!(
            d.node_publish_volume(&ctx(), publish_req(&id, &staging, &target, c))
                .await
                .is_err()
        );
        assert!(host.mounts_at(&target).is_empty());
        assert_eq!(std::fs::read(&target).unwrap(), b"the user's data");
    }

    #[tokio::test]
    async fn unstage_without_a_record_detaches_the_device_by_backing_file() {
        let (dir, host) = (tempfile::tempdir().unwrap(), FakeHost::new());
        let d = driver(dir.path(), &host);
        let id = volume(&d, "vol-22222222222222222222222222222222", Access::Block);
        // A crash between the attach and the save of the record.
        let image = d.backend.volume_path(&id, Access::Block);
        host.loops()
            .attach(&image, &LoopOptions::default())
            .unwrap()
            .keep();
        assert_eq!(host.attached(), 1);
        d.node_unstage_volume(&ctx(), unstage_req(&id, &dir.path().join("staging")))
            .await
            .unwrap();
        assert_eq!(host.attached(), 0);
    }

    #[tokio::test]
    async fn a_failed_inline_ephemeral_publish_leaves_no_record_or_data() {
        let (dir, host) = (tempfile::tempdir().unwrap(), FakeHost::new());
        let d = driver(dir.path(), &host);
        // The target is a user's file: the publish is refused.
        let target = dir.path().join("pod");
        std::fs::write(&target, b"not a directory").unwrap();
        let mut req = publish_req(
            "inline-1",
            Path::new(""),
            &target,
            cap(false, Mode::SingleNodeWriter, &[]),
        );
        req.staging_target_path.clear();
        req.volume_context
            .insert(EPHEMERAL_CONTEXT_KEY.into(), "true".into());
        assert!(d.node_publish_volume(&ctx(), req).await.is_err());
        assert_eq!(d.engine.tables().volumes.len(), 0, "no volume record");
        assert!(d.node.records().is_empty(), "no node record");
        assert!(d.backend.data().volumes.is_empty(), "no volume data left");
    }

    #[tokio::test]
    async fn a_volume_that_cannot_be_restored_is_abnormal_and_the_rest_is_served() {
        let (dir, host) = (tempfile::tempdir().unwrap(), FakeHost::new());
        let c = cap(true, Mode::SingleNodeWriter, &[]);
        let (bad, good) = (
            "vol-33333333333333333333333333333333",
            "vol-44444444444444444444444444444444",
        );
        let (s_bad, s_good) = (dir.path().join("s-bad"), dir.path().join("s-good"));
        {
            let d = driver(dir.path(), &host);
            volume(&d, bad, Access::Block);
            volume(&d, good, Access::Mount);
            d.node_stage_volume(&ctx(), stage_req(bad, &s_bad, c.clone()))
                .await
                .unwrap();
            let mount = cap(false, Mode::SingleNodeWriter, &[]);
            d.node_stage_volume(&ctx(), stage_req(good, &s_good, mount))
                .await
                .unwrap();
            // A reboot: devices and mounts are gone, and so is one image.
            for dev in host
                .loops()
                .find_by_backing_file(&d.backend.volume_path(bad, Access::Block))
                .unwrap()
            {
                host.loops().detach(&dev).unwrap();
            }
            std::fs::remove_file(d.backend.volume_path(bad, Access::Block)).unwrap();
            host.unmount(&s_good, false).unwrap();
        }
        let d = driver(dir.path(), &host);
        d.reconcile_on_start().unwrap();
        let stats = |id: &str, p: &Path| NodeGetVolumeStatsRequest {
            volume_id: id.into(),
            volume_path: p.to_string_lossy().into(),
            ..Default::default()
        };
        let r = d
            .node_get_volume_stats(&ctx(), stats(bad, &s_bad))
            .await
            .unwrap();
        assert!(r.volume_condition.unwrap().abnormal);
        let r = d
            .node_get_volume_stats(&ctx(), stats(good, &s_good))
            .await
            .unwrap();
        assert!(!r.volume_condition.unwrap().abnormal, "restored");
        assert_eq!(host.mounts_at(&s_good).len(), 1);
    }

    #[tokio::test]
    async fn mount_flag_values_reach_no_log_line_at_trace_level() {
        let logs = capture_all_logs();
        let (dir, host) = (tempfile::tempdir().unwrap(), FakeHost::new());
        let d = driver(dir.path(), &host);
        let id = volume(&d, "vol-55555555555555555555555555555555", Access::Mount);
        let (staging, target) = (dir.path().join("staging"), dir.path().join("target"));
        let c = cap(false, Mode::SingleNodeWriter, &["password=SECRET"]);
        // A failing staging mount, then a good one; a failing publish, then a good one.
        host.fake()
            .inject_error(FakeOp::Mount, &staging, Errno::EINVAL);
        host.fake()
            .inject_error(FakeOp::BindMount, &staging, Errno::EINVAL);
        let mut errors = vec![
            d.node_stage_volume(&ctx(), stage_req(&id, &staging, c.clone()))
                .await
                .unwrap_err(),
        ];
        host.fake().clear_errors();
        d.node_stage_volume(&ctx(), stage_req(&id, &staging, c.clone()))
            .await
            .unwrap();
        host.fake()
            .inject_error(FakeOp::Mount, &target, Errno::EINVAL);
        errors.push(
            d.node_publish_volume(&ctx(), publish_req(&id, &staging, &target, c.clone()))
                .await
                .unwrap_err(),
        );
        host.fake().clear_errors();
        d.node_publish_volume(&ctx(), publish_req(&id, &staging, &target, c))
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
