use csi_proto::v1::controller_service_capability::rpc::Type as CtrlCap;
use csi_proto::v1::plugin_capability::service::Type as PluginCap;
use csi_proto::v1::*;
use tonic::Code;

use super::controller::missing_id;
use crate::config::SecretKind;
use crate::suite::{Ctx, Outcome, Resource, fail, skip};

pub(super) async fn capabilities(ctx: &mut Ctx) -> Outcome {
    if !ctx.has_plugin(PluginCap::GroupControllerService) {
        return skip("plugin capability GROUP_CONTROLLER_SERVICE not advertised");
    }
    ctx.rpc(GroupControllerGetCapabilitiesRequest {})
        .await
        .ok()
        .map(drop)
}

fn get_req(ctx: &Ctx, id: &str, snaps: Vec<String>) -> GetVolumeGroupSnapshotRequest {
    GetVolumeGroupSnapshotRequest {
        group_snapshot_id: id.to_string(),
        snapshot_ids: snaps,
        secrets: ctx.secrets(SecretKind::GetVolumeGroupSnapshot),
    }
}

fn delete_req(ctx: &Ctx, id: &str, snaps: Vec<String>) -> DeleteVolumeGroupSnapshotRequest {
    DeleteVolumeGroupSnapshotRequest {
        group_snapshot_id: id.to_string(),
        snapshot_ids: snaps,
        secrets: ctx.secrets(SecretKind::DeleteVolumeGroupSnapshot),
    }
}

pub(super) async fn lifecycle(ctx: &mut Ctx) -> Outcome {
    ctx.need_group()?;
    ctx.need_ctrl(CtrlCap::CreateDeleteVolume)?;
    let a = ctx.create_volume("group-a").await?.volume_id;
    let b = ctx.create_volume("group-b").await?.volume_id;
    let req = CreateVolumeGroupSnapshotRequest {
        name: ctx.name("group"),
        source_volume_ids: vec![a.clone(), b.clone()],
        secrets: ctx.secrets(SecretKind::CreateVolumeGroupSnapshot),
        parameters: ctx.config.snapshot_parameters.clone(),
    };
    let mut first: Option<VolumeGroupSnapshot> = None;
    for _ in 0..2 {
        let call = ctx.rpc(req.clone()).await;
        if let Ok(CreateVolumeGroupSnapshotResponse {
            group_snapshot: Some(g),
        }) = &call.result
        {
            let ids = g.snapshots.iter().map(|s| s.snapshot_id.clone()).collect();
            ctx.register(Resource::GroupSnapshot(g.group_snapshot_id.clone(), ids));
        }
        let g = call.value()?.group_snapshot.clone().unwrap_or_default();
        call.ensure(
            !g.group_snapshot_id.is_empty(),
            "group_snapshot_id is required",
        )?;
        let mut sources: Vec<&str> = g
            .snapshots
            .iter()
            .map(|s| s.source_volume_id.as_str())
            .collect();
        sources.sort();
        let mut want = vec![a.as_str(), b.as_str()];
        want.sort();
        call.ensure(
            sources == want,
            format!("snapshots must cover exactly the source volumes, got {sources:?}"),
        )?;
        call.ensure(
            g.snapshots
                .iter()
                .all(|s| s.group_snapshot_id == g.group_snapshot_id),
            "every member snapshot must carry the group_snapshot_id",
        )?;
        if let Some(f) = &first {
            call.ensure(
                f.group_snapshot_id == g.group_snapshot_id,
                "a repeated CreateVolumeGroupSnapshot must return the same group snapshot",
            )?;
        }
        first = Some(g);
    }
    let g = first.unwrap_or_default();
    let snaps: Vec<String> = g.snapshots.iter().map(|s| s.snapshot_id.clone()).collect();
    let req = get_req(ctx, &g.group_snapshot_id, snaps.clone());
    let call = ctx.rpc(req).await;
    let got = call.value()?.group_snapshot.clone().unwrap_or_default();
    call.ensure(
        got.group_snapshot_id == g.group_snapshot_id,
        "returned another group snapshot",
    )?;
    let req = delete_req(ctx, &g.group_snapshot_id, snaps.clone());
    ctx.rpc(req).await.ok()?;
    let req = get_req(ctx, &g.group_snapshot_id, snaps);
    let call = ctx.rpc(req).await;
    if call.result.is_ok() {
        return fail(
            "GetVolumeGroupSnapshot: the group snapshot is still there after DeleteVolumeGroupSnapshot",
        );
    }
    call.code(Code::NotFound, "the group snapshot was deleted")
        .map(drop)
}

/// The group id alone names a group snapshot: csi-sanity sends no
/// snapshot_ids for an unknown id, and proto3 cannot tell an empty list from
/// an absent one. Also with a listed (unknown) snapshot id.
pub(super) async fn get_missing(ctx: &mut Ctx) -> Outcome {
    ctx.need_group()?;
    let id = missing_id(ctx, "group");
    let snap = missing_id(ctx, "snapshot");
    for snaps in [vec![], vec![snap]] {
        let why = if snaps.is_empty() {
            "the group snapshot does not exist (snapshot_ids may be empty)"
        } else {
            "the group snapshot does not exist"
        };
        let req = get_req(ctx, &id, snaps);
        ctx.rpc(req).await.code(Code::NotFound, why)?;
    }
    Ok(())
}

pub(super) async fn delete_missing(ctx: &mut Ctx) -> Outcome {
    ctx.need_group()?;
    let id = missing_id(ctx, "group");
    let snap = missing_id(ctx, "snapshot");
    for snaps in [vec![], vec![snap]] {
        let why = if snaps.is_empty() {
            "deleting a group snapshot that does not exist must be OK (snapshot_ids may be empty)"
        } else {
            "deleting a group snapshot that does not exist must be OK"
        };
        let req = delete_req(ctx, &id, snaps);
        ctx.rpc(req).await.expect(&[Code::Ok], why)?;
    }
    Ok(())
}
