//! [`NodeVolumes`]: the node record plus the effects, in the order that
//! keeps crashes harmless: gather facts, decide ([`crate::rules`]), save
//! the intent, act, verify in mountinfo, save the outcome.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use std::time::Duration;

use mount_utils::{
    BlockDevices, FUSE_DEVICE, LinuxBlockDevices, LinuxLoopDevices, LoopDevices, Mounter, Resolver,
    SystemResolver,
};

use crate::error::NodeError;
use crate::observe::normalize;
use crate::record::{NodeVolumeRecord, PublishRecord, StageRecord};
use crate::seams::{FilesystemMount, PlainMount, VolumeLocator};
use csi_store::{RecordStore, Table as StoreTable};

/// The csi-store table of stage records, keyed by volume id.
pub const STAGED_TABLE: &str = "node-staged";
/// The csi-store table of publication records, keyed by target path.
pub const PUBLISHED_TABLE: &str = "node-published";

/// Whether a call changed anything on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeOutcome {
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

mod condition;
mod device_node;
mod effects;
mod filesystem;
mod publish;
mod restore;
mod stage;
mod table;
mod unpublish;
mod unstage;
mod view;

use table::Table;
use view::{Snapshot, View};

struct Inner {
    mounter: Arc<dyn Mounter>,
    loops: Arc<dyn LoopDevices>,
    staged: StoreTable<StageRecord>,
    published: StoreTable<PublishRecord>,
    locator: Arc<dyn VolumeLocator>,
    filesystems: Arc<dyn FilesystemMount>,
    devices: Arc<dyn BlockDevices>,
    resolver: Arc<dyn Resolver>,
    fuse_device: PathBuf,
    device_timeout: Duration,
    private_dir: Option<PathBuf>,
    single_node_multi_writer: bool,
    table: Mutex<Table>,
}

/// Which part of a volume's record a save writes.
#[derive(Clone, Copy)]
enum Part<'a> {
    Stage,
    Publication(&'a Path),
}

/// What this node plugin staged and published, and the rules that guard
/// it: NodeStage, NodeUnstage, NodePublish and NodeUnpublish done safely,
/// for any [`VolumeSource`](crate::VolumeSource): directories, image files,
/// attached devices and filesystems mounted by type.
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
    devices: Option<Arc<dyn BlockDevices>>,
    resolver: Option<Arc<dyn Resolver>>,
    fuse_device: PathBuf,
    device_timeout: Duration,
    private_dir: Option<PathBuf>,
    single_node_multi_writer: bool,
}

/// How long NodeStage waits for an attached device to appear by default.
pub const DEFAULT_DEVICE_TIMEOUT: Duration = Duration::from_secs(60);

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

    /// Where attached devices ([`VolumeSource::Device`](crate::VolumeSource::Device))
    /// are looked for (default mount-utils' `LinuxBlockDevices`).
    pub fn block_devices(mut self, devices: Arc<dyn BlockDevices>) -> Self {
        self.devices = Some(devices);
        self
    }

    /// How the servers of network filesystems are looked up (default
    /// mount-utils' `SystemResolver`): NFS, SMB and Ceph sources name them
    /// by host, and mount(2) takes addresses (see `resolve_servers`).
    pub fn resolver(mut self, resolver: Arc<dyn Resolver>) -> Self {
        self.resolver = Some(resolver);
        self
    }

    /// The FUSE device a FUSE filesystem volume is mounted through
    /// (mount-utils' `FUSE_DEVICE`, `/dev/fuse`, by default; a test on a
    /// fake mounter may give `/dev/null`).
    pub fn fuse_device(mut self, device: impl Into<PathBuf>) -> Self {
        self.fuse_device = device.into();
        self
    }

    /// How long NodeStage waits for an attached device to appear
    /// ([`DEFAULT_DEVICE_TIMEOUT`] by default); then NOT_FOUND naming it.
    pub fn device_timeout(mut self, timeout: Duration) -> Self {
        self.device_timeout = timeout;
        self
    }

    /// The directory only this plugin mounts in (under its state
    /// directory; [`NodeServiceBuilder::open_in`](crate::NodeServiceBuilder::open_in)
    /// uses `<dir>/mounts`): a filesystem volume
    /// ([`VolumeSource::Filesystem`](crate::VolumeSource::Filesystem)) is
    /// mounted there first, then moved to its staging path. On Linux it must
    /// not be on a shared mount (`MS_MOVE` refuses one).
    pub fn private_mounts(mut self, dir: impl Into<PathBuf>) -> Self {
        self.private_dir = Some(dir.into());
        self
    }

    pub(crate) fn has_private_mounts(&self) -> bool {
        self.private_dir.is_some()
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
                devices: self.devices.unwrap_or_else(|| Arc::new(LinuxBlockDevices)),
                resolver: self.resolver.unwrap_or_else(|| Arc::new(SystemResolver)),
                fuse_device: self.fuse_device,
                device_timeout: self.device_timeout,
                private_dir: self.private_dir,
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
    /// The call saved its intent, so forgetting it is a delete.
    recorded: bool,
}

impl Undo {
    /// Whether the call has done nothing yet.
    fn is_empty(&self) -> bool {
        self.attached.is_none() && self.created.is_none() && !self.mounted && !self.recorded
    }
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
            devices: None,
            resolver: None,
            fuse_device: PathBuf::from(FUSE_DEVICE),
            device_timeout: DEFAULT_DEVICE_TIMEOUT,
            private_dir: None,
            single_node_multi_writer: false,
        }
    }

    pub(crate) fn mounter(&self) -> &Arc<dyn Mounter> {
        &self.inner.mounter
    }

    pub(crate) fn loop_devices(&self) -> &Arc<dyn LoopDevices> {
        &self.inner.loops
    }

    pub(crate) fn block_devices(&self) -> &Arc<dyn BlockDevices> {
        &self.inner.devices
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.inner.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The record of a volume.
    pub fn record(&self, volume_id: &str) -> Option<NodeVolumeRecord> {
        self.table().records.get(volume_id).cloned()
    }

    /// Every record, by volume id.
    pub fn records(&self) -> BTreeMap<String, NodeVolumeRecord> {
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
}

/// Whether a stage is a bind mount of a directory: its own evidence in
/// mountinfo, so it needs no intent or progress record.
fn is_bind(stage: &StageRecord) -> bool {
    matches!(stage.source, crate::record::VolumeSource::Directory(_))
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
        NodeError::Csi(csi_driver::CsiError::InvalidArgument { reason, .. })
            if reason != "required" =>
        {
            not_there(volume_id, Path::new(path))
        }
        e => e,
    })
}

/// ABORTED: `volume` has yet to be put back after a restart.
fn restoring(volume: &str) -> NodeError {
    NodeError::aborted(format!("volume {volume} is being restored after a restart"))
}

fn not_there(volume_id: &str, path: &Path) -> NodeError {
    NodeError::not_found(format!(
        "volume {volume_id} is not staged or published at {}",
        path.display()
    ))
}
