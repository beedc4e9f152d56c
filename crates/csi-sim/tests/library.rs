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

/// The library's data, with a stray volume once the driver restarted after
/// a crash: what a driver that leaks data at a crash looks like.
struct LeaksAfterACrash {
    data: std::sync::Arc<dyn csi_sim::DataView>,
    restarted: bool,
}

impl csi_sim::DataView for LeaksAfterACrash {
    fn volumes(&self) -> std::collections::BTreeMap<String, String> {
        let mut volumes = self.data.volumes();
        if self.restarted {
            volumes.insert("stray".into(), "stray".into());
        }
        volumes
    }
    fn snapshots(&self) -> std::collections::BTreeMap<String, String> {
        self.data.snapshots()
    }
}

fn start_leaking(world: &World) -> Started {
    let world = world.clone();
    Box::pin(async move {
        let mut services = csi_sim::targets::library(&world).await?;
        let restarted = world.generation() > 0;
        services.data = std::sync::Arc::new(LeaksAfterACrash {
            data: services.data,
            restarted,
        });
        Ok(services)
    })
}

/// Determinism: a violation names its run as `workload:step:fault`, and
/// replaying that triple makes the same run and finds the same violation.
#[test]
fn a_violation_names_its_run_and_the_replay_finds_it_again() {
    use csi_sim::{Call, SimWorkload};
    let workload = SimWorkload {
        name: "create",
        calls: vec![Call::CreateVolume {
            pv: "pv-a",
            size: 1 << 30,
            from: None,
        }],
    };
    let runner = SimRunner::new(&start_leaking);
    let mut report = SimReport::default();
    if std::env::var_os("CSI_SIM_REPLAY").is_some() {
        return; // explore would replay a run of the named workload only
    }
    runner.explore(&workload, &mut report);
    let first = report.violations.first().expect("a crash leaks").clone();
    let spec = first.replay_spec();
    assert!(spec.starts_with("create:"), "{spec}");
    assert!(
        first
            .to_string()
            .contains(&format!("CSI_SIM_REPLAY={spec}")),
        "{first}"
    );
    // Only runs whose driver restarted find it: each one is a crash kind.
    for v in &report.violations {
        let fault = v.fault.map(|f| f.kind()).unwrap_or_default();
        assert!(
            ["crash", "power-loss", "crash-state"].contains(&fault.as_str()),
            "{v}"
        );
    }
    let (trace, again) = runner.replay(&workload, &spec).unwrap();
    assert_eq!(again, vec![first], "the replay is the same run");
    assert!(trace.iter().any(|l| l.contains("<==")), "{trace:?}");
    // A fault named where it cannot happen (a provider fault at step 0, a
    // file operation) does not fire, and the replay says so.
    let (trace, _) = runner.replay(&workload, "create:0:provider-5xx").unwrap();
    let last = trace.last().cloned().unwrap_or_default();
    assert!(last.contains("did not fire"), "{trace:?}");
}
