//! NodeUnpublishVolume.

use csi_proto::v1::NodeUnpublishVolumeRequest;

use super::{NodeOutcome, NodeVolumes, Part, View, absolute};
use crate::error::NodeError;
use crate::record::NodeVolumeRecord;
use crate::rules::{UnpublishDecision, UnpublishFacts, decide_unpublish};

impl NodeVolumes {
    /// NodeUnpublishVolume: unmounts the target only where it shows this
    /// volume and removes it if empty; a target recorded for another volume,
    /// or holding something else, is NOT_FOUND and left alone.
    pub fn unpublish(&self, req: &NodeUnpublishVolumeRequest) -> Result<NodeOutcome, NodeError> {
        let target = absolute(&req.target_path, "target_path")?;
        let vol = req.volume_id.as_str();
        let _claim = self.claim(vol, &[&target])?;
        let table = self.table_for_call()?;
        let view = View::of_call(self.inner.mounter.as_ref(), table.as_ref());
        let (record, claimed) = self.snapshot(vol, &target);
        // A volume staged here is known, also to a driver that learns its
        // volumes only from the contexts of the request.
        let staged = record.as_ref().is_some_and(|r| r.stage.is_some());
        let known = staged || self.inner.locator.source(vol).is_some();
        let ids = self.identities(vol, record.as_ref(), &view)?;
        let (here, mounts_here) = view.facts(&target, &ids)?;
        let decision = decide_unpublish(
            vol,
            &target,
            &UnpublishFacts {
                known,
                record: record.as_ref().and_then(|r| r.publication(&target)),
                target_claimed_by: claimed.as_deref(),
                target: &here,
            },
        )?;
        let UnpublishDecision::Unpublish { unmount, remove } = decision else {
            return Ok(NodeOutcome::Unchanged);
        };
        let mut rec = record.unwrap_or_else(|| NodeVolumeRecord::new(vol));
        // No progress record: after a crash past the unmount the record
        // still says Published, so a restart binds the target again and
        // the CO's retry of this call removes it; the bind mount is its own
        // evidence either way.
        // The table read for the questions above is not kept through the
        // effects: what they change, and what is asked after, the mounter answers.
        drop(table);
        if unmount {
            self.unmount_ours(vol, &target, &ids, mounts_here)?;
        }
        if remove {
            self.remove_if_empty(&target)?;
        }
        rec.publications.retain(|p| p.target != target);
        self.save(&rec, Part::Publication(&target))?;
        tracing::info!(volume = %vol, target = %target.display(), "unpublished");
        Ok(NodeOutcome::Changed)
    }
}
