//! Scenario tests for the node (kubelet) reconciler with the fake plugin and
//! a fake clock.

mod common;

use common::Plugin;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use OperationKind::*;
use volume_state::node::{
    ActualNodeState, AttachMode, AttachState, DesiredNodeState, DeviceState, DiscoveredMount,
    NodeOperation, NodeReconciler, Phase, PodMount, PodMountState,
};
use volume_state::{
    ErrorKind, ExecutionResult, FakeClock, GateError, OperationKind, PassReport, VolumeSpec,
};

type Desired = DesiredNodeState<String, String>;
type Actual = ActualNodeState<String, String>;
type Env = common::Env<Desired, Actual, NodeReconciler<String, String, String>>;

fn env(mode: AttachMode) -> Env {
    let env = Env::new(
        Desired::new(),
        Actual::new(),
        |desired, actual, plugin, clock| {
            NodeReconciler::new("node-1".to_string(), mode, desired, actual, plugin)
                .with_clock(Arc::new(clock))
        },
    );
    env.desired.mark_populated();
    env
}

fn spec(volume: &str) -> VolumeSpec {
    VolumeSpec {
        attachable: true,
        staging_path: Some(staging(volume)),
        desired_size: Some(10),
        ..VolumeSpec::default()
    }
}

fn staging(volume: &str) -> PathBuf {
    PathBuf::from(format!("/staging/{volume}"))
}

fn target(pod: &str, volume: &str) -> PathBuf {
    PathBuf::from(format!("/pods/{pod}/{volume}"))
}

impl Env {
    fn add(&self, volume: &str, pod: &str) {
        self.add_spec(volume, pod, spec(volume));
    }

    fn add_spec(&self, volume: &str, pod: &str, spec: VolumeSpec) {
        self.desired
            .add_pod(volume.into(), spec, pod.into(), target(pod, volume));
    }

    fn remove(&self, volume: &str, pod: &str) {
        assert!(self.desired.remove_pod(&volume.into(), &pod.into()));
    }

    /// Recorded (method, volume) pairs since the last call.
    fn calls(&self) -> Vec<(OperationKind, String)> {
        self.plugin.take_call_summary()
    }

    fn pod_mount(&self, volume: &str, pod: &str) -> Option<PodMount> {
        self.actual
            .snapshot()
            .pod_mount(&volume.into(), &pod.into())
            .cloned()
    }

    fn pod_state(&self, volume: &str, pod: &str) -> Option<PodMountState> {
        self.pod_mount(volume, pod).map(|m| m.state)
    }

    fn device(&self, volume: &str) -> Option<DeviceState> {
        self.actual
            .snapshot()
            .get(&volume.into())
            .map(|v| v.device.clone())
    }

    async fn settle(&self) {
        let passes = self.reconciler.run_until_idle(20).await;
        assert!(passes < 20, "did not settle");
    }

    /// Mounts `volume` for `pod`, settles and forgets the calls.
    async fn mount(&self, volume: &str, pod: &str) {
        self.add(volume, pod);
        self.settle().await;
        self.calls();
    }

    /// Adds `v1` for pod `a` and runs the attach pass and the stage pass,
    /// whose stage times out: the stage pass's report.
    async fn stage_timed_out(&self) -> PassReport {
        self.plugin
            .fail_once(Stage, Some("v1".into()), ErrorKind::Uncertain);
        self.add("v1", "a");
        self.reconciler.run_pass().await;
        self.reconciler.run_pass().await
    }

    /// Mounts `v1` for pod `a` and settles, then makes the next `method`
    /// on `v1` fail with `kind` and removes the pod.
    async fn mount_then_remove_failing(&self, method: OperationKind, kind: ErrorKind) {
        self.mount("v1", "a").await;
        self.plugin.fail_once(method, Some("v1".into()), kind);
        self.remove("v1", "a");
    }

