use std::collections::HashMap;
use std::path::Path;

use csi_proto::v1::controller_service_capability::rpc::Type as CtrlCap;
use csi_proto::v1::node_service_capability::rpc::Type as NodeCap;
use csi_proto::v1::plugin_capability::service::Type as PluginCap;
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::*;
use tonic::Code;

use super::controller::{self, missing_id, publish_req};
use crate::config::SecretKind;
use crate::suite::{Call, Ctx, Outcome, Resource, fail, skip};

pub(super) async fn capabilities(ctx: &mut Ctx) -> Outcome {
    let call = ctx.rpc(NodeGetCapabilitiesRequest {}).await;
    call.ok().map(drop)
}

pub(super) async fn info(ctx: &mut Ctx) -> Outcome {
    ctx.need_node_service()?;
    let call = ctx.rpc(NodeGetInfoRequest {}).await;
    let r = call.value()?;
    call.ensure(!r.node_id.is_empty(), "node_id is required")?;
    call.ensure(
        r.node_id.len() <= 256,
        format!("node_id is {} bytes, the limit is 256", r.node_id.len()),
    )?;
    call.ensure(
        r.max_volumes_per_node >= 0,
        format!(
            "max_volumes_per_node is {}, negative values are forbidden",
            r.max_volumes_per_node
        ),
    )?;
    let constrained = ctx.has_plugin(PluginCap::VolumeAccessibilityConstraints);
    call.ensure(
        !constrained || r.accessible_topology.is_some(),
        "VOLUME_ACCESSIBILITY_CONSTRAINTS is advertised, so accessible_topology must say where the node is (csi-sanity requires it; Kubernetes' external-provisioner reads the node's topology keys from it)",
    )?;
    call.ensure(
        constrained || r.accessible_topology.is_none(),
        "accessible_topology is reported, so the plugin must advertise VOLUME_ACCESSIBILITY_CONSTRAINTS",
    )
}

/// A volume made ready for NodePublish: created, controller-published and
/// staged as far as the driver advertises.
pub(super) struct NodeVol {
    pub id: String,
    pub cap: VolumeCapability,
    pub volume_context: HashMap<String, String>,
    pub publish_context: HashMap<String, String>,
    pub staging: String,
}

async fn controller_publish(
    ctx: &mut Ctx,
    id: &str,
    cap: &VolumeCapability,
) -> Outcome<HashMap<String, String>> {
    if !ctx.has_ctrl(CtrlCap::PublishUnpublishVolume) {
        return Ok(HashMap::new());
    }
    let node = ctx.node_id()?;
    let mut req = publish_req(ctx, id, &node);
    req.volume_capability = Some(cap.clone());
    Ok(controller::send_publish(ctx, req)
        .await
        .ok()?
        .publish_context)
}

fn stage_req(ctx: &Ctx, v: &NodeVol, path: &str) -> NodeStageVolumeRequest {
    NodeStageVolumeRequest {
        volume_id: v.id.clone(),
        publish_context: v.publish_context.clone(),
        staging_target_path: path.to_string(),
        volume_capability: Some(v.cap.clone()),
        secrets: ctx.secrets(SecretKind::NodeStageVolume),
        volume_context: v.volume_context.clone(),
    }
}

async fn stage(ctx: &mut Ctx, v: &NodeVol, path: &str) -> Call<NodeStageVolumeResponse> {
    let req = stage_req(ctx, v, path);
    ctx.rpc(req).await
}

async fn unstage(ctx: &Ctx, id: &str, path: &str) -> Call<NodeUnstageVolumeResponse> {
    let req = NodeUnstageVolumeRequest {
        volume_id: id.to_string(),
        staging_target_path: path.to_string(),
    };
    ctx.rpc(req).await
}

