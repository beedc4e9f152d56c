//! NodeStageVolume.

use csi_proto::v1::NodeStageVolumeRequest;

use super::filesystem::FilesystemStage;
use super::{NodeOutcome, NodeVolumes, Part, Undo, View, absolute, is_bind};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::NodeError;
use crate::observe::{Identities, PathKind, filesystem_on};
use crate::record::{
    Capability, Device, NodeVolumeRecord, StageRecord, StageState, VolumeSource, sorted,
};
use crate::rules::{StageDecision, StageFacts, decide_stage, effective_readonly, mount_options};
use crate::seams::{Probe, VolumeContexts};
use mount_utils::MountArgs;

impl NodeVolumes {
    /// NodeStageVolume. The volume's source comes from the locator; an
    /// image is attached (or its existing device reused), and for mount
    /// access its filesystem, or the directory, is mounted at the staging
    /// path, read-only for reader-only modes.
    pub fn stage(&self, req: &NodeStageVolumeRequest) -> Result<NodeOutcome, NodeError> {
        let cap = Capability::from_proto(req.volume_capability.as_ref(), "volume_capability")?;
        let path = absolute(&req.staging_target_path, "staging_target_path")?;
        let mut req = req.clone();
        req.staging_target_path = path.to_string_lossy().into_owned();
        let readonly = effective_readonly(false, &cap);
        let options = mount_options(&cap, readonly)?;
        let vol = req.volume_id.as_str();
        let contexts = VolumeContexts::of(&req.volume_context, &req.publish_context);
        let source = self
            .inner
            .locator
            .source_in(vol, &contexts)?
            .ok_or_else(|| NodeError::not_found(format!("volume {vol} does not exist")))?;
        if cap.is_block() && matches!(source, VolumeSource::Directory(_)) {
            return Err(NodeError::failed_precondition(format!(
                "volume {vol} is a directory and cannot be staged for block access"
            )));
        }
        if cap.is_block() && matches!(source, VolumeSource::Filesystem(_)) {
            return Err(NodeError::failed_precondition(format!(
                "volume {vol} is a filesystem and cannot be staged for block access"
            )));
        }
        let _claim = self.claim(vol, &[&path])?;
        let table = self.table_for_call()?;
        let view = View::of_call(self.inner.mounter.as_ref(), table.as_ref());
        let (record, claimed) = self.snapshot(vol, &path);
        let ids = self.identities(vol, record.as_ref(), &view)?;
        let (here, _) = view.facts(&path, &ids)?;
        let decision = decide_stage(
            &req,
            &cap,
            &StageFacts {
                staged: record.as_ref().and_then(|r| r.stage.as_ref()),
                path_claimed_by: claimed.as_deref(),
                path: &here,
                device_attached: ids.device().is_some(),
            },
        )?;
        let StageDecision::Stage { resume, mounted } = decision else {
            return Ok(NodeOutcome::Unchanged);
        };
        let mut rec = record.unwrap_or_else(|| NodeVolumeRecord::new(vol));
        let stage = match rec.stage.take() {
            Some(mut s) if resume => {
                s.state = StageState::Staging;
                s
            }
            _ => StageRecord {
                volume_id: vol.to_owned(),
                path: path.clone(),
                capability: cap.clone(),
                readonly,
                source,
                device: None,
                formatted: false,
                mount_id: None,
                publish_context: sorted(&req.publish_context),
                volume_context: sorted(&req.volume_context),
                state: StageState::Staging,
            },
        };
        rec.stage = Some(stage);
        // Waiting for an attached device is no effect: it is found before
        // the intent is saved, and the intent names it.
        let mut ids = ids;
        if let Some(s) = rec.stage.as_mut() {
            if let (VolumeSource::Device(at), None) = (&s.source, &ids.attached) {
                ids.attached = Some(self.wait_for_device(vol, at)?);
            }
            s.device = present_device(&s.source, &ids).or(s.device.take());
        }
        let mut undo = Undo::default();
        // A directory is staged with a bind mount, its own evidence in
        // mountinfo (see NodePublish): only the outcome is saved. Devices
        // and filesystems mounted by type save the intent first, as their
        // effects (an attach, a format, a mount id) need a record to be
        // found and resumed.
        let mut probed = None;
        if !rec.stage.as_ref().is_some_and(is_bind) {
            let device = (rec.stage.as_ref()).and_then(|s| probed_ahead(s, &ids, mounted));
            probed = self.save_intent(&rec, device)?;
            undo.recorded = true;
        }
        // The table read for the questions above is not kept through the
        // effects: what they change, and what is asked after, the mounter answers.
        let view = View::Paths(self.inner.mounter.as_ref());
        drop(table);
        let secrets = Some(&req.secrets);
        let how = (options.as_slice(), secrets, probed);
        let result = self
            .stage_effects_probed(&mut rec, &view, &ids, mounted, how, &mut undo)
            .and_then(|()| {
                if let Some(s) = rec.stage.as_mut() {
                    s.state = StageState::Staged;
                    s.formatted |= s.device.is_some() && !s.capability.is_block();
                }
                // A failed save may still have reached the disk.
                undo.recorded = true;
                self.save(&rec, Part::Stage)
            });
        match result {
            Ok(()) => {
                self.table().abnormal.remove(vol);
                tracing::info!(volume = %vol, path = %path.display(), "staged");
                Ok(NodeOutcome::Changed)
            }
            Err(e) => {
                if !resume {
                    self.undo(&mut rec, &path, undo, Part::Stage);
                }
                Err(e)
            }
        }
    }

