//! [`MemBackend`]: a [`VolumeBackend`] in memory, with knobs to make it
//! full, slow or failing, for tests of the engine and of drivers built on it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

use csi_driver::{CsiError, CsiResult};

use crate::engine::VolumeBackend;
use crate::records::{SnapshotRecord, VolumeRecord};
use crate::util::{DataOnDisk, Source};

/// Volume and snapshot "data" as sizes by id.
#[derive(Debug, Default)]
pub struct MemBackend {
    data: Mutex<Data>,
    /// Creates and snapshots fail with RESOURCE_EXHAUSTED (a full disk).
    pub full: AtomicBool,
    /// What `free_space` answers.
    pub free: AtomicI64,
    paused: Mutex<bool>,
    resumed: Condvar,
}

/// What a [`MemBackend`] holds.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Data {
    /// Volume id → size.
    pub volumes: BTreeMap<String, i64>,
    /// Snapshot id → size.
    pub snapshots: BTreeMap<String, i64>,
    /// How many volumes were made (a retry that runs the work again shows).
    pub made: usize,
}

impl MemBackend {
    /// An empty backend with 1 TiB free.
    pub fn new() -> Self {
        let b = Self::default();
        b.free.store(1 << 40, Ordering::SeqCst);
        b
    }

    /// A copy of what it holds.
    pub fn data(&self) -> Data {
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

    fn check_space(&self) -> CsiResult<()> {
        if self.full.load(Ordering::SeqCst) {
            return Err(CsiError::ResourceExhausted(
                "no space left on device".into(),
            ));
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, Data> {
        self.data.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl VolumeBackend for MemBackend {
    fn create_volume(&self, volume: &VolumeRecord) -> CsiResult<()> {
        self.wait_while_paused();
        self.check_space()?;
        let mut data = self.lock();
        let present = match &volume.source {
            Some(Source::Snapshot(id)) => data.snapshots.contains_key(id),
            Some(Source::Volume(id)) => data.volumes.contains_key(id),
            None => true,
        };
        if !present {
            return Err(CsiError::Internal("the source's data is gone".into()));
        }
        data.volumes
            .insert(volume.id.clone(), volume.capacity_bytes);
        data.made += 1;
        Ok(())
    }

    fn delete_volume(&self, id: &str) -> CsiResult<bool> {
        Ok(self.lock().volumes.remove(id).is_some())
    }

    fn create_snapshot(&self, snapshot: &SnapshotRecord) -> CsiResult<()> {
        self.check_space()?;
        let mut data = self.lock();
        if !data.volumes.contains_key(&snapshot.source_volume_id) {
            return Err(CsiError::Internal("the source's data is gone".into()));
        }
        data.snapshots
            .insert(snapshot.id.clone(), snapshot.size_bytes);
        Ok(())
    }

    fn delete_snapshot(&self, id: &str) -> CsiResult<bool> {
        Ok(self.lock().snapshots.remove(id).is_some())
    }

    fn expand_volume(&self, volume: &VolumeRecord, size: i64) -> CsiResult<()> {
        self.check_space()?;
        self.lock().volumes.insert(volume.id.clone(), size);
        Ok(())
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

    fn free_space(&self) -> i64 {
        self.free.load(Ordering::SeqCst)
    }

    fn cut_group(&self, members: &[(SnapshotRecord, VolumeRecord)]) -> CsiResult<()> {
        self.check_space()?;
        for (snap, _) in members {
            self.create_snapshot(snap)?;
        }
        Ok(())
    }
}
