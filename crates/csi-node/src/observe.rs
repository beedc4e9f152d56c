//! What is at a path, as plain data: the file type (never following a
//! symlink) and the mounts there, each classified as this volume's or not by
//! its device and root in mountinfo, never by its source string (anyone can
//! name a tmpfs `/dev/loop3`).

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use mount_utils::{DeviceNumber, MountInfo, MountSource};

use crate::record::Device;

/// The file at a path, from `lstat` (a symlink is reported, not followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathKind {
    /// Nothing there.
    Absent,
    /// A directory.
    Directory,
    /// A regular file of this many bytes.
    File {
        /// Its size.
        len: u64,
    },
    /// A symbolic link.
    Symlink,
    /// A block device node (a published raw block volume shows as one).
    BlockDevice,
    /// Anything else (socket, fifo, character device).
    Other,
    /// `lstat` failed for another reason than absence (a dead FUSE mount,
    /// a stale NFS handle).
    Inaccessible,
}

impl PathKind {
    /// `lstat` of `path`, from the attributes the kernel has cached
    /// (mount-utils' `nofollow::lstat_cached`): a mount whose server or
    /// FUSE daemon does not answer is still seen, and can be unmounted.
    pub fn of(path: &Path) -> PathKind {
        use nix::sys::stat::SFlag;
        match mount_utils::nofollow::lstat_cached(path) {
            Ok(st) => match SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT {
                SFlag::S_IFLNK => PathKind::Symlink,
                SFlag::S_IFDIR => PathKind::Directory,
                SFlag::S_IFREG => PathKind::File {
                    len: st.st_size as u64,
                },
                SFlag::S_IFBLK => PathKind::BlockDevice,
                _ => PathKind::Other,
            },
            Err(nix::errno::Errno::ENOENT) => PathKind::Absent,
            Err(_) => PathKind::Inaccessible,
        }
    }
}

/// What a filesystem mounted from `device` shows in mountinfo.
pub fn filesystem_on(device: &Device) -> MountSource {
    MountSource::Device(DeviceNumber::new(device.major, device.minor))
}

/// What a bind mount of `path` shows in mountinfo, read from a table
/// already in hand: the topmost of the deepest mounts containing `path`,
/// rooted at `path` within it. Unlike `Mounter::bind_source`, a device node
/// gets this `Bind` form too, which is how binds of it appear in the table.
pub fn bind_of(table: &[MountInfo], path: &Path) -> Option<MountSource> {
    let path = normalize(path);
    let (_, base) = table
        .iter()
        .enumerate()
        .filter(|(_, m)| path.starts_with(&m.mount_point))
        .max_by_key(|(i, m)| (m.mount_point.components().count(), *i))?;
    bind_within(base, &path)
}

/// What a bind mount of `path` shows, given `base`, the mount `path` is on
/// (see [`bind_of`]).
pub fn bind_within(base: &MountInfo, path: &Path) -> Option<MountSource> {
    let rel = path.strip_prefix(&base.mount_point).ok()?;
    let root = if rel.as_os_str().is_empty() {
        base.root.clone()
    } else {
        base.root.join(rel)
    };
    Some(MountSource::Bind {
        device: base.device(),
        root,
    })
}

/// What identifies one volume's mounts, from its record and from the
/// driver's locator.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identities {
    /// What mounts that show this volume look like in mountinfo.
    pub ids: Vec<MountSource>,
    /// Its loop devices now attached (found by backing file); NodeUnstage
    /// detaches them.
    pub devices: Vec<Device>,
    /// The device the controller attached, when it is present now; the
    /// node never detaches it.
    pub attached: Option<Device>,
    /// Ids of mounts this plugin made for the volume (a filesystem mounted
    /// by type and source): such a mount is the volume's wherever it is.
    pub mount_ids: Vec<u32>,
    /// Its source directory: a mount exactly there is the volume's own
    /// filesystem, not a use of it.
    pub directory: Option<PathBuf>,
}

impl Identities {
    /// The volume's block device: its loop device or the attached one.
    pub fn device(&self) -> Option<&Device> {
        self.devices.first().or(self.attached.as_ref())
    }

    /// Whether the mount `entry` shows this volume.
    pub fn owns(&self, entry: &MountInfo) -> bool {
        self.mount_ids.contains(&entry.mount_id) || self.ids.iter().any(|s| s.matches(entry, None))
    }

