//! The Controller service: volumes as directories or sparse image files,
//! snapshots as archives or image copies, attachment bookkeeping, paging.

use std::collections::BTreeMap;

use csi_proto::v1::*;
use csi_server::helpers::capacity::{CapacityPolicy, resolve_capacity};
use csi_server::helpers::idempotency::{compare_snapshot, compare_volume};
use csi_server::{CallContext, Controller, CsiError, CsiResult};
use prost::Message;

use crate::common::{
    access_of, confirmed, forget_attachment, free_space, now_nanos, page, record_attachment,
    sorted, timestamp, to_map,
};
use crate::config::TOPOLOGY_KEY;
use crate::driver::{HostPath, blocking};
use crate::store::{Access, IdKind, SnapshotRecord, Source, VolumeRecord};

/// Size of a volume when the request gives no capacity range.
pub const DEFAULT_VOLUME_SIZE: i64 = 1 << 30;

/// Rounding unit of block volumes (loop devices want whole sectors; MiB keeps it tidy).
const BLOCK_UNIT: i64 = 1 << 20;

impl HostPath {
    pub(crate) fn volume_message(&self, v: &VolumeRecord) -> Volume {
        Volume {
            capacity_bytes: v.capacity_bytes,
            volume_id: v.id.clone(),
            volume_context: to_map(&v.parameters),
            content_source: v.source.as_ref().map(Source::message),
            accessible_topology: if v.topology.is_empty() {
                Vec::new()
            } else {
                vec![Topology {
                    segments: to_map(&v.topology),
                }]
            },
        }
    }

    pub(crate) fn snapshot_message(s: &SnapshotRecord) -> Snapshot {
        Snapshot {
            size_bytes: s.size_bytes,
            snapshot_id: s.id.clone(),
            source_volume_id: s.source_volume_id.clone(),
            creation_time: Some(timestamp(s.created_unix_nanos)),
            ready_to_use: true,
            group_snapshot_id: s.group_snapshot_id.clone().unwrap_or_default(),
        }
    }

    fn our_segment(&self) -> BTreeMap<String, String> {
        [(TOPOLOGY_KEY.to_owned(), self.node_id.clone())].into()
    }

    /// Bytes promised to existing volumes.
    fn allocated(&self) -> i64 {
        self.store
            .read(|s| s.volumes.values().map(|v| v.capacity_bytes).sum())
    }

    /// Free capacity: the configured total minus what is allocated, or the
    /// free space of the state directory's filesystem. Never negative.
    pub(crate) fn available_capacity(&self) -> i64 {
        let free = if self.config.capacity > 0 {
            self.config.capacity - self.allocated()
        } else {
            free_space(self.backend.root())
        };
        free.max(0)
    }

    /// Whether a topology requirement admits this node.
    fn topology_fits(&self, req: Option<&TopologyRequirement>) -> bool {
        let Some(req) = req else { return true };
        if !self.config.enable_topology || req.requisite.is_empty() && req.preferred.is_empty() {
            return true;
        }
        let ours = self.our_segment();
        let fits = |t: &Topology| t.segments.iter().all(|(k, v)| ours.get(k) == Some(v));
        if req.requisite.is_empty() {
            req.preferred.iter().any(fits)
        } else {
            req.requisite.iter().any(fits)
        }
    }

    fn volume_size(&self, range: Option<&CapacityRange>, access: Access) -> CsiResult<i64> {
        let policy = CapacityPolicy {
            default_size: DEFAULT_VOLUME_SIZE,
            min_size: 0,
            max_size: self.config.max_volume_size,
            unit: if access == Access::Block {
                BLOCK_UNIT
            } else {
                1
            },
        };
        resolve_capacity(range, &policy)
    }
}

