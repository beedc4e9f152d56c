//! The tonic service impls: every RPC is one macro-generated line that hands
//! the request to the layer stack and then to the driver trait method.

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use csi_proto::v1 as csi;
use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use crate::driver::{
    CallContext, Controller, CsiStream, Declared, GroupController, Identity, Node, SnapshotMetadata,
};
use crate::error::CsiError;
use crate::layer::Stack;
use crate::request::CsiRequest;

/// What every service shares: the stack, the declaration, the id counter.
pub(crate) struct Shared {
    pub(crate) stack: Stack,
    pub(crate) declared: Arc<Declared>,
    next_id: AtomicU64,
}

impl Shared {
    pub(crate) fn new(stack: Stack, declared: Arc<Declared>) -> Arc<Self> {
        Arc::new(Self {
            stack,
            declared,
            next_id: AtomicU64::new(1),
        })
    }

    async fn dispatch<Req, Resp, F, Fut>(
        &self,
        request: Request<Req>,
        handler: F,
    ) -> Result<Response<Resp>, Status>
    where
        Req: CsiRequest,
        Resp: fmt::Debug + Send + 'static,
        F: FnOnce(CallContext, Req) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Resp, CsiError>> + Send + 'static,
    {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let req = request.into_inner();
        let ctx = CallContext::new(id, req.method(), self.declared.clone());
        self.stack
            .call(id, req, move |req| handler(ctx, req))
            .await
            .map(Response::new)
            .map_err(Status::from)
    }
}

macro_rules! service {
    ($svc:ident, $driver:ident, $tonic:path { $($fn:ident($req:ident) -> $resp:ident;)* }) => {
        pub(crate) struct $svc {
            pub(crate) shared: Arc<Shared>,
            pub(crate) driver: Arc<dyn $driver>,
        }

        #[tonic::async_trait]
        impl $tonic for $svc {
            $(
                async fn $fn(&self, request: Request<csi::$req>) -> Result<Response<csi::$resp>, Status> {
                    let driver = self.driver.clone();
                    self.shared
                        .dispatch(request, move |ctx, req| async move { driver.$fn(&ctx, req).await })
                        .await
                }
            )*
        }
    };
}

service!(IdentityService, Identity, csi::identity_server::Identity {
    get_plugin_info(GetPluginInfoRequest) -> GetPluginInfoResponse;
    get_plugin_capabilities(GetPluginCapabilitiesRequest) -> GetPluginCapabilitiesResponse;
    probe(ProbeRequest) -> ProbeResponse;
});

service!(ControllerService, Controller, csi::controller_server::Controller {
    create_volume(CreateVolumeRequest) -> CreateVolumeResponse;
    delete_volume(DeleteVolumeRequest) -> DeleteVolumeResponse;
    controller_publish_volume(ControllerPublishVolumeRequest) -> ControllerPublishVolumeResponse;
    controller_unpublish_volume(ControllerUnpublishVolumeRequest) -> ControllerUnpublishVolumeResponse;
    validate_volume_capabilities(ValidateVolumeCapabilitiesRequest) -> ValidateVolumeCapabilitiesResponse;
    list_volumes(ListVolumesRequest) -> ListVolumesResponse;
    get_capacity(GetCapacityRequest) -> GetCapacityResponse;
    controller_get_capabilities(ControllerGetCapabilitiesRequest) -> ControllerGetCapabilitiesResponse;
    create_snapshot(CreateSnapshotRequest) -> CreateSnapshotResponse;
    delete_snapshot(DeleteSnapshotRequest) -> DeleteSnapshotResponse;
    list_snapshots(ListSnapshotsRequest) -> ListSnapshotsResponse;
    get_snapshot(GetSnapshotRequest) -> GetSnapshotResponse;
    controller_expand_volume(ControllerExpandVolumeRequest) -> ControllerExpandVolumeResponse;
    controller_get_volume(ControllerGetVolumeRequest) -> ControllerGetVolumeResponse;
    controller_modify_volume(ControllerModifyVolumeRequest) -> ControllerModifyVolumeResponse;
});

service!(NodeService, Node, csi::node_server::Node {
    node_stage_volume(NodeStageVolumeRequest) -> NodeStageVolumeResponse;
    node_unstage_volume(NodeUnstageVolumeRequest) -> NodeUnstageVolumeResponse;
    node_publish_volume(NodePublishVolumeRequest) -> NodePublishVolumeResponse;
    node_unpublish_volume(NodeUnpublishVolumeRequest) -> NodeUnpublishVolumeResponse;
    node_get_volume_stats(NodeGetVolumeStatsRequest) -> NodeGetVolumeStatsResponse;
    node_expand_volume(NodeExpandVolumeRequest) -> NodeExpandVolumeResponse;
    node_get_capabilities(NodeGetCapabilitiesRequest) -> NodeGetCapabilitiesResponse;
    node_get_info(NodeGetInfoRequest) -> NodeGetInfoResponse;
});

service!(GroupControllerService, GroupController, csi::group_controller_server::GroupController {
    group_controller_get_capabilities(GroupControllerGetCapabilitiesRequest) -> GroupControllerGetCapabilitiesResponse;
    create_volume_group_snapshot(CreateVolumeGroupSnapshotRequest) -> CreateVolumeGroupSnapshotResponse;
    delete_volume_group_snapshot(DeleteVolumeGroupSnapshotRequest) -> DeleteVolumeGroupSnapshotResponse;
    get_volume_group_snapshot(GetVolumeGroupSnapshotRequest) -> GetVolumeGroupSnapshotResponse;
});

/// A driver stream travelling through the layers (which only log it).
struct StreamResponse<T>(CsiStream<T>);

impl<T> fmt::Debug for StreamResponse<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<stream>")
    }
}

/// A gRPC response stream.
pub(crate) type StatusStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// Maps driver errors to statuses and a panic while producing an item to
/// INTERNAL (which ends the stream).
fn into_status_stream<T: Send + 'static>(stream: CsiStream<T>) -> StatusStream<T> {
    Box::pin(
        AssertUnwindSafe(stream)
            .catch_unwind()
            .map(|item| match item {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(e)) => Err(Status::from(e)),
                Err(_) => Err(Status::internal("internal error: the driver panicked")),
            }),
    )
}

pub(crate) struct SnapshotMetadataService {
    pub(crate) shared: Arc<Shared>,
    pub(crate) driver: Arc<dyn SnapshotMetadata>,
}

macro_rules! streaming {
    ($($fn:ident($req:ident) -> $resp:ident as $assoc:ident;)*) => {
        #[tonic::async_trait]
        impl csi::snapshot_metadata_server::SnapshotMetadata for SnapshotMetadataService {
            $(
                type $assoc = StatusStream<csi::$resp>;

                async fn $fn(&self, request: Request<csi::$req>) -> Result<Response<Self::$assoc>, Status> {
                    let driver = self.driver.clone();
                    let stream = self
                        .shared
                        .dispatch(request, move |ctx, req| async move {
                            driver.$fn(&ctx, req).await.map(StreamResponse)
                        })
                        .await?;
                    Ok(Response::new(into_status_stream(stream.into_inner().0)))
                }
            )*
        }
    };
}

streaming! {
    get_metadata_allocated(GetMetadataAllocatedRequest) -> GetMetadataAllocatedResponse as GetMetadataAllocatedStream;
    get_metadata_delta(GetMetadataDeltaRequest) -> GetMetadataDeltaResponse as GetMetadataDeltaStream;
}
