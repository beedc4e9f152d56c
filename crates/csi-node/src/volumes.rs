//! [`NodeVolumes`]: the node record plus the effects, in the order that
//! keeps crashes harmless: gather facts, decide ([`crate::rules`]), save
//! the intent, act, verify in mountinfo, save the outcome.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use csi_proto::v1::{
    NodePublishVolumeRequest, NodeStageVolumeRequest, NodeUnpublishVolumeRequest,
    NodeUnstageVolumeRequest, VolumeCondition,
};
use mount_utils::{LinuxLoopDevices, LoopDevices, LoopOptions, MountInfo, MountSource, Mounter};

use crate::error::NodeError;
use crate::observe::{
    Identities, PathFacts, PathKind, bind_of, bind_within, facts_of, filesystem_on, mounts_at,
    normalize, resolve, shows_device,
};
use crate::record::{
    Capability, Device, PublishRecord, PublishState, Source, StageRecord, StageState, VolumeRecord,
    sorted,
};
use crate::rules::{
    PublishDecision, PublishFacts, StageDecision, StageFacts, UnpublishDecision, UnpublishFacts,
    UnstageDecision, UnstageFacts, covered, decide_publish, decide_stage, decide_unpublish,
    decide_unstage, effective_readonly, mount_options,
};
use crate::seams::{FilesystemMount, PlainMount, VolumeLocator};
use csi_store::{RecordStore, Scan, Table as StoreTable};

/// The csi-store table of stage records, keyed by volume id.
pub const STAGED_TABLE: &str = "node-staged";
/// The csi-store table of publication records, keyed by target path.
pub const PUBLISHED_TABLE: &str = "node-published";

/// Whether a call changed anything on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Mounted, unmounted, attached or detached something.
    Changed,
    /// Already so (an idempotent repeat): nothing was touched.
    Unchanged,
}

/// What [`NodeVolumes::restore`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestoreReport {
    /// Volumes whose stage and publications are in place.
    pub healthy: Vec<String>,
    /// Volumes that could not be restored or whose record is unreadable,
    /// with why. They are reported abnormal; everything else is served.
    pub abnormal: BTreeMap<String, String>,
}

/// The mounts gone over when one path holds several stacked mounts.
const MAX_STACKED: usize = 16;