/// Creates a volume with `mode` and prepares it; `None` when the driver
/// rejects the mode with INVALID_ARGUMENT (it does not support it).
async fn prepare_mode(ctx: &mut Ctx, mode: Mode, stage_it: bool) -> Outcome<Option<NodeVol>> {
    ctx.need_node_service()?;
    ctx.need_ctrl(CtrlCap::CreateDeleteVolume)?;
    let cap = ctx.capability_with(mode);
    let mut req = ctx.create_request("node");
    req.volume_capabilities = vec![cap.clone()];
    let probe = ctx.send_create(req.clone()).await;
    if probe.result.as_ref().err().map(|s| s.code()) == Some(Code::InvalidArgument) {
        return Ok(None);
    }
    let vol = ctx.create_volume_with(req).await?;
    let publish_context = controller_publish(ctx, &vol.volume_id, &cap).await?;
    let mut nv = NodeVol {
        id: vol.volume_id,
        cap,
        volume_context: vol.volume_context,
        publish_context,
        staging: String::new(),
    };
    if stage_it && ctx.has_node(NodeCap::StageUnstageVolume) {
        let path = ctx.staging_path()?;
        ctx.register(Resource::Staged {
            volume: nv.id.clone(),
            path: path.clone(),
        });
        stage(ctx, &nv, &path).await.ok()?;
        nv.staging = path;
    }
    Ok(Some(nv))
}

async fn prepare(ctx: &mut Ctx) -> Outcome<NodeVol> {
    let mode = ctx.config.access_mode;
    match prepare_mode(ctx, mode, true).await? {
        Some(v) => Ok(v),
        None => fail(format!(
            "CreateVolume: the configured access mode {mode:?} was rejected"
        )),
    }
}

fn pub_req(ctx: &Ctx, v: &NodeVol, target: &str, readonly: bool) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: v.id.clone(),
        publish_context: v.publish_context.clone(),
        staging_target_path: v.staging.clone(),
        target_path: target.to_string(),
        volume_capability: Some(v.cap.clone()),
        readonly,
        secrets: ctx.secrets(SecretKind::NodePublishVolume),
        volume_context: v.volume_context.clone(),
    }
}

async fn send_publish(
    ctx: &mut Ctx,
    req: NodePublishVolumeRequest,
) -> Call<NodePublishVolumeResponse> {
    let (volume, target) = (req.volume_id.clone(), req.target_path.clone());
    let call = ctx.rpc(req).await;
    if call.result.is_ok() {
        ctx.register(Resource::Published { volume, target });
    }
    call
}

async fn publish(
    ctx: &mut Ctx,
    v: &NodeVol,
    target: &str,
    readonly: bool,
) -> Call<NodePublishVolumeResponse> {
    let req = pub_req(ctx, v, target, readonly);
    send_publish(ctx, req).await
}

async fn unpublish(ctx: &Ctx, id: &str, target: &str) -> Call<NodeUnpublishVolumeResponse> {
    let req = NodeUnpublishVolumeRequest {
        volume_id: id.to_string(),
        target_path: target.to_string(),
    };
    ctx.rpc(req).await
}

/// The plugin, not the CO, creates the target: a directory for mount, a
/// file or device node for block.
fn check_target_created(ctx: &Ctx, target: &str) -> Outcome {
    if !ctx.config.check_target_paths {
        return Ok(());
    }
    let p = Path::new(target);
    match std::fs::symlink_metadata(p) {
        Err(_) => fail(format!(
            "NodePublishVolume: the plugin must create target_path {target}, it does not exist"
        )),
        Ok(m) if ctx.is_block() && m.is_dir() => fail(format!(
            "NodePublishVolume: for a block volume target_path {target} must be a file or device node, not a directory"
        )),
        Ok(m) if !ctx.is_block() && !m.is_dir() => fail(format!(
            "NodePublishVolume: for a mount volume target_path {target} must be a directory"
        )),
        Ok(_) => Ok(()),
    }
}

