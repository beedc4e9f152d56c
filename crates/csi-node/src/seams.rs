//! The driver-side seams of [`NodeVolumes`](crate::NodeVolumes), besides
//! mount-utils' `Mounter` and `LoopDevices` and csi-store's record store:
//! how a filesystem is put on a device, and where a driver keeps a volume's
//! data.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use mount_utils::{
    DiskFormat, FormatError, FuseConnection, MountArgs, Mounter, SafeFormatAndMount, StartedProbe,
};

use crate::error::NodeError;
use crate::record::{Device, FilesystemSource, VolumeSource};

/// Where a driver keeps a volume's data: the one thing NodeVolumes needs
/// to know about the driver to stage a volume and to recognise its mounts
/// and devices without a record (after a crash or a lost record).
pub trait VolumeLocator: Send + Sync {
    /// The volume's source on this node from its id alone (a driver whose
    /// data is on this node); `None` when the driver has no such volume, or
    /// needs the request's contexts to say (the default).
    fn source(&self, volume_id: &str) -> Option<VolumeSource> {
        let _ = volume_id;
        None
    }

    /// The volume's source as NodeStage and NodePublish learn it: from the
    /// request's volume and publish contexts, so no controller need run in
    /// the node's process (e.g. a device named by a serial in the publish
    /// context). A missing or bad key is an error naming it
    /// ([`VolumeContexts::publish`]). [`source`](Self::source) by default.
    fn source_in(
        &self,
        volume_id: &str,
        contexts: &VolumeContexts,
    ) -> Result<Option<VolumeSource>, NodeError> {
        let _ = contexts;
        Ok(self.source(volume_id))
    }

    /// Called with the volume's loop device each time it is staged or
    /// restored, attached just now or found attached: the place for
    /// per-volume device settings (read-ahead, direct I/O). Nothing by
    /// default.
    fn prepare_device(&self, volume_id: &str, device: &Device) -> Result<(), NodeError> {
        let _ = (volume_id, device);
        Ok(())
    }

    /// Serves a FUSE filesystem volume (`fuse` or `fuse.<subtype>`) just
    /// mounted with `connection`: hand it to the filesystem's daemon
    /// (`FuseConnection::hand_to` gives a command the descriptor as
    /// `/dev/fd/3`, which a libfuse daemon takes as its mount point) or
    /// serve it in this process. Called once per mount, before anything looks at the mount,
    /// which waits until it is served. An error unmounts it and fails the
    /// call. By default the driver serves no FUSE filesystem:
    /// FAILED_PRECONDITION.
    fn serve_fuse(
        &self,
        volume_id: &str,
        source: &FilesystemSource,
        connection: FuseConnection,
    ) -> Result<(), NodeError> {
        drop(connection);
        Err(NodeError::failed_precondition(format!(
            "volume {volume_id} is a {} filesystem, and this driver serves no FUSE filesystem",
            source.fs_type
        )))
    }
}

impl<F> VolumeLocator for F
where
    F: Fn(&str) -> Option<VolumeSource> + Send + Sync,
{
    fn source(&self, volume_id: &str) -> Option<VolumeSource> {
        self(volume_id)
    }
}

/// What a NodeStage or NodePublish request says about its volume besides
/// its id (the CO passes on what CreateVolume and ControllerPublishVolume
/// returned). The secrets are not here: they never reach a record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeContexts {
    /// The volume context (CreateVolume's answer).
    pub volume_context: BTreeMap<String, String>,
    /// The publish context (ControllerPublishVolume's answer).
    pub publish_context: BTreeMap<String, String>,
}

impl VolumeContexts {
    /// The contexts of a request.
    pub fn of(
        volume_context: &HashMap<String, String>,
        publish_context: &HashMap<String, String>,
    ) -> Self {
        let sorted = |m: &HashMap<String, String>| m.clone().into_iter().collect();
        VolumeContexts {
            volume_context: sorted(volume_context),
            publish_context: sorted(publish_context),
        }
    }

    /// `publish_context[key]`, or INVALID_ARGUMENT naming it.
    pub fn publish(&self, key: &str) -> Result<&str, NodeError> {
        required(&self.publish_context, "publish_context", key)
    }

    /// `volume_context[key]`, or INVALID_ARGUMENT naming it.
    pub fn volume(&self, key: &str) -> Result<&str, NodeError> {
        required(&self.volume_context, "volume_context", key)
    }
}

