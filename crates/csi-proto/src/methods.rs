//! The CSI method table, generated from csi.proto by `build.rs`: one
//! [`Method`] per RPC with its [`Service`], Rust names, message types,
//! streaming, the capability that gates it ([`Requirement`]), the request
//! fields it locks ([`LockField`]) and its secret fields; and
//! [`RpcRequest`], implemented by every request message.
//!
//! Nothing here is written per RPC by hand: a new RPC in csi.proto appears
//! in [`Method::ALL`], in [`for_each_method!`](crate::for_each_method) and in
//! everything generated from them.
//!
//! ```
//! use csi_proto::methods::{ControllerRpc, KeyKind, Method, Requirement, RpcRequest};
//! use csi_proto::v1::{CreateSnapshotRequest, CreateVolumeRequest};
//!
//! assert_eq!(Method::CreateVolume.path(), "/csi.v1.Controller/CreateVolume");
//! assert_eq!(
//!     Method::DeleteVolume.requirement(),
//!     Some(Requirement::Controller(ControllerRpc::CreateDeleteVolume))
//! );
//! assert_eq!(CreateVolumeRequest::METHOD, Method::CreateVolume);
//!
//! // A snapshot locks its name and its source volume.
//! let req = CreateSnapshotRequest {
//!     name: "snap-1".into(),
//!     source_volume_id: "vol-1".into(),
//!     ..Default::default()
//! };
//! let kinds: Vec<KeyKind> = req.lock_keys().into_iter().map(|k| k.kind).collect();
//! assert_eq!(kinds, [KeyKind::SnapshotName, KeyKind::Volume]);
//! ```

use std::collections::HashMap;
use std::fmt;

/// Controller RPC capabilities (`ControllerServiceCapability.RPC.Type`).
pub use crate::v1::controller_service_capability::rpc::Type as ControllerRpc;
/// Group controller RPC capabilities (`GroupControllerServiceCapability.RPC.Type`).
pub use crate::v1::group_controller_service_capability::rpc::Type as GroupControllerRpc;
/// Node RPC capabilities (`NodeServiceCapability.RPC.Type`).
pub use crate::v1::node_service_capability::rpc::Type as NodeRpc;
/// Plugin service capabilities (`PluginCapability.Service.Type`).
pub use crate::v1::plugin_capability::service::Type as PluginService;

include!(concat!(env!("OUT_DIR"), "/csi.v1.methods.rs"));

/// Unary, or a stream of responses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Streaming {
    /// One request, one response.
    Unary,
    /// One request, a stream of responses.
    Server,
}

/// The capability a plugin must declare before an RPC is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Requirement {
    /// A controller RPC capability.
    Controller(ControllerRpc),
    /// A node RPC capability.
    Node(NodeRpc),
    /// A group controller RPC capability.
    GroupController(GroupControllerRpc),
    /// A plugin service capability.
    Plugin(PluginService),
}

impl Requirement {
    /// The capability's proto name, e.g. `CREATE_DELETE_VOLUME`.
    pub fn as_str_name(self) -> &'static str {
        match self {
            Self::Controller(r) => r.as_str_name(),
            Self::Node(r) => r.as_str_name(),
            Self::GroupController(r) => r.as_str_name(),
            Self::Plugin(s) => s.as_str_name(),
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str_name())
    }
}

/// The kind of resource a lock key names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeyKind {
    /// A volume id (`volume_id`, `source_volume_id(s)`, a clone's source).
    Volume,
    /// A volume name (CreateVolume).
    VolumeName,
    /// A snapshot id (`snapshot_id(s)`, a restore's source).
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

impl KeyKind {
    /// Lower-case words, e.g. `volume name`.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Volume => "volume",
            Self::VolumeName => "volume name",
            Self::Snapshot => "snapshot",
            Self::SnapshotName => "snapshot name",
            Self::GroupSnapshot => "group snapshot",
            Self::GroupSnapshotName => "group snapshot name",
            Self::Path => "path",
        }
    }
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
        write!(f, "{} {:?}", self.kind.describe(), self.value)
    }
}

/// A request field an RPC locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockField {
    /// The kind of key the field's value becomes.
    pub kind: KeyKind,
    /// The field's path in the request, e.g. `volume_content_source.volume.volume_id`.
    pub field: &'static str,
}

