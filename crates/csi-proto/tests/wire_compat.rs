//! Decodes bytes written by hand from the CSI v1.12.0 field numbers, so a
//! renumbered or retyped field fails here rather than in a user's cluster.

use csi_proto::v1::*;
use prost::Message;

/// Minimal protobuf writer: enough to lay out fields by number.
#[derive(Default)]
struct Wire(Vec<u8>);

impl Wire {
    fn varint_raw(&mut self, mut v: u64) {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                self.0.push(byte);
                return;
            }
            self.0.push(byte | 0x80);
        }
    }
    fn varint(mut self, field: u32, v: u64) -> Self {
        self.varint_raw(u64::from(field) << 3);
        self.varint_raw(v);
        self
    }
    fn bytes(mut self, field: u32, b: &[u8]) -> Self {
        self.varint_raw((u64::from(field) << 3) | 2);
        self.varint_raw(b.len() as u64);
        self.0.extend_from_slice(b);
        self
    }
    fn str(self, field: u32, s: &str) -> Self {
        self.bytes(field, s.as_bytes())
    }
    fn msg(self, field: u32, m: Wire) -> Self {
        self.bytes(field, &m.0)
    }
    fn entry(self, field: u32, k: &str, v: &str) -> Self {
        self.msg(field, Wire::default().str(1, k).str(2, v))
    }
}

fn w() -> Wire {
    Wire::default()
}

#[test]
fn create_volume_request_fields() {
    let cap = w()
        .msg(2, w().str(1, "xfs").str(2, "noatime").str(3, "1000"))
        .msg(3, w().varint(1, 5));
    let topo = w()
        .msg(1, w().entry(1, "zone", "a"))
        .msg(2, w().entry(1, "zone", "b"));
    let bytes = w()
        .str(1, "pvc-1")
        .msg(2, w().varint(1, 100).varint(2, 200))
        .msg(3, cap)
        .entry(4, "p", "1")
        .entry(5, "s", "2")
        .msg(6, w().msg(2, w().str(1, "src-vol")))
        .msg(7, topo)
        .entry(8, "iops", "3");
    let req = CreateVolumeRequest::decode(bytes.0.as_slice()).unwrap();
    assert_eq!(req.name, "pvc-1");
    assert_eq!(req.capacity_range, Some(CapacityRange::between(100, 200)));
    let cap = &req.volume_capabilities[0];
    let mount = cap.mount_volume().unwrap();
    assert_eq!(
        (mount.fs_type.as_str(), mount.volume_mount_group.as_str()),
        ("xfs", "1000")
    );
    assert_eq!(mount.mount_flags, ["noatime"]);
    assert_eq!(
        cap.access_mode(),
        volume_capability::access_mode::Mode::MultiNodeMultiWriter
    );
    assert_eq!(req.parameters["p"], "1");
    assert_eq!(req.secrets["s"], "2");
    assert_eq!(req.mutable_parameters["iops"], "3");
    match req.volume_content_source.and_then(|s| s.r#type) {
        Some(volume_content_source::Type::Volume(v)) => assert_eq!(v.volume_id, "src-vol"),
        other => panic!("content source: {other:?}"),
    }
    let topo = req.accessibility_requirements.unwrap();
    assert_eq!(topo.requisite[0].segments["zone"], "a");
    assert_eq!(topo.preferred[0].segments["zone"], "b");
}

