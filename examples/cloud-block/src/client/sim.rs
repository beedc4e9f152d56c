//! [`SimProvider`]: the provider inside csi-sim's world. Its cloud (a
//! `FakeProvider`, so the provider's own rules answer) is kept by the
//! world: volumes, snapshots and attachments outlive every crash of the
//! driver, as a real cloud's do. Every call is one step that the plan may
//! crash or fail with a 5xx, a 429 or a timeout (before or after the
//! provider made the change). An action (attach, detach, resize) stays in
//! progress for [`SIM_ACTION_CALLS`] calls, so the driver waits for it (and
//! resumes waiting after a crash). An attached volume is a block device
//! under the device directory, as the provider process makes a by-id link.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use csi_sim::{DataView, ProviderFault, World};
use mount_utils::{DeviceNumber, MountInfo};

use super::{FakeProvider, ProviderClient, ProviderError};
use crate::api::{
    Action, CreateSnapshotRequest, CreateVolumeRequest, DEVICE_LINK_PREFIX, Page, PageRequest,
    Region, Snapshot, SnapshotFilter, Volume, VolumeFilter, device_link_name,
};

/// How long a throttled call is asked to wait.
pub const SIM_RETRY_AFTER: Duration = Duration::from_secs(2);
/// The client timeout a timed-out call reports.
pub const SIM_TIMEOUT: Duration = Duration::from_secs(30);
/// The major number of the devices attachments make (a virtual disk's).
const DEVICE_MAJOR: u32 = 252;
/// How many provider calls after it started an action (attach, detach,
/// resize) is still in progress: the driver waits for it, and resumes the
/// wait after a crash, as with a real cloud.
pub const SIM_ACTION_CALLS: u32 = 2;

/// Provider calls made since the oldest running action started (kept by
/// the world: the cloud works on while the driver restarts). The cloud
/// ends every running action together.
#[derive(Debug, Default)]
struct ActionProgress(Mutex<u32>);

/// The device numbers given to attached volumes, by volume id (kept by the
/// world, so a volume attached again gets its own number back).
#[derive(Debug, Default)]
struct DeviceNumbers(Mutex<BTreeMap<String, DeviceNumber>>);

/// A [`ProviderClient`] over the world's cloud, for the world's current
/// driver process.
pub struct SimProvider {
    world: World,
    generation: u64,
    cloud: Arc<FakeProvider>,
    device_dir: PathBuf,
}

impl std::fmt::Debug for SimProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimProvider")
            .field("generation", &self.generation)
            .field("device_dir", &self.device_dir)
            .finish_non_exhaustive()
    }
}

fn failure(fault: ProviderFault, request: String) -> ProviderError {
    match fault {
        ProviderFault::ServerError => ProviderError::Unavailable {
            status: 503,
            message: format!("{request}: service unavailable"),
        },
        ProviderFault::Throttled => ProviderError::RateLimited {
            retry_after: Some(SIM_RETRY_AFTER),
            message: format!("{request}: too many requests"),
        },
        ProviderFault::TimeoutBefore | ProviderFault::TimeoutAfter => ProviderError::Timeout {
            request,
            after: SIM_TIMEOUT,
        },
    }
}

impl SimProvider {
    /// The world's provider as its current driver process reaches it;
    /// attached volumes appear under `device_dir`.
    pub fn new(world: &World, device_dir: impl Into<PathBuf>) -> Self {
        let cloud = world.kept::<FakeProvider>();
        cloud.hold_actions(true);
        SimProvider {
            world: world.clone(),
            generation: world.generation(),
            cloud,
            device_dir: device_dir.into(),
        }
    }

    /// The cloud's own progress, one provider call on: running actions
    /// end [`SIM_ACTION_CALLS`] calls after the oldest started.
    fn progress(&self) {
        let progress = self.world.kept::<ActionProgress>();
        let mut calls = progress.0.lock().unwrap_or_else(|e| e.into_inner());
        if self.cloud.cloud().running().is_empty() {
            *calls = 0;
            return;
        }
        *calls += 1;
        if *calls >= SIM_ACTION_CALLS {
            self.cloud.finish_actions(Ok(()));
            *calls = 0;
            self.sync_devices();
        }
    }

    /// Where attached volumes' devices appear.
    pub fn device_dir(&self) -> &Path {
        &self.device_dir
    }

    /// One call: a step, then (unless the fault came first) `op` on the
    /// cloud, then the devices brought in line with its attachments.
    async fn call<'a, T, Fut>(
        &'a self,
        request: String,
        op: impl FnOnce(&'a FakeProvider) -> Fut,
    ) -> Result<T, ProviderError>
    where
        Fut: Future<Output = Result<T, ProviderError>>,
    {
        let fault = match self.world.provider_call(self.generation, &request) {
            Ok(fault) => fault,
            Err(_) => {
                return Err(ProviderError::Connection {
                    request,
                    reason: "the calling process is gone".into(),
                });
            }
        };
        self.progress();
        if let Some(f) = fault.filter(|f| !f.applied()) {
            return Err(failure(f, request));
        }
        let answer = op(&self.cloud).await;
        self.sync_devices();
        match fault {
            Some(f) => Err(failure(f, request)),
            None => answer,
        }
    }

