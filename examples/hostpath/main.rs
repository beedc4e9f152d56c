//! hostpath: a complete CSI driver built only on csi-kit's crates.
//!
//! `cargo run --example hostpath` starts it with defaults (endpoint
//! `unix:///var/lib/csi-hostpath/csi.sock`, state in `/var/lib/csi-hostpath`,
//! node id = hostname) and prints them. Volumes are directories (mount
//! access) or sparse image files attached as loop devices (block access);
//! snapshots, clones, expansion, attach tracking, topology, group snapshots
//! and inline ephemeral volumes are supported. See `--help` for the flags.

mod backend;
mod config;
mod driver;
mod group;
mod node;

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use csi_kit::proto::v1::node_service_capability::rpc::Type as NodeRpc;
use csi_kit::server::{Capabilities, Readiness, ServeMode};

use config::{Config, Mode};
use driver::HostPath;

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

// One thread serves gRPC; everything that blocks (mounts, copies, state
// writes) runs on a pool of at most four threads. The async part is far
// from the bottleneck, and 8-worker lifecycle load runs as fast with four
// blocking threads as with 512 (291-295/s vs 295/s on disk) while peak RSS
// drops from 10.1 to 7.7-7.8 MB (docs/benchmarks.md).
const BLOCKING_THREADS: usize = 4;

// dlmalloc, not glibc's malloc: glibc keeps a cache of freed chunks per
// thread, and under 8-worker load those caches fragmented the heap from
// 0.46 to 1.4 MB. With one allocator lock and no thread caches the heap
// stays near 0.2 MB and peak RSS after conformance plus load falls from
// 7.6-7.8 to 6.9-7.0 MB, for 0-5% of the lifecycle rate (docs/benchmarks.md). glibc's
// malloc still serves libc's own allocations (realpath and the like), in
// one arena.
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

fn main() -> ExitCode {
    let config = Config::parse();
    csi_server::init_tracing(&config.common.log);
    // SAFETY: called before any other thread exists.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(BLOCKING_THREADS)
        .build();
    let result = match runtime {
        Ok(rt) => rt.block_on(run(config)),
        Err(e) => Err(format!("starting the runtime: {e}")),
    };
    csi_server::flags::exit_code("hostpath", result)
}

async fn run(config: Config) -> Result<(), String> {
    let mode = match config.mode {
        Mode::Controller => ServeMode::Controller,
        Mode::Node => ServeMode::Node,
        Mode::Both => ServeMode::Both,
    };
    let mounter = Arc::new(csi_kit::mount::LinuxMounter::new());
    let driver = Arc::new(HostPath::open(config.clone(), mounter)?);
    let group_snapshots = driver.backend.consistent_group_snapshots();
    let caps = driver.controller.capabilities(node_capabilities(&config));
    let readiness = Readiness::new();
    let mut builder = config
        .common
        .server(
            Config::DRIVER_NAME,
            env!("CARGO_PKG_VERSION"),
            &config.statedir.join("csi.sock"),
        )?
        .capabilities(caps)
        .mode(mode)
        .identity(driver.clone())
        .controller(Arc::new(driver.controller.clone()))
        .node(driver.node.clone())
        .readiness(readiness.clone());
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
    readiness.set_ready();
    server.serve().await.map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_kit::server::ControllerRpc;

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
        let keys: Vec<&str> = caps
            .accepted_mutable_parameters()
            .unwrap()
            .iter()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, ["iops"]);
        assert!(caps.check().is_ok());
        // No flag: MODIFY_VOLUME accepts only an empty map.
        let none = node_capabilities(&Config::parse_from(["hostpath"]));
        assert!(none.accepted_mutable_parameters().unwrap().is_empty());
    }
}