    /// Runs an unpublish of `volume` for `pod` outside the reconciler's plan.
    async fn unpublish_directly(&self, volume: &str, pod: &str) {
        self.reconciler
            .execute(NodeOperation::Unpublish {
                volume: volume.into(),
                pod: pod.into(),
                target_path: target(pod, volume),
            })
            .await;
    }

    /// Settles, then checks `volume` went attach, stage, unstage, detach
    /// and nothing else ran.
    async fn settle_through_a_full_cycle(&self, volume: &str) {
        self.settle().await;
        assert_eq!(
            self.calls(),
            [
                v(Attach, volume),
                v(Stage, volume),
                v(Unstage, volume),
                v(Detach, volume)
            ]
        );
    }
}

fn v(method: OperationKind, volume: &str) -> (OperationKind, String) {
    (method, volume.to_string())
}

#[tokio::test]
async fn node_mode_happy_path_and_teardown_in_reverse() {
    let env = env(AttachMode::ByNode);
    env.add("v1", "a");
    // One step per pass: attach, stage, publish.
    assert_eq!(env.reconciler.run_pass().await.planned, 1);
    assert_eq!(env.calls(), [v(Attach, "v1")]);
    env.reconciler.run_pass().await;
    assert_eq!(env.calls(), [v(Stage, "v1")]);
    env.reconciler.run_pass().await;
    assert_eq!(env.calls(), [v(Publish, "v1")]);
    assert_eq!(env.reconciler.run_pass().await.planned, 0);

    let snapshot = env.actual.snapshot();
    let volume = snapshot.get(&"v1".into()).unwrap();
    assert_eq!(volume.attach, AttachState::Attached);
    assert_eq!(
        volume.device,
        DeviceState::Mounted {
            device_path: Some("/dev/fake/\"v1\"".into()),
            staging_path: staging("v1"),
        }
    );
    assert_eq!(env.pod_state("v1", "a"), Some(PodMountState::Mounted));
    assert_eq!(volume.size, Some(10));

    env.remove("v1", "a");
    env.settle().await;
    assert_eq!(
        env.calls(),
        [v(Unpublish, "v1"), v(Unstage, "v1"), v(Detach, "v1")]
    );
    assert!(env.actual.snapshot().is_empty());
}

#[tokio::test]
async fn controller_attach_mode_verifies_only_when_reported_in_use_and_never_detaches() {
    let env = env(AttachMode::ByController);
    env.add("v1", "a");
    assert_eq!(env.reconciler.run_pass().await.planned, 0);
    assert!(env.calls().is_empty());
    env.desired
        .mark_volumes_reported_in_use([&"v1".to_string()]);
    env.settle().await;
    assert_eq!(
        env.calls(),
        [v(VerifyAttached, "v1"), v(Stage, "v1"), v(Publish, "v1")]
    );
    env.remove("v1", "a");
    env.settle().await;
    assert_eq!(env.calls(), [v(Unpublish, "v1"), v(Unstage, "v1")]);
    assert!(env.actual.snapshot().is_empty());
}

#[tokio::test]
async fn volume_without_attach_or_stage_goes_straight_to_publish() {
    let env = env(AttachMode::ByNode);
    env.add_spec("nfs", "a", VolumeSpec::default());
    env.settle().await;
    assert_eq!(env.calls(), [v(Publish, "nfs")]);
    env.remove("nfs", "a");
    env.settle().await;
    assert_eq!(env.calls(), [v(Unpublish, "nfs")]);
    assert!(env.actual.snapshot().is_empty());
}

