use std::collections::HashSet;

use csi_proto::v1::controller_service_capability::rpc::Type as CtrlCap;
use csi_proto::v1::*;
use tonic::Code;

use csi_server::validate::MAX_STRING;

use super::controller::missing_id;
use crate::config::SecretKind;
use crate::suite::{Ctx, Outcome, Resource, fail};

fn snap_req(ctx: &Ctx, name: &str, source: &str) -> CreateSnapshotRequest {
    CreateSnapshotRequest {
        source_volume_id: source.to_string(),
        name: name.to_string(),
        secrets: ctx.secrets(SecretKind::CreateSnapshot),
        parameters: ctx.config.snapshot_parameters.clone(),
    }
}

/// Sends CreateSnapshot, registering whatever it created.
async fn send(
    ctx: &mut Ctx,
    req: CreateSnapshotRequest,
) -> crate::suite::Call<CreateSnapshotResponse> {
    let call = ctx.rpc(req).await;
    if let Ok(CreateSnapshotResponse { snapshot: Some(s) }) = &call.result {
        ctx.register(Resource::Snapshot(s.snapshot_id.clone()));
    }
    call
}

/// Creates a snapshot of `source` and checks the answer's shape.
pub(super) async fn create(ctx: &mut Ctx, name: &str, source: &str) -> Outcome<Snapshot> {
    let req = snap_req(ctx, name, source);
    let mut call = send(ctx, req.clone()).await;
    // ready_to_use=false means post-processing; the CO re-calls until it is
    // true (bounded by the check timeout).
    while call
        .value()?
        .snapshot
        .as_ref()
        .is_some_and(|s| !s.ready_to_use)
    {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        call = send(ctx, req.clone()).await;
    }
    let snap = call.value()?.snapshot.clone().unwrap_or_default();
    call.ensure(
        !snap.snapshot_id.is_empty(),
        "Snapshot.snapshot_id is required",
    )?;
    call.ensure(
        snap.source_volume_id == source,
        format!(
            "source_volume_id is {:?}, expected {source:?}",
            snap.source_volume_id
        ),
    )?;
    call.ensure(snap.size_bytes >= 0, "size_bytes must not be negative")?;
    call.ensure(snap.creation_time.is_some(), "creation_time is required")?;
    Ok(snap)
}

pub(super) async fn create_missing_fields(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::CreateDeleteSnapshot)?;
    let vol = ctx.create_volume("snap-fields").await?;
    let req = snap_req(ctx, "", &vol.volume_id);
    send(ctx, req)
        .await
        .code(Code::InvalidArgument, "name is a required field")?;
    let name = ctx.name("snap");
    let req = snap_req(ctx, &name, "");
    send(ctx, req)
        .await
        .code(
            Code::InvalidArgument,
            "source_volume_id is a required field",
        )
        .map(drop)
}

pub(super) async fn create_idempotent(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::CreateDeleteSnapshot)?;
    let vol = ctx.create_volume("snap-src").await?;
    let name = ctx.name("snap");
    let first = create(ctx, &name, &vol.volume_id).await?;
    let again = create(ctx, &name, &vol.volume_id).await?;
    if again.snapshot_id != first.snapshot_id {
        return fail(format!(
            "CreateSnapshot: a repeated call with the same name returned snapshot {:?}, the first returned {:?}",
            again.snapshot_id, first.snapshot_id
        ));
    }
    Ok(())
}

pub(super) async fn create_conflict(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::CreateDeleteSnapshot)?;
    let a = ctx.create_volume("snap-a").await?;
    let b = ctx.create_volume("snap-b").await?;
    let name = ctx.name("snap");
    create(ctx, &name, &a.volume_id).await?;
    let req = snap_req(ctx, &name, &b.volume_id);
    send(ctx, req)
        .await
        .code(
            Code::AlreadyExists,
            "the name exists with another source volume",
        )
        .map(drop)
}

pub(super) async fn create_max_length_name(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::CreateDeleteSnapshot)?;
    let vol = ctx.create_volume("snap-maxlen-src").await?;
    let name = ctx.name_of_length("snap-maxlen", MAX_STRING);
    let req = snap_req(ctx, &name, &vol.volume_id);
    send(ctx, req).await.expect(
        &[Code::Ok],
        "a name of 128 bytes, the spec's limit for a string, must be accepted",
    )
}

pub(super) async fn delete_missing(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::CreateDeleteSnapshot)?;
    let req = DeleteSnapshotRequest {
        snapshot_id: missing_id(ctx, "snap"),
        secrets: ctx.secrets(SecretKind::DeleteSnapshot),
    };
    ctx.rpc(req).await.expect(
        &[Code::Ok],
        "deleting a snapshot that does not exist must be OK",
    )?;
    let req = DeleteSnapshotRequest {
        snapshot_id: String::new(),
        secrets: ctx.secrets(SecretKind::DeleteSnapshot),
    };
    ctx.rpc(req)
        .await
        .code(Code::InvalidArgument, "snapshot_id is a required field")
        .map(drop)
}

