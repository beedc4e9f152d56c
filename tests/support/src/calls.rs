//! The CSI calls the end-to-end tests make again and again, one function
//! each: it sends the request and fails the test, naming the RPC, when the
//! driver refuses. Tests that check a refusal call the client themselves.

use std::collections::HashMap;
use std::path::Path;

use csi_client::CsiClient;
use csi_proto::v1::{
    ControllerModifyVolumeRequest, ControllerUnpublishVolumeRequest, CreateVolumeRequest,
    DeleteVolumeRequest, GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse,
    ListSnapshotsRequest, ListSnapshotsResponse, ListVolumesRequest, ListVolumesResponse,
    NodeGetInfoRequest, NodePublishVolumeRequest, NodeStageVolumeRequest,
    NodeUnpublishVolumeRequest, NodeUnstageVolumeRequest, Volume, VolumeCapability,
};

fn path_str(path: &Path) -> String {
    path.to_string_lossy().into()
}

/// CreateVolume of `req`: the volume made, or the driver's refusal.
pub async fn try_create_volume(
    client: &CsiClient,
    req: CreateVolumeRequest,
) -> Result<Volume, tonic::Status> {
    let volume = client.controller().create_volume(req).await?.into_inner();
    Ok(volume.volume.expect("a created volume"))
}

/// CreateVolume of `req`: the volume made.
pub async fn create_volume(client: &CsiClient, req: CreateVolumeRequest) -> Volume {
    try_create_volume(client, req).await.expect("CreateVolume")
}

/// GetPluginCapabilities: the services and features the driver offers.
pub async fn plugin_capabilities(client: &CsiClient) -> GetPluginCapabilitiesResponse {
    client
        .identity()
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .expect("GetPluginCapabilities")
        .into_inner()
}

/// NodeGetInfo: the driver's node id.
pub async fn node_id(client: &CsiClient) -> String {
    client
        .node()
        .node_get_info(NodeGetInfoRequest {})
        .await
        .expect("NodeGetInfo")
        .into_inner()
        .node_id
}

/// DeleteVolume of `volume_id`.
pub async fn delete_volume(client: &CsiClient, volume_id: &str) {
    let req = DeleteVolumeRequest {
        volume_id: volume_id.into(),
        ..Default::default()
    };
    client
        .controller()
        .delete_volume(req)
        .await
        .expect("DeleteVolume");
}

/// ControllerUnpublishVolume of `volume_id` from `node_id`.
pub async fn controller_unpublish(client: &CsiClient, volume_id: &str, node_id: &str) {
    let req = ControllerUnpublishVolumeRequest {
        volume_id: volume_id.into(),
        node_id: node_id.into(),
        ..Default::default()
    };
    client
        .controller()
        .controller_unpublish_volume(req)
        .await
        .expect("ControllerUnpublishVolume");
}

/// NodeStageVolume of `volume_id` at `staging` with `cap`.
pub async fn node_stage(
    client: &CsiClient,
    volume_id: &str,
    publish_context: HashMap<String, String>,
    staging: &Path,
    cap: VolumeCapability,
) {
    let req = NodeStageVolumeRequest {
        volume_id: volume_id.into(),
        publish_context,
        staging_target_path: path_str(staging),
        volume_capability: Some(cap),
        ..Default::default()
    };
    client
        .node()
        .node_stage_volume(req)
        .await
        .expect("NodeStageVolume");
}

/// NodePublishVolume of `volume_id`, staged at `staging`, to `target`.
pub async fn node_publish(
    client: &CsiClient,
    volume_id: &str,
    publish_context: HashMap<String, String>,
    (staging, target): (&Path, &Path),
    cap: VolumeCapability,
) {
    let req = NodePublishVolumeRequest {
        volume_id: volume_id.into(),
        publish_context,
        staging_target_path: path_str(staging),
        target_path: path_str(target),
        volume_capability: Some(cap),
        ..Default::default()
    };
    client
        .node()
        .node_publish_volume(req)
        .await
        .expect("NodePublishVolume");
}

/// NodeUnpublishVolume of `volume_id` from `target`.
pub async fn node_unpublish(client: &CsiClient, volume_id: &str, target: &Path) {
    let req = NodeUnpublishVolumeRequest {
        volume_id: volume_id.into(),
        target_path: path_str(target),
    };
    client
        .node()
        .node_unpublish_volume(req)
        .await
        .expect("NodeUnpublishVolume");
}

/// NodeUnstageVolume of `volume_id` from `staging`.
pub async fn node_unstage(client: &CsiClient, volume_id: &str, staging: &Path) {
    let req = NodeUnstageVolumeRequest {
        volume_id: volume_id.into(),
        staging_target_path: path_str(staging),
    };
    client
        .node()
        .node_unstage_volume(req)
        .await
        .expect("NodeUnstageVolume");
}

/// The whole way back from a published volume, as the kubelet and the
/// attacher take it: NodeUnpublish, NodeUnstage, ControllerUnpublish from
/// `node_id`, DeleteVolume.
pub async fn tear_down(
    client: &CsiClient,
    volume_id: &str,
    node_id: &str,
    (staging, target): (&Path, &Path),
) {
    node_unpublish(client, volume_id, target).await;
    node_unstage(client, volume_id, staging).await;
    controller_unpublish(client, volume_id, node_id).await;
    delete_volume(client, volume_id).await;
}

/// ListVolumes, first page.
pub async fn list_volumes(client: &CsiClient) -> ListVolumesResponse {
    client
        .controller()
        .list_volumes(ListVolumesRequest::default())
        .await
        .expect("ListVolumes")
        .into_inner()
}

/// ListSnapshots, first page.
pub async fn list_snapshots(client: &CsiClient) -> ListSnapshotsResponse {
    client
        .controller()
        .list_snapshots(ListSnapshotsRequest::default())
        .await
        .expect("ListSnapshots")
        .into_inner()
}

/// A ControllerModifyVolume request setting `params` on `volume_id`.
pub fn modify_request(volume_id: &str, params: &[(&str, &str)]) -> ControllerModifyVolumeRequest {
    ControllerModifyVolumeRequest {
        volume_id: volume_id.into(),
        mutable_parameters: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}