#[tokio::test]
async fn volume_moves_between_pods_without_restaging() {
    let env = env(AttachMode::ByNode);
    env.mount("v1", "a").await;
    env.remove("v1", "a");
    env.add("v1", "b");
    let plan = env.reconciler.plan();
    assert_eq!(plan.len(), 2);
    assert!(matches!(&plan[0], NodeOperation::Unpublish { pod, .. } if pod == "a"));
    assert!(matches!(&plan[1], NodeOperation::Publish { pod, .. } if pod == "b"));
    env.settle().await;
    let calls = env.plugin.take_calls();
    let paths: Vec<_> = calls
        .iter()
        .map(|c| (c.method, c.path.clone().unwrap()))
        .collect();
    assert_eq!(
        paths,
        [(Unpublish, target("a", "v1")), (Publish, target("b", "v1"))]
    );
    assert_eq!(env.pod_state("v1", "a"), None);
    assert_eq!(env.pod_state("v1", "b"), Some(PodMountState::Mounted));
}

#[tokio::test]
async fn stage_timeout_is_uncertain_and_still_unstaged_on_delete() {
    let env = env(AttachMode::ByNode);
    assert_eq!(env.stage_timed_out().await.failed, 1);
    assert_eq!(env.device("v1"), Some(DeviceState::Uncertain));
    env.remove("v1", "a");
    env.settle_through_a_full_cycle("v1").await;
    assert!(env.actual.snapshot().is_empty());
}

#[tokio::test]
async fn final_stage_error_after_uncertain_means_not_mounted() {
    let env = env(AttachMode::ByNode);
    env.stage_timed_out().await;
    assert_eq!(env.device("v1"), Some(DeviceState::Uncertain));
    env.plugin
        .fail_once(Stage, Some("v1".into()), ErrorKind::Final);
    env.clock.advance(Duration::from_millis(500));
    env.reconciler.run_pass().await;
    assert_eq!(env.device("v1"), Some(DeviceState::NotMounted));
    // Not mounted any more: deleting needs no unstage.
    env.remove("v1", "a");
    env.calls();
    env.settle().await;
    assert_eq!(env.calls(), [v(Detach, "v1")]);
}

#[tokio::test]
async fn publish_timeout_is_retried_after_backoff() {
    let env = env(AttachMode::ByNode);
    env.plugin
        .fail_once(Publish, Some("v1".into()), ErrorKind::Uncertain);
    env.add("v1", "a");
    env.reconciler.run_until_idle(3).await;
    assert_eq!(env.pod_state("v1", "a"), Some(PodMountState::Uncertain));
    // Inside the 500 ms backoff window: nothing to do.
    assert!(env.reconciler.plan().is_empty());
    env.clock.advance(Duration::from_millis(499));
    assert!(env.reconciler.plan().is_empty());
    env.clock.advance(Duration::from_millis(1));
    env.settle().await;
    assert_eq!(env.pod_state("v1", "a"), Some(PodMountState::Mounted));
    assert_eq!(env.plugin.count(Publish), 2);
    assert!(env.reconciler.gate().state().is_empty());
}

#[tokio::test]
async fn failed_unpublish_makes_a_returning_pod_publish_again() {
    let env = env(AttachMode::ByNode);
    env.mount_then_remove_failing(Unpublish, ErrorKind::Final)
        .await;
    env.reconciler.run_pass().await;
    assert_eq!(env.pod_state("v1", "a"), Some(PodMountState::Uncertain));
    env.calls();
    env.add("v1", "a");
    env.settle().await;
    assert_eq!(env.calls(), [v(Publish, "v1")]);
    assert_eq!(env.pod_state("v1", "a"), Some(PodMountState::Mounted));
}

#[tokio::test]
async fn failed_unstage_makes_a_new_pod_stage_again() {
    let env = env(AttachMode::ByNode);
    env.mount_then_remove_failing(Unstage, ErrorKind::Uncertain)
        .await;
    env.reconciler.run_pass().await; // unpublish
    env.reconciler.run_pass().await; // unstage fails
    assert_eq!(env.device("v1"), Some(DeviceState::Uncertain));
    env.calls();
    env.add("v1", "b");
    env.settle().await;
    assert_eq!(env.calls(), [v(Stage, "v1"), v(Publish, "v1")]);
    assert!(matches!(
        env.device("v1"),
        Some(DeviceState::Mounted { .. })
    ));
}

