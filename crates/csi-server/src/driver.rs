//! The traits a driver implements. Every method has a default: the
//! `*GetCapabilities`, GetPluginInfo and Probe defaults answer from the
//! declaration; everything else returns UNIMPLEMENTED, so a node-only
//! driver writes only node methods.

use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use csi_proto::v1::*;
use futures::Stream;

use crate::capabilities::{Capabilities, PluginInfo};
use crate::error::CsiError;
use crate::method::Method;

/// What a driver method knows about the call besides the request.
#[derive(Debug, Clone)]
pub struct CallContext {
    /// A per-server counter, also recorded in the call's tracing span.
    pub request_id: u64,
    /// The RPC being served.
    pub method: Method,
    declared: Arc<Declared>,
}

/// The declaration a server was built with, shared by every call.
#[derive(Debug)]
pub(crate) struct Declared {
    pub(crate) info: PluginInfo,
    pub(crate) capabilities: Capabilities,
}

impl CallContext {
    pub(crate) fn new(request_id: u64, method: Method, declared: Arc<Declared>) -> Self {
        Self {
            request_id,
            method,
            declared,
        }
    }

    /// A context for calling driver methods directly in unit tests.
    pub fn for_test(method: Method, info: PluginInfo, capabilities: Capabilities) -> Self {
        Self::new(0, method, Arc::new(Declared { info, capabilities }))
    }

    /// The capabilities the server serves with.
    pub fn capabilities(&self) -> &Capabilities {
        &self.declared.capabilities
    }

    /// The plugin's name and version.
    pub fn plugin_info(&self) -> &PluginInfo {
        &self.declared.info
    }
}

/// The result of a driver method.
pub type CsiResult<T> = Result<T, CsiError>;

/// A server-streaming response.
pub type CsiStream<T> = Pin<Box<dyn Stream<Item = CsiResult<T>> + Send + 'static>>;

fn unimplemented<T>(ctx: &CallContext) -> CsiResult<T> {
    Err(CsiError::unimplemented(ctx.method.name()))
}

/// The Identity service. Usually nothing to write: the defaults answer from
/// the declared [`PluginInfo`] and [`Capabilities`], and Probe from the
/// server's [`Readiness`](crate::Readiness).
#[async_trait]
pub trait Identity: Send + Sync + 'static {
    /// GetPluginInfo.
    async fn get_plugin_info(
        &self,
        ctx: &CallContext,
        _req: GetPluginInfoRequest,
    ) -> CsiResult<GetPluginInfoResponse> {
        Ok(ctx.plugin_info().response())
    }

    /// GetPluginCapabilities.
    async fn get_plugin_capabilities(
        &self,
        ctx: &CallContext,
        _req: GetPluginCapabilitiesRequest,
    ) -> CsiResult<GetPluginCapabilitiesResponse> {
        Ok(ctx.capabilities().plugin_response())
    }

    /// Probe, called only once the readiness handle says ready. Return
    /// FAILED_PRECONDITION when a dependency is unhealthy.
    async fn probe(&self, _ctx: &CallContext, _req: ProbeRequest) -> CsiResult<ProbeResponse> {
        Ok(ProbeResponse { ready: Some(true) })
    }
}

/// An Identity service made only of the defaults.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultIdentity;

impl Identity for DefaultIdentity {}

