//! The suite against the in-memory reference driver: clean in both access
//! types, and each fault caught by the check meant to catch it.

use csi_conformance::fake::{FakeDriver, FakeServer, Fault};
use csi_conformance::{Report, Status, Suite, SuiteConfig, run_and_assert};

struct Env {
    server: FakeServer,
    dirs: tempfile::TempDir,
}

async fn start(driver: FakeDriver) -> Env {
    Env {
        server: driver.serve().await.expect("fake driver serves"),
        dirs: tempfile::tempdir().expect("tempdir"),
    }
}

fn config(env: &Env) -> SuiteConfig {
    let mut c = SuiteConfig::new(env.server.endpoint()).driver_log(env.server.log_path());
    c.staging_dir = env.dirs.path().join("staging");
    c.target_dir = env.dirs.path().join("target");
    // A VolumeAttributesClass the fake accepts, as a vendor configures one.
    c.mutable_parameters = [("iops".to_owned(), "3000".to_owned())].into();
    c
}

/// Everything passed but the split-endpoint check, which needs two endpoints
/// (tests/split_endpoints.rs).
fn assert_all_passed(report: &Report) {
    assert!(report.is_success(), "{report}");
    let skipped = report.skipped_ids();
    assert_eq!(
        skipped,
        ["identity.split_endpoints"],
        "nothing else the fake driver advertises may be skipped:\n{report}"
    );
    assert_eq!(report.passed(), Suite::checks().len() - 1, "{report}");
}

/// The parent directories the suite made must be gone again.
fn assert_dirs_empty(env: &Env) {
    for sub in ["staging", "target"] {
        let left: Vec<_> = std::fs::read_dir(env.dirs.path().join(sub))
            .expect("dir exists")
            .collect();
        assert!(left.is_empty(), "{sub} not cleaned up: {left:?}");
    }
}

#[tokio::test]
async fn mount_mode_passes_everything() {
    let env = start(FakeDriver::new()).await;
    let report = run_and_assert(config(&env)).await;
    assert_all_passed(&report);
    assert_dirs_empty(&env);
    assert!(
        report
            .plugin
            .as_deref()
            .unwrap_or("")
            .starts_with("fake.csi.example.com")
    );
    let text = report.to_string();
    assert!(text.contains("PASS  node.publish.repeat_table"), "{text}");
    assert!(text.contains("0 failed, 1 skipped"), "{text}");
}

#[tokio::test]
async fn block_mode_passes_everything() {
    let env = start(FakeDriver::new()).await;
    let report = run_and_assert(config(&env).block()).await;
    assert_all_passed(&report);
    assert_dirs_empty(&env);
}

