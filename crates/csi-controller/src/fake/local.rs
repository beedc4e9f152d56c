//! [`FakeControllerBackend`]: local data in memory, with knobs to make it
//! full, slow or failing.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

use csi_driver::{CsiError, async_trait};

use crate::access::ContentSource;
use crate::backend::{
    AttachBackend, AttachState, ControllerBackend, ExpandBackend, GroupSnapshotBackend,
    ModifyBackend, SnapshotBackend,
};
use crate::error::BackendResult;
use crate::files::DataOnDisk;
use crate::records::{SnapshotRecord, VolumeRecord};

/// Volume and snapshot "data" as sizes by id.
#[derive(Debug, Default)]
pub struct FakeControllerBackend {
    data: Mutex<FakeData>,
    offers: Offers,
    /// Creates and snapshots fail with RESOURCE_EXHAUSTED (a full disk).
    pub full: AtomicBool,
    /// What `free_space` answers.
    pub free: AtomicI64,
    paused: Mutex<bool>,
    resumed: Condvar,
}

/// Which optional abilities a [`FakeControllerBackend`] hands out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Offers {
    /// Snapshots and restores.
    pub snapshots: bool,
    /// Clones.
    pub clones: bool,
    /// Expansion.
    pub expand: bool,
    /// Mutable parameters.
    pub modify: bool,
    /// Group snapshots.
    pub groups: bool,
    /// Attach/detach.
    pub attach: bool,
}

impl Offers {
    /// Every ability.
    pub fn all() -> Self {
        Self {
            snapshots: true,
            clones: true,
            expand: true,
            modify: true,
            groups: true,
            attach: true,
        }
    }
}

/// What a [`FakeControllerBackend`] holds.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct FakeData {
    /// Volume id → size.
    pub volumes: BTreeMap<String, i64>,
    /// Snapshot id → size.
    pub snapshots: BTreeMap<String, i64>,
    /// How many volumes were made (a retry that runs the work again shows).
    pub made: usize,
}

impl FakeControllerBackend {
    /// An empty backend with 1 TiB free and every ability.
    pub fn new() -> Self {
        Self::with_offers(Offers::all())
    }

    /// An empty backend with 1 TiB free and only the abilities in `offers`.
    pub fn with_offers(offers: Offers) -> Self {
        let b = Self {
            offers,
            ..Self::default()
        };
        b.free.store(1 << 40, Ordering::SeqCst);
        b
    }

    /// A copy of what it holds.
    pub fn data(&self) -> FakeData {
        self.lock().clone()
    }

    /// Adds volume data no record owns (what a crash leaves).
    pub fn insert_volume(&self, id: &str, size: i64) {
        self.lock().volumes.insert(id.to_owned(), size);
    }

    /// Makes every create wait until [`Self::resume`] (a long copy).
    pub fn pause(&self) {
        *self.paused.lock().unwrap_or_else(|e| e.into_inner()) = true;
    }

    /// Lets waiting creates go on.
    pub fn resume(&self) {
        *self.paused.lock().unwrap_or_else(|e| e.into_inner()) = false;
        self.resumed.notify_all();
    }

    fn wait_while_paused(&self) {
        let mut paused = self.paused.lock().unwrap_or_else(|e| e.into_inner());
        while *paused {
            paused = self.resumed.wait(paused).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn check_space(&self) -> BackendResult<()> {
        if self.full.load(Ordering::SeqCst) {
            return Err(CsiError::ResourceExhausted("no space left on device".into()).into());
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, FakeData> {
        self.data.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn snapshot_now(&self, snapshot: &SnapshotRecord) -> BackendResult<()> {
        self.check_space()?;
        let mut data = self.lock();
        if !data.volumes.contains_key(&snapshot.source_volume_id) {
            return Err(CsiError::Internal("the source's data is gone".into()).into());
        }
        data.snapshots
            .insert(snapshot.id.clone(), snapshot.size_bytes);
        Ok(())
    }
}

#[async_trait]
impl ControllerBackend for FakeControllerBackend {
    async fn create_volume(&self, volume: &mut VolumeRecord) -> BackendResult<()> {
        self.wait_while_paused();
        self.check_space()?;
        let mut data = self.lock();
        let present = match &volume.source {
            Some(ContentSource::Snapshot(id)) => data.snapshots.contains_key(id),
            Some(ContentSource::Volume(id)) => data.volumes.contains_key(id),
            None => true,
        };
        if !present {
            return Err(CsiError::Internal("the source's data is gone".into()).into());
        }
        data.volumes
            .insert(volume.id.clone(), volume.capacity_bytes);
        data.made += 1;
        Ok(())
    }

    async fn delete_volume(&self, id: &str) -> BackendResult<bool> {
        Ok(self.lock().volumes.remove(id).is_some())
    }

    fn snapshots(&self) -> Option<&dyn SnapshotBackend> {
        self.offers.snapshots.then_some(self as _)
    }
    fn expansion(&self) -> Option<&dyn ExpandBackend> {
        self.offers.expand.then_some(self as _)
    }
    fn modification(&self) -> Option<&dyn ModifyBackend> {
        self.offers.modify.then_some(self as _)
    }
    fn group_snapshots(&self) -> Option<&dyn GroupSnapshotBackend> {
        self.offers.groups.then_some(self as _)
    }
    fn attacher(&self) -> Option<&dyn AttachBackend> {
        self.offers.attach.then_some(self as _)
    }
    fn clones_volumes(&self) -> bool {
        self.offers.clones
    }

    fn data(&self) -> DataOnDisk {
        let data = self.lock();
        let by_id =
            |m: &BTreeMap<String, i64>| m.keys().map(|id| (id.clone(), id.into())).collect();
        DataOnDisk {
            volumes: by_id(&data.volumes),
            snapshots: by_id(&data.snapshots),
            foreign: Vec::new(),
        }
    }

    fn free_space(&self) -> Option<i64> {
        Some(self.free.load(Ordering::SeqCst))
    }
}

#[async_trait]
impl SnapshotBackend for FakeControllerBackend {
    async fn create_snapshot(&self, snapshot: &mut SnapshotRecord) -> BackendResult<()> {
        self.snapshot_now(snapshot)
    }

    async fn delete_snapshot(&self, id: &str) -> BackendResult<bool> {
        Ok(self.lock().snapshots.remove(id).is_some())
    }
}

#[async_trait]
impl ExpandBackend for FakeControllerBackend {
    async fn expand_volume(&self, volume: &VolumeRecord, size: i64) -> BackendResult<()> {
        self.check_space()?;
        self.lock().volumes.insert(volume.id.clone(), size);
        Ok(())
    }
}

impl ModifyBackend for FakeControllerBackend {}

#[async_trait]
impl GroupSnapshotBackend for FakeControllerBackend {
    async fn cut_group(&self, members: &[(SnapshotRecord, VolumeRecord)]) -> BackendResult<()> {
        self.check_space()?;
        for (snap, _) in members {
            self.snapshot_now(snap)?;
        }
        Ok(())
    }
}

#[async_trait]
impl AttachBackend for FakeControllerBackend {
    async fn attach(
        &self,
        volume: &VolumeRecord,
        _node: &str,
        _readonly: bool,
    ) -> BackendResult<AttachState> {
        let context = HashMap::from([("volume".to_owned(), volume.id.clone())]);
        Ok(AttachState::Attached(context))
    }

    async fn detach(&self, _id: &str, _node: &str) -> BackendResult<()> {
        Ok(())
    }
}