fn check_target_removed(ctx: &Ctx, target: &str) -> Outcome {
    if ctx.config.check_target_paths && std::fs::symlink_metadata(target).is_ok() {
        return fail(format!(
            "NodeUnpublishVolume: the plugin must delete the target_path {target} it created, it still exists"
        ));
    }
    Ok(())
}

pub(super) async fn stage_missing_fields(ctx: &mut Ctx) -> Outcome {
    ctx.need_node(NodeCap::StageUnstageVolume)?;
    let mode = ctx.config.access_mode;
    let Some(v) = prepare_mode(ctx, mode, false).await? else {
        return fail("CreateVolume: the configured access mode was rejected");
    };
    let path = ctx.staging_path()?;
    let cases = [
        (
            "volume_id",
            NodeStageVolumeRequest {
                volume_id: String::new(),
                ..stage_req(ctx, &v, &path)
            },
        ),
        (
            "staging_target_path",
            NodeStageVolumeRequest {
                staging_target_path: String::new(),
                ..stage_req(ctx, &v, &path)
            },
        ),
        (
            "volume_capability",
            NodeStageVolumeRequest {
                volume_capability: None,
                ..stage_req(ctx, &v, &path)
            },
        ),
    ];
    for (field, req) in cases {
        let call = ctx.rpc(req).await;
        if call.result.is_ok() {
            ctx.register(Resource::Staged {
                volume: v.id.clone(),
                path: path.clone(),
            });
        }
        call.code(
            Code::InvalidArgument,
            &format!("{field} is a required field"),
        )?;
    }
    unstage(ctx, "", &path)
        .await
        .code(Code::InvalidArgument, "volume_id is a required field")?;
    unstage(ctx, &v.id, "")
        .await
        .code(
            Code::InvalidArgument,
            "staging_target_path is a required field",
        )
        .map(drop)
}

pub(super) async fn stage_idempotent(ctx: &mut Ctx) -> Outcome {
    ctx.need_node(NodeCap::StageUnstageVolume)?;
    let v = prepare(ctx).await?;
    stage(ctx, &v, &v.staging.clone()).await.expect(
        &[Code::Ok],
        "staging again with identical arguments must be OK",
    )?;
    for _ in 0..2 {
        unstage(ctx, &v.id, &v.staging)
            .await
            .expect(&[Code::Ok], "unstaging is idempotent")?;
    }
    Ok(())
}

pub(super) async fn publish_missing_fields(ctx: &mut Ctx) -> Outcome {
    let v = prepare(ctx).await?;
    let target = ctx.target_path()?;
    let mut cases = vec![
        (
            "volume_id",
            NodePublishVolumeRequest {
                volume_id: String::new(),
                ..pub_req(ctx, &v, &target, false)
            },
        ),
        (
            "target_path",
            NodePublishVolumeRequest {
                target_path: String::new(),
                ..pub_req(ctx, &v, &target, false)
            },
        ),
        (
            "volume_capability",
            NodePublishVolumeRequest {
                volume_capability: None,
                ..pub_req(ctx, &v, &target, false)
            },
        ),
    ];
    let mut precondition = None;
    if ctx.has_node(NodeCap::StageUnstageVolume) {
        precondition = Some(NodePublishVolumeRequest {
            staging_target_path: String::new(),
            ..pub_req(ctx, &v, &target, false)
        });
    }
    for (field, req) in cases.drain(..) {
        send_publish(ctx, req).await.code(
            Code::InvalidArgument,
            &format!("{field} is a required field"),
        )?;
    }
    if let Some(req) = precondition {
        send_publish(ctx, req).await.code(
            Code::FailedPrecondition,
            "STAGE_UNSTAGE_VOLUME is advertised but no staging_target_path was given",
        )?;
    }
    unpublish(ctx, "", &target)
        .await
        .code(Code::InvalidArgument, "volume_id is a required field")?;
    unpublish(ctx, &v.id, "")
        .await
        .code(Code::InvalidArgument, "target_path is a required field")
        .map(drop)
}

