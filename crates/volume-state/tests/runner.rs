//! The event-driven runner: converges on events and does nothing when idle.

use std::sync::Arc;
use std::time::Duration;

use volume_state::node::{
    ActualNodeState, AttachMode, DesiredNodeState, NodeReconciler, PodMountState,
};
use volume_state::{
    ErrorKind, FakeVolumePlugin, OperationKind, Runner, RunnerConfig, TokioClock, VolumeSpec,
};

type Setup = (
    Arc<DesiredNodeState<u32, u32>>,
    Arc<ActualNodeState<u32, u32>>,
    Arc<FakeVolumePlugin<u32, String>>,
    Arc<NodeReconciler<u32, u32, String>>,
);

fn setup() -> Setup {
    let desired = Arc::new(DesiredNodeState::new());
    let actual = Arc::new(ActualNodeState::new());
    let plugin = Arc::new(FakeVolumePlugin::new());
    let reconciler = Arc::new(
        NodeReconciler::new(
            "node".to_string(),
            AttachMode::ByNode,
            desired.clone(),
            actual.clone(),
            plugin.clone(),
        )
        .with_clock(Arc::new(TokioClock)),
    );
    desired.mark_populated();
    (desired, actual, plugin, reconciler)
}

fn spec(volume: u32) -> VolumeSpec {
    VolumeSpec {
        attachable: true,
        staging_path: Some(format!("/staging/{volume}").into()),
        ..VolumeSpec::default()
    }
}

fn mounted(actual: &ActualNodeState<u32, u32>, count: usize) -> bool {
    let snapshot = actual.snapshot();
    snapshot.len() == count
        && snapshot.volumes().all(|(_, v)| {
            v.pods.values().all(|m| m.state == PodMountState::Mounted) && !v.pods.is_empty()
        })
}

const CONFIG: RunnerConfig = RunnerConfig {
    resync_period: Duration::from_secs(3600),
    min_pass_interval: Duration::from_millis(10),
};

#[tokio::test(start_paused = true)]
async fn idle_runner_with_10000_volumes_runs_no_passes_until_an_event() {
    let (desired, actual, plugin, reconciler) = setup();
    plugin.set_recording(false);
    for volume in 0..10_000 {
        desired.add_pod(
            volume,
            spec(volume),
            volume,
            format!("/pods/{volume}").into(),
        );
    }
    let runner = Runner::spawn(reconciler.clone(), CONFIG);
    let mut waited = Duration::ZERO;
    while !mounted(&actual, 10_000) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        waited += Duration::from_millis(100);
        assert!(waited < Duration::from_secs(60), "did not converge");
    }
    // Let the last completions' wake-ups drain.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let passes = reconciler.passes();
    assert_eq!(runner.passes(), passes);
    assert!(passes < 20, "converging took {passes} passes");

    // Ten idle minutes (resync is an hour): no pass at all.
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(reconciler.passes(), passes);

    // An event wakes it up.
    desired.add_pod(10_000, spec(10_000), 10_000, "/pods/10000".into());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(reconciler.passes() > passes);
    assert!(mounted(&actual, 10_001));

    // The resync period still runs a pass without events.
    let before = reconciler.passes();
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(reconciler.passes(), before + 1);
    runner.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn runner_wakes_up_when_a_backoff_window_ends() {
    let (desired, actual, plugin, reconciler) = setup();
    plugin.fail_times(OperationKind::Publish, None, 3, ErrorKind::Uncertain);
    desired.add_pod(1, spec(1), 1, "/pods/1".into());
    let runner = Runner::spawn(reconciler.clone(), CONFIG);
    // Three failures back off 0.5 + 1 + 2 s; well within the hour of resync.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(mounted(&actual, 1));
    assert_eq!(plugin.count(OperationKind::Publish), 4);
    assert!(reconciler.passes() < 30, "{} passes", reconciler.passes());
    runner.shutdown().await;
}
