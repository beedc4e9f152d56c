//! hostpath: a complete CSI driver built only on csi-kit's crates.
//!
//! The package is the driver's library (its backend, node side and the
//! [`HostPath`] value that holds both) and the `hostpath` binary over it,
//! [`main`]. Tests and simulators build the driver in-process over their own
//! seams with [`HostPath::open_with`] (a fake mounter and loop devices) and
//! call its [`controller`](HostPath::controller) and
//! [`node`](HostPath::node) services directly, or serve it with [`serve`].
//!
//! ```
//! use clap::Parser;
//! use csi_node::testing::FakeHost;
//!
//! let (dir, host) = (tempfile::tempdir().unwrap(), FakeHost::new());
//! let statedir = dir.path().to_str().unwrap();
//! let config = hostpath::Config::parse_from(["hostpath", "--statedir", statedir, "--nodeid", "n1"]);
//! let driver = hostpath::HostPath::open_with(config, host.mounter(), host.loops()).unwrap();
//! assert_eq!(driver.node_id, "n1");
//! ```
//!
//! `cargo run --example hostpath` starts it with defaults (endpoint
//! `unix:///var/lib/csi-hostpath/csi.sock`, state in `/var/lib/csi-hostpath`,
//! node id = hostname) and prints them. Volumes are directories (mount
//! access) or sparse image files attached as loop devices (block access);
//! snapshots, clones, expansion, attach tracking, topology, group snapshots
//! and inline ephemeral volumes are supported. See `--help` for the flags.

pub mod backend;
pub mod config;
pub mod driver;
mod group;
pub mod node;

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use csi_proto::v1::node_service_capability::rpc::Type as NodeRpc;
use csi_server::{Capabilities, Readiness, ServeMode};

pub use config::{Config, Mode};
pub use driver::HostPath;

/// The node's capabilities, from the flags (the controller service adds
/// what its backend offers).
fn node_capabilities(config: &Config) -> Capabilities {
    Capabilities::new()
        .node([
            NodeRpc::StageUnstageVolume,
            NodeRpc::GetVolumeStats,
            NodeRpc::ExpandVolume,
            NodeRpc::VolumeCondition,
            NodeRpc::SingleNodeMultiWriter,
        ])
        // The server rejects any other key before the driver sees it.
        .mutable_parameters(config.accepted_mutable_parameter_names.iter().cloned())
}

/// The `hostpath` program: parses the flags, serves until SIGTERM or SIGINT
/// and reports a failure on stderr in the exit code.
pub fn main() -> ExitCode {
    let config = Config::parse();
    csi_server::init_tracing(&config.common.log);
    // On the host's mounts and loop devices.
    let mounter = Arc::new(mount_utils::LinuxMounter::new());
    let run = async { serve(config.clone(), Arc::new(HostPath::open(config, mounter)?)).await };
    csi_server::flags::run_to_exit("hostpath", csi_server::flags::driver_runtime(), run)
}

/// Serves `driver` at the flags' endpoint: reconciles its state, then
/// serves while the node's volumes are restored (Probe is ready after).
pub async fn serve(config: Config, driver: Arc<HostPath>) -> Result<(), String> {
    let mode = match config.mode {
        Mode::Controller => ServeMode::Controller,
        Mode::Node => ServeMode::Node,
        Mode::Both => ServeMode::Both,
    };
    let group_snapshots = driver.backend.consistent_group_snapshots();
    let caps = driver.controller.capabilities(node_capabilities(&config));
    let socket = config.statedir.join("csi.sock");
    let version = env!("CARGO_PKG_VERSION");
    let mut builder = (config
        .common
        .server(Config::DRIVER_NAME, version, &socket)?)
    .capabilities(caps)
    .mode(mode)
    .identity(driver.clone())
    .controller(Arc::new(driver.controller.clone()))
    .node(driver.node.clone())
    .readiness(Readiness::new());
    if group_snapshots {
        builder = builder.group_controller(Arc::new(driver.controller.clone()));
    }
    let server = builder.build().map_err(|e| e.to_string())?;
    println!(
        "hostpath driver {} {}",
        config.common.driver_name(Config::DRIVER_NAME),
        env!("CARGO_PKG_VERSION")
    );
    println!("  endpoint: {}", server.endpoint());
    println!("  state dir: {}", config.statedir.display());
    println!(
        "  directory volume capacity: {}",
        if driver.backend.quotas() {
            "enforced with project quotas"
        } else {
            "advisory (the state dir's filesystem has no project quotas)"
        }
    );
    println!(
        "  group snapshots: {}",
        if group_snapshots {
            "on (the state dir's filesystem is frozen while a group is copied)"
        } else {
            "off (needs --statedir on a dedicated filesystem and --snapshotdir on another)"
        }
    );
    println!("  node id: {}", driver.node_id);
    println!(
        "  mode: {:?}, attach: {}, topology: {}",
        config.mode, config.enable_attach, config.enable_topology
    );
    driver
        .reconcile_on_start()
        .await
        .map_err(|e| format!("reconciling state: {e}"))?;
    // Serves at once and restores the node's volumes meanwhile: Probe
    // answers not ready, and a call on a volume not yet restored is
    // ABORTED, until the restore has finished.
    let restored = driver.node.restore_in_background();
    let restored =
        async { (restored.await.map(drop)).map_err(|e| format!("restoring node volumes: {e}")) };
    (server.serve_ready_after(restored).await).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_server::ControllerRpc;

    #[test]
    fn attach_limit_is_reported_and_mutable_keys_are_declared() {
        let config = Config::parse_from([
            "hostpath",
            "--attach-limit=4",
            "--accepted-mutable-parameter-name=iops",
        ]);
        assert_eq!(config.max_volumes_per_node(), 4);
        let explicit =
            Config::parse_from(["hostpath", "--attach-limit=4", "--max-volumes-per-node=9"]);
        assert_eq!(explicit.max_volumes_per_node(), 9);
        assert_eq!(Config::parse_from(["hostpath"]).max_volumes_per_node(), 0);
        assert!(Config::try_parse_from(["hostpath", "--attach-limit=-1"]).is_err());
        let caps = node_capabilities(&config).controller([ControllerRpc::ModifyVolume]);
        let keys = caps.accepted_mutable_parameters().unwrap();
        assert!(keys.len() == 1 && keys.contains("iops"), "{keys:?}");
        assert!(caps.check().is_ok());
        // No flag: MODIFY_VOLUME accepts only an empty map.
        let none = node_capabilities(&Config::parse_from(["hostpath"]));
        assert!(none.accepted_mutable_parameters().unwrap().is_empty());
    }
}