#[tokio::test]
async fn remount_failure_never_downgrades_a_mounted_pod() {
    let env = env(AttachMode::ByNode);
    env.add("v1", "a");
    env.settle().await;
    env.actual.mark_remount_required(&"v1".into());
    env.plugin.fail_once(Publish, None, ErrorKind::Final);
    env.reconciler.run_pass().await;
    let mount = env.pod_mount("v1", "a").unwrap();
    assert_eq!(mount.state, PodMountState::Mounted);
    assert!(mount.remount_required);
    env.clock.advance(Duration::from_secs(1));
    env.settle().await;
    let mount = env.pod_mount("v1", "a").unwrap();
    assert!(!mount.remount_required);
    assert_eq!(env.plugin.count(Publish), 3);
}

#[tokio::test]
async fn larger_desired_size_expands_once() {
    let env = env(AttachMode::ByNode);
    env.mount("v1", "a").await;
    env.add_spec(
        "v1",
        "a",
        VolumeSpec {
            desired_size: Some(20),
            ..spec("v1")
        },
    );
    env.settle().await;
    assert_eq!(env.calls(), [v(Expand, "v1")]);
    assert_eq!(
        env.actual.snapshot().get(&"v1".into()).unwrap().size,
        Some(20)
    );
}

#[tokio::test]
async fn plan_emits_operations_in_the_fixed_phase_order() {
    // Build one volume at every stage from a settled state.
    let env = env(AttachMode::ByNode);
    for volume in ["u", "x", "d"] {
        env.add(volume, "a");
    }
    env.settle().await;
    env.add("a", "a"); // needs attach
    env.remove("u", "a"); // needs unpublish
    env.unpublish_directly("x", "a").await;
    env.remove("x", "a"); // mounted device, no pods: needs unstage
    env.unpublish_directly("d", "a").await;
    env.reconciler
        .execute(NodeOperation::Unstage {
            volume: "d".into(),
            staging_path: staging("d"),
        })
        .await;
    env.remove("d", "a"); // attached only: needs detach
    env.actual
        .apply_attach(&"s".into(), &Arc::new(spec("s")), &Ok(Default::default()));
    env.add("s", "a"); // attached, needs stage
    env.actual
        .mark_attached(&"p".into(), &Arc::new(VolumeSpec::default()));
    env.add_spec("p", "a", VolumeSpec::default()); // attached, needs publish

    let plan = env.reconciler.plan();
    let phases: Vec<Phase> = plan.iter().map(|op| op.phase()).collect();
    let volumes: Vec<&str> = plan.iter().map(|op| op.volume().as_str()).collect();
    assert_eq!(
        phases,
        [
            Phase::Unpublish,
            Phase::Attach,
            Phase::Stage,
            Phase::Publish,
            Phase::Unstage,
            Phase::Detach
        ]
    );
    assert_eq!(volumes, ["u", "a", "s", "p", "x", "d"]);
}

#[tokio::test(start_paused = true)]
async fn never_detached_while_an_operation_on_the_volume_is_pending() {
    let env = env(AttachMode::ByNode);
    env.plugin
        .delay(Stage, Some("v1".into()), 1, Duration::from_secs(10));
    env.add("v1", "a");
    env.reconciler.run_pass().await; // attach
    let reconciler = env.reconciler.clone();
    let stage = tokio::spawn(async move { reconciler.run_pass().await });
    while env.plugin.count(Stage) == 0 {
        tokio::task::yield_now().await;
    }
    env.remove("v1", "a");
    // The volume is unwanted and its device not (yet) mounted, but stage runs.
    assert!(env.reconciler.plan().is_empty());
    let detaches = [
        NodeOperation::MarkDetached {
            volume: "v1".into(),
        },
        NodeOperation::Detach {
            volume: "v1".into(),
        },
    ];
    for detach in detaches {
        assert_eq!(
            env.reconciler.execute(detach).await,
            ExecutionResult::Skipped(GateError::AlreadyExists)
        );
    }
    assert!(env.actual.snapshot().get(&"v1".into()).is_some());
    stage.await.unwrap();
    env.settle_through_a_full_cycle("v1").await;
}

