//! [`FakeProvider`]: a cloud-style provider in memory. It names volumes
//! itself, is the source of truth (the service keeps no records), makes
//! volumes and attaches them as actions that take time on its clock, and
//! answers the errors queued with [`FakeProvider::fail_next`].

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use csi_driver::async_trait;
use csi_driver::clock::Clock;

use crate::backend::{
    AttachBackend, AttachState, ControllerBackend, ExpandBackend, ProviderPage, ProviderSnapshot,
    ProviderVolume, SnapshotBackend, VolumeCatalog,
};
use crate::error::{BackendError, BackendResult};
use crate::records::{SnapshotRecord, VolumeRecord};

/// A provider in memory; see the module docs.
#[derive(Debug)]
pub struct FakeProvider {
    clock: Arc<dyn Clock>,
    full_featured: bool,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    volumes: BTreeMap<String, Volume>,
    snapshots: BTreeMap<String, SnapshotRecord>,
    faults: VecDeque<BackendError>,
    action_time: Duration,
    next_id: u64,
    creates: usize,
    attaches: usize,
    calls: usize,
}

#[derive(Debug, Clone)]
struct Volume {
    record: VolumeRecord,
    ready_at: Instant,
    /// node → (read-only, attached at).
    attached: BTreeMap<String, (bool, Instant)>,
}

impl FakeProvider {
    /// A provider with snapshots, expansion and attach, whose actions
    /// finish at once, on `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            full_featured: true,
            state: Mutex::default(),
        }
    }

    /// A provider that only makes and removes volumes.
    pub fn volumes_only(clock: Arc<dyn Clock>) -> Self {
        Self {
            full_featured: false,
            ..Self::new(clock)
        }
    }

    /// Makes creates and attaches take `time` on the clock from now on.
    pub fn set_action_time(&self, time: Duration) {
        self.lock().action_time = time;
    }

    /// Makes the next call (any method) fail with `error`; queued errors
    /// are answered in order.
    pub fn fail_next(&self, error: BackendError) {
        self.lock().faults.push_back(error);
    }

    /// How many volumes were ever asked for.
    pub fn creates(&self) -> usize {
        self.lock().creates
    }

    /// How many attaches were ever started.
    pub fn attaches(&self) -> usize {
        self.lock().attaches
    }

    /// How many calls were made (failed ones included).
    pub fn calls(&self) -> usize {
        self.lock().calls
    }

    /// The names of the volumes it holds.
    pub fn volume_names(&self) -> Vec<String> {
        let state = self.lock();
        state
            .volumes
            .values()
            .map(|v| v.record.name.clone())
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a call and answers the next queued fault, if any.
    fn call(&self) -> BackendResult<MutexGuard<'_, State>> {
        let mut state = self.lock();
        state.calls += 1;
        match state.faults.pop_front() {
            Some(e) => Err(e),
            None => Ok(state),
        }
    }

    fn view(&self, v: &Volume) -> ProviderVolume {
        let now = self.clock.now();
        ProviderVolume {
            record: v.record.clone(),
            ready: now >= v.ready_at,
            attached: v
                .attached
                .iter()
                .map(|(n, (ro, _))| (n.clone(), *ro))
                .collect(),
        }
    }
}

fn page<T: Clone>(all: Vec<T>, token: &str, max: i32) -> BackendResult<ProviderPage<T>> {
    let start: usize = match token {
        "" => 0,
        t => t.parse().map_err(|_| {
            BackendError::Csi(csi_driver::CsiError::Aborted(format!(
                "starting_token {t:?} is not one this provider gave"
            )))
        })?,
    };
    let max = if max <= 0 { all.len() } else { max as usize };
    let entries: Vec<T> = all.iter().skip(start).take(max).cloned().collect();
    let end = start + entries.len();
    Ok(ProviderPage {
        entries,
        next_token: if end < all.len() {
            end.to_string()
        } else {
            String::new()
        },
    })
}

#[async_trait]
impl ControllerBackend for FakeProvider {
    async fn create_volume(&self, volume: &mut VolumeRecord) -> BackendResult<()> {
        let mut state = self.call()?;
        if state.volumes.values().any(|v| v.record.name == volume.name) {
            return Err(BackendError::Conflict(format!(
                "a volume named {:?} exists",
                volume.name
            )));
        }
        state.next_id += 1;
        state.creates += 1;
        volume.id = format!("pv-{}", state.next_id);
        volume.request.clear();
        let ready_at = self.clock.now() + state.action_time;
        let record = volume.clone();
        state.volumes.insert(
            record.id.clone(),
            Volume {
                record,
                ready_at,
                attached: BTreeMap::new(),
            },
        );
        Ok(())
    }

    async fn delete_volume(&self, id: &str) -> BackendResult<bool> {
        Ok(self.call()?.volumes.remove(id).is_some())
    }

