//! The controller half: a [`ControllerBackend`] over [`ProviderClient`].
//! The provider is the source of truth: what csi-controller needs to know
//! of a volume beyond the provider's own fields (its access type and
//! CreateVolume parameters) rides in the volume's description.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use csi_controller::{
    Access, AttachBackend, AttachState, BackendError, BackendResult, ContentSource,
    ControllerBackend, ExpandBackend, ProviderPage, ProviderSnapshot, ProviderVolume,
    SnapshotBackend, SnapshotRecord, VolumeCatalog, VolumeRecord,
};
use csi_driver::{CsiError, async_trait};
use serde::{Deserialize, Serialize};

use super::{ACCESS_KEY, DEVICE_KEY, TOPOLOGY_KEY};
use crate::api::{
    self, ActionKind, ActionStatus, CreateSnapshotRequest, CreateVolumeRequest, GIB, PageRequest,
    SnapshotFilter, VolumeFilter,
};
use crate::client::{ConflictKind, ProviderClient, ProviderError};

/// The CreateVolume parameters this driver takes: `tags`, comma-separated
/// tags for the provider's volume.
pub const PARAMETERS: &[&str] = &["tags"];
/// The snapshot tag saying its source was a block volume.
const BLOCK_TAG: &str = "csi-kit:block";

/// What a volume's description holds.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Meta {
    block: bool,
    parameters: BTreeMap<String, String>,
}

/// The controller's backend: a provider client and the region it works in.
pub struct CloudController {
    client: Arc<dyn ProviderClient>,
    region: String,
}

impl CloudController {
    /// Volumes are made in `region` through `client`.
    pub fn new(client: Arc<dyn ProviderClient>, region: impl Into<String>) -> Self {
        let region = region.into();
        CloudController { client, region }
    }

    fn view(&self, v: api::Volume) -> ProviderVolume {
        // A volume this driver did not make reads as a mount volume.
        let meta: Meta = serde_json::from_str(&v.description).unwrap_or_default();
        let access = if meta.block {
            Access::Block
        } else {
            Access::Mount
        };
        let capacity_bytes = i64::try_from(v.size_bytes()).unwrap_or(i64::MAX);
        ProviderVolume {
            attached: v.node_ids.iter().map(|n| (n.clone(), false)).collect(),
            ready: true,
            record: VolumeRecord {
                capacity_bytes,
                access,
                source: v.snapshot_id.map(ContentSource::Snapshot),
                parameters: meta.parameters,
                mutable_parameters: BTreeMap::new(),
                topology: BTreeMap::from([(TOPOLOGY_KEY.to_owned(), v.region)]),
                request: Vec::new(),
                ephemeral: false,
                id: v.id,
                name: v.name,
            },
        }
    }
}

/// What ControllerPublish hands the node: the device's stable name and
/// the access type (the node keeps no state of the controller's).
fn publish_context(id: &str, access: Access) -> HashMap<String, String> {
    let access = if access == Access::Block {
        "block"
    } else {
        "mount"
    };
    HashMap::from([
        (DEVICE_KEY.to_owned(), api::device_link_name(id)),
        (ACCESS_KEY.to_owned(), access.to_owned()),
    ])
}

fn gigabytes(bytes: i64) -> u64 {
    (bytes.max(0) as u64).div_ceil(GIB).max(1)
}

fn snapshot_view(s: api::Snapshot) -> ProviderSnapshot {
    let created = api::parse_rfc3339(&s.created_at)
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as i128);
    let block = s.tags.iter().any(|t| t == BLOCK_TAG);
    ProviderSnapshot {
        ready: true,
        record: SnapshotRecord {
            size_bytes: s.min_disk_size.saturating_mul(GIB) as i64,
            access: if block { Access::Block } else { Access::Mount },
            created_unix_nanos: created,
            group_snapshot_id: None,
            parameters: BTreeMap::new(),
            id: s.id,
            name: s.name,
            source_volume_id: s.resource_id,
        },
    }
}

/// `max_entries` items (0: all) from offset `token`, read in the
/// provider's largest pages; the next token is the next offset.
async fn window<T, Fut>(
    token: &str,
    max_entries: i32,
    fetch: impl Fn(PageRequest) -> Fut,
) -> BackendResult<ProviderPage<T>>
where
    Fut: Future<Output = Result<api::Page<T>, ProviderError>>,
{
    let offset: usize = match token {
        "" => 0,
        t => t.parse().map_err(|_| {
            CsiError::Aborted(format!("starting_token {t:?} is not one this plugin gave"))
        })?,
    };
    let want = usize::try_from(max_entries)
        .ok()
        .filter(|&n| n > 0)
        .unwrap_or(usize::MAX);
    let per = api::MAX_PER_PAGE as usize;
    let (mut page, mut skip) = ((offset / per) as u32 + 1, offset % per);
    let mut entries = Vec::new();
    loop {
        let got = fetch(PageRequest {
            page,
            per_page: per as u32,
        })
        .await?;
        entries.extend(got.items.into_iter().skip(skip));
        skip = 0;
        if entries.len() >= want || got.next_page.is_none() {
            entries.truncate(want);
            let end = offset + entries.len();
            let more = (end as u64) < got.total;
            let next_token = if more { end.to_string() } else { String::new() };
            return Ok(ProviderPage {
                entries,
                next_token,
            });
        }
        page += 1;
    }
}

