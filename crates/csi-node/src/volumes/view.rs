//! Where a call learns about mounts: the whole table or one path at a time.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use mount_utils::{LoopDevices, MountInfo, MountSource, Mounter};

use crate::error::NodeError;
use crate::observe::{
    Identities, PathFacts, bind_within, facts_of, normalize, resolve, resolve_dir, resolve_with,
};
use crate::observe::{bind_of, mounts_at};
use crate::record::Device;

/// Where a call learns about mounts: the whole table, read once (unstage
/// needs it to find every use of a volume), a [`Snapshot`] of it (a
/// restore reads it once for all volumes), or the mounter asked about one
/// path at a time (`Mounter::mounts_at`, `Mounter::containing_mount`),
/// which on Linux reads only those mounts instead of formatting and
/// parsing every mount in the namespace.
pub(super) enum View<'a> {
    Table(&'a MountIndex),
    Snapshot(&'a Snapshot<'a>),
    Paths(&'a dyn Mounter),
}

/// The mount table read once for many volumes. It stays true for their
/// paths as long as only the reader changes mounts there and says where
/// first ([`changing`](Self::changing)): a path at or below such a place
/// is asked of the mounter from then on, everything else of the table.
/// Calls served meanwhile change mounts only at paths of other volumes
/// (a claim keeps them off the reader's). The same holds for the loop
/// devices of images: listed once, at the first question, and kept true
/// by the reader, who says what it attaches ([`note_attached`](Self::note_attached)).
pub(super) struct Snapshot<'a> {
    table: MountIndex,
    mounter: &'a dyn Mounter,
    changed: Mutex<BTreeSet<PathBuf>>,
    loops: &'a dyn LoopDevices,
    /// Bound devices by backing file; `None` when they could not be
    /// listed (each image is then asked of the seam).
    loop_index: OnceLock<Option<Mutex<LoopIndex>>>,
}

impl<'a> Snapshot<'a> {
    /// Reads the table once, indexed by mount point for the many
    /// questions of a restore.
    pub(super) fn read(
        mounter: &'a dyn Mounter,
        loops: &'a dyn LoopDevices,
    ) -> Result<Self, NodeError> {
        Self::read_as(mounter, loops, MountIndex::new)
    }

    /// Reads the table once for the few questions of one call: each is a
    /// scan, cheaper than indexing thousands of mounts for them.
    pub(super) fn read_for_call(
        mounter: &'a dyn Mounter,
        loops: &'a dyn LoopDevices,
    ) -> Result<Self, NodeError> {
        Self::read_as(mounter, loops, MountIndex::unindexed)
    }

    fn read_as(
        mounter: &'a dyn Mounter,
        loops: &'a dyn LoopDevices,
        index: fn(Vec<MountInfo>) -> MountIndex,
    ) -> Result<Self, NodeError> {
        let table = mounter
            .mount_points()
            .map_err(|e| NodeError::mount("reading", Path::new("the mount table"), &e))?;
        Ok(Snapshot {
            table: index(table),
            mounter,
            changed: Mutex::default(),
            loops,
            loop_index: OnceLock::new(),
        })
    }

    /// The loop devices bound to `image`, from one list of every device,
    /// or `None` when that list could not be read: the caller asks the seam.
    pub(super) fn loop_devices_of(&self, image: &Path) -> Option<Vec<Device>> {
        let index = self.loop_index()?.lock().unwrap_or_else(|e| e.into_inner());
        Some(index.get(&backing_key(image)).cloned().unwrap_or_default())
    }

    /// The reader attached `device` to `image`.
    pub(super) fn note_attached(&self, image: &Path, device: &Device) {
        if let Some(index) = self.loop_index() {
            let mut index = index.lock().unwrap_or_else(|e| e.into_inner());
            index
                .entry(backing_key(image))
                .or_default()
                .push(device.clone());
        }
    }

    fn loop_index(&self) -> Option<&Mutex<LoopIndex>> {
        let index = self.loop_index.get_or_init(|| {
            let bound = self.loops.attached().ok()?;
            let mut index = LoopIndex::new();
            for info in &bound {
                let key = info.backing_file.clone();
                index.entry(key).or_default().push(Device::of(info));
            }
            Some(Mutex::new(index))
        });
        index.as_ref()
    }

