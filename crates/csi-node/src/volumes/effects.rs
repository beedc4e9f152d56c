//! What every call shares: claims, saves, loop devices, identities,
//! verifying a mount, undoing a failed first attempt, unmounting only ours.

use std::path::Path;

use mount_utils::{LoopOptions, MountInfo};

use std::sync::Mutex;

use super::view::backing_key;
use super::{Claim, MAX_STACKED, NodeVolumes, Part, Snapshot, Table, Undo, View, restoring};
use crate::error::NodeError;
use crate::observe::{Identities, filesystem_on, normalize};
use crate::record::{Device, NodeVolumeRecord, VolumeSource};
use crate::rules::covered;

impl NodeVolumes {
    pub(super) fn claim(&self, volume: &str, paths: &[&Path]) -> Result<Claim<'_>, NodeError> {
        let mut t = self.table();
        if t.restoring_volumes.contains(volume) {
            return Err(restoring(volume));
        }
        if let Some(p) = paths.iter().find(|p| t.restoring_paths.contains(**p)) {
            return Err(NodeError::aborted(format!(
                "{} is being restored after a restart",
                p.display()
            )));
        }
        Self::claim_in(&mut t, &self.inner.table, volume, paths)
    }

    /// A restore's claim of a volume it is about to put back: from then on
    /// other calls on it wait for this one, as for any call in progress.
    pub(super) fn claim_to_restore(
        &self,
        volume: &str,
        paths: &[&Path],
    ) -> Result<Claim<'_>, NodeError> {
        let mut t = self.table();
        t.restoring_volumes.remove(volume);
        for p in paths {
            t.restoring_paths.remove(*p);
        }
        Self::claim_in(&mut t, &self.inner.table, volume, paths)
    }

    fn claim_in<'a>(
        t: &mut Table,
        table: &'a Mutex<Table>,
        volume: &str,
        paths: &[&Path],
    ) -> Result<Claim<'a>, NodeError> {
        if t.busy_volumes.contains(volume) {
            return Err(NodeError::aborted(format!(
                "an operation on volume {volume} is in progress"
            )));
        }
        if let Some(p) = paths.iter().find(|p| t.busy_paths.contains(**p)) {
            return Err(NodeError::aborted(format!(
                "an operation on {} is in progress",
                p.display()
            )));
        }
        t.busy_volumes.insert(volume.to_owned());
        for p in paths {
            t.busy_paths.insert(p.to_path_buf());
        }
        Ok(Claim {
            table,
            volume: volume.to_owned(),
            paths: paths.iter().map(|p| p.to_path_buf()).collect(),
        })
    }

    /// This volume's record and the other volume whose record names `path`.
    pub(super) fn snapshot(
        &self,
        volume: &str,
        path: &Path,
    ) -> (Option<NodeVolumeRecord>, Option<String>) {
        let t = self.table();
        let claimed = t
            .records
            .values()
            .find(|r| r.volume_id != volume && r.names(path))
            .map(|r| r.volume_id.clone());
        (t.records.get(volume).cloned(), claimed)
    }

    /// Persists one part of `rec` (a delete when it is gone), then updates
    /// memory: memory never runs ahead of disk.
    pub(super) fn save(&self, rec: &NodeVolumeRecord, part: Part<'_>) -> Result<(), NodeError> {
        let (staged, published) = (&self.inner.staged, &self.inner.published);
        match part {
            Part::Stage => match &rec.stage {
                Some(s) => staged.put(&rec.volume_id, s)?,
                None => drop(staged.delete(&rec.volume_id)?),
            },
            Part::Publication(target) => {
                let key = target.to_string_lossy();
                match rec.publication(target) {
                    Some(p) => published.put(&key, p)?,
                    None => drop(published.delete(&key)?),
                }
            }
        }
        let mut t = self.table();
        if rec.is_empty() {
            t.records.remove(&rec.volume_id);
        } else {
            t.records.insert(rec.volume_id.clone(), rec.clone());
        }
        Ok(())
    }

    /// Saves a step that only helps a restart (Unstaging, Unpublishing):
    /// on a full disk it is skipped, so space can still be freed.
    pub(super) fn save_progress(
        &self,
        rec: &NodeVolumeRecord,
        part: Part<'_>,
    ) -> Result<(), NodeError> {
        match self.save(rec, part) {
            Err(e) if e.is_disk_full() => {
                tracing::warn!(volume = %rec.volume_id, "disk full: going on without saving progress");
                Ok(())
            }
            other => other,
        }
    }

    /// The mount table read once for a call's questions before its
    /// effects, when asking the mounter about each path would read all of
    /// it every time (Linux before 6.8); the call drops it before its
    /// effects, so it is not held through a mkfs or a flush. `None` when the
    /// mounter answers each path from its mounts alone. See
    /// [`View::of_call`].
    pub(super) fn table_for_call(&self) -> Result<Option<Snapshot<'_>>, NodeError> {
        let mounter = self.inner.mounter.as_ref();
        if !mounter.path_queries_read_whole_table() {
            return Ok(None);
        }
        Snapshot::read_for_call(mounter, self.inner.loops.as_ref()).map(Some)
    }

    /// The table's entries that may show the volume `ids` describes (see
    /// [`Identities::may_own`]); the other lines are not parsed.
    pub(super) fn mounts_that_may_show(
        &self,
        ids: &Identities,
    ) -> Result<Vec<MountInfo>, NodeError> {
        self.inner
            .mounter
            .mount_points_where(&|id, device| ids.may_own(id, device))
            .map_err(|e| NodeError::mount("reading", Path::new("the mount table"), &e))
    }

    /// The loop devices attached to `image` now (a restore's snapshot
    /// answers from one list of every device). The device the stage
    /// `recorded`, while it still holds `image`, is the answer: every other
    /// loop device is looked at (a read of each in sysfs: milliseconds on a
    /// node with a thousand) only when the record names none that does.
    pub(super) fn devices_of(
        &self,
        image: &Path,
        recorded: Option<&Device>,
        view: &View<'_>,
    ) -> Result<Vec<Device>, NodeError> {
        if let View::Snapshot(snapshot) = view
            && let Some(found) = snapshot.loop_devices_of(image)
        {
            return Ok(found);
        }
        let loops = &self.inner.loops;
        if let Some(dev) = recorded
            && let Some(info) = (loops.info(&dev.path))
                .map_err(|e| NodeError::loop_device("inspecting", &dev.path, &e))?
            && Device::of(&info) == *dev
            && info.backing_file == backing_key(image)
        {
            return Ok(vec![dev.clone()]);
        }
        let found = loops
            .find_by_backing_file(image)
            .map_err(|e| NodeError::loop_device("looking up loop devices of", image, &e))?;
        let mut out = Vec::new();
        for path in found {
            // Gone meanwhile (detached by someone): not a device of it.
            let info = loops
                .info(&path)
                .map_err(|e| NodeError::loop_device("inspecting", &path, &e))?;
            out.extend(info.as_ref().map(Device::of));
        }
        Ok(out)
    }

    /// Attaches `image`, left attached (no autoclear: a bind mount of the
    /// device node does not hold it open; NodeUnstage detaches it).
    pub(super) fn attach(&self, image: &Path) -> Result<Device, NodeError> {
        let opts = LoopOptions {
            autoclear: false,
            ..LoopOptions::default()
        };
        let attached = self
            .inner
            .loops
            .attach(image, &opts)
            .map_err(|e| NodeError::loop_device("attaching", image, &e))?;
        Ok(Device::of(&attached.keep()))
    }

    /// The attached device at `path` (its node: a link such as a by-id
    /// name resolved), if it is there now.
    pub(super) fn find_device(&self, path: &Path) -> Result<Option<Device>, NodeError> {
        let found = self.inner.devices.find(path);
        let found = found.map_err(|e| NodeError::block_device(path, &e))?;
        Ok(found.map(|d| Device {
            path: d.node,
            major: d.device.major,
            minor: d.device.minor,
        }))
    }

    /// The attached device at `path`, waited for; NOT_FOUND naming it if it
    /// does not appear in time.
    pub(super) fn wait_for_device(&self, volume: &str, path: &Path) -> Result<Device, NodeError> {
        let timeout = self.inner.device_timeout;
        match self.inner.devices.wait_for(path, timeout) {
            Ok(d) => Ok(Device {
                path: d.node,
                major: d.device.major,
                minor: d.device.minor,
            }),
            Err(mount_utils::BlockDeviceError::Timeout { waited, .. }) => {
                Err(NodeError::not_found(format!(
                    "device {} of volume {volume} did not appear within {waited:?}",
                    path.display()
                )))
            }
            Err(e) => Err(NodeError::block_device(path, &e)),
        }
    }

    /// Detaches `device`; one already gone is fine.
    pub(super) fn detach(&self, device: &Device) -> Result<(), NodeError> {
        self.inner
            .loops
            .detach(&device.path)
            .map_err(|e| NodeError::loop_device("detaching", &device.path, &e))
    }

    /// What identifies `volume`'s mounts: from its stage record and from
    /// the driver's locator, with its devices found by backing file now.
    pub(super) fn identities(
        &self,
        volume: &str,
        record: Option<&NodeVolumeRecord>,
        view: &View<'_>,
    ) -> Result<Identities, NodeError> {
        let stage = record.and_then(|r| r.stage.as_ref());
        let mut sources: Vec<VolumeSource> = stage.map(|s| s.source.clone()).into_iter().collect();
        if let Some(s) = self
            .inner
            .locator
            .source(volume)
            .filter(|s| !sources.contains(s))
        {
            sources.push(s);
        }
        let mut out = Identities::default();
        for source in sources {
            match source {
                VolumeSource::Filesystem(fs) => {
                    let stage = record.and_then(|r| r.stage.as_ref());
                    self.filesystem_identities(volume, stage, &fs, view, &mut out)?;
                }
                VolumeSource::Directory(d) => {
                    // mountinfo shows resolved paths. One without symlinks
                    // is its own: one openat2 instead of realpath's
                    // readlink per component.
                    let d = match mount_utils::nofollow::open(&d) {
                        Ok(_) => mount_utils::nofollow::absolute(&d).ok(),
                        Err(_) => std::fs::canonicalize(&d).ok(),
                    }
                    .unwrap_or_else(|| normalize(&d));
                    out.ids.extend(view.bind_of(&d)?);
                    out.directory = Some(d);
                }
                VolumeSource::Device(path) => {
                    if let Some(dev) = self.find_device(&path)? {
                        out.ids.push(filesystem_on(&dev));
                        // Block publications bind the node behind a stable name.
                        let node =
                            super::device_node::device_node(self.inner.devices.as_ref(), &dev);
                        out.ids
                            .extend(view.bind_of(node.as_ref().unwrap_or(&dev.path))?);
                        out.attached = Some(dev);
                    }
                }
                VolumeSource::Image(image) => {
                    let recorded = stage
                        .filter(|s| s.source == VolumeSource::Image(image.clone()))
                        .and_then(|s| s.device.as_ref());
                    for dev in self.devices_of(&image, recorded, view)? {
                        out.ids.push(filesystem_on(&dev));
                        out.ids.extend(view.bind_of(&dev.path)?);
                        out.devices.push(dev);
                    }
                }
            }
        }
        Ok(out)
    }

    /// After a mount: the path shows exactly this volume, read-only when it
    /// must be. Otherwise an error (the caller undoes the mount). `view`
    /// is the caller's: what identifies the volume (the mounts holding its
    /// directory or device node) is not changed by the mount; the mounts at
    /// `path` are read anew, from those mounts alone where the kernel can
    /// (`Mounter::mounts_at`).
    pub(super) fn verify(
        &self,
        volume: &str,
        rec: &NodeVolumeRecord,
        view: &View<'_>,
        path: &Path,
        readonly: bool,
    ) -> Result<(), NodeError> {
        let ids = self.identities(volume, Some(rec), view)?;
        self.verify_with(volume, &ids, path, readonly)
    }

    /// [`verify`](Self::verify) with the caller's identities of the volume,
    /// when what it did (a bind mount) cannot have changed them.
    pub(super) fn verify_with(
        &self,
        volume: &str,
        ids: &Identities,
        path: &Path,
        readonly: bool,
    ) -> Result<(), NodeError> {
        // Read now, whatever the caller's view holds.
        let here = View::Paths(self.inner.mounter.as_ref()).at(path)?;
        if here.is_empty() || !here.iter().all(|m| ids.owns(m)) {
            return Err(NodeError::failed_precondition(format!(
                "after mounting, {} does not show volume {volume}",
                path.display()
            )));
        }
        if readonly && !here.last().is_some_and(|m| m.is_read_only()) {
            return Err(NodeError::failed_precondition(format!(
                "{} could not be made read-only for volume {volume}",
                path.display()
            )));
        }
        Ok(())
    }

    /// Undoes what a failed first attempt did, then forgets it. If undoing
    /// fails the record stays, so a later unstage or unpublish finishes.
    pub(super) fn undo(
        &self,
        rec: &mut NodeVolumeRecord,
        path: &Path,
        undo: Undo,
        forget: Part<'_>,
    ) {
        let result = (|| {
            if undo.mounted {
                let view = View::Paths(self.inner.mounter.as_ref());
                let ids = self.identities(&rec.volume_id, Some(rec), &view)?;
                self.unmount_ours(&rec.volume_id, path, &ids, view.at(path)?)?;
            }
            if let Some(created) = &undo.created {
                self.remove_if_empty(created)?;
            }
            if let Some(dev) = &undo.attached {
                self.detach(dev)?;
            }
            match forget {
                Part::Stage => rec.stage = None,
                Part::Publication(t) => rec.publications.retain(|p| p.target != t),
            }
            match undo.recorded {
                true => self.save(rec, forget),
                false => Ok(()),
            }
        })();
        if let Err(e) = result {
            tracing::warn!(volume = %rec.volume_id, path = %path.display(), error = %e,
                "could not undo a failed call; the record is kept for cleanup");
        }
    }

    /// Removes an empty directory or empty file (what NodePublish creates);
    /// leaves anything with content, which is not ours to delete.
    pub(super) fn remove_if_empty(&self, path: &Path) -> Result<(), NodeError> {
        match self.inner.mounter.remove_mount_point(path) {
            Err(e) if e.errno() == Some(mount_utils::Errno::ENOTEMPTY) => {
                tracing::warn!(path = %path.display(), "left in place: it is not empty");
                Ok(())
            }
            result => result.map_err(|e| NodeError::mount("removing", path, &e)),
        }
    }

    /// Unmounts every mount at `path`, each verified to be this volume's
    /// first; stops at anything else. `here` is what the caller just saw
    /// there (under its claim); after each unmount the mounts at `path` are
    /// read again only if it is still a mount point.
    pub(super) fn unmount_ours(
        &self,
        volume: &str,
        path: &Path,
        ids: &Identities,
        mut here: Vec<MountInfo>,
    ) -> Result<(), NodeError> {
        for _ in 0..MAX_STACKED {
            let Some(top) = here.last() else {
                return Ok(());
            };
            if !ids.owns(top) {
                return Err(covered(volume, path));
            }
            self.inner
                .mounter
                .unmount(path, false)
                .map_err(|e| NodeError::mount("unmounting", path, &e))?;
            // The common case, one mount, ends here.
            if !self.inner.mounter.is_mount_point(path).unwrap_or(true) {
                return Ok(());
            }
            here = View::Paths(self.inner.mounter.as_ref()).at(path)?;
        }
        Err(NodeError::failed_precondition(format!(
            "{} is still mounted after {MAX_STACKED} unmounts",
            path.display()
        )))
    }
}
