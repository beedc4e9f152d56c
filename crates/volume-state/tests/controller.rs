//! Scenario tests for the attach/detach controller reconciler.

mod common;

use std::sync::Arc;
use std::time::Duration;

use OperationKind::*;
use volume_state::controller::{
    ActualAttachState, AttachConfig, AttachOperation, AttachReconciler, DesiredAttachState,
    NodeHealth,
};
use volume_state::node::AttachState;
use volume_state::{ErrorKind, NodeAccess, OperationKind, PluginCall, VolumeSpec};

type Desired = DesiredAttachState<String, String, String>;
type Actual = ActualAttachState<String, String>;
type Env = common::Env<Desired, Actual, AttachReconciler<String, String, String>>;

fn env(config: AttachConfig) -> Env {
    Env::new(
        Desired::new(),
        Actual::new(),
        |desired, actual, plugin, clock| {
            AttachReconciler::new(config, desired, actual, plugin).with_clock(Arc::new(clock))
        },
    )
}

fn spec(mode: NodeAccess) -> VolumeSpec {
    VolumeSpec {
        attachable: true,
        access_mode: mode,
        ..VolumeSpec::default()
    }
}

impl Env {
    fn add(&self, node: &str, mode: NodeAccess) {
        self.desired
            .add_pod(node.into(), "v1".into(), spec(mode), format!("pod-{node}"));
    }

    fn remove(&self, node: &str) {
        assert!(
            self.desired
                .remove_pod(&node.into(), &"v1".into(), &format!("pod-{node}"))
        );
    }

    fn not_in_use(&self, node: &str) {
        self.actual.set_volumes_in_use(&node.into(), []);
    }

    fn state(&self, node: &str) -> Option<AttachState> {
        self.actual
            .snapshot()
            .attachment(&"v1".into(), &node.into())
            .map(|a| a.state)
    }

    /// Attached to `node`; calls forgotten.
    async fn attached(&self, node: &str, mode: NodeAccess) {
        self.add(node, mode);
        self.reconciler.run_until_idle(5).await;
        self.calls();
    }

    /// Attached to `node`, which no longer uses it; calls forgotten.
    async fn attached_unused(&self, node: &str, mode: NodeAccess) {
        self.attached(node, mode).await;
        self.not_in_use(node);
    }

    /// Single-node attached on `node` and unused; the next detach fails
    /// uncertain.
    async fn attached_with_an_uncertain_detach_next(&self, node: &str) {
        self.attached_unused(node, NodeAccess::SingleNode).await;
        self.plugin.fail_once(Detach, None, ErrorKind::Uncertain);
    }

    /// The pod moves from `from` to `to`.
    fn move_pod(&self, from: &str, to: &str, mode: NodeAccess) {
        self.remove(from);
        self.add(to, mode);
    }

    /// Detached from n1, then attached to n2, since the last calls.
    fn assert_moved_to_n2(&self) {
        assert_eq!(self.calls(), [n(Detach, "n1"), n(Attach, "n2")]);
        assert_eq!(self.state("n1"), None);
        assert_eq!(self.state("n2"), Some(AttachState::Attached));
    }

    /// (method, node) of the recorded calls since the last call.
    fn calls(&self) -> Vec<(OperationKind, String)> {
        self.plugin
            .take_calls()
            .into_iter()
            .map(|c: PluginCall<String, String>| (c.method, c.node.unwrap()))
            .collect()
    }
}

fn n(method: OperationKind, node: &str) -> (OperationKind, String) {
    (method, node.to_string())
}

