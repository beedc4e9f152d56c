//! Restarts and reboots of the node side: reconstruction from mounts found
//! on disk and from the intent journal (kubernetes#85476, #117513 and
//! #120853).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use OperationKind::*;
use volume_state::journal::{FakeJournalStore, Journal, JournalStore};
use volume_state::mounts::{FakeMountTable, MountEvidence, MountIdentity};
use volume_state::node::{
    ActualNodeState, AttachMode, AttachState, DesiredNodeState, DeviceState, DiscoveredMount,
    NodeReconciler, PodMountState,
};
use volume_state::{FakeClock, FakeVolumePlugin, OperationKind, VolumeSpec};

type Store = FakeJournalStore<String, String>;
type Plugin = FakeVolumePlugin<String, String>;

/// One run of the node agent: fresh in-memory state over a journal store
/// and a mount table that outlive it.
struct Node {
    desired: Arc<DesiredNodeState<String, String>>,
    actual: Arc<ActualNodeState<String, String>>,
    plugin: Arc<Plugin>,
    journal: Arc<Journal<String, String>>,
    clock: FakeClock,
    reconciler: Arc<NodeReconciler<String, String, String>>,
}

fn start(mode: AttachMode, store: &Arc<Store>, mounts: &Arc<FakeMountTable>) -> Node {
    let desired = Arc::new(DesiredNodeState::new());
    let actual = Arc::new(ActualNodeState::new());
    let plugin = Arc::new(Plugin::new());
    let journal = Arc::new(Journal::open(store.clone()).unwrap());
    let clock = FakeClock::new();
    let reconciler = Arc::new(
        NodeReconciler::new(
            "node-1".to_string(),
            mode,
            desired.clone(),
            actual.clone(),
            plugin.clone(),
        )
        .with_clock(Arc::new(clock.clone()))
        .with_journal(journal.clone())
        .with_mount_table(mounts.clone()),
    );
    Node {
        desired,
        actual,
        plugin,
        journal,
        clock,
        reconciler,
    }
}

fn spec(volume: &str) -> VolumeSpec {
    VolumeSpec {
        attachable: true,
        staging_path: Some(staging(volume)),
        ..VolumeSpec::default()
    }
}

fn staging(volume: &str) -> PathBuf {
    PathBuf::from(format!("/staging/{volume}"))
}

fn target(pod: &str, volume: &str) -> PathBuf {
    PathBuf::from(format!("/pods/{pod}/{volume}"))
}

fn disk(minor: u32) -> MountIdentity {
    MountIdentity {
        device: (8, minor),
        root: "/".into(),
        fs_type: "ext4".into(),
        source: format!("/dev/sd{}", char::from(b'a' + minor as u8)),
        boot_id: Some("boot-1".into()),
    }
}

impl Node {
    fn add(&self, volume: &str, pod: &str) {
        self.desired
            .add_pod(volume.into(), spec(volume), pod.into(), target(pod, volume));
    }

    /// Recorded (method, volume) pairs since the last call.
    fn calls(&self) -> Vec<(OperationKind, String)> {
        self.plugin.take_call_summary()
    }

    async fn settle(&self) {
        assert!(
            self.reconciler.run_until_idle(20).await < 20,
            "did not settle"
        );
    }

    /// Mounts found on disk for `pods` of `volume`, looked up in `mounts`.
    fn scan(
        &self,
        mounts: &FakeMountTable,
        volume: &str,
        pods: &[&str],
    ) -> Vec<DiscoveredMount<String, String>> {
        pods.iter()
            .map(|pod| {
                DiscoveredMount::new(volume.to_string(), pod.to_string(), target(pod, volume))
                    .with_staging_path(staging(volume))
                    .with_device_path("/dev/stale")
                    .checked(mounts)
            })
            .collect()
    }
}

fn v(method: OperationKind, volume: &str) -> (OperationKind, String) {
    (method, volume.to_string())
}

