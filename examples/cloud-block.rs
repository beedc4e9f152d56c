//! `cargo run --example cloud-block`: a one-machine dev setup of the
//! cloud-block driver (package `examples/cloud-block`). The provider is
//! served in this process on a loopback port with a fresh random token, and
//! the driver runs in `--mode both` against it; the provider's disks, the
//! by-id links and the node's record all live under `--dir`. Needs root
//! (loop devices, mounts). A cluster runs the `cloud-provider` and
//! `cloud-block` binaries instead.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use cloud_block::cloud::Limits;
use cloud_block::driver::Flags;
use cloud_block::provider::{Config, Faults, Provider};
use cloud_block::token::Token;

/// A dev setup of the cloud-block CSI driver in one process: the block
/// storage provider on a loopback port and the driver in `--mode both`
/// against it, everything under `--dir`. Arguments after `--` go to the
/// driver (see the `cloud-block` binary's --help), e.g. `-- --endpoint
/// unix:///tmp/csi.sock`.
#[derive(Parser)]
#[command(name = "cloud-block (dev setup)", version)]
struct DevFlags {
    /// Where the provider's disks, the by-id links and the driver's state
    /// (its socket too, unless the driver gets --endpoint) live.
    #[arg(long, default_value = "/var/lib/csi-cloud-block-dev")]
    dir: PathBuf,
    /// Flags for the driver.
    #[arg(last = true)]
    driver: Vec<String>,
}

fn main() -> ExitCode {
    let dev = DevFlags::parse();
    let runtime = tokio::runtime::Runtime::new();
    let result = match runtime {
        Ok(rt) => rt.block_on(run(dev)),
        Err(e) => Err(format!("starting the runtime: {e}")),
    };
    csi_server::flags::exit_code("cloud-block", result)
}

/// Writes a new random token, readable by the owner only.
fn write_token(path: &Path) -> Result<Token, String> {
    let text = uuid::Uuid::new_v4().simple().to_string();
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()).map(|()| f));
    file.as_mut()
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    Token::new(&text, "the dev token").map_err(|e| e.to_string())
}

async fn run(dev: DevFlags) -> Result<(), String> {
    let (provider_dir, by_id) = (dev.dir.join("provider"), dev.dir.join("by-id"));
    for dir in [&provider_dir, &by_id] {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    let token_file = dev.dir.join("token");
    let provider = Provider::open(Config {
        data_dir: provider_dir,
        device_dir: by_id.clone(),
        token: write_token(&token_file)?,
        limits: Limits::default(),
        faults: Faults::default(),
        fault_seed: 1,
    })
    .map_err(|e| format!("starting the provider: {e}"))?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await;
    let listener = listener.map_err(|e| format!("binding the provider: {e}"))?;
    let url = format!(
        "http://{}",
        listener.local_addr().map_err(|e| e.to_string())?
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(provider.serve(listener, async {
        let _ = stopped.await;
    }));
    println!("provider: {url}, data in {}", dev.dir.display());

    let mut args: Vec<String> = ["cloud-block", "--mode", "both"].map(String::from).into();
    for (flag, value) in [
        ("--statedir", dev.dir.join("node")),
        ("--device-dir", by_id),
        ("--provider-token-file", token_file),
    ] {
        args.extend([flag.to_owned(), value.display().to_string()]);
    }
    args.extend(["--provider-url".to_owned(), url]);
    args.extend(dev.driver);
    let flags = Flags::try_parse_from(args).map_err(|e| e.to_string())?;
    csi_server::init_tracing(&flags.common.log);
    let result = cloud_block::driver::run(flags).await;
    let _ = stop.send(());
    match serving.await {
        Ok(Ok(())) => result,
        Ok(Err(e)) => result.and(Err(format!("provider: {e}"))),
        Err(e) => result.and(Err(format!("provider: {e}"))),
    }
}
