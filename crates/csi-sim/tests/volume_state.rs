//! volume-state's reconcilers (a simulated kubelet and the attach/detach
//! controller, with the kubelet's journal on the world's filesystem)
//! driving the library's services, under a crash and each fault at every
//! step of every kubelet workload.

use csi_sim::{SimReport, SimRunner, Started, World, kubelet_workloads};

/// The library's services, started on `world`.
fn start(world: &World) -> Started {
    let world = world.clone();
    Box::pin(async move { csi_sim::targets::library(&world).await })
}

#[test]
fn the_reconcilers_converge_after_every_fault_at_every_step() {
    // The runner spreads each workload's runs over the machine's cores.
    let runner = SimRunner::new(&start);
    let mut report = SimReport {
        // The driver's start is the library's, explored by tests/library.rs.
        start_steps: 1,
        ..SimReport::default()
    };
    // The standard workloads whose calls have no kubelet part run against
    // the same services in tests/library.rs (lifecycle and shared-staging
    // are kubelet-shared and kubelet-restart here, expand-online is
    // kubelet-expand-online).
    for (w, why) in [
        (
            "snapshot-restore-clone",
            "not run: the external-snapshotter's and provisioner's calls, with no kubelet part",
        ),
        (
            "group-snapshot",
            "not run: the external-snapshotter's calls, with no kubelet part",
        ),
    ] {
        report.skip(w, why);
    }
    for w in kubelet_workloads() {
        runner.explore_kubelet(&w, &mut report);
    }
    println!("{report}");
    if std::env::var_os("CSI_SIM_REPLAY").is_none() {
        assert_eq!(report.steps.len(), kubelet_workloads().len());
        assert!(report.steps.iter().all(|(_, s)| *s > 0), "{report}");
        assert_eq!(report.unreached, 0, "{report}");
    }
    let found: Vec<String> = report.violations.iter().map(|v| v.to_string()).collect();
    assert!(found.is_empty(), "{}", found.join("\n"));
}
