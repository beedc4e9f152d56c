//! The Controller service: volumes as directories or sparse image files,
//! snapshots as archives or image copies, attachment bookkeeping, paging.

use std::collections::BTreeMap;

use csi_proto::v1::*;
use csi_server::helpers::capacity::{CapacityPolicy, resolve_capacity};
use csi_server::helpers::idempotency::{compare_snapshot, compare_volume};
use csi_server::{CallContext, Controller, CsiError, CsiResult};
use prost::Message;

use crate::common::state::{Res, Reservation};
use crate::common::{access_of, confirmed, free_space, now_nanos, page, sorted, timestamp, to_map};
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

    /// Free capacity: the configured total minus what is promised to
    /// volumes (and to creates in progress), or the free space of the state
    /// directory's filesystem. Never negative.
    pub(crate) fn available_capacity(&self) -> i64 {
        let free = if self.config.capacity > 0 {
            self.config.capacity - self.ledger.used()
        } else {
            free_space(self.backend.root())
        };
        free.max(0)
    }

    /// Reserves `bytes` of `--capacity` (checked and taken in one step), or
    /// RESOURCE_EXHAUSTED.
    fn reserve(&self, bytes: i64, what: &str) -> CsiResult<Reservation> {
        self.ledger
            .reserve(bytes, self.config.capacity)
            .ok_or_else(|| {
                CsiError::ResourceExhausted(format!(
                    "not enough capacity {what}: {} left",
                    csi_proto::size::format_bytes(self.available_capacity())
                ))
            })
    }

    /// Makes a new volume's data, then saves its record; if either fails,
    /// removes what was made (so a full disk leaves nothing behind and the
    /// CO's retry starts clean). Runs in a blocking task holding the
    /// volume's claims, to the end even if the call is cancelled.
    fn make_volume(&self, record: VolumeRecord, reservation: Reservation) -> CsiResult<()> {
        let (id, access, size) = (record.id.as_str(), record.access, record.capacity_bytes);
        let made = match &record.source {
            None => self.backend.create_volume(id, access, size),
            Some(Source::Snapshot(snap)) => self.backend.restore(snap, id, access, size),
            Some(Source::Volume(src)) => self.backend.clone_volume(src, id, access, size),
        };
        made?;
        if let Err(e) = self.store.volumes.put(id, record.clone()) {
            if let Err(undo) = self.backend.delete_volume(id, access) {
                tracing::error!(volume = %id, error = %undo, "removing the data of a volume whose record could not be saved");
            }
            return Err(e.into());
        }
        reservation.keep();
        Ok(())
    }

    /// DeleteVolume's work, under the volume's claim: the record goes first
    /// (refused while the volume is in use), then the data. With no record,
    /// data an unacknowledged create or a half-done delete left is removed.
    fn remove_volume(&self, id: &str) -> CsiResult<()> {
        let removed = self.store.volumes.update(id, |slot| {
            if slot.is_none() {
                return Ok(None);
            }
            if self.in_use_on_node(id) {
                return Err(CsiError::FailedPrecondition(format!(
                    "volume {id} is in use on this node"
                )));
            }
            if let Some(why) = self.store.in_use(id) {
                return Err(CsiError::FailedPrecondition(format!("volume {id} {why}")));
            }
            Ok(slot.take())
        })?;
        match removed {
            Some(v) => {
                self.ledger.release(v.capacity_bytes);
                self.backend.delete_volume(id, v.access)?;
                tracing::info!(volume = %id, "deleted volume");
            }
            None => {
                if self.backend.delete_volume_data(id)? {
                    tracing::warn!(volume = %id, "removed data of a volume with no record");
                }
            }
        }
        Ok(())
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
        // One CreateVolume per name at a time, however long its copy runs.
        let mut claim = self
            .in_flight
            .claim("CreateVolume", &[(Res::VolumeName, &req.name)])?;
        if let Some(existing) = self.store.volumes.by_name(&req.name) {
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
        // The source must exist, have the same access type, fit, and stay
        // while it is copied (its claim makes a DeleteVolume/DeleteSnapshot
        // of it ABORTED meanwhile).
        let source_size = match &source {
            Some(Source::Snapshot(id)) => {
                claim.also(&[(Res::Snapshot, id)])?;
                let snap = IdKind::Snapshot
                    .is_valid(id)
                    .then(|| self.store.snapshots.get(id))
                    .flatten()
                    .ok_or_else(|| CsiError::NotFound(format!("snapshot {id:?} does not exist")))?;
                if snap.access != access {
                    return Err(CsiError::invalid(
                        "volume_content_source",
                        "snapshot access type differs from the requested one",
                    ));
                }
                let vol_size = self
                    .store
                    .volumes
                    .get(&snap.source_volume_id)
                    .map(|v| v.capacity_bytes);
                vol_size
                    .unwrap_or(snap.size_bytes)
                    .max(if access == Access::Block {
                        snap.size_bytes
                    } else {
                        0
                    })
            }
            Some(Source::Volume(id)) => {
                claim.also(&[(Res::Volume, id)])?;
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
        let reservation = self.reserve(
            size,
            &format!("for {}", csi_proto::size::format_bytes(size)),
        )?;
        let record = VolumeRecord {
            id: IdKind::Volume.generate(),
            name: req.name.clone(),
            capacity_bytes: size,
            access,
            source,
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
            ephemeral: false,
        };
        claim.also(&[(Res::Volume, &record.id)])?;
        let this = self.clone();
        let made = record.clone();
        blocking(move || {
            let _claim = claim;
            this.make_volume(made, reservation)
        })
        .await?;
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
        let claim = self
            .in_flight
            .claim("DeleteVolume", &[(Res::Volume, &req.volume_id)])?;
        let (this, id) = (self.clone(), req.volume_id);
        blocking(move || {
            let _claim = claim;
            this.remove_volume(&id)
        })
        .await?;
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
        self.store.attach(
            &req.volume_id,
            &req.node_id,
            req.readonly,
            cap.access_mode().is_multi_node(),
            limit,
        )?;
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
        if IdKind::Volume.is_valid(&req.volume_id) {
            self.store.detach(&req)?;
        }
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
        let (entries, next_token) = self.store.volumes.read(|all| {
            let all: Vec<&VolumeRecord> = all.values().filter(|v| !v.ephemeral).collect();
            page(all, req.max_entries, &req.starting_token, |v| {
                list_volumes_response::Entry {
                    volume: Some(self.volume_message(v)),
                    status: Some(list_volumes_response::VolumeStatus {
                        published_node_ids: self.store.attached_nodes(&v.id),
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
        let mut claim = self
            .in_flight
            .claim("CreateSnapshot", &[(Res::SnapshotName, &req.name)])?;
        if let Some(existing) = self.store.snapshots.by_name(&req.name) {
            compare_snapshot(
                &Self::snapshot_message(&existing),
                &to_map(&existing.parameters),
                &req,
            )?;
            return Ok(CreateSnapshotResponse {
                snapshot: Some(Self::snapshot_message(&existing)),
            });
        }
        // The source stays while it is copied: DeleteVolume of it is ABORTED.
        claim.also(&[(Res::Volume, &req.source_volume_id)])?;
        let volume = self.known_volume(&req.source_volume_id)?;
        let mut record = Self::new_snapshot_record(&volume, &req.name, None);
        record.parameters = sorted(&req.parameters);
        claim.also(&[(Res::Snapshot, &record.id)])?;
        let (this, saved) = (self.clone(), record.clone());
        blocking(move || {
            let _claim = claim;
            let (id, access) = (saved.id.clone(), saved.access);
            this.backend
                .snapshot(&saved.source_volume_id, &id, access)?;
            if let Err(e) = this.store.snapshots.put(&id, saved) {
                let _ = this.backend.delete_snapshot(&id, access);
                return Err(e.into());
            }
            Ok(())
        })
        .await?;
        tracing::info!(snapshot = %record.id, volume = %volume.id, "created snapshot");
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
        // ABORTED while a volume is being restored from it.
        let claim = self
            .in_flight
            .claim("DeleteSnapshot", &[(Res::Snapshot, &req.snapshot_id)])?;
        let (this, id) = (self.clone(), req.snapshot_id);
        blocking(move || {
            let _claim = claim;
            let removed = this.store.snapshots.update(&id, |slot| match slot {
                Some(snap) if snap.group_snapshot_id.is_some() => Err(CsiError::invalid(
                    "snapshot_id",
                    "the snapshot belongs to a group snapshot; delete the group instead",
                )),
                _ => Ok(slot.take()),
            })?;
            match removed {
                Some(snap) => this.backend.delete_snapshot(&snap.id, snap.access),
                None => this.backend.delete_snapshot_data(&id).map(drop),
            }
        })
        .await?;
        Ok(DeleteSnapshotResponse {})
    }

    async fn list_snapshots(
        &self,
        _ctx: &CallContext,
        req: ListSnapshotsRequest,
    ) -> CsiResult<ListSnapshotsResponse> {
        let (entries, next_token) = self.store.snapshots.read(|all| {
            let all: Vec<&SnapshotRecord> = all
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
            .then(|| self.store.snapshots.get(&req.snapshot_id))
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
        let claim = self
            .in_flight
            .claim("ControllerExpandVolume", &[(Res::Volume, &req.volume_id)])?;
        let volume = self.known_volume(&req.volume_id)?;
        let size = self.volume_size(req.capacity_range.as_ref(), volume.access)?;
        if size <= volume.capacity_bytes {
            return Ok(ControllerExpandVolumeResponse {
                capacity_bytes: volume.capacity_bytes,
                node_expansion_required: false,
            });
        }
        let reservation = self.reserve(
            size - volume.capacity_bytes,
            &format!("to grow to {}", csi_proto::size::format_bytes(size)),
        )?;
        // Block: grow the backing file; directory: raise its quota (if any).
        let (this, id, access) = (self.clone(), volume.id.clone(), volume.access);
        blocking(move || {
            let _claim = claim;
            match access {
                Access::Block => this.backend.grow_block(&id, size)?,
                Access::Mount => this.backend.grow_mount(&id, size)?,
            }
            this.store.volumes.update(&id, |slot| {
                if let Some(v) = slot {
                    v.capacity_bytes = size;
                }
                Ok(())
            })?;
            reservation.keep();
            Ok(())
        })
        .await?;
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
                published_node_ids: self.store.attached_nodes(&volume.id),
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
        self.store.volumes.update(&req.volume_id, |slot| {
            let v = slot.as_mut().ok_or_else(|| {
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
