//! A [`VolumePlugin`] that drives a real CSI driver over its socket:
//! attach → ControllerPublishVolume, stage → NodeStageVolume, publish →
//! NodePublishVolume, and back, expand → NodeExpandVolume.
//!
//! gRPC codes become [`ErrorKind`](crate::ErrorKind)s through
//! [`PluginError::from_code`](crate::PluginError::from_code): a
//! timeout, cancellation, `UNAVAILABLE`, `ABORTED` or `RESOURCE_EXHAUSTED`
//! leaves the operation uncertain, so the reconciler re-runs or tears down
//! rather than assuming nothing happened.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use csi_client::{CsiClient, UnaryRequest};
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::{
    CapacityRange, ControllerPublishVolumeRequest, ControllerUnpublishVolumeRequest,
    NodeExpandVolumeRequest, NodePublishVolumeRequest, NodeStageVolumeRequest,
    NodeUnpublishVolumeRequest, NodeUnstageVolumeRequest, VolumeCapability,
};

use crate::error::PluginError;
use crate::plugin::{ExpandRequest, MountResult, PublishRequest, StageRequest, VolumePlugin};
use crate::types::{AttachInfo, Key, NodeAccess, VolumeSpec};

/// Builds the CSI capability of a volume from its spec.
pub type CapabilityFn = dyn Fn(&VolumeSpec) -> VolumeCapability + Send + Sync;

/// Drives one CSI driver. Volume and node keys are the CSI volume and node
/// ids (`AsRef<str>`).
pub struct CsiVolumePlugin {
    client: CsiClient,
    secrets: HashMap<String, String>,
    capability: Arc<CapabilityFn>,
    /// Publish contexts from ControllerPublish, by (volume, node).
    attachments: Mutex<HashMap<(String, String), AttachInfo>>,
}

impl std::fmt::Debug for CsiVolumePlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CsiVolumePlugin")
            .field("endpoint", &self.client.endpoint().to_string())
            .field("secrets", &csi_proto::redact::Redacted(self.secrets.len()))
            .finish_non_exhaustive()
    }
}

/// The default capability: a filesystem with the spec's type and mount
/// options; single-node writer, multi-node multi-writer, or the reader-only
/// mode of either when the spec is read-only.
pub fn default_capability(spec: &VolumeSpec) -> VolumeCapability {
    let mode = match (spec.access_mode, spec.read_only) {
        (NodeAccess::SingleNode, false) => Mode::SingleNodeWriter,
        (NodeAccess::SingleNode, true) => Mode::SingleNodeReaderOnly,
        (NodeAccess::MultiNode, false) => Mode::MultiNodeMultiWriter,
        (NodeAccess::MultiNode, true) => Mode::MultiNodeReaderOnly,
    };
    VolumeCapability::mount(spec.fs_type.clone().unwrap_or_default())
        .with_mount_flags(spec.mount_options.clone())
        .with_access_mode(mode)
}

fn status_error(rpc: &str, status: tonic::Status) -> PluginError {
    PluginError::from_code(status.code(), format!("{rpc}: {}", status.message()))
}

fn context(attributes: &BTreeMap<String, String>) -> HashMap<String, String> {
    attributes
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

impl CsiVolumePlugin {
    /// A plugin talking through `client`, with mount capabilities.
    pub fn new(client: CsiClient) -> Self {
        Self {
            client,
            secrets: HashMap::new(),
            capability: Arc::new(default_capability),
            attachments: Mutex::new(HashMap::new()),
        }
    }

    /// Sends `request`; a failure names the RPC.
    async fn send<Req: UnaryRequest>(&self, request: Req) -> Result<Req::Response, PluginError> {
        self.client
            .call(request)
            .await
            .map_err(|s| status_error(Req::METHOD.name(), s))
    }

    /// Sends these secrets with every request that carries secrets.
    pub fn with_secrets(mut self, secrets: HashMap<String, String>) -> Self {
        self.secrets = secrets;
        self
    }

    /// Replaces how capabilities are built (e.g. for raw block volumes).
    pub fn with_capability(
        mut self,
        f: impl Fn(&VolumeSpec) -> VolumeCapability + Send + Sync + 'static,
    ) -> Self {
        self.capability = Arc::new(f);
        self
    }

    fn attachment(&self, volume: &str, node: &str) -> Option<AttachInfo> {
        self.attachments
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(volume.to_owned(), node.to_owned()))
            .cloned()
    }

    async fn controller_publish(
        &self,
        volume: &str,
        node: &str,
        spec: &VolumeSpec,
    ) -> Result<AttachInfo, PluginError> {
        let req = ControllerPublishVolumeRequest {
            volume_id: volume.to_owned(),
            node_id: node.to_owned(),
            volume_capability: Some((self.capability)(spec)),
            readonly: spec.read_only,
            secrets: self.secrets.clone(),
            volume_context: context(&spec.attributes),
        };
        let resp = self.send(req).await?;
        let info = AttachInfo {
            device_path: None,
            publish_context: resp.publish_context.into_iter().collect(),
        };
        self.attachments
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((volume.to_owned(), node.to_owned()), info.clone());
        Ok(info)
    }
}

