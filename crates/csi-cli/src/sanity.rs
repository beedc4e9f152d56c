//! `csi sanity`: the csi-conformance suite against an endpoint, with a plain
//! report on stdout, optional JUnit XML, and a non-zero exit on failure.
//!
//! A driver whose controller and node run as separate processes is tested
//! with `--endpoint` on the node and `--controller-endpoint` on the
//! controller; `--rpc-secrets` takes the per-RPC YAML file csi-sanity's
//! `--csi.secrets` reads.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use csi_conformance::{Secrets, Suite, SuiteConfig, secret_kinds};

use crate::args::{parse_kv, parse_size};

/// Arguments of `csi sanity`.
#[derive(Debug, clap::Args)]
pub struct SanityArgs {
    /// The controller plugin's endpoint when it runs apart from the node
    /// plugin: Identity, Controller and GroupController calls go there,
    /// Node calls to `--endpoint`, and identity is checked on both.
    #[arg(long)]
    controller_endpoint: Option<String>,
    /// Secrets per RPC: a YAML file as csi-sanity's `--csi.secrets` reads
    /// (`NodeStageVolumeSecret:` then indented `key: value` lines, ...).
    /// Replaces `--secrets-file`/`--secrets-env` and the suite's markers.
    #[arg(long, value_name = "FILE")]
    rpc_secrets: Option<PathBuf>,
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
    /// The controller's log file when it runs apart (`--controller-endpoint`),
    /// scanned like `--driver-log`.
    #[arg(long)]
    controller_log: Option<PathBuf>,
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
    config.controller_endpoint = args.controller_endpoint;
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
    if let Some(path) = &args.rpc_secrets {
        // The file's contents are never shown: the error names a line only.
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read secrets file {}: {e}", path.display()))?;
        config.secrets = Secrets::from_sanity_yaml(&text)
            .map_err(|e| format!("secrets file {}: {e}", path.display()))?;
    } else if !secrets.is_empty() {
        let mut s = Secrets::none();
        for kind in secret_kinds() {
            s.set(kind, secrets.clone());
        }
        config.secrets = s;
    }
    config.skip = args.skip;
    config.focus = args.focus;
    config.driver_log = args.driver_log;
    config.controller_log = args.controller_log;
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

#[cfg(test)]
mod tests {
    use clap::Parser;
    use csi_conformance::fake::{FakeDriver, FakeSplitServer, Fault};

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: SanityArgs,
    }

    fn args(extra: &[&str]) -> SanityArgs {
        let argv = std::iter::once("sanity").chain(extra.iter().copied());
        Cli::try_parse_from(argv).expect("valid arguments").args
    }

    /// `csi sanity` against the split endpoints of `server`, with the
    /// secrets file `secrets` and its staging and target directories in
    /// `dirs`.
    async fn run_split(server: &FakeSplitServer, secrets: &str, dirs: &str) -> ExitCode {
        let log = server.log_path().to_string_lossy().into_owned();
        let argv = [
            "--controller-endpoint",
            server.controller_endpoint(),
            "--rpc-secrets",
            secrets,
            "--staging-dir",
            dirs,
            "--target-dir",
            dirs,
            "--driver-log",
            log.as_str(),
        ];
        run(server.node_endpoint(), args(&argv), HashMap::new())
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn split_endpoints_with_a_secrets_file() {
        let dir = tempfile::tempdir().unwrap();
        let server = FakeDriver::new().serve_split().await.unwrap();
        let secrets = dir.path().join("secrets.yaml");
        std::fs::write(
            &secrets,
            "NodeStageVolumeSecret:\n  password: stage-secret-5e21\n",
        )
        .unwrap();
        let dirs = dir.path().to_string_lossy().into_owned();
        let secrets = secrets.to_string_lossy().into_owned();
        let code = run_split(&server, &secrets, &dirs).await;
        assert_eq!(code, ExitCode::SUCCESS);
        let sent = std::fs::read_to_string(server.log_path()).unwrap();
        assert!(sent.contains("NodeStageVolume"), "{sent}");
        server.shutdown().await;

        // The same run against a driver that echoes secrets in errors fails.
        let leaky = FakeDriver::new()
            .with_fault(Fault::LeaksSecretsInErrors)
            .serve_split()
            .await
            .unwrap();
        let code = run_split(&leaky, &secrets, &dirs).await;
        assert_eq!(code, ExitCode::FAILURE);
        leaky.shutdown().await;
    }

    #[tokio::test]
    async fn a_bad_secrets_file_names_the_line_not_the_value() {
        let dir = tempfile::tempdir().unwrap();
        let secrets = dir.path().join("secrets.yaml");
        std::fs::write(&secrets, "NodeStageVolumeSecret:\n  hunter2-value\n").unwrap();
        let secrets = secrets.to_string_lossy().into_owned();
        let err = run(
            "unix:///nonexistent/csi.sock",
            args(&["--rpc-secrets", secrets.as_str()]),
            HashMap::new(),
        )
        .await
        .unwrap_err();
        assert!(err.contains("line 2"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }
}