#[csi_server::async_trait]
impl Controller for HostPath {
    async fn create_volume(
        &self,
        _ctx: &CallContext,
        req: CreateVolumeRequest,
    ) -> CsiResult<CreateVolumeResponse> {
        let access = access_of(&req.volume_capabilities)?;
        let source = Source::of(req.volume_content_source.as_ref());
        if let Some(existing) = self.store.read(|s| s.volume_by_name(&req.name).cloned()) {
            let original = CreateVolumeRequest::decode(existing.request.as_slice())
                .map_err(|e| CsiError::Internal(format!("state of volume {}: {e}", existing.id)))?;
            let volume = self.volume_message(&existing);
            compare_volume(&original, &volume, &req)?;
            return Ok(CreateVolumeResponse {
                volume: Some(volume),
            });
        }
        if !self.topology_fits(req.accessibility_requirements.as_ref()) {
            return Err(CsiError::ResourceExhausted(format!(
                "node {} is not in the requested topology",
                self.node_id
            )));
        }
        let size = self.volume_size(req.capacity_range.as_ref(), access)?;
        // The source must exist, have the same access type, and fit.
        let source_size = match &source {
            Some(Source::Snapshot(id)) => {
                let snap = IdKind::Snapshot
                    .is_valid(id)
                    .then(|| self.store.read(|s| s.snapshots.get(id).cloned()))
                    .flatten()
                    .ok_or_else(|| CsiError::NotFound(format!("snapshot {id:?} does not exist")))?;
                if snap.access != access {
                    return Err(CsiError::invalid(
                        "volume_content_source",
                        "snapshot access type differs from the requested one",
                    ));
                }
                let vol_size = self.store.read(|s| {
                    s.volumes
                        .get(&snap.source_volume_id)
                        .map(|v| v.capacity_bytes)
                });
                vol_size
                    .unwrap_or(snap.size_bytes)
                    .max(if access == Access::Block {
                        snap.size_bytes
                    } else {
                        0
                    })
            }
            Some(Source::Volume(id)) => {
                let vol = self.known_volume(id).map_err(|_| {
                    CsiError::NotFound(format!("source volume {id:?} does not exist"))
                })?;
                if vol.access != access {
                    return Err(CsiError::invalid(
                        "volume_content_source",
                        "source volume access type differs from the requested one",
                    ));
                }
                vol.capacity_bytes
            }
            None => 0,
        };
        if size < source_size {
            return Err(CsiError::OutOfRange(format!(
                "requested {size} bytes is smaller than the source's {source_size} bytes"
            )));
        }
        if self.config.capacity > 0 && size > self.available_capacity() {
            return Err(CsiError::ResourceExhausted(format!(
                "not enough capacity for {}",
                csi_proto::size::format_bytes(size)
            )));
        }
        let record = VolumeRecord {
            id: IdKind::Volume.generate(),
            name: req.name.clone(),
            capacity_bytes: size,
            access,
            source: source.clone(),
            parameters: sorted(&req.parameters),
            mutable_parameters: sorted(&req.mutable_parameters),
            topology: if self.config.enable_topology {
                self.our_segment()
            } else {
                BTreeMap::new()
            },
            request: CreateVolumeRequest {
                secrets: Default::default(),
                ..req.clone()
            }
            .encode_to_vec(),
            published_nodes: BTreeMap::new(),
            ephemeral: false,
        };
        let (backend, id) = (self.backend.clone(), record.id.clone());
        blocking(move || match source {
            None => backend.create_volume(&id, access, size),
            Some(Source::Snapshot(snap)) => backend.restore(&snap, &id, access, size),
            Some(Source::Volume(src)) => backend.clone_volume(&src, &id, access, size),
        })
        .await?;
        self.store.update(|s| {
            s.volumes.insert(record.id.clone(), record.clone());
            Ok(())
        })?;
        tracing::info!(volume = %record.id, name = %record.name, size, "created volume");
        Ok(CreateVolumeResponse {
            volume: Some(self.volume_message(&record)),
        })
    }

    async fn delete_volume(
        &self,
        _ctx: &CallContext,
        req: DeleteVolumeRequest,
    ) -> CsiResult<DeleteVolumeResponse> {
        if !IdKind::Volume.is_valid(&req.volume_id) {
            return Ok(DeleteVolumeResponse {});
        }
        let id = req.volume_id.clone();
        let on_node = self.in_use_on_node(&id);
        let removed = self.store.update(|s| {
            let Some(v) = s.volumes.get(&id) else {
                return Ok(None);
            };
            if !v.published_nodes.is_empty() || on_node {
                return Err(CsiError::FailedPrecondition(format!(
                    "volume {id} is in use"
                )));
            }
            if s.snapshots.values().any(|snap| snap.source_volume_id == id) {
                return Err(CsiError::FailedPrecondition(format!(
                    "volume {id} has snapshots; delete them first"
                )));
            }
            Ok(s.volumes.remove(&id))
        })?;
        if let Some(v) = removed {
            let backend = self.backend.clone();
            blocking(move || backend.delete_volume(&v.id, v.access)).await?;
            tracing::info!(volume = %req.volume_id, "deleted volume");
        }
        Ok(DeleteVolumeResponse {})
    }

