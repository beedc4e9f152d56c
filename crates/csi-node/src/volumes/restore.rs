//! Putting staged and published volumes back after a restart.

use std::path::{Path, PathBuf};

use super::{NodeVolumes, RestoreReport, Snapshot, Undo, View};
use crate::error::NodeError;
use crate::observe::{Identities, PathKind};
use crate::record::{
    NodeVolumeRecord, PublishRecord, PublishState, StageRecord, StageState, VolumeSource,
};
use crate::rules::mount_options;

impl NodeVolumes {
    /// Marks every recorded volume as yet to be restored: calls on one
    /// (and on its paths) are ABORTED until [`restore`](Self::restore) has
    /// put it back. Call it before serving when the restore runs while
    /// serving; `restore` does it too.
    pub fn begin_restore(&self) {
        self.table().mark_restoring();
    }

    /// After a restart: puts every staged and published volume back (loop
    /// devices are gone after a reboot, mounts too), never formatting again.
    /// A volume that cannot be restored (its image gone, its target now a
    /// regular file or a symlink, its filesystem damaged) is reported
    /// abnormal and left as it is; the others are served. The mount table
    /// is read once for all volumes; calls on a volume not yet restored are
    /// ABORTED, so it may run while serving.
    pub fn restore(&self) -> RestoreReport {
        let records: Vec<(String, NodeVolumeRecord)> = {
            let mut t = self.table();
            // Once begun (before serving), what was marked then is restored;
            // volumes staged since are not this restore's.
            if t.restoring_volumes.is_empty() {
                t.mark_restoring();
            }
            let marked = t.restoring_volumes.iter();
            let recorded = marked.filter_map(|v| Some((v.clone(), t.records.get(v)?.clone())));
            recorded.collect()
        };
        let mut report = RestoreReport::default();
        let snapshot = (!records.is_empty())
            .then(|| Snapshot::read(self.inner.mounter.as_ref(), self.inner.loops.as_ref()));
        for (vol, rec) in records {
            let result = match &snapshot {
                Some(Ok(snapshot)) => self.restore_volume(&vol, rec, &View::Snapshot(snapshot)),
                Some(Err(e)) => Err(NodeError::failed_precondition(e.to_string())),
                None => Ok(()),
            };
            match result {
                Ok(()) => report.healthy.push(vol),
                Err(e) => {
                    let why = e.to_string();
                    tracing::warn!(volume = %vol, error = %why, "could not restore; reporting it abnormal");
                    self.table().abnormal.insert(vol.clone(), why);
                }
            }
        }
        {
            // Whatever was not reached (an unreadable table) is not held up.
            let mut t = self.table();
            t.restoring_volumes.clear();
            t.restoring_paths.clear();
        }
        report.abnormal = self.abnormal();
        report
    }

    pub(super) fn restore_volume(
        &self,
        vol: &str,
        mut rec: NodeVolumeRecord,
        view: &View<'_>,
    ) -> Result<(), NodeError> {
        let paths: Vec<PathBuf> = rec
            .stage
            .iter()
            .map(|s| s.path.clone())
            .chain(rec.publications.iter().map(|p| p.target.clone()))
            .collect();
        let refs: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
        let _claim = self.claim_to_restore(vol, &refs)?;
        // The volume's identities, found once for its stage and its
        // publications while nothing of it changes (a restart without a
        // reboot), found again after a step changed something.
        let mut ids = None;
        if let Some(s) = rec.stage.clone().filter(|s| s.state == StageState::Staged) {
            self.clear_disconnected_fuse(&rec, &s, view)?;
            ids = self.restore_stage(&mut rec, &s, view)?;
        }
        let mut problems = Vec::new();
        for p in rec.publications.clone() {
            if p.state != PublishState::Published {
                continue;
            }
            if let Err(e) = self.restore_publication(&rec, &p, view, &mut ids) {
                problems.push(e.to_string());
            }
        }
        match problems.is_empty() {
            true => Ok(()),
            false => Err(NodeError::failed_precondition(problems.join("; "))),
        }
    }

