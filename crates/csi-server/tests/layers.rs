//! Each layer alone on a `Stack`, then all of them together.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_proto::v1::controller_service_capability::rpc::Type as ControllerRpc;
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::*;
use csi_server::layer::{
    CatchPanicLayer, GatingLayer, LockMap, LockingLayer, Readiness, ReadinessLayer, Stack,
    TracingLayer, ValidationLayer,
};
use csi_server::{Capabilities, CsiError};
use tokio::sync::Notify;
use tonic::Code;

fn delete(id: &str) -> DeleteVolumeRequest {
    DeleteVolumeRequest {
        volume_id: id.into(),
        ..Default::default()
    }
}

async fn ok_delete(
    calls: &Arc<AtomicUsize>,
    stack: &Stack,
    req: DeleteVolumeRequest,
) -> Result<DeleteVolumeResponse, CsiError> {
    let calls = calls.clone();
    stack
        .call(1, req, move |_| async move {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok(DeleteVolumeResponse {})
        })
        .await
}

#[tokio::test]
async fn validation_alone() {
    let calls = Arc::new(AtomicUsize::new(0));
    let stack = Stack::new().push(ValidationLayer);
    let err = ok_delete(&calls, &stack, delete("")).await.unwrap_err();
    assert_eq!(err, CsiError::required("volume_id"));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    ok_delete(&calls, &stack, delete("v")).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn gating_alone() {
    let calls = Arc::new(AtomicUsize::new(0));
    let none = Stack::new().push(GatingLayer::new(Capabilities::new()));
    let err = ok_delete(&calls, &none, delete("v")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
    let declared = Stack::new().push(GatingLayer::new(
        Capabilities::new().controller([ControllerRpc::CreateDeleteVolume]),
    ));
    ok_delete(&calls, &declared, delete("v")).await.unwrap();
    // Gating alone does not validate: an empty id reaches the driver.
    ok_delete(&calls, &declared, delete("")).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn gating_split_around_validation() {
    use csi_proto::v1::node_service_capability::rpc::Type as NodeRpc;
    let caps = Capabilities::new().node([NodeRpc::StageUnstageVolume]);
    let stack = Stack::new()
        .push(GatingLayer::rpcs(caps.clone()))
        .push(ValidationLayer)
        .push(GatingLayer::fields(caps.clone()));
    let publish = |volume_id: &str| NodePublishVolumeRequest {
        volume_id: volume_id.into(),
        target_path: "/mnt/t".into(),
        volume_capability: Some(
            VolumeCapability::mount("ext4").with_access_mode(Mode::SingleNodeWriter),
        ),
        ..Default::default()
    };
    let run = |req: NodePublishVolumeRequest| {
        stack.call(1, req, |_| async { Ok(NodePublishVolumeResponse {}) })
    };
    // Missing volume_id and staging path: the field rule, not the staging rule.
    assert_eq!(
        run(publish("")).await.unwrap_err(),
        CsiError::required("volume_id")
    );
    assert_eq!(
        run(publish("v")).await.unwrap_err().code(),
        Code::FailedPrecondition
    );
    // Each half alone makes only its own decision.
    let rpcs_only = Stack::new().push(GatingLayer::rpcs(caps.clone()));
    rpcs_only
        .call(1, publish("v"), |_| async {
            Ok(NodePublishVolumeResponse {})
        })
        .await
        .unwrap();
    let fields_only = Stack::new().push(GatingLayer::fields(caps));
    let calls = Arc::new(AtomicUsize::new(0));
    ok_delete(&calls, &fields_only, delete("v")).await.unwrap();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "DELETE is not gated by fields()"
    );
}

#[tokio::test]
async fn locking_alone() {
    let map = LockMap::new();
    let stack = Arc::new(Stack::new().push(LockingLayer::with_map(map.clone(), Duration::ZERO)));
    let entered = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let (e, r, s) = (entered.clone(), release.clone(), stack.clone());
    let first = tokio::spawn(async move {
        s.call(1, delete("v"), move |_| async move {
            e.notify_one();
            r.notified().await;
            Ok(DeleteVolumeResponse {})
        })
        .await
    });
    entered.notified().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let err = ok_delete(&calls, &stack, delete("v")).await.unwrap_err();
    assert_eq!(err.code(), Code::Aborted);
    ok_delete(&calls, &stack, delete("w")).await.unwrap();
    release.notify_one();
    first.await.unwrap().unwrap();
    assert!(map.is_empty());

    // With a wait, the second call runs after the first instead of failing.
    let waiting =
        Arc::new(Stack::new().push(LockingLayer::with_map(map.clone(), Duration::from_secs(60))));
    let (e, r, s) = (entered.clone(), release.clone(), waiting.clone());
    let first = tokio::spawn(async move {
        s.call(1, delete("v"), move |_| async move {
            e.notify_one();
            r.notified().await;
            Ok(DeleteVolumeResponse {})
        })
        .await
    });
    entered.notified().await;
    let c2 = calls.clone();
    let w2 = waiting.clone();
    let second = tokio::spawn(async move { ok_delete(&c2, &w2, delete("v")).await });
    release.notify_one();
    first.await.unwrap().unwrap();
    second.await.unwrap().unwrap();
    assert!(map.is_empty());
}

#[tokio::test]
async fn panic_alone() {
    let stack = Stack::new().push(CatchPanicLayer);
    let err = stack
        .call(1, delete("v"), |_| async {
            if true {
                panic!("driver bug");
            }
            Ok(DeleteVolumeResponse {})
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Internal);
    let calls = Arc::new(AtomicUsize::new(0));
    ok_delete(&calls, &stack, delete("v")).await.unwrap();
}

#[tokio::test]
async fn readiness_alone() {
    let readiness = Readiness::new();
    let stack = Stack::new().push(ReadinessLayer::new(readiness.clone()));
    let probe = || {
        stack.call(1, ProbeRequest {}, |_| async {
            Ok(ProbeResponse { ready: Some(true) })
        })
    };
    assert_eq!(probe().await.unwrap().ready, Some(false));
    readiness.set_ready();
    assert_eq!(probe().await.unwrap().ready, Some(true));
    readiness.set_unhealthy("");
    assert_eq!(probe().await.unwrap_err().code(), Code::FailedPrecondition);
    // Other RPCs are not affected.
    let calls = Arc::new(AtomicUsize::new(0));
    ok_delete(&calls, &stack, delete("v")).await.unwrap();
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn tracing_alone_logs_without_secrets_or_mount_flags() {
    let out = Captured::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let stack = Stack::new().push(TracingLayer);
            let req = NodePublishVolumeRequest {
                volume_id: "vol-42".into(),
                target_path: "/mnt/t".into(),
                volume_capability: Some(
                    VolumeCapability::mount("ext4")
                        .with_mount_flags(["password=mountsecret"])
                        .with_access_mode(Mode::SingleNodeWriter),
                ),
                secrets: [("token".to_string(), "topsecret".to_string())].into(),
                ..Default::default()
            };
            stack
                .call(7, req, |_| async { Ok(NodePublishVolumeResponse {}) })
                .await
                .unwrap();
            let _ = stack
                .call(8, delete("vol-43"), |_| async {
                    Err::<DeleteVolumeResponse, _>(CsiError::NotFound("vol-43".into()))
                })
                .await;
        });
    });
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    assert!(text.contains("NodePublishVolume"), "{text}");
    assert!(text.contains("request_id=7"), "{text}");
    assert!(text.contains("vol-42"), "{text}");
    assert!(
        text.contains("NotFound") || text.contains("NOT_FOUND") || text.contains("vol-43"),
        "{text}"
    );
    assert!(!text.contains("topsecret"), "secret leaked: {text}");
    assert!(!text.contains("mountsecret"), "mount flags leaked: {text}");
}