/// Where a call learns about mounts: the whole table, read once (unstage
/// needs it to find every use of a volume; startup reads it once for all),
/// or the mounter asked about one path at a time (`Mounter::mounts_at`,
/// `Mounter::containing_mount`), which on Linux reads only those mounts
/// instead of formatting and parsing every mount in the namespace.
enum View<'a> {
    Table(&'a [MountInfo]),
    Paths(&'a dyn Mounter),
}

impl View<'_> {
    /// The mounts stacked at `path`, bottom first.
    fn at(&self, path: &Path) -> Result<Vec<MountInfo>, NodeError> {
        match self {
            View::Table(table) => Ok(mounts_at(table, path).into_iter().cloned().collect()),
            View::Paths(mounter) => mounter
                .mounts_at(&resolve(path))
                .map_err(|e| NodeError::mount("reading the mounts at", path, &e)),
        }
    }

    /// What a bind mount of `path` shows ([`bind_of`]).
    fn bind_of(&self, path: &Path) -> Result<Option<MountSource>, NodeError> {
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
    fn facts(
        &self,
        path: &Path,
        ids: &Identities,
    ) -> Result<(PathFacts, Vec<MountInfo>), NodeError> {
        let here = self.at(path)?;
        Ok((facts_of(path, &here, ids), here))
    }
}

struct Inner {
    mounter: Arc<dyn Mounter>,
    loops: Arc<dyn LoopDevices>,
    staged: StoreTable<StageRecord>,
    published: StoreTable<PublishRecord>,
    locator: Arc<dyn VolumeLocator>,
    filesystems: Arc<dyn FilesystemMount>,
    single_node_multi_writer: bool,
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    records: BTreeMap<String, VolumeRecord>,
    /// Volumes reported abnormal, with why.
    abnormal: BTreeMap<String, String>,
    /// Targets whose publication record is unreadable, with why.
    abnormal_paths: BTreeMap<PathBuf, String>,
    busy_volumes: BTreeSet<String>,
    busy_paths: BTreeSet<PathBuf>,
}

impl Table {
    /// Adds the stored stages and publications to the records; what was
    /// set aside (now or in an earlier run) and not recorded anew since is
    /// reported abnormal.
    fn load(
        &mut self,
        staged: &StoreTable<StageRecord>,
        published: &StoreTable<PublishRecord>,
    ) -> Result<(), NodeError> {
        let unreadable = |why: &str| format!("its node record is unreadable ({why}); set aside");
        let Scan {
            records,
            quarantined,
        } = staged.scan()?;
        for (vol, s) in records {
            if s.volume_id == vol {
                self.entry(&vol).stage = Some(s);
            } else {
                self.abnormal.insert(vol, unreadable("another volume's"));
            }
        }
        for q in quarantined {
            if let Some(vol) = q.key {
                tracing::warn!(volume = %vol, reason = %q.reason, "unreadable stage record set aside");
                self.abnormal.insert(vol, unreadable(&q.reason));
            }
        }
        for vol in staged.quarantined_keys()? {
            if !self.records.contains_key(&vol) {
                self.abnormal
                    .entry(vol)
                    .or_insert_with(|| unreadable("set aside earlier"));
            }
        }
        let Scan {
            records,
            quarantined,
        } = published.scan()?;
        for (target, p) in records {
            if p.target == Path::new(&target) {
                self.entry(&p.volume_id.clone()).publications.push(p);
            } else {
                self.abnormal_paths
                    .insert(target.into(), unreadable("another target's"));
            }
        }
        for q in quarantined {
            if let Some(target) = q.key {
                tracing::warn!(%target, reason = %q.reason, "unreadable publication record set aside");
                self.abnormal_paths
                    .insert(target.into(), unreadable(&q.reason));
            }
        }
        for target in published.quarantined_keys()? {
            let target = PathBuf::from(target);
            if !self
                .records
                .values()
                .any(|r| r.publication(&target).is_some())
            {
                self.abnormal_paths
                    .entry(target)
                    .or_insert_with(|| unreadable("set aside earlier"));
            }
        }
        Ok(())
    }

    fn entry(&mut self, volume: &str) -> &mut VolumeRecord {
        self.records
            .entry(volume.to_owned())
            .or_insert_with(|| VolumeRecord::new(volume))
    }
}

/// Which part of a volume's record a save writes.
#[derive(Clone, Copy)]
enum Part<'a> {
    Stage,
    Publication(&'a Path),
}

/// What this node plugin staged and published, and the rules that guard
/// it: NodeStage, NodeUnstage, NodePublish and NodeUnpublish done safely,
/// for any driver whose volumes are directories or image files.
///
/// Cheap to clone; every method blocks (run it in `spawn_blocking`). Calls
/// on a volume or path another call is working on are ABORTED.
#[derive(Clone)]
pub struct NodeVolumes {
    inner: Arc<Inner>,
}

/// Sets up a [`NodeVolumes`].
pub struct NodeVolumesBuilder {
    mounter: Arc<dyn Mounter>,
    // Set later when NodeService's builder makes this one.
    store: Option<Arc<dyn RecordStore>>,
    locator: Arc<dyn VolumeLocator>,
    loops: Option<Arc<dyn LoopDevices>>,
    filesystems: Option<Arc<dyn FilesystemMount>>,
    single_node_multi_writer: bool,
}

impl NodeVolumesBuilder {
    /// Loop devices to use (default mount-utils' `LinuxLoopDevices`).
    pub fn loop_devices(mut self, loops: Arc<dyn LoopDevices>) -> Self {
        self.loops = Some(loops);
        self
    }

    /// How filesystems on devices are mounted (default [`PlainMount`];
    /// pass a `SafeFormatAndMount` to format new volumes).
    pub fn filesystem_mount(mut self, filesystems: Arc<dyn FilesystemMount>) -> Self {
        self.filesystems = Some(filesystems);
        self
    }

    /// Whether the plugin declares SINGLE_NODE_MULTI_WRITER (the repeat
    /// table then allows several targets for that mode).
    pub fn single_node_multi_writer(mut self, declared: bool) -> Self {
        self.single_node_multi_writer = declared;
        self
    }

    pub(crate) fn store(mut self, store: Arc<dyn RecordStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// Loads every record. An unreadable record does not fail this: its
    /// volume (or, for a publication, its target) is reported abnormal and
    /// served as having no record: nothing of it is touched unless
    /// verifiably its own.
    pub fn open(self) -> Result<NodeVolumes, NodeError> {
        let store = self.store.ok_or_else(|| NodeError::Store {
            reason: "no record store was given".into(),
            full: false,
        })?;
        let staged = StoreTable::with_shared(store.clone(), STAGED_TABLE)?;
        let published = StoreTable::with_shared(store, PUBLISHED_TABLE)?;
        let mut table = Table::default();
        table.load(&staged, &published)?;
        let filesystems = self
            .filesystems
            .unwrap_or_else(|| Arc::new(PlainMount(self.mounter.clone())));
        Ok(NodeVolumes {
            inner: Arc::new(Inner {
                loops: self
                    .loops
                    .unwrap_or_else(|| Arc::new(LinuxLoopDevices::new())),
                mounter: self.mounter,
                staged,
                published,
                locator: self.locator,
                filesystems,
                single_node_multi_writer: self.single_node_multi_writer,
                table: Mutex::new(table),
            }),
        })
    }
}

/// Marks a volume and its paths busy for one call.
struct Claim<'a> {
    table: &'a Mutex<Table>,
    volume: String,
    paths: Vec<PathBuf>,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        t.busy_volumes.remove(&self.volume);
        for p in &self.paths {
            t.busy_paths.remove(p);
        }
    }
}