    async fn controller_publish_volume(
        &self,
        _ctx: &CallContext,
        req: ControllerPublishVolumeRequest,
    ) -> CsiResult<ControllerPublishVolumeResponse> {
        let volume = self.known_volume(&req.volume_id)?;
        if req.node_id != self.node_id {
            return Err(CsiError::NotFound(format!(
                "node {:?} does not exist",
                req.node_id
            )));
        }
        let cap = req.volume_capability.clone().unwrap_or_default();
        let limit = self.config.attach_limit;
        let context = [(
            "hostpath.csi-kit.dev/access".to_owned(),
            format!("{:?}", volume.access).to_lowercase(),
        )]
        .into();
        self.store.update(|s| {
            let attached_here = s
                .volumes
                .values()
                .filter(|v| v.published_nodes.contains_key(&req.node_id))
                .count() as i64;
            let v = s.volumes.get_mut(&req.volume_id).ok_or_else(|| {
                CsiError::NotFound(format!("volume {} does not exist", req.volume_id))
            })?;
            let new_here = !v.published_nodes.contains_key(&req.node_id);
            if new_here && limit > 0 && attached_here >= limit {
                return Err(CsiError::ResourceExhausted(format!(
                    "node {} has reached its limit of {limit} attached volumes",
                    req.node_id
                )));
            }
            record_attachment(
                &v.id,
                &mut v.published_nodes,
                &req.node_id,
                req.readonly,
                cap.access_mode().is_multi_node(),
            )
        })?;
        Ok(ControllerPublishVolumeResponse {
            publish_context: context,
        })
    }

    async fn controller_unpublish_volume(
        &self,
        _ctx: &CallContext,
        req: ControllerUnpublishVolumeRequest,
    ) -> CsiResult<ControllerUnpublishVolumeResponse> {
        // A missing volume or node counts as unpublished (the spec's SHOULD).
        self.store.update(|s| {
            if let Some(v) = s.volumes.get_mut(&req.volume_id) {
                forget_attachment(&mut v.published_nodes, &req);
            }
            Ok(())
        })?;
        Ok(ControllerUnpublishVolumeResponse {})
    }