/// The first run mounts `volume` for `pod` (the "driver" mounts `source`
/// at both paths) and stays up; its journal records the sources.
async fn mounted_run(
    store: &Arc<Store>,
    mounts: &Arc<FakeMountTable>,
    volume: &str,
    pod: &str,
    source: MountIdentity,
) -> Node {
    mounts.mount(staging(volume), source.clone());
    mounts.mount(target(pod, volume), source.clone());
    let node = start(AttachMode::ByNode, store, mounts);
    node.desired.mark_populated();
    node.add(volume, pod);
    node.settle().await;
    assert_eq!(
        node.calls(),
        [v(Attach, volume), v(Stage, volume), v(Publish, volume)]
    );
    let record = node.journal.get(&volume.into()).unwrap();
    assert!(record.attached);
    assert_eq!(record.staged, Some(source.clone()));
    assert_eq!(record.pods[pod].source, Some(source));
    node
}

/// kubernetes#85476: the process stops after the last unpublish and before
/// the unstage. No pod directory is left to find, but the journal still
/// says the volume is staged and attached: both are undone.
#[tokio::test]
async fn restart_between_unpublish_and_unstage_still_unstages_and_detaches() {
    let store = Arc::new(Store::new());
    let mounts = Arc::new(FakeMountTable::new());
    let first = mounted_run(&store, &mounts, "v1", "a", disk(1)).await;
    assert!(first.desired.remove_pod(&"v1".into(), &"a".into()));
    first.reconciler.run_pass().await; // unpublish only
    assert_eq!(first.calls(), [v(Unpublish, "v1")]);
    mounts.unmount(&target("a", "v1"));
    drop(first); // the restart

    let second = start(AttachMode::ByNode, &store, &mounts);
    let report = second.actual.reconstruct_with_journal(
        [],
        &second.journal.records(),
        |_| None, // the volume's metadata is gone too
    );
    assert_eq!(report.from_journal, 1);
    let snapshot = second.actual.snapshot();
    let volume = snapshot.get(&"v1".into()).unwrap();
    assert_eq!(volume.device, DeviceState::Uncertain);
    assert!(volume.pods.is_empty());
    second.desired.mark_populated();
    second.settle().await;
    assert_eq!(second.calls(), [v(Unstage, "v1"), v(Detach, "v1")]);
    assert!(second.actual.snapshot().is_empty());
    assert!(store.load().unwrap().is_empty(), "journal emptied");
}

/// A crash while stage runs: the intent was written first, so the maybe
/// staged volume is unstaged and detached after the restart.
#[tokio::test]
async fn a_crash_during_stage_is_torn_down_after_the_restart() {
    let store = Arc::new(Store::new());
    let mounts = Arc::new(FakeMountTable::new());
    let first = start(AttachMode::ByNode, &store, &mounts);
    first.desired.mark_populated();
    let hold = first.plugin.hold(Stage, None);
    first.add("v1", "a");
    first.reconciler.run_pass().await; // attach
    let reconciler = first.reconciler.clone();
    let stage = tokio::spawn(async move { reconciler.run_pass().await });
    hold.entered().await;
    stage.abort(); // the crash
    assert!(stage.await.unwrap_err().is_cancelled());
    let record = store.load().unwrap()["v1"].clone();
    assert!(record.attached);
    assert_eq!(record.staging_path, Some(staging("v1")));

    let second = start(AttachMode::ByNode, &store, &mounts);
    second
        .actual
        .reconstruct_with_journal([], &second.journal.records(), |v| Some(spec(v)));
    second.desired.mark_populated();
    second.settle().await;
    assert_eq!(second.calls(), [v(Unstage, "v1"), v(Detach, "v1")]);
    assert!(store.load().unwrap().is_empty());
}

#[tokio::test]
async fn a_failed_intent_write_keeps_the_step_from_running() {
    let store = Arc::new(Store::new());
    let mounts = Arc::new(FakeMountTable::new());
    let node = start(AttachMode::ByNode, &store, &mounts);
    node.desired.mark_populated();
    store.set_failing(true);
    node.add("v1", "a");
    let report = node.reconciler.run_pass().await;
    assert_eq!(report.failed, 1);
    assert!(node.calls().is_empty(), "attach must not run unrecorded");
    store.set_failing(false);
    node.clock.advance(Duration::from_millis(500));
    node.settle().await;
    assert_eq!(
        node.calls(),
        [v(Attach, "v1"), v(Stage, "v1"), v(Publish, "v1")]
    );
}

