use csi_proto::v1::plugin_capability::service::Type as PluginCap;
use csi_proto::v1::*;

use crate::suite::{Ctx, Outcome, skip};

/// DNS-1123 style as the spec words it: alphanumeric at both ends, `-`, `.`
/// and alphanumerics in between.
fn is_dns_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'.')
}

pub(super) async fn plugin_info(ctx: &mut Ctx) -> Outcome {
    let call = ctx.rpc(GetPluginInfoRequest {}).await;
    let r = call.value()?;
    call.ensure(!r.name.is_empty(), "name is required")?;
    call.ensure(
        r.name.len() <= 63,
        format!("name {:?} is longer than 63 characters", r.name),
    )?;
    call.ensure(
        is_dns_name(&r.name),
        format!("name {:?} is not DNS-1123 style", r.name),
    )?;
    call.ensure(!r.vendor_version.is_empty(), "vendor_version is required")
}

pub(super) async fn plugin_capabilities(ctx: &mut Ctx) -> Outcome {
    let call = ctx.rpc(GetPluginCapabilitiesRequest {}).await;
    let r = call.value()?;
    for c in &r.capabilities {
        call.ensure(
            c.service_type().is_some() || c.volume_expansion_type().is_some(),
            format!("capability {c:?} is neither a known service nor a volume expansion mode"),
        )?;
    }
    Ok(())
}

pub(super) async fn probe(ctx: &mut Ctx) -> Outcome {
    // A plugin may still be starting: ready=false with OK is allowed, so poll
    // (bounded) until it reports ready.
    for _ in 0..50 {
        let call = ctx.rpc(ProbeRequest {}).await;
        if call.value()?.ready != Some(false) {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    crate::suite::fail("Probe kept answering ready=false for 5 s")
}

/// With controller and node in separate processes, the CO pairs them by
/// plugin name and sends each only its own service's calls.
pub(super) async fn split_endpoints(ctx: &mut Ctx) -> Outcome {
    if !ctx.is_split() {
        return skip("controller and node share one endpoint (no controller endpoint configured)");
    }
    let c = ctx.rpc_on(&ctx.controller, GetPluginInfoRequest {}).await;
    let controller_name = c.value()?.name.clone();
    let n = ctx.rpc_on(&ctx.node, GetPluginInfoRequest {}).await;
    let node_name = &n.value()?.name;
    n.ensure(
        *node_name == controller_name,
        format!(
            "the node endpoint's plugin is {node_name:?} but the controller endpoint's is {controller_name:?}: a CO pairs them by name"
        ),
    )?;
    for (client, side) in [(&ctx.controller, "controller"), (&ctx.node, "node")] {
        let call = ctx.rpc_on(client, ProbeRequest {}).await;
        call.value().map_err(|_| {
            call.failure("OK", format!("Probe on the {side} endpoint must succeed"))
        })?;
    }
    let c = ctx
        .rpc_on(&ctx.controller, GetPluginCapabilitiesRequest {})
        .await;
    let controller_services = services(c.value()?);
    c.ensure(
        controller_services.contains(&PluginCap::ControllerService),
        "the controller endpoint must declare the CONTROLLER_SERVICE plugin capability",
    )?;
    ctx.rpc_on(&ctx.controller, ControllerGetCapabilitiesRequest {})
        .await
        .ok()?;
    ctx.rpc_on(&ctx.node, NodeGetCapabilitiesRequest {})
        .await
        .ok()?;
    // GetPluginCapabilities describes the whole plugin, so every process
    // should give the same set (CSI spec, GetPluginCapabilities). A node
    // process that leaves out what it does not serve is tolerated; one that
    // declares what the controller does not is contradicting it.
    let n = ctx.rpc_on(&ctx.node, GetPluginCapabilitiesRequest {}).await;
    let extra: Vec<&str> = services(n.value()?)
        .into_iter()
        .filter(|s| !controller_services.contains(s))
        .map(|s| s.as_str_name())
        .collect();
    n.ensure(
        extra.is_empty(),
        format!(
            "the node endpoint declares {} but the controller endpoint does not: both describe the same plugin",
            extra.join(", ")
        ),
    )
}

fn services(r: &GetPluginCapabilitiesResponse) -> Vec<PluginCap> {
    r.capabilities
        .iter()
        .filter_map(|c| c.service_type())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::is_dns_name;

    #[test]
    fn dns_names() {
        assert!(is_dns_name("csi.example.com"));
        assert!(is_dns_name("a"));
        assert!(!is_dns_name("-a"));
        assert!(!is_dns_name("a."));
        assert!(!is_dns_name("a_b"));
        assert!(!is_dns_name(""));
    }
}