    async fn validate_volume_capabilities(
        &self,
        _ctx: &CallContext,
        req: ValidateVolumeCapabilitiesRequest,
    ) -> CsiResult<ValidateVolumeCapabilitiesResponse> {
        let volume = self.known_volume(&req.volume_id)?;
        let unsupported = req
            .volume_capabilities
            .iter()
            .find(|c| c.is_block() != (volume.access == Access::Block));
        if let Some(cap) = unsupported {
            return Ok(ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: format!(
                    "volume {} does not support {} access",
                    volume.id,
                    if cap.is_block() { "block" } else { "mount" }
                ),
            });
        }
        Ok(confirmed(req))
    }

    async fn list_volumes(
        &self,
        _ctx: &CallContext,
        req: ListVolumesRequest,
    ) -> CsiResult<ListVolumesResponse> {
        let (entries, next_token) = self.store.read(|s| {
            let all: Vec<&VolumeRecord> = s.volumes.values().filter(|v| !v.ephemeral).collect();
            page(all, req.max_entries, &req.starting_token, |v| {
                list_volumes_response::Entry {
                    volume: Some(self.volume_message(v)),
                    status: Some(list_volumes_response::VolumeStatus {
                        published_node_ids: v.published_nodes.keys().cloned().collect(),
                        volume_condition: Some(self.volume_condition(v)),
                    }),
                }
            })
        })?;
        Ok(ListVolumesResponse {
            entries,
            next_token,
        })
    }

    async fn get_capacity(
        &self,
        _ctx: &CallContext,
        req: GetCapacityRequest,
    ) -> CsiResult<GetCapacityResponse> {
        let ours = self.our_segment();
        let elsewhere = self.config.enable_topology
            && req
                .accessible_topology
                .as_ref()
                .is_some_and(|t| t.segments.iter().any(|(k, v)| ours.get(k) != Some(v)));
        Ok(GetCapacityResponse {
            available_capacity: if elsewhere {
                0
            } else {
                self.available_capacity()
            },
            maximum_volume_size: Some(self.config.max_volume_size),
            minimum_volume_size: None,
        })
    }

    async fn create_snapshot(
        &self,
        _ctx: &CallContext,
        req: CreateSnapshotRequest,
    ) -> CsiResult<CreateSnapshotResponse> {
        if let Some(existing) = self.store.read(|s| s.snapshot_by_name(&req.name).cloned()) {
            compare_snapshot(
                &Self::snapshot_message(&existing),
                &to_map(&existing.parameters),
                &req,
            )?;
            return Ok(CreateSnapshotResponse {
                snapshot: Some(Self::snapshot_message(&existing)),
            });
        }
        let volume = self.known_volume(&req.source_volume_id)?;
        let mut record = self.cut_snapshot(&volume, &req.name, None).await?;
        record.parameters = sorted(&req.parameters);
        self.store.update(|s| {
            s.snapshots.insert(record.id.clone(), record.clone());
            Ok(())
        })?;
        Ok(CreateSnapshotResponse {
            snapshot: Some(Self::snapshot_message(&record)),
        })
    }

    async fn delete_snapshot(
        &self,
        _ctx: &CallContext,
        req: DeleteSnapshotRequest,
    ) -> CsiResult<DeleteSnapshotResponse> {
        if !IdKind::Snapshot.is_valid(&req.snapshot_id) {
            return Ok(DeleteSnapshotResponse {});
        }
        let removed = self
            .store
            .update(|s| match s.snapshots.get(&req.snapshot_id) {
                Some(snap) if snap.group_snapshot_id.is_some() => Err(CsiError::invalid(
                    "snapshot_id",
                    "the snapshot belongs to a group snapshot; delete the group instead",
                )),
                Some(_) => Ok(s.snapshots.remove(&req.snapshot_id)),
                None => Ok(None),
            })?;
        if let Some(snap) = removed {
            let backend = self.backend.clone();
            blocking(move || backend.delete_snapshot(&snap.id, snap.access)).await?;
        }
        Ok(DeleteSnapshotResponse {})
    }

    async fn list_snapshots(
        &self,
        _ctx: &CallContext,
        req: ListSnapshotsRequest,
    ) -> CsiResult<ListSnapshotsResponse> {
        let (entries, next_token) = self.store.read(|s| {
            let all: Vec<&SnapshotRecord> = s
                .snapshots
                .values()
                .filter(|snap| req.snapshot_id.is_empty() || snap.id == req.snapshot_id)
                .filter(|snap| {
                    req.source_volume_id.is_empty() || snap.source_volume_id == req.source_volume_id
                })
                .collect();
            page(all, req.max_entries, &req.starting_token, |snap| {
                list_snapshots_response::Entry {
                    snapshot: Some(Self::snapshot_message(snap)),
                }
            })
        })?;
        Ok(ListSnapshotsResponse {
            entries,
            next_token,
        })
    }

    async fn get_snapshot(
        &self,
        _ctx: &CallContext,
        req: GetSnapshotRequest,
    ) -> CsiResult<GetSnapshotResponse> {
        let snap = IdKind::Snapshot
            .is_valid(&req.snapshot_id)
            .then(|| {
                self.store
                    .read(|s| s.snapshots.get(&req.snapshot_id).cloned())
            })
            .flatten()
            .ok_or_else(|| {
                CsiError::NotFound(format!("snapshot {:?} does not exist", req.snapshot_id))
            })?;
        Ok(GetSnapshotResponse {
            snapshot: Some(Self::snapshot_message(&snap)),
        })
    }

    async fn controller_expand_volume(
        &self,
        _ctx: &CallContext,
        req: ControllerExpandVolumeRequest,
    ) -> CsiResult<ControllerExpandVolumeResponse> {
        let volume = self.known_volume(&req.volume_id)?;
        let size = self.volume_size(req.capacity_range.as_ref(), volume.access)?;
        if size <= volume.capacity_bytes {
            return Ok(ControllerExpandVolumeResponse {
                capacity_bytes: volume.capacity_bytes,
                node_expansion_required: false,
            });
        }
        if self.config.capacity > 0 && size - volume.capacity_bytes > self.available_capacity() {
            return Err(CsiError::ResourceExhausted(format!(
                "not enough capacity to grow to {}",
                csi_proto::size::format_bytes(size)
            )));
        }
        // Block: grow the backing file; directory: raise its quota (if any).
        let (backend, id, access) = (self.backend.clone(), volume.id.clone(), volume.access);
        blocking(move || match access {
            Access::Block => backend.grow_block(&id, size),
            Access::Mount => backend.grow_mount(&id, size),
        })
        .await?;
        self.store.update(|s| {
            if let Some(v) = s.volumes.get_mut(&volume.id) {
                v.capacity_bytes = size;
            }
            Ok(())
        })?;
        Ok(ControllerExpandVolumeResponse {
            capacity_bytes: size,
            node_expansion_required: volume.access == Access::Block,
        })
    }

    async fn controller_get_volume(
        &self,
        _ctx: &CallContext,
        req: ControllerGetVolumeRequest,
    ) -> CsiResult<ControllerGetVolumeResponse> {
        let volume = self.known_volume(&req.volume_id)?;
        Ok(ControllerGetVolumeResponse {
            volume: Some(self.volume_message(&volume)),
            status: Some(controller_get_volume_response::VolumeStatus {
                published_node_ids: volume.published_nodes.keys().cloned().collect(),
                volume_condition: Some(self.volume_condition(&volume)),
            }),
        })
    }

    async fn controller_modify_volume(
        &self,
        _ctx: &CallContext,
        req: ControllerModifyVolumeRequest,
    ) -> CsiResult<ControllerModifyVolumeResponse> {
        // Only accepted keys get here (declared in the capabilities); an
        // empty map is a no-op on an existing volume.
        self.known_volume(&req.volume_id)?;
        self.store.update(|s| {
            let v = s.volumes.get_mut(&req.volume_id).ok_or_else(|| {
                CsiError::NotFound(format!("volume {} does not exist", req.volume_id))
            })?;
            v.mutable_parameters.extend(req.mutable_parameters.clone());
            Ok(())
        })?;
        Ok(ControllerModifyVolumeResponse {})
    }
}

