//! The library's own services (csi-controller's engine, csi-node's node
//! service over a directory-volume driver) under a crash and each fault at
//! every step of every standard workload.

use csi_sim::{SimReport, SimRunner, Started, Violation, World, workloads};

/// Violations found in code this crate does not own, reported to its
/// owner: each is still found, counted and printed, and the test fails as
/// soon as one is fixed (so its entry goes) or another appears.
///
/// csi-controller's DeleteVolumeGroupSnapshot (engine.rs,
/// `delete_volume_group_snapshot`, with `Tables::remove_group`): a failure
/// after a member's record was removed and before its data was deleted
/// leaves that data behind, and the retry finds no group and answers OK,
/// so the data is leaked until the next start's sweep.
/// The library's services, started on `world`.
fn start(world: &World) -> Started {
    let world = world.clone();
    Box::pin(async move { csi_sim::targets::library(&world).await })
}

fn known(v: &Violation) -> bool {
    v.workload == "group-snapshot"
        && v.what
            .starts_with("after call 3 (DeleteGroup(\"group-1\")): snapshot data differ")
        && v.what.contains("missing []")
}

#[test]
fn every_step_of_every_workload_survives_every_fault() {
    let runner = SimRunner::new(&start);
    let mut report = SimReport::default();
    for w in workloads() {
        runner.explore(&w, &mut report);
    }
    println!("{report}");
    if std::env::var_os("CSI_SIM_REPLAY").is_none() {
        assert_eq!(report.steps.len(), workloads().len());
        assert!(report.steps.iter().all(|(_, s)| *s > 0), "{report}");
        assert_eq!(report.unreached, 0, "{report}");
        let known_found = report.violations.iter().filter(|v| known(v)).count();
        assert!(
            known_found > 0,
            "a known violation is gone: remove it from `known`"
        );
    }
    let unknown: Vec<String> = report
        .violations
        .iter()
        .filter(|v| !known(v))
        .map(|v| v.to_string())
        .collect();
    assert!(unknown.is_empty(), "{}", unknown.join("\n"));
}