/// The requests csi-sanity sends: a required field missing and no
/// staging_target_path either. INVALID_ARGUMENT for the missing field comes
/// before the STAGE_UNSTAGE rule (FAILED_PRECONDITION) could apply.
pub(super) async fn publish_missing_fields_without_staging(ctx: &mut Ctx) -> Outcome {
    ctx.need_node_service()?;
    let id = missing_id(ctx, "vol");
    let target = ctx.target_path()?;
    let secrets = ctx.secrets(SecretKind::NodePublishVolume);
    let cases = [
        (
            "volume_id",
            NodePublishVolumeRequest {
                secrets: secrets.clone(),
                ..Default::default()
            },
        ),
        (
            "target_path",
            NodePublishVolumeRequest {
                volume_id: id.clone(),
                secrets: secrets.clone(),
                ..Default::default()
            },
        ),
        (
            "volume_capability",
            NodePublishVolumeRequest {
                volume_id: id,
                target_path: target,
                secrets,
                ..Default::default()
            },
        ),
    ];
    for (field, req) in cases {
        send_publish(ctx, req).await.code(
            Code::InvalidArgument,
            &format!(
                "{field} is missing (and staging_target_path too): a missing required field is INVALID_ARGUMENT before any capability rule"
            ),
        )?;
    }
    Ok(())
}

pub(super) async fn lifecycle(ctx: &mut Ctx) -> Outcome {
    let v = prepare(ctx).await?;
    let target = ctx.target_path()?;
    for _ in 0..2 {
        publish(ctx, &v, &target, false).await.expect(
            &[Code::Ok],
            "publishing (again) with identical arguments must be OK",
        )?;
        check_target_created(ctx, &target)?;
    }
    for _ in 0..2 {
        unpublish(ctx, &v.id, &target)
            .await
            .expect(&[Code::Ok], "unpublishing is idempotent")?;
        check_target_removed(ctx, &target)?;
    }
    if !v.staging.is_empty() {
        for _ in 0..2 {
            unstage(ctx, &v.id, &v.staging)
                .await
                .expect(&[Code::Ok], "unstaging is idempotent")?;
        }
    }
    if ctx.has_ctrl(CtrlCap::PublishUnpublishVolume) {
        let req = ControllerUnpublishVolumeRequest {
            volume_id: v.id.clone(),
            node_id: ctx.node_id()?,
            secrets: ctx.secrets(SecretKind::ControllerUnpublishVolume),
        };
        ctx.rpc(req).await.ok()?;
    }
    let req = DeleteVolumeRequest {
        volume_id: v.id.clone(),
        secrets: ctx.secrets(SecretKind::DeleteVolume),
    };
    ctx.rpc(req).await.ok().map(drop)
}

pub(super) async fn repeat_table(ctx: &mut Ctx) -> Outcome {
    ctx.need_node_service()?;
    let mut modes = vec![Mode::SingleNodeWriter, Mode::MultiNodeMultiWriter];
    if ctx.has_ctrl(CtrlCap::SingleNodeMultiWriter) && ctx.has_node(NodeCap::SingleNodeMultiWriter)
    {
        modes.extend([Mode::SingleNodeSingleWriter, Mode::SingleNodeMultiWriter]);
    }
    let mut tested = 0;
    let mut unsupported = Vec::new();
    for mode in modes {
        let Some(v) = prepare_mode(ctx, mode, true).await? else {
            unsupported.push(format!("{mode:?}"));
            continue;
        };
        tested += 1;
        let shared = mode.is_multi_node() || mode == Mode::SingleNodeMultiWriter;
        let (other, why) = if shared {
            (
                Code::Ok,
                format!("{mode:?} may be published at several targets"),
            )
        } else {
            (
                Code::FailedPrecondition,
                format!("{mode:?} is already published at another target"),
            )
        };
        let t1 = ctx.target_path()?;
        publish(ctx, &v, &t1, false).await.ok()?;
        publish(ctx, &v, &t1, false).await.expect(
            &[Code::Ok],
            &format!("{mode:?}: same target, same arguments"),
        )?;
        publish(ctx, &v, &t1, true).await.code(
            Code::AlreadyExists,
            &format!("{mode:?}: same target, different arguments (readonly flipped)"),
        )?;
        let t2 = ctx.target_path()?;
        publish(ctx, &v, &t2, false).await.expect(
            &[other],
            &format!("{why}: different target, same arguments"),
        )?;
        let t3 = ctx.target_path()?;
        publish(ctx, &v, &t3, true).await.expect(
            &[other],
            &format!("{why}: different target, different arguments"),
        )?;
    }
    if tested == 0 {
        return skip(format!(
            "the driver rejects every access mode tried: {}",
            unsupported.join(", ")
        ));
    }
    Ok(())
}