#[test]
fn volume_and_snapshot_fields() {
    let vol = w()
        .varint(1, 1 << 30)
        .str(2, "vol-9")
        .entry(3, "k", "v")
        .msg(4, w().msg(1, w().str(1, "snap-1")))
        .msg(5, w().entry(1, "rack", "r1"));
    let resp = CreateVolumeResponse::decode(w().msg(1, vol).0.as_slice()).unwrap();
    let vol = resp.volume.unwrap();
    assert_eq!(
        (vol.capacity_bytes, vol.volume_id.as_str()),
        (1 << 30, "vol-9")
    );
    assert_eq!(vol.volume_context["k"], "v");
    assert!(matches!(
        vol.content_source.and_then(|s| s.r#type),
        Some(volume_content_source::Type::Snapshot(s)) if s.snapshot_id == "snap-1"
    ));
    assert_eq!(vol.accessible_topology[0].segments["rack"], "r1");

    let snap = w()
        .varint(1, 77)
        .str(2, "snap-2")
        .str(3, "vol-9")
        .msg(4, w().varint(1, 1_700_000_000))
        .varint(5, 1)
        .str(6, "group-1");
    let snap = Snapshot::decode(snap.0.as_slice()).unwrap();
    assert_eq!(snap.size_bytes, 77);
    assert_eq!(
        (snap.snapshot_id.as_str(), snap.source_volume_id.as_str()),
        ("snap-2", "vol-9")
    );
    assert_eq!(snap.creation_time.unwrap().seconds, 1_700_000_000);
    assert!(snap.ready_to_use);
    assert_eq!(snap.group_snapshot_id, "group-1");
}

#[test]
fn node_request_fields() {
    let bytes = w()
        .str(1, "vol-1")
        .entry(2, "pc", "1")
        .str(3, "/staging")
        .str(4, "/target")
        .msg(5, w().msg(1, w()).msg(3, w().varint(1, 7)))
        .varint(6, 1)
        .entry(7, "s", "x")
        .entry(8, "vc", "2");
    let req = NodePublishVolumeRequest::decode(bytes.0.as_slice()).unwrap();
    assert_eq!(req.volume_id, "vol-1");
    assert_eq!(req.publish_context["pc"], "1");
    assert_eq!(
        (req.staging_target_path.as_str(), req.target_path.as_str()),
        ("/staging", "/target")
    );
    let cap = req.volume_capability.unwrap();
    assert!(cap.is_block());
    assert_eq!(
        cap.access_mode(),
        volume_capability::access_mode::Mode::SingleNodeMultiWriter
    );
    assert!(req.readonly);
    assert_eq!(
        (req.secrets["s"].as_str(), req.volume_context["vc"].as_str()),
        ("x", "2")
    );

    let stage = w()
        .str(1, "v")
        .entry(2, "a", "b")
        .str(3, "/st")
        .msg(4, w())
        .entry(5, "s", "t")
        .entry(6, "c", "d");
    let stage = NodeStageVolumeRequest::decode(stage.0.as_slice()).unwrap();
    assert_eq!(stage.staging_target_path, "/st");
    assert_eq!(
        (
            stage.secrets["s"].as_str(),
            stage.volume_context["c"].as_str()
        ),
        ("t", "d")
    );

    let info = w()
        .str(1, "node-a")
        .varint(2, 16)
        .msg(3, w().entry(1, "zone", "z"));
    let info = NodeGetInfoResponse::decode(info.0.as_slice()).unwrap();
    assert_eq!(
        (info.node_id.as_str(), info.max_volumes_per_node),
        ("node-a", 16)
    );
    assert_eq!(info.accessible_topology.unwrap().segments["zone"], "z");

    let usage = w().msg(1, w().varint(1, 1).varint(2, 2).varint(3, 3).varint(4, 2));
    let stats = NodeGetVolumeStatsResponse::decode(usage.0.as_slice()).unwrap();
    let u = &stats.usage[0];
    assert_eq!((u.available, u.total, u.used), (1, 2, 3));
    assert_eq!(u.unit(), volume_usage::Unit::Inodes);
}

#[test]
fn controller_and_paging_fields() {
    let req = ListVolumesRequest::decode(w().varint(1, 10).str(2, "tok").0.as_slice()).unwrap();
    assert_eq!((req.max_entries, req.starting_token.as_str()), (10, "tok"));
    let entry = w().msg(1, w().str(2, "v1")).msg(
        2,
        w().str(1, "node-1").msg(2, w().varint(1, 1).str(2, "bad")),
    );
    let resp = ListVolumesResponse::decode(w().msg(1, entry).str(2, "next").0.as_slice()).unwrap();
    assert_eq!(resp.next_token, "next");
    let status = resp.entries[0].status.clone().unwrap();
    assert_eq!(status.published_node_ids, ["node-1"]);
    let cond = status.volume_condition.unwrap();
    assert!(cond.abnormal && cond.message == "bad");

    let publish = w()
        .str(1, "v")
        .str(2, "n")
        .msg(3, w())
        .varint(4, 1)
        .entry(5, "s", "1")
        .entry(6, "c", "2");
    let publish = ControllerPublishVolumeRequest::decode(publish.0.as_slice()).unwrap();
    assert_eq!(
        (publish.volume_id.as_str(), publish.node_id.as_str()),
        ("v", "n")
    );
    assert!(publish.readonly && publish.volume_capability.is_some());

    let cap = GetCapacityResponse::decode(
        w().varint(1, 5)
            .msg(2, w().varint(1, 6))
            .msg(3, w().varint(1, 4))
            .0
            .as_slice(),
    )
    .unwrap();
    assert_eq!(
        (
            cap.available_capacity,
            cap.maximum_volume_size,
            cap.minimum_volume_size
        ),
        (5, Some(6), Some(4))
    );

    let exp =
        ControllerExpandVolumeResponse::decode(w().varint(1, 9).varint(2, 1).0.as_slice()).unwrap();
    assert!(exp.capacity_bytes == 9 && exp.node_expansion_required);

    let probe = ProbeResponse::decode(w().msg(1, w().varint(1, 1)).0.as_slice()).unwrap();
    assert_eq!(probe.ready, Some(true));
    let probe = ProbeResponse::decode(&[][..]).unwrap();
    assert_eq!(
        probe.ready, None,
        "an absent ready field must stay distinguishable"
    );

    let snap = CreateSnapshotRequest::decode(
        w().str(1, "src")
            .str(2, "name")
            .entry(3, "s", "x")
            .entry(4, "p", "y")
            .0
            .as_slice(),
    )
    .unwrap();
    assert_eq!(
        (snap.source_volume_id.as_str(), snap.name.as_str()),
        ("src", "name")
    );
    assert_eq!(
        (snap.secrets["s"].as_str(), snap.parameters["p"].as_str()),
        ("x", "y")
    );
}

#[test]
fn capability_enum_numbers() {
    use controller_service_capability::rpc::Type as C;
    use node_service_capability::rpc::Type as N;
    use plugin_capability::service::Type as P;
    assert_eq!(
        [
            C::CreateDeleteVolume,
            C::PublishUnpublishVolume,
            C::ListVolumes,
            C::GetCapacity,
            C::CreateDeleteSnapshot,
            C::ListSnapshots,
            C::CloneVolume,
            C::PublishReadonly,
            C::ExpandVolume,
            C::ListVolumesPublishedNodes,
            C::VolumeCondition,
            C::GetVolume,
            C::SingleNodeMultiWriter,
            C::ModifyVolume,
            C::GetSnapshot
        ]
        .map(|c| c as i32),
        [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    );
    assert_eq!(
        [
            N::StageUnstageVolume,
            N::GetVolumeStats,
            N::ExpandVolume,
            N::VolumeCondition,
            N::SingleNodeMultiWriter,
            N::VolumeMountGroup
        ]
        .map(|c| c as i32),
        [1, 2, 3, 4, 5, 6]
    );
    assert_eq!(
        [
            P::ControllerService,
            P::VolumeAccessibilityConstraints,
            P::GroupControllerService,
            P::SnapshotMetadataService
        ]
        .map(|c| c as i32),
        [1, 2, 3, 4]
    );
    assert_eq!(BlockMetadataType::VariableLength as i32, 2);
    let bm = BlockMetadata::decode(w().varint(1, 4096).varint(2, 512).0.as_slice()).unwrap();
    assert_eq!((bm.byte_offset, bm.size_bytes), (4096, 512));
    let delta = GetMetadataDeltaRequest::decode(
        w().str(1, "a")
            .str(2, "b")
            .varint(3, 8)
            .varint(4, 3)
            .entry(5, "s", "1")
            .0
            .as_slice(),
    )
    .unwrap();
    assert_eq!(
        (
            delta.base_snapshot_id.as_str(),
            delta.target_snapshot_id.as_str()
        ),
        ("a", "b")
    );
    assert_eq!((delta.starting_offset, delta.max_results), (8, 3));
}
