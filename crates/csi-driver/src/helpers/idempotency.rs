//! Repeated CreateVolume/CreateSnapshot calls: does an existing volume or
//! snapshot with the same name answer the new request (OK with the
//! existing one), or is it incompatible (ALREADY_EXISTS), or is the new
//! capacity range impossible (OUT_OF_RANGE)?

use std::collections::HashMap;

use csi_proto::v1::{CreateSnapshotRequest, CreateVolumeRequest, Snapshot, Volume};

use crate::error::CsiError;
use crate::helpers::topology::topology_matches;

/// The outcome when the existing resource is compatible: return it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Same;

fn differing_key<'a>(
    a: &'a HashMap<String, String>,
    b: &'a HashMap<String, String>,
) -> Option<&'a str> {
    a.iter()
        .find(|(k, v)| b.get(*k) != Some(*v))
        .or_else(|| b.iter().find(|(k, _)| !a.contains_key(*k)))
        .map(|(k, _)| k.as_str())
}

/// Compares `new` with an existing volume of the same name, created by
/// `original` (the driver keeps the fields it needs) as `volume`.
///
/// - a capacity range that cannot be satisfied at all → OUT_OF_RANGE;
/// - capacity outside the new range, a capability not in the original,
///   different parameters, mutable parameters or content source, or an
///   accessible topology outside the new requisite → ALREADY_EXISTS;
/// - otherwise [`Same`]. Messages name the field or key, never a value.
pub fn compare_volume(
    original: &CreateVolumeRequest,
    volume: &Volume,
    new: &CreateVolumeRequest,
) -> Result<Same, CsiError> {
    let exists = |what: String| {
        Err(CsiError::AlreadyExists(format!(
            "volume {:?} already exists with a different {what}",
            new.name
        )))
    };
    if let Some(r) = &new.capacity_range {
        if r.limit_bytes > 0 && r.limit_bytes < r.required_bytes {
            return Err(CsiError::OutOfRange(
                "capacity_range: limit_bytes is smaller than required_bytes".into(),
            ));
        }
        let cap = volume.capacity_bytes;
        if cap < r.required_bytes || (r.limit_bytes > 0 && cap > r.limit_bytes) {
            return exists("capacity".into());
        }
    }
    if let Some(i) = new
        .volume_capabilities
        .iter()
        .position(|c| !original.volume_capabilities.contains(c))
    {
        return exists(format!("volume_capabilities[{i}]"));
    }
    if let Some(k) = differing_key(&original.parameters, &new.parameters) {
        return exists(format!("parameter {k:?}"));
    }
    if let Some(k) = differing_key(&original.mutable_parameters, &new.mutable_parameters) {
        return exists(format!("mutable parameter {k:?}"));
    }
    if original.volume_content_source != new.volume_content_source {
        return exists("volume_content_source".into());
    }
    if let Some(req) = &new.accessibility_requirements {
        let fits = req.requisite.is_empty()
            || volume.accessible_topology.is_empty()
            || volume
                .accessible_topology
                .iter()
                .all(|t| req.requisite.iter().any(|r| topology_matches(t, r)));
        if !fits {
            return exists("accessible topology".into());
        }
    }
    Ok(Same)
}

