//! The node half: csi-node's [`AttachedDevices`], whose volumes are the devices the provider
//! attached, found by the stable name ControllerPublish put in the publish context; csi-node
//! waits for them, formats them on first use (never again), mounts them or publishes them as
//! block devices.

use std::path::PathBuf;

use csi_node::AttachedDevices;

use super::{ACCESS_KEY, DEVICE_KEY};

/// The node's backend: devices appear as `<dir>/<the publish context's name>`.
///
/// Without contexts (NodeUnstage, NodeUnpublish, after a restart): an id in the provider's
/// format may be one of its volumes, whose device has the stable name made from its id.
/// Otherwise a volume whose record went with the work of an answer that was lost (a crash
/// right after NodeUnstage removed it) would be NOT_FOUND to every retry.
pub fn devices(dir: PathBuf) -> AttachedDevices {
    let by_id =
        |id: &str| crate::cloud::is_provider_id(id).then(|| crate::api::device_link_name(id));
    AttachedDevices::new(dir, DEVICE_KEY)
        .access_key(ACCESS_KEY)
        .named_by_id(by_id)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use csi_node::{VolumeLocator, VolumeSource};

    use super::*;

    /// Found by csi-sim (a crash after NodeUnstage removed its record): a
    /// retry of NodeUnstage must find the volume known without contexts.
    #[test]
    fn a_provider_id_is_known_without_contexts_by_its_stable_device_name() {
        let node = devices(PathBuf::from("/dev/disk/by-id"));
        let id = "3f2c7a1e-8b4d-4c6e-9a10-2b3c4d5e6f70";
        let want = Path::new("/dev/disk/by-id").join(crate::api::device_link_name(id));
        assert_eq!(node.source(id), Some(VolumeSource::Device(want)));
        for bad in ["", "vol-1", "../3f2c7a1e-8b4d-4c6e-9a10-2b3c4d5e6f70"] {
            assert_eq!(node.source(bad), None, "{bad:?}");
        }
    }
}
