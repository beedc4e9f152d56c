//! The controller checks. One file over 700 lines: one function per
//! check, in the order the suite runs them.

use std::collections::{HashMap, HashSet};

use csi_proto::v1::controller_service_capability::rpc::Type as CtrlCap;
use csi_proto::v1::plugin_capability::service::Type as PluginCap;
use csi_proto::v1::*;
use tonic::Code;

use csi_server::validate::MAX_STRING;

use crate::config::SecretKind;
use crate::suite::{Call, Ctx, Outcome, Resource, fail, skip};

/// A volume id no driver will have created.
pub(super) fn missing_id(ctx: &mut Ctx, what: &str) -> String {
    format!("{}-does-not-exist", ctx.name(what))
}

fn need_controller(ctx: &Ctx) -> Outcome {
    if ctx.has_plugin(PluginCap::ControllerService) {
        Ok(())
    } else {
        skip("plugin capability CONTROLLER_SERVICE not advertised")
    }
}

pub(super) async fn capabilities(ctx: &mut Ctx) -> Outcome {
    need_controller(ctx)?;
    let call = ctx.rpc(ControllerGetCapabilitiesRequest {}).await;
    let caps: Vec<CtrlCap> = call
        .value()?
        .capabilities
        .iter()
        .filter_map(|c| c.rpc_type())
        .collect();
    call.ensure(
        !caps.contains(&CtrlCap::ListVolumesPublishedNodes)
            || caps.contains(&CtrlCap::PublishUnpublishVolume),
        "LIST_VOLUMES_PUBLISHED_NODES requires PUBLISH_UNPUBLISH_VOLUME",
    )
}

/// Sends a CreateVolume that must be rejected; cleans up if it was not.
async fn create_rejected(ctx: &mut Ctx, req: CreateVolumeRequest, why: &str) -> Outcome {
    ctx.need_ctrl(CtrlCap::CreateDeleteVolume)?;
    let call = ctx.send_create(req).await;
    call.code(Code::InvalidArgument, why).map(drop)
}

pub(super) async fn create_missing_name(ctx: &mut Ctx) -> Outcome {
    let mut req = ctx.create_request("noname");
    req.name.clear();
    create_rejected(ctx, req, "name is a required field").await
}

pub(super) async fn create_missing_caps(ctx: &mut Ctx) -> Outcome {
    let mut req = ctx.create_request("nocaps");
    req.volume_capabilities.clear();
    create_rejected(ctx, req, "volume_capabilities is a required field").await
}

pub(super) async fn create_cap_no_access_type(ctx: &mut Ctx) -> Outcome {
    let mut req = ctx.create_request("noaccesstype");
    req.volume_capabilities[0].access_type = None;
    create_rejected(ctx, req, "VolumeCapability.access_type is required").await
}

pub(super) async fn create_cap_no_access_mode(ctx: &mut Ctx) -> Outcome {
    let mut req = ctx.create_request("noaccessmode");
    req.volume_capabilities[0].access_mode = None;
    create_rejected(ctx, req, "VolumeCapability.access_mode is required").await
}

pub(super) async fn create_idempotent(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::CreateDeleteVolume)?;
    let req = ctx.create_request("idem");
    let first = ctx.create_volume_with(req.clone()).await?;
    let call = ctx.send_create(req).await;
    let again = call.value()?.volume.clone().unwrap_or_default();
    call.ensure(
        again.volume_id == first.volume_id,
        format!(
            "a repeated CreateVolume with the same name and arguments must return the same volume: got {:?}, first call returned {:?}",
            again.volume_id, first.volume_id
        ),
    )?;
    call.ensure(
        again.capacity_bytes == first.capacity_bytes,
        "a repeated CreateVolume returned a different capacity",
    )
}