#[async_trait]
impl<V, N> VolumePlugin<V, N> for CsiVolumePlugin
where
    V: Key + AsRef<str>,
    N: Key + AsRef<str>,
{
    async fn attach(
        &self,
        volume: &V,
        node: &N,
        spec: &VolumeSpec,
    ) -> Result<AttachInfo, PluginError> {
        self.controller_publish(volume.as_ref(), node.as_ref(), spec)
            .await
    }

    async fn wait_for_attach(
        &self,
        volume: &V,
        node: &N,
        spec: &VolumeSpec,
    ) -> Result<AttachInfo, PluginError> {
        // ControllerPublish is idempotent: repeating it returns the same
        // publish context when this process did not see the attach itself.
        match self.attachment(volume.as_ref(), node.as_ref()) {
            Some(info) => Ok(info),
            None => {
                self.controller_publish(volume.as_ref(), node.as_ref(), spec)
                    .await
            }
        }
    }

    async fn detach(&self, volume: &V, node: &N) -> Result<(), PluginError> {
        let req = ControllerUnpublishVolumeRequest {
            volume_id: volume.as_ref().to_owned(),
            node_id: node.as_ref().to_owned(),
            secrets: self.secrets.clone(),
        };
        self.send(req).await?;
        self.attachments
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(volume.as_ref().to_owned(), node.as_ref().to_owned()));
        Ok(())
    }

    async fn stage(&self, request: &StageRequest<V>) -> Result<MountResult, PluginError> {
        let req = NodeStageVolumeRequest {
            volume_id: request.volume.as_ref().to_owned(),
            publish_context: request.attach.publish_context.clone().into_iter().collect(),
            staging_target_path: path(&request.staging_path),
            volume_capability: Some((self.capability)(&request.spec)),
            secrets: self.secrets.clone(),
            volume_context: context(&request.spec.attributes),
        };
        self.send(req).await?;
        // CSI stage and publish responses carry no size.
        Ok(MountResult::default())
    }

    async fn unstage(&self, volume: &V, staging_path: &Path) -> Result<(), PluginError> {
        let req = NodeUnstageVolumeRequest {
            volume_id: volume.as_ref().to_owned(),
            staging_target_path: path(staging_path),
        };
        self.send(req).await?;
        Ok(())
    }

    async fn publish(&self, request: &PublishRequest<V>) -> Result<MountResult, PluginError> {
        let req = NodePublishVolumeRequest {
            volume_id: request.volume.as_ref().to_owned(),
            publish_context: request.attach.publish_context.clone().into_iter().collect(),
            staging_target_path: request
                .staging_path
                .as_deref()
                .map(path)
                .unwrap_or_default(),
            target_path: path(&request.target_path),
            volume_capability: Some((self.capability)(&request.spec)),
            readonly: request.spec.read_only,
            secrets: self.secrets.clone(),
            volume_context: context(&request.spec.attributes),
        };
        self.send(req).await?;
        Ok(MountResult::default())
    }

    async fn unpublish(&self, volume: &V, target_path: &Path) -> Result<(), PluginError> {
        let req = NodeUnpublishVolumeRequest {
            volume_id: volume.as_ref().to_owned(),
            target_path: path(target_path),
        };
        self.send(req).await?;
        Ok(())
    }

    async fn expand(&self, request: &ExpandRequest<V>) -> Result<u64, PluginError> {
        let size = i64::try_from(request.new_size).map_err(|_| {
            PluginError::final_error(format!(
                "size {} does not fit CSI's int64",
                request.new_size
            ))
        })?;
        let req = NodeExpandVolumeRequest {
            volume_id: request.volume.as_ref().to_owned(),
            volume_path: path(&request.volume_path),
            capacity_range: Some(CapacityRange::at_least(size)),
            staging_target_path: request
                .staging_path
                .as_deref()
                .map(path)
                .unwrap_or_default(),
            volume_capability: Some((self.capability)(&request.spec)),
            secrets: self.secrets.clone(),
        };
        let resp = self.send(req).await?;
        Ok(u64::try_from(resp.capacity_bytes).unwrap_or(request.new_size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_capability_follows_access_mode_and_read_only() {
        let mut spec = VolumeSpec {
            fs_type: Some("xfs".into()),
            mount_options: vec!["noatime".into()],
            ..Default::default()
        };
        let cap = default_capability(&spec);
        assert_eq!(cap.access_mode(), Mode::SingleNodeWriter);
        assert_eq!(cap.mount_volume().unwrap().fs_type, "xfs");
        spec.read_only = true;
        spec.access_mode = NodeAccess::MultiNode;
        assert_eq!(
            default_capability(&spec).access_mode(),
            Mode::MultiNodeReaderOnly
        );
    }

    #[test]
    fn grpc_codes_map_to_error_kinds() {
        use crate::error::ErrorKind;
        let e = status_error("NodeStageVolume", tonic::Status::deadline_exceeded("slow"));
        assert_eq!(e.kind, ErrorKind::Uncertain);
        assert!(e.message.contains("NodeStageVolume: slow"));
        assert_eq!(
            status_error("X", tonic::Status::not_found("gone")).kind,
            ErrorKind::Final
        );
        assert_eq!(
            status_error("X", tonic::Status::unavailable("down")).kind,
            ErrorKind::Uncertain
        );
    }
}