/// What a call did so far, to undo when it fails before anything was
/// acknowledged.
#[derive(Default)]
struct Undo {
    attached: Option<crate::record::Device>,
    created: Option<PathBuf>,
    mounted: bool,
}

impl NodeVolumes {
    /// Starts a builder: `mounter` for the mount table, `store` for the
    /// records (tables [`STAGED_TABLE`] and [`PUBLISHED_TABLE`]), `locator`
    /// for where the driver keeps each volume.
    pub fn builder(
        mounter: Arc<dyn Mounter>,
        store: Arc<dyn RecordStore>,
        locator: Arc<dyn VolumeLocator>,
    ) -> NodeVolumesBuilder {
        Self::builder_without_store(mounter, locator).store(store)
    }

    pub(crate) fn builder_without_store(
        mounter: Arc<dyn Mounter>,
        locator: Arc<dyn VolumeLocator>,
    ) -> NodeVolumesBuilder {
        NodeVolumesBuilder {
            mounter,
            store: None,
            locator,
            loops: None,
            filesystems: None,
            single_node_multi_writer: false,
        }
    }

    pub(crate) fn mounter(&self) -> &Arc<dyn Mounter> {
        &self.inner.mounter
    }

    pub(crate) fn loop_devices(&self) -> &Arc<dyn LoopDevices> {
        &self.inner.loops
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.inner.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The record of a volume.
    pub fn record(&self, volume_id: &str) -> Option<VolumeRecord> {
        self.table().records.get(volume_id).cloned()
    }

    /// Every record, by volume id.
    pub fn records(&self) -> BTreeMap<String, VolumeRecord> {
        self.table().records.clone()
    }

    /// What is reported abnormal, with why: volumes by id (an unreadable
    /// stage record, a failed restore) and targets by path (an unreadable
    /// publication record).
    pub fn abnormal(&self) -> BTreeMap<String, String> {
        let t = self.table();
        let paths = t
            .abnormal_paths
            .iter()
            .map(|(p, why)| (p.display().to_string(), why.clone()));
        t.abnormal.clone().into_iter().chain(paths).collect()
    }

    fn claim(&self, volume: &str, paths: &[&Path]) -> Result<Claim<'_>, NodeError> {
        let mut t = self.table();
        if t.busy_volumes.contains(volume) {
            return Err(NodeError::Aborted(format!(
                "an operation on volume {volume} is in progress"
            )));
        }
        if let Some(p) = paths.iter().find(|p| t.busy_paths.contains(**p)) {
            return Err(NodeError::Aborted(format!(
                "an operation on {} is in progress",
                p.display()
            )));
        }
        t.busy_volumes.insert(volume.to_owned());
        for p in paths {
            t.busy_paths.insert(p.to_path_buf());
        }
        Ok(Claim {
            table: &self.inner.table,
            volume: volume.to_owned(),
            paths: paths.iter().map(|p| p.to_path_buf()).collect(),
        })
    }

