//! The full stack over real unix sockets.
//!
//! One file over 700 lines: it lists cases over the one test driver
//! of `common`.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use common::*;
use csi_proto::v1::node_service_capability::rpc::Type as NodeRpc;
use csi_proto::v1::*;
use csi_server::socket::SocketError;
use csi_server::{Capabilities, Endpoint, Readiness, ServeMode, Server, ServerError};
use tonic::Code;

#[tokio::test]
async fn identity_answers_from_the_declaration() {
    let (_dir, _driver, s) = start_test_driver().await;
    let mut id = s.client.identity();
    let info = id
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "test.csi.example.com");
    assert!(offers_controller_service(&s.client).await);
    let probe = id.probe(ProbeRequest {}).await.unwrap().into_inner();
    assert_eq!(probe.ready, Some(true));
    let ccaps = s
        .client
        .controller()
        .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await
        .unwrap();
    assert_eq!(ccaps.into_inner().capabilities.len(), 1);
    s.stop().await.unwrap();
}

#[tokio::test]
async fn validation_comes_before_the_driver() {
    let (_dir, driver, s) = start_test_driver().await;
    let mut c = s.client.controller();
    // The driver would say NOT_FOUND; validation must answer first.
    let err = expect_code(
        c.delete_volume(DeleteVolumeRequest {
            volume_id: String::new(),
            ..Default::default()
        }),
        Code::InvalidArgument,
    )
    .await;
    assert_eq!(err.message(), "volume_id: required");
    assert!(err.details().is_empty());
    let mut cap = mount_cap();
    cap.access_mode = None;
    let err = expect_code(
        c.create_volume(CreateVolumeRequest {
            name: "v".into(),
            volume_capabilities: vec![cap],
            ..Default::default()
        }),
        Code::InvalidArgument,
    )
    .await;
    assert_eq!(
        err.message(),
        "volume_capabilities[0].access_mode: required"
    );
    let err = expect_code(
        s.client
            .node()
            .node_publish_volume(publish("v", "relative/path")),
        Code::InvalidArgument,
    )
    .await;
    assert_eq!(err.message(), "target_path: must be an absolute path");
    assert_eq!(driver.executions.load(Ordering::SeqCst), 0);
    s.stop().await.unwrap();
}

/// csi-sanity's order: an undeclared RPC is UNIMPLEMENTED, then a missing
/// required field is INVALID_ARGUMENT, and only then do capability rules
/// (staging path, accepted mutable parameters) and the driver answer.
#[tokio::test]
async fn required_fields_come_before_capability_rules() {
    use csi_proto::v1::controller_service_capability::rpc::Type as ControllerRpc;
    let caps = Capabilities::new()
        .controller([
            ControllerRpc::CreateDeleteVolume,
            ControllerRpc::ModifyVolume,
        ])
        .node([NodeRpc::StageUnstageVolume])
        .mutable_parameters(["iops"]);
    let (_dir, driver, s) = start_test_driver_with(|b| b.capabilities(caps)).await;
    let mut n = s.client.node();
    let no_staging = [
        (NodePublishVolumeRequest::default(), "volume_id: required"),
        (
            NodePublishVolumeRequest {
                volume_id: "v".into(),
                ..Default::default()
            },
            "target_path: required",
        ),
        (
            NodePublishVolumeRequest {
                volume_capability: None,
                ..publish("v", "/mnt/t")
            },
            "volume_capability: required",
        ),
    ];
    for (req, message) in no_staging {
        let err = expect_code(n.node_publish_volume(req), Code::InvalidArgument).await;
        assert_eq!(err.message(), message);
    }
    expect_code(
        n.node_publish_volume(publish("v", "/mnt/t")),
        Code::FailedPrecondition,
    )
    .await;
    // Undeclared wins over missing fields.
    expect_code(
        n.node_get_volume_stats(NodeGetVolumeStatsRequest::default()),
        Code::Unimplemented,
    )
    .await;

    let mut c = s.client.controller();
    let modify = |id: &str, params: &[(&str, &str)]| ControllerModifyVolumeRequest {
        volume_id: id.into(),
        mutable_parameters: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    };
    let err = expect_message(
        c.controller_modify_volume(modify("v", &[("XXX_FakeKey", "x"), ("iops", "1")])),
        Code::InvalidArgument,
        "mutable_parameters[\"XXX_FakeKey\"]: ",
    )
    .await;
    assert!(err.message().starts_with("mutable_parameters"));
    expect_code(
        c.create_volume(CreateVolumeRequest {
            name: "v".into(),
            volume_capabilities: vec![mount_cap()],
            mutable_parameters: [("XXX_FakeKey".to_string(), "x".to_string())].into(),
            ..Default::default()
        }),
        Code::InvalidArgument,
    )
    .await;
    assert_eq!(
        driver.executions.load(Ordering::SeqCst),
        0,
        "nothing applied"
    );
    // Empty mutable parameters reach the driver: NOT_FOUND or a no-op.
    expect_code(
        c.controller_modify_volume(modify("missing-v", &[])),
        Code::NotFound,
    )
    .await;
    c.controller_modify_volume(modify("v", &[])).await.unwrap();
    c.controller_modify_volume(modify("v", &[("iops", "100")]))
        .await
        .unwrap();
    assert_eq!(driver.executions.load(Ordering::SeqCst), 3);
    s.stop().await.unwrap();
}

