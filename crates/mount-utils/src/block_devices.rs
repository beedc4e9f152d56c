//! Block devices the controller attached (a cloud disk, an iSCSI LUN), found
//! by path or by a stable name such as `/dev/disk/by-id/<serial>`, and
//! waited for: the kernel and udev make the node some time after the
//! attach returned.
//!
//! [`BlockDevices`] is the seam: [`LinuxBlockDevices`] looks at the real
//! `/dev`, [`FakeBlockDevices`] answers from memory and waits on a virtual
//! clock, so a unit test neither reads the host's devices nor sleeps.

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use nix::errno::Errno;

use crate::block::DeviceNumber;

/// How long [`BlockDevices::wait_for`] pauses between looks.
pub const DEVICE_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// A block device found at a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockDeviceInfo {
    /// The path it was asked for (a stable name stays a stable name: the
    /// node it points to may change across reboots).
    pub path: PathBuf,
    /// Its `st_rdev`: what mountinfo shows for a filesystem on it.
    pub device: DeviceNumber,
    /// Its size in bytes.
    pub size: u64,
}

/// Why a block device could not be found or read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockDeviceError {
    /// Nothing appeared at the path within the timeout.
    #[error("device {} did not appear within {waited:?}", path.display())]
    Timeout {
        /// The path waited for.
        path: PathBuf,
        /// How long.
        waited: Duration,
    },
    /// The path holds something that is not a block device.
    #[error("{} is not a block device", path.display())]
    NotBlockDevice {
        /// The path.
        path: PathBuf,
    },
    /// Reading the device failed.
    #[error("{action} {}: {}", path.display(), errno.desc())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The kernel's answer.
        errno: Errno,
    },
}

/// Finds attached block devices and reads their size.
pub trait BlockDevices: Send + Sync {
    /// The block device at `path` (a link such as a by-id name is followed:
    /// udev's links are how a stable name reaches the device), or `None`
    /// while nothing is there.
    fn find(&self, path: &Path) -> Result<Option<BlockDeviceInfo>, BlockDeviceError>;

    /// Waits `interval` between two looks (a fake advances its clock).
    fn pause(&self, interval: Duration);

    /// The device at `path`, looked for until `timeout` has passed.
    fn wait_for(
        &self,
        path: &Path,
        timeout: Duration,
    ) -> Result<BlockDeviceInfo, BlockDeviceError> {
        let mut waited = Duration::ZERO;
        loop {
            if let Some(found) = self.find(path)? {
                return Ok(found);
            }
            if waited >= timeout {
                return Err(BlockDeviceError::Timeout {
                    path: path.to_path_buf(),
                    waited,
                });
            }
            let step = DEVICE_POLL_INTERVAL.min(timeout - waited);
            self.pause(step);
            waited += step;
        }
    }
}

/// The host's block devices.
#[derive(Debug, Clone, Copy, Default)]
pub struct LinuxBlockDevices;

impl BlockDevices for LinuxBlockDevices {
    fn find(&self, path: &Path) -> Result<Option<BlockDeviceInfo>, BlockDeviceError> {
        let io = |action, e: std::io::Error| BlockDeviceError::Io {
            action,
            path: path.to_path_buf(),
            errno: Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
        };
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io("inspecting", e)),
        };
        if !meta.file_type().is_block_device() {
            return Err(BlockDeviceError::NotBlockDevice {
                path: path.to_path_buf(),
            });
        }
        let size = crate::block::device_size(path).map_err(|e| io("reading the size of", e))?;
        Ok(Some(BlockDeviceInfo {
            path: path.to_path_buf(),
            device: DeviceNumber::from_dev_t(meta.rdev()),
            size,
        }))
    }

    fn pause(&self, interval: Duration) {
        std::thread::sleep(interval);
    }
}

/// Block devices in memory for unit tests: devices appear when a test says
/// so (now, or after some virtual time), and waiting advances a virtual
/// clock instead of sleeping. Never reads the host's `/dev`.
#[derive(Debug, Default)]
pub struct FakeBlockDevices {
    state: Mutex<FakeState>,
}

#[derive(Debug, Default)]
struct FakeState {
    now: Duration,
    /// Path → (device, appears at).
    devices: BTreeMap<PathBuf, (BlockDeviceInfo, Duration)>,
    looks: usize,
}

impl FakeBlockDevices {
    /// No devices, the clock at zero.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A device of `size` bytes numbered `device` at `path`, present now.
    pub fn add(&self, path: impl Into<PathBuf>, device: DeviceNumber, size: u64) {
        self.add_after(path, device, size, Duration::ZERO);
    }

    /// Like [`add`](Self::add), appearing once `delay` of virtual time passed.
    pub fn add_after(
        &self,
        path: impl Into<PathBuf>,
        device: DeviceNumber,
        size: u64,
        delay: Duration,
    ) {
        let path = path.into();
        let mut st = self.lock();
        let at = st.now + delay;
        let info = BlockDeviceInfo {
            path: path.clone(),
            device,
            size,
        };
        st.devices.insert(path, (info, at));
    }

    /// Grows (or shrinks) the device at `path`, as a provider's resize does.
    pub fn resize(&self, path: &Path, size: u64) {
        if let Some((info, _)) = self.lock().devices.get_mut(path) {
            info.size = size;
        }
    }

    /// Removes the device at `path`, as a detach does.
    pub fn remove(&self, path: &Path) {
        self.lock().devices.remove(path);
    }

    /// The virtual time waited so far.
    pub fn waited(&self) -> Duration {
        self.lock().now
    }

    /// How many times a device was looked for.
    pub fn looks(&self) -> usize {
        self.lock().looks
    }
}

impl BlockDevices for FakeBlockDevices {
    fn find(&self, path: &Path) -> Result<Option<BlockDeviceInfo>, BlockDeviceError> {
        let mut st = self.lock();
        st.looks += 1;
        let now = st.now;
        Ok(st
            .devices
            .get(path)
            .filter(|(_, at)| *at <= now)
            .map(|(info, _)| info.clone()))
    }

    fn pause(&self, interval: Duration) {
        self.lock().now += interval;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_finds_a_late_device_and_times_out_on_a_missing_one_without_sleeping() {
        let fake = FakeBlockDevices::new();
        let late = Path::new("/dev/disk/by-id/late");
        fake.add_after(
            late,
            DeviceNumber::new(8, 16),
            1 << 20,
            Duration::from_secs(2),
        );
        let found = fake.wait_for(late, Duration::from_secs(5)).unwrap();
        assert_eq!(
            (found.device, found.size),
            (DeviceNumber::new(8, 16), 1 << 20)
        );
        assert_eq!(fake.waited(), Duration::from_secs(2));

        let missing = Path::new("/dev/disk/by-id/never");
        let e = fake.wait_for(missing, Duration::from_secs(1)).unwrap_err();
        assert_eq!(
            e,
            BlockDeviceError::Timeout {
                path: missing.into(),
                waited: Duration::from_secs(1)
            }
        );
        assert!(e.to_string().contains("/dev/disk/by-id/never"));
    }

    #[test]
    fn a_path_that_is_not_a_block_device_is_refused() {
        let dir = std::env::temp_dir();
        let e = LinuxBlockDevices.find(&dir).unwrap_err();
        assert!(matches!(e, BlockDeviceError::NotBlockDevice { .. }));
        let absent = dir.join("csi-kit-no-such-device-here");
        assert_eq!(LinuxBlockDevices.find(&absent).unwrap(), None);
    }
}
