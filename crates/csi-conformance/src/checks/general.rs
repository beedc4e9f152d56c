use csi_proto::v1::controller_service_capability::rpc::Type as CtrlCap;
use csi_proto::v1::node_service_capability::rpc::Type as NodeCap;
use csi_proto::v1::{
    ControllerPublishVolumeRequest, CreateVolumeRequest, NodePublishVolumeRequest,
    NodeStageVolumeRequest, ProbeResponse,
};
use csi_server::Endpoint;
use csi_server::authority::unary_with_authority;
use prost::Message;

use crate::config::{SecretKind, secret_kinds, secrets_file_key};
use crate::suite::{Ctx, Outcome, fail, skip};

/// gRPC clients other than grpc-go and grpc-js name a unix socket's path
/// as `:authority`; a server that resets those streams cannot be called
/// from Python, C++ or Java at all.
pub(super) async fn any_authority(ctx: &mut Ctx) -> Outcome {
    let mut endpoints = vec![ctx.config.endpoint.clone()];
    endpoints.extend(ctx.config.controller_endpoint.clone());
    let mut tested = 0;
    for endpoint in &endpoints {
        if let Ok(Endpoint::Unix(path)) = endpoint.parse::<Endpoint>() {
            probe_with_authorities(ctx, &path).await?;
            tested += 1;
        }
    }
    if tested == 0 {
        return skip("the endpoint is not a unix socket");
    }
    Ok(())
}

/// Probes the socket at `path` with the `:authority` values other gRPC
/// stacks send.
async fn probe_with_authorities(ctx: &Ctx, path: &std::path::Path) -> Outcome {
    let raw = path.to_string_lossy().into_owned();
    let encoded = raw.replace('/', "%2F");
    for (authority, client) in [
        (&raw, "grpc-java"),
        (&encoded, "gRPC C-core (Python grpcio, C++)"),
    ] {
        let what = format!("Probe with :authority {authority:?}, as {client} sends it");
        let conn = tokio::net::UnixStream::connect(path)
            .await
            .or_else(|e| fail(format!("cannot connect to {}: {e}", path.display())))?;
        let call = unary_with_authority(conn, authority, "/csi.v1.Identity/Probe", &[]);
        let reply = match tokio::time::timeout(ctx.config.timeouts.rpc, call).await {
            Err(_) => {
                return fail(format!(
                    "{what}: no answer within {:?}",
                    ctx.config.timeouts.rpc
                ));
            }
            Ok(Err(e)) => return fail(format!("{what}: {e}")),
            Ok(Ok(reply)) => reply,
        };
        match (reply.reset, reply.grpc_status) {
            (Some(1), _) => {
                return fail(format!(
                    "{what}: the stream was reset with PROTOCOL_ERROR, so {client} clients cannot call this driver (h2 rejects the value; serve the socket through csi_server::authority::AnyAuthority)"
                ));
            }
            (Some(code), _) => {
                return fail(format!("{what}: the stream was reset with code {code}"));
            }
            (None, Some(0)) => {}
            (None, status) => {
                return fail(format!(
                    "{what}: answered grpc-status {status:?} ({})",
                    reply.grpc_message.as_deref().unwrap_or("no message")
                ));
            }
        }
        let message = reply.message.unwrap_or_default();
        if let Err(e) = ProbeResponse::decode(&message[..]) {
            return fail(format!("{what}: the answer is not a ProbeResponse: {e}"));
        }
    }
    Ok(())
}

pub(super) async fn secrets_not_in_logs(ctx: &mut Ctx) -> Outcome {
    let logs: Vec<_> = [&ctx.config.driver_log, &ctx.config.controller_log]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
    if logs.is_empty() {
        return skip("no driver log configured (SuiteConfig::driver_log)");
    }
    let markers = ctx.secret_values();
    // Let the driver flush what it logged during the last checks.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    for path in &logs {
        let bytes = tokio::fs::read(path)
            .await
            .or_else(|e| fail(format!("cannot read driver log {}: {e}", path.display())))?;
        let text = String::from_utf8_lossy(&bytes);
        for (n, line) in text.lines().enumerate() {
            let Some(marker) = markers.iter().find(|m| line.contains(m.as_str())) else {
                continue;
            };
            let mut kinds: Vec<String> = secret_kinds()
                .filter(|k| ctx.config.secrets.get(*k).values().any(|v| v == marker))
                .map(secrets_file_key)
                .collect();
            if kinds.is_empty() {
                kinds.push("the suite's marker".to_string());
            }
            // Never echo a secret into the report.
            let mut context = line.to_string();
            for m in &markers {
                context = context.replace(m.as_str(), "<SECRET>");
            }
            let context: String = context.chars().take(200).collect();
            return fail(format!(
                "a secret value ({}) appears in the driver log {} at line {}: {context}",
                kinds.join(", "),
                path.display(),
                n + 1
            ));
        }
    }
    Ok(())
}

/// Secrets are `csi_secret` fields: a driver must not echo them in any
/// status message either. Every error the run received was already scanned
/// (and redacted) by `Ctx::rpc`; this check also provokes errors from the
/// RPCs that take credentials, sending the configured secrets plus a marker.
pub(super) async fn secrets_not_in_errors(ctx: &mut Ctx) -> Outcome {
    let with_marker = |ctx: &Ctx, kind: SecretKind| {
        let mut s = ctx.secrets(kind);
        s.insert("csi-conformance-marker".into(), ctx.marker.clone());
        s
    };
    let missing = format!("{}-does-not-exist", ctx.name("secret-probe"));
    if ctx.has_ctrl(CtrlCap::CreateDeleteVolume) {
        // No capabilities: INVALID_ARGUMENT, and nothing is created.
        let req = CreateVolumeRequest {
            name: ctx.name("secret-probe"),
            secrets: with_marker(ctx, SecretKind::CreateVolume),
            ..Default::default()
        };
        ctx.send_create(req).await;
    }
    if ctx.has_ctrl(CtrlCap::PublishUnpublishVolume)
        && let Some(node) = ctx.caps.node_id.clone()
    {
        let req = ControllerPublishVolumeRequest {
            volume_id: missing.clone(),
            node_id: node,
            volume_capability: Some(ctx.capability()),
            secrets: with_marker(ctx, SecretKind::ControllerPublishVolume),
            ..Default::default()
        };
        ctx.rpc(req).await;
    }
    if ctx.caps.node_err.is_none() {
        if ctx.has_node(NodeCap::StageUnstageVolume) {
            let staging = ctx.staging_path()?;
            let req = NodeStageVolumeRequest {
                volume_id: missing.clone(),
                staging_target_path: staging,
                volume_capability: Some(ctx.capability()),
                secrets: with_marker(ctx, SecretKind::NodeStageVolume),
                ..Default::default()
            };
            ctx.rpc(req).await;
        }
        let target = ctx.target_path()?;
        let req = NodePublishVolumeRequest {
            volume_id: missing.clone(),
            target_path: target,
            volume_capability: Some(ctx.capability()),
            secrets: with_marker(ctx, SecretKind::NodePublishVolume),
            ..Default::default()
        };
        ctx.rpc(req).await;
    }
    let leaks = ctx.leaks.lock().unwrap_or_else(|e| e.into_inner()).clone();
    match leaks.first() {
        None => Ok(()),
        Some(first) => fail(format!(
            "{} error message(s) carried a secret value (csi_secret fields must never be echoed); the first, redacted: {first}",
            leaks.len()
        )),
    }
}