pub(super) async fn create_incompatible(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::CreateDeleteVolume)?;
    let mut req = ctx.create_request("incompat");
    let vol = ctx.create_volume_with(req.clone()).await?;
    let base = vol.capacity_bytes.max(ctx.config.volume_size).max(1);
    req.capacity_range = Some(CapacityRange::exactly(base.saturating_mul(2)));
    let call = ctx.send_create(req).await;
    call.code(
        Code::AlreadyExists,
        "the name exists with a capacity that cannot satisfy the new capacity_range",
    )
    .map(drop)
}

pub(super) async fn create_capacity(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::CreateDeleteVolume)?;
    let required = ctx.config.volume_size;
    let got = ctx.create_volume("capacity").await?.capacity_bytes;
    if got != 0 && got < required {
        return fail(format!(
            "CreateVolume: capacity_bytes {got} is below the required_bytes {required} (0 would mean unknown)"
        ));
    }
    Ok(())
}

pub(super) async fn create_max_length_name(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::CreateDeleteVolume)?;
    let mut req = ctx.create_request("maxlen");
    req.name = ctx.name_of_length("maxlen", MAX_STRING);
    let call = ctx.send_create(req).await;
    call.expect(
        &[Code::Ok],
        "a name of 128 bytes, the spec's limit for a string, must be accepted",
    )
}

/// All volume ids ListVolumes reports, following next_token.
pub(super) async fn list_all(ctx: &Ctx, max_entries: i32) -> Outcome<Vec<String>> {
    let mut ids = Vec::new();
    let mut token = String::new();
    let mut seen_tokens = HashSet::new();
    loop {
        let req = ListVolumesRequest {
            max_entries,
            starting_token: token.clone(),
        };
        let call = ctx.rpc(req).await;
        let r = call.value()?;
        if max_entries > 0 {
            call.ensure(
                r.entries.len() <= max_entries as usize,
                format!(
                    "returned {} entries although max_entries is {max_entries}",
                    r.entries.len()
                ),
            )?;
        }
        for e in &r.entries {
            let v = e.volume.as_ref();
            call.ensure(
                v.is_some_and(|v| !v.volume_id.is_empty()),
                "every entry needs a volume with a volume_id",
            )?;
            ids.push(v.map(|v| v.volume_id.clone()).unwrap_or_default());
        }
        if r.next_token.is_empty() {
            return Ok(ids);
        }
        call.ensure(
            seen_tokens.insert(r.next_token.clone()),
            format!("next_token {:?} repeats: paging never ends", r.next_token),
        )?;
        token = r.next_token.clone();
    }
}

pub(super) async fn create_concurrent(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::CreateDeleteVolume)?;
    let req = ctx.create_request("concurrent");
    let before = if ctx.has_ctrl(CtrlCap::ListVolumes) {
        Some(list_all(ctx, 0).await?.len())
    } else {
        None
    };
    let n = ctx.config.concurrency.max(2);
    let calls = futures::future::join_all((0..n).map(|_| ctx.rpc(req.clone()))).await;
    let mut ids = HashSet::new();
    for c in &calls {
        if let Ok(CreateVolumeResponse { volume: Some(v) }) = &c.result {
            ids.insert(v.volume_id.clone());
            ctx.register(Resource::Volume(v.volume_id.clone()));
        }
    }
    for c in calls {
        c.expect(
            &[Code::Ok, Code::Aborted],
            "concurrent identical calls may only succeed or be ABORTED",
        )?;
    }
    if ids.len() > 1 {
        return fail(format!(
            "CreateVolume: {n} concurrent calls with one name created {} different volumes",
            ids.len()
        ));
    }
    if ids.is_empty() {
        // Every call was ABORTED: the retry the spec prescribes must succeed.
        ctx.create_volume_with(req.clone()).await?;
    }
    if let Some(before) = before {
        let after = list_all(ctx, 0).await?.len();
        if after != before + 1 {
            return fail(format!(
                "ListVolumes: {n} concurrent CreateVolume calls with one name changed the volume count from {before} to {after}, expected exactly one new volume"
            ));
        }
    }
    Ok(())
}

