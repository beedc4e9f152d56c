//! Command-line flags, the same as hostpath's where they apply, with
//! defaults that make `cargo run --example loop-block` work with no flags.

use std::path::PathBuf;

use clap::Parser;
use csi_server::ServeMode;
use csi_server::flags::parse_size;

const AFTER_HELP: &str = "\
Mutable parameters (VolumeAttributesClass / ControllerModifyVolume):
  readAheadKiB=0..65536   read-ahead of the disk's loop device
  directIO=true|false     the loop device bypasses the host's page cache
Applied when the node attaches the disk, and at once to a disk attached here.

Group snapshots freeze the members' filesystems while they are copied; a
member attached as a raw block device cannot be frozen and is refused
(FAILED_PRECONDITION).";

/// A block-storage CSI driver whose disks are sparse files attached as loop devices.
#[derive(Debug, Clone, Parser)]
#[command(name = "loop-block", version, about, after_help = AFTER_HELP)]
pub struct Config {
    /// --endpoint, --nodeid, --drivername, --log.
    #[command(flatten)]
    pub common: csi_server::flags::DriverFlags,
    /// Where this process keeps its records (the controller's volumes, the
    /// node's stages and publications), and by default the disks.
    #[arg(long, default_value = "/var/lib/csi-loop-block")]
    pub statedir: PathBuf,
    /// Where the backing files and snapshots live (default: the state
    /// dir). A controller and a node run apart share it, as a node sees a
    /// network disk; each keeps its own --statedir.
    #[arg(long)]
    pub datadir: Option<PathBuf>,
    /// Which services to serve: controller, node or both.
    #[arg(long, default_value = "both")]
    pub mode: ServeMode,
    /// Largest volume the driver creates, in bytes or with a suffix (1Ti, 500Gi).
    #[arg(long, value_parser = parse_size, default_value = "1Ti")]
    pub max_volume_size: i64,
    /// Most volumes attached to this node at once: reported by NodeGetInfo
    /// (max_volumes_per_node) and enforced by ControllerPublishVolume
    /// (RESOURCE_EXHAUSTED). 0 = no limit (the CO decides).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i64).range(0..))]
    pub attach_limit: i64,
}

impl Config {
    /// The driver name reported when --drivername is not given.
    pub const DRIVER_NAME: &str = "loop-block.csi.csi-kit.dev";

    /// Where the backing files and snapshots live.
    pub fn data_dir(&self) -> PathBuf {
        self.datadir
            .clone()
            .unwrap_or_else(|| self.statedir.clone())
    }

    /// Whether this process serves the Controller service.
    pub fn serves_controller(&self) -> bool {
        self.mode != ServeMode::Node
    }

    /// Whether this process serves the Node service.
    pub fn serves_node(&self) -> bool {
        self.mode != ServeMode::Controller
    }
}

#[cfg(test)]
impl Config {
    /// One process's flags for the tests: `mode` on node `n1`.
    pub(crate) fn for_test(mode: &str, statedir: &str, datadir: &str) -> Config {
        let dirs = ["--statedir", statedir, "--datadir", datadir];
        let args = ["loop-block", "--mode", mode, "--nodeid", "n1"];
        Config::parse_from(args.into_iter().chain(dirs))
    }
}
