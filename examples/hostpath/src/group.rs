//! Write-order consistent group snapshots (csi-controller's service serves
//! the GroupController RPCs; this is the cut).
//!
//! The spec requires a group snapshot to be write-order consistent or to
//! fail. All volumes live on the state directory's filesystem, so freezing
//! it (FIFREEZE) stops every writer at one point in time while the members
//! are copied to the snapshot directory on another filesystem. The service
//! is offered only when that is possible: a dedicated filesystem for
//! `--statedir` (the root filesystem is never frozen) and a `--snapshotdir`
//! elsewhere.

use csi_controller::{SnapshotRecord, VolumeRecord};
use csi_server::{CsiError, CsiResult};
use mount_utils::freeze::FrozenFilesystem;

use crate::backend::Backend;

/// Copies every member while the volumes' filesystem is frozen: writes from
/// pods block for the duration, so the copies are one point in time. Nothing
/// here may write to the frozen filesystem (records are saved after the
/// thaw; copies go to the snapshot directory on another filesystem).
pub fn cut_consistently(
    backend: &Backend,
    plan: &[(SnapshotRecord, VolumeRecord)],
) -> CsiResult<()> {
    let frozen = FrozenFilesystem::freeze(backend.root()).map_err(|e| {
        CsiError::FailedPrecondition(format!("cannot freeze the volumes' filesystem: {e}"))
    })?;
    for (i, (snap, _)) in plan.iter().enumerate() {
        if let Err(e) = backend.snapshot(&snap.source_volume_id, &snap.id, snap.access) {
            drop(frozen);
            // Partial failure: remove what was cut (the spec's SHOULD).
            for (done, _) in &plan[..i] {
                let _ = backend.delete_snapshot(&done.id, done.access);
            }
            return Err(e);
        }
    }
    frozen
        .thaw()
        .map_err(|e| CsiError::Internal(format!("thawing the volumes' filesystem: {e}")))
}
