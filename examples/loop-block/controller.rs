//! The Controller service: disks as sparse backing files, attachment
//! bookkeeping (the cloud API's attach step), snapshots as sparse copies,
//! clones, expansion, paging and capacity.

use csi_proto::v1::*;
use csi_server::helpers::capacity::{CapacityPolicy, resolve_capacity};
use csi_server::helpers::idempotency::{compare_snapshot, compare_volume};
use csi_server::{CallContext, Controller, CsiError, CsiResult};
use prost::Message;

use crate::common::state::Res;
use crate::common::{
    IdKind, blocking, confirmed, free_space, now_nanos, page, sorted, timestamp, to_map,
};
use crate::driver::LoopBlock;
use crate::store::{Access, SnapshotRecord, Source, VolumeRecord};
use crate::tuning::{TuneError, Tuning};

/// Size of a volume when the request gives no capacity range.
pub const DEFAULT_VOLUME_SIZE: i64 = 1 << 30;

/// Disks are whole MiB: loop devices want whole sectors and filesystems
/// whole blocks, and a round unit keeps sizes readable.
const BLOCK_UNIT: i64 = 1 << 20;

/// The publish-context key carrying the backing file to the node (what a
/// cloud driver would return as the attached device's path or serial).
pub const BACKING_FILE_KEY: &str = "loop-block.csi-kit.dev/backing-file";

/// Filesystems NodeStage can create (SafeFormatAndMount's list).
const SUPPORTED_FS: [&str; 4] = ["ext3", "ext4", "xfs", "btrfs"];

/// The access type of the capabilities, whose filesystem must be one NodeStage can create.
fn access_of(caps: &[VolumeCapability]) -> CsiResult<Access> {
    if let Some(fs) = caps
        .iter()
        .filter_map(|c| c.mount_volume())
        .map(|m| m.fs_type.as_str())
        .find(|fs| !fs.is_empty() && !SUPPORTED_FS.contains(fs))
    {
        return Err(CsiError::invalid(
            "volume_capabilities.mount.fs_type",
            format!("{fs:?} is not supported (supported: {SUPPORTED_FS:?})"),
        ));
    }
    crate::common::access_of(caps)
}

