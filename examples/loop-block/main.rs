//! loop-block: a block-storage CSI driver whose disks are sparse files
//! attached as loop devices — the shape of every cloud-disk or SAN driver,
//! runnable on one Linux machine.
//!
//! The controller creates, snapshots (sparse/reflinked copies), clones,
//! grows and deletes backing files, and ControllerPublish records the
//! attachment to a node and hands it the backing file in the publish context
//! (a cloud driver would call its attach API and return the device). The
//! node attaches the file as a loop device (the disk appearing), formats it
//! on first use, mounts it at the staging path and bind-mounts it into
//! targets, or exposes the raw device for block access; NodeExpandVolume
//! refreshes the loop device's size and grows the filesystem online.
//! ControllerModifyVolume changes the disk's read-ahead and direct I/O
//! ([`tuning`]); group snapshots freeze the members' filesystems ([`group`]);
//! `--attach-limit` caps the disks attached to the node.
//!
//! `cargo run --example loop-block` starts it with defaults (endpoint
//! `unix:///var/lib/csi-loop-block/csi.sock`, state and backing files in
//! `/var/lib/csi-loop-block`, node id = hostname) and prints them. It needs
//! root (loop devices, mounts). See `--help` for the flags.

mod backend;
mod config;
mod driver;
mod group;
mod node;
mod tuning;

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use csi_kit::proto::v1::node_service_capability::rpc::Type as NodeRpc;
use csi_kit::server::{Capabilities, Readiness};

use config::Config;
use driver::LoopBlock;

/// What the driver advertises: the node's capabilities here, the
/// controller's from what its backend offers.
fn capabilities(driver: &LoopBlock) -> Capabilities {
    let node = Capabilities::new().node([
        NodeRpc::StageUnstageVolume,
        NodeRpc::GetVolumeStats,
        NodeRpc::ExpandVolume,
        NodeRpc::SingleNodeMultiWriter,
    ]);
    driver.controller.capabilities(node)
}

#[tokio::main]
async fn main() -> ExitCode {
    let config = Config::parse();
    csi_server::init_tracing(&config.common.log);
    csi_server::flags::exit_code("loop-block", run(config).await)
}

async fn run(config: Config) -> Result<(), String> {
    let mounter = Arc::new(csi_kit::mount::LinuxMounter::new());
    let driver = Arc::new(LoopBlock::open(config.clone(), mounter)?);
    let readiness = Readiness::new();
    let server = config
        .common
        .server(
            Config::DRIVER_NAME,
            env!("CARGO_PKG_VERSION"),
            &config.statedir.join("csi.sock"),
        )?
        .capabilities(capabilities(&driver))
        .identity(driver.clone())
        .controller(Arc::new(driver.controller.clone()))
        .group_controller(Arc::new(driver.controller.clone()))
        .node(driver.node.clone())
        .readiness(readiness.clone())
        .build()
        .map_err(|e| e.to_string())?;
    println!(
        "loop-block driver {} {}",
        config.common.driver_name(Config::DRIVER_NAME),
        env!("CARGO_PKG_VERSION")
    );
    println!("  endpoint: {}", server.endpoint());
    println!("  backing dir: {}", driver.backend.volumes_dir().display());
    println!("  state dir: {}", config.statedir.display());
    println!("  node id: {}", driver.node_id);
    println!(
        "  attach limit: {}",
        match config.attach_limit {
            0 => "none (the CO decides)".to_owned(),
            n => format!("{n} volumes"),
        }
    );
    println!(
        "  mutable parameters: {}, {}{}",
        tuning::READ_AHEAD_KEY,
        tuning::DIRECT_IO_KEY,
        if driver.direct_io_supported {
            ""
        } else {
            " (directIO=true refused: the backing files' filesystem has no O_DIRECT)"
        }
    );
    // Before serving: a staged volume must have its disk back first.
    driver
        .reconcile_on_start()
        .await
        .map_err(|e| format!("reconciling state: {e}"))?;
    readiness.set_ready();
    server.serve().await.map_err(|e| e.to_string())
}
