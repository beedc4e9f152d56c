//! `csi sanity`: the csi-conformance suite against an endpoint, with a plain
//! report on stdout, optional JUnit XML, and a non-zero exit on failure.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use csi_conformance::{Secrets, Suite, SuiteConfig, secret_kinds};

use crate::args::{parse_kv, parse_size};

/// Arguments of `csi sanity`.
#[derive(Debug, clap::Args)]
pub struct SanityArgs {
    /// Parent of the staging paths the suite creates (default: the temp dir).
    #[arg(long)]
    staging_dir: Option<PathBuf>,
    /// Parent of the target paths the suite creates (default: the temp dir).
    #[arg(long)]
    target_dir: Option<PathBuf>,
    /// Size of each test volume.
    #[arg(long, value_parser = parse_size, default_value = "16Mi")]
    volume_size: i64,
    /// A CreateVolume parameter (repeatable).
    #[arg(long = "param", value_parser = parse_kv)]
    params: Vec<(String, String)>,
    /// A mutable parameter the driver accepts (repeatable), sent with
    /// ControllerModifyVolume besides the empty map every driver must take.
    #[arg(long = "mutable-param", value_parser = parse_kv)]
    mutable_params: Vec<(String, String)>,
    /// Test raw block volumes instead of filesystems.
    #[arg(long)]
    block: bool,
    /// Filesystem type for mount volumes (empty: the driver's default).
    #[arg(long, default_value = "")]
    fs_type: String,
    /// Skip checks by id, group, or `prefix*` (repeatable).
    #[arg(long)]
    skip: Vec<String>,
    /// Run only checks matching (repeatable).
    #[arg(long)]
    focus: Vec<String>,
    /// The driver's log file, scanned for the secrets the suite sent.
    #[arg(long)]
    driver_log: Option<PathBuf>,
    /// Write a JUnit XML report here.
    #[arg(long)]
    junit: Option<PathBuf>,
    /// Prefix of the names of volumes and snapshots the suite creates.
    #[arg(long, default_value = "csi-sanity")]
    test_volume_prefix: String,
    /// List the checks and exit.
    #[arg(long)]
    list: bool,
}

/// Runs the suite; `secrets` (from `--secrets-file`) replace the default
/// per-run markers for every request kind.
pub async fn run(
    endpoint: &str,
    args: SanityArgs,
    secrets: HashMap<String, String>,
) -> Result<ExitCode, String> {
    if args.list {
        for check in Suite::checks() {
            println!("{:<52} {}", check.id, check.description);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut config = SuiteConfig::new(endpoint);
    if let Some(d) = args.staging_dir {
        config.staging_dir = d;
    }
    if let Some(d) = args.target_dir {
        config.target_dir = d;
    }
    config.volume_size = args.volume_size;
    config.parameters = args.params.into_iter().collect();
    config.mutable_parameters = args.mutable_params.into_iter().collect();
    if args.block {
        config = config.block();
    } else {
        config.access_type = csi_conformance::SuiteAccessType::Mount {
            fs_type: args.fs_type,
        };
    }
    if !secrets.is_empty() {
        let mut s = Secrets::none();
        for kind in secret_kinds() {
            s.set(kind, secrets.clone());
        }
        config.secrets = s;
    }
    config.skip = args.skip;
    config.focus = args.focus;
    config.driver_log = args.driver_log;
    config.test_volume_prefix = args.test_volume_prefix;
    let report = Suite::new(config).run().await.map_err(|e| e.to_string())?;
    print!("{report}");
    if let Some(path) = &args.junit {
        report
            .write_junit(path)
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    Ok(if report.is_success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
