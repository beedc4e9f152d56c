//! A test driver and a server running on a unix socket in a tempdir.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use csi_client::{ClientOptions, CsiClient};
use csi_proto::v1::*;
use csi_server::layer::LockMap;
use csi_server::{
    CallContext, Capabilities, Controller, CsiError, CsiResult, Endpoint, Node, PluginInfo, Server,
    ServerBuilder, ServerError,
};
use tokio::sync::{Notify, oneshot};

/// Counts executions and the highest number running at once; blocks or
/// panics on demand, keyed by volume id.
#[derive(Default)]
pub struct TestDriver {
    pub running: AtomicUsize,
    pub max_running: AtomicUsize,
    pub executions: AtomicUsize,
    /// Signalled when a call on a `block-*` or `slow-*` volume has started.
    pub entered: Notify,
    /// Released by the test to let `block-*` calls finish.
    pub release: Notify,
}

impl TestDriver {
    async fn run(&self, volume_id: &str) -> CsiResult<()> {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_running.fetch_max(now, Ordering::SeqCst);
        self.executions.fetch_add(1, Ordering::SeqCst);
        struct Dec<'a>(&'a AtomicUsize);
        impl Drop for Dec<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let _dec = Dec(&self.running);
        if volume_id.starts_with("boom") {
            panic!("driver bug on {volume_id}");
        }
        if volume_id.starts_with("block") {
            self.entered.notify_one();
            self.release.notified().await;
        }
        if volume_id.starts_with("slow") {
            self.entered.notify_one();
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        if volume_id.starts_with("busy") {
            // Long enough for the other calls to collide with it.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }
}

#[csi_server::async_trait]
impl Controller for TestDriver {
    async fn create_volume(
        &self,
        _: &CallContext,
        req: CreateVolumeRequest,
    ) -> CsiResult<CreateVolumeResponse> {
        self.run(&req.name).await?;
        Ok(CreateVolumeResponse {
            volume: Some(Volume {
                volume_id: format!("id-{}", req.name),
                capacity_bytes: req.capacity_range.map_or(0, |r| r.required_bytes),
                ..Default::default()
            }),
        })
    }

    async fn delete_volume(
        &self,
        _: &CallContext,
        req: DeleteVolumeRequest,
    ) -> CsiResult<DeleteVolumeResponse> {
        self.run(&req.volume_id).await?;
        if req.volume_id.starts_with("missing") {
            return Err(CsiError::NotFound(req.volume_id));
        }
        Ok(DeleteVolumeResponse {})
    }

    async fn create_snapshot(
        &self,
        _: &CallContext,
        req: CreateSnapshotRequest,
    ) -> CsiResult<CreateSnapshotResponse> {
        self.run(&req.name).await?;
        Ok(CreateSnapshotResponse {
            snapshot: Some(Snapshot {
                snapshot_id: format!("snap-{}", req.name),
                source_volume_id: req.source_volume_id,
                ready_to_use: true,
                ..Default::default()
            }),
        })
    }

    async fn controller_modify_volume(
        &self,
        _: &CallContext,
        req: ControllerModifyVolumeRequest,
    ) -> CsiResult<ControllerModifyVolumeResponse> {
        self.run(&req.volume_id).await?;
        if req.volume_id.starts_with("missing") {
            return Err(CsiError::NotFound(req.volume_id));
        }
        Ok(ControllerModifyVolumeResponse {})
    }
}

#[csi_server::async_trait]
impl Node for TestDriver {
    async fn node_publish_volume(
        &self,
        _: &CallContext,
        req: NodePublishVolumeRequest,
    ) -> CsiResult<NodePublishVolumeResponse> {
        self.run(&req.volume_id).await?;
        Ok(NodePublishVolumeResponse {})
    }

    async fn node_unpublish_volume(
        &self,
        _: &CallContext,
        req: NodeUnpublishVolumeRequest,
    ) -> CsiResult<NodeUnpublishVolumeResponse> {
        self.run(&req.volume_id).await?;
        Ok(NodeUnpublishVolumeResponse {})
    }

    async fn node_stage_volume(
        &self,
        _: &CallContext,
        req: NodeStageVolumeRequest,
    ) -> CsiResult<NodeStageVolumeResponse> {
        self.run(&req.volume_id).await?;
        Ok(NodeStageVolumeResponse {})
    }

    async fn node_get_info(
        &self,
        _: &CallContext,
        _: NodeGetInfoRequest,
    ) -> CsiResult<NodeGetInfoResponse> {
        Ok(NodeGetInfoResponse {
            node_id: "node-1".into(),
            ..Default::default()
        })
    }
}

pub fn info() -> PluginInfo {
    PluginInfo::new("test.csi.example.com", "0.1.0").unwrap()
}

pub fn all_caps() -> Capabilities {
    use csi_proto::v1::controller_service_capability::rpc::Type as C;
    Capabilities::new().controller([C::CreateDeleteVolume])
}

/// A builder for a server on a fresh socket in `dir`, with the driver as
/// controller and node.
pub fn builder(dir: &tempfile::TempDir, driver: &Arc<TestDriver>) -> ServerBuilder {
    Server::builder(info())
        .capabilities(all_caps())
        .endpoint(Endpoint::unix(dir.path().join("csi.sock")).unwrap())
        .controller(driver.clone())
        .node(driver.clone())
        .grace_period(Duration::from_secs(30))
}

pub struct Running {
    pub client: CsiClient,
    pub path: PathBuf,
    pub lock_map: Arc<LockMap>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), ServerError>>,
}

impl Running {
    /// Triggers shutdown and waits for `serve_with_shutdown` to return.
    pub async fn stop(mut self) -> Result<(), ServerError> {
        let _ = self.stop.take().unwrap().send(());
        self.task.await.unwrap()
    }

