//! [`AttachedDevices`]: the whole [`NodeBackend`] of a driver whose volumes
//! are disks its controller attaches through a provider (DigitalOcean
//! volumes, EBS, PD, Cinder, Ceph RBD): the node keeps no state of the
//! controller's and learns each volume from the request.

use std::path::{Path, PathBuf};

use crate::error::NodeError;
use crate::record::VolumeSource;
use crate::seams::{VolumeContexts, VolumeLocator, device_by_name};
use crate::service::{NodeBackend, VolumeInfo};

/// A device's stable name from a volume id alone, or `None` for an id
/// that cannot be one of the driver's volumes.
type NameById = Box<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// The node side of a remote-disk driver: a volume is the device
/// `<dir>/<publish_context[name_key]>` (e.g. `/dev/disk/by-id/<serial>`),
/// which [`NodeService`](crate::NodeService) waits for, formats only when
/// it holds no filesystem and mounts or publishes as a block device.
///
/// - NodeStage and NodePublish learn the device from the publish context
///   (ControllerPublishVolume's answer); a missing key is INVALID_ARGUMENT
///   naming `publish_context[<key>]`, and a name that is not one path
///   component is refused, so a request cannot point the node elsewhere.
/// - The access type is `publish_context[access_key]` (`block`, anything
///   else is mount) when [`access_key`](Self::access_key) names one; a
///   volume is a mount volume otherwise.
/// - Calls without contexts (NodeUnstage, NodeUnpublish, a restore) know a
///   volume only through [`named_by_id`](Self::named_by_id): a driver whose
///   device names derive from volume ids should give it, or a retry of a
///   NodeUnstage whose record went with an answer that was lost (a crash
///   right after the unstage) is NOT_FOUND forever.
///
/// ```
/// use csi_node::{AttachedDevices, VolumeContexts, VolumeLocator, VolumeSource};
///
/// let devices = AttachedDevices::new("/dev/disk/by-id", "serial")
///     .access_key("access")
///     .named_by_id(|id| id.starts_with("vol-").then(|| format!("disk-{id}")));
/// let mut contexts = VolumeContexts::default();
/// contexts.publish_context.insert("serial".into(), "disk-7".into());
/// let device = devices.source_in("vol-7", &contexts).unwrap();
/// assert_eq!(device, Some(VolumeSource::Device("/dev/disk/by-id/disk-7".into())));
/// let known = devices.source("vol-7");
/// assert_eq!(known, Some(VolumeSource::Device("/dev/disk/by-id/disk-vol-7".into())));
/// ```
pub struct AttachedDevices {
    dir: PathBuf,
    name_key: String,
    access_key: Option<String>,
    by_id: Option<NameById>,
}

impl AttachedDevices {
    /// Devices appear as `<dir>/<publish_context[name_key]>`.
    pub fn new(dir: impl Into<PathBuf>, name_key: impl Into<String>) -> Self {
        AttachedDevices {
            dir: dir.into(),
            name_key: name_key.into(),
            access_key: None,
            by_id: None,
        }
    }

    /// The publish context key whose value `block` makes a volume a block
    /// volume (a capability of the other access type is then
    /// FAILED_PRECONDITION).
    pub fn access_key(mut self, key: impl Into<String>) -> Self {
        self.access_key = Some(key.into());
        self
    }

    /// How a volume is known without contexts: the name of its device from
    /// its id, `None` for an id that cannot be the driver's.
    pub fn named_by_id(
        mut self,
        name: impl Fn(&str) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.by_id = Some(Box::new(name));
        self
    }

    /// Where the devices appear.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl VolumeLocator for AttachedDevices {
    fn source(&self, volume_id: &str) -> Option<VolumeSource> {
        let name = (self.by_id.as_ref()?)(volume_id)?;
        let device = device_by_name(&self.dir, &name, "volume_id").ok()?;
        Some(VolumeSource::Device(device))
    }

    fn source_in(
        &self,
        _volume_id: &str,
        contexts: &VolumeContexts,
    ) -> Result<Option<VolumeSource>, NodeError> {
        let name = contexts.publish(&self.name_key)?;
        let field = format!("publish_context[{}]", self.name_key);
        let device = device_by_name(&self.dir, name, &field)?;
        Ok(Some(VolumeSource::Device(device)))
    }
}

impl NodeBackend for AttachedDevices {
    /// No contexts at all (nothing staged here) is an unknown volume;
    /// contexts without the device's name are an error naming the key.
    fn volume_in(
        &self,
        _volume_id: &str,
        contexts: &VolumeContexts,
    ) -> Result<Option<VolumeInfo>, NodeError> {
        if *contexts == VolumeContexts::default() {
            return Ok(None);
        }
        contexts.publish(&self.name_key)?;
        let access = (self.access_key.as_ref()).and_then(|k| contexts.publish_context.get(k));
        Ok(Some(VolumeInfo::new(
            access.is_some_and(|a| a == "block"),
            0,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contexts(publish: &[(&str, &str)]) -> VolumeContexts {
        let mut c = VolumeContexts::default();
        for (k, v) in publish {
            c.publish_context.insert(k.to_string(), v.to_string());
        }
        c
    }

    #[test]
    fn the_publish_context_names_the_device_and_its_access_type() {
        let devices = AttachedDevices::new("/by-id", "name").access_key("access");
        let block = contexts(&[("name", "d1"), ("access", "block")]);
        let found = devices.source_in("v1", &block).unwrap();
        assert_eq!(found, Some(VolumeSource::Device("/by-id/d1".into())));
        assert_eq!(
            devices.volume_in("v1", &block).unwrap(),
            Some(VolumeInfo::new(true, 0))
        );
        let mount = contexts(&[("name", "d1"), ("access", "mount")]);
        assert_eq!(
            devices.volume_in("v1", &mount).unwrap(),
            Some(VolumeInfo::new(false, 0))
        );
        // Without an access key every volume is a mount volume.
        let plain = AttachedDevices::new("/by-id", "name");
        assert_eq!(
            plain.volume_in("v1", &block).unwrap(),
            Some(VolumeInfo::new(false, 0))
        );
    }

    #[test]
    fn a_missing_or_escaping_name_is_an_error_naming_the_key() {
        let devices = AttachedDevices::new("/by-id", "name");
        let other = contexts(&[("serial", "d1")]);
        for e in [
            devices.source_in("v1", &other).unwrap_err(),
            devices.volume_in("v1", &other).unwrap_err(),
            devices
                .source_in("v1", &contexts(&[("name", "../sda")]))
                .unwrap_err(),
        ] {
            assert!(e.to_string().contains("publish_context[name]"), "{e}");
        }
        // No contexts at all: a volume this node knows nothing of.
        let none = VolumeContexts::default();
        assert_eq!(devices.volume_in("v1", &none).unwrap(), None);
    }

    #[test]
    fn without_contexts_a_volume_is_known_only_by_its_id() {
        let plain = AttachedDevices::new("/by-id", "name");
        assert_eq!(plain.source("vol-1"), None);
        let devices = plain.named_by_id(|id| id.starts_with("vol-").then(|| format!("x-{id}")));
        let want = VolumeSource::Device("/by-id/x-vol-1".into());
        assert_eq!(devices.source("vol-1"), Some(want));
        assert_eq!(devices.source("other"), None);
        let escaping = AttachedDevices::new("/by-id", "name").named_by_id(|id| Some(id.into()));
        assert_eq!(escaping.source("../sda"), None, "one path component only");
    }
}
