//! The conformance suite against the hostpath example over a real unix
//! socket, as root, with real bind mounts and loop devices: mount and block
//! access, with attach enabled and disabled. Nothing the driver advertises
//! may be skipped, and the driver's log must not contain any secret.
//!
//! The attach-enabled runs keep the state on a dedicated filesystem with
//! snapshots elsewhere, the layout in which hostpath offers (frozen,
//! write-order consistent) group snapshots; the other runs use the default
//! layout, where the group service is not offered.

use e2e_support as support;

use csi_conformance::Report;
use mount_utils::require_root;
use mount_utils::testing::ScratchFilesystem;
use support::{Driver, mounts_under, run_isolated};

/// The driver under test, built by cargo for this package's tests.
const HOSTPATH: &str = env!("CARGO_BIN_EXE_hostpath");

async fn run_suite(block: bool, attach: bool) -> Report {
    let dir = tempfile::tempdir().expect("tempdir");
    let snapshots = dir.path().join("snapshots");
    let (scratch, statedir) = if attach {
        let fs = ScratchFilesystem::new(dir.path(), "state", 512 << 20, "ext4")
            .expect("state filesystem");
        let path = fs.path().to_owned();
        (Some(fs), path)
    } else {
        (None, dir.path().join("state"))
    };
    let snapshot_arg = format!("--snapshotdir={}", snapshots.display());
    // A VolumeAttributesClass key, as csi-sanity is run with one.
    let mut args = vec!["--accepted-mutable-parameter-name=iops"];
    if attach {
        // The attach limit is NodeGetInfo's max_volumes_per_node too.
        args.extend([
            "--enable-attach",
            "--enable-topology",
            "--attach-limit=8",
            &snapshot_arg,
        ]);
    }
    let driver = Driver::start(HOSTPATH, &statedir, &args);
    driver.client().await;
    let mut config = driver.suite_config(dir.path());
    config.volume_size = 16 << 20;
    config.mutable_parameters = [("iops".to_owned(), "3000".to_owned())].into();
    if block {
        config = config.block();
    }
    let report = driver.run_suite(config).await;
    // Everything but the scratch filesystem holding the state must be gone.
    let leftover: Vec<_> = mounts_under(dir.path())
        .into_iter()
        .filter(|m| scratch.is_none() || *m != statedir)
        .collect();
    assert!(
        leftover.is_empty(),
        "mounts left after the suite: {leftover:?}"
    );
    report
}

/// Skips expected without attach and with the default layout.
fn allowed_skip(check: &str) -> bool {
    [
        "controller.publish",
        "controller.unpublish",
        "group-controller.",
    ]
    .iter()
    .any(|p| check.starts_with(p))
}

/// The checks skipped in a run, with their reasons (but the split-endpoint
/// check, which a plugin served on one endpoint never runs).
fn skipped(report: &Report) -> Vec<String> {
    report
        .results
        .iter()
        .filter(|r| r.id != "identity.split_endpoints")
        .filter_map(|r| match &r.status {
            csi_conformance::Status::Skipped(why) => Some(format!("{}: {why}", r.id)),
            _ => None,
        })
        .collect()
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn hostpath_mount_access_without_attach() {
    require_root!("hostpath_mount_access_without_attach");
    run_isolated("hostpath-mount", || async {
        let report = run_suite(false, false).await;
        // Only attach and group checks may be skipped: neither is offered.
        for s in skipped(&report) {
            assert!(allowed_skip(&s), "unexpected skip {s}");
        }
    });
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn hostpath_mount_access_with_attach() {
    require_root!("hostpath_mount_access_with_attach");
    run_isolated("hostpath-mount-attach", || async {
        let report = run_suite(false, true).await;
        assert_eq!(skipped(&report), Vec::<String>::new());
    });
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn hostpath_block_access_without_attach() {
    require_root!("hostpath_block_access_without_attach");
    run_isolated("hostpath-block", || async {
        let report = run_suite(true, false).await;
        for s in skipped(&report) {
            assert!(allowed_skip(&s), "unexpected skip {s}");
        }
    });
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn hostpath_block_access_with_attach() {
    require_root!("hostpath_block_access_with_attach");
    run_isolated("hostpath-block-attach", || async {
        let report = run_suite(true, true).await;
        assert_eq!(skipped(&report), Vec::<String>::new());
    });
}
