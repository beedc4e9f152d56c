//! The controller half: a [`ControllerBackend`] over [`ProviderClient`]. The provider is the
//! source of truth: what csi-controller needs to know of a volume beyond the provider's own
//! fields (its access type and CreateVolume parameters) rides in the volume's description
//! ([`VolumeNotes`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use csi_controller::{
    Access, AttachBackend, AttachState, BackendResult, ContentSource, ControllerBackend,
    ExpandBackend, ProviderPage, ProviderSnapshot, ProviderVolume, SnapshotBackend, SnapshotRecord,
    VolumeCatalog, VolumeNotes, VolumeRecord,
};
use csi_driver::async_trait;

use super::{ACCESS_KEY, DEVICE_KEY, TOPOLOGY_KEY};
use crate::api::{self, ActionKind, ActionStatus, GIB, PageRequest, SnapshotFilter, VolumeFilter};
use crate::client::{ConflictKind, ProviderClient, found, page, running, taken_is_transient};

/// The snapshot tag saying its source was a block volume.
const BLOCK_TAG: &str = "csi-kit:block";

/// A page of the provider's volumes or snapshots.
type Listed<T> = BackendResult<ProviderPage<T>>;
/// Something the provider may not have.
type Found<T> = BackendResult<Option<T>>;

/// The controller's backend: volumes are made in `region` through `client`.
pub struct CloudController {
    /// The provider's API.
    pub client: Arc<dyn ProviderClient>,
    /// Where volumes are made, and the topology segment's value.
    pub region: String,
}

fn access(block: bool) -> Access {
    if block { Access::Block } else { Access::Mount }
}

fn volume_view(v: api::Volume) -> ProviderVolume {
    // A volume this driver did not make reads as a mount volume.
    let notes = VolumeNotes::from_text(&v.description);
    let size = i64::try_from(v.size_bytes()).unwrap_or(i64::MAX);
    let mut record = notes.record(v.id, v.name, size, v.snapshot_id);
    record.topology = BTreeMap::from([(TOPOLOGY_KEY.to_owned(), v.region)]);
    // The provider has no read-only attachments.
    let attached = v.node_ids.into_iter().map(|n| (n, false)).collect();
    ProviderVolume {
        record,
        attached,
        ready: true,
    }
}

fn snapshot_view(s: api::Snapshot) -> ProviderSnapshot {
    let created = (api::parse_rfc3339(&s.created_at))
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as i128);
    let record = SnapshotRecord {
        size_bytes: s.min_disk_size.saturating_mul(GIB) as i64,
        access: access(s.tags.iter().any(|t| t == BLOCK_TAG)),
        created_unix_nanos: created,
        group_snapshot_id: None,
        parameters: BTreeMap::new(),
        id: s.id,
        name: s.name,
        source_volume_id: s.resource_id,
    };
    ProviderSnapshot {
        record,
        ready: true,
    }
}

/// What ControllerPublish hands the node (which keeps no state of the controller's): the
/// device's stable name and the access type.
fn publish_context(id: &str, access: Access) -> HashMap<String, String> {
    let access = format!("{access:?}").to_lowercase();
    let device = api::device_link_name(id);
    HashMap::from([(DEVICE_KEY.into(), device), (ACCESS_KEY.into(), access)])
}

/// Whether an attach of volume `id` to `node` is running; `None`: no such volume.
async fn attach_running(c: &dyn ProviderClient, id: &str, node: &str) -> Found<bool> {
    let actions = found(c.list_volume_actions(id, first()).await)?;
    Ok(actions.map(|a| {
        let attach = (ActionKind::Attach, ActionStatus::InProgress);
        (a.items.iter()).any(|a| (a.kind, a.status) == attach && a.node_id.as_deref() == Some(node))
    }))
}

fn attached_to(v: &ProviderVolume, node: &str) -> Option<AttachState> {
    let context = publish_context(&v.record.id, v.record.access);
    v.attached
        .contains_key(node)
        .then_some(AttachState::Attached(context))
}

