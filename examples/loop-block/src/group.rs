//! Write-order consistent group snapshots (csi-controller's service serves
//! the GroupController RPCs; this is the cut).
//!
//! The spec requires a group snapshot to be write-order consistent or to
//! fail. A member nobody has attached has no writer: its backing file is
//! copied as it is. A member in use through a filesystem (mount access,
//! staged on this host) is frozen (FIFREEZE on its staging mount): that
//! flushes what pods wrote through the loop device into the backing file
//! and blocks further writes until the thaw. Every member is frozen before
//! the first copy and thawed after the last, so all copies are one point in
//! time. A member attached as a raw block device cannot be frozen (no
//! filesystem of ours is on it), so a group including one is refused with
//! FAILED_PRECONDITION, as is any member attached without its filesystem
//! mounted where the record says.

use std::path::PathBuf;

use csi_controller::{SnapshotRecord, VolumeRecord};
use csi_server::{CsiError, CsiResult};
use mount_utils::freeze::FrozenFilesystem;

use crate::backend::Backend;

/// How a member is written to right now.
enum Writer {
    /// Not attached: nothing can write to it.
    Nobody,
    /// Through the filesystem mounted at this staging path.
    Filesystem(PathBuf),
}

impl Backend {
    /// Who writes to volume `id` and how to stop them, or why nobody can
    /// be stopped. Its loop devices come from the seam ([`Backend::loops`]).
    fn writer_of(&self, id: &str) -> CsiResult<Writer> {
        let image = self.volume_path(id);
        let devices = (self.loops.find_by_backing_file(&image))
            .map_err(|e| CsiError::Internal(format!("looking up loop devices: {e}")))?;
        let Some(device) = devices.first() else {
            return Ok(Writer::Nobody);
        };
        let Some(node) = self.node.get() else {
            // `--mode controller`: the node that attached it is another process.
            return Err(CsiError::FailedPrecondition(format!(
                "volume {} is attached by a node this controller cannot freeze; \
                 a group snapshot of it would not be write-order consistent",
                id
            )));
        };
        let stage = node.record(id).and_then(|r| r.stage);
        let Some(staged) = stage.filter(|s| !s.capability.is_block()) else {
            return Err(CsiError::FailedPrecondition(format!(
                "volume {} is attached as a raw block device, which cannot be frozen: \
                 a group snapshot of it would not be write-order consistent",
                id
            )));
        };
        // The staging path must be the filesystem on this very device.
        if !mounted_from(&staged.path, device) {
            return Err(CsiError::FailedPrecondition(format!(
                "volume {} is attached but its filesystem is not mounted at {}; cannot freeze it",
                id,
                staged.path.display()
            )));
        }
        Ok(Writer::Filesystem(staged.path))
    }
}

/// Whether the filesystem at `path` lives on block device `device`.
fn mounted_from(path: &std::path::Path, device: &std::path::Path) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    match (std::fs::metadata(path), std::fs::metadata(device)) {
        (Ok(at), Ok(dev)) => dev.file_type().is_block_device() && at.dev() == dev.rdev(),
        _ => false,
    }
}

/// Freezes every member in use, copies every member, thaws; the caller
/// holds the attachments exclusively, so no member gets attached or
/// detached meanwhile. Copies go to the state directory,
/// never to a frozen filesystem; a failure removes the copies already made.
pub fn cut_consistently(
    backend: &Backend,
    members: &[(SnapshotRecord, VolumeRecord)],
) -> CsiResult<()> {
    let mut frozen = Vec::new();
    for (snap, volume) in members {
        if let Writer::Filesystem(staging) = backend.writer_of(&volume.id)? {
            let f = crash_points::effect("freeze", || FrozenFilesystem::freeze(&staging)).map_err(
                |e| {
                    CsiError::FailedPrecondition(format!(
                        "cannot freeze the filesystem of volume {}: {e}",
                        snap.source_volume_id
                    ))
                },
            )?;
            frozen.push(f);
        }
    }
    for (i, (snap, _)) in members.iter().enumerate() {
        if let Err(e) = backend.snapshot(&snap.source_volume_id, &snap.id) {
            drop(frozen);
            for (done, _) in &members[..i] {
                let _ = backend.remove_snapshot(&done.id);
            }
            return Err(e);
        }
    }
    for f in frozen {
        crash_points::effect("thaw", || f.thaw())
            .map_err(|e| CsiError::Internal(format!("thawing a member's filesystem: {e}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use mount_utils::{FakeLoopDevices, LoopOptions};

    use super::*;

    /// The cut asks the LoopDevices seam which members are attached: a fake
    /// device is seen, and /sys (the host's own loop devices) is never read.
    #[test]
    fn a_members_writer_is_found_through_the_loop_devices_seam() {
        let dir = tempfile::tempdir().unwrap();
        let loops = Arc::new(FakeLoopDevices::new());
        let backend = Backend::new(dir.path(), loops.clone()).unwrap();
        let id = csi_controller::IdKind::Volume.generate();
        backend.create(&id, 1 << 20).unwrap();
        assert!(matches!(backend.writer_of(&id), Ok(Writer::Nobody)));
        loops.attach_existing(backend.volume_path(&id), &LoopOptions::default());
        match backend.writer_of(&id) {
            Err(CsiError::FailedPrecondition(why)) => {
                assert!(why.contains("cannot freeze"), "{why}");
            }
            other => panic!("attached without a node record: {:?}", other.err()),
        }
    }
}