    /// Puts the stage back; returns the volume's identities when it found
    /// the stage in place and changed nothing (they still hold).
    pub(super) fn restore_stage(
        &self,
        rec: &mut NodeVolumeRecord,
        s: &StageRecord,
        view: &View<'_>,
    ) -> Result<Option<Identities>, NodeError> {
        let gone = |what: &str, p: &Path| {
            NodeError::failed_precondition(format!("its {what} {} is gone", p.display()))
        };
        match &s.source {
            VolumeSource::Directory(d) if !d.is_dir() => return Err(gone("directory", d)),
            VolumeSource::Image(f) if !f.is_file() => return Err(gone("image", f)),
            _ => {}
        }
        let ids = self.identities(&rec.volume_id, Some(rec), view)?;
        let (here, _) = view.facts(&s.path, &ids)?;
        if here.kind == PathKind::Symlink || here.has_foreign_mount() {
            return Err(NodeError::failed_precondition(format!(
                "its staging path {} is now a symlink or holds something else",
                s.path.display()
            )));
        }
        if !s.capability.is_block()
            && !here.is_ours()
            && here.kind != PathKind::Absent
            && here.kind != PathKind::Directory
        {
            return Err(NodeError::failed_precondition(format!(
                "its staging path {} is no longer a directory",
                s.path.display()
            )));
        }
        let options = mount_options(&s.capability, s.readonly)?;
        if !here.is_ours() {
            self.changing(view, &s.path);
            if let Some(private) = &self.inner.private_dir {
                self.changing(view, private);
            }
        }
        let mut undo = Undo::default();
        let before = rec.stage.clone();
        self.stage_effects(rec, view, &ids, here.is_ours(), &options, None, &mut undo)?;
        if undo.mounted {
            tracing::info!(volume = %rec.volume_id, path = %s.path.display(), "restored staging mount");
        }
        // A block stage mounts nothing: what it may change (a device
        // attached, the record) shows in `undo` and the record.
        let in_place = here.is_ours() || s.capability.is_block();
        let unchanged = in_place && undo.is_empty() && rec.stage == before;
        Ok(unchanged.then_some(ids))
    }

    /// Puts a publication back; `known` holds the volume's identities when
    /// nothing changed since they were found, and is emptied by a change.
    pub(super) fn restore_publication(
        &self,
        rec: &NodeVolumeRecord,
        p: &PublishRecord,
        view: &View<'_>,
        known: &mut Option<Identities>,
    ) -> Result<(), NodeError> {
        let ids = match known.take() {
            Some(ids) => ids,
            None => self.identities(&rec.volume_id, Some(rec), view)?,
        };
        let (here, _) = view.facts(&p.target, &ids)?;
        if here.is_ours() {
            *known = Some(ids);
            return Ok(());
        }
        let block = p.capability.is_block();
        let refuse = |what: &str| {
            Err(NodeError::failed_precondition(format!(
                "its target {} {what}",
                p.target.display()
            )))
        };
        match here.kind {
            _ if here.has_foreign_mount() => return refuse("holds something else"),
            PathKind::Symlink => return refuse("is now a symlink"),
            PathKind::Absent | PathKind::File { len: 0 } if block => {}
            PathKind::Absent | PathKind::Directory if !block => {}
            PathKind::File { .. } if !block => return refuse("is now a regular file"),
            _ => return refuse("is no longer what was published there"),
        }
        let source = match (&rec.stage, block) {
            (Some(_), true) => match ids.device() {
                Some(d) => d.path.clone(),
                None => return refuse("lost its device"),
            },
            (Some(s), false) => s.path.clone(),
            (None, _) => match self.inner.locator.source(&rec.volume_id) {
                Some(VolumeSource::Directory(d)) => d,
                _ => return refuse("has no source to bind"),
            },
        };
        let options = mount_options(&p.capability, p.effective_readonly)?;
        self.changing(view, &p.target);
        let mut undo = Undo::default();
        self.bind(
            rec,
            &ids,
            &source,
            &p.target,
            block,
            p.effective_readonly,
            &options,
            false,
            &mut undo,
        )?;
        tracing::info!(volume = %rec.volume_id, target = %p.target.display(), "restored publication");
        Ok(())
    }

    /// Tells a snapshot view that this restore is about to change the
    /// mounts at or below `path`.
    pub(super) fn changing(&self, view: &View<'_>, path: &Path) {
        if let View::Snapshot(snapshot) = view {
            snapshot.changing(path);
        }
    }
}