    /// A device for every attached volume, none for the others.
    fn sync_devices(&self) {
        let numbers = self.world.kept::<DeviceNumbers>();
        let mut numbers = numbers.0.lock().unwrap_or_else(|e| e.into_inner());
        let (devices, mounter) = (self.world.block_devices(), self.world.mounter());
        for volume in self.cloud.cloud().volumes() {
            let link = self.device_dir.join(device_link_name(&volume.id));
            if volume.node_ids.is_empty() {
                devices.remove(&link);
                continue;
            }
            let next = DeviceNumber::new(DEVICE_MAJOR, numbers.len() as u32);
            let number = *numbers.entry(volume.id.clone()).or_insert(next);
            devices.add(&link, number, volume.size_bytes());
            mounter.add_block_device(&link, number);
        }
    }

    fn ids(&self, of: impl Iterator<Item = String>) -> BTreeMap<String, String> {
        of.map(|id| (id.clone(), id)).collect()
    }
}

/// What the simulation reads of the cloud: its volumes and snapshots
/// (their data is the provider's, so each is its own), which volume a
/// mount of an attached device shows, and which volumes are attached.
impl DataView for SimProvider {
    fn volumes(&self) -> BTreeMap<String, String> {
        self.ids(self.cloud.cloud().volumes().map(|v| v.id.clone()))
    }
    fn snapshots(&self) -> BTreeMap<String, String> {
        self.ids(self.cloud.cloud().snapshots().map(|s| s.id.clone()))
    }
    fn volume_at(&self, mount: &MountInfo) -> Option<String> {
        let source = Path::new(&mount.source);
        if source.parent() != Some(self.device_dir.as_path()) {
            return None;
        }
        let name = source.file_name()?.to_str()?;
        name.strip_prefix(DEVICE_LINK_PREFIX).map(str::to_owned)
    }
    fn attached_volumes(&self) -> Option<BTreeSet<String>> {
        let cloud = self.cloud.cloud();
        let attached = cloud.volumes().filter(|v| !v.node_ids.is_empty());
        Some(attached.map(|v| v.id.clone()).collect())
    }
}

#[async_trait]
impl ProviderClient for SimProvider {
    async fn list_regions(&self) -> Result<Vec<Region>, ProviderError> {
        self.call("list regions".into(), |c| c.list_regions()).await
    }
    async fn create_volume(&self, req: &CreateVolumeRequest) -> Result<Volume, ProviderError> {
        let request = format!("create volume {}", req.name);
        self.call(request, |c| c.create_volume(req)).await
    }
    async fn get_volume(&self, id: &str) -> Result<Volume, ProviderError> {
        self.call(format!("get volume {id}"), |c| c.get_volume(id))
            .await
    }
    async fn list_volumes(
        &self,
        filter: &VolumeFilter,
        page: PageRequest,
    ) -> Result<Page<Volume>, ProviderError> {
        let request = format!("list volumes {:?} page {}", filter.name, page.page);
        self.call(request, |c| c.list_volumes(filter, page)).await
    }
    async fn delete_volume(&self, id: &str) -> Result<(), ProviderError> {
        let request = format!("delete volume {id}");
        self.call(request, |c| c.delete_volume(id)).await
    }
    async fn attach(&self, volume_id: &str, node_id: &str) -> Result<Action, ProviderError> {
        let request = format!("attach volume {volume_id} to {node_id}");
        self.call(request, |c| c.attach(volume_id, node_id)).await
    }
    async fn detach(&self, volume_id: &str, node_id: &str) -> Result<Action, ProviderError> {
        let request = format!("detach volume {volume_id} from {node_id}");
        self.call(request, |c| c.detach(volume_id, node_id)).await
    }
    async fn resize(&self, volume_id: &str, size_gigabytes: u64) -> Result<Action, ProviderError> {
        let request = format!("resize volume {volume_id} to {size_gigabytes} GiB");
        self.call(request, |c| c.resize(volume_id, size_gigabytes))
            .await
    }
    async fn get_action(&self, id: u64) -> Result<Action, ProviderError> {
        self.call(format!("get action {id}"), |c| c.get_action(id))
            .await
    }
    async fn list_volume_actions(
        &self,
        volume_id: &str,
        page: PageRequest,
    ) -> Result<Page<Action>, ProviderError> {
        let request = format!("list actions of volume {volume_id} page {}", page.page);
        self.call(request, |c| c.list_volume_actions(volume_id, page))
            .await
    }
    async fn create_snapshot(
        &self,
        volume_id: &str,
        req: &CreateSnapshotRequest,
    ) -> Result<Snapshot, ProviderError> {
        let request = format!("create snapshot {} of volume {volume_id}", req.name);
        self.call(request, |c| c.create_snapshot(volume_id, req))
            .await
    }
    async fn get_snapshot(&self, id: &str) -> Result<Snapshot, ProviderError> {
        self.call(format!("get snapshot {id}"), |c| c.get_snapshot(id))
            .await
    }
    async fn list_snapshots(
        &self,
        filter: &SnapshotFilter,
        page: PageRequest,
    ) -> Result<Page<Snapshot>, ProviderError> {
        let request = format!("list snapshots {:?} page {}", filter.name, page.page);
        self.call(request, |c| c.list_snapshots(filter, page)).await
    }
    async fn delete_snapshot(&self, id: &str) -> Result<(), ProviderError> {
        let request = format!("delete snapshot {id}");
        self.call(request, |c| c.delete_snapshot(id)).await
    }
}