/// One row of the method table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MethodInfo {
    /// The RPC.
    pub method: Method,
    /// Its name, e.g. `CreateVolume`.
    pub name: &'static str,
    /// Its service.
    pub service: Service,
    /// Its gRPC path, e.g. `/csi.v1.Controller/CreateVolume`.
    pub path: &'static str,
    /// The method name in generated Rust code, e.g. `create_volume`.
    pub rust_name: &'static str,
    /// The request message's full name.
    pub request: &'static str,
    /// The response message's full name.
    pub response: &'static str,
    /// Unary or server streaming.
    pub streaming: Streaming,
    /// Whether the RPC or its service is alpha in the spec.
    pub alpha: bool,
    /// The capability that gates it (`None`: served whenever its service is).
    pub requirement: Option<Requirement>,
    /// The request fields it locks (empty for RPCs that only read).
    pub locks: &'static [LockField],
    /// The request fields marked `csi_secret`.
    pub secret_fields: &'static [&'static str],
}

impl Method {
    /// The RPC name, e.g. `CreateVolume`.
    pub const fn name(self) -> &'static str {
        self.info().name
    }

    /// The service the RPC belongs to.
    pub const fn service(self) -> Service {
        self.info().service
    }

    /// The gRPC path, e.g. `/csi.v1.Controller/CreateVolume`.
    pub const fn path(self) -> &'static str {
        self.info().path
    }

    /// The capability that must be declared for this RPC to be served
    /// (`None`: always served when its service is).
    pub const fn requirement(self) -> Option<Requirement> {
        self.info().requirement
    }

    /// Whether the RPC answers with a stream.
    pub const fn is_streaming(self) -> bool {
        matches!(self.info().streaming, Streaming::Server)
    }

    /// The RPC for a gRPC path, e.g. `/csi.v1.Node/NodeGetInfo`.
    pub fn from_path(path: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|m| m.path() == path)
    }

    /// The RPC of a name, e.g. `NodeGetInfo`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|m| m.name() == name)
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A request message of a CSI RPC: which RPC, and what it locks.
/// Implemented (by `build.rs`) for every request message of csi.proto.
pub trait RpcRequest:
    prost::Message + Default + Clone + fmt::Debug + Send + Sync + 'static
{
    /// The response message (one item of the stream for streaming RPCs).
    type Response: prost::Message + Default + Clone + fmt::Debug + Send + Sync + 'static;

    /// The RPC this message is the request of.
    const METHOD: Method;

    /// The resources this call must hold alone: the ids, name and node
    /// paths in [`MethodInfo::locks`], empty values skipped. Empty for
    /// RPCs that only read.
    fn lock_keys(&self) -> Vec<LockKey> {
        Vec::new()
    }

    /// The volume the call concerns (`volume_id` or `source_volume_id`), for tracing.
    fn volume_id(&self) -> Option<&str> {
        None
    }

    /// The secrets map, for RPCs that carry one.
    fn secrets(&self) -> Option<&HashMap<String, String>> {
        None
    }
}

