//! Command-line flags, following the conventions of the community's
//! hostpath driver, and the defaults that make `cargo run --example
//! hostpath` work with no flags at all.

use std::path::PathBuf;

use clap::Parser;
use csi_server::flags::parse_size;

/// A CSI driver that keeps volumes on the local filesystem, for dev clusters and tests.
#[derive(Debug, Clone, Parser)]
#[command(name = "hostpath", version, about)]
pub struct Config {
    /// --endpoint, --nodeid, --drivername, --log.
    #[command(flatten)]
    pub common: csi_server::flags::DriverFlags,
    /// Where volumes, snapshots and the state file live.
    #[arg(long, default_value = "/var/lib/csi-hostpath")]
    pub statedir: PathBuf,
    /// Where snapshots are kept (default: STATEDIR/snapshots). On another
    /// filesystem than a dedicated state dir, group snapshots are offered:
    /// they freeze the volumes' filesystem while copying (write-order
    /// consistency, which the spec requires of a group snapshot).
    #[arg(long)]
    pub snapshotdir: Option<PathBuf>,
    /// Which services to serve.
    #[arg(long, value_enum, default_value_t = Mode::Both)]
    pub mode: Mode,
    /// Advertise ControllerPublish/Unpublish (attach) and track attachments.
    #[arg(long)]
    pub enable_attach: bool,
    /// Most volumes attached to this node at once (0 = unlimited); also
    /// what NodeGetInfo reports as max_volumes_per_node, as in the Go
    /// csi-driver-host-path, unless --max-volumes-per-node is set.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i64).range(0..))]
    pub attach_limit: i64,
    /// Largest volume the driver creates, in bytes or with a suffix (1Ti, 500Gi).
    #[arg(long, value_parser = parse_size, default_value = "1Ti")]
    pub max_volume_size: i64,
    /// Total capacity the driver hands out (0 = unlimited, reported as free disk space).
    #[arg(long, value_parser = parse_size, default_value = "0")]
    pub capacity: i64,
    /// Report topology (one segment per node) and honour topology requirements.
    #[arg(long)]
    pub enable_topology: bool,
    /// Most volumes NodeGetInfo reports this node can take (0: the
    /// --attach-limit, or the CO decides when that is 0 too).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i64).range(0..))]
    pub max_volumes_per_node: i64,
    /// Mutable parameter names ControllerModifyVolume accepts (repeatable).
    #[arg(long = "accepted-mutable-parameter-name")]
    pub accepted_mutable_parameter_names: Vec<String>,
}

/// Which services this instance serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Controller service only.
    Controller,
    /// Node service only.
    Node,
    /// Both (a single-node dev cluster).
    Both,
}

impl Config {
    /// The driver name reported when --drivername is not given.
    pub const DRIVER_NAME: &str = "hostpath.csi.csi-kit.dev";

    /// NodeGetInfo's max_volumes_per_node: the explicit flag, else the
    /// attach limit (0 = the CO decides).
    pub fn max_volumes_per_node(&self) -> i64 {
        if self.max_volumes_per_node > 0 {
            self.max_volumes_per_node
        } else {
            self.attach_limit
        }
    }
}

/// The topology key this driver reports.
pub const TOPOLOGY_KEY: &str = "topology.hostpath.csi-kit.dev/node";