#[tokio::test]
async fn restart_reconstruction_waits_for_populated_desired_state_and_cleans_orphans_once() {
    let desired = Arc::new(Desired::new());
    let actual = Arc::new(Actual::new());
    let plugin = Arc::new(Plugin::new());
    let reconciler = NodeReconciler::new(
        "node-1".to_string(),
        AttachMode::ByNode,
        desired.clone(),
        actual.clone(),
        plugin.clone(),
    )
    .with_clock(Arc::new(FakeClock::new()));
    let mount = |volume: &str, pod: &str| {
        DiscoveredMount::new(volume.to_string(), pod.to_string(), target(pod, volume))
            .with_staging_path(staging(volume))
            .with_device_path("/dev/sdx")
    };
    let report = actual.reconstruct(
        [mount("kept", "a"), mount("gone", "b"), mount("orphan", "c")],
        |volume| (volume != "orphan").then(|| spec(volume)),
    );
    assert_eq!(report.reconstructed, 2);
    assert_eq!(report.orphans, 1);
    let snapshot = actual.snapshot();
    for volume in ["kept", "gone"] {
        let entry = snapshot.get(&volume.into()).unwrap();
        assert_eq!(entry.attach, AttachState::Uncertain);
        assert_eq!(entry.device, DeviceState::Uncertain);
        assert!(
            entry
                .pods
                .values()
                .all(|m| m.state == PodMountState::Uncertain)
        );
    }

    // The populator has added "kept" but is not done: nothing is torn down.
    desired.add_pod("kept".into(), spec("kept"), "a".into(), target("a", "kept"));
    reconciler.run_until_idle(10).await;
    let calls = plugin.take_calls();
    assert!(calls.iter().all(|c| c.volume == "kept"), "{calls:?}");
    assert_eq!(
        calls.iter().map(|c| c.method).collect::<Vec<_>>(),
        [Attach, Stage, Publish]
    );

    // Populated: the unwanted volume is torn down, the orphan cleaned once.
    plugin.fail_once(Unpublish, Some("orphan".into()), ErrorKind::Final);
    desired.mark_populated();
    reconciler.run_until_idle(10).await;
    let summary: Vec<_> = plugin
        .take_calls()
        .into_iter()
        .map(|c| (c.method, c.volume))
        .collect();
    assert_eq!(
        summary,
        [
            v(Unpublish, "gone"),
            v(Unpublish, "orphan"),
            v(Unstage, "gone"),
            v(Detach, "gone")
        ]
    );
    let snapshot = actual.snapshot();
    assert_eq!(snapshot.orphans().count(), 0);
    assert_eq!(snapshot.len(), 1);
    assert_eq!(
        snapshot
            .pod_mount(&"kept".into(), &"a".into())
            .unwrap()
            .state,
        PodMountState::Mounted
    );
}

