//! One table per validation rule: (case, request, expected field prefix or
//! `None` for valid).
//!
//! One file over 700 lines: it lists cases, one table per rule.

use csi_driver::{CsiError, Validate};
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::volume_capability::{AccessMode, AccessType};
use csi_proto::v1::*;
use tonic::Code;

fn cap() -> VolumeCapability {
    VolumeCapability::mount("ext4").with_access_mode(Mode::SingleNodeWriter)
}

fn create() -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: "pvc-1".into(),
        volume_capabilities: vec![cap()],
        ..Default::default()
    }
}

fn publish() -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: "v".into(),
        target_path: "/var/lib/kubelet/pods/x/mount".into(),
        volume_capability: Some(cap()),
        ..Default::default()
    }
}

/// Runs a table: `Some(field)` expects INVALID_ARGUMENT whose message
/// starts with the field path.
fn check<T: Validate + std::fmt::Debug>(cases: Vec<(&str, T, Option<&str>)>) {
    for (name, req, want) in cases {
        let got = req.validate();
        match (want, got) {
            (None, Ok(())) => {}
            (Some(field), Err(e @ CsiError::InvalidArgument { .. })) => {
                let msg = e.to_string();
                assert!(
                    msg.starts_with(field) && msg.contains(": "),
                    "{name}: {msg}"
                );
            }
            (want, got) => panic!("{name}: wanted {want:?}, got {got:?}"),
        }
    }
}

#[test]
fn required_fields() {
    check(vec![
        ("valid", create(), None),
        (
            "no name",
            CreateVolumeRequest {
                name: String::new(),
                ..create()
            },
            Some("name"),
        ),
        (
            "no capabilities",
            CreateVolumeRequest {
                volume_capabilities: vec![],
                ..create()
            },
            Some("volume_capabilities"),
        ),
    ]);
    check(vec![
        (
            "empty volume id",
            DeleteVolumeRequest::default(),
            Some("volume_id"),
        ),
        (
            "ok",
            DeleteVolumeRequest {
                volume_id: "v".into(),
                ..Default::default()
            },
            None,
        ),
    ]);
    check(vec![
        (
            "no node id",
            ControllerPublishVolumeRequest {
                volume_id: "v".into(),
                volume_capability: Some(cap()),
                ..Default::default()
            },
            Some("node_id"),
        ),
        (
            "no capability",
            ControllerPublishVolumeRequest {
                volume_id: "v".into(),
                node_id: "n".into(),
                ..Default::default()
            },
            Some("volume_capability"),
        ),
    ]);
    check(vec![(
        "unpublish from all nodes",
        ControllerUnpublishVolumeRequest {
            volume_id: "v".into(),
            ..Default::default()
        },
        None,
    )]);
    // proto3 cannot tell empty from absent: an empty map is "modify nothing".
    check(vec![(
        "no mutable parameters",
        ControllerModifyVolumeRequest {
            volume_id: "v".into(),
            ..Default::default()
        },
        None,
    )]);
    // The group id alone names a group snapshot; listed ids must be set.
    check(vec![
        (
            "get without snapshot ids",
            GetVolumeGroupSnapshotRequest {
                group_snapshot_id: "g".into(),
                ..Default::default()
            },
            None,
        ),
        (
            "get with an empty snapshot id",
            GetVolumeGroupSnapshotRequest {
                group_snapshot_id: "g".into(),
                snapshot_ids: vec!["s".into(), String::new()],
                ..Default::default()
            },
            Some("snapshot_ids[1]"),
        ),
        (
            "get without group id",
            GetVolumeGroupSnapshotRequest::default(),
            Some("group_snapshot_id"),
        ),
    ]);
    check(vec![
        (
            "delete without snapshot ids",
            DeleteVolumeGroupSnapshotRequest {
                group_snapshot_id: "g".into(),
                ..Default::default()
            },
            None,
        ),
        (
            "delete without group id",
            DeleteVolumeGroupSnapshotRequest::default(),
            Some("group_snapshot_id"),
        ),
    ]);
    check(vec![
        (
            "no capacity range",
            ControllerExpandVolumeRequest {
                volume_id: "v".into(),
                ..Default::default()
            },
            Some("capacity_range"),
        ),
        (
            "ok",
            ControllerExpandVolumeRequest {
                volume_id: "v".into(),
                capacity_range: Some(CapacityRange::at_least(1)),
                ..Default::default()
            },
            None,
        ),
    ]);
    check(vec![
        (
            "no source",
            CreateSnapshotRequest {
                name: "s".into(),
                ..Default::default()
            },
            Some("source_volume_id"),
        ),
        (
            "no name",
            CreateSnapshotRequest {
                source_volume_id: "v".into(),
                ..Default::default()
            },
            Some("name"),
        ),
    ]);
    check(vec![(
        "no snapshot id",
        GetSnapshotRequest::default(),
        Some("snapshot_id"),
    )]);
    check(vec![
        (
            "no sources",
            CreateVolumeGroupSnapshotRequest {
                name: "g".into(),
                ..Default::default()
            },
            Some("source_volume_ids"),
        ),
        (
            "empty source",
            CreateVolumeGroupSnapshotRequest {
                name: "g".into(),
                source_volume_ids: vec!["a".into(), String::new()],
                ..Default::default()
            },
            Some("source_volume_ids[1]"),
        ),
    ]);
    check(vec![(
        "no staging path",
        NodeStageVolumeRequest {
            volume_id: "v".into(),
            volume_capability: Some(cap()),
            ..Default::default()
        },
        Some("staging_target_path"),
    )]);
    check(vec![
        (
            "no target",
            NodePublishVolumeRequest {
                target_path: String::new(),
                ..publish()
            },
            Some("target_path"),
        ),
        (
            "no capability",
            NodePublishVolumeRequest {
                volume_capability: None,
                ..publish()
            },
            Some("volume_capability"),
        ),
    ]);
}

