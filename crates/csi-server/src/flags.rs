//! The command-line flags every driver takes, its process setup and its
//! exit (feature `flags`): flatten [`DriverFlags`] into the driver's own
//! clap parser, and make `main` [`run_to_exit`] on [`driver_runtime`] with
//! [`Allocator`] as the binary's global allocator.
//!
//! ```
//! use clap::Parser;
//!
//! #[derive(Parser)]
//! struct Config {
//!     #[command(flatten)]
//!     common: csi_server::flags::DriverFlags,
//!     /// Where this driver keeps its state.
//!     #[arg(long, default_value = "/var/lib/my-driver")]
//!     statedir: std::path::PathBuf,
//! }
//!
//! let config = Config::parse_from(["my-driver", "--drivername", "my.csi.example.com"]);
//! let builder = config.common.server(
//!     "default.csi.example.com",
//!     "1.0.0",
//!     &config.statedir.join("csi.sock"),
//! );
//! assert!(builder.is_ok());
//! ```

use std::fmt::Display;
use std::path::Path;
use std::process::ExitCode;

use crate::{PluginInfo, Server, ServerBuilder};

#[cfg(target_os = "linux")]
mod huge_code;
mod runtime;

#[cfg(target_os = "linux")]
pub use huge_code::{CodePages, HUGE_CODE_ENV, move_code_to_huge_pages};
pub use runtime::{Allocator, BLOCKING_THREADS, driver_runtime, limit_malloc_arenas};

/// `--endpoint`, `--nodeid`, `--drivername` and `--log`, with the
/// conventions of the community's drivers (`CSI_ENDPOINT` in the
/// environment, the hostname as node id).
#[derive(Debug, Clone, clap::Args)]
pub struct DriverFlags {
    /// Where to listen (default: csi.sock in the driver's state directory).
    #[arg(long, env = "CSI_ENDPOINT")]
    pub endpoint: Option<String>,
    /// This node's id (default: the hostname).
    #[arg(long)]
    pub nodeid: Option<String>,
    /// The driver's name, as in the CSIDriver object (default: the driver's own).
    #[arg(long)]
    pub drivername: Option<String>,
    /// Log filter: a level, or target=level pairs (RUST_LOG wins when set).
    #[arg(long, default_value = "info")]
    pub log: String,
}

impl DriverFlags {
    /// The node id to report: `--nodeid`, else the hostname.
    pub fn node_id(&self) -> String {
        crate::node_id_or_hostname(self.nodeid.as_deref())
    }

    /// The driver name: `--drivername`, else `default`.
    pub fn driver_name<'a>(&'a self, default: &'a str) -> &'a str {
        self.drivername.as_deref().unwrap_or(default)
    }

    /// The endpoint to serve on: `--endpoint`, else the unix socket `socket`.
    pub fn endpoint_text(&self, socket: &Path) -> String {
        self.endpoint
            .clone()
            .unwrap_or_else(|| format!("unix://{}", socket.display()))
    }

    /// A server builder with the plugin's name and version and the
    /// endpoint; an error names the flag that is wrong.
    pub fn server(
        &self,
        default_name: &str,
        version: &str,
        socket: &Path,
    ) -> Result<ServerBuilder, String> {
        let endpoint = self
            .endpoint_text(socket)
            .parse()
            .map_err(|e| format!("--endpoint: {e}"))?;
        let info = PluginInfo::new(self.driver_name(default_name), version)
            .map_err(|e| format!("--drivername: {e}"))?;
        Ok(Server::builder(info).endpoint(endpoint))
    }
}

/// clap value parser for sizes in bytes or with a Kubernetes suffix
/// (`10Gi`, `1G`), for a driver's own size flags.
pub fn parse_size(text: &str) -> Result<i64, String> {
    csi_proto::size::parse_bytes(text)
        .ok_or_else(|| format!("{text:?} is not a size like 10Gi or 1073741824"))
}

/// The process's exit: success, or the error printed as `program: error`.
pub fn exit_code(program: &str, result: Result<(), impl Display>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{program}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A driver's `main` from its `run`: limits glibc's malloc arenas, builds
/// `runtime` (usually [`driver_runtime`]) with I/O and time enabled, runs
/// `run` on it to the end, and returns [`exit_code`].
pub fn run_to_exit(
    program: &str,
    mut runtime: tokio::runtime::Builder,
    run: impl Future<Output = Result<(), String>>,
) -> ExitCode {
    limit_malloc_arenas();
    // On the heap: a driver's whole run is one large future that block_on
    // moves down its calls by value, onto main-thread stack that stays
    // resident; boxed, only a pointer moves.
    let run = Box::pin(run);
    let result = match runtime.enable_all().build() {
        Ok(runtime) => runtime.block_on(run),
        Err(e) => Err(format!("starting the runtime: {e}")),
    };
    exit_code(program, result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        common: DriverFlags,
    }

    #[test]
    fn defaults_and_bad_flags_name_the_flag() {
        let cli = Cli::parse_from(["d", "--nodeid", "n1"]);
        assert_eq!(cli.common.node_id(), "n1");
        assert_eq!(cli.common.driver_name("x.example.com"), "x.example.com");
        assert_eq!(
            cli.common.endpoint_text(Path::new("/run/d/csi.sock")),
            "unix:///run/d/csi.sock"
        );
        let bad = Cli::parse_from(["d", "--endpoint", "ftp://nowhere"]);
        let err = bad
            .common
            .server("x.example.com", "1", Path::new("/s"))
            .unwrap_err();
        assert!(err.starts_with("--endpoint: "), "{err}");
        let bad = Cli::parse_from(["d", "--drivername", "not a name!"]);
        let err = bad
            .common
            .server("x.example.com", "1", Path::new("/s.sock"))
            .unwrap_err();
        assert!(err.starts_with("--drivername: "), "{err}");
    }

    #[test]
    fn sizes_parse_with_or_without_a_suffix() {
        assert_eq!(parse_size("2Gi"), Ok(2 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("2 apples").is_err());
    }
}
