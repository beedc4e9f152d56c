//! Putting staged and published volumes back after a restart.

use std::path::{Path, PathBuf};

use super::{NodeVolumes, RestoreReport, Undo, View};
use crate::error::NodeError;
use crate::observe::PathKind;
use crate::record::{
    NodeVolumeRecord, PublishRecord, PublishState, StageRecord, StageState, VolumeSource,
};
use crate::rules::mount_options;

impl NodeVolumes {
    /// After a restart: puts every staged and published volume back (loop
    /// devices are gone after a reboot, mounts too), never formatting again.
    /// A volume that cannot be restored (its image gone, its target now a
    /// regular file or a symlink, its filesystem damaged) is reported
    /// abnormal and left as it is; the others are served.
    pub fn restore(&self) -> RestoreReport {
        let mut report = RestoreReport::default();
        for (vol, rec) in self.records() {
            match self.restore_volume(&vol, rec) {
                Ok(()) => report.healthy.push(vol),
                Err(e) => {
                    let why = e.to_string();
                    tracing::warn!(volume = %vol, error = %why, "could not restore; reporting it abnormal");
                    self.table().abnormal.insert(vol.clone(), why);
                }
            }
        }
        report.abnormal = self.abnormal();
        report
    }

    pub(super) fn restore_volume(
        &self,
        vol: &str,
        mut rec: NodeVolumeRecord,
    ) -> Result<(), NodeError> {
        let paths: Vec<PathBuf> = rec
            .stage
            .iter()
            .map(|s| s.path.clone())
            .chain(rec.publications.iter().map(|p| p.target.clone()))
            .collect();
        let refs: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
        let _claim = self.claim(vol, &refs)?;
        if let Some(s) = rec.stage.clone().filter(|s| s.state == StageState::Staged) {
            self.restore_stage(&mut rec, &s)?;
        }
        let mut problems = Vec::new();
        for p in rec.publications.clone() {
            if p.state != PublishState::Published {
                continue;
            }
            if let Err(e) = self.restore_publication(&rec, &p) {
                problems.push(e.to_string());
            }
        }
        match problems.is_empty() {
            true => Ok(()),
            false => Err(NodeError::failed_precondition(problems.join("; "))),
        }
    }

    pub(super) fn restore_stage(
        &self,
        rec: &mut NodeVolumeRecord,
        s: &StageRecord,
    ) -> Result<(), NodeError> {
        let gone = |what: &str, p: &Path| {
            NodeError::failed_precondition(format!("its {what} {} is gone", p.display()))
        };
        match &s.source {
            VolumeSource::Directory(d) if !d.is_dir() => return Err(gone("directory", d)),
            VolumeSource::Image(f) if !f.is_file() => return Err(gone("image", f)),
            _ => {}
        }
        let table = self.mount_table()?;
        let view = View::Table(&table);
        let ids = self.identities(&rec.volume_id, Some(rec), &view)?;
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
        let mut undo = Undo::default();
        let result =
            self.stage_effects(rec, &view, &ids, here.is_ours(), &options, None, &mut undo);
        if result.is_ok() && undo.mounted {
            tracing::info!(volume = %rec.volume_id, path = %s.path.display(), "restored staging mount");
        }
        result
    }

    pub(super) fn restore_publication(
        &self,
        rec: &NodeVolumeRecord,
        p: &PublishRecord,
    ) -> Result<(), NodeError> {
        let table = self.mount_table()?;
        let view = View::Table(&table);
        let ids = self.identities(&rec.volume_id, Some(rec), &view)?;
        let (here, _) = view.facts(&p.target, &ids)?;
        if here.is_ours() {
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
        let mut undo = Undo::default();
        self.bind(
            rec,
            &view,
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
}