#[tokio::test]
async fn attach_then_detach_once_the_node_stops_using_the_volume() {
    let env = env(AttachConfig::default());
    env.add("n1", NodeAccess::SingleNode);
    env.reconciler.run_until_idle(5).await;
    assert_eq!(env.calls(), [n(Attach, "n1")]);
    let snapshot = env.actual.snapshot();
    let attachment = snapshot.attachment(&"v1".into(), &"n1".into()).unwrap();
    assert_eq!(attachment.state, AttachState::Attached);
    assert!(
        attachment.mounted_by_node,
        "assumed mounted until reported otherwise"
    );
    assert_eq!(snapshot.attached_as_reported(&"n1".into()), ["v1"]);

    env.remove("n1");
    env.reconciler.run_until_idle(5).await;
    assert!(env.calls().is_empty(), "still reported in use");
    assert!(
        env.actual
            .snapshot()
            .attachment(&"v1".into(), &"n1".into())
            .unwrap()
            .detach_requested_at
            .is_some()
    );
    env.not_in_use("n1");
    env.reconciler.run_until_idle(5).await;
    assert_eq!(env.calls(), [n(Detach, "n1")]);
    assert!(env.actual.snapshot().is_empty());
}

#[tokio::test]
async fn detach_before_attach_for_single_node_volumes() {
    let env = env(AttachConfig::default());
    env.attached_unused("n1", NodeAccess::SingleNode).await;
    env.move_pod("n1", "n2", NodeAccess::SingleNode);
    // Single-node attaches share a volume-level key, so wait out n1's backoff.
    env.clock.advance(Duration::from_millis(500));
    let plan = env.reconciler.plan();
    assert!(plan.iter().any(
        |op| matches!(op, AttachOperation::Detach { node, forced: false, .. } if node == "n1")
    ));
    assert!(
        !plan
            .iter()
            .any(|op| matches!(op, AttachOperation::Attach { .. })),
        "{plan:?}"
    );
    env.reconciler.run_until_idle(5).await;
    env.assert_moved_to_n2();
}

#[tokio::test]
async fn multi_attach_is_blocked_by_confirmed_attachments_not_by_uncertain_attaches() {
    // Confirmed on n1, still used there: n2 must wait.
    let env = env(AttachConfig::default());
    env.add("n1", NodeAccess::SingleNode);
    env.reconciler.run_until_idle(5).await;
    env.add("n2", NodeAccess::SingleNode);
    env.reconciler.run_until_idle(5).await;
    assert_eq!(env.calls(), [n(Attach, "n1")]);
    assert_eq!(env.state("n2"), None);

    // Multi-node volumes attach everywhere.
    let env = crate::env(AttachConfig::default());
    env.add("n1", NodeAccess::MultiNode);
    env.add("n2", NodeAccess::MultiNode);
    env.reconciler.run_until_idle(5).await;
    assert_eq!(env.calls(), [n(Attach, "n1"), n(Attach, "n2")]);

    // An uncertain attachment elsewhere does not block.
    let env = crate::env(AttachConfig::default());
    env.plugin.fail_once(Attach, None, ErrorKind::Uncertain);
    env.add("n1", NodeAccess::SingleNode);
    env.reconciler.run_pass().await;
    assert_eq!(env.state("n1"), Some(AttachState::Uncertain));
    env.add("n2", NodeAccess::SingleNode);
    // Single-node attaches share a volume-level key, so wait out n1's backoff.
    env.clock.advance(Duration::from_millis(500));
    let plan = env.reconciler.plan();
    assert!(
        plan.iter()
            .any(|op| matches!(op, AttachOperation::Attach { node, .. } if node == "n2")),
        "{plan:?}"
    );
}

#[tokio::test]
async fn force_detach_only_for_an_unhealthy_node_past_the_max_wait() {
    let env = env(AttachConfig::default());
    env.attached("n1", NodeAccess::SingleNode).await;
    env.remove("n1");
    env.reconciler.run_until_idle(5).await; // detach requested now

    // Healthy but still mounted: wait forever.
    env.clock.advance(Duration::from_secs(7 * 60));
    env.reconciler.run_until_idle(5).await;
    assert!(env.calls().is_empty());

    // Unhealthy: the request is 7 min old, past the 6 min maximum.
    env.actual.set_node_health(
        "n1".into(),
        NodeHealth {
            unhealthy: true,
            out_of_service: false,
        },
    );
    let plan = env.reconciler.plan();
    assert!(
        matches!(
            plan.as_slice(),
            [AttachOperation::Detach { forced: true, .. }]
        ),
        "{plan:?}"
    );
    env.reconciler.run_until_idle(5).await;
    assert_eq!(env.calls(), [n(Detach, "n1")]);
}