#[tokio::test]
async fn undeclared_capabilities_are_gated() {
    use csi_proto::v1::volume_content_source::{SnapshotSource, Type};
    let (_dir, driver, s) = start_test_driver_with(|b| {
        b.capabilities(Capabilities::new().node([NodeRpc::StageUnstageVolume]))
    })
    .await;
    let mut c = s.client.controller();
    let create = CreateVolumeRequest {
        name: "v".into(),
        volume_capabilities: vec![mount_cap()],
        ..Default::default()
    };
    expect_message(
        c.create_volume(create.clone()),
        Code::Unimplemented,
        "CREATE_DELETE_VOLUME",
    )
    .await;
    expect_code(
        c.list_volumes(ListVolumesRequest::default()),
        Code::Unimplemented,
    )
    .await;
    expect_code(
        c.controller_get_volume(ControllerGetVolumeRequest {
            volume_id: "v".into(),
        }),
        Code::Unimplemented,
    )
    .await;
    // Not declared: NodeGetVolumeStats; declared: staging, so a publish
    // without staging_target_path is FAILED_PRECONDITION.
    let mut n = s.client.node();
    expect_code(
        n.node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: "v".into(),
            volume_path: "/mnt/v".into(),
            ..Default::default()
        }),
        Code::Unimplemented,
    )
    .await;
    expect_code(
        n.node_publish_volume(publish("v", "/mnt/t")),
        Code::FailedPrecondition,
    )
    .await;
    let mut staged = publish("v", "/mnt/t");
    staged.staging_target_path = "/mnt/s".into();
    n.node_publish_volume(staged).await.unwrap();
    s.stop().await.unwrap();

    // With CREATE_DELETE_VOLUME but neither snapshots nor MODIFY_VOLUME.
    let dir = tempfile::tempdir().unwrap();
    let s = start(builder(&dir, &driver)).await;
    let mut c = s.client.controller();
    let mut from_snapshot = create.clone();
    from_snapshot.volume_content_source = Some(VolumeContentSource {
        r#type: Some(Type::Snapshot(SnapshotSource {
            snapshot_id: "s".into(),
        })),
    });
    assert_eq!(
        c.create_volume(from_snapshot).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    let mut mutable = create.clone();
    mutable
        .mutable_parameters
        .insert("iops".into(), "100".into());
    let err = expect_code(c.create_volume(mutable), Code::InvalidArgument).await;
    assert!(err.message().starts_with("mutable_parameters:"));
    c.create_volume(create).await.unwrap();
    // NodeStage is not declared here.
    expect_code(
        s.client.node().node_stage_volume(NodeStageVolumeRequest {
            volume_id: "v".into(),
            staging_target_path: "/mnt/s".into(),
            volume_capability: Some(mount_cap()),
            ..Default::default()
        }),
        Code::Unimplemented,
    )
    .await;
    s.stop().await.unwrap();
}