pub(super) async fn delete_missing(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::CreateDeleteVolume)?;
    let req = DeleteVolumeRequest {
        volume_id: missing_id(ctx, "vol"),
        secrets: ctx.secrets(SecretKind::DeleteVolume),
    };
    ctx.rpc(req)
        .await
        .code_in(
            &[Code::Ok],
            "deleting a volume that does not exist must be OK",
        )
        .map(drop)
}

pub(super) async fn delete_empty_id(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::CreateDeleteVolume)?;
    let req = DeleteVolumeRequest {
        volume_id: String::new(),
        secrets: ctx.secrets(SecretKind::DeleteVolume),
    };
    ctx.rpc(req)
        .await
        .code(Code::InvalidArgument, "volume_id is a required field")
        .map(drop)
}

fn validate_req(
    ctx: &Ctx,
    id: &str,
    caps: Vec<VolumeCapability>,
) -> ValidateVolumeCapabilitiesRequest {
    ValidateVolumeCapabilitiesRequest {
        volume_id: id.to_string(),
        volume_capabilities: caps,
        parameters: ctx.config.parameters.clone(),
        secrets: ctx.secrets(SecretKind::ValidateVolumeCapabilities),
        ..Default::default()
    }
}

pub(super) async fn validate_missing(ctx: &mut Ctx) -> Outcome {
    need_controller(ctx)?;
    let id = missing_id(ctx, "vol");
    let req = validate_req(ctx, &id, vec![ctx.capability()]);
    ctx.rpc(req)
        .await
        .code(Code::NotFound, "the volume does not exist")
        .map(drop)
}

pub(super) async fn validate_confirmed(ctx: &mut Ctx) -> Outcome {
    let vol = ctx.create_volume("validate").await?;
    let mut req = validate_req(ctx, &vol.volume_id, vec![ctx.capability()]);
    req.volume_context = vol.volume_context.clone();
    let call = ctx.rpc(req).await;
    let r = call.value()?;
    let Some(confirmed) = &r.confirmed else {
        return Err(call.bad(format!(
            "the volume was created with these capabilities, so they must be confirmed (message: {:?})",
            r.message
        )));
    };
    call.ensure(
        confirmed.volume_capabilities == vec![ctx.capability()],
        format!(
            "confirmed.volume_capabilities must echo the request, got {:?}",
            confirmed.volume_capabilities
        ),
    )
}

pub(super) async fn validate_missing_fields(ctx: &mut Ctx) -> Outcome {
    let vol = ctx.create_volume("validate-fields").await?;
    let req = validate_req(ctx, &vol.volume_id, vec![]);
    ctx.rpc(req).await.code(
        Code::InvalidArgument,
        "volume_capabilities is a required field",
    )?;
    let req = validate_req(ctx, "", vec![ctx.capability()]);
    ctx.rpc(req)
        .await
        .code(Code::InvalidArgument, "volume_id is a required field")
        .map(drop)
}

pub(super) async fn list_paging(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::ListVolumes)?;
    let mut created = Vec::new();
    for _ in 0..ctx.config.paging_items.max(3) {
        created.push(ctx.create_volume("page").await?.volume_id);
    }
    let listed = list_all(ctx, 2).await?;
    for id in &created {
        let n = listed.iter().filter(|l| *l == id).count();
        if n != 1 {
            return fail(format!(
                "ListVolumes: paging with max_entries=2 returned volume {id:?} {n} times, expected exactly once (listed {} entries in all)",
                listed.len()
            ));
        }
    }
    Ok(())
}