#[tokio::test]
async fn unhealthy_node_within_the_max_wait_or_with_force_disabled_is_not_detached() {
    for (config, advance) in [
        (AttachConfig::default(), Duration::from_secs(5 * 60)),
        (
            AttachConfig {
                max_wait_for_unmount: None,
                ..AttachConfig::default()
            },
            Duration::from_secs(3600),
        ),
    ] {
        let env = env(config);
        env.attached("n1", NodeAccess::SingleNode).await;
        env.actual.set_node_health(
            "n1".into(),
            NodeHealth {
                unhealthy: true,
                out_of_service: false,
            },
        );
        env.remove("n1");
        env.reconciler.run_until_idle(5).await;
        env.clock.advance(advance);
        env.reconciler.run_until_idle(5).await;
        assert!(env.calls().is_empty(), "{config:?}");
        assert_eq!(env.state("n1"), Some(AttachState::Attached));
    }
}

#[tokio::test]
async fn out_of_service_node_is_detached_at_once() {
    let env = env(AttachConfig {
        max_wait_for_unmount: None,
        ..AttachConfig::default()
    });
    env.attached("n1", NodeAccess::SingleNode).await;
    env.actual.set_node_health(
        "n1".into(),
        NodeHealth {
            unhealthy: false,
            out_of_service: true,
        },
    );
    env.remove("n1");
    env.reconciler.run_until_idle(5).await;
    assert_eq!(env.calls(), [n(Detach, "n1")]);
    assert!(env.actual.snapshot().is_empty());
}

#[tokio::test]
async fn failed_detach_is_detach_uncertain_reported_again_and_retried_after_backoff() {
    let env = env(AttachConfig::default());
    env.attached_with_an_uncertain_detach_next("n1").await;
    env.remove("n1");
    env.reconciler.run_until_idle(5).await;
    assert_eq!(env.state("n1"), Some(AttachState::DetachUncertain));
    assert_eq!(
        env.actual.snapshot().attached_as_reported(&"n1".into()),
        ["v1"]
    );
    assert!(env.reconciler.plan().is_empty(), "in backoff");
    env.clock.advance(Duration::from_millis(500));
    env.reconciler.run_until_idle(5).await;
    assert_eq!(env.calls(), [n(Detach, "n1"), n(Detach, "n1")]);
    assert!(env.actual.snapshot().is_empty());
}

#[tokio::test(start_paused = true)]
async fn never_detached_while_an_operation_on_the_volume_is_pending() {
    let env = env(AttachConfig::default());
    env.add("n1", NodeAccess::SingleNode);
    env.reconciler.run_until_idle(5).await;
    env.not_in_use("n1");
    env.plugin.delay(Detach, None, 1, Duration::from_secs(30));
    env.remove("n1");
    let reconciler = env.reconciler.clone();
    let detach = tokio::spawn(async move { reconciler.run_pass().await });
    while env.plugin.count(Detach) == 0 {
        tokio::task::yield_now().await;
    }
    // Pending: no second detach, and no attach elsewhere for this
    // single-node volume (volume-level key).
    env.add("n2", NodeAccess::SingleNode);
    let plan = env.reconciler.plan();
    assert!(plan.is_empty(), "{plan:?}");
    let attach = AttachOperation::Attach {
        volume: "v1".into(),
        node: "n2".into(),
        spec: Arc::new(spec(NodeAccess::SingleNode)),
    };
    assert_eq!(
        env.reconciler.execute(attach).await,
        volume_state::ExecutionResult::Skipped(volume_state::GateError::AlreadyExists)
    );
    assert_eq!(env.state("n1"), Some(AttachState::Attached));
    detach.await.unwrap();
    env.reconciler.run_until_idle(5).await;
    assert_eq!(env.state("n1"), None);
    assert_eq!(env.state("n2"), Some(AttachState::Attached));
}