#[tokio::test]
async fn without_staging_the_node_checks_still_pass() {
    let env = start(FakeDriver::new().without_stage_unstage()).await;
    let report = run_and_assert(config(&env)).await;
    let skipped = report.skipped_ids();
    assert_eq!(
        skipped,
        [
            "identity.split_endpoints",
            "node.stage.missing_fields",
            "node.stage.idempotent"
        ]
    );
    match &report.get("node.stage.idempotent").unwrap().status {
        Status::Skipped(reason) => assert!(reason.contains("STAGE_UNSTAGE_VOLUME"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

/// Runs the suite against a faulty driver and returns the failure text of `id`.
async fn failure_of(fault: Fault, id: &str) -> (Report, String) {
    let env = start(FakeDriver::new().with_fault(fault)).await;
    let report = Suite::new(config(&env)).run().await.expect("suite runs");
    let result = report.get(id).unwrap_or_else(|| panic!("no check {id}"));
    let text = match &result.status {
        Status::Failed(f) => f.to_string(),
        other => panic!("{fault:?}: expected {id} to fail, got {other:?}\n{report}"),
    };
    (report, text)
}

/// A fault the suite must catch: the check meant to catch it, what that
/// check's failure says, and the other checks that fail with it.
struct Caught {
    fault: Fault,
    by: &'static str,
    says: &'static [&'static str],
    also: &'static [&'static str],
    /// No check outside `by` and `also` may fail.
    only: bool,
}

const CAUGHT: &[Caught] = &[
    Caught {
        fault: Fault::WrongCodeForMissingVolume,
        by: "controller.validate_volume_capabilities.missing_volume",
        says: &[
            "ValidateVolumeCapabilities",
            "expected: NOT_FOUND",
            "actual:   INTERNAL",
            "request:  ValidateVolumeCapabilitiesRequest",
        ],
        also: &[
            "controller.get_volume.missing_volume",
            "controller.publish.missing_volume",
            "controller.expand_volume.missing_volume",
            "controller.modify_volume.missing_volume",
            "node.expand_volume.missing_volume",
        ],
        only: false,
    },
    Caught {
        fault: Fault::NoPaging,
        by: "controller.list_volumes.paging",
        says: &["ListVolumes", "max_entries is 2"],
        also: &["snapshot.list.paging"],
        only: false,
    },
    Caught {
        fault: Fault::NoTargetCleanup,
        by: "node.publish.lifecycle",
        says: &["NodeUnpublishVolume", "must delete the target_path"],
        also: &[],
        only: false,
    },
    Caught {
        fault: Fault::NoRepeatTable,
        by: "node.publish.repeat_table",
        says: &[
            "NodePublishVolume",
            "expected: FAILED_PRECONDITION",
            "actual:   OK",
        ],
        also: &[],
        only: false,
    },
    // The answers csi-sanity expects, each fault caught by its own check.
    Caught {
        fault: Fault::StagingCheckedFirst,
        by: "node.publish.missing_fields_without_staging",
        says: &[
            "NodePublishVolume",
            "expected: INVALID_ARGUMENT",
            "actual:   FAILED_PRECONDITION",
        ],
        also: &[],
        only: true,
    },
    Caught {
        fault: Fault::RelativeVolumePathInvalid,
        by: "node.get_volume_stats.relative_path",
        says: &[
            "NodeGetVolumeStats",
            "expected: NOT_FOUND",
            "actual:   INVALID_ARGUMENT",
        ],
        also: &["node.expand_volume.relative_path"],
        only: true,
    },
    Caught {
        fault: Fault::AcceptsAnyMutableParameter,
        by: "controller.create_volume.unaccepted_mutable_parameter",
        says: &[
            "CreateVolume",
            "csi-conformance-unaccepted-key",
            "actual:   OK",
        ],
        also: &["controller.modify_volume.unaccepted_parameter"],
        only: true,
    },
    Caught {
        fault: Fault::RequiresMutableParameters,
        by: "controller.modify_volume.missing_volume",
        says: &[
            "expected: NOT_FOUND",
            "actual:   INVALID_ARGUMENT",
            "proto3",
        ],
        also: &["controller.modify_volume.empty_parameters"],
        only: true,
    },
    Caught {
        fault: Fault::RequiresSnapshotIds,
        by: "group-controller.get.missing",
        says: &[
            "GetVolumeGroupSnapshot",
            "expected: NOT_FOUND",
            "snapshot_ids: []",
        ],
        also: &["group-controller.delete.missing"],
        only: true,
    },
    Caught {
        fault: Fault::NoAttachLimit,
        by: "controller.publish.attach_limit",
        says: &["ControllerPublishVolume", "expected: RESOURCE_EXHAUSTED"],
        also: &[],
        only: true,
    },
    Caught {
        fault: Fault::ShortNameLimit,
        by: "controller.create_volume.max_length_name",
        says: &[
            "CreateVolume",
            "expected: OK",
            "actual:   INVALID_ARGUMENT",
            "128 bytes",
        ],
        also: &["snapshot.create.max_length_name"],
        only: true,
    },
    Caught {
        fault: Fault::RepublishIgnoresArguments,
        by: "controller.publish.incompatible",
        says: &[
            "ControllerPublishVolume",
            "expected: ALREADY_EXISTS",
            "actual:   OK",
        ],
        also: &[],
        only: true,
    },
    Caught {
        fault: Fault::ListsDeleted,
        by: "controller.list_volumes.created_and_deleted",
        says: &["ListVolumes", "still listed after DeleteVolume"],
        also: &["snapshot.list.created_and_deleted"],
        only: true,
    },
    Caught {
        fault: Fault::UnknownSourceNotFound,
        by: "snapshot.list.filters",
        says: &["ListSnapshots", "expected: OK", "actual:   NOT_FOUND"],
        also: &[],
        only: true,
    },
    Caught {
        fault: Fault::MutableParametersOnlyOnModify,
        by: "controller.create_volume.mutable_parameters",
        says: &["CreateVolume", "expected: OK", "actual:   INVALID_ARGUMENT"],
        also: &[],
        only: true,
    },
    // The fake's own repeat rules then refuse its volumes too.
    Caught {
        fault: Fault::CapacityBelowRequired,
        by: "controller.create_volume.capacity",
        says: &["CreateVolume", "below the required_bytes"],
        also: &["controller.create_volume.idempotent"],
        only: false,
    },
    Caught {
        fault: Fault::StatsAtAnyPath,
        by: "node.get_volume_stats.missing_path",
        says: &["NodeGetVolumeStats", "expected: NOT_FOUND", "actual:   OK"],
        also: &[],
        only: true,
    },
    Caught {
        fault: Fault::NoNodeTopology,
        by: "node.get_info",
        says: &[
            "NodeGetInfo",
            "VOLUME_ACCESSIBILITY_CONSTRAINTS",
            "accessible_topology",
        ],
        also: &[],
        only: true,
    },
    Caught {
        fault: Fault::ListedSnapshotsWithoutTime,
        by: "snapshot.list.filters",
        says: &["ListSnapshots", "creation_time"],
        also: &[
            "snapshot.list.paging",
            "snapshot.list.created_and_deleted",
            "snapshot.delete_source_volume",
        ],
        only: true,
    },
    // Nothing else depends on the authority: grpc-go style clients are fine.
    Caught {
        fault: Fault::StrictAuthority,
        by: "general.any_authority",
        says: &["grpc-status Some(13)", "grpc-java"],
        also: &[],
        only: true,
    },
];

#[tokio::test]
async fn each_fault_is_caught_by_its_check() {
    for case in CAUGHT {
        let (report, text) = failure_of(case.fault, case.by).await;
        for said in case.says {
            assert!(
                text.contains(said),
                "{:?}: {said:?} not in {text}",
                case.fault
            );
        }
        for id in case.also {
            assert!(
                matches!(report.get(id).unwrap().status, Status::Failed(_)),
                "{:?}: {id} should fail:\n{report}",
                case.fault
            );
        }
        if case.only {
            let mut want = [&[case.by], case.also].concat();
            want.sort();
            let mut failed: Vec<&str> = report.failures().map(|(r, _)| r.id.as_str()).collect();
            failed.sort();
            assert_eq!(failed, want, "{:?}:\n{report}", case.fault);
        }
    }
}

#[tokio::test]
async fn non_idempotent_create_is_caught() {
    let (report, text) = failure_of(
        Fault::NotIdempotentCreate,
        "controller.create_volume.idempotent",
    )
    .await;
    assert!(text.contains("CreateVolume"), "{text}");
    assert!(text.contains("same volume"), "{text}");
    // controller.create_volume.concurrent is not asserted: the server's lock
    // on the volume name makes concurrent duplicates ABORTED, so only calls
    // that happen not to overlap can show the fault there.
    let incompatible = &report
        .get("controller.create_volume.incompatible_capacity")
        .unwrap()
        .status;
    match incompatible {
        Status::Failed(f) => {
            assert_eq!(f.expected.as_deref(), Some("ALREADY_EXISTS"));
            assert_eq!(f.actual.as_deref(), Some("OK"));
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn leaked_secrets_are_caught_without_echoing_them() {
    let env = start(FakeDriver::new().with_fault(Fault::LeaksSecretsToLog)).await;
    let cfg = config(&env);
    let markers = cfg.secrets.log_markers();
    assert_eq!(markers.len(), 1);
    let report = Suite::new(cfg).run().await.expect("suite runs");
    let failures: Vec<_> = report.failures().map(|(r, _)| r.id.as_str()).collect();
    assert_eq!(failures, ["general.secrets_not_in_logs"], "{report}");
    let text = report.to_string();
    assert!(text.contains("CreateVolumeSecret"), "{text}");
    assert!(
        !text.contains(&markers[0]),
        "the report must not repeat the secret"
    );
    assert!(!report.to_junit_xml().contains(&markers[0]));
}

/// The configured mutable parameters are sent too, and must be accepted.
#[tokio::test]
async fn configured_mutable_parameters_are_used() {
    let env = start(FakeDriver::new()).await;
    let mut cfg = config(&env);
    cfg.mutable_parameters = [("iops".to_string(), "3000".to_string())].into();
    assert_all_passed(&run_and_assert(cfg).await);
    let mut cfg = config(&env).focus("controller.modify_volume.*");
    cfg.mutable_parameters = [("unknown".to_string(), "x".to_string())].into();
    let report = Suite::new(cfg).run().await.expect("suite runs");
    match &report
        .get("controller.modify_volume.empty_parameters")
        .unwrap()
        .status
    {
        Status::Failed(f) => assert!(f.message.contains("configured"), "{f}"),
        other => panic!("{other:?}"),
    }
}

/// A large attach limit is skipped, saying why.
#[tokio::test]
async fn an_attach_limit_above_the_bound_is_skipped() {
    let env = start(FakeDriver::new()).await;
    let mut cfg = config(&env).focus("controller.publish.attach_limit");
    cfg.attach_limit_max = 2;
    let report = run_and_assert(cfg).await;
    match &report
        .get("controller.publish.attach_limit")
        .unwrap()
        .status
    {
        Status::Skipped(reason) => assert!(reason.contains("attach_limit_max (2)"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn skipping_by_id_group_and_prefix() {
    let env = start(FakeDriver::new().with_fault(Fault::NoPaging)).await;
    let cfg = config(&env)
        .skip("controller.list_volumes.paging")
        .skip("snapshot.list.*")
        .skip("group-controller");
    let report = run_and_assert(cfg).await;
    for id in [
        "controller.list_volumes.paging",
        "snapshot.list.paging",
        "snapshot.list.filters",
        "snapshot.list.created_and_deleted",
        "group-controller.lifecycle",
    ] {
        match &report.get(id).unwrap().status {
            Status::Skipped(reason) => assert!(reason.contains("configuration"), "{reason}"),
            other => panic!("{id}: {other:?}"),
        }
    }
    // Eight by configuration (the five above and the other three
    // group-controller checks) and the split-endpoint check (one endpoint).
    assert_eq!(report.skipped(), 9, "{report}");
}

#[tokio::test]
async fn focus_runs_only_the_selected_checks() {
    let env = start(FakeDriver::new()).await;
    let report = run_and_assert(config(&env).focus("identity")).await;
    // identity.split_endpoints is skipped: one endpoint.
    assert_eq!(report.passed(), 3, "{report}");
    assert_eq!(report.skipped(), Suite::checks().len() - 3, "{report}");
}

#[tokio::test]
async fn junit_xml_is_well_formed() {
    let env = start(FakeDriver::new().with_fault(Fault::WrongCodeForMissingVolume)).await;
    let report = Suite::new(config(&env).skip("node"))
        .run()
        .await
        .expect("suite runs");
    let xml = report.to_junit_xml();
    assert!(xml.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites "));
    assert!(xml.trim_end().ends_with("</testsuites>"));
    assert_eq!(xml.matches("<testcase ").count(), report.results.len());
    assert_eq!(xml.matches("<failure ").count(), report.failed());
    assert_eq!(xml.matches("<skipped ").count(), report.skipped());
    assert_eq!(
        xml.matches("<testsuite ").count(),
        xml.matches("</testsuite>").count()
    );
    // Open and close tags balance: every non-self-closing testcase is closed.
    let open = xml.matches("<testcase ").count();
    let self_closed = xml
        .lines()
        .filter(|l| l.contains("<testcase ") && l.ends_with("/>"))
        .count();
    assert_eq!(open - self_closed, xml.matches("</testcase>").count());
    // Debug output of requests contains quotes; they must be escaped.
    let failure_lines: Vec<&str> = xml.lines().filter(|l| l.contains("<failure ")).collect();
    assert!(!failure_lines.is_empty());
    for line in failure_lines {
        assert!(line.contains("&quot;"), "{line}");
        let inner = line.split_once('>').unwrap().1;
        assert!(
            !inner.trim_end_matches("</failure>").contains('<'),
            "{line}"
        );
    }
    let path = env.dirs.path().join("report.xml");
    report.write_junit(&path).unwrap();
    assert_eq!(std::fs::read_to_string(path).unwrap(), xml);
}

#[test]
fn checks_are_listed_with_unique_ids() {
    let checks = Suite::checks();
    let mut ids: Vec<&str> = checks.iter().map(|c| c.id).collect();
    assert!(ids.len() >= 50);
    assert!(ids.contains(&"node.publish.repeat_table"));
    assert!(checks.iter().all(|c| c.id.starts_with(c.group.as_str())));
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), checks.len(), "duplicate check ids");
}

#[tokio::test]
async fn unreachable_endpoint_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = SuiteConfig::new(format!("unix://{}/nothing.sock", dir.path().display()));
    cfg.timeouts.connect = std::time::Duration::from_millis(200);
    cfg.staging_dir = dir.path().join("s");
    cfg.target_dir = dir.path().join("t");
    let err = Suite::new(cfg).run().await.unwrap_err();
    assert!(err.to_string().contains("nothing.sock"), "{err}");
}

/// What the driver still holds after a run.
async fn leftovers(env: &Env) -> (usize, usize) {
    use csi_proto::v1::{ListSnapshotsRequest, ListVolumesRequest};
    let client = csi_client::CsiClient::connect(env.server.endpoint())
        .await
        .unwrap();
    let vols = client.call(ListVolumesRequest::default()).await.unwrap();
    let snaps = client.call(ListSnapshotsRequest::default()).await.unwrap();
    (vols.entries.len(), snaps.entries.len())
}

#[tokio::test]
async fn cleanup_runs_even_when_checks_fail() {
    for fault in [
        Fault::NoRepeatTable,
        Fault::WrongCodeForMissingVolume,
        Fault::NotIdempotentCreate,
        Fault::NoTargetCleanup,
        Fault::NoAttachLimit,
        Fault::AcceptsAnyMutableParameter,
    ] {
        let env = start(FakeDriver::new().with_fault(fault)).await;
        let report = Suite::new(config(&env)).run().await.expect("suite runs");
        assert!(!report.is_success(), "{fault:?} went unnoticed");
        assert_eq!(
            leftovers(&env).await,
            (0, 0),
            "{fault:?} left resources:\n{report}"
        );
    }
    let env = start(FakeDriver::new()).await;
    run_and_assert(config(&env)).await;
    assert_eq!(leftovers(&env).await, (0, 0));
}

#[tokio::test]
#[should_panic(expected = "CSI conformance failures")]
async fn run_and_assert_panics_with_the_report() {
    let env = start(FakeDriver::new().with_fault(Fault::NoPaging)).await;
    run_and_assert(config(&env)).await;
}

/// The whole suite in one call against a driver served in this process.
#[tokio::test]
async fn run_in_process_runs_everything_in_one_call() {
    let report = csi_conformance::run_in_process(FakeDriver::new().server_builder()).await;
    assert!(report.passed() > 0, "{report}");
    // Without a driver log the secrets check has nothing to read, one
    // endpoint has no split to check, and without configured mutable
    // parameters there is no VolumeAttributesClass to create with: all
    // three skipped.
    assert_eq!(report.skipped(), 3, "{report}");
    let block =
        csi_conformance::run_in_process_with(FakeDriver::new().server_builder(), |c| c.block())
            .await;
    assert!(block.is_success(), "{block}");
}

/// A fault makes run_in_process panic with the report.
#[tokio::test]
#[should_panic(expected = "node.publish.repeat_table")]
async fn run_in_process_panics_with_the_failures() {
    csi_conformance::run_in_process(
        FakeDriver::new()
            .with_fault(Fault::NoRepeatTable)
            .server_builder(),
    )
    .await;
}