    /// Mounts at or below `path` are about to change: the table no
    /// longer answers for them.
    pub(super) fn changing(&self, path: &Path) {
        let mut changed = self.changed.lock().unwrap_or_else(|e| e.into_inner());
        changed.insert(normalize(path));
        changed.insert(resolve(path));
    }

    /// Whether no mount was said to change since the table was read.
    fn unchanged(&self) -> bool {
        let changed = self.changed.lock().unwrap_or_else(|e| e.into_inner());
        changed.is_empty()
    }

    /// Whether `path` or a directory above it was changed.
    fn is_changed(&self, path: &Path) -> bool {
        let changed = self.changed.lock().unwrap_or_else(|e| e.into_inner());
        if changed.is_empty() {
            return false;
        }
        let (given, resolved) = (normalize(path), resolve(path));
        given
            .ancestors()
            .chain(resolved.ancestors())
            .any(|p| changed.contains(p))
    }

    fn view(&self, path: &Path) -> View<'_> {
        match self.is_changed(path) {
            true => View::Paths(self.mounter),
            false => View::Table(&self.table),
        }
    }
}

/// Bound loop devices by backing file.
type LoopIndex = HashMap<PathBuf, Vec<Device>>;

/// How the kernel names a backing file: by its resolved path.
pub(super) fn backing_key(image: &Path) -> PathBuf {
    std::fs::canonicalize(image).unwrap_or_else(|_| normalize(image))
}

/// The mount table by mount point: a restore asks it about every
/// volume's paths, and a scan of the whole table per question made a
/// restore quadratic in the number of mounts. A call's few questions scan
/// it instead ([`unindexed`](Self::unindexed)).
pub(super) struct MountIndex {
    table: Vec<MountInfo>,
    /// Positions in `table`, in table order (bottom first), by mount point;
    /// `None`: each question scans the table.
    by_point: Option<HashMap<PathBuf, Vec<usize>>>,
    /// Directories resolved while asking (`resolve_dir`): a restore asks
    /// about thousands of paths in a few directories, and resolving each
    /// one's parent again cost an openat2 and a close per path. The table
    /// is read once for the same span of time.
    dirs: Mutex<HashMap<PathBuf, Option<PathBuf>>>,
}

impl MountIndex {
    pub(super) fn new(table: Vec<MountInfo>) -> Self {
        let mut by_point: HashMap<PathBuf, Vec<usize>> = HashMap::with_capacity(table.len());
        for (i, m) in table.iter().enumerate() {
            by_point.entry(m.mount_point.clone()).or_default().push(i);
        }
        MountIndex {
            table,
            by_point: Some(by_point),
            dirs: Mutex::default(),
        }
    }

    /// The table as it is, each question a scan of it.
    pub(super) fn unindexed(table: Vec<MountInfo>) -> Self {
        MountIndex {
            table,
            by_point: None,
            dirs: Mutex::default(),
        }
    }

    /// [`resolve`], each directory resolved once.
    fn resolve(&self, path: &Path) -> PathBuf {
        resolve_with(path, |dir| {
            let mut dirs = self.dirs.lock().unwrap_or_else(|e| e.into_inner());
            dirs.entry(dir.to_owned())
                .or_insert_with(|| resolve_dir(dir))
                .clone()
        })
    }

    /// [`mounts_at`] of the whole table.
    fn at(&self, path: &Path) -> Vec<MountInfo> {
        let Some(by_point) = &self.by_point else {
            return mounts_at(&self.table, path).into_iter().cloned().collect();
        };
        let resolved = self.resolve(path);
        let found = by_point.get(&resolved).map_or(&[][..], Vec::as_slice);
        found.iter().map(|&i| self.table[i].clone()).collect()
    }

    /// [`bind_of`] of the whole table: the deepest mount point at or
    /// above `path`, topmost there.
    fn bind_of(&self, path: &Path) -> Option<MountSource> {
        let Some(by_point) = &self.by_point else {
            return bind_of(&self.table, path);
        };
        let path = normalize(path);
        let top = path
            .ancestors()
            .find_map(|p| by_point.get(p)?.last().copied())?;
        bind_within(&self.table[top], &path)
    }
}