pub(super) async fn list_created_and_deleted(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::ListVolumes)?;
    let id = ctx.create_volume("listed").await?.volume_id;
    let n = list_all(ctx, 0).await?.iter().filter(|l| **l == id).count();
    if n != 1 {
        return fail(format!(
            "ListVolumes: the new volume {id:?} is listed {n} times, expected once"
        ));
    }
    let req = DeleteVolumeRequest {
        volume_id: id.clone(),
        secrets: ctx.secrets(SecretKind::DeleteVolume),
    };
    ctx.rpc(req).await.ok()?;
    if list_all(ctx, 0).await?.contains(&id) {
        return fail(format!(
            "ListVolumes: volume {id:?} is still listed after DeleteVolume succeeded"
        ));
    }
    Ok(())
}

pub(super) async fn list_invalid_token(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::ListVolumes)?;
    let req = ListVolumesRequest {
        max_entries: 0,
        starting_token: missing_id(ctx, "token"),
    };
    ctx.rpc(req)
        .await
        .code(Code::Aborted, "the starting_token was never handed out")
        .map(drop)
}

pub(super) async fn list_negative(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::ListVolumes)?;
    let req = ListVolumesRequest {
        max_entries: -1,
        starting_token: String::new(),
    };
    ctx.rpc(req)
        .await
        .code(Code::InvalidArgument, "max_entries must not be negative")
        .map(drop)
}

pub(super) async fn get_volume_existing(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::GetVolume)?;
    let vol = ctx.create_volume("get").await?;
    let req = ControllerGetVolumeRequest {
        volume_id: vol.volume_id.clone(),
    };
    let call = ctx.rpc(req).await;
    let got = call.value()?.volume.clone().unwrap_or_default();
    call.ensure(
        got.volume_id == vol.volume_id,
        format!(
            "returned volume {:?}, expected {:?}",
            got.volume_id, vol.volume_id
        ),
    )
}

pub(super) async fn get_volume_missing(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::GetVolume)?;
    let req = ControllerGetVolumeRequest {
        volume_id: missing_id(ctx, "vol"),
    };
    ctx.rpc(req)
        .await
        .code(Code::NotFound, "the volume does not exist")
        .map(drop)
}

pub(super) async fn get_capacity(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::GetCapacity)?;
    for req in [
        GetCapacityRequest::default(),
        GetCapacityRequest {
            volume_capabilities: vec![ctx.capability()],
            parameters: ctx.config.parameters.clone(),
            accessible_topology: None,
        },
    ] {
        let call = ctx.rpc(req).await;
        let r = call.value()?;
        call.ensure(r.available_capacity >= 0, "available_capacity must be >= 0")?;
        call.ensure(
            r.maximum_volume_size.is_none_or(|m| m >= 0),
            "maximum_volume_size must be >= 0",
        )?;
        call.ensure(
            r.minimum_volume_size.is_none_or(|m| m >= 0),
            "minimum_volume_size must be >= 0",
        )?;
    }
    Ok(())
}

pub(super) fn publish_req(ctx: &Ctx, volume: &str, node: &str) -> ControllerPublishVolumeRequest {
    ControllerPublishVolumeRequest {
        volume_id: volume.to_string(),
        node_id: node.to_string(),
        volume_capability: Some(ctx.capability()),
        readonly: false,
        secrets: ctx.secrets(SecretKind::ControllerPublishVolume),
        volume_context: Default::default(),
    }
}

/// ControllerPublishVolume; an attachment it made is registered for cleanup.
pub(super) async fn send_publish(
    ctx: &mut Ctx,
    req: ControllerPublishVolumeRequest,
) -> Call<ControllerPublishVolumeResponse> {
    let (volume, node) = (req.volume_id.clone(), req.node_id.clone());
    let call = ctx.rpc(req).await;
    if call.result.is_ok() {
        ctx.register(Resource::ControllerPublish { volume, node });
    }
    call
}

fn unpublish_req(ctx: &Ctx, volume: &str, node: &str) -> ControllerUnpublishVolumeRequest {
    ControllerUnpublishVolumeRequest {
        volume_id: volume.to_string(),
        node_id: node.to_string(),
        secrets: ctx.secrets(SecretKind::ControllerUnpublishVolume),
    }
}