fn required<'a>(
    map: &'a BTreeMap<String, String>,
    name: &str,
    key: &str,
) -> Result<&'a str, NodeError> {
    match map.get(key).map(String::as_str) {
        Some(v) if !v.is_empty() => Ok(v),
        _ => Err(NodeError::invalid(
            format!("{name}[{key}]"),
            "required by this driver",
        )),
    }
}

/// A stable device name (`<dir>/<name>`, e.g. `/dev/disk/by-id/<serial>`)
/// from a name the request carries: one path component, so a request
/// cannot point the node at another path. `field` names it in the error.
pub fn device_by_name(
    dir: &Path,
    name: &str,
    field: &str,
) -> Result<std::path::PathBuf, NodeError> {
    let ok = !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains('/')
        && !name.contains('\0');
    if !ok {
        return Err(NodeError::invalid(field, "must be a single path component"));
    }
    Ok(dir.join(name))
}

/// Puts the filesystem of a device at the staging path.
pub trait FilesystemMount: Send + Sync {
    /// Mounts the filesystem on the device `mount.source` at `mount.target`
    /// (an empty `fstype`: the implementation's default). `may_format`:
    /// the device may be formatted if it is empty; false once a filesystem
    /// was mounted from it (it must then be refused, never formatted again).
    fn mount_filesystem(&self, mount: &MountArgs<'_>, may_format: bool) -> Result<(), NodeError>;

    /// Starts looking at what is on `device`, for
    /// [`mount_probed`](Self::mount_probed): NodeStage starts it before it
    /// saves its intent and takes what it found once the intent is saved,
    /// as looking changes nothing. `None` (the default): nothing is looked
    /// at ahead, and [`mount_filesystem`](Self::mount_filesystem) is called.
    fn probe_ahead(&self, device: &str) -> Option<StartedProbe> {
        let _ = device;
        None
    }

    /// [`mount_filesystem`](Self::mount_filesystem) of the device
    /// [`probe_ahead`](Self::probe_ahead) looked at (`probe`: what it found);
    /// nothing has written to it since. Default: `mount_filesystem`.
    fn mount_probed(
        &self,
        mount: &MountArgs<'_>,
        may_format: bool,
        probe: Probe,
    ) -> Result<(), NodeError> {
        let _ = probe;
        self.mount_filesystem(mount, may_format)
    }
}

/// What [`FilesystemMount::probe_ahead`] found on a device, or why it could
/// not look.
pub type Probe = Result<DiskFormat, FormatError>;

/// Mounts what is there (ext4 when no type is asked for); formats nothing.
pub struct PlainMount(pub Arc<dyn Mounter>);

impl FilesystemMount for PlainMount {
    fn mount_filesystem(&self, mount: &MountArgs<'_>, _may_format: bool) -> Result<(), NodeError> {
        let fstype = match mount.fstype {
            "" => mount_utils::DEFAULT_FS_TYPE,
            asked => asked,
        };
        self.0
            .mount_with(&MountArgs { fstype, ..*mount })
            .map_err(|e| NodeError::mount("mounting", mount.target, &e))
    }
}

/// Formats a new volume's empty device, fscks and mounts; a device that
/// was formatted before and now shows no filesystem (damaged first blocks)
/// is refused ([`SafeFormatAndMount::mount_formatted`]), never formatted
/// again.
impl FilesystemMount for SafeFormatAndMount {
    fn mount_filesystem(&self, mount: &MountArgs<'_>, may_format: bool) -> Result<(), NodeError> {
        let MountArgs {
            source,
            target,
            fstype,
            options,
            sensitive_options,
        } = *mount;
        let result = match may_format {
            true => self.format_and_mount_sensitive(mount, &[]),
            false => self.mount_formatted(source, target, fstype, options, sensitive_options),
        };
        result.map_err(|e| NodeError::format(Path::new(source), target, &e))
    }

    fn probe_ahead(&self, device: &str) -> Option<StartedProbe> {
        Some(self.start_probe(device))
    }

    fn mount_probed(
        &self,
        mount: &MountArgs<'_>,
        may_format: bool,
        probe: Probe,
    ) -> Result<(), NodeError> {
        let format = may_format.then_some(&[][..]);
        let result = probe.and_then(|found| self.mount_as_probed(mount, format, found));
        result.map_err(|e| NodeError::format(Path::new(mount.source), mount.target, &e))
    }
}