#[test]
fn nested_capability_fields() {
    let with = |c: VolumeCapability| CreateVolumeRequest {
        volume_capabilities: vec![cap(), c],
        ..create()
    };
    check(vec![
        (
            "no access type",
            with(VolumeCapability {
                access_type: None,
                ..cap()
            }),
            Some("volume_capabilities[1].access_type"),
        ),
        (
            "no access mode",
            with(VolumeCapability {
                access_mode: None,
                ..cap()
            }),
            Some("volume_capabilities[1].access_mode"),
        ),
        (
            "unknown mode",
            with(cap().with_access_mode(Mode::Unknown)),
            Some("volume_capabilities[1].access_mode"),
        ),
        (
            "out-of-enum mode",
            with(VolumeCapability {
                access_mode: Some(AccessMode { mode: 99 }),
                ..cap()
            }),
            Some("volume_capabilities[1].access_mode"),
        ),
        (
            "block",
            with(VolumeCapability::block().with_access_mode(Mode::MultiNodeMultiWriter)),
            None,
        ),
        (
            "long fs type",
            with(VolumeCapability::mount("x".repeat(129)).with_access_mode(Mode::SingleNodeWriter)),
            Some("volume_capabilities[1].mount.fs_type"),
        ),
        (
            "huge mount flags",
            with(cap().with_mount_flags(vec!["o".repeat(4097)])),
            Some("volume_capabilities[1].mount.mount_flags"),
        ),
    ]);
    let mut c = cap();
    c.access_type = Some(AccessType::Mount(Default::default()));
    check(vec![("empty mount is fine", with(c), None)]);
}

#[test]
fn string_lengths() {
    check(vec![
        (
            "128 bytes",
            DeleteVolumeRequest {
                volume_id: "v".repeat(128),
                ..Default::default()
            },
            None,
        ),
        (
            "129 bytes",
            DeleteVolumeRequest {
                volume_id: "v".repeat(129),
                ..Default::default()
            },
            Some("volume_id"),
        ),
    ]);
    check(vec![(
        "name 129",
        CreateVolumeRequest {
            name: "n".repeat(129),
            ..create()
        },
        Some("name"),
    )]);
    check(vec![(
        "token 129",
        ListVolumesRequest {
            starting_token: "t".repeat(129),
            ..Default::default()
        },
        Some("starting_token"),
    )]);
}

#[test]
fn node_id_length() {
    let req = |n: usize| ControllerPublishVolumeRequest {
        volume_id: "v".into(),
        node_id: "n".repeat(n),
        volume_capability: Some(cap()),
        ..Default::default()
    };
    check(vec![
        ("256", req(256), None),
        ("257", req(257), Some("node_id")),
    ]);
}

#[test]
fn map_sizes() {
    let big = |n: usize| [("k".to_string(), "v".repeat(n))].into();
    check(vec![
        (
            "4 KiB",
            CreateVolumeRequest {
                parameters: big(4095),
                ..create()
            },
            None,
        ),
        (
            "over 4 KiB",
            CreateVolumeRequest {
                parameters: big(4096),
                ..create()
            },
            Some("parameters"),
        ),
        (
            "mutable",
            CreateVolumeRequest {
                mutable_parameters: big(4096),
                ..create()
            },
            Some("mutable_parameters"),
        ),
        (
            "secrets",
            CreateVolumeRequest {
                secrets: big(4096),
                ..create()
            },
            Some("secrets"),
        ),
    ]);
    check(vec![
        (
            "volume context",
            NodePublishVolumeRequest {
                volume_context: big(5000),
                ..publish()
            },
            Some("volume_context"),
        ),
        (
            "publish context",
            NodePublishVolumeRequest {
                publish_context: big(5000),
                ..publish()
            },
            Some("publish_context"),
        ),
    ]);
}