/// The node id to publish to: the node plugin's, or a stand-in when the node
/// service is not reachable from here.
fn publish_node(ctx: &Ctx) -> Outcome<String> {
    ctx.node_id()
}

pub(super) async fn publish_missing_fields(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::PublishUnpublishVolume)?;
    let node = publish_node(ctx)?;
    let vol = ctx.create_volume("pub-fields").await?;
    let cases: [(&str, ControllerPublishVolumeRequest); 3] = [
        (
            "volume_id",
            ControllerPublishVolumeRequest {
                volume_id: String::new(),
                ..publish_req(ctx, &vol.volume_id, &node)
            },
        ),
        (
            "node_id",
            ControllerPublishVolumeRequest {
                node_id: String::new(),
                ..publish_req(ctx, &vol.volume_id, &node)
            },
        ),
        (
            "volume_capability",
            ControllerPublishVolumeRequest {
                volume_capability: None,
                ..publish_req(ctx, &vol.volume_id, &node)
            },
        ),
    ];
    for (field, req) in cases {
        send_publish(ctx, req).await.code(
            Code::InvalidArgument,
            &format!("{field} is a required field"),
        )?;
    }
    let req = unpublish_req(ctx, "", &node);
    ctx.rpc(req)
        .await
        .code(Code::InvalidArgument, "volume_id is a required field")
        .map(drop)
}

pub(super) async fn publish_missing_volume(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::PublishUnpublishVolume)?;
    let node = publish_node(ctx)?;
    let id = missing_id(ctx, "vol");
    let req = publish_req(ctx, &id, &node);
    ctx.rpc(req)
        .await
        .code(Code::NotFound, "the volume does not exist")
        .map(drop)
}

pub(super) async fn publish_missing_node(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::PublishUnpublishVolume)?;
    let vol = ctx.create_volume("pub-nonode").await?;
    let node = missing_id(ctx, "node");
    let req = publish_req(ctx, &vol.volume_id, &node);
    send_publish(ctx, req)
        .await
        .code(Code::NotFound, "the node does not exist")
        .map(drop)
}

pub(super) async fn publish_idempotent(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::PublishUnpublishVolume)?;
    let node = publish_node(ctx)?;
    let vol = ctx.create_volume("pub-idem").await?;
    ctx.register(Resource::ControllerPublish {
        volume: vol.volume_id.clone(),
        node: node.clone(),
    });
    for _ in 0..2 {
        let req = publish_req(ctx, &vol.volume_id, &node);
        ctx.rpc(req).await.ok()?;
    }
    for _ in 0..2 {
        let req = unpublish_req(ctx, &vol.volume_id, &node);
        ctx.rpc(req).await.ok()?;
    }
    Ok(())
}

pub(super) async fn publish_incompatible(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::PublishUnpublishVolume)?;
    ctx.need_ctrl(CtrlCap::PublishReadonly)?;
    let node = publish_node(ctx)?;
    let vol = ctx.create_volume("pub-incompat").await?;
    ctx.register(Resource::ControllerPublish {
        volume: vol.volume_id.clone(),
        node: node.clone(),
    });
    let req = publish_req(ctx, &vol.volume_id, &node);
    ctx.rpc(req.clone()).await.ok()?;
    let readonly = ControllerPublishVolumeRequest {
        readonly: true,
        ..req
    };
    ctx.rpc(readonly)
        .await
        .code(
            Code::AlreadyExists,
            "the volume is published to the node with readonly false; the same publish with readonly true is incompatible",
        )
        .map(drop)
}

pub(super) async fn unpublish_not_published(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::PublishUnpublishVolume)?;
    let node = publish_node(ctx)?;
    let vol = ctx.create_volume("unpub").await?;
    let req = unpublish_req(ctx, &vol.volume_id, &node);
    ctx.rpc(req)
        .await
        .code_in(
            &[Code::Ok],
            "a volume that is not published counts as unpublished",
        )
        .map(drop)
}

