//! NodeUnstageVolume.

use std::path::{Path, PathBuf};

use csi_proto::v1::NodeUnstageVolumeRequest;

use super::{NodeOutcome, NodeVolumes, Part, View, absolute, is_bind};
use crate::error::NodeError;
use crate::observe::resolve;
use crate::record::{NodeVolumeRecord, StageState};
use crate::rules::{UnstageDecision, UnstageFacts, decide_unstage};

impl NodeVolumes {
    /// NodeUnstageVolume: refuses while the volume is published anywhere;
    /// unmounts the staging path only where it shows this volume; detaches
    /// the volume's devices: the recorded one, or those found by backing
    /// file when the record names none (a crash before it recorded the
    /// attach).
    pub fn unstage(&self, req: &NodeUnstageVolumeRequest) -> Result<NodeOutcome, NodeError> {
        let path = absolute(&req.staging_target_path, "staging_target_path")?;
        let vol = req.volume_id.as_str();
        let _claim = self.claim(vol, &[&path])?;
        let table = self.table_for_call()?;
        let view = View::of_call(self.inner.mounter.as_ref(), table.as_ref());
        let (record, claimed) = self.snapshot(vol, &path);
        let known = self.inner.locator.source(vol).is_some();
        let ids = self.identities(vol, record.as_ref(), &view)?;
        let (here, mounts_here) = view.facts(&path, &ids)?;
        let mut in_use: Vec<PathBuf> = record
            .iter()
            .flat_map(|r| r.publications.iter().map(|p| p.target.clone()))
            .collect();
        let private = self.private_path(vol).ok();
        // Unrecorded uses (a lost record) matter where unstaging releases
        // something they still need: a device, or a filesystem this plugin
        // mounted. A bind of a directory stays valid without the staging
        // mount, so the records and the paths alone answer for it.
        let bind_only = ids.directory.is_some()
            && ids.devices.is_empty()
            && ids.attached.is_none()
            && ids.mount_ids.is_empty();
        if !bind_only {
            let read;
            let table = match view.whole_table() {
                Some(table) => table,
                None => {
                    read = self.mounts_that_may_show(&ids)?;
                    &read
                }
            };
            // A mount in the volume's private directory is this plugin's
            // half-made stage (a crash before the move), not a use.
            for p in ids.uses(table, &resolve(&path)) {
                let half_made = private.as_deref().is_some_and(|d| p.starts_with(d));
                if !half_made && !in_use.iter().any(|t| resolve(t) == p) {
                    in_use.push(p.to_path_buf());
                }
            }
        }
        let decision = decide_unstage(
            vol,
            &path,
            &UnstageFacts {
                staged: record.as_ref().and_then(|r| r.stage.as_ref()),
                known,
                path_claimed_by: claimed.as_deref(),
                path: &here,
                in_use_at: &in_use,
                device_attached: !ids.devices.is_empty(),
            },
        )?;
        let UnstageDecision::Unstage { unmount } = decision else {
            return Ok(NodeOutcome::Unchanged);
        };
        let mut rec = record.unwrap_or_else(|| NodeVolumeRecord::new(vol));
        // A bind stage needs no progress record (see NodeUnpublish).
        if let Some(s) = rec.stage.as_mut().filter(|s| !is_bind(s)) {
            s.state = StageState::Unstaging;
            self.save_progress(&rec, Part::Stage)?;
        }
        // The table read for the questions above is not kept through the
        // effects: what they change, and what is asked after, the mounter answers.
        drop(table);
        if unmount {
            self.unmount_ours(vol, &path, &ids, mounts_here)?;
        }
        for dev in &ids.devices {
            self.detach(dev)?;
            tracing::info!(volume = %vol, device = %dev.path.display(), "detached");
        }
        if private.as_deref().is_some_and(Path::exists) {
            self.clear_private(vol);
        }
        rec.stage = None;
        self.save(&rec, Part::Stage)?;
        tracing::info!(volume = %vol, path = %path.display(), "unstaged");
        Ok(NodeOutcome::Changed)
    }
}
