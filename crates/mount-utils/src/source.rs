//! [`MountSource`]: what a caller expects to find mounted at a path, so it
//! only ever unmounts or removes what is its own.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::block::DeviceNumber;
use crate::mountinfo::MountInfo;

/// The identity of a mount a node plugin made, checked against mountinfo
/// before the plugin treats a path as "already done" or tears it down.
///
/// Record it **before** the mount syscall (it is computable then, see the
/// variants), so a crash between the mount and saving the record still
/// leaves enough to clean up, and a lost record never lets someone else's
/// mount be removed.
///
/// ```
/// use std::path::Path;
/// use mount_utils::{DeviceNumber, FakeMounter, MountCheck, MountSource, Mounter};
///
/// let m = FakeMounter::new();
/// // NodeStage: a filesystem on /dev/loop3 (7:3) at the staging path.
/// let staged = MountSource::Device(DeviceNumber::new(7, 3));
/// m.mount("/dev/loop3", Path::new("/staging"), "ext4", &[]).unwrap();
/// // NodePublish: what a bind of the staging path will show, computed before binding.
/// let published = m.bind_source(Path::new("/staging")).unwrap();
/// m.bind_mount(Path::new("/staging"), Path::new("/pods/a"), false).unwrap();
///
/// assert!(matches!(m.check_mounted(Path::new("/pods/a"), &published).unwrap(), MountCheck::Ours(_)));
/// m.add_mount("tmpfs", "/pods/b", "tmpfs"); // someone else's
/// assert!(matches!(m.check_mounted(Path::new("/pods/b"), &published).unwrap(), MountCheck::Foreign(_)));
/// assert!(m.cleanup_mount_point_owned(Path::new("/pods/b"), &published).is_err());
/// assert!(m.is_mount_point(Path::new("/pods/b")).unwrap());
/// assert!(matches!(m.check_mounted(Path::new("/staging"), &staged).unwrap(), MountCheck::Ours(_)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum MountSource {
    /// The filesystem on this block device, mounted at its root: mountinfo
    /// shows the device's `st_rdev` as `major:minor` and `/` as root. What
    /// NodeStage of a formatted device leaves. Known before mounting (from
    /// [`DeviceNumber::of_block_device`] or a loop device's info). Not for
    /// btrfs, whose mounts show an anonymous device number: record
    /// [`MountSource::of_mount`] of the new mount instead.
    Device(DeviceNumber),
    /// A bind mount: the mounted filesystem (`major:minor`) and the
    /// directory or file inside it that is the mount's root. What binding a
    /// directory leaves (hostpath volumes, NodePublish of a staged
    /// filesystem). Get it before binding with
    /// [`Mounter::bind_source`](crate::Mounter::bind_source).
    Bind {
        /// Device number of the filesystem, as mountinfo shows it.
        device: DeviceNumber,
        /// Mountinfo root: the source's path inside that filesystem.
        root: PathBuf,
    },
    /// A bind mount of a block device node (raw block NodePublish): what is
    /// at the path is a block device with this `st_rdev`.
    DeviceNode(DeviceNumber),
}

impl MountSource {
    /// The exact identity of an existing mount (device and root); matches
    /// that mount and binds of the same directory.
    pub fn of_mount(info: &MountInfo) -> MountSource {
        MountSource::Bind {
            device: info.device(),
            root: info.root.clone(),
        }
    }

    /// Whether `info` (with `device_node`, the block device node the mount
    /// shows, if any) is this source.
    pub fn matches(&self, info: &MountInfo, device_node: Option<DeviceNumber>) -> bool {
        match self {
            MountSource::Device(d) => info.device() == *d && info.root == Path::new("/"),
            MountSource::Bind { device, root } => info.device() == *device && info.root == *root,
            MountSource::DeviceNode(d) => device_node == Some(*d),
        }
    }
}

