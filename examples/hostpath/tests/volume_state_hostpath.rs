//! volume-state's reconciler drives the hostpath example through the
//! CSI-backed plugin: from empty to mounted for several pods (attach, stage,
//! publish over the real socket, real bind mounts) and back to empty, with a
//! clean mount table and no attachment left at the end.

use e2e_support as support;

use std::sync::Arc;

use csi_client::CsiClient;
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::*;
use mount_utils::require_root;
use support::{Driver, calls, mounts_under, run_isolated};
use volume_state::csi::CsiVolumePlugin;
use volume_state::node::PodMountState;
use volume_state::node::{ActualNodeState, AttachMode, DesiredNodeState, NodeReconciler};
use volume_state::{NodeAccess, VolumeSpec};

/// The driver under test, built by cargo for this package's tests.
const HOSTPATH: &str = env!("CARGO_BIN_EXE_hostpath");

/// Runs reconcile passes until `done` holds (bounded: 30 s), sleeping
/// between rounds so backoff windows can pass.
async fn converge(reconciler: &NodeReconciler<String, String, String>, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "the reconciler did not converge in 30 s"
        );
        reconciler.run_until_idle(20).await;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The nodes the driver says `volume` is attached to.
async fn published_node_ids(client: &CsiClient, volume: &str) -> Vec<String> {
    let got = client
        .controller()
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: volume.to_owned(),
        })
        .await
        .unwrap()
        .into_inner();
    got.status.unwrap_or_default().published_node_ids
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn reconciler_mounts_pods_through_hostpath_and_tears_everything_down() {
    require_root!("reconciler_mounts_pods_through_hostpath_and_tears_everything_down");
    run_isolated("volume-state-hostpath", || async {
        let dir = tempfile::tempdir().unwrap();
        let driver = Driver::start(HOSTPATH, &dir.path().join("state"), &["--enable-attach"]);
        let client = driver.client().await;
        let node_id = calls::node_id(&client).await;

        // The provisioner's part: two volumes, one shared by two pods.
        let mut ids = Vec::new();
        for (name, mode) in [
            ("pvc-solo", Mode::SingleNodeWriter),
            ("pvc-shared", Mode::MultiNodeMultiWriter),
        ] {
            let req = CreateVolumeRequest {
                name: name.into(),
                capacity_range: Some(CapacityRange::at_least(8 << 20)),
                volume_capabilities: vec![VolumeCapability::mount("").with_access_mode(mode)],
                ..Default::default()
            };
            ids.push(
                client
                    .controller()
                    .create_volume(req)
                    .await
                    .unwrap()
                    .into_inner()
                    .volume
                    .unwrap()
                    .volume_id,
            );
        }
        let (solo, shared) = (ids[0].clone(), ids[1].clone());

        let desired = Arc::new(DesiredNodeState::<String, String>::new());
        let actual = Arc::new(ActualNodeState::new());
        let plugin = Arc::new(CsiVolumePlugin::new(client.clone()));
        let reconciler = NodeReconciler::new(
            node_id.clone(),
            AttachMode::ByNode,
            desired.clone(),
            actual.clone(),
            plugin,
        );
        let spec = |vol: &str, access: NodeAccess| VolumeSpec {
            attachable: true,
            staging_path: Some(dir.path().join("staging").join(vol)),
            access_mode: access,
            ..VolumeSpec::default()
        };
        for vol in [&solo, &shared] {
            std::fs::create_dir_all(dir.path().join("staging").join(vol)).unwrap();
        }
        let pods = [
            (solo.clone(), NodeAccess::SingleNode, "pod-a"),
            (shared.clone(), NodeAccess::MultiNode, "pod-b"),
            (shared.clone(), NodeAccess::MultiNode, "pod-c"),
        ];
        for (vol, access, pod) in &pods {
            let target = dir.path().join("pods").join(pod).join("vol");
            std::fs::create_dir_all(target.parent().unwrap()).unwrap();
            desired.add_pod(vol.clone(), spec(vol, *access), pod.to_string(), target);
        }
        desired.mark_populated();
        // Concurrent publishes of the shared volume may meet ABORTED from the
        // driver's per-volume lock; the reconciler retries after its backoff.
        let all_mounted = || {
            let snapshot = actual.snapshot();
            pods.iter().all(|(vol, _, pod)| {
                snapshot
                    .pod_mount(vol, &pod.to_string())
                    .is_some_and(|m| m.state == PodMountState::Mounted)
            })
        };
        converge(&reconciler, all_mounted).await;

        let mounts = mounts_under(dir.path());
        assert_eq!(mounts.len(), 5, "2 staging + 3 pod mounts: {mounts:?}");
        for vol in [&solo, &shared] {
            assert_eq!(
                published_node_ids(&client, vol).await,
                vec![node_id.clone()],
                "{vol} attached"
            );
        }

        // Pods go away one by one: the shared volume stays until its last pod.
        desired.remove_pod(&shared, &"pod-b".to_string());
        converge(&reconciler, || mounts_under(dir.path()).len() == 4).await;
        desired.remove_pod(&solo, &"pod-a".to_string());
        desired.remove_pod(&shared, &"pod-c".to_string());
        converge(&reconciler, || {
            mounts_under(dir.path()).is_empty() && actual.snapshot().volumes().next().is_none()
        })
        .await;

        assert_eq!(
            mounts_under(dir.path()),
            Vec::<std::path::PathBuf>::new(),
            "clean mount table"
        );
        for vol in [&solo, &shared] {
            assert!(
                published_node_ids(&client, vol).await.is_empty(),
                "{vol} detached"
            );
            client
                .controller()
                .delete_volume(DeleteVolumeRequest {
                    volume_id: vol.clone(),
                    ..Default::default()
                })
                .await
                .unwrap();
        }
    });
}
