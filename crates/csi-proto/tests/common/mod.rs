//! Test support: fills any CSI message with distinct non-default values via
//! the descriptor, so tests cover every field without hand-kept lists.

use prost_reflect::{
    DescriptorPool, DynamicMessage, FieldDescriptor, Kind, MapKey, MessageDescriptor, Value,
};
use std::collections::HashMap;

/// Value put into every secret field; must never show in Debug output.
pub const SECRET_MARKER: &str = "SECRET-MARKER-6f1d";

pub fn pool() -> DescriptorPool {
    DescriptorPool::decode(csi_proto::FILE_DESCRIPTOR_SET).expect("descriptor set decodes")
}

fn is_hidden(field: &FieldDescriptor) -> bool {
    let msg = field.parent_message().full_name();
    csi_proto::redact::SECRET_FIELDS
        .iter()
        .chain(csi_proto::redact::SENSITIVE_FIELDS)
        .any(|(m, f)| *m == msg && *f == field.name())
}

fn scalar(kind: &Kind, field: &FieldDescriptor, depth: usize) -> Value {
    let hidden = is_hidden(field);
    match kind {
        Kind::String if hidden => Value::String(SECRET_MARKER.to_owned()),
        Kind::String => Value::String(format!("visible-{}", field.name())),
        Kind::Bytes => Value::Bytes(b"bytes".to_vec().into()),
        Kind::Bool => Value::Bool(true),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => Value::I32(7),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => Value::I64(4242),
        Kind::Uint32 | Kind::Fixed32 => Value::U32(9),
        Kind::Uint64 | Kind::Fixed64 => Value::U64(99),
        Kind::Float => Value::F32(1.5),
        Kind::Double => Value::F64(2.5),
        Kind::Enum(e) => {
            let v = e
                .values()
                .map(|v| v.number())
                .find(|n| *n != 0)
                .unwrap_or(0);
            Value::EnumNumber(v)
        }
        Kind::Message(m) => Value::Message(fill(m, depth + 1)),
    }
}

/// A message with every field set (the first member of each oneof).
pub fn fill(desc: &MessageDescriptor, depth: usize) -> DynamicMessage {
    let mut msg = DynamicMessage::new(desc.clone());
    if depth > 6 {
        return msg;
    }
    let mut oneofs_done = Vec::new();
    for field in desc.fields() {
        if let Some(o) = field.containing_oneof() {
            if oneofs_done.contains(&o.name().to_owned()) {
                continue;
            }
            oneofs_done.push(o.name().to_owned());
        }
        let value = if field.is_map() {
            let Kind::Message(entry) = field.kind() else {
                unreachable!("map entry")
            };
            let value_field = entry.map_entry_value_field();
            let mut map = HashMap::new();
            let key = if is_hidden(&field) {
                "secret-key"
            } else {
                "visible-key"
            };
            map.insert(
                MapKey::String(key.to_owned()),
                if is_hidden(&field) {
                    Value::String(SECRET_MARKER.to_owned())
                } else {
                    scalar(&value_field.kind(), &value_field, depth)
                },
            );
            Value::Map(map)
        } else if field.is_list() {
            Value::List(vec![scalar(&field.kind(), &field, depth); 2])
        } else {
            scalar(&field.kind(), &field, depth)
        };
        msg.set_field(&field, value);
    }
    msg
}

/// Every concrete type that is an RPC input or output, with functions to
/// decode into it and re-encode, and to Debug-format it.
#[macro_export]
macro_rules! csi_types {
    ($($t:ident),* $(,)?) => {
        pub fn rust_types() -> Vec<(&'static str, fn(&[u8]) -> Vec<u8>, fn(&[u8]) -> String)> {
            use prost::Message as _;
            vec![$(
                (
                    concat!("csi.v1.", stringify!($t)),
                    |b: &[u8]| csi_proto::v1::$t::decode(b).expect(stringify!($t)).encode_to_vec(),
                    |b: &[u8]| format!("{:?}", csi_proto::v1::$t::decode(b).expect(stringify!($t))),
                ),
            )*]
        }
    };
}

csi_types!(
    GetPluginInfoRequest,
    GetPluginInfoResponse,
    GetPluginCapabilitiesRequest,
    GetPluginCapabilitiesResponse,
    ProbeRequest,
    ProbeResponse,
    CreateVolumeRequest,
    CreateVolumeResponse,
    DeleteVolumeRequest,
    DeleteVolumeResponse,
    ControllerPublishVolumeRequest,
    ControllerPublishVolumeResponse,
    ControllerUnpublishVolumeRequest,
    ControllerUnpublishVolumeResponse,
    ValidateVolumeCapabilitiesRequest,
    ValidateVolumeCapabilitiesResponse,
    ListVolumesRequest,
    ListVolumesResponse,
    ControllerGetVolumeRequest,
    ControllerGetVolumeResponse,
    ControllerModifyVolumeRequest,
    ControllerModifyVolumeResponse,
    GetCapacityRequest,
    GetCapacityResponse,
    ControllerGetCapabilitiesRequest,
    ControllerGetCapabilitiesResponse,
    CreateSnapshotRequest,
    CreateSnapshotResponse,
    DeleteSnapshotRequest,
    DeleteSnapshotResponse,
    ListSnapshotsRequest,
    ListSnapshotsResponse,
    GetSnapshotRequest,
    GetSnapshotResponse,
    ControllerExpandVolumeRequest,
    ControllerExpandVolumeResponse,
    NodeStageVolumeRequest,
    NodeStageVolumeResponse,
    NodeUnstageVolumeRequest,
    NodeUnstageVolumeResponse,
    NodePublishVolumeRequest,
    NodePublishVolumeResponse,
    NodeUnpublishVolumeRequest,
    NodeUnpublishVolumeResponse,
    NodeGetVolumeStatsRequest,
    NodeGetVolumeStatsResponse,
    NodeExpandVolumeRequest,
    NodeExpandVolumeResponse,
    NodeGetCapabilitiesRequest,
    NodeGetCapabilitiesResponse,
    NodeGetInfoRequest,
    NodeGetInfoResponse,
    GroupControllerGetCapabilitiesRequest,
    GroupControllerGetCapabilitiesResponse,
    CreateVolumeGroupSnapshotRequest,
    CreateVolumeGroupSnapshotResponse,
    DeleteVolumeGroupSnapshotRequest,
    DeleteVolumeGroupSnapshotResponse,
    GetVolumeGroupSnapshotRequest,
    GetVolumeGroupSnapshotResponse,
    GetMetadataAllocatedRequest,
    GetMetadataAllocatedResponse,
    GetMetadataDeltaRequest,
    GetMetadataDeltaResponse,
);