pub(super) async fn publish_concurrent(ctx: &mut Ctx) -> Outcome {
    let v = prepare(ctx).await?;
    let target = ctx.target_path()?;
    ctx.register(Resource::Published {
        volume: v.id.clone(),
        target: target.clone(),
    });
    let n = ctx.config.concurrency.max(2);
    let req = pub_req(ctx, &v, &target, false);
    let calls = futures::future::join_all((0..n).map(|_| ctx.rpc(req.clone()))).await;
    let mut any_ok = false;
    for c in calls {
        any_ok |= c
            .code_in(
                &[Code::Ok, Code::Aborted],
                "concurrent identical calls may only succeed or be ABORTED",
            )?
            .is_ok();
    }
    if !any_ok {
        publish(ctx, &v, &target, false).await.ok()?;
    }
    check_target_created(ctx, &target)?;
    unpublish(ctx, &v.id, &target).await.ok()?;
    check_target_removed(ctx, &target)
}

/// What csi-sanity sends as a volume_path that names no volume.
const RELATIVE_PATH: &str = "some/path";

fn stats_req(v_id: &str, path: &str, staging: &str) -> NodeGetVolumeStatsRequest {
    NodeGetVolumeStatsRequest {
        volume_id: v_id.to_string(),
        volume_path: path.to_string(),
        staging_target_path: staging.to_string(),
    }
}

pub(super) async fn stats_published(ctx: &mut Ctx) -> Outcome {
    ctx.need_node(NodeCap::GetVolumeStats)?;
    let v = prepare(ctx).await?;
    let target = ctx.target_path()?;
    publish(ctx, &v, &target, false).await.ok()?;
    let req = stats_req(&v.id, &target, &v.staging);
    let call = ctx.rpc(req).await;
    let r = call.value()?;
    call.ensure(!r.usage.is_empty(), "a published volume must report usage")?;
    for u in &r.usage {
        call.ensure(
            matches!(
                volume_usage::Unit::try_from(u.unit),
                Ok(volume_usage::Unit::Bytes | volume_usage::Unit::Inodes)
            ),
            format!("usage unit {} is neither BYTES nor INODES", u.unit),
        )?;
        call.ensure(
            u.total >= 0 && u.used >= 0 && u.available >= 0,
            format!("negative usage {u:?}"),
        )?;
    }
    Ok(())
}

pub(super) async fn stats_missing_path(ctx: &mut Ctx) -> Outcome {
    ctx.need_node(NodeCap::GetVolumeStats)?;
    let vol = ctx.create_volume("stats").await?;
    let parent = ctx.config.target_dir.clone();
    let dir = ctx.fresh_dir(&parent, "not-published")?;
    let req = stats_req(&vol.volume_id, &dir.to_string_lossy(), "");
    ctx.rpc(req)
        .await
        .code(Code::NotFound, "the volume is not published at volume_path")
        .map(drop)
}

