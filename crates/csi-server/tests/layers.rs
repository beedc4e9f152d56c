//! Each layer alone over a test service, then all of them together: plain
//! tower composition, as a driver would write it.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_proto::v1::controller_service_capability::rpc::Type as ControllerRpc;
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::*;
use csi_server::layer::{
    CatchPanicLayer, CsiCall, GatingLayer, LockMap, LockingLayer, Readiness, ReadinessLayer,
    TracingLayer, ValidationLayer,
};
use csi_server::{Capabilities, CsiError, CsiRequest};
use tokio::sync::Notify;
use tonic::Code;
use tower::{Layer, Service, ServiceBuilder, ServiceExt, service_fn};

fn delete(id: &str) -> DeleteVolumeRequest {
    DeleteVolumeRequest {
        volume_id: id.into(),
        ..Default::default()
    }
}

/// Sends one call through `service`.
async fn call<S, Req>(service: &S, request: Req) -> Result<Req::Output, CsiError>
where
    Req: CsiRequest,
    S: Service<CsiCall<Req>, Response = Req::Output, Error = CsiError> + Clone,
{
    service.clone().oneshot(CsiCall::new(1, request)).await
}

type DeleteCall = CsiCall<DeleteVolumeRequest>;

/// A DeleteVolume service that any layer here can wrap.
trait DeleteHandler:
    Service<DeleteCall, Response = DeleteVolumeResponse, Error = CsiError, Future: Send + 'static>
    + Clone
    + Send
    + 'static
{
}

impl<S> DeleteHandler for S where
    S: Service<
            DeleteCall,
            Response = DeleteVolumeResponse,
            Error = CsiError,
            Future: Send + 'static,
        > + Clone
        + Send
        + 'static
{
}

/// A DeleteVolume handler that counts its calls.
fn counting(calls: &Arc<AtomicUsize>) -> impl DeleteHandler {
    let calls = calls.clone();
    service_fn(move |_: CsiCall<DeleteVolumeRequest>| {
        calls.fetch_add(1, Ordering::SeqCst);
        async { Ok(DeleteVolumeResponse {}) }
    })
}

/// A DeleteVolume handler that runs `body` for each call.
fn handler<F, Fut>(body: F) -> impl DeleteHandler
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<DeleteVolumeResponse, CsiError>> + Send + 'static,
{
    service_fn(move |_: CsiCall<DeleteVolumeRequest>| body())
}

