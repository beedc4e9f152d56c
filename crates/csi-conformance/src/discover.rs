//! What the driver advertises, fetched once per run before any check.

use csi_proto::v1::plugin_capability::service::Type as PluginCap;
use csi_proto::v1::*;
use tonic::Status as GrpcStatus;

use crate::suite::{Ctx, code_name};

/// Fetches plugin info and every capability list once, so checks can decide
/// what applies without repeating the calls.
pub(crate) async fn discover(ctx: &mut Ctx) -> Option<String> {
    let plugin = ctx
        .rpc(GetPluginInfoRequest {})
        .await
        .result
        .ok()
        .map(|r| format!("{} {}", r.name, r.vendor_version));
    let err = |s: GrpcStatus| format!("{}: {}", code_name(s.code()), s.message());
    match ctx.rpc(GetPluginCapabilitiesRequest {}).await.result {
        Ok(r) => {
            ctx.caps.plugin = r
                .capabilities
                .iter()
                .filter_map(|c| c.service_type())
                .collect()
        }
        Err(s) => ctx.caps.plugin_err = Some(err(s)),
    }
    if ctx.has_plugin(PluginCap::ControllerService) {
        match ctx.rpc(ControllerGetCapabilitiesRequest {}).await.result {
            Ok(r) => {
                ctx.caps.controller = r.capabilities.iter().filter_map(|c| c.rpc_type()).collect()
            }
            Err(s) => ctx.caps.controller_err = Some(err(s)),
        }
    } else {
        ctx.caps.controller_err =
            Some("plugin capability CONTROLLER_SERVICE not advertised".into());
    }
    match ctx.rpc(NodeGetCapabilitiesRequest {}).await.result {
        Ok(r) => ctx.caps.node = r.capabilities.iter().filter_map(|c| c.rpc_type()).collect(),
        Err(s) => ctx.caps.node_err = Some(err(s)),
    }
    if ctx.caps.node_err.is_none()
        && let Ok(r) = ctx.rpc(NodeGetInfoRequest {}).await.result
    {
        if !r.node_id.is_empty() {
            ctx.caps.node_id = Some(r.node_id);
        }
        ctx.caps.max_volumes_per_node = r.max_volumes_per_node;
    }
    if ctx.has_plugin(PluginCap::GroupControllerService) {
        match ctx
            .rpc(GroupControllerGetCapabilitiesRequest {})
            .await
            .result
        {
            Ok(r) => ctx.caps.group = r.capabilities.iter().filter_map(|c| c.rpc_type()).collect(),
            Err(s) => ctx.caps.group_err = Some(err(s)),
        }
    }
    plugin
}