#[test]
fn control_characters_in_names() {
    let named = |n: &str| CreateVolumeRequest {
        name: n.into(),
        ..create()
    };
    let mut cases = vec![
        ("unicode", named("pvc-ünïcødé-✓"), None),
        ("tab allowed", named("a\tb"), None),
        ("newline allowed", named("a\nb"), None),
        ("carriage return allowed", named("a\rb"), None),
    ];
    for c in [
        '\u{0}', '\u{8}', '\u{b}', '\u{c}', '\u{e}', '\u{1f}', '\u{7f}', '\u{85}', '\u{9f}',
    ] {
        cases.push(("control", named(&format!("a{c}b")), Some("name")));
    }
    check(cases);
    check(vec![(
        "snapshot",
        CreateSnapshotRequest {
            name: "a\u{1}".into(),
            source_volume_id: "v".into(),
            ..Default::default()
        },
        Some("name"),
    )]);
}

#[test]
fn secret_keys() {
    let with = |k: &str| DeleteVolumeRequest {
        volume_id: "v".into(),
        secrets: [(k.to_string(), "hunter2".to_string())].into(),
    };
    check(vec![
        ("alnum-_.", with("user.name-1_x"), None),
        ("space", with("user name"), Some("secrets[\"user name\"]")),
        ("slash", with("a/b"), Some("secrets[\"a/b\"]")),
        ("empty", with(""), Some("secrets[\"\"]")),
    ]);
    let err = with("bad key").validate().unwrap_err().to_string();
    assert!(!err.contains("hunter2"), "a secret value leaked: {err}");
}

#[test]
fn paths_are_absolute() {
    check(vec![
        (
            "relative target",
            NodePublishVolumeRequest {
                target_path: "mnt/x".into(),
                ..publish()
            },
            Some("target_path"),
        ),
        (
            "relative staging",
            NodePublishVolumeRequest {
                staging_target_path: "stage".into(),
                ..publish()
            },
            Some("staging_target_path"),
        ),
        (
            "nul",
            NodePublishVolumeRequest {
                target_path: "/a\0b".into(),
                ..publish()
            },
            Some("target_path"),
        ),
        (
            "long path ok",
            NodePublishVolumeRequest {
                target_path: format!("/{}", "p".repeat(300)),
                ..publish()
            },
            None,
        ),
    ]);
    check(vec![
        (
            "stats missing",
            NodeGetVolumeStatsRequest {
                volume_id: "v".into(),
                ..Default::default()
            },
            Some("volume_path"),
        ),
        (
            "stats relative without volume id",
            NodeGetVolumeStatsRequest {
                volume_path: "some/path".into(),
                ..Default::default()
            },
            Some("volume_id"),
        ),
        (
            "stats relative with a relative staging path",
            NodeGetVolumeStatsRequest {
                volume_id: "v".into(),
                volume_path: "some/path".into(),
                staging_target_path: "stage".into(),
            },
            Some("staging_target_path"),
        ),
    ]);
    check(vec![
        (
            "expand missing",
            NodeExpandVolumeRequest {
                volume_id: "v".into(),
                ..Default::default()
            },
            Some("volume_path"),
        ),
        (
            "expand relative with a bad capacity",
            NodeExpandVolumeRequest {
                volume_id: "v".into(),
                volume_path: "some/path".into(),
                capacity_range: Some(CapacityRange::at_least(-1)),
                ..Default::default()
            },
            Some("capacity_range.required_bytes"),
        ),
    ]);
    check(vec![(
        "unpublish relative",
        NodeUnpublishVolumeRequest {
            volume_id: "v".into(),
            target_path: "x".into(),
        },
        Some("target_path"),
    )]);
}

