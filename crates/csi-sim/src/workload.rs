//! Workloads: a CO's sequences of calls, and the standard ones every driver is run through.

const GIB: i64 = 1 << 30;

/// One CO call; volumes, snapshots and groups are named by the CO's names
/// and mapped to the ids the driver answered with.
#[derive(Debug, Clone)]
pub enum Call {
    /// CreateVolume `pv` of `size` bytes, empty or from a snapshot or volume.
    CreateVolume {
        /// The CO's name.
        pv: &'static str,
        /// Bytes.
        size: i64,
        /// Content source.
        from: Option<Content>,
    },
    /// DeleteVolume.
    DeleteVolume(&'static str),
    /// ControllerPublishVolume to the node.
    ControllerPublish(&'static str),
    /// ControllerUnpublishVolume from the node.
    ControllerUnpublish(&'static str),
    /// NodeStageVolume.
    Stage(&'static str),
    /// NodeUnstageVolume.
    Unstage(&'static str),
    /// NodePublishVolume for a pod.
    Publish {
        /// The volume.
        pv: &'static str,
        /// The pod.
        pod: &'static str,
        /// Read only.
        readonly: bool,
        /// The pod is deleted if the first answer is not OK: the CO then
        /// tears the publication down instead of retrying it.
        deleted_if_uncertain: bool,
    },
    /// NodeUnpublishVolume for a pod.
    Unpublish(&'static str, &'static str),
    /// ControllerExpandVolume, then NodeExpandVolume at the pod's path.
    Expand {
        /// The volume.
        pv: &'static str,
        /// The pod it is published for.
        pod: &'static str,
        /// New size.
        size: i64,
    },
    /// CreateSnapshot `snap` of a volume.
    CreateSnapshot(&'static str, &'static str),
    /// DeleteSnapshot.
    DeleteSnapshot(&'static str),
    /// CreateVolumeGroupSnapshot of volumes.
    CreateGroup(&'static str, Vec<&'static str>),
    /// DeleteVolumeGroupSnapshot.
    DeleteGroup(&'static str),
}

/// A new volume's content source.
#[derive(Debug, Clone, Copy)]
pub enum Content {
    /// A snapshot, by the CO's name.
    Snapshot(&'static str),
    /// A volume, by the CO's name.
    Volume(&'static str),
}

/// A CO's sequence of calls.
#[derive(Debug, Clone)]
pub struct SimWorkload {
    /// Its name, in reports and replays.
    pub name: &'static str,
    /// The calls, in order.
    pub calls: Vec<Call>,
}

/// The standard workloads: what csi-sim runs every driver through.
pub fn workloads() -> Vec<SimWorkload> {
    use Call::*;
    let publish = |pv, pod, readonly, deleted_if_uncertain| Publish {
        pv,
        pod,
        readonly,
        deleted_if_uncertain,
    };
    let create = |pv, from| CreateVolume {
        pv,
        size: GIB,
        from,
    };
    vec![
        SimWorkload {
            name: "lifecycle",
            calls: vec![
                create("pv-a", None),
                ControllerPublish("pv-a"),
                Stage("pv-a"),
                publish("pv-a", "pod-1", false, false),
                Unpublish("pv-a", "pod-1"),
                Unstage("pv-a"),
                ControllerUnpublish("pv-a"),
                DeleteVolume("pv-a"),
            ],
        },
        SimWorkload {
            name: "snapshot-restore-clone",
            calls: vec![
                create("pv-a", None),
                CreateSnapshot("snap-a", "pv-a"),
                create("pv-b", Some(Content::Snapshot("snap-a"))),
                create("pv-c", Some(Content::Volume("pv-b"))),
                DeleteVolume("pv-c"),
                DeleteVolume("pv-b"),
                DeleteSnapshot("snap-a"),
                DeleteVolume("pv-a"),
            ],
        },
        SimWorkload {
            name: "expand-online",
            calls: vec![
                create("pv-a", None),
                Stage("pv-a"),
                publish("pv-a", "pod-1", false, false),
                Expand {
                    pv: "pv-a",
                    pod: "pod-1",
                    size: 2 * GIB,
                },
                Unpublish("pv-a", "pod-1"),
                Unstage("pv-a"),
                DeleteVolume("pv-a"),
            ],
        },
        SimWorkload {
            name: "group-snapshot",
            calls: vec![
                create("pv-a", None),
                create("pv-b", None),
                CreateGroup("group-1", vec!["pv-a", "pv-b"]),
                DeleteGroup("group-1"),
                DeleteVolume("pv-b"),
                DeleteVolume("pv-a"),
            ],
        },
        SimWorkload {
            name: "shared-staging",
            calls: vec![
                create("pv-a", None),
                Stage("pv-a"),
                publish("pv-a", "pod-1", false, false),
                publish("pv-a", "pod-2", true, true),
                Unpublish("pv-a", "pod-2"),
                Unpublish("pv-a", "pod-1"),
                Unstage("pv-a"),
                DeleteVolume("pv-a"),
            ],
        },
    ]
}
