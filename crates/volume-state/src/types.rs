//! Key bounds and the plain data shared by both reconcilers.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::path::PathBuf;

/// Bounds for volume, pod (workload) and node identifiers.
///
/// Blanket-implemented; `String`, integers and small newtypes all qualify.
pub trait Key: Clone + Eq + Hash + Ord + Debug + Send + Sync + 'static {}

impl<T: Clone + Eq + Hash + Ord + Debug + Send + Sync + 'static> Key for T {}

/// Whether a volume may be attached to more than one node at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum NodeAccess {
    /// At most one node (ReadWriteOnce-like): multi-attach is forbidden.
    #[default]
    SingleNode,
    /// Any number of nodes.
    MultiNode,
}

/// Everything needed to attach, stage and publish a volume.
///
/// Shared behind an `Arc` by the state caches, so cloning a cache is cheap.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VolumeSpec {
    /// The volume must be attached to the node (ControllerPublish) before use.
    pub attachable: bool,
    /// Where the device is staged (NodeStage). `None` means the volume is not
    /// device-mountable and goes straight to publish.
    pub staging_path: Option<PathBuf>,
    /// Single- or multi-node access.
    pub access_mode: NodeAccess,
    /// Publish read-only.
    pub read_only: bool,
    /// Mount options for stage and publish.
    pub mount_options: Vec<String>,
    /// Filesystem type, if the driver needs one.
    pub fs_type: Option<String>,
    /// Desired size in bytes; a larger value than the mounted size triggers a
    /// node expansion.
    pub desired_size: Option<u64>,
    /// Opaque driver attributes (CSI volume context).
    pub attributes: BTreeMap<String, String>,
}

impl VolumeSpec {
    /// Whether the volume needs a stage step (device mount) before publish.
    pub fn device_mountable(&self) -> bool {
        self.staging_path.is_some()
    }
}

/// What an attach (or verify-attached) call reports about the attachment.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct AttachInfo {
    /// Device path on the node, if the plugin knows it.
    pub device_path: Option<PathBuf>,
    /// Opaque data for stage and publish (CSI publish context).
    pub publish_context: BTreeMap<String, String>,
}

/// The name of an operation, part of an operation key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OperationKind {
    /// Attach the volume to a node.
    Attach,
    /// Wait for an attachment done by someone else (the controller).
    VerifyAttached,
    /// Detach the volume from a node.
    Detach,
    /// Stage (device-mount) the volume.
    Stage,
    /// Unstage (device-unmount) the volume.
    Unstage,
    /// Publish (mount) the volume for a pod.
    Publish,
    /// Unpublish (unmount) the volume for a pod.
    Unpublish,
    /// Expand the filesystem on the node.
    Expand,
    /// Unmount a discovered mount that could not be reconstructed.
    CleanupOrphan,
}