#[tokio::test]
async fn services_outside_the_mode_are_not_served() {
    let (dir, driver, s) = start_test_driver_with(|b| b.mode(ServeMode::Node)).await;
    // Every error carries a human-readable message, this one too.
    expect_message(
        s.client
            .controller()
            .controller_get_capabilities(ControllerGetCapabilitiesRequest {}),
        Code::Unimplemented,
        "csi.v1.Controller/ControllerGetCapabilities is not served",
    )
    .await;
    assert!(!offers_controller_service(&s.client).await);
    s.client
        .node()
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap();
    s.stop().await.unwrap();

    // A mode whose driver is missing fails fast.
    let err = Server::builder(info())
        .endpoint(Endpoint::unix(dir.path().join("x.sock")).unwrap())
        .mode(ServeMode::Controller)
        .node(driver.clone())
        .build()
        .unwrap_err();
    assert!(matches!(err, ServerError::Config(_)), "{err}");
    let err = Server::builder(info())
        .endpoint("tcp://127.0.0.1:0".parse().unwrap())
        .node(driver.clone())
        .controller(driver)
        .build()
        .unwrap_err();
    assert!(matches!(err, ServerError::TcpNotAllowed(_)), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_conflicting_calls_see_only_ok_or_aborted() {
    let (_dir, driver, s) = start_test_driver().await;
    let mut calls = Vec::new();
    for _ in 0..64 {
        calls.push(spawn_delete(&s, "busy-1"));
    }
    let mut ok = 0;
    for call in calls {
        match call.await.unwrap() {
            Ok(_) => ok += 1,
            Err(e) => {
                assert_eq!(e.code(), Code::Aborted, "{e:?}");
                assert_eq!(
                    e.message(),
                    "an operation for volume \"busy-1\" is already in progress"
                );
            }
        }
    }
    assert!(ok >= 1);
    assert_eq!(
        driver.max_running.load(Ordering::SeqCst),
        1,
        "two calls ran at once"
    );
    assert_eq!(
        driver.executions.load(Ordering::SeqCst),
        ok,
        "an ABORTED call reached the driver"
    );
    assert!(s.lock_map.is_empty());
    s.stop().await.unwrap();
}

#[tokio::test]
async fn different_volumes_do_not_block_each_other() {
    let (_dir, driver, s) = start_test_driver().await;
    let blocked = spawn_delete(&s, "block-a");
    driver.entered.notified().await;
    s.client
        .controller()
        .delete_volume(delete("other"))
        .await
        .unwrap();
    driver.release.notify_one();
    blocked.await.unwrap().unwrap();
    assert!(s.lock_map.is_empty());
    s.stop().await.unwrap();
}

#[tokio::test]
async fn a_cancelled_call_keeps_its_lock_until_its_work_ends() {
    let (_dir, driver, s) = start_test_driver().await;
    let mut n = s.client.node();
    let call =
        tokio::spawn(async move { n.node_publish_volume(publish("block-v", "/mnt/t")).await });
    driver.entered.notified().await;
    assert_eq!(s.lock_map.len(), 2, "volume and target path held");
    // The client gives up (as on a deadline): RST_STREAM drops the call on
    // the server, but not its work.
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert_eq!(driver.running.load(Ordering::SeqCst), 1, "the work goes on");
    // A retry while it runs is ABORTED and never reaches the driver.
    for _ in 0..3 {
        expect_code(
            s.client
                .node()
                .node_publish_volume(publish("block-v", "/mnt/t")),
            Code::Aborted,
        )
        .await;
    }
    assert_eq!(driver.executions.load(Ordering::SeqCst), 1);
    assert_eq!(driver.max_running.load(Ordering::SeqCst), 1);
    // When the work ends its locks are released, and a retry runs.
    driver.release.notify_one();
    let map = s.lock_map.clone();
    eventually("the lock map to empty", || map.is_empty()).await;
    let mut n = s.client.node();
    let retry =
        tokio::spawn(async move { n.node_publish_volume(publish("block-v", "/mnt/t")).await });
    driver.entered.notified().await;
    driver.release.notify_one();
    retry.await.unwrap().unwrap();
    assert_eq!(driver.executions.load(Ordering::SeqCst), 2);
    assert!(s.lock_map.is_empty());
    s.stop().await.unwrap();
}

#[tokio::test]
async fn a_snapshot_or_clone_locks_its_source() {
    use csi_proto::v1::controller_service_capability::rpc::Type as C;
    use csi_proto::v1::volume_content_source::{Type, VolumeSource};
    let caps = Capabilities::new().controller([
        C::CreateDeleteVolume,
        C::CreateDeleteSnapshot,
        C::CloneVolume,
    ]);
    let (_dir, driver, s) = start_test_driver_with(|b| b.capabilities(caps)).await;
    let delete_source = || {
        let mut c = s.client.controller();
        async move { c.delete_volume(delete("src")).await }
    };

    let mut c = s.client.controller();
    let snapshot = tokio::spawn(async move {
        c.create_snapshot(CreateSnapshotRequest {
            source_volume_id: "src".into(),
            name: "block-snap".into(),
            ..Default::default()
        })
        .await
    });
    driver.entered.notified().await;
    let err = expect_code(delete_source(), Code::Aborted).await;
    assert_eq!(
        err.message(),
        "an operation for volume \"src\" is already in progress"
    );
    driver.release.notify_one();
    assert_eq!(
        snapshot
            .await
            .unwrap()
            .unwrap()
            .into_inner()
            .snapshot
            .unwrap()
            .source_volume_id,
        "src"
    );

    let mut c = s.client.controller();
    let clone = tokio::spawn(async move {
        c.create_volume(CreateVolumeRequest {
            name: "block-clone".into(),
            volume_capabilities: vec![mount_cap()],
            volume_content_source: Some(VolumeContentSource {
                r#type: Some(Type::Volume(VolumeSource {
                    volume_id: "src".into(),
                })),
            }),
            ..Default::default()
        })
        .await
    });
    driver.entered.notified().await;
    assert_eq!(delete_source().await.unwrap_err().code(), Code::Aborted);
    driver.release.notify_one();
    clone.await.unwrap().unwrap();
    // Nothing in flight any more: the source can go.
    delete_source().await.unwrap();
    assert!(s.lock_map.is_empty());
    s.stop().await.unwrap();
}