    pub fn trigger_stop(&mut self) {
        let _ = self.stop.take().unwrap().send(());
    }

    pub async fn join(self) -> Result<(), ServerError> {
        self.task.await.unwrap()
    }
}

/// A fresh [`TestDriver`] and a new temporary directory for its socket.
pub fn test_driver() -> (tempfile::TempDir, Arc<TestDriver>) {
    (
        tempfile::tempdir().unwrap(),
        Arc::new(TestDriver::default()),
    )
}

/// A server over a fresh [`TestDriver`] with every capability, in a new
/// temporary directory (kept alive by the caller).
pub async fn start_test_driver() -> (tempfile::TempDir, Arc<TestDriver>, Running) {
    start_test_driver_with(|b| b).await
}

/// [`start_test_driver`] with the builder adjusted by `configure`.
pub async fn start_test_driver_with(
    configure: impl FnOnce(ServerBuilder) -> ServerBuilder,
) -> (tempfile::TempDir, Arc<TestDriver>, Running) {
    let (dir, driver) = test_driver();
    let running = start(configure(builder(&dir, &driver))).await;
    (dir, driver, running)
}

/// Builds, serves in a task, and connects a client.
pub async fn start(builder: ServerBuilder) -> Running {
    let server = builder.build().unwrap();
    let endpoint = server.endpoint().clone();
    let path = endpoint.unix_path().unwrap().to_owned();
    let lock_map = server.lock_map();
    let (tx, rx) = oneshot::channel();
    let task = tokio::spawn(server.serve_with_shutdown(async move {
        let _ = rx.await;
    }));
    let client =
        CsiClient::connect_when_ready(endpoint, ClientOptions::default(), Duration::from_secs(30))
            .await
            .unwrap();
    Running {
        client,
        path,
        lock_map,
        stop: Some(tx),
        task,
    }
}

/// Polls `cond` until it holds, failing after a generous deadline.
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub fn mount_cap() -> VolumeCapability {
    VolumeCapability::mount("ext4")
        .with_access_mode(csi_proto::v1::volume_capability::access_mode::Mode::SingleNodeWriter)
}

pub fn publish(volume_id: &str, target: &str) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: volume_id.into(),
        target_path: target.into(),
        volume_capability: Some(mount_cap()),
        ..Default::default()
    }
}

/// A DeleteVolume of `volume_id`.
pub fn delete(volume_id: &str) -> DeleteVolumeRequest {
    DeleteVolumeRequest {
        volume_id: volume_id.into(),
        ..Default::default()
    }
}

/// A DeleteVolume of `volume_id` on `s`, in a task of its own.
pub fn spawn_delete(
    s: &Running,
    volume_id: &str,
) -> tokio::task::JoinHandle<Result<tonic::Response<DeleteVolumeResponse>, tonic::Status>> {
    let mut c = s.client.controller();
    let request = delete(volume_id);
    tokio::spawn(async move { c.delete_volume(request).await })
}

/// Awaits a call that must fail with `code`; returns the status so the
/// caller can check its message.
/// Whether GetPluginCapabilities reports the Controller service.
pub async fn offers_controller_service(client: &CsiClient) -> bool {
    use csi_proto::v1::plugin_capability::service::Type;
    let caps = client
        .identity()
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    caps.capabilities
        .iter()
        .any(|c| c.service_type() == Some(Type::ControllerService))
}

/// [`expect_code`], and the message holds `needle` (a field's name, a
/// capability, a method).
pub async fn expect_message<T>(
    call: impl std::future::Future<Output = Result<T, tonic::Status>>,
    code: tonic::Code,
    needle: &str,
) -> tonic::Status {
    let status = expect_code(call, code).await;
    let message = status.message();
    assert!(message.contains(needle), "{needle:?} not in {message:?}");
    status
}

pub async fn expect_code<T>(
    call: impl std::future::Future<Output = Result<T, tonic::Status>>,
    code: tonic::Code,
) -> tonic::Status {
    match call.await {
        Ok(_) => panic!("expected {code:?}, got OK"),
        Err(status) => {
            assert_eq!(status.code(), code, "{}", status.message());
            status
        }
    }
}
