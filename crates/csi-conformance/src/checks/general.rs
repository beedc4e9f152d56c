use csi_proto::v1::ProbeResponse;
use csi_server::Endpoint;
use csi_server::authority::unary_with_authority;
use prost::Message;

use crate::config::{secret_kinds, secrets_file_key};
use crate::suite::{Ctx, Outcome, fail, skip};

/// gRPC clients other than grpc-go and grpc-js name a unix socket's path
/// as `:authority`; a server that resets those streams cannot be called
/// from Python, C++ or Java at all.
pub(super) async fn any_authority(ctx: &mut Ctx) -> Outcome {
    let Ok(Endpoint::Unix(path)) = ctx.config.endpoint.parse::<Endpoint>() else {
        return skip("the endpoint is not a unix socket");
    };
    let raw = path.to_string_lossy().into_owned();
    let encoded = raw.replace('/', "%2F");
    for (authority, client) in [
        (&raw, "grpc-java"),
        (&encoded, "gRPC C-core (Python grpcio, C++)"),
    ] {
        let what = format!("Probe with :authority {authority:?}, as {client} sends it");
        let mut conn = tokio::net::UnixStream::connect(&path)
            .await
            .or_else(|e| fail(format!("cannot connect to {}: {e}", path.display())))?;
        let call = unary_with_authority(
            &mut conn,
            authority.as_bytes(),
            "/csi.v1.Identity/Probe",
            &[],
        );
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
    let Some(path) = ctx.config.driver_log.clone() else {
        return skip("no driver log configured (SuiteConfig::driver_log)");
    };
    let markers = ctx.config.secrets.log_markers();
    if markers.is_empty() {
        return skip("no secret value of 8 bytes or more is configured");
    }
    // Let the driver flush what it logged during the last checks.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let bytes = tokio::fs::read(&path)
        .await
        .or_else(|e| fail(format!("cannot read driver log {}: {e}", path.display())))?;
    let text = String::from_utf8_lossy(&bytes);
    for marker in &markers {
        if let Some((n, line)) = text
            .lines()
            .enumerate()
            .find(|(_, l)| l.contains(marker.as_str()))
        {
            let kinds: Vec<String> = secret_kinds()
                .filter(|k| ctx.config.secrets.get(*k).values().any(|v| v == marker))
                .map(secrets_file_key)
                .collect();
            // Never echo the secret itself into the report.
            let context: String = line
                .replace(marker.as_str(), "<SECRET>")
                .chars()
                .take(200)
                .collect();
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