/// Counts the calls that pass.
#[derive(Clone)]
struct Count<S>(S, Arc<std::sync::atomic::AtomicUsize>);

impl<S, Req> tower::Service<csi_server::CsiCall<Req>> for Count<S>
where
    S: tower::Service<csi_server::CsiCall<Req>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, call: csi_server::CsiCall<Req>) -> S::Future {
        self.1.fetch_add(1, Ordering::SeqCst);
        self.0.call(call)
    }
}

#[tokio::test]
async fn a_tower_layer_at_any_position() {
    use csi_server::{Builtin, Position};
    // A time limit on the driver's work, inside the lock; calls seen before
    // tracing are counted by a layer of our own.
    let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = seen.clone();
    let (_dir, _driver, s) = start_test_driver_with(|b| {
        b.layer_at(
            Position::Inside(Builtin::Locking),
            tower::timeout::TimeoutLayer::new(std::time::Duration::from_millis(50)),
        )
        .layer_at(
            Position::Outermost,
            tower::layer::layer_fn(move |inner| Count(inner, counter.clone())),
        )
    })
    .await;
    expect_code(
        s.client.controller().delete_volume(delete("slow-1")),
        Code::DeadlineExceeded,
    )
    .await;
    s.client
        .controller()
        .delete_volume(delete("v"))
        .await
        .unwrap();
    assert_eq!(seen.load(Ordering::SeqCst), 2);
    s.stop().await.unwrap();
}