impl fmt::Display for MountSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MountSource::Device(d) => write!(f, "filesystem of device {d}"),
            MountSource::Bind { device, root } => {
                write!(f, "bind of {} on device {device}", root.display())
            }
            MountSource::DeviceNode(d) => write!(f, "block device node {d}"),
        }
    }
}

/// What [`Mounter::check_mounted`](crate::Mounter::check_mounted) found at a
/// path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountCheck {
    /// Nothing is mounted there (or the path does not exist).
    NotMounted,
    /// The topmost mount there is the expected one.
    Ours(MountInfo),
    /// Something else is mounted there: leave it alone.
    Foreign(MountInfo),
}

impl MountCheck {
    /// Whether it is [`MountCheck::Ours`].
    pub fn is_ours(&self) -> bool {
        matches!(self, MountCheck::Ours(_))
    }
}

/// Space and inode usage of a filesystem (`statvfs`), as
/// NodeGetVolumeStats reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FsUsage {
    /// Size of the filesystem in bytes.
    pub total_bytes: u64,
    /// Bytes in use.
    pub used_bytes: u64,
    /// Bytes an unprivileged user can still allocate (less than total minus
    /// used when blocks are reserved for root).
    pub available_bytes: u64,
    /// Number of inodes.
    pub total_inodes: u64,
    /// Inodes in use.
    pub used_inodes: u64,
    /// Inodes free.
    pub free_inodes: u64,
}

impl FsUsage {
    // fsblkcnt_t and friends are u32 on some targets.
    #[allow(clippy::unnecessary_cast)]
    pub(crate) fn from_statvfs(st: &nix::sys::statvfs::Statvfs) -> FsUsage {
        let frsize = st.fragment_size() as u64;
        let (blocks, bfree) = (st.blocks() as u64, st.blocks_free() as u64);
        let (files, ffree) = (st.files() as u64, st.files_free() as u64);
        FsUsage {
            total_bytes: blocks * frsize,
            used_bytes: blocks.saturating_sub(bfree) * frsize,
            available_bytes: st.blocks_available() as u64 * frsize,
            total_inodes: files,
            used_inodes: files.saturating_sub(ffree),
            free_inodes: ffree,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(line: &str) -> MountInfo {
        MountInfo::parse_line(line.as_bytes()).unwrap()
    }

    #[test]
    fn matching_rules() {
        let staged = entry("30 1 7:3 / /staging rw - ext4 /dev/loop3 rw");
        let bind = entry("31 1 7:3 / /pods/a rw - ext4 /dev/loop3 rw");
        let sub = entry("32 1 7:3 /sub /pods/b rw - ext4 /dev/loop3 rw");
        let node = entry("33 1 0:5 /loop3 /pods/c rw - devtmpfs udev rw");
        let dev = MountSource::Device(DeviceNumber::new(7, 3));
        assert!(dev.matches(&staged, None) && dev.matches(&bind, None));
        assert!(!dev.matches(&sub, None));
        let b = MountSource::of_mount(&staged);
        assert!(b.matches(&bind, None) && !b.matches(&sub, None));
        let n = MountSource::DeviceNode(DeviceNumber::new(7, 3));
        assert!(n.matches(&node, Some(DeviceNumber::new(7, 3))));
        assert!(!n.matches(&node, Some(DeviceNumber::new(7, 4))));
        assert!(!n.matches(&staged, None));
        assert_eq!(dev.to_string(), "filesystem of device 7:3");
        assert_eq!(
            MountSource::of_mount(&sub).to_string(),
            "bind of /sub on device 7:3"
        );
        assert_eq!(n.to_string(), "block device node 7:3");
    }

    #[test]
    fn usage_from_statvfs() {
        let st = nix::sys::statvfs::statvfs("/").unwrap();
        let u = FsUsage::from_statvfs(&st);
        assert!(u.total_bytes >= u.used_bytes);
        assert!(u.total_bytes >= u.available_bytes);
        assert_eq!(u.total_inodes, u.used_inodes + u.free_inodes);
    }
}