    /// This volume's record and the other volume whose record names `path`.
    fn snapshot(&self, volume: &str, path: &Path) -> (Option<VolumeRecord>, Option<String>) {
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
    fn save(&self, rec: &VolumeRecord, part: Part<'_>) -> Result<(), NodeError> {
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
    fn save_progress(&self, rec: &VolumeRecord, part: Part<'_>) -> Result<(), NodeError> {
        match self.save(rec, part) {
            Err(e) if e.is_disk_full() => {
                tracing::warn!(volume = %rec.volume_id, "disk full: going on without saving progress");
                Ok(())
            }
            other => other,
        }
    }

    fn mount_table(&self) -> Result<Vec<MountInfo>, NodeError> {
        self.inner
            .mounter
            .mount_points()
            .map_err(|e| NodeError::mount("reading", Path::new("the mount table"), &e))
    }

    /// The loop devices attached to `image` now.
    fn devices_of(&self, image: &Path) -> Result<Vec<Device>, NodeError> {
        let loops = &self.inner.loops;
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
    fn attach(&self, image: &Path) -> Result<Device, NodeError> {
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

    /// Detaches `device`; one already gone is fine.
    fn detach(&self, device: &Device) -> Result<(), NodeError> {
        self.inner
            .loops
            .detach(&device.path)
            .map_err(|e| NodeError::loop_device("detaching", &device.path, &e))
    }

    /// What identifies `volume`'s mounts: from its stage record and from
    /// the driver's locator, with its devices found by backing file now.
    fn identities(
        &self,
        volume: &str,
        record: Option<&VolumeRecord>,
        view: &View<'_>,
    ) -> Result<Identities, NodeError> {
        let mut sources: Vec<Source> = record
            .and_then(|r| r.stage.as_ref())
            .map(|s| s.source.clone())
            .into_iter()
            .collect();
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
                Source::Directory(d) => {
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
                Source::Image(image) => {
                    for dev in self.devices_of(&image)? {
                        out.ids.push(filesystem_on(&dev));
                        out.ids.extend(view.bind_of(&dev.path)?);
                        out.devices.push(dev);
                    }
                }
            }
        }
        Ok(out)
    }

    /// NodeStageVolume. The volume's source comes from the locator; an
    /// image is attached (or its existing device reused), and for mount
    /// access its filesystem, or the directory, is mounted at the staging
    /// path, read-only for reader-only modes.
    pub fn stage(&self, req: &NodeStageVolumeRequest) -> Result<Outcome, NodeError> {
        let cap = Capability::from_proto(req.volume_capability.as_ref(), "volume_capability")?;
        let path = absolute(&req.staging_target_path, "staging_target_path")?;
        let mut req = req.clone();
        req.staging_target_path = path.to_string_lossy().into_owned();
        let readonly = effective_readonly(false, &cap);
        let options = mount_options(&cap, readonly)?;
        let vol = req.volume_id.as_str();
        let source = self
            .inner
            .locator
            .source(vol)
            .ok_or_else(|| NodeError::NotFound(format!("volume {vol} does not exist")))?;
        if cap.is_block() && matches!(source, Source::Directory(_)) {
            return Err(NodeError::FailedPrecondition(format!(
                "volume {vol} is a directory and cannot be staged for block access"
            )));
        }
        let _claim = self.claim(vol, &[&path])?;
        let view = View::Paths(self.inner.mounter.as_ref());
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
                device_attached: !ids.devices.is_empty(),
            },
        )?;
        let StageDecision::Stage { resume, mounted } = decision else {
            return Ok(Outcome::Unchanged);
        };
        let mut rec = record.unwrap_or_else(|| VolumeRecord::new(vol));
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
                publish_context: sorted(&req.publish_context),
                volume_context: sorted(&req.volume_context),
                state: StageState::Staging,
            },
        };
        rec.stage = Some(stage);
        self.save(&rec, Part::Stage)?;
        let mut undo = Undo::default();
        match self.stage_effects(&mut rec, &view, &ids, mounted, &options, &mut undo) {
            Ok(()) => {
                if let Some(s) = rec.stage.as_mut() {
                    s.state = StageState::Staged;
                    s.formatted |= s.device.is_some() && !s.capability.is_block();
                }
                self.save(&rec, Part::Stage)?;
                self.table().abnormal.remove(vol);
                tracing::info!(volume = %vol, path = %path.display(), "staged");
                Ok(Outcome::Changed)
            }
            Err(e) => {
                if !resume {
                    self.undo(&mut rec, &path, undo, Part::Stage);
                }
                Err(e)
            }
        }
    }

    fn stage_effects(
        &self,
        rec: &mut VolumeRecord,
        view: &View<'_>,
        ids: &Identities,
        mounted: bool,
        options: &[String],
        undo: &mut Undo,
    ) -> Result<(), NodeError> {
        let Some(s) = rec.stage.clone() else {
            return Ok(());
        };
        let device = match &s.source {
            Source::Directory(_) => None,
            Source::Image(image) => {
                let dev = match ids.devices.first() {
                    Some(d) => d.clone(),
                    None => {
                        if !image.is_file() {
                            return Err(NodeError::FailedPrecondition(format!(
                                "the image of volume {} is missing",
                                rec.volume_id
                            )));
                        }
                        let d = self.attach(image)?;
                        undo.attached = Some(d.clone());
                        d
                    }
                };
                if s.device.as_ref() != Some(&dev) {
                    if let Some(st) = rec.stage.as_mut() {
                        st.device = Some(dev.clone());
                    }
                    self.save(rec, Part::Stage)?;
                }
                self.inner.locator.prepare_device(&rec.volume_id, &dev)?;
                Some(dev)
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
            (Source::Directory(dir), _) => self
                .inner
                .mounter
                .bind_mount(dir, &s.path, s.readonly)
                .map_err(|e| NodeError::mount("staging at", &s.path, &e))?,
            (Source::Image(_), Some(dev)) => {
                let opts: Vec<&str> = options.iter().map(String::as_str).collect();
                self.inner.filesystems.mount_filesystem(
                    &dev.path,
                    &s.path,
                    s.capability.fs_type().unwrap_or_default(),
                    &opts,
                    !s.formatted,
                )?
            }
            (Source::Image(image), None) => {
                return Err(NodeError::FailedPrecondition(format!(
                    "no loop device for {}",
                    image.display()
                )));
            }
        }
        undo.mounted = true;
        self.verify(&rec.volume_id, rec, view, &s.path, s.readonly)
    }

    /// After a mount: the path shows exactly this volume, read-only when it
    /// must be. Otherwise an error (the caller undoes the mount). `view`
    /// is the caller's: what identifies the volume (the mounts holding its
    /// directory or device node) is not changed by the mount; the mounts at
    /// `path` are read anew, from those mounts alone where the kernel can
    /// (`Mounter::mounts_at`).
    fn verify(
        &self,
        volume: &str,
        rec: &VolumeRecord,
        view: &View<'_>,
        path: &Path,
        readonly: bool,
    ) -> Result<(), NodeError> {
        let ids = self.identities(volume, Some(rec), view)?;
        // Read now, whatever the caller's view holds.
        let here = View::Paths(self.inner.mounter.as_ref()).at(path)?;
        if here.is_empty() || !here.iter().all(|m| ids.owns(m)) {
            return Err(NodeError::FailedPrecondition(format!(
                "after mounting, {} does not show volume {volume}",
                path.display()
            )));
        }
        if readonly && !here.last().is_some_and(|m| m.is_read_only()) {
            return Err(NodeError::FailedPrecondition(format!(
                "{} could not be made read-only for volume {volume}",
                path.display()
            )));
        }
        Ok(())
    }

    /// Undoes what a failed first attempt did, then forgets it. If undoing
    /// fails the record stays, so a later unstage or unpublish finishes.
    fn undo(&self, rec: &mut VolumeRecord, path: &Path, undo: Undo, forget: Part<'_>) {
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
            self.save(rec, forget)
        })();
        if let Err(e) = result {
            tracing::warn!(volume = %rec.volume_id, path = %path.display(), error = %e,
                "could not undo a failed call; the record is kept for cleanup");
        }
    }

    /// Removes an empty directory or empty file (what NodePublish creates);
    /// leaves anything with content, which is not ours to delete.
    fn remove_if_empty(&self, path: &Path) -> Result<(), NodeError> {
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
    fn unmount_ours(
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
        Err(NodeError::FailedPrecondition(format!(
            "{} is still mounted after {MAX_STACKED} unmounts",
            path.display()
        )))
    }

    /// NodeUnstageVolume: refuses while the volume is published anywhere;
    /// unmounts the staging path only where it shows this volume; detaches
    /// the volume's devices, found by backing file (so also after a crash
    /// that lost the record of the attach).
    pub fn unstage(&self, req: &NodeUnstageVolumeRequest) -> Result<Outcome, NodeError> {
        let path = absolute(&req.staging_target_path, "staging_target_path")?;
        let vol = req.volume_id.as_str();
        let _claim = self.claim(vol, &[&path])?;
        let table = self.mount_table()?;
        let view = View::Table(&table);
        let (record, claimed) = self.snapshot(vol, &path);
        let known = self.inner.locator.source(vol).is_some();
        let ids = self.identities(vol, record.as_ref(), &view)?;
        let (here, mounts_here) = view.facts(&path, &ids)?;
        let mut in_use: Vec<PathBuf> = record
            .iter()
            .flat_map(|r| r.publications.iter().map(|p| p.target.clone()))
            .collect();
        for p in ids.uses(&table, &resolve(&path)) {
            if !in_use.iter().any(|t| resolve(t) == p) {
                in_use.push(p.to_path_buf());
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
            return Ok(Outcome::Unchanged);
        };
        let mut rec = record.unwrap_or_else(|| VolumeRecord::new(vol));
        if let Some(s) = rec.stage.as_mut() {
            s.state = StageState::Unstaging;
            self.save_progress(&rec, Part::Stage)?;
        }
        if unmount {
            self.unmount_ours(vol, &path, &ids, mounts_here)?;
        }
        for dev in &ids.devices {
            self.detach(dev)?;
            tracing::info!(volume = %vol, device = %dev.path.display(), "detached");
        }
        rec.stage = None;
        self.save(&rec, Part::Stage)?;
        tracing::info!(volume = %vol, path = %path.display(), "unstaged");
        Ok(Outcome::Changed)
    }

    /// NodePublishVolume: binds the staging path (mount access), the
    /// volume's device node (block access) or, without staging, the
    /// volume's directory at the target; read-only always wins.
    pub fn publish(&self, req: &NodePublishVolumeRequest) -> Result<Outcome, NodeError> {
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
        let view = View::Paths(self.inner.mounter.as_ref());
        let (record, claimed) = self.snapshot(vol, &target);
        let located = self.inner.locator.source(vol);
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
            return Ok(Outcome::Unchanged);
        };
        let source = match (staged, &staging, &located) {
            (Some(_), Some(_), _) if cap.is_block() => {
                ids.devices.first().map(|d| d.path.clone()).ok_or_else(|| {
                    NodeError::FailedPrecondition(format!(
                        "the device of staged volume {vol} is no longer attached"
                    ))
                })?
            }
            (Some(s), Some(_), _) => s.path.clone(),
            (_, None, Some(Source::Directory(dir))) if !cap.is_block() => dir.clone(),
            _ => {
                return Err(NodeError::FailedPrecondition(format!(
                    "volume {vol} must be staged before it is published"
                )));
            }
        };
        let mut rec = record.unwrap_or_else(|| VolumeRecord::new(vol));
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
        self.save(&rec, Part::Publication(&target))?;
        let mut undo = Undo::default();
        let result = self.bind(
            &rec,
            &view,
            &source,
            &target,
            cap.is_block(),
            readonly,
            &options,
            mounted,
            &mut undo,
        );
        match result {
            Ok(()) => {
                if let Some(p) = rec.publications.iter_mut().find(|p| p.target == target) {
                    p.state = PublishState::Published;
                }
                self.save(&rec, Part::Publication(&target))?;
                tracing::info!(volume = %vol, target = %target.display(), readonly, "published");
                Ok(Outcome::Changed)
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
    fn bind(
        &self,
        rec: &VolumeRecord,
        view: &View<'_>,
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
        self.verify(&rec.volume_id, rec, view, target, readonly)
    }

    /// NodeUnpublishVolume: unmounts the target only where it shows this
    /// volume and removes it if empty; a target recorded for another volume,
    /// or holding something else, is NOT_FOUND and left alone.
    pub fn unpublish(&self, req: &NodeUnpublishVolumeRequest) -> Result<Outcome, NodeError> {
        let target = absolute(&req.target_path, "target_path")?;
        let vol = req.volume_id.as_str();
        let _claim = self.claim(vol, &[&target])?;
        let view = View::Paths(self.inner.mounter.as_ref());
        let (record, claimed) = self.snapshot(vol, &target);
        let known = self.inner.locator.source(vol).is_some();
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
            return Ok(Outcome::Unchanged);
        };
        let mut rec = record.unwrap_or_else(|| VolumeRecord::new(vol));
        if let Some(p) = rec.publications.iter_mut().find(|p| p.target == target) {
            p.state = PublishState::Unpublishing;
            self.save_progress(&rec, Part::Publication(&target))?;
        }
        if unmount {
            self.unmount_ours(vol, &target, &ids, mounts_here)?;
        }
        if remove {
            self.remove_if_empty(&target)?;
        }
        rec.publications.retain(|p| p.target != target);
        self.save(&rec, Part::Publication(&target))?;
        tracing::info!(volume = %vol, target = %target.display(), "unpublished");
        Ok(Outcome::Changed)
    }

    /// The volume's record when `path` is its staging path or one of its
    /// targets, for NodeGetVolumeStats and NodeExpandVolume (the staged
    /// device and the staging path); NOT_FOUND otherwise.
    pub fn record_at(&self, volume_id: &str, path: &str) -> Result<VolumeRecord, NodeError> {
        let path = volume_path(volume_id, path)?;
        self.record(volume_id)
            .filter(|r| r.names(&path))
            .ok_or_else(|| not_there(volume_id, &path))
    }

    /// For NodeGetVolumeStats: the condition of `volume_id` at `path` (its
    /// staging path, a target, or for a raw block volume any block device
    /// node of its device, such as the pod's `volumeDevices` path), checked
    /// now. NOT_FOUND when the volume is not there; a volume whose record is
    /// unreadable or that could not be restored is abnormal at any path.
    pub fn volume_condition(
        &self,
        volume_id: &str,
        path: &str,
    ) -> Result<VolumeCondition, NodeError> {
        let path = volume_path(volume_id, path)?;
        let (record, abnormal) = {
            let t = self.table();
            let why = t
                .abnormal
                .get(volume_id)
                .or_else(|| t.abnormal_paths.get(&path));
            (t.records.get(volume_id).cloned(), why.cloned())
        };
        let named = record.as_ref().is_some_and(|r| r.names(&path));
        let abnormal_here = |message: String| VolumeCondition {
            abnormal: true,
            message,
        };
        if let (Some(why), true) = (&abnormal, named || record.is_none()) {
            return Ok(abnormal_here(why.clone()));
        }
        let view = View::Paths(self.inner.mounter.as_ref());
        let ids = self.identities(volume_id, record.as_ref(), &view)?;
        if !named {
            // A raw block volume is also wherever its device node is: the
            // kubelet asks at the pod's volumeDevices path.
            let stage = record.as_ref().and_then(|r| r.stage.as_ref());
            return match ids.devices.iter().find(|d| shows_device(&path, d)) {
                Some(d) if stage.is_some_and(|s| s.capability.is_block()) => Ok(VolumeCondition {
                    abnormal: false,
                    message: format!("its device {} is present", d.path.display()),
                }),
                _ => Err(not_there(volume_id, &path)),
            };
        }
        let (here, _) = view.facts(&path, &ids)?;
        let stage = record.as_ref().and_then(|r| r.stage.as_ref());
        let block_stage = stage.is_some_and(|s| s.path == path && s.capability.is_block());
        Ok(if here.has_foreign_mount() {
            abnormal_here(format!("something else is mounted at {}", path.display()))
        } else if block_stage {
            match ids.devices.first() {
                Some(d) => VolumeCondition {
                    abnormal: false,
                    message: format!("attached as {}", d.path.display()),
                },
                None => abnormal_here("its device is no longer attached".into()),
            }
        } else if here.is_ours() {
            VolumeCondition {
                abnormal: false,
                message: "mounted".into(),
            }
        } else {
            abnormal_here(format!("{} is not mounted", path.display()))
        })
    }

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

    fn restore_volume(&self, vol: &str, mut rec: VolumeRecord) -> Result<(), NodeError> {
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
            false => Err(NodeError::FailedPrecondition(problems.join("; "))),
        }
    }

    fn restore_stage(&self, rec: &mut VolumeRecord, s: &StageRecord) -> Result<(), NodeError> {
        let gone = |what: &str, p: &Path| {
            NodeError::FailedPrecondition(format!("its {what} {} is gone", p.display()))
        };
        match &s.source {
            Source::Directory(d) if !d.is_dir() => return Err(gone("directory", d)),
            Source::Image(f) if !f.is_file() => return Err(gone("image", f)),
            _ => {}
        }
        let table = self.mount_table()?;
        let view = View::Table(&table);
        let ids = self.identities(&rec.volume_id, Some(rec), &view)?;
        let (here, _) = view.facts(&s.path, &ids)?;
        if here.kind == PathKind::Symlink || here.has_foreign_mount() {
            return Err(NodeError::FailedPrecondition(format!(
                "its staging path {} is now a symlink or holds something else",
                s.path.display()
            )));
        }
        if !s.capability.is_block()
            && !here.is_ours()
            && here.kind != PathKind::Absent
            && here.kind != PathKind::Directory
        {
            return Err(NodeError::FailedPrecondition(format!(
                "its staging path {} is no longer a directory",
                s.path.display()
            )));
        }
        let options = mount_options(&s.capability, s.readonly)?;
        let mut undo = Undo::default();
        let result = self.stage_effects(rec, &view, &ids, here.is_ours(), &options, &mut undo);
        if result.is_ok() && undo.mounted {
            tracing::info!(volume = %rec.volume_id, path = %s.path.display(), "restored staging mount");
        }
        result
    }

    fn restore_publication(&self, rec: &VolumeRecord, p: &PublishRecord) -> Result<(), NodeError> {
        let table = self.mount_table()?;
        let view = View::Table(&table);
        let ids = self.identities(&rec.volume_id, Some(rec), &view)?;
        let (here, _) = view.facts(&p.target, &ids)?;
        if here.is_ours() {
            return Ok(());
        }
        let block = p.capability.is_block();
        let refuse = |what: &str| {
            Err(NodeError::FailedPrecondition(format!(
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
            (Some(_), true) => match ids.devices.first() {
                Some(d) => d.path.clone(),
                None => return refuse("lost its device"),
            },
            (Some(s), false) => s.path.clone(),
            (None, _) => match self.inner.locator.source(&rec.volume_id) {
                Some(Source::Directory(d)) => d,
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

/// An absolute, lexically normalised path from a request field.
fn absolute(path: &str, field: &str) -> Result<PathBuf, NodeError> {
    let p = Path::new(path);
    if path.is_empty() {
        return Err(NodeError::invalid(field, "required"));
    }
    if !p.is_absolute() {
        return Err(NodeError::invalid(field, "must be an absolute path"));
    }
    Ok(normalize(p))
}

/// A `volume_path` (NodeGetVolumeStats, NodeExpandVolume): a relative one
/// names no volume, which is NOT_FOUND as csi-sanity expects.
fn volume_path(volume_id: &str, path: &str) -> Result<PathBuf, NodeError> {
    absolute(path, "volume_path").map_err(|e| match e {
        NodeError::InvalidArgument { reason, .. } if reason != "required" => {
            not_there(volume_id, Path::new(path))
        }
        e => e,
    })
}

fn not_there(volume_id: &str, path: &Path) -> NodeError {
    NodeError::NotFound(format!(
        "volume {volume_id} is not staged or published at {}",
        path.display()
    ))
}
