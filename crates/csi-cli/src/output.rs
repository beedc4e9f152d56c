//! Rendering of CSI responses: an indented human-readable form, or the
//! protobuf canonical JSON mapping (field names as in csi.proto) for scripts.

use std::fmt::Write as _;
use std::sync::OnceLock;

use prost_reflect::{DescriptorPool, DynamicMessage, Kind, MapKey, SerializeOptions, Value};

/// How responses are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Indented `field: value` lines.
    Human,
    /// One JSON document per response.
    Json,
}

fn pool() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| {
        DescriptorPool::decode(csi_proto::FILE_DESCRIPTOR_SET).expect("embedded descriptor set")
    })
}

/// Converts a generated message into its reflective form by name.
pub fn dynamic<M: prost::Message>(msg: &M, full_name: &str) -> DynamicMessage {
    let desc = pool()
        .get_message_by_name(full_name)
        .unwrap_or_else(|| panic!("{full_name} is not in csi.proto"));
    DynamicMessage::decode(desc, msg.encode_to_vec().as_slice())
        .expect("a message re-decodes with its own descriptor")
}

/// Renders a message as JSON (canonical proto3 mapping with proto field names).
pub fn to_json(msg: &DynamicMessage) -> serde_json::Value {
    let options = SerializeOptions::new()
        .use_proto_field_name(true)
        .stringify_64_bit_integers(false);
    msg.serialize_with_options(serde_json::value::Serializer, &options)
        .expect("a CSI message serializes to JSON")
}

/// Renders a message in the chosen format.
pub fn render(msg: &DynamicMessage, format: Format) -> String {
    match format {
        Format::Json => serde_json::to_string_pretty(&to_json(msg)).expect("JSON value prints"),
        Format::Human => {
            let mut out = String::new();
            human(msg, 0, &mut out);
            if out.is_empty() {
                out.push_str("ok\n");
            }
            out
        }
    }
}

fn human(msg: &DynamicMessage, depth: usize, out: &mut String) {
    let pad = "  ".repeat(depth);
    for (field, value) in msg.fields() {
        let name = field.name();
        match value {
            Value::Message(m) => {
                let _ = writeln!(out, "{pad}{name}:");
                human(m, depth + 1, out);
            }
            Value::List(items) => {
                let _ = writeln!(out, "{pad}{name}:");
                for item in items {
                    match item {
                        Value::Message(m) => {
                            let _ = writeln!(out, "{pad}  -");
                            human(m, depth + 2, out);
                        }
                        other => {
                            let _ =
                                writeln!(out, "{pad}  - {}", scalar(&field.kind(), name, other));
                        }
                    }
                }
            }
            Value::Map(map) => {
                let _ = writeln!(out, "{pad}{name}:");
                let mut entries: Vec<_> = map.iter().collect();
                entries.sort_by_key(|(k, _)| map_key(k));
                for (k, v) in entries {
                    let _ = writeln!(
                        out,
                        "{pad}  {}: {}",
                        map_key(k),
                        scalar(&Kind::String, "", v)
                    );
                }
            }
            other => {
                let _ = writeln!(out, "{pad}{name}: {}", scalar(&field.kind(), name, other));
            }
        }
    }
}

fn map_key(k: &MapKey) -> String {
    match k {
        MapKey::String(s) => s.clone(),
        other => format!("{other:?}"),
    }
}

fn scalar(kind: &Kind, name: &str, value: &Value) -> String {
    let sized = |n: i64| {
        if name.ends_with("bytes") || name.ends_with("capacity") || name.ends_with("size") {
            format!("{n} ({})", csi_proto::size::format_bytes(n))
        } else {
            n.to_string()
        }
    };
    match value {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::I64(n) => sized(*n),
        Value::I32(n) => n.to_string(),
        Value::U32(n) => n.to_string(),
        Value::U64(n) => n.to_string(),
        Value::F32(n) => n.to_string(),
        Value::F64(n) => n.to_string(),
        Value::Bytes(b) => format!("<{} bytes>", b.len()),
        Value::EnumNumber(n) => match kind.as_enum().and_then(|e| e.get_value(*n)) {
            Some(v) => v.name().to_owned(),
            None => n.to_string(),
        },
        Value::Message(m) => format!("{m:?}"),
        Value::List(_) | Value::Map(_) => String::from("…"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_proto::v1::{CreateVolumeResponse, Volume};

    #[test]
    fn human_and_json_show_fields_by_proto_name() {
        let resp = CreateVolumeResponse {
            volume: Some(Volume {
                volume_id: "vol-1".into(),
                capacity_bytes: 1 << 30,
                volume_context: [("k".to_string(), "v".to_string())].into(),
                ..Default::default()
            }),
        };
        let msg = dynamic(&resp, "csi.v1.CreateVolumeResponse");
        let text = render(&msg, Format::Human);
        assert!(text.contains("volume_id: vol-1"), "{text}");
        assert!(
            text.contains("capacity_bytes: 1073741824 (1 GiB)"),
            "{text}"
        );
        assert!(text.contains("    k: v"), "{text}");
        let json = to_json(&msg);
        assert_eq!(json["volume"]["volume_id"], "vol-1");
        assert_eq!(json["volume"]["capacity_bytes"], 1073741824);
        let empty = dynamic(
            &csi_proto::v1::DeleteVolumeResponse {},
            "csi.v1.DeleteVolumeResponse",
        );
        assert_eq!(render(&empty, Format::Human), "ok\n");
        assert_eq!(render(&empty, Format::Json), "{}");
    }
}
