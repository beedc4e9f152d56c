//! Where a call learns about mounts: the whole table or one path at a time.

use std::path::Path;

use mount_utils::{MountInfo, MountSource, Mounter};

use crate::error::NodeError;
use crate::observe::{
    Identities, PathFacts, bind_of, bind_within, facts_of, mounts_at, normalize, resolve,
};

/// Where a call learns about mounts: the whole table, read once (unstage
/// needs it to find every use of a volume; startup reads it once for all),
/// or the mounter asked about one path at a time (`Mounter::mounts_at`,
/// `Mounter::containing_mount`), which on Linux reads only those mounts
/// instead of formatting and parsing every mount in the namespace.
pub(super) enum View<'a> {
    Table(&'a [MountInfo]),
    Paths(&'a dyn Mounter),
}

impl View<'_> {
    /// The mounts stacked at `path`, bottom first.
    pub(super) fn at(&self, path: &Path) -> Result<Vec<MountInfo>, NodeError> {
        match self {
            View::Table(table) => Ok(mounts_at(table, path).into_iter().cloned().collect()),
            View::Paths(mounter) => mounter
                .mounts_at(&resolve(path))
                .map_err(|e| NodeError::mount("reading the mounts at", path, &e)),
        }
    }

    /// What a bind mount of `path` shows ([`bind_of`]).
    pub(super) fn bind_of(&self, path: &Path) -> Result<Option<MountSource>, NodeError> {
        match self {
            View::Table(table) => Ok(bind_of(table, path)),
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