#[tokio::test]
async fn validation_alone() {
    let calls = Arc::new(AtomicUsize::new(0));
    let stack = ValidationLayer.layer(counting(&calls));
    let err = call(&stack, delete("")).await.unwrap_err();
    assert_eq!(err, CsiError::required("volume_id"));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    call(&stack, delete("v")).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn gating_alone() {
    let calls = Arc::new(AtomicUsize::new(0));
    let none = GatingLayer::new(Capabilities::new()).layer(counting(&calls));
    let err = call(&none, delete("v")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
    let declared =
        GatingLayer::new(Capabilities::new().controller([ControllerRpc::CreateDeleteVolume]))
            .layer(counting(&calls));
    call(&declared, delete("v")).await.unwrap();
    // Gating alone does not validate: an empty id reaches the driver.
    call(&declared, delete("")).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// A handler that signals `entered`, then waits for `release`.
fn blocking(entered: &Arc<Notify>, release: &Arc<Notify>) -> impl DeleteHandler {
    let (e, r) = (entered.clone(), release.clone());
    handler(move || {
        let (e, r) = (e.clone(), r.clone());
        async move {
            e.notify_one();
            r.notified().await;
            Ok(DeleteVolumeResponse {})
        }
    })
}

#[tokio::test]
async fn gating_split_around_validation() {
    use csi_proto::v1::node_service_capability::rpc::Type as NodeRpc;
    let caps = Capabilities::new().node([NodeRpc::StageUnstageVolume]);
    let published = || {
        service_fn(|_: CsiCall<NodePublishVolumeRequest>| async {
            Ok::<_, CsiError>(NodePublishVolumeResponse {})
        })
    };
    let stack = ServiceBuilder::new()
        .layer(GatingLayer::rpcs(caps.clone()))
        .layer(ValidationLayer)
        .layer(GatingLayer::fields(caps.clone()))
        .service(published());
    let publish = |volume_id: &str| NodePublishVolumeRequest {
        volume_id: volume_id.into(),
        target_path: "/mnt/t".into(),
        volume_capability: Some(
            VolumeCapability::mount("ext4").with_access_mode(Mode::SingleNodeWriter),
        ),
        ..Default::default()
    };
    // Missing volume_id and staging path: the field rule, not the staging rule.
    assert_eq!(
        call(&stack, publish("")).await.unwrap_err(),
        CsiError::required("volume_id")
    );
    assert_eq!(
        call(&stack, publish("v")).await.unwrap_err().code(),
        Code::FailedPrecondition
    );
    // Each half alone makes only its own decision.
    let rpcs_only = GatingLayer::rpcs(caps.clone()).layer(published());
    call(&rpcs_only, publish("v")).await.unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let fields_only = GatingLayer::fields(caps).layer(counting(&calls));
    call(&fields_only, delete("v")).await.unwrap();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "DELETE is not gated by fields()"
    );
}

#[tokio::test]
async fn locking_alone() {
    let map = LockMap::new();
    let entered = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let stack =
        LockingLayer::with_map(map.clone(), Duration::ZERO).layer(blocking(&entered, &release));
    let s = stack.clone();
    let first = tokio::spawn(async move { call(&s, delete("v")).await });
    entered.notified().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = LockingLayer::with_map(map.clone(), Duration::ZERO).layer(counting(&calls));
    let err = call(&counted, delete("v")).await.unwrap_err();
    assert_eq!(err.code(), Code::Aborted);
    call(&counted, delete("w")).await.unwrap();
    release.notify_one();
    first.await.unwrap().unwrap();
    assert!(map.is_empty());

    // With a wait, the second call runs after the first instead of failing.
    let waiting = LockingLayer::with_map(map.clone(), Duration::from_secs(60));
    let s = waiting.layer(blocking(&entered, &release));
    let first = tokio::spawn(async move { call(&s, delete("v")).await });
    entered.notified().await;
    let c = waiting.layer(counting(&calls));
    let second = tokio::spawn(async move { call(&c, delete("v")).await });
    release.notify_one();
    first.await.unwrap().unwrap();
    second.await.unwrap().unwrap();
    assert!(map.is_empty());
}

#[tokio::test]
async fn locking_covers_the_work_of_a_call_whose_caller_went_away() {
    let map = LockMap::new();
    let entered = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let running = Arc::new(AtomicUsize::new(0));
    let executions = Arc::new(AtomicUsize::new(0));
    let (e, r, run, ex) = (
        entered.clone(),
        release.clone(),
        running.clone(),
        executions.clone(),
    );
    let work = handler(move || {
        let (e, r, run, ex) = (e.clone(), r.clone(), run.clone(), ex.clone());
        async move {
            assert_eq!(
                run.fetch_add(1, Ordering::SeqCst),
                0,
                "two executions at once"
            );
            ex.fetch_add(1, Ordering::SeqCst);
            e.notify_one();
            r.notified().await;
            run.fetch_sub(1, Ordering::SeqCst);
            Ok(DeleteVolumeResponse {})
        }
    });
    let stack = LockingLayer::with_map(map.clone(), Duration::ZERO).layer(work);

    // The caller gives up (a deadline) while the work runs.
    let s = stack.clone();
    let first = tokio::spawn(async move { call(&s, delete("v")).await });
    entered.notified().await;
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());

    // The work goes on under the lock: every retry meanwhile is ABORTED.
    for _ in 0..3 {
        let err = call(&stack, delete("v")).await.unwrap_err();
        assert_eq!(err.code(), Code::Aborted, "{err}");
        tokio::task::yield_now().await;
    }
    assert_eq!(running.load(Ordering::SeqCst), 1);
    assert_eq!(map.len(), 1);

    // Once it ends, the lock is free and a retry runs.
    release.notify_one();
    tokio::time::timeout(Duration::from_secs(30), map.idle())
        .await
        .unwrap();
    let s = stack.clone();
    let retry = tokio::spawn(async move { call(&s, delete("v")).await });
    entered.notified().await;
    release.notify_one();
    retry.await.unwrap().unwrap();
    assert_eq!(executions.load(Ordering::SeqCst), 2);
    assert!(map.is_empty());
}

#[tokio::test]
async fn panic_alone() {
    let stack = CatchPanicLayer.layer(handler(|| async {
        if true {
            panic!("driver bug");
        }
        Ok(DeleteVolumeResponse {})
    }));
    let err = call(&stack, delete("v")).await.unwrap_err();
    assert_eq!(err.code(), Code::Internal);
    let calls = Arc::new(AtomicUsize::new(0));
    call(&CatchPanicLayer.layer(counting(&calls)), delete("v"))
        .await
        .unwrap();
}

#[tokio::test]
async fn readiness_alone() {
    let readiness = Readiness::new();
    let layer = ReadinessLayer::new(readiness.clone());
    let stack = layer.layer(service_fn(|_: CsiCall<ProbeRequest>| async {
        Ok::<_, CsiError>(ProbeResponse { ready: Some(true) })
    }));
    assert_eq!(
        call(&stack, ProbeRequest {}).await.unwrap().ready,
        Some(false)
    );
    readiness.set_ready();
    assert_eq!(
        call(&stack, ProbeRequest {}).await.unwrap().ready,
        Some(true)
    );
    readiness.set_unhealthy("");
    assert_eq!(
        call(&stack, ProbeRequest {}).await.unwrap_err().code(),
        Code::FailedPrecondition
    );
    // Other RPCs are not affected.
    let calls = Arc::new(AtomicUsize::new(0));
    call(&layer.layer(counting(&calls)), delete("v"))
        .await
        .unwrap();
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
            TracingLayer
                .layer(service_fn(|_: CsiCall<NodePublishVolumeRequest>| async {
                    Ok::<_, CsiError>(NodePublishVolumeResponse {})
                }))
                .oneshot(CsiCall::new(7, req))
                .await
                .unwrap();
            let _ = TracingLayer
                .layer(handler(|| async {
                    Err(CsiError::NotFound("vol-43".into()))
                }))
                .oneshot(CsiCall::new(8, delete("vol-43")))
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

/// A controller whose DeleteVolume panics for `boom*` ids.
struct Driver(Arc<AtomicUsize>);

#[csi_server::async_trait]
impl csi_server::Controller for Driver {
    async fn delete_volume(
        &self,
        _: &csi_server::CallContext,
        req: DeleteVolumeRequest,
    ) -> csi_server::CsiResult<DeleteVolumeResponse> {
        if req.volume_id.starts_with("boom") {
            panic!("boom");
        }
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(DeleteVolumeResponse {})
    }
}

#[tokio::test]
async fn the_full_stack_together() {
    let map = LockMap::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let stack = ServiceBuilder::new()
        .layer(TracingLayer)
        .layer(CatchPanicLayer)
        .layer(GatingLayer::new(
            Capabilities::new().controller([ControllerRpc::CreateDeleteVolume]),
        ))
        .layer(ValidationLayer)
        .layer(ReadinessLayer::new(Readiness::ready()))
        .layer(LockingLayer::with_map(map.clone(), Duration::ZERO))
        .service(csi_server::DriverService::new(csi_server::Drivers {
            controller: Some(Arc::new(Driver(calls.clone()))),
            ..Default::default()
        }));
    assert_eq!(
        call(&stack, delete("")).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    assert_eq!(
        call(
            &stack,
            ControllerGetVolumeRequest {
                volume_id: String::new()
            }
        )
        .await
        .unwrap_err()
        .code(),
        Code::Unimplemented,
        "gating answers before validation"
    );
    let err = call(&stack, delete("boom")).await.unwrap_err();
    assert_eq!(err.code(), Code::Internal);
    assert!(map.is_empty(), "the panic released the lock");
    call(&stack, delete("v")).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
