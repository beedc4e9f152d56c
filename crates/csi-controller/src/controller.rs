//! csi-driver's `Controller` and `GroupController` traits for
//! [`ControllerService`]: each RPC is in its own file.

use csi_driver::{CallContext, CsiResult, async_trait};
use csi_proto::v1::*;

use crate::backend::ControllerBackend;
use crate::service::ControllerService;

#[async_trait]
impl<B: ControllerBackend> csi_driver::Controller for ControllerService<B> {
    async fn create_volume(
        &self,
        ctx: &CallContext,
        req: CreateVolumeRequest,
    ) -> CsiResult<CreateVolumeResponse> {
        self.create_volume_rpc(ctx, req).await
    }

    async fn delete_volume(
        &self,
        ctx: &CallContext,
        req: DeleteVolumeRequest,
    ) -> CsiResult<DeleteVolumeResponse> {
        self.delete_volume_rpc(ctx, req).await
    }

    async fn controller_publish_volume(
        &self,
        ctx: &CallContext,
        req: ControllerPublishVolumeRequest,
    ) -> CsiResult<ControllerPublishVolumeResponse> {
        self.controller_publish_rpc(ctx, req).await
    }

    async fn controller_unpublish_volume(
        &self,
        ctx: &CallContext,
        req: ControllerUnpublishVolumeRequest,
    ) -> CsiResult<ControllerUnpublishVolumeResponse> {
        self.controller_unpublish_rpc(ctx, req).await
    }

    async fn validate_volume_capabilities(
        &self,
        ctx: &CallContext,
        req: ValidateVolumeCapabilitiesRequest,
    ) -> CsiResult<ValidateVolumeCapabilitiesResponse> {
        self.validate_rpc(ctx, req).await
    }

    async fn list_volumes(
        &self,
        ctx: &CallContext,
        req: ListVolumesRequest,
    ) -> CsiResult<ListVolumesResponse> {
        self.list_volumes_rpc(ctx, req).await
    }

    async fn get_capacity(
        &self,
        ctx: &CallContext,
        req: GetCapacityRequest,
    ) -> CsiResult<GetCapacityResponse> {
        self.get_capacity_rpc(ctx, req).await
    }

    async fn create_snapshot(
        &self,
        ctx: &CallContext,
        req: CreateSnapshotRequest,
    ) -> CsiResult<CreateSnapshotResponse> {
        self.create_snapshot_rpc(ctx, req).await
    }

    async fn delete_snapshot(
        &self,
        ctx: &CallContext,
        req: DeleteSnapshotRequest,
    ) -> CsiResult<DeleteSnapshotResponse> {
        self.delete_snapshot_rpc(ctx, req).await
    }

    async fn list_snapshots(
        &self,
        ctx: &CallContext,
        req: ListSnapshotsRequest,
    ) -> CsiResult<ListSnapshotsResponse> {
        self.list_snapshots_rpc(ctx, req).await
    }

    async fn get_snapshot(
        &self,
        ctx: &CallContext,
        req: GetSnapshotRequest,
    ) -> CsiResult<GetSnapshotResponse> {
        self.get_snapshot_rpc(ctx, req).await
    }

    async fn controller_expand_volume(
        &self,
        ctx: &CallContext,
        req: ControllerExpandVolumeRequest,
    ) -> CsiResult<ControllerExpandVolumeResponse> {
        self.controller_expand_rpc(ctx, req).await
    }

    async fn controller_get_volume(
        &self,
        ctx: &CallContext,
        req: ControllerGetVolumeRequest,
    ) -> CsiResult<ControllerGetVolumeResponse> {
        self.get_volume_rpc(ctx, req).await
    }

    async fn controller_modify_volume(
        &self,
        ctx: &CallContext,
        req: ControllerModifyVolumeRequest,
    ) -> CsiResult<ControllerModifyVolumeResponse> {
        self.controller_modify_rpc(ctx, req).await
    }
}

#[async_trait]
impl<B: ControllerBackend> csi_driver::GroupController for ControllerService<B> {
    async fn create_volume_group_snapshot(
        &self,
        ctx: &CallContext,
        req: CreateVolumeGroupSnapshotRequest,
    ) -> CsiResult<CreateVolumeGroupSnapshotResponse> {
        self.create_group_rpc(ctx, req).await
    }

    async fn delete_volume_group_snapshot(
        &self,
        ctx: &CallContext,
        req: DeleteVolumeGroupSnapshotRequest,
    ) -> CsiResult<DeleteVolumeGroupSnapshotResponse> {
        self.delete_group_rpc(ctx, req).await
    }

    async fn get_volume_group_snapshot(
        &self,
        ctx: &CallContext,
        req: GetVolumeGroupSnapshotRequest,
    ) -> CsiResult<GetVolumeGroupSnapshotResponse> {
        self.get_group_rpc(ctx, req).await
    }
}
