//! The node half: a [`NodeBackend`] whose volumes are the devices the provider attached, found
//! by the stable name ControllerPublish put in the publish context; csi-node waits for them,
//! formats them on first use (never again), mounts them or publishes them as block devices.

use std::path::PathBuf;

use csi_node::{
    NodeBackend, NodeError, VolumeContexts, VolumeInfo, VolumeLocator, VolumeSource, device_by_name,
};

use super::{ACCESS_KEY, DEVICE_KEY};

/// The node's backend: devices appear as `<.0>/<the publish context's name>`.
pub struct CloudNode(pub PathBuf);

impl VolumeLocator for CloudNode {
    /// Without contexts (NodeUnstage, NodeUnpublish, after a restart): an
    /// id in the provider's format may be one of its volumes, whose device
    /// has the stable name made from its id. Otherwise a volume whose
    /// record went with the work of an answer that was lost (a crash right
    /// after NodeUnstage removed it) would be NOT_FOUND to every retry.
    fn source(&self, id: &str) -> Option<VolumeSource> {
        let device = self.0.join(crate::api::device_link_name(id));
        crate::cloud::is_provider_id(id).then_some(VolumeSource::Device(device))
    }

    fn source_in(&self, _: &str, c: &VolumeContexts) -> Result<Option<VolumeSource>, NodeError> {
        let name = c.publish(DEVICE_KEY)?;
        let field = format!("publish_context[{DEVICE_KEY}]");
        let device = device_by_name(&self.0, name, &field)?;
        Ok(Some(VolumeSource::Device(device)))
    }
}

impl NodeBackend for CloudNode {
    /// No contexts at all (nothing staged here) is an unknown volume;
    /// contexts without the device's name are an error naming the key.
    fn volume_in(&self, _: &str, c: &VolumeContexts) -> Result<Option<VolumeInfo>, NodeError> {
        if *c == VolumeContexts::default() {
            return Ok(None);
        }
        c.publish(DEVICE_KEY)?;
        let access = c.publish_context.get(ACCESS_KEY);
        let info = VolumeInfo::new(access.is_some_and(|a| a == "block"), 0);
        Ok(Some(info))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// Found by csi-sim (a crash after NodeUnstage removed its record): a
    /// retry of NodeUnstage must find the volume known without contexts.
    #[test]
    fn a_provider_id_is_known_without_contexts_by_its_stable_device_name() {
        let node = CloudNode(PathBuf::from("/dev/disk/by-id"));
        let id = "3f2c7a1e-8b4d-4c6e-9a10-2b3c4d5e6f70";
        let want = Path::new("/dev/disk/by-id").join(crate::api::device_link_name(id));
        assert_eq!(node.source(id), Some(VolumeSource::Device(want)));
        for bad in ["", "vol-1", "../3f2c7a1e-8b4d-4c6e-9a10-2b3c4d5e6f70"] {
            assert_eq!(node.source(bad), None, "{bad:?}");
        }
    }
}
