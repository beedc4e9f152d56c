//! What the layers need to know about any request, type-erased: its method,
//! the resources it locks, the volume it concerns, its validation and its
//! capability rules.

use std::any::Any;
use std::fmt;

use csi_proto::v1::controller_service_capability::rpc::Type as ControllerRpc;
use csi_proto::v1::node_service_capability::rpc::Type as NodeRpc;
use csi_proto::v1::volume_content_source::Type as SourceType;
use csi_proto::v1::*;

use crate::capabilities::Capabilities;
use crate::error::CsiError;
use crate::method::Method;
use crate::validate::Validate;

/// The kind of resource a lock key names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeyKind {
    /// A volume id.
    Volume,
    /// A volume name (CreateVolume).
    VolumeName,
    /// A snapshot id.
    Snapshot,
    /// A snapshot name (CreateSnapshot).
    SnapshotName,
    /// A group snapshot id.
    GroupSnapshot,
    /// A group snapshot name (CreateVolumeGroupSnapshot).
    GroupSnapshotName,
    /// A node target or staging path.
    Path,
}

/// A resource one call at a time may operate on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockKey {
    /// What the value names.
    pub kind: KeyKind,
    /// The id, name or path.
    pub value: String,
}

impl LockKey {
    /// A key of `kind` for `value`.
    pub fn new(kind: KeyKind, value: impl Into<String>) -> Self {
        Self {
            kind,
            value: value.into(),
        }
    }
}

impl fmt::Display for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            KeyKind::Volume => "volume",
            KeyKind::VolumeName => "volume name",
            KeyKind::Snapshot => "snapshot",
            KeyKind::SnapshotName => "snapshot name",
            KeyKind::GroupSnapshot => "group snapshot",
            KeyKind::GroupSnapshotName => "group snapshot name",
            KeyKind::Path => "path",
        };
        write!(f, "{kind} {:?}", self.value)
    }
}

/// A CSI request as the layers see it. Implemented for every request type
/// of `csi_proto::v1`; `Debug` is the redacting one from csi-proto.
pub trait CsiRequest: Validate + fmt::Debug + Send + Sync + 'static {
    /// The RPC this request belongs to.
    fn method(&self) -> Method;

    /// The volume the call concerns, for tracing.
    fn volume_id(&self) -> Option<&str> {
        None
    }

    /// Resources that must not be operated on concurrently. Empty values
    /// are skipped (validation rejects them first).
    fn lock_keys(&self) -> Vec<LockKey> {
        Vec::new()
    }

    /// Field-level capability rules (beyond the RPC's own capability).
    fn check_capabilities(&self, _caps: &Capabilities) -> Result<(), CsiError> {
        Ok(())
    }

    /// Runs [`Validate::validate`] (object-safe entry point).
    fn validate_request(&self) -> Result<(), CsiError> {
        self.validate()
    }

    /// For downcasting back to the concrete request.
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;
}

fn keys(pairs: &[(KeyKind, &str)]) -> Vec<LockKey> {
    pairs
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| LockKey::new(*k, *v))
        .collect()
}

macro_rules! csi_request {
    ($($req:ty => $method:ident $(, volume: $vol:ident)? $(, locks: |$r:ident| $locks:expr)?;)*) => {$(
        impl CsiRequest for $req {
            fn method(&self) -> Method {
                Method::$method
            }
            $(fn volume_id(&self) -> Option<&str> {
                Some(&self.$vol)
            })?
            $(fn lock_keys(&self) -> Vec<LockKey> {
                let $r = self;
                keys(&$locks)
            })?
            fn check_capabilities(&self, caps: &Capabilities) -> Result<(), CsiError> {
                field_capabilities(self, caps)
            }
            fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
                self
            }
        }
    )*};
}

use KeyKind as K;

