//! Where a call learns about mounts: the whole table or one path at a time.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use mount_utils::{MountInfo, MountSource, Mounter};

use crate::error::NodeError;
use crate::observe::{
    Identities, PathFacts, bind_of, bind_within, facts_of, mounts_at, normalize, resolve,
};

/// Where a call learns about mounts: the whole table, read once (unstage
/// needs it to find every use of a volume), a [`Snapshot`] of it (a
/// restore reads it once for all volumes), or the mounter asked about one
/// path at a time (`Mounter::mounts_at`, `Mounter::containing_mount`),
/// which on Linux reads only those mounts instead of formatting and
/// parsing every mount in the namespace.
pub(super) enum View<'a> {
    Table(&'a [MountInfo]),
    Snapshot(&'a Snapshot<'a>),
    Paths(&'a dyn Mounter),
}

/// The mount table read once for many volumes. It stays true for their
/// paths as long as only the reader changes mounts there and says where
/// first ([`changing`](Self::changing)): a path at or below such a place
/// is asked of the mounter from then on, everything else of the table.
/// Calls served meanwhile change mounts only at paths of other volumes
/// (a claim keeps them off the reader's).
pub(super) struct Snapshot<'a> {
    table: Vec<MountInfo>,
    mounter: &'a dyn Mounter,
    changed: Mutex<BTreeSet<PathBuf>>,
}

impl<'a> Snapshot<'a> {
    /// Reads the table once.
    pub(super) fn read(mounter: &'a dyn Mounter) -> Result<Self, NodeError> {
        let table = mounter
            .mount_points()
            .map_err(|e| NodeError::mount("reading", Path::new("the mount table"), &e))?;
        Ok(Snapshot {
            table,
            mounter,
            changed: Mutex::default(),
        })
    }

    /// Mounts at or below `path` are about to change: the table no
    /// longer answers for them.
    pub(super) fn changing(&self, path: &Path) {
        let mut changed = self.changed.lock().unwrap_or_else(|e| e.into_inner());
        changed.insert(normalize(path));
        changed.insert(resolve(path));
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

impl View<'_> {
    /// The mounts stacked at `path`, bottom first.
    pub(super) fn at(&self, path: &Path) -> Result<Vec<MountInfo>, NodeError> {
        match self {
            View::Table(table) => Ok(mounts_at(table, path).into_iter().cloned().collect()),
            View::Snapshot(snapshot) => snapshot.view(path).at(path),
            View::Paths(mounter) => mounter
                .mounts_at(&resolve(path))
                .map_err(|e| NodeError::mount("reading the mounts at", path, &e)),
        }
    }

    /// What a bind mount of `path` shows ([`bind_of`]).
    pub(super) fn bind_of(&self, path: &Path) -> Result<Option<MountSource>, NodeError> {
        match self {
            View::Table(table) => Ok(bind_of(table, path)),
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
