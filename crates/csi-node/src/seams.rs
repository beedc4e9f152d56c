//! The driver-side seams of [`NodeVolumes`](crate::NodeVolumes), besides
//! mount-utils' `Mounter` and `LoopDevices` and csi-store's record store:
//! how a filesystem is put on a device, and where a driver keeps a volume's
//! data.

use std::path::Path;
use std::sync::Arc;

use mount_utils::{Mounter, SafeFormatAndMount};

use crate::error::NodeError;
use crate::record::{Device, Source};

/// Where a driver keeps a volume's data: the one thing NodeVolumes needs
/// to know about the driver to stage a volume and to recognise its mounts
/// and devices without a record (after a crash or a lost record).
pub trait VolumeLocator: Send + Sync {
    /// The volume's source on this node; `None` when the driver has no
    /// such volume (NOT_FOUND).
    fn source(&self, volume_id: &str) -> Option<Source>;

    /// Called with the volume's loop device each time it is staged or
    /// restored, attached just now or found attached: the place for
    /// per-volume device settings (read-ahead, direct I/O). Nothing by
    /// default.
    fn prepare_device(&self, volume_id: &str, device: &Device) -> Result<(), NodeError> {
        let _ = (volume_id, device);
        Ok(())
    }
}

impl<F> VolumeLocator for F
where
    F: Fn(&str) -> Option<Source> + Send + Sync,
{
    fn source(&self, volume_id: &str) -> Option<Source> {
        self(volume_id)
    }
}

/// Puts the filesystem of a device at the staging path.
pub trait FilesystemMount: Send + Sync {
    /// Mounts the filesystem on `device` at `target`. `may_format`: the
    /// device may be formatted if it is empty; false once a filesystem was
    /// mounted from it (it must then be refused, never formatted again).
    fn mount_filesystem(
        &self,
        device: &Path,
        target: &Path,
        fs_type: &str,
        options: &[&str],
        may_format: bool,
    ) -> Result<(), NodeError>;
}

/// Mounts what is there (ext4 when no type is asked for); formats nothing.
pub struct PlainMount(pub Arc<dyn Mounter>);

impl FilesystemMount for PlainMount {
    fn mount_filesystem(
        &self,
        device: &Path,
        target: &Path,
        fs_type: &str,
        options: &[&str],
        _may_format: bool,
    ) -> Result<(), NodeError> {
        let fs_type = if fs_type.is_empty() {
            mount_utils::DEFAULT_FS_TYPE
        } else {
            fs_type
        };
        self.0
            .mount(&device.to_string_lossy(), target, fs_type, options)
            .map_err(|e| NodeError::mount("mounting", target, &e))
    }
}

/// Formats a new volume's empty device, fscks and mounts; a device that
/// was formatted before and now shows no filesystem (damaged first blocks)
/// is refused ([`SafeFormatAndMount::mount_formatted`]), never formatted
/// again.
impl FilesystemMount for SafeFormatAndMount {
    fn mount_filesystem(
        &self,
        device: &Path,
        target: &Path,
        fs_type: &str,
        options: &[&str],
        may_format: bool,
    ) -> Result<(), NodeError> {
        let dev = device.to_string_lossy();
        let result = if may_format {
            self.format_and_mount(&dev, target, fs_type, options, &[])
        } else {
            self.mount_formatted(&dev, target, fs_type, options, &[])
        };
        result.map_err(|e| NodeError::format(device, target, &e))
    }
}