/// A relative volume_path names no volume: NOT_FOUND, as csi-sanity expects,
/// once every field rule has passed.
#[test]
fn relative_volume_paths_are_not_found() {
    let stats = NodeGetVolumeStatsRequest {
        volume_id: "v".into(),
        volume_path: "some/path".into(),
        ..Default::default()
    };
    let expand = NodeExpandVolumeRequest {
        volume_id: "v".into(),
        volume_path: "some/path".into(),
        ..Default::default()
    };
    for err in [
        stats.validate().unwrap_err(),
        expand.validate().unwrap_err(),
    ] {
        assert_eq!(err.code(), Code::NotFound, "{err}");
        assert!(err.to_string().starts_with("volume_path "), "{err}");
    }
    let absolute = NodeGetVolumeStatsRequest {
        volume_path: "/var/lib/kubelet/pods/p/volumes/v".into(),
        ..stats
    };
    assert!(absolute.validate().is_ok());
    let nul = NodeExpandVolumeRequest {
        volume_path: "a\0b".into(),
        ..expand
    };
    assert_eq!(nul.validate().unwrap_err().code(), Code::InvalidArgument);
}

#[test]
fn topology_keys_and_requirements() {
    let topo = |k: &str, v: &str| Topology {
        segments: [(k.to_string(), v.to_string())].into(),
    };
    let req = |requisite: Vec<Topology>, preferred: Vec<Topology>| CreateVolumeRequest {
        accessibility_requirements: Some(TopologyRequirement {
            requisite,
            preferred,
        }),
        ..create()
    };
    check(vec![
        (
            "prefixed",
            req(vec![topo("topology.example.com/zone", "a")], vec![]),
            None,
        ),
        ("plain", req(vec![topo("zone_1.x", "a")], vec![]), None),
        (
            "uppercase prefix",
            req(vec![topo("Example.com/zone", "a")], vec![]),
            Some("accessibility_requirements.requisite[0].segments"),
        ),
        (
            "bad name end",
            req(vec![topo("zone-", "a")], vec![]),
            Some("accessibility_requirements.requisite[0].segments"),
        ),
        (
            "long name",
            req(vec![topo(&"z".repeat(64), "a")], vec![]),
            Some("accessibility_requirements.requisite[0].segments"),
        ),
        (
            "long value",
            req(vec![topo("zone", &"a".repeat(64))], vec![]),
            Some("accessibility_requirements.requisite[0].segments"),
        ),
        (
            "preferred outside requisite",
            req(vec![topo("zone", "a")], vec![topo("zone", "b")]),
            Some("accessibility_requirements.preferred[0]"),
        ),
        ("preferred only", req(vec![], vec![topo("zone", "b")]), None),
    ]);
    let dup = Topology {
        segments: [
            ("Zone".to_string(), "a".to_string()),
            ("zone".to_string(), "b".to_string()),
        ]
        .into(),
    };
    check(vec![(
        "case-insensitive duplicate",
        GetCapacityRequest {
            accessible_topology: Some(dup),
            ..Default::default()
        },
        Some("accessible_topology.segments"),
    )]);
}

#[test]
fn numbers_and_ranges() {
    check(vec![
        (
            "negative max",
            ListVolumesRequest {
                max_entries: -1,
                ..Default::default()
            },
            Some("max_entries"),
        ),
        ("zero max", ListVolumesRequest::default(), None),
    ]);
    check(vec![(
        "negative max",
        ListSnapshotsRequest {
            max_entries: -5,
            ..Default::default()
        },
        Some("max_entries"),
    )]);
    check(vec![
        (
            "negative required",
            CreateVolumeRequest {
                capacity_range: Some(CapacityRange::at_least(-1)),
                ..create()
            },
            Some("capacity_range.required_bytes"),
        ),
        (
            "limit below required",
            CreateVolumeRequest {
                capacity_range: Some(CapacityRange::between(10, 5)),
                ..create()
            },
            Some("capacity_range.limit_bytes"),
        ),
    ]);
    let err = GetMetadataAllocatedRequest {
        snapshot_id: "s".into(),
        starting_offset: -1,
        ..Default::default()
    }
    .validate()
    .unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange);
}

#[test]
fn content_sources() {
    use csi_proto::v1::volume_content_source::{SnapshotSource, Type, VolumeSource};
    let src = |t: Option<Type>| CreateVolumeRequest {
        volume_content_source: Some(VolumeContentSource { r#type: t }),
        ..create()
    };
    check(vec![
        ("no type", src(None), Some("volume_content_source.type")),
        (
            "empty snapshot id",
            src(Some(Type::Snapshot(SnapshotSource::default()))),
            Some("volume_content_source.snapshot.snapshot_id"),
        ),
        (
            "empty volume id",
            src(Some(Type::Volume(VolumeSource::default()))),
            Some("volume_content_source.volume.volume_id"),
        ),
        (
            "ok",
            src(Some(Type::Volume(VolumeSource {
                volume_id: "v".into(),
            }))),
            None,
        ),
    ]);
}
