//! Block devices the controller attached (a cloud disk, an iSCSI LUN), found
//! by path or by a stable name such as `/dev/disk/by-id/<serial>`, and
//! waited for: the kernel and udev make the node some time after the
//! attach returned.
//!
//! [`BlockDevices`] is the seam: [`LinuxBlockDevices`] looks at the real
//! `/dev`, [`FakeBlockDevices`](crate::FakeBlockDevices) answers from memory
//! and waits on a virtual clock, so a unit test neither reads the host's
//! devices nor sleeps.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
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
    /// The device node the path leads to now (`/dev/sdb` for a by-id link):
    /// what to bind or mount, since mounts never follow a symlink.
    pub node: PathBuf,
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

    /// Where `path` leads when it is a stable name (a symbolic link such
    /// as a by-id name, which udev or a provider may re-point): the device
    /// node behind it and that node's number. `None` when `path` is no
    /// link (the node itself, or nothing). By default the host's `/dev` is
    /// read (`lstat`, then `realpath` and `stat` of a link); a fake answers
    /// from what it holds, so a unit test reads no real device.
    fn link_target(
        &self,
        path: &Path,
    ) -> Result<Option<(PathBuf, DeviceNumber)>, BlockDeviceError> {
        let io = |action, e: std::io::Error| BlockDeviceError::Io {
            action,
            path: path.to_path_buf(),
            errno: Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
        };
        let is_link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
        if !is_link {
            return Ok(None);
        }
        let node = std::fs::canonicalize(path).map_err(|e| io("resolving", e))?;
        let meta = std::fs::metadata(&node).map_err(|e| io("inspecting", e))?;
        Ok(Some((node, DeviceNumber::from_dev_t(meta.rdev() as _))))
    }

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
        // One descriptor for the node the path leads to: its size, and its
        // resolved name from the kernel (one readlink of the descriptor,
        // not one per component of the path and of each link's target).
        let device = match std::fs::File::open(path) {
            Ok(f) => f,
            // Detached since the look above.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io("opening", e)),
        };
        let opened = device.metadata().map_err(|e| io("inspecting", e))?;
        if !opened.file_type().is_block_device() || opened.rdev() != meta.rdev() {
            // Replaced between the two looks: look again next time.
            return Ok(None);
        }
        let size =
            crate::block::device_size_fd(&device).map_err(|e| io("reading the size of", e))?;
        let fd = std::os::fd::AsRawFd::as_raw_fd(&device);
        let node =
            std::fs::read_link(format!("/proc/self/fd/{fd}")).map_err(|e| io("resolving", e))?;
        if node.as_os_str().as_encoded_bytes().ends_with(b" (deleted)") || !node.is_absolute() {
            // The node was removed meanwhile (or the descriptor names no path).
            return Ok(None);
        }
        Ok(Some(BlockDeviceInfo {
            path: path.to_path_buf(),
            node,
            device: DeviceNumber::from_dev_t(meta.rdev()),
            size,
        }))
    }

    fn pause(&self, interval: Duration) {
        std::thread::sleep(interval);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FakeBlockDevices;

    /// Issue 22: the fake answers where a stable name leads from memory; the
    /// host's file at the same path (here a real symlink) is not read.
    #[test]
    fn a_link_is_resolved_by_the_seam_and_the_fake_never_reads_the_host() {
        let dir = tempfile::tempdir().unwrap();
        let (file, link) = (dir.path().join("node"), dir.path().join("by-id"));
        std::fs::write(&file, b"").unwrap();
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let fake = FakeBlockDevices::new();
        fake.add(&link, DeviceNumber::new(259, 1), 1 << 20);
        assert_eq!(fake.link_target(&link).unwrap(), None);
        assert_eq!(fake.link_target(Path::new("/dev/loop0")).unwrap(), None);
        assert_eq!(fake.looks(), 0, "no look for a device");
        // The host's seam reads the host: the link leads to the file.
        let (node, _) = LinuxBlockDevices.link_target(&link).unwrap().unwrap();
        assert_eq!(node, file.canonicalize().unwrap());
        assert_eq!(LinuxBlockDevices.link_target(&file).unwrap(), None);
    }

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