#[tokio::test]
async fn a_panicking_driver_gives_internal_and_the_server_keeps_serving() {
    let (_dir, _driver, s) = start_test_driver().await;
    let mut c = s.client.controller();
    expect_code(c.delete_volume(delete("boom")), Code::Internal).await;
    assert!(s.lock_map.is_empty());
    c.delete_volume(delete("fine")).await.unwrap();
    s.stop().await.unwrap();
}

#[tokio::test]
async fn shutdown_lets_in_flight_calls_finish_and_removes_the_socket() {
    let (_dir, driver, mut s) = start_test_driver().await;
    let call = spawn_delete(&s, "slow-1");
    driver.entered.notified().await;
    assert!(s.path.exists());
    s.trigger_stop();
    call.await
        .unwrap()
        .expect("the in-flight call completes during the grace period");
    let path = s.path.clone();
    s.join().await.unwrap();
    assert!(!path.exists(), "socket removed");
}

#[tokio::test]
async fn socket_is_0600_and_stale_sockets_are_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("csi.sock");
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let driver = Arc::new(TestDriver::default());
    let s = start(builder(&dir, &driver)).await;
    let mode = std::fs::metadata(&s.path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    s.client.identity().probe(ProbeRequest {}).await.unwrap();

    // A second server at the same path, which must not start.
    let refused = || async {
        builder(&dir, &driver)
            .build()
            .unwrap()
            .serve_with_shutdown(async {})
            .await
            .unwrap_err()
    };

    // A second server on the same live socket is refused.
    let err = refused().await;
    assert!(
        matches!(err, ServerError::Socket(SocketError::InUse(_))),
        "{err}"
    );
    s.stop().await.unwrap();

    // A regular file at the path is never replaced.
    std::fs::write(&path, b"data").unwrap();
    let err = refused().await;
    assert!(
        matches!(err, ServerError::Socket(SocketError::NotASocket(_))),
        "{err}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), b"data");
}

#[tokio::test]
async fn probe_follows_the_readiness_handle() {
    let readiness = Readiness::new();
    let (_dir, _driver, s) = start_test_driver_with(|b| b.readiness(readiness.clone())).await;
    let mut id = s.client.identity();
    assert_eq!(
        id.probe(ProbeRequest {}).await.unwrap().into_inner().ready,
        Some(false)
    );
    readiness.set_ready();
    assert_eq!(
        id.probe(ProbeRequest {}).await.unwrap().into_inner().ready,
        Some(true)
    );
    readiness.set_unhealthy("backend unreachable");
    let err = expect_code(id.probe(ProbeRequest {}), Code::FailedPrecondition).await;
    assert_eq!(err.message(), "backend unreachable");
    s.stop().await.unwrap();
}

#[tokio::test]
async fn built_in_layers_can_be_switched_off() {
    let (_dir, driver, s) =
        start_test_driver_with(|b| b.validation(false).capability_gating(false).locking(false))
            .await;
    let mut c = s.client.controller();
    // No validation: an empty id reaches the driver.
    c.delete_volume(DeleteVolumeRequest::default())
        .await
        .unwrap();
    // No gating: an undeclared RPC reaches the driver's default.
    let err = expect_code(
        c.controller_get_volume(ControllerGetVolumeRequest {
            volume_id: "v".into(),
        }),
        Code::Unimplemented,
    )
    .await;
    assert!(err.message().contains("not implemented"), "{err:?}");
    // No locking: two calls on one volume run at once.
    let first = spawn_delete(&s, "block-x");
    driver.entered.notified().await;
    let second = spawn_delete(&s, "block-x");
    driver.entered.notified().await;
    assert_eq!(driver.max_running.load(Ordering::SeqCst), 2);
    driver.release.notify_one();
    driver.release.notify_one();
    first.await.unwrap().unwrap();
    second.await.unwrap().unwrap();
    assert!(s.lock_map.is_empty());
    s.stop().await.unwrap();
}