fn expand_req(ctx: &Ctx, id: &str, bytes: Option<i64>) -> ControllerExpandVolumeRequest {
    ControllerExpandVolumeRequest {
        volume_id: id.to_string(),
        capacity_range: bytes.map(CapacityRange::at_least),
        secrets: ctx.secrets(SecretKind::ControllerExpandVolume),
        volume_capability: Some(ctx.capability()),
    }
}

pub(super) async fn expand_grow(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::ExpandVolume)?;
    let vol = ctx.create_volume("expand").await?;
    let target = vol.capacity_bytes.max(ctx.config.volume_size) * 2;
    for _ in 0..2 {
        let req = expand_req(ctx, &vol.volume_id, Some(target));
        let call = ctx.rpc(req).await;
        let got = call.value()?.capacity_bytes;
        call.ensure(
            got >= target,
            format!("capacity_bytes {got} is below the requested {target}"),
        )?;
    }
    Ok(())
}

pub(super) async fn expand_missing(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::ExpandVolume)?;
    let id = missing_id(ctx, "vol");
    let req = expand_req(ctx, &id, Some(ctx.config.volume_size * 2));
    ctx.rpc(req)
        .await
        .code(Code::NotFound, "the volume does not exist")
        .map(drop)
}

pub(super) async fn expand_no_capacity(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::ExpandVolume)?;
    let vol = ctx.create_volume("expand-nocap").await?;
    let req = expand_req(ctx, &vol.volume_id, None);
    ctx.rpc(req)
        .await
        .code(Code::InvalidArgument, "capacity_range is a required field")
        .map(drop)
}

/// A mutable parameter no driver accepts.
fn unaccepted_mutable_parameter() -> HashMap<String, String> {
    [(
        "csi-conformance-unaccepted-key".to_string(),
        "csi-conformance-value".to_string(),
    )]
    .into()
}

async fn modify(
    ctx: &Ctx,
    volume_id: &str,
    mutable_parameters: HashMap<String, String>,
) -> Call<ControllerModifyVolumeResponse> {
    let req = ControllerModifyVolumeRequest {
        volume_id: volume_id.to_string(),
        secrets: ctx.secrets(SecretKind::ControllerModifyVolume),
        mutable_parameters,
    };
    ctx.rpc(req).await
}

/// The empty map (as csi-sanity and a parameterless VolumeAttributesClass
/// send it), then the configured parameters when there are any.
fn modify_parameter_sets(ctx: &Ctx) -> Vec<HashMap<String, String>> {
    let mut sets = vec![HashMap::new()];
    if !ctx.config.mutable_parameters.is_empty() {
        sets.push(ctx.config.mutable_parameters.clone());
    }
    sets
}

pub(super) async fn modify_missing(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::ModifyVolume)?;
    let id = missing_id(ctx, "vol");
    for params in modify_parameter_sets(ctx) {
        let why = if params.is_empty() {
            "the volume does not exist (an empty mutable_parameters is not a missing field: proto3 cannot tell it from absent)"
        } else {
            "the volume does not exist"
        };
        modify(ctx, &id, params).await.code(Code::NotFound, why)?;
    }
    Ok(())
}

pub(super) async fn modify_empty(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::ModifyVolume)?;
    let vol = ctx.create_volume("modify").await?;
    for params in modify_parameter_sets(ctx) {
        let why = if params.is_empty() {
            "an empty mutable_parameters modifies nothing and must succeed"
        } else {
            "the configured mutable parameters must be accepted"
        };
        modify(ctx, &vol.volume_id, params)
            .await
            .expect(&[Code::Ok], why)?;
    }
    Ok(())
}