impl LoopBlock {
    fn volume_message(v: &VolumeRecord) -> Volume {
        Volume {
            capacity_bytes: v.capacity_bytes,
            volume_id: v.id.clone(),
            volume_context: to_map(&v.parameters),
            content_source: v.source.as_ref().map(Source::message),
            accessible_topology: Vec::new(),
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

    fn volume_size(&self, range: Option<&CapacityRange>) -> CsiResult<i64> {
        let policy = CapacityPolicy {
            default_size: DEFAULT_VOLUME_SIZE,
            min_size: BLOCK_UNIT,
            max_size: self.config.max_volume_size,
            unit: BLOCK_UNIT,
        };
        resolve_capacity(range, &policy)
    }

    fn known_snapshot(&self, id: &str) -> CsiResult<SnapshotRecord> {
        IdKind::Snapshot
            .is_valid(id)
            .then(|| self.store.snapshots.get(id))
            .flatten()
            .ok_or_else(|| CsiError::NotFound(format!("snapshot {id:?} does not exist")))
    }

    /// The file a new volume is copied from and the smallest size it may
    /// have, after checking the source exists with the same access type.
    fn content_source(
        &self,
        source: &Source,
        access: Access,
    ) -> CsiResult<(std::path::PathBuf, i64)> {
        let (path, source_access, size) = match source {
            Source::Snapshot(id) => {
                let snap = self.known_snapshot(id)?;
                (self.backend.snapshot_path(id), snap.access, snap.size_bytes)
            }
            Source::Volume(id) => {
                let vol = self.known_volume(id).map_err(|_| {
                    CsiError::NotFound(format!("source volume {id:?} does not exist"))
                })?;
                (self.backend.volume_path(id), vol.access, vol.capacity_bytes)
            }
        };
        if source_access != access {
            return Err(CsiError::invalid(
                "volume_content_source",
                "the source's access type differs from the requested one",
            ));
        }
        Ok((path, size))
    }
}

#[csi_server::async_trait]
impl Controller for LoopBlock {
    async fn create_volume(
        &self,
        _ctx: &CallContext,
        req: CreateVolumeRequest,
    ) -> CsiResult<CreateVolumeResponse> {
        let access = access_of(&req.volume_capabilities)?;
        let tuning = Tuning::default().with(&req.mutable_parameters, self.direct_io_supported)?;
        // One CreateVolume per name at a time, however long its copy runs.
        let mut claim = self
            .in_flight
            .claim("CreateVolume", &[(Res::VolumeName, &req.name)])?;
        if let Some(existing) = self.store.volumes.by_name(&req.name) {
            let original = CreateVolumeRequest::decode(existing.request.as_slice())
                .map_err(|e| CsiError::Internal(format!("state of volume {}: {e}", existing.id)))?;
            let volume = Self::volume_message(&existing);
            compare_volume(&original, &volume, &req)?;
            return Ok(CreateVolumeResponse {
                volume: Some(volume),
            });
        }
        let size = self.volume_size(req.capacity_range.as_ref())?;
        let source = Source::of(req.volume_content_source.as_ref());
        let copy_from = match &source {
            Some(src) => {
                // The source stays while it is copied: deleting it is ABORTED.
                claim.also(&[match src {
                    Source::Snapshot(id) => (Res::Snapshot, id.as_str()),
                    Source::Volume(id) => (Res::Volume, id.as_str()),
                }])?;
                let (path, source_size) = self.content_source(src, access)?;
                if size < source_size {
                    return Err(CsiError::OutOfRange(format!(
                        "capacity_range: {size} bytes is smaller than the source's {source_size} bytes"
                    )));
                }
                Some(path)
            }
            None => None,
        };
        if size > free_space(self.backend.root()) {
            // Sparse files could overcommit; a disk driver must not promise
            // space it does not have.
            return Err(CsiError::ResourceExhausted(format!(
                "not enough free space for {}",
                csi_proto::size::format_bytes(size)
            )));
        }
        let record = VolumeRecord {
            id: IdKind::Volume.generate(),
            name: req.name.clone(),
            capacity_bytes: size,
            access,
            source,
            parameters: sorted(&req.parameters),
            request: CreateVolumeRequest {
                secrets: Default::default(),
                ..req.clone()
            }
            .encode_to_vec(),
            tuning,
        };
        claim.also(&[(Res::Volume, &record.id)])?;
        let (this, saved) = (self.clone(), record.clone());
        // Data, then record; a failure of either (a full disk) leaves nothing.
        blocking(move || {
            let _claim = claim;
            let id = saved.id.clone();
            match copy_from {
                None => this.backend.create(&id, size)?,
                Some(src) => this.backend.copy_into(&src, &id, size)?,
            }
            if let Err(e) = this.store.volumes.put(&id, saved) {
                let _ = this.backend.delete(&id);
                return Err(e.into());
            }
            Ok(())
        })
        .await?;
        tracing::info!(volume = %record.id, name = %record.name, size, "created volume");
        Ok(CreateVolumeResponse {
            volume: Some(Self::volume_message(&record)),
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
            let removed = this.store.volumes.update(&id, |slot| {
                if slot.is_none() {
                    return Ok(None);
                }
                if let Some(node) = this.store.attached_nodes(&id).first() {
                    return Err(CsiError::FailedPrecondition(format!(
                        "volume {id} is attached to node {node}"
                    )));
                }
                if this.in_use_on_node(&id) {
                    return Err(CsiError::FailedPrecondition(format!(
                        "volume {id} is in use on this node"
                    )));
                }
                Ok(slot.take())
            })?;
            // Record first, then data: a crash in between leaves a file the
            // next start removes. Without a record, a file left by an
            // unacknowledged create or a half-done delete goes now.
            let had_data = this.backend.volume_path(&id).exists();
            this.backend.delete(&id)?;
            match removed {
                Some(_) => tracing::info!(volume = %id, "deleted volume"),
                None if had_data => {
                    tracing::warn!(volume = %id, "removed the backing file of a volume with no record")
                }
                None => {}
            }
            Ok(())
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
        if cap.is_block() != (volume.access == Access::Block) {
            return Err(CsiError::invalid(
                "volume_capability",
                format!("volume {} was not created for this access type", volume.id),
            ));
        }
        let limit = self.config.attach_limit;
        self.store.attach(
            &req.volume_id,
            &req.node_id,
            req.readonly,
            cap.access_mode().is_multi_node(),
            limit,
        )?;
        let backing = self.backend.volume_path(&volume.id);
        Ok(ControllerPublishVolumeResponse {
            publish_context: [(
                BACKING_FILE_KEY.to_owned(),
                backing.to_string_lossy().into_owned(),
            )]
            .into(),
        })
    }

    async fn controller_unpublish_volume(
        &self,
        _ctx: &CallContext,
        req: ControllerUnpublishVolumeRequest,
    ) -> CsiResult<ControllerUnpublishVolumeResponse> {
        // A missing volume or node counts as detached (the spec's SHOULD).
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
        let tuning = volume
            .tuning
            .with(&req.mutable_parameters, self.direct_io_supported);
        let message = match (access_of(&req.volume_capabilities), tuning) {
            (Err(e), _) | (_, Err(e)) => Some(e.to_string()),
            (Ok(access), _) if access != volume.access => Some(format!(
                "volume {} was created for {:?} access",
                volume.id, volume.access
            )),
            _ => None,
        };
        if let Some(message) = message {
            return Ok(ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message,
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
            let all: Vec<&VolumeRecord> = all.values().collect();
            page(all, req.max_entries, &req.starting_token, |v| {
                list_volumes_response::Entry {
                    volume: Some(Self::volume_message(v)),
                    status: Some(list_volumes_response::VolumeStatus {
                        published_node_ids: self.store.attached_nodes(&v.id),
                        volume_condition: None,
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
        _req: GetCapacityRequest,
    ) -> CsiResult<GetCapacityResponse> {
        Ok(GetCapacityResponse {
            available_capacity: free_space(self.backend.root()),
            maximum_volume_size: Some(self.config.max_volume_size),
            minimum_volume_size: Some(BLOCK_UNIT),
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
            let snapshot = Self::snapshot_message(&existing);
            compare_snapshot(&snapshot, &to_map(&existing.parameters), &req)?;
            return Ok(CreateSnapshotResponse {
                snapshot: Some(snapshot),
            });
        }
        // The source stays while it is copied: DeleteVolume of it is ABORTED.
        claim.also(&[(Res::Volume, &req.source_volume_id)])?;
        let volume = self.known_volume(&req.source_volume_id)?;
        let record = SnapshotRecord {
            id: IdKind::Snapshot.generate(),
            name: req.name.clone(),
            source_volume_id: volume.id.clone(),
            size_bytes: volume.capacity_bytes,
            access: volume.access,
            created_unix_nanos: now_nanos(),
            parameters: sorted(&req.parameters),
            group_snapshot_id: None,
        };
        claim.also(&[(Res::Snapshot, &record.id)])?;
        let (this, saved) = (self.clone(), record.clone());
        blocking(move || {
            let _claim = claim;
            let id = saved.id.clone();
            this.backend.snapshot(&saved.source_volume_id, &id)?;
            if let Err(e) = this.store.snapshots.put(&id, saved) {
                let _ = this.backend.delete_snapshot(&id);
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
        // ABORTED while a disk is being restored from it.
        let claim = self
            .in_flight
            .claim("DeleteSnapshot", &[(Res::Snapshot, &req.snapshot_id)])?;
        let (this, id) = (self.clone(), req.snapshot_id);
        blocking(move || {
            let _claim = claim;
            this.store.snapshots.update(&id, |slot| match slot {
                Some(snap) if snap.group_snapshot_id.is_some() => Err(CsiError::invalid(
                    "snapshot_id",
                    format!("snapshot {id} belongs to a group snapshot; delete the group instead"),
                )),
                _ => Ok(slot.take()),
            })?;
            // With or without a record: a copy left by a crash goes too.
            this.backend.delete_snapshot(&id)
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
        let snap = self.known_snapshot(&req.snapshot_id)?;
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
        let size = self.volume_size(req.capacity_range.as_ref())?;
        // The node must always act: the loop device does not see the file
        // grow until LOOP_SET_CAPACITY, and a filesystem must be grown too.
        if size <= volume.capacity_bytes {
            return Ok(ControllerExpandVolumeResponse {
                capacity_bytes: volume.capacity_bytes,
                node_expansion_required: true,
            });
        }
        if size - volume.capacity_bytes > free_space(self.backend.root()) {
            return Err(CsiError::ResourceExhausted(format!(
                "not enough free space to grow volume {} to {}",
                volume.id,
                csi_proto::size::format_bytes(size)
            )));
        }
        let (this, id) = (self.clone(), volume.id.clone());
        blocking(move || {
            let _claim = claim;
            this.backend.grow(&id, size)?;
            this.store.volumes.update(&id, |slot| {
                if let Some(v) = slot {
                    v.capacity_bytes = size;
                }
                Ok(())
            })
        })
        .await?;
        tracing::info!(volume = %volume.id, size, "grew volume");
        Ok(ControllerExpandVolumeResponse {
            capacity_bytes: size,
            node_expansion_required: true,
        })
    }

    async fn controller_get_volume(
        &self,
        _ctx: &CallContext,
        req: ControllerGetVolumeRequest,
    ) -> CsiResult<ControllerGetVolumeResponse> {
        let volume = self.known_volume(&req.volume_id)?;
        Ok(ControllerGetVolumeResponse {
            volume: Some(Self::volume_message(&volume)),
            status: Some(controller_get_volume_response::VolumeStatus {
                published_node_ids: self.store.attached_nodes(&volume.id),
                volume_condition: None,
            }),
        })
    }

    async fn controller_modify_volume(
        &self,
        _ctx: &CallContext,
        req: ControllerModifyVolumeRequest,
    ) -> CsiResult<ControllerModifyVolumeResponse> {
        // Exclusive: no NodeStage attaches the disk with the old values meanwhile.
        let _exclusive = self.attachments.write().await;
        let volume = self.known_volume(&req.volume_id)?;
        let tuning = volume
            .tuning
            .with(&req.mutable_parameters, self.direct_io_supported)?;
        if tuning == volume.tuning {
            return Ok(ControllerModifyVolumeResponse {});
        }
        // Attached on this host: the change takes effect now (a cloud disk
        // changes its IOPS while attached too); otherwise at the next attach.
        let image = self.backend.volume_path(&volume.id);
        let applied_to = blocking(move || {
            let devices = mount_utils::loopdev::find_by_backing_file(&image)
                .map_err(|e| CsiError::Internal(format!("looking up loop devices: {e}")))?;
            for d in &devices {
                tuning.apply(d).map_err(TuneError::for_modify)?;
            }
            Ok(devices)
        })
        .await?;
        self.store.volumes.update(&volume.id, |slot| {
            let v = slot.as_mut().ok_or_else(|| {
                CsiError::NotFound(format!("volume {} does not exist", volume.id))
            })?;
            v.tuning = tuning;
            Ok(())
        })?;
        tracing::info!(volume = %volume.id, parameters = ?tuning.to_map(), attached = ?applied_to, "modified volume");
        Ok(ControllerModifyVolumeResponse {})
    }
}

#[cfg(test)]
mod tests {
    //! The driver's own answers, called directly: csi-server's layers are
    //! not in the way, so these pin what loop-block itself says.
    use std::collections::HashMap;
    use std::sync::Arc;

    use clap::Parser;
    use csi_server::Method;
    use csi_server::{Node, PluginInfo};

    use super::*;
    use crate::config::Config;
    use crate::tuning::{DIRECT_IO_KEY, READ_AHEAD_KEY};

    fn driver(dir: &std::path::Path) -> LoopBlock {
        let statedir = dir.to_string_lossy().into_owned();
        let config = Config::parse_from(["loop-block", "--statedir", &statedir, "--nodeid", "n1"]);
        LoopBlock::open(config, Arc::new(mount_utils::FakeMounter::new())).unwrap()
    }

    fn ctx(method: Method) -> CallContext {
        let info = PluginInfo::new("loop-block.csi.csi-kit.dev", "test").unwrap();
        CallContext::for_test(method, info, crate::capabilities())
    }

    fn params(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    async fn create(d: &LoopBlock, name: &str, mutable: &[(&str, &str)]) -> CsiResult<Volume> {
        let req = CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(CapacityRange::at_least(BLOCK_UNIT)),
            volume_capabilities: vec![VolumeCapability::block()],
            mutable_parameters: params(mutable),
            ..Default::default()
        };
        let resp = d.create_volume(&ctx(Method::CreateVolume), req).await?;
        Ok(resp.volume.unwrap())
    }

    async fn modify(d: &LoopBlock, id: &str, mutable: &[(&str, &str)]) -> CsiResult<()> {
        let req = ControllerModifyVolumeRequest {
            volume_id: id.into(),
            mutable_parameters: params(mutable),
            ..Default::default()
        };
        d.controller_modify_volume(&ctx(Method::ControllerModifyVolume), req)
            .await
            .map(drop)
    }

    fn field(e: CsiError) -> String {
        match e {
            CsiError::InvalidArgument { field, .. } => field,
            other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn modify_volume_answers() {
        let dir = tempfile::tempdir().unwrap();
        let d = driver(dir.path());
        let v = create(&d, "pvc-1", &[(READ_AHEAD_KEY, "512")])
            .await
            .unwrap();
        let tuning = |d: &LoopBlock| d.known_volume(&v.volume_id).unwrap().tuning;
        assert_eq!(tuning(&d).read_ahead_kib, Some(512));

        // Empty mutable_parameters on an existing volume: OK, nothing changes.
        modify(&d, &v.volume_id, &[]).await.unwrap();
        assert_eq!(tuning(&d).read_ahead_kib, Some(512));
        // An unknown volume is NOT_FOUND, with or without parameters.
        for id in [
            "vol-00000000000000000000000000000000",
            "non-existing-volume-id",
        ] {
            for p in [&[][..], &[(READ_AHEAD_KEY, "8")][..]] {
                assert!(matches!(
                    modify(&d, id, p).await,
                    Err(CsiError::NotFound(_))
                ));
            }
        }
        // An unknown key next to a good one: INVALID_ARGUMENT naming it, nothing applied.
        let bad = modify(
            &d,
            &v.volume_id,
            &[(READ_AHEAD_KEY, "8"), ("XXX_FakeKey", "x")],
        );
        assert_eq!(
            field(bad.await.unwrap_err()),
            "mutable_parameters[XXX_FakeKey]"
        );
        assert_eq!(tuning(&d).read_ahead_kib, Some(512));
        // A known key is kept; keys not sent keep their values.
        modify(&d, &v.volume_id, &[(DIRECT_IO_KEY, "false")])
            .await
            .unwrap();
        assert_eq!(tuning(&d).read_ahead_kib, Some(512));
        assert_eq!(tuning(&d).direct_io, Some(false));

        // CreateVolume with an unknown mutable parameter creates nothing.
        let err = create(&d, "pvc-2", &[("XXX_FakeKey", "XXX_FakeValue")]).await;
        assert_eq!(field(err.unwrap_err()), "mutable_parameters[XXX_FakeKey]");
        assert!(d.store.volumes.by_name("pvc-2").is_none());
        let files = std::fs::read_dir(d.backend.volumes_dir()).unwrap().count();
        assert_eq!(files, 1, "no backing file for the refused volume");
    }

    #[tokio::test]
    async fn attach_limit_is_reported_and_enforced() {
        let dir = tempfile::tempdir().unwrap();
        let statedir = dir.path().to_string_lossy().into_owned();
        let config = Config::parse_from([
            "loop-block",
            "--statedir",
            &statedir,
            "--nodeid",
            "n1",
            "--attach-limit",
            "2",
        ]);
        let d = LoopBlock::open(config, Arc::new(mount_utils::FakeMounter::new())).unwrap();
        let info = d
            .node
            .node_get_info(&ctx(Method::NodeGetInfo), NodeGetInfoRequest {})
            .await
            .unwrap();
        assert_eq!(info.max_volumes_per_node, 2);
        let publish = |id: String| {
            let d = d.clone();
            async move {
                let req = ControllerPublishVolumeRequest {
                    volume_id: id,
                    node_id: "n1".into(),
                    volume_capability: Some(VolumeCapability::block()),
                    ..Default::default()
                };
                d.controller_publish_volume(&ctx(Method::ControllerPublishVolume), req)
                    .await
                    .map(drop)
            }
        };
        let mut ids = Vec::new();
        for i in 0..3 {
            ids.push(
                create(&d, &format!("pvc-{i}"), &[])
                    .await
                    .unwrap()
                    .volume_id,
            );
        }
        publish(ids[0].clone()).await.unwrap();
        publish(ids[1].clone()).await.unwrap();
        publish(ids[1].clone()).await.unwrap();
        assert!(matches!(
            publish(ids[2].clone()).await,
            Err(CsiError::ResourceExhausted(_))
        ));
        let unpublish = ControllerUnpublishVolumeRequest {
            volume_id: ids[0].clone(),
            node_id: "n1".into(),
            ..Default::default()
        };
        d.controller_unpublish_volume(&ctx(Method::ControllerUnpublishVolume), unpublish)
            .await
            .unwrap();
        publish(ids[2].clone()).await.unwrap();
    }
}