#[tokio::test]
async fn the_full_stack_together() {
    let map = LockMap::new();
    let readiness = Readiness::ready();
    let stack = Stack::new()
        .push(TracingLayer)
        .push(CatchPanicLayer)
        .push(GatingLayer::new(
            Capabilities::new().controller([ControllerRpc::CreateDeleteVolume]),
        ))
        .push(ValidationLayer)
        .push(ReadinessLayer::new(readiness))
        .push(LockingLayer::with_map(map.clone(), Duration::ZERO));
    let calls = Arc::new(AtomicUsize::new(0));
    assert_eq!(
        ok_delete(&calls, &stack, delete(""))
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
    assert_eq!(
        stack
            .call(
                1,
                ControllerGetVolumeRequest {
                    volume_id: String::new()
                },
                |_| async { Ok(ControllerGetVolumeResponse::default()) }
            )
            .await
            .unwrap_err()
            .code(),
        Code::Unimplemented,
        "gating answers before validation"
    );
    let err = stack
        .call(2, delete("v"), |_| async {
            if true {
                panic!("boom");
            }
            Ok(DeleteVolumeResponse {})
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Internal);
    assert!(map.is_empty(), "the panic released the lock");
    ok_delete(&calls, &stack, delete("v")).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(stack.len(), 6);
}