fn list_req(ctx: &Ctx) -> ListSnapshotsRequest {
    ListSnapshotsRequest {
        secrets: ctx.secrets(SecretKind::ListSnapshots),
        ..Default::default()
    }
}

/// Every snapshot id matching `req`, following next_token.
async fn list_all(ctx: &Ctx, mut req: ListSnapshotsRequest) -> Outcome<Vec<String>> {
    let mut ids = Vec::new();
    let mut tokens = HashSet::new();
    loop {
        let call = ctx.rpc(req.clone()).await;
        let r = call.value()?;
        if req.max_entries > 0 {
            call.ensure(
                r.entries.len() <= req.max_entries as usize,
                format!(
                    "returned {} entries although max_entries is {}",
                    r.entries.len(),
                    req.max_entries
                ),
            )?;
        }
        for e in &r.entries {
            let s = e.snapshot.as_ref();
            call.ensure(
                s.is_some_and(|s| !s.snapshot_id.is_empty() && !s.source_volume_id.is_empty()),
                "every entry needs a snapshot with a snapshot_id and a source_volume_id",
            )?;
            call.ensure(
                s.is_some_and(|s| s.creation_time.is_some()),
                "every listed snapshot needs its creation_time",
            )?;
            ids.extend(s.map(|s| s.snapshot_id.clone()));
        }
        if r.next_token.is_empty() {
            return Ok(ids);
        }
        call.ensure(
            tokens.insert(r.next_token.clone()),
            "next_token repeats: paging never ends",
        )?;
        req.starting_token = r.next_token.clone();
    }
}

pub(super) async fn list_filters(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::CreateDeleteSnapshot)?;
    ctx.need_ctrl(CtrlCap::ListSnapshots)?;
    let a = ctx.create_volume("list-a").await?;
    let b = ctx.create_volume("list-b").await?;
    let na = ctx.name("snap");
    let nb = ctx.name("snap");
    let sa = create(ctx, &na, &a.volume_id).await?;
    let sb = create(ctx, &nb, &b.volume_id).await?;
    let by_id = list_all(
        ctx,
        ListSnapshotsRequest {
            snapshot_id: sa.snapshot_id.clone(),
            ..list_req(ctx)
        },
    )
    .await?;
    if by_id != vec![sa.snapshot_id.clone()] {
        return fail(format!(
            "ListSnapshots: filtering by snapshot_id {:?} returned {by_id:?}",
            sa.snapshot_id
        ));
    }
    let by_src = list_all(
        ctx,
        ListSnapshotsRequest {
            source_volume_id: a.volume_id.clone(),
            ..list_req(ctx)
        },
    )
    .await?;
    if !by_src.contains(&sa.snapshot_id) || by_src.contains(&sb.snapshot_id) {
        return fail(format!(
            "ListSnapshots: filtering by source_volume_id {:?} returned {by_src:?}",
            a.volume_id
        ));
    }
    let missing_snapshot = ListSnapshotsRequest {
        snapshot_id: missing_id(ctx, "snap"),
        ..list_req(ctx)
    };
    let missing_source = ListSnapshotsRequest {
        source_volume_id: missing_id(ctx, "vol"),
        ..list_req(ctx)
    };
    for (field, req) in [
        ("snapshot_id", missing_snapshot),
        ("source_volume_id", missing_source),
    ] {
        let none = list_all(ctx, req).await?;
        if !none.is_empty() {
            return fail(format!(
                "ListSnapshots: filtering by a missing {field} returned {none:?}"
            ));
        }
    }
    Ok(())
}

pub(super) async fn list_created_and_deleted(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::CreateDeleteSnapshot)?;
    ctx.need_ctrl(CtrlCap::ListSnapshots)?;
    let vol = ctx.create_volume("listed-src").await?;
    let name = ctx.name("snap");
    let id = create(ctx, &name, &vol.volume_id).await?.snapshot_id;
    let listed = list_all(ctx, list_req(ctx)).await?;
    let n = listed.iter().filter(|l| **l == id).count();
    if n != 1 {
        return fail(format!(
            "ListSnapshots: the new snapshot {id:?} is listed {n} times, expected once"
        ));
    }
    let req = DeleteSnapshotRequest {
        snapshot_id: id.clone(),
        secrets: ctx.secrets(SecretKind::DeleteSnapshot),
    };
    ctx.rpc(req).await.ok()?;
    if list_all(ctx, list_req(ctx)).await?.contains(&id) {
        return fail(format!(
            "ListSnapshots: snapshot {id:?} is still listed after DeleteSnapshot succeeded"
        ));
    }
    Ok(())
}

