//! The library's own services (csi-controller's engine, csi-node's node
//! service over a directory-volume driver) under a crash and each fault at
//! every step of every standard workload.

use csi_sim::{SimReport, SimRunner, Started, World, workloads};

/// The library's services, started on `world`.
fn start(world: &World) -> Started {
    let world = world.clone();
    Box::pin(async move { csi_sim::targets::library(&world).await })
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
    }
    let found: Vec<String> = report.violations.iter().map(|v| v.to_string()).collect();
    assert!(found.is_empty(), "{}", found.join("\n"));
}