/// A failed detach from n1 leaves a single-node volume
/// maybe attached there; it must not be attached to n2 until the detach
/// succeeds (Kubernetes counts only confirmed attachments and attaches n2
/// at once).
#[tokio::test]
async fn failed_detach_blocks_attaching_a_single_node_volume_elsewhere_until_it_succeeds() {
    let env = env(AttachConfig::default());
    env.attached_with_an_uncertain_detach_next("n1").await;
    env.move_pod("n1", "n2", NodeAccess::SingleNode);
    env.reconciler.run_until_idle(5).await;
    assert_eq!(env.calls(), [n(Detach, "n1")]);
    assert_eq!(env.state("n2"), None, "attached while n1 may hold it");
    assert_eq!(env.state("n1"), Some(AttachState::DetachUncertain));
    assert_eq!(env.actual.snapshot().holding_nodes(&"v1".into()), ["n1"]);
    // Still blocked while the detach backs off.
    env.clock.advance(Duration::from_millis(499));
    assert!(env.reconciler.plan().is_empty());
    // The retried detach succeeds: now n2 gets it.
    env.clock.advance(Duration::from_millis(1));
    env.reconciler.run_until_idle(5).await;
    env.assert_moved_to_n2();
}

#[tokio::test]
async fn a_failed_detach_does_not_block_a_multi_node_volume_or_when_opted_out() {
    for (mode, config) in [
        (NodeAccess::MultiNode, AttachConfig::default()),
        (
            NodeAccess::SingleNode,
            AttachConfig {
                attach_while_detach_uncertain: true,
                ..AttachConfig::default()
            },
        ),
    ] {
        let env = env(config);
        env.attached_unused("n1", mode).await;
        env.plugin.fail_once(Detach, None, ErrorKind::Final);
        env.move_pod("n1", "n2", mode);
        env.reconciler.run_until_idle(5).await;
        assert_eq!(
            env.calls(),
            [n(Detach, "n1"), n(Attach, "n2")],
            "{mode:?} {config:?}"
        );
        assert_eq!(env.state("n1"), Some(AttachState::DetachUncertain));
    }
}

#[tokio::test]
async fn a_failed_attach_never_clears_detach_uncertain() {
    let env = env(AttachConfig::default());
    env.attached_with_an_uncertain_detach_next("n1").await;
    env.remove("n1");
    env.reconciler.run_until_idle(5).await;
    assert_eq!(env.state("n1"), Some(AttachState::DetachUncertain));
    // Wanted on n1 again: attach confirms it, but a final attach error says
    // nothing about the earlier attachment.
    env.plugin.fail_once(Attach, None, ErrorKind::Final);
    env.add("n1", NodeAccess::SingleNode);
    env.reconciler.run_pass().await;
    assert_eq!(env.state("n1"), Some(AttachState::DetachUncertain));
    env.clock.advance(Duration::from_secs(1));
    env.reconciler.run_until_idle(5).await;
    assert_eq!(env.state("n1"), Some(AttachState::Attached));
}

/// Gate records of a volume nobody
/// wants and nothing holds are dropped.
#[tokio::test]
async fn gate_records_of_forgotten_volumes_are_purged() {
    let env = env(AttachConfig::default());
    env.plugin.fail_always(Attach, None, ErrorKind::Final);
    env.add("n1", NodeAccess::SingleNode);
    env.reconciler.run_until_idle(5).await;
    assert_eq!(env.reconciler.gate().state().len(), 1);
    env.remove("n1");
    env.reconciler.run_until_idle(5).await;
    assert!(env.reconciler.gate().state().is_empty());
}