/// Stage fails for a while (backoff up to 16 s), the pod
/// goes away, the volume is detached and forgotten; hours later a new pod's
/// first failure waits the initial 500 ms, and nothing was kept meanwhile
/// (kubernetes#116886: Kubernetes waits 32 s here, and keeps the record).
#[tokio::test]
async fn backoff_is_forgotten_once_the_volume_left_both_states() {
    use volume_state::OperationKey;
    let env = env(AttachMode::ByNode);
    let stage = OperationKey::<String, String, String>::volume("v1".into(), OperationKind::Stage);
    let backoff = |env: &Env| {
        let now = volume_state::Clock::now(&env.clock);
        env.reconciler
            .gate()
            .state()
            .backoff_until(&stage, now)
            .map(|until| until - now)
    };
    env.plugin
        .fail_times(Stage, Some("v1".into()), 6, ErrorKind::Final);
    env.add("v1", "a");
    env.reconciler.run_pass().await; // attach
    let mut waits = Vec::new();
    for _ in 0..6 {
        env.reconciler.run_pass().await; // stage fails
        let wait = backoff(&env).unwrap();
        waits.push(wait.as_millis());
        env.clock.advance(wait);
    }
    assert_eq!(waits, [500, 1_000, 2_000, 4_000, 8_000, 16_000]);

    env.remove("v1", "a");
    env.settle().await;
    assert!(env.actual.snapshot().is_empty(), "detached and forgotten");
    assert!(env.reconciler.gate().state().is_empty(), "records purged");

    env.clock.advance(Duration::from_secs(3 * 3600));
    env.plugin
        .fail_once(Stage, Some("v1".into()), ErrorKind::Final);
    env.add("v1", "b");
    env.reconciler.run_pass().await; // attach
    env.reconciler.run_pass().await; // stage fails
    assert_eq!(backoff(&env), Some(Duration::from_millis(500)));
}

/// The spec had no size at first mount; the size the
/// plugin reports from stage/publish lets a later larger size expand.
#[tokio::test]
async fn expansion_happens_when_the_size_was_unknown_at_first_mount() {
    let env = env(AttachMode::ByNode);
    let unsized_spec = VolumeSpec {
        desired_size: None,
        ..spec("v1")
    };
    env.plugin.set_size("v1".into(), 10);
    env.add_spec("v1", "a", unsized_spec.clone());
    env.settle().await;
    env.calls();
    assert_eq!(
        env.actual.snapshot().get(&"v1".into()).unwrap().size,
        Some(10)
    );
    env.add_spec(
        "v1",
        "a",
        VolumeSpec {
            desired_size: Some(20),
            ..unsized_spec
        },
    );
    env.settle().await;
    assert_eq!(env.calls(), [v(Expand, "v1")]);
    assert_eq!(
        env.actual.snapshot().get(&"v1".into()).unwrap().size,
        Some(20)
    );
    assert_eq!(env.plugin.size(&"v1".into()), Some(20));
}

/// A held stage keeps every other operation on its volume
/// out, while other volumes go on; the fake's events prove it.
#[tokio::test]
async fn a_held_stage_excludes_its_volume_but_not_others() {
    let env = env(AttachMode::ByNode);
    let hold = env.plugin.hold(Stage, Some("v1".into()));
    env.add("v1", "a");
    env.reconciler.run_pass().await; // attach
    let reconciler = env.reconciler.clone();
    let stage = tokio::spawn(async move { reconciler.run_pass().await });
    hold.entered().await;
    // Pod a leaves and b arrives while v1 is being staged: nothing on v1.
    env.remove("v1", "a");
    env.add("v1", "b");
    assert!(env.reconciler.plan().is_empty());
    // v2 goes all the way meanwhile.
    env.add("v2", "c");
    env.settle().await;
    assert_eq!(env.pod_state("v2", "c"), Some(PodMountState::Mounted));
    assert!(!stage.is_finished());
    hold.release();
    stage.await.unwrap();
    env.settle().await;
    assert_eq!(env.pod_state("v1", "b"), Some(PodMountState::Mounted));
    assert_eq!(env.plugin.max_concurrent(|c| c.volume == "v1"), 1);
    assert_eq!(env.plugin.max_concurrent(|_| true), 2);
    let v1: Vec<_> = env
        .plugin
        .events()
        .into_iter()
        .filter_map(|e| match e {
            volume_state::PluginEvent::Finished(c, r) if c.volume == "v1" => {
                Some((c.method, r.is_ok()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(v1, [(Attach, true), (Stage, true), (Publish, true)]);
}