impl HostPath {
    /// A healthy volume has its data in place.
    pub(crate) fn volume_condition(&self, v: &VolumeRecord) -> VolumeCondition {
        let path = self.backend.volume_path(&v.id, v.access);
        if path.exists() {
            VolumeCondition {
                abnormal: false,
                message: "volume data is present".into(),
            }
        } else {
            VolumeCondition {
                abnormal: true,
                message: format!("volume data {} is missing", path.display()),
            }
        }
    }

    /// Copies a volume into a new snapshot (blocking I/O off the runtime).
    pub(crate) async fn cut_snapshot(
        &self,
        volume: &VolumeRecord,
        name: &str,
        group: Option<&str>,
    ) -> CsiResult<SnapshotRecord> {
        let record = Self::new_snapshot_record(volume, name, group);
        let (backend, vol, snap, access) = (
            self.backend.clone(),
            volume.id.clone(),
            record.id.clone(),
            volume.access,
        );
        blocking(move || backend.snapshot(&vol, &snap, access)).await?;
        Ok(record)
    }

    /// The record of a snapshot about to be cut from `volume`.
    pub(crate) fn new_snapshot_record(
        volume: &VolumeRecord,
        name: &str,
        group: Option<&str>,
    ) -> SnapshotRecord {
        SnapshotRecord {
            id: IdKind::Snapshot.generate(),
            name: name.to_owned(),
            source_volume_id: volume.id.clone(),
            size_bytes: volume.capacity_bytes,
            access: volume.access,
            created_unix_nanos: now_nanos(),
            group_snapshot_id: group.map(str::to_owned),
            parameters: BTreeMap::new(),
        }
    }
}