csi_request! {
    GetPluginInfoRequest => GetPluginInfo;
    GetPluginCapabilitiesRequest => GetPluginCapabilities;
    ProbeRequest => Probe;
    CreateVolumeRequest => CreateVolume, locks: |r| [(K::VolumeName, r.name.as_str())];
    DeleteVolumeRequest => DeleteVolume, volume: volume_id, locks: |r| [(K::Volume, r.volume_id.as_str())];
    ControllerPublishVolumeRequest => ControllerPublishVolume, volume: volume_id, locks: |r| [(K::Volume, r.volume_id.as_str())];
    ControllerUnpublishVolumeRequest => ControllerUnpublishVolume, volume: volume_id, locks: |r| [(K::Volume, r.volume_id.as_str())];
    ValidateVolumeCapabilitiesRequest => ValidateVolumeCapabilities, volume: volume_id;
    ListVolumesRequest => ListVolumes;
    GetCapacityRequest => GetCapacity;
    ControllerGetCapabilitiesRequest => ControllerGetCapabilities;
    CreateSnapshotRequest => CreateSnapshot, volume: source_volume_id, locks: |r| [(K::SnapshotName, r.name.as_str())];
    DeleteSnapshotRequest => DeleteSnapshot, locks: |r| [(K::Snapshot, r.snapshot_id.as_str())];
    ListSnapshotsRequest => ListSnapshots;
    GetSnapshotRequest => GetSnapshot;
    ControllerExpandVolumeRequest => ControllerExpandVolume, volume: volume_id, locks: |r| [(K::Volume, r.volume_id.as_str())];
    ControllerGetVolumeRequest => ControllerGetVolume, volume: volume_id;
    ControllerModifyVolumeRequest => ControllerModifyVolume, volume: volume_id, locks: |r| [(K::Volume, r.volume_id.as_str())];
    GroupControllerGetCapabilitiesRequest => GroupControllerGetCapabilities;
    CreateVolumeGroupSnapshotRequest => CreateVolumeGroupSnapshot, locks: |r| [(K::GroupSnapshotName, r.name.as_str())];
    DeleteVolumeGroupSnapshotRequest => DeleteVolumeGroupSnapshot, locks: |r| [(K::GroupSnapshot, r.group_snapshot_id.as_str())];
    GetVolumeGroupSnapshotRequest => GetVolumeGroupSnapshot;
    GetMetadataAllocatedRequest => GetMetadataAllocated;
    GetMetadataDeltaRequest => GetMetadataDelta;
    NodeStageVolumeRequest => NodeStageVolume, volume: volume_id,
        locks: |r| [(K::Volume, r.volume_id.as_str()), (K::Path, r.staging_target_path.as_str())];
    NodeUnstageVolumeRequest => NodeUnstageVolume, volume: volume_id,
        locks: |r| [(K::Volume, r.volume_id.as_str()), (K::Path, r.staging_target_path.as_str())];
    NodePublishVolumeRequest => NodePublishVolume, volume: volume_id,
        locks: |r| [(K::Volume, r.volume_id.as_str()), (K::Path, r.target_path.as_str())];
    NodeUnpublishVolumeRequest => NodeUnpublishVolume, volume: volume_id,
        locks: |r| [(K::Volume, r.volume_id.as_str()), (K::Path, r.target_path.as_str())];
    NodeGetVolumeStatsRequest => NodeGetVolumeStats, volume: volume_id;
    NodeExpandVolumeRequest => NodeExpandVolume, volume: volume_id, locks: |r| [(K::Volume, r.volume_id.as_str())];
    NodeGetCapabilitiesRequest => NodeGetCapabilities;
    NodeGetInfoRequest => NodeGetInfo;
}

/// Field-level capability rules, keyed by request type.
trait FieldCapabilities {
    fn field_capabilities(&self, _caps: &Capabilities) -> Result<(), CsiError> {
        Ok(())
    }
}

fn field_capabilities<T: FieldCapabilities>(req: &T, caps: &Capabilities) -> Result<(), CsiError> {
    req.field_capabilities(caps)
}

macro_rules! no_field_rules {
    ($($t:ty),*) => {$(impl FieldCapabilities for $t {})*};
}

no_field_rules!(
    GetPluginInfoRequest,
    GetPluginCapabilitiesRequest,
    ProbeRequest,
    DeleteVolumeRequest,
    ControllerPublishVolumeRequest,
    ControllerUnpublishVolumeRequest,
    ListVolumesRequest,
    GetCapacityRequest,
    ControllerGetCapabilitiesRequest,
    CreateSnapshotRequest,
    DeleteSnapshotRequest,
    ListSnapshotsRequest,
    GetSnapshotRequest,
    ControllerExpandVolumeRequest,
    ControllerGetVolumeRequest,
    GroupControllerGetCapabilitiesRequest,
    CreateVolumeGroupSnapshotRequest,
    DeleteVolumeGroupSnapshotRequest,
    GetVolumeGroupSnapshotRequest,
    GetMetadataAllocatedRequest,
    GetMetadataDeltaRequest,
    NodeStageVolumeRequest,
    NodeUnstageVolumeRequest,
    NodeUnpublishVolumeRequest,
    NodeGetVolumeStatsRequest,
    NodeExpandVolumeRequest,
    NodeGetCapabilitiesRequest,
    NodeGetInfoRequest
);