    fn catalog(&self) -> Option<&dyn VolumeCatalog> {
        Some(self)
    }
    fn snapshots(&self) -> Option<&dyn SnapshotBackend> {
        self.full_featured.then_some(self as _)
    }
    fn expansion(&self) -> Option<&dyn ExpandBackend> {
        self.full_featured.then_some(self as _)
    }
    fn attacher(&self) -> Option<&dyn AttachBackend> {
        self.full_featured.then_some(self as _)
    }
    fn accepted_parameters(&self) -> Option<&[&str]> {
        Some(&["type"])
    }
}

#[async_trait]
impl VolumeCatalog for FakeProvider {
    async fn volume_by_name(&self, name: &str) -> BackendResult<Option<ProviderVolume>> {
        let state = self.call()?;
        let found = state.volumes.values().find(|v| v.record.name == name);
        Ok(found.map(|v| self.view(v)))
    }

    async fn volume(&self, id: &str) -> BackendResult<Option<ProviderVolume>> {
        Ok(self.call()?.volumes.get(id).map(|v| self.view(v)))
    }

    async fn list_volumes(
        &self,
        starting_token: &str,
        max_entries: i32,
    ) -> BackendResult<ProviderPage<ProviderVolume>> {
        let state = self.call()?;
        let all = state.volumes.values().map(|v| self.view(v)).collect();
        page(all, starting_token, max_entries)
    }

    async fn snapshot_by_name(&self, name: &str) -> BackendResult<Option<ProviderSnapshot>> {
        let state = self.call()?;
        let found = state.snapshots.values().find(|s| s.name == name);
        Ok(found.map(|s| ProviderSnapshot {
            record: s.clone(),
            ready: true,
        }))
    }

    async fn snapshot(&self, id: &str) -> BackendResult<Option<ProviderSnapshot>> {
        Ok(self.call()?.snapshots.get(id).map(|s| ProviderSnapshot {
            record: s.clone(),
            ready: true,
        }))
    }

    async fn list_snapshots(
        &self,
        source_volume_id: &str,
        starting_token: &str,
        max_entries: i32,
    ) -> BackendResult<ProviderPage<ProviderSnapshot>> {
        let state = self.call()?;
        let all = (state.snapshots.values())
            .filter(|s| source_volume_id.is_empty() || s.source_volume_id == source_volume_id)
            .map(|s| ProviderSnapshot {
                record: s.clone(),
                ready: true,
            })
            .collect();
        page(all, starting_token, max_entries)
    }
}

#[async_trait]
impl SnapshotBackend for FakeProvider {
    async fn create_snapshot(&self, snapshot: &mut SnapshotRecord) -> BackendResult<()> {
        let mut state = self.call()?;
        if !state.volumes.contains_key(&snapshot.source_volume_id) {
            return Err(BackendError::NotFound(format!(
                "volume {} does not exist",
                snapshot.source_volume_id
            )));
        }
        state.next_id += 1;
        snapshot.id = format!("ps-{}", state.next_id);
        state
            .snapshots
            .insert(snapshot.id.clone(), snapshot.clone());
        Ok(())
    }

    async fn delete_snapshot(&self, id: &str) -> BackendResult<bool> {
        Ok(self.call()?.snapshots.remove(id).is_some())
    }
}

#[async_trait]
impl ExpandBackend for FakeProvider {
    async fn expand_volume(&self, volume: &VolumeRecord, size: i64) -> BackendResult<()> {
        let mut state = self.call()?;
        let v = (state.volumes.get_mut(&volume.id)).ok_or_else(|| {
            BackendError::NotFound(format!("volume {} does not exist", volume.id))
        })?;
        v.record.capacity_bytes = size;
        Ok(())
    }
}

#[async_trait]
impl AttachBackend for FakeProvider {
    async fn attach(
        &self,
        volume: &VolumeRecord,
        node: &str,
        readonly: bool,
    ) -> BackendResult<AttachState> {
        let mut state = self.call()?;
        let at = self.clock.now() + state.action_time;
        let v = (state.volumes.get_mut(&volume.id)).ok_or_else(|| {
            BackendError::NotFound(format!("volume {} does not exist", volume.id))
        })?;
        v.attached.insert(node.to_owned(), (readonly, at));
        state.attaches += 1;
        Ok(AttachState::Attaching)
    }

    async fn attachment(&self, id: &str, node: &str) -> BackendResult<Option<AttachState>> {
        let state = self.call()?;
        let now = self.clock.now();
        let at = state.volumes.get(id).and_then(|v| v.attached.get(node));
        Ok(at.map(|(_, at)| match now >= *at {
            true => AttachState::Attached(HashMap::from([(
                "device".to_owned(),
                format!("/dev/disk/by-id/fake-{id}"),
            )])),
            false => AttachState::Attaching,
        }))
    }

    async fn detach(&self, id: &str, node: &str) -> BackendResult<()> {
        let mut state = self.call()?;
        if let Some(v) = state.volumes.get_mut(id) {
            match node {
                "" => v.attached.clear(),
                n => drop(v.attached.remove(n)),
            }
        }
        Ok(())
    }
}