/// Compares `new` with an existing snapshot of the same name that was cut
/// with `parameters`: a different source volume or different parameters →
/// ALREADY_EXISTS.
pub fn compare_snapshot(
    existing: &Snapshot,
    parameters: &HashMap<String, String>,
    new: &CreateSnapshotRequest,
) -> Result<Same, CsiError> {
    if existing.source_volume_id != new.source_volume_id {
        return Err(CsiError::AlreadyExists(format!(
            "snapshot {:?} already exists for another source volume",
            new.name
        )));
    }
    if let Some(k) = differing_key(parameters, &new.parameters) {
        return Err(CsiError::AlreadyExists(format!(
            "snapshot {:?} already exists with a different parameter {k:?}",
            new.name
        )));
    }
    Ok(Same)
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_proto::size::GIB;
    use csi_proto::v1::volume_capability::access_mode::Mode;
    use csi_proto::v1::volume_content_source::{SnapshotSource, Type};
    use csi_proto::v1::*;
    use tonic::Code;

    fn zone(z: &str) -> Topology {
        Topology {
            segments: [("zone".to_string(), z.to_string())].into(),
        }
    }

    fn original() -> CreateVolumeRequest {
        CreateVolumeRequest {
            name: "pvc-1".into(),
            capacity_range: Some(CapacityRange::at_least(GIB)),
            volume_capabilities: vec![
                VolumeCapability::mount("ext4").with_access_mode(Mode::SingleNodeWriter),
                VolumeCapability::block().with_access_mode(Mode::SingleNodeWriter),
            ],
            parameters: [("type".to_string(), "ssd".to_string())].into(),
            ..Default::default()
        }
    }

    fn volume() -> Volume {
        Volume {
            volume_id: "v1".into(),
            capacity_bytes: GIB,
            accessible_topology: vec![zone("a")],
            ..Default::default()
        }
    }

    #[test]
    fn table() {
        type Edit = fn(&mut CreateVolumeRequest);
        let cases: Vec<(&str, Edit, Result<Same, Code>)> = vec![
            ("identical", |_| {}, Ok(Same)),
            (
                "subset of capabilities",
                |r| {
                    r.volume_capabilities.pop();
                },
                Ok(Same),
            ),
            (
                "range still met",
                |r| r.capacity_range = Some(CapacityRange::between(1, 2 * GIB)),
                Ok(Same),
            ),
            ("no range", |r| r.capacity_range = None, Ok(Same)),
            (
                "larger",
                |r| r.capacity_range = Some(CapacityRange::at_least(2 * GIB)),
                Err(Code::AlreadyExists),
            ),
            (
                "limit below",
                |r| r.capacity_range = Some(CapacityRange::at_most(GIB / 2)),
                Err(Code::AlreadyExists),
            ),
            (
                "impossible range",
                |r| r.capacity_range = Some(CapacityRange::between(2, 1)),
                Err(Code::OutOfRange),
            ),
            (
                "new capability",
                |r| {
                    r.volume_capabilities.push(
                        VolumeCapability::mount("xfs").with_access_mode(Mode::SingleNodeWriter),
                    )
                },
                Err(Code::AlreadyExists),
            ),
            (
                "other parameter",
                |r| {
                    r.parameters.insert("type".into(), "hdd".into());
                },
                Err(Code::AlreadyExists),
            ),
            (
                "extra parameter",
                |r| {
                    r.parameters.insert("x".into(), "y".into());
                },
                Err(Code::AlreadyExists),
            ),
            (
                "missing parameter",
                |r| r.parameters.clear(),
                Err(Code::AlreadyExists),
            ),
            (
                "mutable parameter",
                |r| {
                    r.mutable_parameters.insert("iops".into(), "1".into());
                },
                Err(Code::AlreadyExists),
            ),
            (
                "content source",
                |r| {
                    r.volume_content_source = Some(VolumeContentSource {
                        r#type: Some(Type::Snapshot(SnapshotSource {
                            snapshot_id: "s".into(),
                        })),
                    })
                },
                Err(Code::AlreadyExists),
            ),
            (
                "requisite met",
                |r| {
                    r.accessibility_requirements = Some(TopologyRequirement {
                        requisite: vec![zone("a"), zone("b")],
                        preferred: vec![],
                    })
                },
                Ok(Same),
            ),
            (
                "requisite not met",
                |r| {
                    r.accessibility_requirements = Some(TopologyRequirement {
                        requisite: vec![zone("b")],
                        preferred: vec![],
                    })
                },
                Err(Code::AlreadyExists),
            ),
        ];
        for (name, edit, want) in cases {
            let mut new = original();
            edit(&mut new);
            let got = compare_volume(&original(), &volume(), &new).map_err(|e| e.code());
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn snapshots() {
        let snap = Snapshot {
            snapshot_id: "s1".into(),
            source_volume_id: "v1".into(),
            ..Default::default()
        };
        let params: HashMap<String, String> = [("a".to_string(), "1".to_string())].into();
        let mut new = CreateSnapshotRequest {
            name: "snap".into(),
            source_volume_id: "v1".into(),
            parameters: params.clone(),
            ..Default::default()
        };
        assert_eq!(compare_snapshot(&snap, &params, &new), Ok(Same));
        new.secrets.insert("k".into(), "v".into());
        assert_eq!(
            compare_snapshot(&snap, &params, &new),
            Ok(Same),
            "secrets do not count"
        );
        new.source_volume_id = "v2".into();
        assert_eq!(
            compare_snapshot(&snap, &params, &new).unwrap_err().code(),
            Code::AlreadyExists
        );
        new.source_volume_id = "v1".into();
        new.parameters.clear();
        assert_eq!(
            compare_snapshot(&snap, &params, &new).unwrap_err().code(),
            Code::AlreadyExists
        );
    }
}