fn no_mutable_parameters(
    caps: &Capabilities,
    m: &std::collections::HashMap<String, String>,
) -> Result<(), CsiError> {
    if !m.is_empty() && !caps.has_controller(ControllerRpc::ModifyVolume) {
        return Err(CsiError::invalid(
            "mutable_parameters",
            "not supported: the plugin does not declare MODIFY_VOLUME",
        ));
    }
    Ok(())
}

/// MODIFY_VOLUME declared, and every key one the driver declared it accepts.
fn accepted_mutable_parameters(
    caps: &Capabilities,
    m: &std::collections::HashMap<String, String>,
) -> Result<(), CsiError> {
    no_mutable_parameters(caps, m)?;
    match caps.accepted_mutable_parameters() {
        Some(accepted) => {
            crate::helpers::mutable::check_accepted("mutable_parameters", m, accepted)
        }
        None => Ok(()),
    }
}

impl FieldCapabilities for CreateVolumeRequest {
    fn field_capabilities(&self, caps: &Capabilities) -> Result<(), CsiError> {
        match self
            .volume_content_source
            .as_ref()
            .and_then(|s| s.r#type.as_ref())
        {
            Some(SourceType::Snapshot(_))
                if !caps.has_controller(ControllerRpc::CreateDeleteSnapshot) =>
            {
                return Err(CsiError::invalid(
                    "volume_content_source.snapshot",
                    "not supported: the plugin does not declare CREATE_DELETE_SNAPSHOT",
                ));
            }
            Some(SourceType::Volume(_)) if !caps.has_controller(ControllerRpc::CloneVolume) => {
                return Err(CsiError::invalid(
                    "volume_content_source.volume",
                    "not supported: the plugin does not declare CLONE_VOLUME",
                ));
            }
            _ => {}
        }
        accepted_mutable_parameters(caps, &self.mutable_parameters)
    }
}

impl FieldCapabilities for ControllerModifyVolumeRequest {
    fn field_capabilities(&self, caps: &Capabilities) -> Result<(), CsiError> {
        accepted_mutable_parameters(caps, &self.mutable_parameters)
    }
}

impl FieldCapabilities for ValidateVolumeCapabilitiesRequest {
    fn field_capabilities(&self, caps: &Capabilities) -> Result<(), CsiError> {
        no_mutable_parameters(caps, &self.mutable_parameters)
    }
}

/// The volume context key kubelet sets to `"true"` for a CSI inline
/// ephemeral volume (published without NodeStage).
pub const EPHEMERAL_CONTEXT_KEY: &str = "csi.storage.k8s.io/ephemeral";

impl FieldCapabilities for NodePublishVolumeRequest {
    fn field_capabilities(&self, caps: &Capabilities) -> Result<(), CsiError> {
        // Kubelet never stages CSI inline ephemeral volumes, so they are exempt.
        let ephemeral = self
            .volume_context
            .get(EPHEMERAL_CONTEXT_KEY)
            .is_some_and(|v| v == "true");
        if self.staging_target_path.is_empty()
            && caps.has_node(NodeRpc::StageUnstageVolume)
            && !ephemeral
        {
            return Err(CsiError::FailedPrecondition(
                "staging_target_path is required: the plugin declares STAGE_UNSTAGE_VOLUME".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod ephemeral_tests {
    use super::*;

    #[test]
    fn inline_ephemeral_publish_needs_no_staging_path() {
        let caps = Capabilities::new().node([NodeRpc::StageUnstageVolume]);
        let mut req = NodePublishVolumeRequest {
            volume_id: "v".into(),
            target_path: "/t".into(),
            ..Default::default()
        };
        let err = req.field_capabilities(&caps).unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
        req.volume_context
            .insert(EPHEMERAL_CONTEXT_KEY.into(), "true".into());
        assert!(req.field_capabilities(&caps).is_ok());
    }
}
