//! A strict, reusable conformance suite for CSI drivers, run from `cargo test`.
//!
//! Point a [`Config`] at a driver's endpoint, run the [`Suite`], and get a
//! [`Report`] with one result per check: the identity, controller, node and
//! group-controller rules of CSI v1.12.0 that a client can observe, including
//! what common suites skip (ABORTED under concurrency, ListVolumes paging,
//! the NodePublish repeat table, the plugin creating and removing target paths,
//! secrets never reaching the driver's log). Checks follow the driver's
//! advertised capabilities and say why they were skipped.
//!
//! [`mock`] holds an in-memory reference driver: a test double for CO-side
//! code, and, with [`mock::Fault`]s, a deliberately broken driver.
//!
//! ```no_run
//! use csi_conformance::{Config, run_and_assert};
//!
//! # async fn example() {
//! let config = Config::new("unix:///run/csi/csi.sock")
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
#![warn(missing_docs)]

mod checks;
mod config;
pub mod mock;
mod report;
mod suite;

pub use config::{
    AccessType, Config, SecretKind, Secrets, Timeouts, from_secrets_file_key, secret_kinds,
    secrets_file_key,
};
pub use report::{CheckResult, Failure, Group, Report, Status};
pub use suite::{CheckInfo, Error, Suite, code_name};

/// Runs the suite and panics with the report when a check failed or the
/// suite could not run; returns the report otherwise.
pub async fn run_and_assert(config: Config) -> Report {
    let report = match Suite::new(config).run().await {
        Ok(r) => r,
        Err(e) => panic!("CSI conformance suite could not run: {e}"),
    };
    assert!(report.is_success(), "CSI conformance failures:\n{report}");
    report
}