fn gigabytes(bytes: i64) -> u64 {
    (bytes.max(0) as u64).div_ceil(GIB).max(1)
}

fn first() -> PageRequest {
    PageRequest::default()
}

#[async_trait]
impl ControllerBackend for CloudController {
    async fn create_volume(&self, volume: &mut VolumeRecord) -> BackendResult<()> {
        let snapshot_id = match &volume.source {
            Some(ContentSource::Snapshot(id)) => Some(id.clone()),
            _ => None,
        };
        let tags = (volume.parameters.get("tags").into_iter())
            .flat_map(|t| t.split(',').map(str::trim).filter(|t| !t.is_empty()))
            .map(str::to_owned);
        let notes = VolumeNotes::of(volume);
        let req = api::CreateVolumeRequest {
            name: volume.name.clone(),
            size_gigabytes: gigabytes(volume.capacity_bytes),
            region: Some(self.region.clone()),
            description: notes.to_text(),
            snapshot_id,
            source_volume_id: notes.clone_of,
            tags: tags.collect(),
        };
        let made = self.client.create_volume(&req).await;
        *volume = volume_view(made.map_err(taken_is_transient)?).record;
        Ok(())
    }
    async fn delete_volume(&self, id: &str) -> BackendResult<bool> {
        Ok(found(self.client.delete_volume(id).await)?.is_some())
    }
    fn catalog(&self) -> Option<&dyn VolumeCatalog> {
        Some(self)
    }
    fn snapshots(&self) -> Option<&dyn SnapshotBackend> {
        Some(self)
    }
    fn expansion(&self) -> Option<&dyn ExpandBackend> {
        Some(self)
    }
    fn attacher(&self) -> Option<&dyn AttachBackend> {
        Some(self)
    }
    fn clones_volumes(&self) -> bool {
        true // the provider copies a volume of the region
    }
    fn accepted_parameters(&self) -> Option<&[&str]> {
        Some(&["tags"]) // comma-separated tags of the provider's volume
    }
}

#[async_trait]
impl VolumeCatalog for CloudController {
    async fn volume_by_name(&self, name: &str) -> BackendResult<Option<ProviderVolume>> {
        let (name, region) = (Some(name.to_owned()), Some(self.region.clone()));
        let filter = VolumeFilter { name, region };
        let found = self.client.list_volumes(&filter, first()).await?;
        Ok(found.items.into_iter().next().map(volume_view))
    }
    async fn volume(&self, id: &str) -> BackendResult<Option<ProviderVolume>> {
        Ok(found(self.client.get_volume(id).await)?.map(volume_view))
    }
    fn ready_when_created(&self) -> bool {
        true // the provider's volumes are usable once created
    }
    async fn list_volumes(&self, token: &str, max: i32) -> Listed<ProviderVolume> {
        let (name, region) = (None, Some(self.region.clone()));
        let filter = VolumeFilter { name, region };
        let fetch = |p| self.client.list_volumes(&filter, p);
        page(token, max, fetch, volume_view).await
    }
    async fn snapshot_by_name(&self, name: &str) -> BackendResult<Option<ProviderSnapshot>> {
        let (name, resource_id) = (Some(name.to_owned()), None);
        let filter = SnapshotFilter { name, resource_id };
        let found = self.client.list_snapshots(&filter, first()).await?;
        Ok(found.items.into_iter().next().map(snapshot_view))
    }
    async fn snapshot(&self, id: &str) -> BackendResult<Option<ProviderSnapshot>> {
        Ok(found(self.client.get_snapshot(id).await)?.map(snapshot_view))
    }
    async fn list_snapshots(&self, of: &str, token: &str, max: i32) -> Listed<ProviderSnapshot> {
        let (name, resource_id) = (None, Some(of.to_owned()).filter(|s| !s.is_empty()));
        let filter = SnapshotFilter { name, resource_id };
        let fetch = |p| self.client.list_snapshots(&filter, p);
        page(token, max, fetch, snapshot_view).await
    }
}