macro_rules! driver_trait {
    (
        $(#[$doc:meta])*
        trait $name:ident {
            $($(#[$mdoc:meta])* fn $fn:ident($req:ident) -> $resp:ident;)*
        }
        $(capabilities $capfn:ident($capreq:ident) -> $capresp:ident = $respfn:ident;)?
    ) => {
        $(#[$doc])*
        #[async_trait]
        pub trait $name: Send + Sync + 'static {
            $(
                $(#[$mdoc])*
                async fn $fn(&self, ctx: &CallContext, _req: $req) -> CsiResult<$resp> {
                    unimplemented(ctx)
                }
            )*
            $(
                /// Answers from the declared capabilities unless overridden.
                async fn $capfn(&self, ctx: &CallContext, _req: $capreq) -> CsiResult<$capresp> {
                    Ok(ctx.capabilities().$respfn())
                }
            )?
        }
    };
}

driver_trait! {
    /// The Controller service. Implement the methods whose capabilities you
    /// declare; the server never calls a method whose capability is missing.
    trait Controller {
        /// CreateVolume (CREATE_DELETE_VOLUME).
        fn create_volume(CreateVolumeRequest) -> CreateVolumeResponse;
        /// DeleteVolume (CREATE_DELETE_VOLUME).
        fn delete_volume(DeleteVolumeRequest) -> DeleteVolumeResponse;
        /// ControllerPublishVolume (PUBLISH_UNPUBLISH_VOLUME).
        fn controller_publish_volume(ControllerPublishVolumeRequest) -> ControllerPublishVolumeResponse;
        /// ControllerUnpublishVolume (PUBLISH_UNPUBLISH_VOLUME).
        fn controller_unpublish_volume(ControllerUnpublishVolumeRequest) -> ControllerUnpublishVolumeResponse;
        /// ValidateVolumeCapabilities (always required of a controller).
        fn validate_volume_capabilities(ValidateVolumeCapabilitiesRequest) -> ValidateVolumeCapabilitiesResponse;
        /// ListVolumes (LIST_VOLUMES); see [`crate::helpers::paging`].
        fn list_volumes(ListVolumesRequest) -> ListVolumesResponse;
        /// GetCapacity (GET_CAPACITY).
        fn get_capacity(GetCapacityRequest) -> GetCapacityResponse;
        /// CreateSnapshot (CREATE_DELETE_SNAPSHOT).
        fn create_snapshot(CreateSnapshotRequest) -> CreateSnapshotResponse;
        /// DeleteSnapshot (CREATE_DELETE_SNAPSHOT).
        fn delete_snapshot(DeleteSnapshotRequest) -> DeleteSnapshotResponse;
        /// ListSnapshots (LIST_SNAPSHOTS).
        fn list_snapshots(ListSnapshotsRequest) -> ListSnapshotsResponse;
        /// GetSnapshot (GET_SNAPSHOT).
        fn get_snapshot(GetSnapshotRequest) -> GetSnapshotResponse;
        /// ControllerExpandVolume (EXPAND_VOLUME).
        fn controller_expand_volume(ControllerExpandVolumeRequest) -> ControllerExpandVolumeResponse;
        /// ControllerGetVolume (GET_VOLUME).
        fn controller_get_volume(ControllerGetVolumeRequest) -> ControllerGetVolumeResponse;
        /// ControllerModifyVolume (MODIFY_VOLUME).
        fn controller_modify_volume(ControllerModifyVolumeRequest) -> ControllerModifyVolumeResponse;
    }
    capabilities controller_get_capabilities(ControllerGetCapabilitiesRequest) -> ControllerGetCapabilitiesResponse = controller_response;
}

driver_trait! {
    /// The Node service.
    trait Node {
        /// NodeStageVolume (STAGE_UNSTAGE_VOLUME).
        fn node_stage_volume(NodeStageVolumeRequest) -> NodeStageVolumeResponse;
        /// NodeUnstageVolume (STAGE_UNSTAGE_VOLUME).
        fn node_unstage_volume(NodeUnstageVolumeRequest) -> NodeUnstageVolumeResponse;
        /// NodePublishVolume; see [`crate::helpers::publish`] for the repeat table.
        fn node_publish_volume(NodePublishVolumeRequest) -> NodePublishVolumeResponse;
        /// NodeUnpublishVolume.
        fn node_unpublish_volume(NodeUnpublishVolumeRequest) -> NodeUnpublishVolumeResponse;
        /// NodeGetVolumeStats (GET_VOLUME_STATS).
        fn node_get_volume_stats(NodeGetVolumeStatsRequest) -> NodeGetVolumeStatsResponse;
        /// NodeExpandVolume (EXPAND_VOLUME).
        fn node_expand_volume(NodeExpandVolumeRequest) -> NodeExpandVolumeResponse;
        /// NodeGetInfo (required of every node plugin).
        fn node_get_info(NodeGetInfoRequest) -> NodeGetInfoResponse;
    }
    capabilities node_get_capabilities(NodeGetCapabilitiesRequest) -> NodeGetCapabilitiesResponse = node_response;
}

driver_trait! {
    /// The GroupController service.
    trait GroupController {
        /// CreateVolumeGroupSnapshot.
        fn create_volume_group_snapshot(CreateVolumeGroupSnapshotRequest) -> CreateVolumeGroupSnapshotResponse;
        /// DeleteVolumeGroupSnapshot.
        fn delete_volume_group_snapshot(DeleteVolumeGroupSnapshotRequest) -> DeleteVolumeGroupSnapshotResponse;
        /// GetVolumeGroupSnapshot.
        fn get_volume_group_snapshot(GetVolumeGroupSnapshotRequest) -> GetVolumeGroupSnapshotResponse;
    }
    capabilities group_controller_get_capabilities(GroupControllerGetCapabilitiesRequest) -> GroupControllerGetCapabilitiesResponse = group_controller_response;
}

/// The SnapshotMetadata service (alpha): server-streaming RPCs returning a
/// boxed stream. An `Err` item aborts the stream with that error.
#[async_trait]
pub trait SnapshotMetadata: Send + Sync + 'static {
    /// GetMetadataAllocated.
    async fn get_metadata_allocated(
        &self,
        ctx: &CallContext,
        _req: GetMetadataAllocatedRequest,
    ) -> CsiResult<CsiStream<GetMetadataAllocatedResponse>> {
        unimplemented(ctx)
    }

    /// GetMetadataDelta.
    async fn get_metadata_delta(
        &self,
        ctx: &CallContext,
        _req: GetMetadataDeltaRequest,
    ) -> CsiResult<CsiStream<GetMetadataDeltaResponse>> {
        unimplemented(ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NodeOnly;
    impl Node for NodeOnly {}

    #[tokio::test]
    async fn defaults_answer_from_the_declaration_or_unimplemented() {
        use csi_proto::v1::node_service_capability::rpc::Type as NodeRpc;
        let ctx = CallContext::for_test(
            Method::NodeGetCapabilities,
            PluginInfo::new("x.y", "1").unwrap(),
            Capabilities::new().node([NodeRpc::GetVolumeStats]),
        );
        let caps = NodeOnly
            .node_get_capabilities(&ctx, Default::default())
            .await
            .unwrap();
        assert_eq!(caps.capabilities.len(), 1);
        let err = NodeOnly
            .node_get_info(&ctx, Default::default())
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unimplemented);
        let info = DefaultIdentity
            .get_plugin_info(&ctx, Default::default())
            .await
            .unwrap();
        assert_eq!(info.name, "x.y");
    }
}
