//! Identifying a mount by what is mounted, not by its path.
//!
//! A path alone says nothing after a reboot: the directory survives, the
//! mount does not, and a device name may now belong to another volume. The
//! node reconciler records the [`MountIdentity`] of every stage and publish
//! in the [journal](crate::journal); reconstruction trusts a mount found
//! after a restart only when the same source is mounted there again.

use std::fmt::Debug;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What is mounted at a path, as mountinfo shows it, and in which boot.
///
/// Device numbers and names are only stable within one boot: after a
/// reboot `/dev/sdb` (8:16) may be another disk. The boot id makes every
/// source recorded before a reboot differ from anything found after it,
/// so nothing mounted then is trusted now. Within one boot a filesystem
/// replaced by an identical-looking one (same device number, which
/// anonymous devices such as tmpfs reuse) cannot be told apart.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MountIdentity {
    /// `major:minor` of the mounted filesystem's device.
    pub device: (u32, u32),
    /// Directory of that filesystem mounted here (`/` unless a bind mount
    /// of a subdirectory).
    pub root: PathBuf,
    /// Filesystem type.
    pub fs_type: String,
    /// Mount source (device path, `server:/export`, or a pseudo name).
    pub source: String,
    /// The kernel's boot id (`/proc/sys/kernel/random/boot_id`), if known.
    pub boot_id: Option<String>,
}

/// What a restart-time scan found at a path of a [`DiscoveredMount`](crate::node::DiscoveredMount).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum MountEvidence {
    /// Not looked at: the path is taken to be a mount of the volume, but not
    /// trusted enough to skip stage or publish.
    #[default]
    Unchecked,
    /// Nothing is mounted there (a directory left over, e.g. after a reboot).
    NotMounted,
    /// The caller verified that this volume is mounted there: it is neither
    /// staged nor published again.
    Verified,
    /// This is mounted there. Trusted (as [`Verified`](Self::Verified)) only
    /// if the journal recorded the same source for the path; a different
    /// source means another volume's mount and is never used.
    Mounted(MountIdentity),
}

impl MountEvidence {
    /// Looks `path` up in `table`; a lookup error leaves it unchecked.
    pub fn of(table: &dyn MountTable, path: &Path) -> Self {
        match table.source_at(path) {
            Ok(Some(source)) => MountEvidence::Mounted(source),
            Ok(None) => MountEvidence::NotMounted,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "mount table lookup failed");
                MountEvidence::Unchecked
            }
        }
    }

    /// Whether the scan saw no mount of this volume there (nothing, or
    /// something else).
    pub(crate) fn is_absent(&self, recorded: Option<&MountIdentity>) -> bool {
        match self {
            MountEvidence::NotMounted => true,
            MountEvidence::Mounted(source) => recorded.is_some_and(|r| r != source),
            MountEvidence::Unchecked | MountEvidence::Verified => false,
        }
    }

    /// Whether the mount is this volume's beyond doubt.
    pub(crate) fn is_verified(&self, recorded: Option<&MountIdentity>) -> bool {
        match self {
            MountEvidence::Verified => true,
            MountEvidence::Mounted(source) => recorded == Some(source),
            MountEvidence::Unchecked | MountEvidence::NotMounted => false,
        }
    }

    /// Whether a different source than the recorded one is mounted there.
    pub(crate) fn is_mismatch(&self, recorded: Option<&MountIdentity>) -> bool {
        matches!((self, recorded), (MountEvidence::Mounted(s), Some(r)) if s != r)
    }
}

/// Looks up what is mounted at a path.
pub trait MountTable: Debug + Send + Sync {
    /// The topmost mount at exactly `path`, or `None` if `path` is not a
    /// mount point.
    fn source_at(&self, path: &Path) -> std::io::Result<Option<MountIdentity>>;
}

#[cfg(feature = "testing")]
pub use fake::FakeMountTable;

#[cfg(feature = "testing")]
mod fake {
    use std::collections::BTreeMap;
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;

    use super::{MountIdentity, MountTable};

    /// An in-memory [`MountTable`] for tests.
    #[derive(Debug, Default)]
    pub struct FakeMountTable {
        mounts: Mutex<BTreeMap<PathBuf, MountIdentity>>,
    }

    impl FakeMountTable {
        /// An empty table.
        pub fn new() -> Self {
            Self::default()
        }

        /// Mounts `source` at `path` (replacing what was there).
        pub fn mount(&self, path: impl Into<PathBuf>, source: MountIdentity) {
            self.lock().insert(path.into(), source);
        }

        /// Unmounts `path`; returns whether something was mounted.
        pub fn unmount(&self, path: &Path) -> bool {
            self.lock().remove(path).is_some()
        }

        /// Unmounts everything (a reboot).
        pub fn clear(&self) {
            self.lock().clear()
        }

        fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<PathBuf, MountIdentity>> {
            self.mounts.lock().unwrap_or_else(|e| e.into_inner())
        }
    }

    impl MountTable for FakeMountTable {
        fn source_at(&self, path: &Path) -> std::io::Result<Option<MountIdentity>> {
            Ok(self.lock().get(path).cloned())
        }
    }
}