    /// Saves the stage intent `rec`. When `device` is given, its probe is
    /// started first and taken after (looking changes nothing, so it needs
    /// no intent): `blkid` runs while the record is flushed. What it found
    /// is returned with the device. Nothing is formatted or mounted before
    /// the intent is durable: that is after this returns.
    fn save_intent(
        &self,
        rec: &NodeVolumeRecord,
        device: Option<&Path>,
    ) -> Result<Option<(PathBuf, Probe)>, NodeError> {
        let fs = &self.inner.filesystems;
        let started = device.and_then(|d| Some((d, fs.probe_ahead(&d.to_string_lossy())?)));
        let saved = self.save(rec, Part::Stage);
        let probe = started.map(|(device, probe)| (device.to_owned(), probe.finish()));
        saved.map(|()| probe)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn stage_effects(
        &self,
        rec: &mut NodeVolumeRecord,
        view: &View<'_>,
        ids: &Identities,
        mounted: bool,
        options: &[String],
        secrets: Option<&HashMap<String, String>>,
        undo: &mut Undo,
    ) -> Result<(), NodeError> {
        let how = (options, secrets, None);
        self.stage_effects_probed(rec, view, ids, mounted, how, undo)
    }

    /// [`stage_effects`](Self::stage_effects) with, last in `how`, what
    /// [`save_intent`](Self::save_intent) found on the device, if it probed.
    fn stage_effects_probed(
        &self,
        rec: &mut NodeVolumeRecord,
        view: &View<'_>,
        ids: &Identities,
        mounted: bool,
        how: StageHow<'_>,
        undo: &mut Undo,
    ) -> Result<(), NodeError> {
        let (options, secrets, probed) = how;
        let Some(s) = rec.stage.clone() else {
            return Ok(());
        };
        let device = match &s.source {
            VolumeSource::Filesystem(fs) => {
                let how = FilesystemStage {
                    view,
                    options,
                    secrets,
                };
                return match mounted {
                    true => self.verify(&rec.volume_id, rec, view, &s.path, s.readonly),
                    false => self.stage_filesystem(rec, fs, &how, undo),
                };
            }
            VolumeSource::Directory(_) => None,
            VolumeSource::Device(path) => {
                let dev = match &ids.attached {
                    Some(d) => d.clone(),
                    None => self.wait_for_device(&rec.volume_id, path)?,
                };
                Some(self.use_device(rec, dev)?)
            }
            VolumeSource::Image(image) => {
                let dev = match ids.devices.first() {
                    Some(d) => d.clone(),
                    None => {
                        if !image.is_file() {
                            return Err(NodeError::failed_precondition(format!(
                                "the image of volume {} is missing",
                                rec.volume_id
                            )));
                        }
                        let d = self.attach(image)?;
                        if let View::Snapshot(snapshot) = view {
                            snapshot.note_attached(image, &d);
                        }
                        undo.attached = Some(d.clone());
                        d
                    }
                };
                Some(self.use_device(rec, dev)?)
            }
        };
        if s.capability.is_block() || mounted {
            return Ok(());
        }
        if PathKind::of(&s.path) == PathKind::Absent {
            std::fs::create_dir(&s.path).map_err(|e| NodeError::io("creating", &s.path, &e))?;
            undo.created = Some(s.path.clone());
        }
        match (&s.source, &device) {
            (VolumeSource::Directory(dir), _) => self
                .inner
                .mounter
                .bind_mount(dir, &s.path, s.readonly)
                .map_err(|e| NodeError::mount("staging at", &s.path, &e))?,
            (VolumeSource::Image(_) | VolumeSource::Device(_), Some(dev)) => {
                let opts: Vec<&str> = options.iter().map(String::as_str).collect();
                let device = dev.path.to_string_lossy();
                let fstype = s.capability.fs_type().unwrap_or_default();
                let mount = MountArgs::new(&device, &s.path, fstype, &opts);
                let fs = &self.inner.filesystems;
                match probed.filter(|(probed, _)| *probed == dev.path) {
                    Some((_, probe)) => fs.mount_probed(&mount, !s.formatted, probe)?,
                    None => fs.mount_filesystem(&mount, !s.formatted)?,
                }
            }
            (VolumeSource::Filesystem(_), _) => return Ok(()),
            (VolumeSource::Image(image) | VolumeSource::Device(image), None) => {
                return Err(NodeError::failed_precondition(format!(
                    "no block device for {}",
                    image.display()
                )));
            }
        }
        undo.mounted = true;
        match &device {
            // What was mounted is known: this device's filesystem. Looking
            // the volume's device up again would only repeat the work above.
            Some(dev) => {
                let mounted = Identities {
                    ids: vec![filesystem_on(dev)],
                    ..Identities::default()
                };
                self.verify_with(&rec.volume_id, &mounted, &s.path, s.readonly)
            }
            // A bind of the directory: it changes nothing that identifies
            // the volume (see NodePublish).
            None => self.verify_with(&rec.volume_id, ids, &s.path, s.readonly),
        }
    }

    /// Saves `dev` in the stage record if it is not there yet (the intent
    /// usually carries it already: see [`present_device`]), then lets the
    /// driver prepare it.
    fn use_device(&self, rec: &mut NodeVolumeRecord, dev: Device) -> Result<Device, NodeError> {
        if let Some(st) = rec
            .stage
            .as_mut()
            .filter(|st| st.device.as_ref() != Some(&dev))
        {
            st.device = Some(dev.clone());
            self.save(rec, Part::Stage)?;
        }
        self.inner.locator.prepare_device(&rec.volume_id, &dev)?;
        Ok(dev)
    }
}

/// The device a stage about to save its intent can probe meanwhile: an
/// attached device whose filesystem is to be mounted.
fn probed_ahead<'a>(s: &StageRecord, ids: &'a Identities, mounted: bool) -> Option<&'a Path> {
    let wanted = matches!(s.source, VolumeSource::Device(_)) && !s.capability.is_block();
    let device = ids.attached.as_ref().filter(|_| wanted && !mounted);
    device.map(|d| d.path.as_path())
}

/// What staging works with besides the record: the capability's mount
/// options, the NodeStage secrets (`None` when restoring) and what was
/// probed on the device while the intent was saved.
type StageHow<'a> = (
    &'a [String],
    Option<&'a HashMap<String, String>>,
    Option<(PathBuf, Probe)>,
);

/// The device of `source` that is there already: the attached one, or a
/// loop device a crash left attached to its image. The intent records it,
/// so no second save follows the first.
fn present_device(source: &VolumeSource, ids: &Identities) -> Option<Device> {
    match source {
        VolumeSource::Device(_) => ids.attached.clone(),
        VolumeSource::Image(_) => ids.devices.first().cloned(),
        VolumeSource::Directory(_) | VolumeSource::Filesystem(_) => None,
    }
}
