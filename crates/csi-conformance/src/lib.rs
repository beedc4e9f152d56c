//! A strict, reusable conformance suite for CSI drivers, run from `cargo test`.
//!
//! Point a [`SuiteConfig`] at a driver's endpoint, run the [`Suite`], and get a
//! [`Report`] with one result per check: the identity, controller, node and
//! group-controller rules of CSI v1.12.0 that a client can observe, including
//! what common suites skip (ABORTED under concurrency, ListVolumes paging,
//! the NodePublish repeat table, the plugin creating and removing target paths,
//! secrets never reaching the driver's log or an error message). Checks
//! follow the driver's advertised capabilities and say why they were
//! skipped. A driver whose controller and node run as separate processes is
//! tested through both sockets ([`SuiteConfig::controller_endpoint`]);
//! secrets per RPC can come from a csi-sanity secrets file
//! ([`Secrets::from_sanity_yaml`]).
//!
//! With the `testing` feature, `fake` holds an in-memory reference driver,
//! built on the csi-driver traits and served by csi-server like any driver:
//! a test double for CO-side code, and, with its `Fault`s, a deliberately
//! broken driver. The suite itself does not need it.
//! [`run_in_process`] runs the whole suite against a driver served in the
//! test's own process, in one call.
//!
//! ```no_run
//! use csi_conformance::{SuiteConfig, run_and_assert};
//!
//! # async fn example() {
//! let config = SuiteConfig::new("unix:///run/csi/csi.sock")
//!     .driver_log("/var/log/my-driver.log")
//!     .skip("controller.list_volumes.paging");
//! // Panics with the full report when any check fails.
//! let report = run_and_assert(config).await;
//! println!("{report}");
//! # }
//! ```
//!
//! Every check id is listed by [`Suite::checks`]; [`Report::to_junit_xml`]
//! renders the result for CI systems.
mod checks;
mod config;
mod discover;
#[cfg(feature = "testing")]
pub mod fake;
mod in_process;
mod report;
mod secrets_file;
mod suite;

pub use config::{
    SecretKind, Secrets, SuiteAccessType, SuiteConfig, Timeouts, from_secrets_file_key,
    secret_kinds, secrets_file_key,
};
pub use report::{CheckResult, Failure, Group, Report, Status};
pub use secrets_file::SecretsFileError;
pub use suite::{CheckInfo, Error, Suite, code_name};

/// Runs the whole suite against a driver in this process, in one call:
/// serves `server` (a csi-server builder with the driver, its capabilities
/// and mode; the endpoint is replaced) on a socket in a temporary directory,
/// runs every check with staging and target directories there, stops the
/// server, and panics with the report when a check failed. Returns the
/// report otherwise.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use csi_conformance::fake::FakeDriver;
///
/// let report = csi_conformance::run_in_process(FakeDriver::new().server_builder()).await;
/// assert!(report.is_success());
/// # }
/// ```
pub async fn run_in_process(server: csi_server::ServerBuilder) -> Report {
    run_in_process_with(server, |config| config).await
}

/// [`run_in_process`] with the suite's [`SuiteConfig`] adjusted by `configure`
/// (skips, focus, access type, parameters, ...).
pub async fn run_in_process_with(
    server: csi_server::ServerBuilder,
    configure: impl FnOnce(SuiteConfig) -> SuiteConfig,
) -> Report {
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => panic!("CSI conformance suite could not run: temporary directory: {e}"),
    };
    let running = match in_process::serve(server, dir).await {
        Ok(r) => r,
        Err(e) => panic!("CSI conformance suite could not run: the driver did not start: {e}"),
    };
    let mut config = SuiteConfig::new(running.endpoint());
    config.staging_dir = running.dir().join("staging");
    config.target_dir = running.dir().join("target");
    let result = Suite::new(configure(config)).run().await;
    running.shutdown().await;
    let report = match result {
        Ok(r) => r,
        Err(e) => panic!("CSI conformance suite could not run: {e}"),
    };
    assert!(report.is_success(), "CSI conformance failures:\n{report}");
    report
}

/// Runs the suite and panics with the report when a check failed or the
/// suite could not run; returns the report otherwise.
pub async fn run_and_assert(config: SuiteConfig) -> Report {
    let report = match Suite::new(config).run().await {
        Ok(r) => r,
        Err(e) => panic!("CSI conformance suite could not run: {e}"),
    };
    assert!(report.is_success(), "CSI conformance failures:\n{report}");
    report
}