#[tokio::test]
async fn concurrent_publishes_of_one_volume_keep_each_others_intents() {
    let store = Arc::new(Store::new());
    let mounts = Arc::new(FakeMountTable::new());
    let node = start(AttachMode::ByNode, &store, &mounts);
    node.desired.mark_populated();
    node.add("v1", "a");
    node.settle().await;
    // b's publish is held; c's mounts this.
    let hold = node.plugin.hold(Publish, None);
    mounts.mount(target("c", "v1"), disk(3));
    node.add("v1", "b");
    node.add("v1", "c");
    let reconciler = node.reconciler.clone();
    let pass = tokio::spawn(async move { reconciler.run_pass().await });
    hold.entered().await;
    // Once c's result is recorded, b's intent (in flight) must still be there.
    let recorded = |node: &Node| {
        node.journal
            .get(&"v1".into())
            .is_some_and(|r| r.pods.get("c").is_some_and(|c| c.source.is_some()))
    };
    tokio::time::timeout(Duration::from_secs(10), async {
        while !recorded(&node) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("c's publish was recorded");
    assert!(!pass.is_finished());
    let record = store.load().unwrap()["v1"].clone();
    let pods: Vec<&String> = record.pods.keys().collect();
    assert_eq!(pods, ["a", "b", "c"]);
    assert_eq!(record.pods["b"].source, None, "b is only intended");
    hold.release();
    pass.await.unwrap();
    assert_eq!(node.journal.get(&"v1".into()).unwrap().pods.len(), 3);
}

/// After a process restart the volume's mounts are still
/// there. Attached, not attached again; trusted mounts are neither staged
/// nor published again.
#[tokio::test]
async fn after_a_restart_mounts_that_prove_themselves_are_left_alone() {
    let store = Arc::new(Store::new());
    let mounts = Arc::new(FakeMountTable::new());
    drop(mounted_run(&store, &mounts, "v1", "a", disk(1)).await);

    let second = start(AttachMode::ByNode, &store, &mounts);
    let found = second.scan(&mounts, "v1", &["a"]);
    assert_eq!(found[0].target, MountEvidence::Mounted(disk(1)));
    let report = second
        .actual
        .reconstruct_with_journal(found, &second.journal.records(), |v| Some(spec(v)));
    assert_eq!((report.reconstructed, report.verified), (1, 1));
    let snapshot = second.actual.snapshot();
    let volume = snapshot.get(&"v1".into()).unwrap();
    assert_eq!(volume.attach, AttachState::Attached);
    assert_eq!(
        volume.attach_info.device_path,
        Some("/dev/fake/\"v1\"".into()),
        "the journal's attach info, not the scanner's stale guess"
    );
    assert!(matches!(volume.device, DeviceState::Mounted { .. }));
    second.desired.mark_populated();
    second.add("v1", "a");
    second.settle().await;
    assert!(second.calls().is_empty());
}

#[tokio::test]
async fn a_mount_without_journal_proves_attachment_and_verified_ones_are_trusted() {
    let mounts = Arc::new(FakeMountTable::new());
    mounts.mount(target("a", "seen"), disk(1));
    let node = start(AttachMode::ByNode, &Arc::new(Store::new()), &mounts);
    let found = [
        // Something is mounted there, but nothing recorded what: attached,
        // staged and published again.
        DiscoveredMount::new("seen".to_string(), "a".to_string(), target("a", "seen"))
            .with_staging_path(staging("seen"))
            .checked(mounts.as_ref()),
        // The caller vouches for these mounts.
        DiscoveredMount::new("sure".to_string(), "b".to_string(), target("b", "sure"))
            .with_staging_path(staging("sure"))
            .verified(),
        // Not looked at: trusted for nothing.
        DiscoveredMount::new("blind".to_string(), "c".to_string(), target("c", "blind"))
            .with_staging_path(staging("blind")),
    ];
    let report = node.actual.reconstruct(found, |v| Some(spec(v)));
    assert_eq!((report.reconstructed, report.verified), (3, 1));
    let snapshot = node.actual.snapshot();
    let attach = |v: &str| snapshot.get(&v.into()).unwrap().attach;
    assert_eq!(attach("seen"), AttachState::Attached);
    assert_eq!(attach("sure"), AttachState::Attached);
    assert_eq!(attach("blind"), AttachState::Uncertain);
    node.desired.mark_populated();
    node.add("seen", "a");
    node.add("sure", "b");
    node.add("blind", "c");
    node.settle().await;
    let mut calls = node.calls();
    // Grouped by volume, each volume's calls in order.
    calls.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(
        calls,
        [
            v(Attach, "blind"),
            v(Stage, "blind"),
            v(Publish, "blind"),
            v(Stage, "seen"),
            v(Publish, "seen"),
        ]
    );
}

/// kubernetes#117513 and #120853: after a reboot the pod directories are
/// left but nothing is mounted, or another volume's disk got the old
/// device name and is mounted at the staging path. Neither is taken for
/// the volume: it is attached again (fresh device path), staged, and only
/// then published.
#[tokio::test]
async fn after_a_reboot_leftover_or_foreign_mounts_are_never_used() {
    for foreign in [false, true] {
        let store = Arc::new(Store::new());
        let mounts = Arc::new(FakeMountTable::new());
        drop(mounted_run(&store, &mounts, "v1", "a", disk(1)).await);

        mounts.clear(); // the reboot
        if foreign {
            mounts.mount(staging("v1"), disk(2));
            mounts.mount(target("a", "v1"), disk(2));
        }
        let second = start(AttachMode::ByNode, &store, &mounts);
        let found = second.scan(&mounts, "v1", &["a"]);
        let report =
            second
                .actual
                .reconstruct_with_journal(found, &second.journal.records(), |v| Some(spec(v)));
        assert_eq!(report.verified, 0);
        assert_eq!(report.mismatched, if foreign { 2 } else { 0 });
        let snapshot = second.actual.snapshot();
        let volume = snapshot.get(&"v1".into()).unwrap();
        assert_eq!(volume.attach, AttachState::Uncertain, "foreign={foreign}");
        assert_eq!(volume.device, DeviceState::Uncertain);
        assert_eq!(
            volume.pods["a"].state,
            PodMountState::Uncertain,
            "foreign={foreign}"
        );

        second.desired.mark_populated();
        second.add("v1", "a");
        second.settle().await;
        let calls = second.plugin.take_calls();
        let order: Vec<_> = calls.iter().map(|c| c.method).collect();
        assert_eq!(order, [Attach, Stage, Publish], "foreign={foreign}");
        let snapshot = second.actual.snapshot();
        assert_ne!(
            snapshot.get(&"v1".into()).unwrap().attach_info.device_path,
            Some("/dev/stale".into())
        );
    }
}

/// In controller-attach mode the node must report in use
/// both what is wanted and what is still mounted. After a restart the list
/// covers the reconstructed volumes, and reporting it lets the wanted one
/// leave the uncertain state.
#[tokio::test]
async fn volumes_in_use_after_a_restart_cover_desired_and_still_mounted_volumes() {
    let store = Arc::new(Store::new());
    let mounts = Arc::new(FakeMountTable::new());
    // The previous run: "kept" published for a, "gone" staged only.
    let journal = Journal::open(store.clone()).unwrap();
    for (volume, pods) in [("kept", &["a"][..]), ("gone", &[][..])] {
        journal
            .update(&volume.to_string(), |r| {
                r.staging_path = Some(staging(volume));
                for pod in pods {
                    r.pods.insert(
                        pod.to_string(),
                        volume_state::journal::PublishIntent {
                            target_path: target(pod, volume),
                            source: None,
                        },
                    );
                }
            })
            .await
            .unwrap();
    }
    drop(journal);

    let node = start(AttachMode::ByController, &store, &mounts);
    node.actual
        .reconstruct_with_journal([], &node.journal.records(), |v| Some(spec(v)));
    node.add("kept", "a");
    node.desired.mark_populated();
    assert_eq!(node.reconciler.volumes_in_use(), ["gone", "kept"]);
    node.settle().await;
    // Not yet reported: "gone" is unstaged, "kept" waits uncertain.
    assert_eq!(node.calls(), [v(Unstage, "gone")]);
    let in_use = node.reconciler.volumes_in_use();
    assert_eq!(in_use, ["kept"]);
    assert_eq!(
        node.actual.snapshot().get(&"kept".into()).unwrap().attach,
        AttachState::Uncertain
    );
    node.desired.mark_volumes_reported_in_use(&in_use);
    node.settle().await;
    assert_eq!(
        node.calls(),
        [
            v(VerifyAttached, "kept"),
            v(Stage, "kept"),
            v(Publish, "kept")
        ]
    );
    assert_eq!(node.reconciler.volumes_in_use(), ["kept"]);
}

#[tokio::test]
async fn volumes_in_use_include_volumes_still_mounted_but_no_longer_wanted() {
    let store = Arc::new(Store::new());
    let mounts = Arc::new(FakeMountTable::new());
    let node = start(AttachMode::ByController, &store, &mounts);
    let found = ["kept", "gone"].map(|volume| {
        DiscoveredMount::new(volume.to_string(), "a".to_string(), target("a", volume))
            .with_staging_path(staging(volume))
    });
    let orphan = DiscoveredMount::new("orphan".to_string(), "b".to_string(), target("b", "orphan"));
    node.actual
        .reconstruct(found.into_iter().chain([orphan]), |v| {
            (v != "orphan").then(|| spec(v))
        });
    node.add("kept", "a");
    node.add("new", "a");
    // Before the populator is done nothing is torn down; all are in use.
    assert_eq!(
        node.reconciler.volumes_in_use(),
        ["gone", "kept", "new", "orphan"]
    );
    let in_use = node.reconciler.volumes_in_use();
    node.desired.mark_volumes_reported_in_use(&in_use);
    node.desired.mark_populated();
    node.settle().await;
    assert_eq!(node.reconciler.volumes_in_use(), ["kept", "new"]);
    let snapshot = node.actual.snapshot();
    for volume in ["kept", "new"] {
        assert_eq!(
            snapshot
                .pod_mount(&volume.into(), &"a".into())
                .unwrap()
                .state,
            PodMountState::Mounted
        );
    }
}

/// In controller-attach mode the node owes no detach, yet the attach info
/// (publish context, device path) must survive a restart for the stage
/// and publish that may follow it.
#[tokio::test]
async fn controller_attach_mode_keeps_the_attach_info_across_a_restart() {
    let store = Arc::new(Store::new());
    let mounts = Arc::new(FakeMountTable::new());
    mounts.mount(staging("v1"), disk(1));
    mounts.mount(target("a", "v1"), disk(1));
    let first = start(AttachMode::ByController, &store, &mounts);
    first.add("v1", "a");
    first.desired.mark_populated();
    first
        .desired
        .mark_volumes_reported_in_use(&first.reconciler.volumes_in_use());
    first.settle().await;
    assert_eq!(
        first.calls(),
        [v(VerifyAttached, "v1"), v(Stage, "v1"), v(Publish, "v1")]
    );
    let record = store.load().unwrap()["v1"].clone();
    assert!(!record.attached, "the controller detaches, not the node");
    let info = record.attach_info.expect("attach info kept");
    assert_eq!(info.device_path, Some("/dev/fake/\"v1\"".into()));
    drop(first);

    let second = start(AttachMode::ByController, &store, &mounts);
    let found = second.scan(&mounts, "v1", &["a"]);
    second
        .actual
        .reconstruct_with_journal(found, &second.journal.records(), |v| Some(spec(v)));
    let snapshot = second.actual.snapshot();
    let volume = snapshot.get(&"v1".into()).unwrap();
    assert_eq!(volume.attach, AttachState::Attached);
    assert_eq!(*volume.attach_info, info);
}

fn sized(volume: &str, bytes: u64) -> VolumeSpec {
    VolumeSpec {
        desired_size: Some(bytes),
        ..spec(volume)
    }
}

impl Node {
    fn add_sized(&self, volume: &str, pod: &str, bytes: u64) {
        self.desired.add_pod(
            volume.into(),
            sized(volume, bytes),
            pod.into(),
            target(pod, volume),
        );
    }

    /// Reconstructs `volume` for `pods` from the mounts and the journal,
    /// the spec (the API's) wanting `bytes`.
    fn reconstruct_sized(&self, mounts: &FakeMountTable, volume: &str, pods: &[&str], bytes: u64) {
        let found = self.scan(mounts, volume, pods);
        self.actual
            .reconstruct_with_journal(found, &self.journal.records(), |v| Some(sized(v, bytes)));
    }
}

/// The first run sets `volume` up for `pod` at `bytes`; the journal
/// keeps that size.
async fn sized_run(
    store: &Arc<Store>,
    mounts: &Arc<FakeMountTable>,
    volume: &str,
    pod: &str,
    bytes: u64,
) -> Node {
    mounts.mount(staging(volume), disk(1));
    mounts.mount(target(pod, volume), disk(1));
    let node = start(AttachMode::ByNode, store, mounts);
    node.desired.mark_populated();
    node.add_sized(volume, pod, bytes);
    node.settle().await;
    assert_eq!(
        node.calls(),
        [v(Attach, volume), v(Stage, volume), v(Publish, volume)]
    );
    assert_eq!(store.load().unwrap()[volume].size, Some(bytes));
    node
}

/// The PV grew (ControllerExpandVolume done) and the process stopped
/// before NodeExpandVolume. The size the node was set up at was only in
/// memory, so the restarted node, reconstructed from its mounts and the
/// journal with the PV's new size as the spec, took the volume for
/// expanded and never expanded it. Kubelet compares the PV's capacity with
/// the size the node recorded (the PVC's status), which a restart keeps:
/// the journal keeps it now.
#[tokio::test]
async fn an_expansion_interrupted_by_a_restart_is_made_after_it() {
    let store = Arc::new(Store::new());
    let mounts = Arc::new(FakeMountTable::new());
    let first = sized_run(&store, &mounts, "v1", "a", 10).await;
    first.add_sized("v1", "a", 20); // the PV grew; no pass ran
    drop(first);

    let second = start(AttachMode::ByNode, &store, &mounts);
    second.reconstruct_sized(&mounts, "v1", &["a"], 20);
    let snapshot = second.actual.snapshot();
    assert_eq!(snapshot.get(&"v1".into()).unwrap().size, Some(10));
    second.desired.mark_populated();
    second.add_sized("v1", "a", 20);
    second.settle().await;
    assert_eq!(second.calls(), [v(Expand, "v1")]);
    assert_eq!(store.load().unwrap()["v1"].size, Some(20));
    assert_eq!(second.plugin.size(&"v1".into()), Some(20));

    // A restart after the expansion does not expand again.
    drop(second);
    let third = start(AttachMode::ByNode, &store, &mounts);
    third.reconstruct_sized(&mounts, "v1", &["a"], 20);
    third.desired.mark_populated();
    third.add_sized("v1", "a", 20);
    third.settle().await;
    assert!(third.calls().is_empty());
}

/// A crash while NodeExpandVolume runs: the size is recorded only once it
/// succeeded, so the restart expands again; and a volume staged and
/// published again after the restart (its mounts not proven) is not taken
/// for grown by the re-stage either.
#[tokio::test]
async fn a_crash_during_expansion_expands_again_after_the_restart() {
    let store = Arc::new(Store::new());
    let mounts = Arc::new(FakeMountTable::new());
    let first = sized_run(&store, &mounts, "v1", "a", 10).await;
    let hold = first.plugin.hold(Expand, None);
    first.add_sized("v1", "a", 20);
    let reconciler = first.reconciler.clone();
    let expand = tokio::spawn(async move { reconciler.run_pass().await });
    hold.entered().await;
    expand.abort(); // the crash
    assert!(expand.await.unwrap_err().is_cancelled());
    assert_eq!(store.load().unwrap()["v1"].size, Some(10));
    drop(first);
    // The mounts are gone too (a reboot): nothing proves the set-up.
    mounts.unmount(&target("a", "v1"));
    mounts.unmount(&staging("v1"));

    let second = start(AttachMode::ByNode, &store, &mounts);
    second.reconstruct_sized(&mounts, "v1", &["a"], 20);
    second.desired.mark_populated();
    second.add_sized("v1", "a", 20);
    second.settle().await;
    let calls = second.calls();
    assert!(calls.contains(&v(Stage, "v1")), "{calls:?}");
    assert_eq!(calls.last(), Some(&v(Expand, "v1")), "{calls:?}");
    assert_eq!(store.load().unwrap()["v1"].size, Some(20));
}
