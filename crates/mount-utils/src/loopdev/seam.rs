//! The [`LoopDevices`] seam, its [`AttachedLoop`] handle and the Linux implementation.

use std::path::{Path, PathBuf};

use nix::errno::Errno;

use super::attach::device_path;
use super::find::loop_numbers;
use super::{LoopDevice, LoopDeviceInfo, LoopError, LoopOptions, detach, find_by_backing_file};

/// Loop device operations a node plugin needs, behind a trait so its node
/// code can be unit tested without root (with `FakeLoopDevices`, feature `testing`).
///
/// Device numbers are reused: after a detach the next attach may get the
/// same `/dev/loopN` for another file. Check [`info`](LoopDevices::info)'s
/// backing file before trusting a recorded device path.
pub trait LoopDevices: Send + Sync {
    /// Attaches `backing_file` to a free device. The returned handle holds
    /// the device open, so autoclear cannot release it before the caller has
    /// mounted it; dropping the handle detaches it, [`AttachedLoop::keep`]
    /// leaves it attached.
    fn attach(&self, backing_file: &Path, options: &LoopOptions)
    -> Result<AttachedLoop, LoopError>;

    /// Devices attached to `backing_file` (after a crash between attach and
    /// saving a record, this finds the device to clean up).
    fn find_by_backing_file(&self, backing_file: &Path) -> Result<Vec<PathBuf>, LoopError>;

    /// Every bound device, from one scan: a caller matching many backing
    /// files (a restart's restore) asks once instead of once per file.
    fn attached(&self) -> Result<Vec<LoopDeviceInfo>, LoopError>;

    /// The device at `device`, or `None` if nothing is attached there.
    fn info(&self, device: &Path) -> Result<Option<LoopDeviceInfo>, LoopError>;

    /// Re-reads the backing file's size after it grew; returns the new size.
    fn set_capacity(&self, device: &Path) -> Result<u64, LoopError>;

    /// Detaches `device` (deferred by the kernel while it is in use); not
    /// attached or absent is success.
    fn detach(&self, device: &Path) -> Result<(), LoopError>;
}

type Release = Box<dyn FnOnce(bool) -> Result<(), LoopError> + Send>;

/// A device attached by [`LoopDevices::attach`]: detached when dropped
/// unless [`kept`](AttachedLoop::keep).
pub struct AttachedLoop {
    info: LoopDeviceInfo,
    release: Option<Release>,
}

impl AttachedLoop {
    /// For [`LoopDevices`] implementations: `release(true)` must detach the
    /// device, `release(false)` let go of it leaving it attached.
    pub fn new(
        info: LoopDeviceInfo,
        release: impl FnOnce(bool) -> Result<(), LoopError> + Send + 'static,
    ) -> Self {
        AttachedLoop {
            info,
            release: Some(Box::new(release)),
        }
    }

    /// The device.
    pub fn info(&self) -> &LoopDeviceInfo {
        &self.info
    }

    /// Device path, for example `/dev/loop3`.
    pub fn path(&self) -> &Path {
        &self.info.path
    }

    /// Leaves the device attached (with autoclear: until nothing uses it).
    pub fn keep(mut self) -> LoopDeviceInfo {
        if let Some(release) = self.release.take() {
            let _ = release(false);
        }
        self.info.clone()
    }

    /// Detaches now (deferred by the kernel while in use).
    pub fn detach(mut self) -> Result<(), LoopError> {
        self.release.take().map_or(Ok(()), |release| release(true))
    }
}

impl Drop for AttachedLoop {
    fn drop(&mut self) {
        if let Some(release) = self.release.take()
            && let Err(e) = release(true)
        {
            tracing::warn!(error = %e, "detaching loop device on drop");
        }
    }
}

impl std::fmt::Debug for AttachedLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachedLoop")
            .field("info", &self.info)
            .field("kept", &self.release.is_none())
            .finish()
    }
}

/// [`LoopDevices`] on the kernel's loop driver.
#[derive(Debug, Clone, Copy, Default)]
pub struct LinuxLoopDevices;

impl LinuxLoopDevices {
    /// The real thing.
    pub fn new() -> Self {
        LinuxLoopDevices
    }
}

impl LoopDevices for LinuxLoopDevices {
    fn attach(
        &self,
        backing_file: &Path,
        options: &LoopOptions,
    ) -> Result<AttachedLoop, LoopError> {
        let dev = LoopDevice::attach(backing_file, options)?;
        let info = dev.info()?;
        Ok(AttachedLoop::new(info, move |detach| {
            if detach {
                dev.detach()
            } else {
                dev.keep();
                Ok(())
            }
        }))
    }

    fn find_by_backing_file(&self, backing_file: &Path) -> Result<Vec<PathBuf>, LoopError> {
        find_by_backing_file(backing_file)
    }

    fn attached(&self) -> Result<Vec<LoopDeviceInfo>, LoopError> {
        let mut out = Vec::new();
        for number in loop_numbers()? {
            // Unbound, or detached since the scan: not attached.
            out.extend(self.info(&device_path(number))?);
        }
        Ok(out)
    }

    fn info(&self, device: &Path) -> Result<Option<LoopDeviceInfo>, LoopError> {
        let dev = match LoopDevice::open(device) {
            Ok(d) => d,
            Err(LoopError::Open {
                errno: Errno::ENOENT | Errno::ENXIO,
                ..
            }) => return Ok(None),
            Err(e) => return Err(e),
        };
        match dev.info() {
            Ok(info) => Ok(Some(info)),
            // Not bound to a file.
            Err(LoopError::Ioctl {
                errno: Errno::ENXIO,
                ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn set_capacity(&self, device: &Path) -> Result<u64, LoopError> {
        let dev = LoopDevice::open(device)?;
        dev.set_capacity()?;
        dev.size()
    }

    fn detach(&self, device: &Path) -> Result<(), LoopError> {
        match detach(device) {
            Err(LoopError::Open {
                errno: Errno::ENOENT | Errno::ENXIO,
                ..
            }) => Ok(()),
            other => other,
        }
    }
}