/// A relative volume_path names no volume: NOT_FOUND, for an unknown
/// volume and for one that is published (elsewhere).
pub(super) async fn stats_relative_path(ctx: &mut Ctx) -> Outcome {
    ctx.need_node(NodeCap::GetVolumeStats)?;
    let why = "a relative volume_path names no volume";
    let id = missing_id(ctx, "vol");
    let req = stats_req(&id, RELATIVE_PATH, "");
    ctx.rpc(req).await.code(Code::NotFound, why)?;
    let v = prepare(ctx).await?;
    let target = ctx.target_path()?;
    publish(ctx, &v, &target, false).await.ok()?;
    let req = stats_req(&v.id, RELATIVE_PATH, "");
    ctx.rpc(req).await.code(Code::NotFound, why).map(drop)
}

pub(super) async fn stats_empty_id(ctx: &mut Ctx) -> Outcome {
    ctx.need_node(NodeCap::GetVolumeStats)?;
    let parent = ctx.config.target_dir.clone();
    let dir = ctx.fresh_dir(&parent, "stats")?;
    let req = stats_req("", &dir.to_string_lossy(), "");
    ctx.rpc(req)
        .await
        .code(Code::InvalidArgument, "volume_id is a required field")
        .map(drop)
}

fn node_expand_req(
    ctx: &Ctx,
    id: &str,
    path: &str,
    staging: &str,
    bytes: i64,
) -> NodeExpandVolumeRequest {
    NodeExpandVolumeRequest {
        volume_id: id.to_string(),
        volume_path: path.to_string(),
        capacity_range: Some(CapacityRange::at_least(bytes)),
        staging_target_path: staging.to_string(),
        volume_capability: Some(ctx.capability()),
        secrets: ctx.secrets(SecretKind::NodeExpandVolume),
    }
}

pub(super) async fn expand(ctx: &mut Ctx) -> Outcome {
    ctx.need_node(NodeCap::ExpandVolume)?;
    let v = prepare(ctx).await?;
    let target = ctx.target_path()?;
    publish(ctx, &v, &target, false).await.ok()?;
    let bytes = ctx.config.volume_size * 2;
    if ctx.has_ctrl(CtrlCap::ExpandVolume) {
        let req = ControllerExpandVolumeRequest {
            volume_id: v.id.clone(),
            capacity_range: Some(CapacityRange::at_least(bytes)),
            secrets: ctx.secrets(SecretKind::ControllerExpandVolume),
            volume_capability: Some(v.cap.clone()),
        };
        let call = ctx.rpc(req).await;
        // An OFFLINE-only plugin may refuse a published volume.
        if call
            .code_in(
                &[Code::Ok, Code::FailedPrecondition],
                "expanding a published volume",
            )?
            .is_err()
        {
            return skip("the controller only expands volumes offline");
        }
    }
    let req = node_expand_req(ctx, &v.id, &target, &v.staging, bytes);
    ctx.rpc(req).await.ok().map(drop)
}

pub(super) async fn expand_relative_path(ctx: &mut Ctx) -> Outcome {
    ctx.need_node(NodeCap::ExpandVolume)?;
    let req = NodeExpandVolumeRequest {
        volume_id: missing_id(ctx, "vol"),
        volume_path: RELATIVE_PATH.to_string(),
        ..Default::default()
    };
    ctx.rpc(req)
        .await
        .code(Code::NotFound, "a relative volume_path names no volume")
        .map(drop)
}

pub(super) async fn expand_missing(ctx: &mut Ctx) -> Outcome {
    ctx.need_node(NodeCap::ExpandVolume)?;
    let parent = ctx.config.target_dir.clone();
    let dir = ctx.fresh_dir(&parent, "expand")?;
    let id = missing_id(ctx, "vol");
    let req = node_expand_req(ctx, &id, &dir.to_string_lossy(), "", ctx.config.volume_size);
    ctx.rpc(req)
        .await
        .code(Code::NotFound, "the volume does not exist")
        .map(drop)
}
