//! NodePublishVolume.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use csi_proto::v1::NodePublishVolumeRequest;

use super::{NodeOutcome, NodeVolumes, Part, Undo, View, absolute};
use crate::error::NodeError;
use crate::observe::{Identities, PathKind};
use crate::record::{
    Capability, NodeVolumeRecord, PublishRecord, PublishState, VolumeSource, sorted,
};
use crate::rules::{
    PublishDecision, PublishFacts, decide_publish, effective_readonly, mount_options,
};
use crate::seams::VolumeContexts;

impl NodeVolumes {
    /// NodePublishVolume: binds the staging path (mount access), the
    /// volume's device node (block access) or, without staging, the
    /// volume's directory at the target; read-only always wins.
    pub fn publish(&self, req: &NodePublishVolumeRequest) -> Result<NodeOutcome, NodeError> {
        let cap = Capability::from_proto(req.volume_capability.as_ref(), "volume_capability")?;
        let target = absolute(&req.target_path, "target_path")?;
        let staging = match req.staging_target_path.as_str() {
            "" => None,
            s => Some(absolute(s, "staging_target_path")?),
        };
        let mut req = req.clone();
        req.target_path = target.to_string_lossy().into_owned();
        if let Some(s) = &staging {
            req.staging_target_path = s.to_string_lossy().into_owned();
        }
        let readonly = effective_readonly(req.readonly, &cap);
        let options = mount_options(&cap, readonly)?;
        let vol = req.volume_id.as_str();
        let _claim = self.claim(vol, &[&target])?;
        let table = self.table_for_call()?;
        let view = View::of_call(self.inner.mounter.as_ref(), table.as_ref());
        let (record, claimed) = self.snapshot(vol, &target);
        let contexts = VolumeContexts::of(&req.volume_context, &req.publish_context);
        let located = match self.inner.locator.source_in(vol, &contexts) {
            Ok(located) => located,
            // A staged volume's source is in its record.
            Err(_) if record.as_ref().is_some_and(|r| r.stage.is_some()) => None,
            Err(e) => return Err(e),
        };
        let ids = self.identities(vol, record.as_ref(), &view)?;
        let (here, _) = view.facts(&target, &ids)?;
        let staged = record.as_ref().and_then(|r| r.stage.as_ref());
        let decision = decide_publish(
            &req,
            &cap,
            &PublishFacts {
                known: located.is_some(),
                publications: record.as_ref().map_or(&[], |r| &r.publications),
                staged,
                target_claimed_by: claimed.as_deref(),
                target: &here,
                single_node_multi_writer: self.inner.single_node_multi_writer,
            },
        )?;
        let PublishDecision::Publish { resume, mounted } = decision else {
            return Ok(NodeOutcome::Unchanged);
        };
        let source = match (staged, &staging, &located) {
            (Some(_), Some(_), _) if cap.is_block() => {
                let device = ids.device().ok_or_else(|| {
                    NodeError::failed_precondition(format!(
                        "the device of staged volume {vol} is no longer attached"
                    ))
                })?;
                super::device_node::device_node(self.inner.devices.as_ref(), device)?
            }
            (Some(s), Some(_), _) => s.path.clone(),
            (_, None, Some(VolumeSource::Directory(dir))) if !cap.is_block() => dir.clone(),
            _ => {
                return Err(NodeError::failed_precondition(format!(
                    "volume {vol} must be staged before it is published"
                )));
            }
        };
        let mut rec = record.unwrap_or_else(|| NodeVolumeRecord::new(vol));
        let publication = PublishRecord {
            volume_id: vol.to_owned(),
            target: target.clone(),
            staging_path: staging.clone().unwrap_or_default(),
            capability: cap.clone(),
            readonly: req.readonly,
            effective_readonly: readonly,
            publish_context: sorted(&req.publish_context),
            volume_context: sorted(&req.volume_context),
            state: PublishState::Publishing,
        };
        rec.publications.retain(|p| p.target != target);
        rec.publications.push(publication);
        // No intent record: a publication is a bind mount, which shows in
        // mountinfo as this volume's, so after a crash before the save
        // below a retry completes it and NodeUnpublish removes it by that
        // evidence alone. The one save is the outcome.
        // The table read for the questions above is not kept through the
        // effects: what they change, and what is asked after, the mounter answers.
        drop(table);
        let mut undo = Undo::default();
        let result = self
            .bind(
                &rec,
                &ids,
                &source,
                &target,
                cap.is_block(),
                readonly,
                &options,
                mounted,
                &mut undo,
            )
            .and_then(|()| {
                if let Some(p) = rec.publications.iter_mut().find(|p| p.target == target) {
                    p.state = PublishState::Published;
                }
                // A failed save may still have reached the disk.
                undo.recorded = true;
                self.save(&rec, Part::Publication(&target))
            });
        match result {
            Ok(()) => {
                tracing::info!(volume = %vol, target = %target.display(), readonly, "published");
                Ok(NodeOutcome::Changed)
            }
            Err(e) => {
                if !resume {
                    self.undo(&mut rec, &target, undo, Part::Publication(&target));
                }
                Err(e)
            }
        }
    }

    /// Creates the target (never through a symlink) and binds `source` there.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn bind(
        &self,
        rec: &NodeVolumeRecord,
        ids: &Identities,
        source: &Path,
        target: &Path,
        block: bool,
        readonly: bool,
        options: &[String],
        mounted: bool,
        undo: &mut Undo,
    ) -> Result<(), NodeError> {
        if !mounted {
            if PathKind::of(target) == PathKind::Absent {
                let created = if block {
                    OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
                        .mode(0o600)
                        .open(target)
                        .map(drop)
                } else {
                    std::fs::create_dir(target)
                };
                created.map_err(|e| NodeError::io("creating", target, &e))?;
                undo.created = Some(target.to_path_buf());
            }
            let result = if options.is_empty() {
                self.inner.mounter.bind_mount(source, target, false)
            } else {
                let mut opts = vec!["bind"];
                opts.extend(options.iter().map(String::as_str));
                self.inner
                    .mounter
                    .mount(&source.to_string_lossy(), target, "", &opts)
            };
            result.map_err(|e| NodeError::mount("publishing at", target, &e))?;
            undo.mounted = true;
        }
        // A bind changes nothing that identifies the volume.
        self.verify_with(&rec.volume_id, ids, target, readonly)
    }
}
