//! `cloud-provider`: the block storage provider as its own process.
//!
//! ```text
//! cloud-provider --listen 127.0.0.1:0 --data-dir /var/lib/cloud --token-file /secret/token
//! cloud-provider --cleanup --data-dir /var/lib/cloud --device-dir /tmp/by-id
//! ```
//!
//! Prints `listening on http://ADDR` on stdout once it accepts connections.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use cloud_block::cloud::Limits;
use cloud_block::provider::{Config, Faults, Provider, cleanup};
use cloud_block::token::{TOKEN_ENV, Token};

/// A DigitalOcean-style block storage provider: volumes are sparse files,
/// an attach is a loop device with a by-id link.
// No Debug: it would print the token.
#[derive(Parser)]
#[command(name = "cloud-provider", version)]
struct Flags {
    /// Address to serve the API on (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: std::net::SocketAddr,
    /// Where the state file, volumes and snapshots live.
    #[arg(long)]
    data_dir: PathBuf,
    /// Where attached volumes' by-id links go.
    #[arg(long, default_value = "/dev/disk/by-id")]
    device_dir: PathBuf,
    /// The bearer token API calls must carry.
    #[arg(long, env = TOKEN_ENV, hide_env_values = true)]
    token: Option<String>,
    /// A file holding the token (a mounted Secret).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Regions volumes can be created in; the first is the default.
    #[arg(long = "region", default_value = "dev-1", value_delimiter = ',')]
    regions: Vec<String>,
    /// Largest volume, in GiB.
    #[arg(long, default_value_t = 16 * 1024)]
    max_size_gigabytes: u64,
    /// Volumes one node may have attached.
    #[arg(long, default_value_t = 7)]
    max_volumes_per_node: usize,
    /// The nodes volumes can be attached to (a cloud's machines); an attach
    /// to another is 404. Empty: any node.
    #[arg(long = "node", value_delimiter = ',')]
    nodes: Vec<String>,
    /// Seed of the fault mode's randomness (reproducible runs).
    #[arg(long, default_value_t = 1)]
    fault_seed: u64,
    #[command(flatten)]
    faults: Faults,
    /// Detach every volume (loop devices and links), record them detached,
    /// and exit; the provider must not be running.
    #[arg(long)]
    cleanup: bool,
    /// Log filter (RUST_LOG overrides it).
    #[arg(long, default_value = "info")]
    log: String,
}

fn main() -> ExitCode {
    let flags = Flags::parse();
    csi_server::init_tracing(&flags.log);
    match run(flags) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cloud-provider: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(flags: Flags) -> Result<(), Box<dyn std::error::Error>> {
    if flags.cleanup {
        let done = cleanup(&flags.data_dir, &flags.device_dir)?;
        println!("detached {} volumes", done.detached);
        return Ok(());
    }
    let token = Token::resolve(
        flags.token.as_deref(),
        flags.token_file.as_deref(),
        TOKEN_ENV,
    )?;
    let provider = Provider::open(Config {
        data_dir: flags.data_dir,
        device_dir: flags.device_dir,
        token,
        limits: Limits {
            regions: flags.regions,
            max_size_gigabytes: flags.max_size_gigabytes,
            max_volumes_per_node: flags.max_volumes_per_node,
            nodes: flags.nodes,
        },
        faults: flags.faults,
        fault_seed: flags.fault_seed,
    })?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        // Before the address is printed: a test may signal as soon as it reads it.
        let stop = stop_signal()?;
        let listener = tokio::net::TcpListener::bind(flags.listen).await?;
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on http://{}", listener.local_addr()?)?;
        out.flush()?;
        drop(out);
        provider.serve(listener, stop).await?;
        tracing::info!("stopped; attachments are kept");
        Ok(())
    })
}

/// Completes on SIGTERM or SIGINT.
fn stop_signal() -> std::io::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}