/// A name taken by a create whose answer was lost: the service looks the
/// name up again before any second create.
fn taken_is_transient(e: ProviderError) -> BackendError {
    match e.conflict() {
        Some(ConflictKind::NameTaken) => BackendError::transient(e.to_string()),
        _ => e.into(),
    }
}

/// An action that has not completed yet: retried (polled) by the service.
fn running(what: &str, a: &api::Action) -> BackendError {
    let why = a.error.as_deref().unwrap_or("running");
    BackendError::transient(format!("{what} (action {}): {why}", a.id))
}

impl From<ProviderError> for BackendError {
    fn from(e: ProviderError) -> Self {
        let message = e.to_string();
        if e.is_transient() {
            let retry_after = e.retry_after();
            return BackendError::Transient {
                message,
                retry_after,
            };
        }
        match e {
            ProviderError::NotFound { .. } => BackendError::NotFound(message),
            ProviderError::Unauthorized { .. } => BackendError::Unauthorized(message),
            ProviderError::Garbage { .. } => BackendError::Malformed(message),
            ProviderError::Invalid { .. } => BackendError::InvalidArgument {
                field: "request".into(),
                reason: message,
            },
            ProviderError::Conflict { kind, .. } => match kind {
                ConflictKind::ActionInProgress { .. } => BackendError::transient(message),
                ConflictKind::AttachLimit => BackendError::Exhausted(message),
                ConflictKind::AttachedElsewhere { .. } | ConflictKind::VolumeAttached => {
                    BackendError::Csi(CsiError::FailedPrecondition(message))
                }
                _ => BackendError::Conflict(message),
            },
            _ => BackendError::transient(message),
        }
    }
}

#[async_trait]
impl ControllerBackend for CloudController {
    async fn create_volume(&self, volume: &mut VolumeRecord) -> BackendResult<()> {
        let snapshot_id = match &volume.source {
            Some(ContentSource::Snapshot(id)) => Some(id.clone()),
            Some(ContentSource::Volume(_)) => {
                let why = "this plugin does not clone volumes";
                return Err(CsiError::invalid("volume_content_source", why).into());
            }
            None => None,
        };
        let tags = (volume.parameters.get("tags").into_iter())
            .flat_map(|t| t.split(','))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
            .collect();
        let meta = Meta {
            block: volume.access == Access::Block,
            parameters: volume.parameters.clone(),
        };
        let req = CreateVolumeRequest {
            name: volume.name.clone(),
            size_gigabytes: gigabytes(volume.capacity_bytes),
            region: Some(self.region.clone()),
            description: serde_json::to_string(&meta)
                .map_err(|e| CsiError::Internal(e.to_string()))?,
            snapshot_id,
            tags,
        };
        let made = self
            .client
            .create_volume(&req)
            .await
            .map_err(taken_is_transient)?;
        *volume = self.view(made).record;
        Ok(())
    }

    async fn delete_volume(&self, id: &str) -> BackendResult<bool> {
        match self.client.delete_volume(id).await {
            Ok(()) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e.into()),
        }
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
    fn accepted_parameters(&self) -> Option<&[&str]> {
        Some(PARAMETERS)
    }
}

#[async_trait]
impl VolumeCatalog for CloudController {
    async fn volume_by_name(&self, name: &str) -> BackendResult<Option<ProviderVolume>> {
        let filter = VolumeFilter {
            name: Some(name.to_owned()),
            region: Some(self.region.clone()),
        };
        let found = self
            .client
            .list_volumes(&filter, PageRequest::default())
            .await?;
        Ok(found.items.into_iter().next().map(|v| self.view(v)))
    }