    /// Whether a mount with this id and device may show this volume: what
    /// [`owns`](Self::owns) needs of an entry before the rest is parsed.
    pub fn may_own(&self, mount_id: u32, device: DeviceNumber) -> bool {
        self.mount_ids.contains(&mount_id)
            || self.ids.iter().any(|s| match s {
                MountSource::Device(d) | MountSource::Bind { device: d, .. } => *d == device,
                // `owns` knows no device node, so this never matches there.
                MountSource::DeviceNode(_) => false,
            })
    }

    /// Mount points in `table` that show this volume, other than `except`
    /// and the source directory itself: its uses.
    pub fn uses<'a>(&self, table: &'a [MountInfo], except: &Path) -> Vec<&'a Path> {
        let mut out: Vec<&Path> = table
            .iter()
            .filter(|m| self.owns(m))
            .map(|m| m.mount_point.as_path())
            .filter(|p| *p != except && Some(*p) != self.directory.as_deref())
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

/// Who a mount at a path belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// It shows the volume the call is about.
    ThisVolume,
    /// Anything else: another volume, a foreign filesystem, unknown.
    Other,
}

/// A path as the rules see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathFacts {
    /// The file there.
    pub kind: PathKind,
    /// The mounts stacked there, bottom first, classified.
    pub mounts: Vec<Owner>,
}

impl PathFacts {
    /// Nothing there, nothing mounted.
    pub fn absent() -> Self {
        PathFacts {
            kind: PathKind::Absent,
            mounts: Vec::new(),
        }
    }

    /// Whether something not of this volume is mounted there.
    pub fn has_foreign_mount(&self) -> bool {
        self.mounts.contains(&Owner::Other)
    }

    /// Whether this volume is mounted there (and nothing else).
    pub fn is_ours(&self) -> bool {
        !self.mounts.is_empty() && !self.has_foreign_mount()
    }

    /// Whether nothing is mounted there.
    pub fn unmounted(&self) -> bool {
        self.mounts.is_empty()
    }
}

/// The mounts at `path` in `table`, bottom first.
pub fn mounts_at<'a>(table: &'a [MountInfo], path: &Path) -> Vec<&'a MountInfo> {
    let resolved = resolve(path);
    table.iter().filter(|m| m.mount_point == resolved).collect()
}

/// Looks at `path`: its kind and its mounts classified against `volume`.
pub fn facts(table: &[MountInfo], path: &Path, volume: &Identities) -> PathFacts {
    facts_of(path, mounts_at(table, path), volume)
}

/// Looks at `path`, given the mounts stacked there (bottom first).
pub fn facts_of<'a>(
    path: &Path,
    here: impl IntoIterator<Item = &'a MountInfo>,
    volume: &Identities,
) -> PathFacts {
    PathFacts {
        kind: PathKind::of(path),
        mounts: here
            .into_iter()
            .map(|m| {
                if volume.owns(m) {
                    Owner::ThisVolume
                } else {
                    Owner::Other
                }
            })
            .collect(),
    }
}

/// How `path` appears in mountinfo: its parent with symlinks resolved (the
/// kernel reports resolved paths), its last component as given.
pub fn resolve(path: &Path) -> PathBuf {
    resolve_with(path, resolve_dir)
}

/// [`resolve`], with the parent's resolved form from `dir` (which a
/// caller asking about many paths in a few directories can remember).
pub(crate) fn resolve_with(path: &Path, dir: impl FnOnce(&Path) -> Option<PathBuf>) -> PathBuf {
    let path = normalize(path);
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => match dir(parent) {
            Some(p) if p == parent => path,
            Some(p) => p.join(name),
            None => path,
        },
        _ => path,
    }
}

/// A directory with symlinks resolved (`None` when it cannot be).
pub(crate) fn resolve_dir(dir: &Path) -> Option<PathBuf> {
    // A directory reached without a symlink is its own canonical form:
    // one openat2 instead of realpath's readlink per component.
    if mount_utils::nofollow::open(dir).is_ok() {
        return Some(dir.to_owned());
    }
    std::fs::canonicalize(dir).ok()
}

/// Lexical normalisation: drops `.` and trailing `/`, resolves `..`.
pub use mount_utils::nofollow::normalize;