pub(super) async fn list_paging(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::CreateDeleteSnapshot)?;
    ctx.need_ctrl(CtrlCap::ListSnapshots)?;
    let vol = ctx.create_volume("page-src").await?;
    let mut created = Vec::new();
    for _ in 0..ctx.config.paging_items.max(3) {
        let name = ctx.name("snap");
        created.push(create(ctx, &name, &vol.volume_id).await?.snapshot_id);
    }
    let listed = list_all(
        ctx,
        ListSnapshotsRequest {
            max_entries: 2,
            ..list_req(ctx)
        },
    )
    .await?;
    for id in &created {
        let n = listed.iter().filter(|l| *l == id).count();
        if n != 1 {
            return fail(format!(
                "ListSnapshots: paging with max_entries=2 returned snapshot {id:?} {n} times, expected exactly once"
            ));
        }
    }
    let token = missing_id(ctx, "token");
    let req = ListSnapshotsRequest {
        starting_token: token,
        ..list_req(ctx)
    };
    ctx.rpc(req)
        .await
        .code(Code::Aborted, "the starting_token was never handed out")
        .map(drop)
}

pub(super) async fn get_existing(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::CreateDeleteSnapshot)?;
    ctx.need_ctrl(CtrlCap::GetSnapshot)?;
    let vol = ctx.create_volume("get-src").await?;
    let name = ctx.name("snap");
    let snap = create(ctx, &name, &vol.volume_id).await?;
    let req = GetSnapshotRequest {
        snapshot_id: snap.snapshot_id.clone(),
        secrets: ctx.secrets(SecretKind::GetSnapshot),
    };
    let call = ctx.rpc(req).await;
    let got = call.value()?.snapshot.clone().unwrap_or_default();
    call.ensure(
        got.snapshot_id == snap.snapshot_id && got.source_volume_id == vol.volume_id,
        format!("returned {got:?}"),
    )
}

pub(super) async fn get_missing(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::GetSnapshot)?;
    let req = GetSnapshotRequest {
        snapshot_id: missing_id(ctx, "snap"),
        secrets: ctx.secrets(SecretKind::GetSnapshot),
    };
    ctx.rpc(req)
        .await
        .code(Code::NotFound, "the snapshot does not exist")
        .map(drop)
}

fn snapshot_source(id: &str) -> VolumeContentSource {
    VolumeContentSource {
        r#type: Some(volume_content_source::Type::Snapshot(
            volume_content_source::SnapshotSource {
                snapshot_id: id.to_string(),
            },
        )),
    }
}

pub(super) async fn restore(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::CreateDeleteSnapshot)?;
    let vol = ctx.create_volume("restore-src").await?;
    let name = ctx.name("snap");
    let snap = create(ctx, &name, &vol.volume_id).await?;
    let mut req = ctx.create_request("restored");
    req.volume_content_source = Some(snapshot_source(&snap.snapshot_id));
    let restored = ctx.create_volume_with(req).await?;
    if let Some(cs) = &restored.content_source
        && *cs != snapshot_source(&snap.snapshot_id)
    {
        return fail(format!(
            "CreateVolume: content_source {cs:?} does not name the snapshot"
        ));
    }
    let mut req = ctx.create_request("restore-missing");
    let missing = missing_id(ctx, "snap");
    req.volume_content_source = Some(snapshot_source(&missing));
    let call = ctx.send_create(req).await;
    call.code(Code::NotFound, "the source snapshot does not exist")
        .map(drop)
}

pub(super) async fn delete_source(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::CreateDeleteSnapshot)?;
    let vol = ctx.create_volume("del-src").await?;
    let name = ctx.name("snap");
    let snap = create(ctx, &name, &vol.volume_id).await?;
    let req = DeleteVolumeRequest {
        volume_id: vol.volume_id.clone(),
        secrets: ctx.secrets(SecretKind::DeleteVolume),
    };
    let call = ctx.rpc(req).await;
    match call.code_in(
        &[Code::Ok, Code::FailedPrecondition],
        "a volume with snapshots is deleted, or refused with FAILED_PRECONDITION",
    )? {
        Ok(_) => {
            // Independent snapshots must survive their source.
            if ctx.has_ctrl(CtrlCap::ListSnapshots) {
                let req = ListSnapshotsRequest {
                    snapshot_id: snap.snapshot_id.clone(),
                    ..list_req(ctx)
                };
                let found = list_all(ctx, req).await?;
                if found != vec![snap.snapshot_id.clone()] {
                    return fail(format!(
                        "ListSnapshots: snapshot {:?} vanished when its source volume was deleted",
                        snap.snapshot_id
                    ));
                }
            }
            Ok(())
        }
        Err(_) => {
            // FAILED_PRECONDITION promises the volume is unaltered.
            let req = ValidateVolumeCapabilitiesRequest {
                volume_id: vol.volume_id.clone(),
                volume_capabilities: vec![ctx.capability()],
                parameters: ctx.config.parameters.clone(),
                volume_context: vol.volume_context.clone(),
                secrets: ctx.secrets(SecretKind::ValidateVolumeCapabilities),
                ..Default::default()
            };
            let call = ctx.rpc(req).await;
            let r = call.value()?;
            call.ensure(
                r.confirmed.is_some(),
                "after DeleteVolume answered FAILED_PRECONDITION the volume must be unaltered",
            )
        }
    }
}