#[async_trait]
impl SnapshotBackend for CloudController {
    async fn create_snapshot(&self, snapshot: &mut SnapshotRecord) -> BackendResult<()> {
        let block = snapshot.access == Access::Block;
        let tags = block.then(|| BLOCK_TAG.to_owned()).into_iter().collect();
        let (name, source) = (snapshot.name.clone(), &snapshot.source_volume_id);
        let req = api::CreateSnapshotRequest { name, tags };
        let made = self.client.create_snapshot(source, &req).await;
        let made = snapshot_view(made.map_err(taken_is_transient)?).record;
        (snapshot.id, snapshot.size_bytes) = (made.id, made.size_bytes);
        snapshot.created_unix_nanos = made.created_unix_nanos;
        Ok(())
    }
    async fn delete_snapshot(&self, id: &str) -> BackendResult<bool> {
        Ok(found(self.client.delete_snapshot(id).await)?.is_some())
    }
}

#[async_trait]
impl ExpandBackend for CloudController {
    async fn expand_volume(&self, volume: &VolumeRecord, size: i64) -> BackendResult<()> {
        let want = gigabytes(size);
        if self.client.get_volume(&volume.id).await?.size_gigabytes >= want {
            return Ok(());
        }
        match self.client.resize(&volume.id, want).await? {
            a if a.status == ActionStatus::Completed => Ok(()),
            a => Err(running(&format!("resize of volume {}", volume.id), &a)),
        }
    }
    /// A mount volume's filesystem is grown by the node too.
    fn node_expansion_required(&self, _access: Access) -> bool {
        true
    }
}

#[async_trait]
impl AttachBackend for CloudController {
    async fn attach(&self, v: &VolumeRecord, node: &str, _: bool) -> BackendResult<AttachState> {
        let attached = AttachState::Attached(publish_context(&v.id, v.access));
        match self.client.attach(&v.id, node).await {
            Ok(a) if a.status == ActionStatus::Completed => Ok(attached),
            Ok(a) if a.status == ActionStatus::Errored => {
                Err(running(&format!("attach of {} to {node}", v.id), &a))
            }
            Ok(_) => Ok(AttachState::Attaching),
            Err(e) if e.conflict() == Some(&ConflictKind::AlreadyAttached) => Ok(attached),
            Err(e) => Err(e.into()),
        }
    }
    async fn attachment(&self, id: &str, node: &str) -> BackendResult<Option<AttachState>> {
        // Actions first: one that ends meanwhile shows in the volume read next.
        match attach_running(self.client.as_ref(), id, node).await? {
            Some(false) => {}
            running => return Ok(running.map(|_| AttachState::Attaching)),
        }
        let volume = found(self.client.get_volume(id).await)?.map(volume_view);
        Ok(volume.and_then(|v| attached_to(&v, node)))
    }
    /// `v` was read before the actions: an attach that ended in between is started again and
    /// refused as `AlreadyAttached`, which is attached.
    async fn attachment_of(&self, v: &ProviderVolume, node: &str) -> Found<AttachState> {
        match attach_running(self.client.as_ref(), &v.record.id, node).await? {
            Some(false) => Ok(attached_to(v, node)),
            running => Ok(running.map(|_| AttachState::Attaching)),
        }
    }
    async fn detach(&self, id: &str, node: &str) -> BackendResult<()> {
        let nodes = match node {
            "" => found(self.client.get_volume(id).await)?.map_or_else(Vec::new, |v| v.node_ids),
            n => vec![n.to_owned()],
        };
        for node in nodes {
            match self.client.detach(id, &node).await {
                Ok(a) if a.status == ActionStatus::Completed => {}
                Ok(a) => return Err(running(&format!("detach of volume {id} from {node}"), &a)),
                Err(e) if e.is_not_found() || e.conflict() == Some(&ConflictKind::NotAttached) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}