#[cfg(feature = "mountinfo")]
pub use mounter_table::{MounterTable, current_boot_id};

#[cfg(feature = "mountinfo")]
mod mounter_table {
    use std::path::Path;

    use mount_utils::{LinuxMounter, Mounter};

    use super::{MountIdentity, MountTable};

    impl MountIdentity {
        /// The source of a mountinfo line, seen in boot `boot_id`.
        pub fn from_mountinfo(info: &mount_utils::MountInfo, boot_id: Option<String>) -> Self {
            MountIdentity {
                device: (info.major, info.minor),
                root: info.root.clone(),
                fs_type: info.fs_type.clone(),
                source: info.source.clone(),
                boot_id,
            }
        }
    }

    /// The running kernel's boot id, if readable.
    pub fn current_boot_id() -> Option<String> {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .ok()
            .map(|id| id.trim().to_owned())
            .filter(|id| !id.is_empty())
    }

    /// The mount table a mount-utils [`Mounter`] reads: by default
    /// [`LinuxMounter`], the calling thread's `/proc/thread-self/mountinfo`;
    /// sources carry the current boot id.
    #[derive(Debug, Clone)]
    pub struct MounterTable<M = LinuxMounter> {
        mounter: M,
        boot_id: Option<String>,
    }

    impl Default for MounterTable {
        fn default() -> Self {
            Self::with_mounter(LinuxMounter::new())
        }
    }

    impl MounterTable {
        /// The calling thread's mount table.
        pub fn new() -> Self {
            Self::default()
        }
    }

    impl<M> MounterTable<M> {
        /// The table `mounter` reads (e.g. mount-utils' fake).
        pub fn with_mounter(mounter: M) -> Self {
            Self {
                mounter,
                boot_id: current_boot_id(),
            }
        }

        /// Stamps sources with `boot_id` instead of the kernel's (tests of
        /// a reboot, or an id kept elsewhere).
        pub fn with_boot_id(mut self, boot_id: impl Into<String>) -> Self {
            self.boot_id = Some(boot_id.into());
            self
        }
    }

    impl<M: Mounter + std::fmt::Debug> MountTable for MounterTable<M> {
        fn source_at(&self, path: &Path) -> std::io::Result<Option<MountIdentity>> {
            // mountinfo lists canonical paths; a missing path is not mounted.
            let path = match std::fs::canonicalize(path) {
                Ok(p) => p,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(e),
            };
            // The mounts at this path alone (statmount on Linux), not the
            // whole table once per volume; the topmost is what shows.
            let mounts = self
                .mounter
                .mounts_at(&path)
                .map_err(std::io::Error::other)?;
            Ok(mounts
                .last()
                .map(|m| MountIdentity::from_mountinfo(m, self.boot_id.clone())))
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn finds_the_proc_mount_and_nothing_on_plain_or_missing_paths() {
            let table = MounterTable::new();
            let proc = table.source_at(Path::new("/proc")).unwrap().unwrap();
            assert_eq!(proc.fs_type, "proc");
            assert_eq!(proc.boot_id, current_boot_id());
            assert!(proc.boot_id.is_some());
            let rebooted = MounterTable::new().with_boot_id("another boot");
            assert_ne!(rebooted.source_at(Path::new("/proc")).unwrap(), Some(proc));
            let dir = tempfile::tempdir().unwrap();
            assert_eq!(table.source_at(dir.path()).unwrap(), None);
            assert_eq!(table.source_at(Path::new("/does/not/exist")).unwrap(), None);
        }
    }
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use super::*;

    fn source(minor: u32) -> MountIdentity {
        MountIdentity {
            device: (8, minor),
            root: "/".into(),
            fs_type: "ext4".into(),
            source: format!("/dev/sd{minor}"),
            boot_id: None,
        }
    }

    #[test]
    fn checks_compare_with_the_recorded_source() {
        let table = FakeMountTable::new();
        table.mount("/a", source(1));
        let found = MountEvidence::of(&table, Path::new("/a"));
        assert_eq!(found, MountEvidence::Mounted(source(1)));
        assert_eq!(
            MountEvidence::of(&table, Path::new("/b")),
            MountEvidence::NotMounted
        );
        assert!(found.is_verified(Some(&source(1))));
        assert!(!found.is_verified(None), "nothing recorded: not verified");
        assert!(!found.is_verified(Some(&source(2))));
        assert!(found.is_mismatch(Some(&source(2))));
        assert!(found.is_absent(Some(&source(2))));
        assert!(!found.is_absent(None));
        assert!(MountEvidence::Verified.is_verified(None));
        assert!(MountEvidence::NotMounted.is_absent(None));
        assert!(!MountEvidence::Unchecked.is_absent(Some(&source(1))));
        assert!(!MountEvidence::Unchecked.is_verified(Some(&source(1))));
        assert!(table.unmount(Path::new("/a")));
        table.mount("/c", source(3));
        table.clear();
        assert_eq!(table.source_at(Path::new("/c")).unwrap(), None);
    }
}
