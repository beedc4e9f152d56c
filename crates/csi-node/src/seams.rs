//! The traits [`NodeVolumes`](crate::NodeVolumes) acts through besides the
//! mounter and csi-store's record store, each with a real implementation and
//! a fake beside it: loop devices, how a filesystem is put on a device, and
//! where a driver keeps a volume's data.

use std::path::Path;
use std::sync::Arc;

use mount_utils::{DiskFormat, Errno, LoopDevice, LoopOptions, Mounter, SafeFormatAndMount};

use crate::error::NodeError;
use crate::observe::device_number;
use crate::record::{Device, Source};

/// Loop devices, found by their backing file.
pub trait LoopDevices: Send + Sync {
    /// Attaches `backing_file` to a free loop device, left attached (no
    /// autoclear: a bind mount of the device node does not hold it open).
    fn attach(&self, backing_file: &Path) -> Result<Device, NodeError>;
    /// The devices attached to `backing_file` now.
    fn find(&self, backing_file: &Path) -> Result<Vec<Device>, NodeError>;
    /// Detaches `device` (deferred by the kernel while it is mounted); one
    /// already gone is fine.
    fn detach(&self, device: &Device) -> Result<(), NodeError>;
}

/// [`LoopDevices`] over mount-utils' loop ioctls and `/sys/block`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemLoopDevices;

impl SystemLoopDevices {
    fn device(path: &Path) -> Result<Device, NodeError> {
        let (major, minor) =
            device_number(path).map_err(|e| NodeError::io("inspecting", path, &e))?;
        Ok(Device {
            path: path.to_path_buf(),
            major,
            minor,
        })
    }
}

impl LoopDevices for SystemLoopDevices {
    fn attach(&self, backing_file: &Path) -> Result<Device, NodeError> {
        let opts = LoopOptions {
            autoclear: false,
            ..LoopOptions::default()
        };
        let dev = LoopDevice::attach(backing_file, &opts)
            .map_err(|e| NodeError::loop_device("attaching", backing_file, &e))?;
        let device = Self::device(dev.path());
        let path = dev.keep();
        device.inspect_err(|_| {
            let _ = mount_utils::loopdev::detach(&path);
        })
    }

    fn find(&self, backing_file: &Path) -> Result<Vec<Device>, NodeError> {
        mount_utils::loopdev::find_by_backing_file(backing_file)
            .map_err(|e| NodeError::loop_device("looking up loop devices of", backing_file, &e))?
            .iter()
            .map(|p| Self::device(p))
            .collect()
    }

    fn detach(&self, device: &Device) -> Result<(), NodeError> {
        match mount_utils::loopdev::detach(&device.path) {
            Ok(()) => Ok(()),
            Err(e) if matches!(e.errno(), Some(Errno::ENXIO | Errno::ENOENT)) => Ok(()),
            Err(e) => Err(NodeError::loop_device("detaching", &device.path, &e)),
        }
    }
}

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
/// is refused, never formatted again.
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
        if !may_format {
            match self.probe(&dev) {
                Ok(DiskFormat::Filesystem(_)) => {}
                Ok(_) => {
                    return Err(NodeError::FailedPrecondition(format!(
                        "{} was formatted for this volume but holds no filesystem now; \
                         refusing to format it again",
                        device.display()
                    )));
                }
                Err(e) => return Err(NodeError::format(device, target, &e)),
            }
        }
        self.format_and_mount(&dev, target, fs_type, options, &[])
            .map_err(|e| NodeError::format(device, target, &e))
    }
}
