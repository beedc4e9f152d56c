//! The `cloud-block` CSI driver: `ControllerService` over the provider's API ([`CloudController`]),
//! `NodeService` over the devices it attaches ([`devices`]). The halves share only what the CO
//! carries, so they run apart (`--mode controller`, `--mode node`) or together (`--mode both`).

mod controller;
mod node;

use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use csi_controller::{Config, ControllerService};
use csi_driver::{Capabilities, NodeRpc, PluginService, VolumeExpansion};
use csi_node::{AttachedDevices, NodeHost, NodeInfo, NodeService, NodeServiceBuilder};
use csi_server::{ServeMode, flags::DriverFlags};
use mount_utils::{LinuxMounter, SystemExec};

pub use {controller::CloudController, node::devices};

use crate::{api::GIB, client::HttpProvider, token::TOKEN_ENV, token::Token};

/// The driver's default name (the CSIDriver object's).
pub const DRIVER_NAME: &str = "cloud-block.csi.csi-kit.dev";
/// The topology key whose value is the region.
pub const TOPOLOGY_KEY: &str = "topology.cloud-block.csi-kit.dev/region";
/// Publish context key: the name of the device's stable link.
pub const DEVICE_KEY: &str = "device-name";
/// Publish context key: `block` or `mount`.
pub const ACCESS_KEY: &str = "access";
/// Where the node keeps its record by default.
const NODE_STATE_DIR: &str = "/var/lib/kubelet/plugins/cloud-block.csi.csi-kit.dev/node";

/// The driver's flags. The provider's token comes from `CLOUD_PROVIDER_TOKEN`
/// or `--provider-token-file`, never a flag (the process list shows flags).
#[derive(Debug, Clone, Parser)]
#[command(name = "cloud-block", version)]
pub struct Flags {
    /// Which services to serve: controller, node or both.
    #[arg(long, default_value = "both")]
    pub mode: ServeMode,
    /// Endpoint, node id, driver name and log level.
    #[command(flatten)]
    pub common: DriverFlags,
    /// The provider's API (controller).
    #[arg(long, env = "CLOUD_PROVIDER_URL")]
    pub provider_url: Option<String>,
    /// A file holding the provider's token, e.g. a mounted Secret (controller).
    #[arg(long)]
    pub provider_token_file: Option<PathBuf>,
    /// The region volumes are made in (controller) and this node is in (node).
    #[arg(long, default_value = "dev-1")]
    pub region: String,
    /// Where attached devices' stable links appear (node).
    #[arg(long, default_value = "/dev/disk/by-id")]
    pub device_dir: PathBuf,
    /// Where the node keeps its record of what it staged and published (node).
    #[arg(long, default_value = NODE_STATE_DIR)]
    pub statedir: PathBuf,
    /// Volumes this node may have attached (node; the provider's limit).
    #[arg(long, default_value_t = 7)]
    pub max_volumes_per_node: i64,
    /// How long NodeStage waits for an attached device, in seconds (node).
    #[arg(long, default_value_t = 60)]
    pub device_timeout_secs: u64,
}

/// The controller service over the provider the flags name.
pub fn controller(flags: &Flags) -> Result<ControllerService<CloudController>, String> {
    let url = (flags.provider_url.as_deref())
        .ok_or("--provider-url or CLOUD_PROVIDER_URL is required in controller mode")?;
    let (env, file) = (std::env::var(TOKEN_ENV).ok(), &flags.provider_token_file);
    let token = Token::resolve(env.as_deref(), file.as_deref(), TOKEN_ENV);
    let token = token.map_err(|e| format!("the provider's token: {e}"))?;
    let client = HttpProvider::new(url, token).map_err(|e| format!("--provider-url: {e}"))?;
    let (client, region) = (Arc::new(client), flags.region.clone());
    let backend = CloudController { client, region };
    ControllerService::without_store(controller_config(&flags.region), backend)
}

/// The controller service's configuration for volumes in `region`.
pub fn controller_config(region: &str) -> Config {
    let mut config = Config::new(region);
    config.topology_key = Some(TOPOLOGY_KEY.to_owned());
    // The provider's sizes are whole GiB.
    let gib = GIB as i64;
    (config.default_size, config.mount_unit, config.block_unit) = (gib, gib, gib);
    config.retry.initial = std::time::Duration::from_millis(2); // an action can end in ms
    config
}

/// The node service on the host's devices and mounts; its effects are
/// crash points in test builds (crash-points, armed).
pub fn node(flags: &Flags) -> Result<NodeService<AttachedDevices>, String> {
    let mounter = crash_points::mounter(Arc::new(LinuxMounter::new()));
    let host = NodeHost::new(mounter, crash_points::exec(Arc::new(SystemExec::new())));
    let fs = crash_points::file_system(Arc::new(csi_store::RealFs));
    let node = node_on(flags, host).open_on(fs, &flags.statedir);
    let node = node.map_err(|e| format!("--statedir: {e}"))?;
    node.restore();
    Ok(node)
}

/// The node service as `flags` say, on `host`, to be opened on its state.
pub fn node_on(flags: &Flags, host: NodeHost) -> NodeServiceBuilder<AttachedDevices> {
    let info = NodeInfo::new(flags.common.node_id())
        .max_volumes(flags.max_volumes_per_node)
        .topology(TOPOLOGY_KEY, flags.region.clone());
    let timeout = std::time::Duration::from_secs(flags.device_timeout_secs);
    let backend = Arc::new(node::devices(flags.device_dir.clone()));
    NodeService::builder_on(backend, info, host)
        .volumes(|v| v.device_timeout(timeout).single_node_multi_writer(true))
}

/// Serves what `--mode` says until SIGTERM or SIGINT.
pub async fn run(flags: Flags) -> Result<(), String> {
    let socket = flags.statedir.join("csi.sock");
    let server = (flags.common).server(DRIVER_NAME, env!("CARGO_PKG_VERSION"), &socket)?;
    // GetPluginCapabilities describes the whole plugin, wherever it runs.
    let mut caps = Capabilities::new()
        .plugin(PluginService::ControllerService)
        .plugin(PluginService::VolumeAccessibilityConstraints)
        .volume_expansion(VolumeExpansion::Online);
    let mut server = server.mode(flags.mode).services_elsewhere(true);
    if flags.mode != ServeMode::Node {
        let controller = controller(&flags)?;
        caps = controller.capabilities(caps);
        server = server.controller(Arc::new(controller));
    }
    if flags.mode != ServeMode::Controller {
        use NodeRpc::*;
        let rpcs = [StageUnstageVolume, GetVolumeStats, ExpandVolume];
        caps = caps.node(rpcs).node([SingleNodeMultiWriter]);
        server = server.node(Arc::new(node(&flags)?));
    }
    let server = server.capabilities(caps).build();
    let server = server.map_err(|e| e.to_string())?;
    let (endpoint, mode) = (server.endpoint(), flags.mode);
    tracing::info!(%endpoint, ?mode, region = %flags.region, "cloud-block serving");
    server.serve().await.map_err(|e| e.to_string())
}
