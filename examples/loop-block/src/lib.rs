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
//! The package is the driver's library (its backend, node side and the
//! [`LoopBlock`] value that holds both) and the `loop-block` binary over it,
//! [`main`]. Tests and simulators build the driver in-process over their own
//! seams with [`LoopBlock::open_with`] and call its services directly, or
//! serve it with [`serve`].
//!
//! ```
//! use std::sync::Arc;
//!
//! use clap::Parser;
//! use csi_node::testing::FakeHost;
//!
//! let (dir, host) = (tempfile::tempdir().unwrap(), FakeHost::new());
//! let statedir = dir.path().to_str().unwrap();
//! let config = loop_block::Config::parse_from(["loop-block", "--statedir", statedir, "--nodeid", "n1"]);
//! let exec = Arc::new(mount_utils::FakeExec::new());
//! let driver = loop_block::LoopBlock::open_with(config, host.mounter(), host.loops(), exec).unwrap();
//! assert!(driver.controller.is_some() && driver.node.is_some());
//! ```
//!
//! `cargo run --example loop-block` starts it with defaults (endpoint
//! `unix:///var/lib/csi-loop-block/csi.sock`, state and backing files in
//! `/var/lib/csi-loop-block`, node id = hostname) and prints them. It needs
//! root (loop devices, mounts). See `--help` for the flags.
//!
//! Controller and node also run apart, as production drivers do:
//! `--mode controller` and `--mode node`, each with its own `--statedir`
//! and endpoint, the same `--datadir` (the disks, as a node would see a
//! network disk). The node then learns everything from the publish context
//! ([`context`]).

pub mod backend;
pub mod config;
pub mod context;
pub mod driver;
pub mod group;
pub mod node;
pub mod tuning;

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use csi_server::Readiness;

pub use config::Config;
pub use driver::LoopBlock;

/// The `loop-block` program: parses the flags, serves until SIGTERM or
/// SIGINT and reports a failure on stderr in the exit code.
pub fn main() -> ExitCode {
    let config = Config::parse();
    csi_server::init_tracing(&config.common.log);
    let run = async {
        // On the host's mounts, loop devices and programs (mkfs, fsck).
        let driver = LoopBlock::open(config.clone(), Arc::new(mount_utils::LinuxMounter::new()))?;
        serve(config, Arc::new(driver)).await
    };
    csi_server::flags::run_to_exit("loop-block", csi_server::flags::driver_runtime(), run)
}

/// Serves `driver` at the flags' endpoint: reconciles its state, then
/// serves while the node's volumes are restored (Probe is ready after).
pub async fn serve(config: Config, driver: Arc<LoopBlock>) -> Result<(), String> {
    let socket = config.statedir.join("csi.sock");
    let name = Config::DRIVER_NAME;
    let mut builder = (config
        .common
        .server(name, env!("CARGO_PKG_VERSION"), &socket)?)
    .capabilities(driver.capabilities())
    .mode(config.mode)
    .identity(driver.clone())
    .readiness(Readiness::new());
    if let Some(controller) = &driver.controller {
        builder = builder
            .controller(Arc::new(controller.clone()))
            .group_controller(Arc::new(controller.clone()));
    }
    if let Some(node) = &driver.node {
        builder = builder.node(node.clone());
    }
    let server = builder.build().map_err(|e| e.to_string())?;
    println!(
        "loop-block driver {} {}",
        config.common.driver_name(Config::DRIVER_NAME),
        env!("CARGO_PKG_VERSION")
    );
    println!("  endpoint: {}", server.endpoint());
    println!("  backing dir: {}", driver.backend.volumes_dir().display());
    println!("  state dir: {}", config.statedir.display());
    println!("  mode: {:?}", config.mode);
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
    // Before serving: thaw what a crash left frozen, settle the controller.
    driver
        .reconcile_on_start()
        .await
        .map_err(|e| format!("reconciling state: {e}"))?;
    // Serves at once and restores the node's volumes meanwhile: Probe
    // answers not ready, and a call on a volume not yet restored is
    // ABORTED, until the restore has finished.
    let restored = (driver.node.as_ref()).map(|node| node.restore_in_background());
    let restored = async {
        match restored {
            Some(restored) => restored.await.map(drop),
            None => Ok(()),
        }
    };
    let restored = async { (restored.await).map_err(|e| format!("restoring node volumes: {e}")) };
    (server.serve_ready_after(restored).await).map_err(|e| e.to_string())
}