pub(super) async fn modify_unaccepted(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::ModifyVolume)?;
    let vol = ctx.create_volume("modify-unaccepted").await?;
    modify(ctx, &vol.volume_id, unaccepted_mutable_parameter())
        .await
        .code(
            Code::InvalidArgument,
            "a mutable parameter the driver does not accept must be refused (and nothing applied)",
        )
        .map(drop)
}

pub(super) async fn create_with_mutable_parameters(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::CreateDeleteVolume)?;
    ctx.need_ctrl(CtrlCap::ModifyVolume)?;
    if ctx.config.mutable_parameters.is_empty() {
        return skip("no mutable parameters configured (SuiteConfig::mutable_parameters)");
    }
    let mut req = ctx.create_request("vac");
    req.mutable_parameters = ctx.config.mutable_parameters.clone();
    let call = ctx.send_create(req).await;
    let id = match &call.result {
        Ok(CreateVolumeResponse { volume: Some(v) }) => v.volume_id.clone(),
        _ => String::new(),
    };
    call.expect(
        &[Code::Ok],
        "the configured mutable_parameters (a VolumeAttributesClass) must be accepted at creation too",
    )?;
    let params = ctx.config.mutable_parameters.clone();
    modify(ctx, &id, params).await.expect(
        &[Code::Ok],
        "a volume created with the configured mutable parameters must take them again",
    )
}

pub(super) async fn create_unaccepted_mutable(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::ModifyVolume)?;
    let mut req = ctx.create_request("vac-unaccepted");
    req.mutable_parameters = unaccepted_mutable_parameter();
    create_rejected(
        ctx,
        req,
        "a mutable parameter the driver does not accept must be refused (and no volume created)",
    )
    .await
}

pub(super) async fn publish_attach_limit(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::PublishUnpublishVolume)?;
    ctx.need_ctrl(CtrlCap::CreateDeleteVolume)?;
    let node = publish_node(ctx)?;
    let limit = ctx.caps.max_volumes_per_node;
    if limit <= 0 {
        return skip("an attach limit (NodeGetInfo max_volumes_per_node) is not advertised");
    }
    if limit > ctx.config.attach_limit_max {
        return skip(format!(
            "max_volumes_per_node {limit} is above SuiteConfig::attach_limit_max ({})",
            ctx.config.attach_limit_max
        ));
    }
    for i in 0..=limit {
        let vol = ctx.create_volume("attach-limit").await?;
        let req = publish_req(ctx, &vol.volume_id, &node);
        let call = send_publish(ctx, req).await;
        if i < limit {
            call.expect(
                &[Code::Ok],
                &format!("attachment {} of max_volumes_per_node {limit}", i + 1),
            )?;
        } else {
            call.expect(
                &[Code::ResourceExhausted],
                &format!("the node already has max_volumes_per_node ({limit}) volumes attached"),
            )?;
        }
    }
    Ok(())
}

pub(super) async fn clone_volume(ctx: &mut Ctx) -> Outcome {
    ctx.need_ctrl(CtrlCap::CloneVolume)?;
    let src = ctx.create_volume("clone-src").await?;
    let source = |id: &str| VolumeContentSource {
        r#type: Some(volume_content_source::Type::Volume(
            volume_content_source::VolumeSource {
                volume_id: id.to_string(),
            },
        )),
    };
    let mut req = ctx.create_request("clone");
    req.volume_content_source = Some(source(&src.volume_id));
    let clone = ctx.create_volume_with(req).await?;
    if clone.volume_id == src.volume_id {
        return fail("CreateVolume: a clone must be a new volume, got the source's id");
    }
    if let Some(cs) = &clone.content_source
        && *cs != source(&src.volume_id)
    {
        return fail(format!(
            "CreateVolume: content_source {cs:?} does not name the source volume"
        ));
    }
    let mut req = ctx.create_request("clone-missing");
    let missing = missing_id(ctx, "vol");
    req.volume_content_source = Some(source(&missing));
    let call = ctx.send_create(req).await;
    call.code(Code::NotFound, "the source volume does not exist")
        .map(drop)
}