/// Adds a key unless the value is empty (validation rejects those first).
fn push(keys: &mut Vec<LockKey>, kind: KeyKind, value: &str) {
    if !value.is_empty() {
        keys.push(LockKey::new(kind, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::*;

    #[test]
    fn the_table_is_the_proto() {
        assert_eq!(Method::ALL.len(), 32);
        for (i, m) in Method::ALL.iter().enumerate() {
            assert_eq!(*m as usize, i);
            assert_eq!(m.info().method, *m);
            assert_eq!(Method::from_path(m.path()), Some(*m));
        }
        assert_eq!(Service::ALL.len(), 5);
        assert_eq!(Service::Node.methods().count(), 8);
        assert!(Method::GetMetadataDelta.is_streaming());
        assert!(Method::GetMetadataDelta.info().alpha);
        assert_eq!(
            Method::GetMetadataAllocated.info().rust_name,
            "get_metadata_allocated"
        );
    }

    #[test]
    fn capabilities_are_derived_from_their_names() {
        use Requirement as R;
        let expect = [
            (Method::GetPluginInfo, None),
            (Method::GetPluginCapabilities, None),
            (Method::Probe, None),
            (
                Method::CreateVolume,
                Some(R::Controller(ControllerRpc::CreateDeleteVolume)),
            ),
            (
                Method::DeleteVolume,
                Some(R::Controller(ControllerRpc::CreateDeleteVolume)),
            ),
            (
                Method::ControllerPublishVolume,
                Some(R::Controller(ControllerRpc::PublishUnpublishVolume)),
            ),
            (
                Method::ControllerUnpublishVolume,
                Some(R::Controller(ControllerRpc::PublishUnpublishVolume)),
            ),
            (Method::ValidateVolumeCapabilities, None),
            (
                Method::ListVolumes,
                Some(R::Controller(ControllerRpc::ListVolumes)),
            ),
            (
                Method::GetCapacity,
                Some(R::Controller(ControllerRpc::GetCapacity)),
            ),
            (Method::ControllerGetCapabilities, None),
            (
                Method::CreateSnapshot,
                Some(R::Controller(ControllerRpc::CreateDeleteSnapshot)),
            ),
            (
                Method::DeleteSnapshot,
                Some(R::Controller(ControllerRpc::CreateDeleteSnapshot)),
            ),
            (
                Method::ListSnapshots,
                Some(R::Controller(ControllerRpc::ListSnapshots)),
            ),
            (
                Method::GetSnapshot,
                Some(R::Controller(ControllerRpc::GetSnapshot)),
            ),
            (
                Method::ControllerExpandVolume,
                Some(R::Controller(ControllerRpc::ExpandVolume)),
            ),
            (
                Method::ControllerGetVolume,
                Some(R::Controller(ControllerRpc::GetVolume)),
            ),
            (
                Method::ControllerModifyVolume,
                Some(R::Controller(ControllerRpc::ModifyVolume)),
            ),
            (Method::GroupControllerGetCapabilities, None),
            (
                Method::CreateVolumeGroupSnapshot,
                Some(R::GroupController(
                    GroupControllerRpc::CreateDeleteGetVolumeGroupSnapshot,
                )),
            ),
            (
                Method::DeleteVolumeGroupSnapshot,
                Some(R::GroupController(
                    GroupControllerRpc::CreateDeleteGetVolumeGroupSnapshot,
                )),
            ),
            (
                Method::GetVolumeGroupSnapshot,
                Some(R::GroupController(
                    GroupControllerRpc::CreateDeleteGetVolumeGroupSnapshot,
                )),
            ),
            (
                Method::GetMetadataAllocated,
                Some(R::Plugin(PluginService::SnapshotMetadataService)),
            ),
            (
                Method::GetMetadataDelta,
                Some(R::Plugin(PluginService::SnapshotMetadataService)),
            ),
            (
                Method::NodeStageVolume,
                Some(R::Node(NodeRpc::StageUnstageVolume)),
            ),
            (
                Method::NodeUnstageVolume,
                Some(R::Node(NodeRpc::StageUnstageVolume)),
            ),
            (Method::NodePublishVolume, None),
            (Method::NodeUnpublishVolume, None),
            (
                Method::NodeGetVolumeStats,
                Some(R::Node(NodeRpc::GetVolumeStats)),
            ),
            (
                Method::NodeExpandVolume,
                Some(R::Node(NodeRpc::ExpandVolume)),
            ),
            (Method::NodeGetCapabilities, None),
            (Method::NodeGetInfo, None),
        ];
        assert_eq!(expect.len(), Method::ALL.len());
        for (m, r) in expect {
            assert_eq!(m.requirement(), r, "{m}");
        }
    }

    fn keys(req: &impl RpcRequest) -> Vec<String> {
        req.lock_keys().iter().map(ToString::to_string).collect()
    }

    #[test]
    fn lock_keys_cover_names_ids_sources_and_paths() {
        use crate::v1::volume_content_source::{SnapshotSource, Type, VolumeSource};
        let clone = CreateVolumeRequest {
            name: "pvc".into(),
            volume_content_source: Some(VolumeContentSource {
                r#type: Some(Type::Volume(VolumeSource {
                    volume_id: "src".into(),
                })),
            }),
            ..Default::default()
        };
        assert_eq!(keys(&clone), ["volume name \"pvc\"", "volume \"src\""]);
        let restore = CreateVolumeRequest {
            name: "pvc".into(),
            volume_content_source: Some(VolumeContentSource {
                r#type: Some(Type::Snapshot(SnapshotSource {
                    snapshot_id: "snap".into(),
                })),
            }),
            ..Default::default()
        };
        assert_eq!(keys(&restore), ["volume name \"pvc\"", "snapshot \"snap\""]);
        let group = CreateVolumeGroupSnapshotRequest {
            name: "g".into(),
            source_volume_ids: vec!["a".into(), "b".into()],
            ..Default::default()
        };
        assert_eq!(
            keys(&group),
            ["group snapshot name \"g\"", "volume \"a\"", "volume \"b\""]
        );
        let publish = NodePublishVolumeRequest {
            volume_id: "v".into(),
            target_path: "/t".into(),
            ..Default::default()
        };
        assert_eq!(keys(&publish), ["path \"/t\"", "volume \"v\""]);
        // Reads lock nothing; empty values are skipped.
        let stats = NodeGetVolumeStatsRequest {
            volume_id: "v".into(),
            ..Default::default()
        };
        assert!(keys(&stats).is_empty());
        assert!(keys(&DeleteVolumeRequest::default()).is_empty());
        assert_eq!(stats.volume_id(), Some("v"));
        assert_eq!(
            Method::CreateVolume.info().secret_fields,
            ["secrets"].as_slice()
        );
        assert!(DeleteVolumeRequest::default().secrets().is_some());
        assert!(ProbeRequest::default().secrets().is_none());
    }
}