/// Whether `path`, after symlinks (this only looks), is a block device
/// node of `device`.
pub fn shows_device(path: &Path, device: &Device) -> bool {
    std::fs::metadata(path).is_ok_and(|m| {
        m.file_type().is_block_device()
            && (
                nix::sys::stat::major(m.rdev()) as u32,
                nix::sys::stat::minor(m.rdev()) as u32,
            ) == (device.major, device.minor)
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn entry(id: u32, dev: (u32, u32), root: &str, at: &str, source: &str) -> MountInfo {
        MountInfo {
            mount_id: id,
            parent_id: 1,
            major: dev.0,
            minor: dev.1,
            root: root.into(),
            mount_point: at.into(),
            mount_options: vec!["rw".into()],
            optional_fields: vec![],
            fs_type: "ext4".into(),
            source: source.into(),
            super_options: vec![],
        }
    }

    #[test]
    fn bind_identity_follows_the_deepest_topmost_mount() {
        let table = vec![
            entry(1, (8, 1), "/", "/", "/dev/sda1"),
            entry(2, (0, 5), "/", "/dev", "devtmpfs"),
            entry(3, (8, 2), "/", "/var/lib", "/dev/sda2"),
            entry(4, (8, 3), "/", "/var/lib", "/dev/sda3"),
        ];
        let id = bind_of(&table, Path::new("/var/lib/vols/v1/")).unwrap();
        let bind = |major, minor, root: &str| MountSource::Bind {
            device: DeviceNumber::new(major, minor),
            root: root.into(),
        };
        assert_eq!(id, bind(8, 3, "/vols/v1"));
        let node = bind_of(&table, Path::new("/dev/loop3")).unwrap();
        assert_eq!(node, bind(0, 5, "/loop3"));
        assert_eq!(bind_of(&[], Path::new("/x")), None);
    }

    #[test]
    fn ownership_is_by_device_and_root_not_by_source_name() {
        let loop3 = Device {
            path: "/dev/loop3".into(),
            major: 7,
            minor: 3,
        };
        let volume = Identities {
            ids: vec![filesystem_on(&loop3)],
            devices: vec![loop3],
            attached: None,
            mount_ids: Vec::new(),
            directory: None,
        };
        let ours = entry(10, (7, 3), "/", "/staging", "/dev/loop3");
        let spoof = entry(11, (0, 44), "/", "/staging", "/dev/loop3");
        let subdir = entry(12, (7, 3), "/lost+found", "/t", "/dev/loop3");
        assert!(volume.owns(&ours));
        assert!(
            !volume.owns(&spoof),
            "a tmpfs named like the device is not the device"
        );
        assert!(
            !volume.owns(&subdir),
            "a bind of a subdirectory is not the volume"
        );
        let table = vec![
            ours.clone(),
            entry(13, (7, 3), "/", "/pods/a", "/dev/loop3"),
        ];
        assert_eq!(
            volume.uses(&table, Path::new("/staging")),
            vec![Path::new("/pods/a")]
        );
        // What the table is filtered with before parsing keeps every entry
        // `owns` takes, and the mounts this plugin made by id.
        let by_id = Identities {
            mount_ids: vec![11],
            ..volume.clone()
        };
        for e in [&ours, &spoof, &subdir] {
            assert!(!volume.owns(e) || volume.may_own(e.mount_id, e.device()));
            assert!(!by_id.owns(e) || by_id.may_own(e.mount_id, e.device()));
        }
        assert!(by_id.may_own(11, spoof.device()));
        assert!(!volume.may_own(11, spoof.device()));
    }

    #[test]
    fn path_kinds_never_follow_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("dir")).unwrap();
        std::fs::write(d.join("file"), b"data").unwrap();
        std::os::unix::fs::symlink(d.join("dir"), d.join("link")).unwrap();
        assert_eq!(PathKind::of(&d.join("dir")), PathKind::Directory);
        assert_eq!(PathKind::of(&d.join("file")), PathKind::File { len: 4 });
        assert_eq!(PathKind::of(&d.join("link")), PathKind::Symlink);
        assert_eq!(PathKind::of(&d.join("none")), PathKind::Absent);
        assert_eq!(
            resolve(&d.join("x/../dir/")),
            std::fs::canonicalize(d).unwrap().join("dir")
        );
    }
}