impl<'a> View<'a> {
    /// A call's view: the mounter asked about each path, or, when each such
    /// question would read the whole table (Linux before 6.8), `table`: the
    /// table read once for the call ([`NodeVolumes::table_for_call`]).
    ///
    /// [`NodeVolumes::table_for_call`]: super::NodeVolumes::table_for_call
    pub(super) fn of_call(mounter: &'a dyn Mounter, table: Option<&'a Snapshot<'a>>) -> Self {
        match table {
            Some(snapshot) => View::Snapshot(snapshot),
            None => View::Paths(mounter),
        }
    }

    /// The whole table as read, when the view holds one no call has
    /// changed yet.
    pub(super) fn whole_table(&self) -> Option<&[MountInfo]> {
        match self {
            View::Table(index) => Some(&index.table),
            View::Snapshot(snapshot) if snapshot.unchanged() => Some(&snapshot.table.table),
            View::Snapshot(_) | View::Paths(_) => None,
        }
    }
}

impl View<'_> {
    /// The mounts stacked at `path`, bottom first.
    pub(super) fn at(&self, path: &Path) -> Result<Vec<MountInfo>, NodeError> {
        match self {
            View::Table(index) => Ok(index.at(path)),
            View::Snapshot(snapshot) => snapshot.view(path).at(path),
            View::Paths(mounter) => mounter
                .mounts_at(&resolve(path))
                .map_err(|e| NodeError::mount("reading the mounts at", path, &e)),
        }
    }

    /// What a bind mount of `path` shows ([`bind_of`]).
    pub(super) fn bind_of(&self, path: &Path) -> Result<Option<MountSource>, NodeError> {
        match self {
            View::Table(index) => Ok(index.bind_of(path)),
            View::Snapshot(snapshot) => snapshot.view(path).bind_of(path),
            View::Paths(mounter) => {
                let path = normalize(path);
                let base = mounter
                    .containing_mount(&path)
                    .map_err(|e| NodeError::mount("reading the mount of", &path, &e))?;
                Ok(base.and_then(|b| bind_within(&b, &path)))
            }
        }
    }

    /// [`facts`] of `path` and the mounts there.
    pub(super) fn facts(
        &self,
        path: &Path,
        ids: &Identities,
    ) -> Result<(PathFacts, Vec<MountInfo>), NodeError> {
        let here = self.at(path)?;
        Ok((facts_of(path, &here, ids), here))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: u32, dev: (u32, u32), root: &str, at: &str) -> MountInfo {
        crate::observe::tests::entry(id, dev, root, at, "/dev/x")
    }

    #[test]
    fn the_index_answers_as_a_scan_of_the_whole_table() {
        let table = vec![
            entry(1, (8, 1), "/", "/"),
            entry(2, (8, 2), "/", "/var/lib"),
            entry(3, (8, 3), "/", "/var/lib"),
            entry(4, (8, 3), "/vols/v1", "/mnt/t1"),
            entry(5, (0, 9), "/", "/mnt/t1"),
            entry(6, (8, 3), "/vols/v2", "/mnt/t2"),
        ];
        let index = MountIndex::new(table.clone());
        let scanned_index = MountIndex::unindexed(table.clone());
        let paths = [
            "/",
            "/var",
            "/var/lib",
            "/var/lib/",
            "/var/lib/vols/v1",
            "/mnt/t1",
            "/mnt/t1/sub",
            "/mnt/t2",
            "/mnt/t3",
            "/mnt/./t2/..",
        ];
        for p in paths.map(Path::new) {
            let scanned: Vec<MountInfo> = mounts_at(&table, p).into_iter().cloned().collect();
            assert_eq!(index.at(p), scanned, "mounts at {}", p.display());
            assert_eq!(scanned_index.at(p), scanned, "mounts at {}", p.display());
            assert_eq!(scanned_index.bind_of(p), bind_of(&table, p));
            assert_eq!(
                index.bind_of(p),
                bind_of(&table, p),
                "bind of {}",
                p.display()
            );
        }
        assert_eq!(
            index.at(Path::new("/mnt/t1")).len(),
            2,
            "stacked, bottom first"
        );
        assert_eq!(MountIndex::new(Vec::new()).bind_of(Path::new("/x")), None);
    }
}