    async fn volume(&self, id: &str) -> BackendResult<Option<ProviderVolume>> {
        match self.client.get_volume(id).await {
            Ok(v) => Ok(Some(self.view(v))),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn list_volumes(
        &self,
        starting_token: &str,
        max_entries: i32,
    ) -> BackendResult<ProviderPage<ProviderVolume>> {
        let filter = VolumeFilter {
            name: None,
            region: Some(self.region.clone()),
        };
        let fetch = |page| self.client.list_volumes(&filter, page);
        let found = window(starting_token, max_entries, fetch).await?;
        let entries = found.entries.into_iter().map(|v| self.view(v)).collect();
        Ok(ProviderPage {
            entries,
            next_token: found.next_token,
        })
    }

    async fn snapshot_by_name(&self, name: &str) -> BackendResult<Option<ProviderSnapshot>> {
        let filter = SnapshotFilter {
            name: Some(name.to_owned()),
            resource_id: None,
        };
        let found = self
            .client
            .list_snapshots(&filter, PageRequest::default())
            .await?;
        Ok(found.items.into_iter().next().map(snapshot_view))
    }

    async fn snapshot(&self, id: &str) -> BackendResult<Option<ProviderSnapshot>> {
        match self.client.get_snapshot(id).await {
            Ok(s) => Ok(Some(snapshot_view(s))),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn list_snapshots(
        &self,
        source_volume_id: &str,
        starting_token: &str,
        max_entries: i32,
    ) -> BackendResult<ProviderPage<ProviderSnapshot>> {
        let filter = SnapshotFilter {
            name: None,
            resource_id: (!source_volume_id.is_empty()).then(|| source_volume_id.to_owned()),
        };
        let fetch = |page| self.client.list_snapshots(&filter, page);
        let found = window(starting_token, max_entries, fetch).await?;
        let entries = found.entries.into_iter().map(snapshot_view).collect();
        Ok(ProviderPage {
            entries,
            next_token: found.next_token,
        })
    }
}

#[async_trait]
impl SnapshotBackend for CloudController {
    async fn create_snapshot(&self, snapshot: &mut SnapshotRecord) -> BackendResult<()> {
        let block = snapshot.access == Access::Block;
        let req = CreateSnapshotRequest {
            name: snapshot.name.clone(),
            tags: block.then(|| BLOCK_TAG.to_owned()).into_iter().collect(),
        };
        let made = (self
            .client
            .create_snapshot(&snapshot.source_volume_id, &req)
            .await)
            .map_err(taken_is_transient)?;
        let made = snapshot_view(made).record;
        snapshot.id = made.id;
        snapshot.size_bytes = made.size_bytes;
        snapshot.created_unix_nanos = made.created_unix_nanos;
        Ok(())
    }

    async fn delete_snapshot(&self, id: &str) -> BackendResult<bool> {
        match self.client.delete_snapshot(id).await {
            Ok(()) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e.into()),
        }
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
    async fn attach(
        &self,
        volume: &VolumeRecord,
        node: &str,
        _readonly: bool,
    ) -> BackendResult<AttachState> {
        let attached = AttachState::Attached(publish_context(&volume.id, volume.access));
        match self.client.attach(&volume.id, node).await {
            Ok(a) if a.status == ActionStatus::Completed => Ok(attached),
            Ok(a) if a.status == ActionStatus::Errored => Err(running(
                &format!("attach of volume {} to {node}", volume.id),
                &a,
            )),
            Ok(_) => Ok(AttachState::Attaching),
            Err(e) if e.conflict() == Some(&ConflictKind::AlreadyAttached) => Ok(attached),
            Err(e) => Err(e.into()),
        }
    }

    async fn attachment(&self, id: &str, node: &str) -> BackendResult<Option<AttachState>> {
        // Actions first: one that ends meanwhile shows in the volume read next.
        let actions = match self
            .client
            .list_volume_actions(id, PageRequest::default())
            .await
        {
            Ok(page) => page.items,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let running = actions.iter().any(|a| {
            a.kind == ActionKind::Attach
                && a.status == ActionStatus::InProgress
                && a.node_id.as_deref() == Some(node)
        });
        if running {
            return Ok(Some(AttachState::Attaching));
        }
        let volume = match self.client.get_volume(id).await {
            Ok(v) => self.view(v),
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let attached = volume.attached.contains_key(node);
        Ok(attached.then(|| AttachState::Attached(publish_context(id, volume.record.access))))
    }

    async fn detach(&self, id: &str, node: &str) -> BackendResult<()> {
        let nodes = match node {
            "" => match self.client.get_volume(id).await {
                Ok(v) => v.node_ids,
                Err(e) if e.is_not_found() => return Ok(()),
                Err(e) => return Err(e.into()),
            },
            n => vec![n.to_owned()],
        };
        for node in nodes {
            match self.client.detach(id, &node).await {
                Ok(a) if a.status == ActionStatus::Completed => {}
                Ok(a) => return Err(running(&format!("detach of volume {id} from {node}"), &a)),
                Err(e) if e.is_not_found() => {}
                Err(e) if e.conflict() == Some(&ConflictKind::NotAttached) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}
