//! The fake driver's Controller service: volumes, attachments, capacity;
//! snapshots are in `snapshots.rs`.

use csi_proto::v1::*;
use csi_server::helpers::capacity::{CapacityPolicy, resolve_capacity};
use csi_server::helpers::confirm::{confirmed, not_confirmed};
use csi_server::helpers::idempotency::compare_volume;
use csi_server::helpers::paging::paginate;
use csi_server::{CallContext, Controller, CsiError, CsiResult};

use super::state::Vol;
use super::{FakeDriver, Fault, MAX_VOLUMES_PER_NODE, is_block};

#[csi_server::async_trait]
impl Controller for FakeDriver {
    async fn create_volume(
        &self,
        _: &CallContext,
        mut req: CreateVolumeRequest,
    ) -> CsiResult<CreateVolumeResponse> {
        req.secrets.clear();
        self.check_name(&req.name)?;
        if self.has(Fault::MutableParametersOnlyOnModify) && !req.mutable_parameters.is_empty() {
            let reason = "only ControllerModifyVolume takes them";
            return Err(CsiError::invalid("mutable_parameters", reason));
        }
        let mut st = self.lock();
        if !self.has(Fault::NotIdempotentCreate)
            && let Some(v) = st.volumes.values().find(|v| v.request.name == req.name)
        {
            compare_volume(&v.request, &v.volume, &req)?;
            return Ok(CreateVolumeResponse {
                volume: Some(v.volume.clone()),
            });
        }
        let source_size = match req
            .volume_content_source
            .as_ref()
            .and_then(|s| s.r#type.as_ref())
        {
            Some(volume_content_source::Type::Snapshot(s)) => Some(
                st.snapshots
                    .get(&s.snapshot_id)
                    .map(|s| s.snapshot.size_bytes)
                    .ok_or_else(|| {
                        CsiError::NotFound(format!("snapshot {} does not exist", s.snapshot_id))
                    })?,
            ),
            Some(volume_content_source::Type::Volume(v)) => Some(
                st.volumes
                    .get(&v.volume_id)
                    .map(|v| v.volume.capacity_bytes)
                    .ok_or_else(|| {
                        CsiError::NotFound(format!("volume {} does not exist", v.volume_id))
                    })?,
            ),
            None => None,
        };
        let policy = CapacityPolicy::new(csi_proto::size::GIB, 1);
        let mut size = resolve_capacity(req.capacity_range.as_ref(), &policy)?;
        if let Some(src) = source_size {
            let limit = req.capacity_range.as_ref().map_or(0, |r| r.limit_bytes);
            if limit > 0 && src > limit {
                return Err(CsiError::OutOfRange(
                    "the source is larger than limit_bytes".into(),
                ));
            }
            size = size.max(src);
        }
        if st.used() + size > self.opts.total_capacity {
            return Err(CsiError::ResourceExhausted("out of capacity".into()));
        }
        let id = st.next_id("vol");
        let reported = match self.has(Fault::CapacityBelowRequired) {
            true => size / 2,
            false => size,
        };
        let volume = Volume {
            capacity_bytes: reported,
            volume_id: id.clone(),
            volume_context: [("fake/name".to_string(), req.name.clone())].into(),
            content_source: req.volume_content_source.clone(),
            accessible_topology: vec![super::topology()],
        };
        st.volumes.insert(
            id,
            Vol {
                request: req,
                volume: volume.clone(),
            },
        );
        Ok(CreateVolumeResponse {
            volume: Some(volume),
        })
    }

    async fn delete_volume(
        &self,
        _: &CallContext,
        req: DeleteVolumeRequest,
    ) -> CsiResult<DeleteVolumeResponse> {
        let mut st = self.lock();
        if st.in_use(&req.volume_id) {
            return Err(CsiError::FailedPrecondition(format!(
                "volume {} is in use",
                req.volume_id
            )));
        }
        let removed = st.volumes.remove(&req.volume_id);
        if let Some(v) = removed.filter(|_| self.has(Fault::ListsDeleted)) {
            st.deleted_volumes.push(v.volume);
        }
        Ok(DeleteVolumeResponse {})
    }

    async fn controller_publish_volume(
        &self,
        _: &CallContext,
        req: ControllerPublishVolumeRequest,
    ) -> CsiResult<ControllerPublishVolumeResponse> {
        let mut st = self.lock();
        self.volume(&st, &req.volume_id)?;
        if req.node_id != self.opts.node_id {
            return Err(CsiError::NotFound(format!(
                "node {} does not exist",
                req.node_id
            )));
        }
        let key = (req.volume_id.clone(), req.node_id);
        let args = (req.volume_capability, req.readonly);
        match st.controller_pubs.get(&key) {
            Some(existing) if *existing == args => {}
            Some(_) if self.has(Fault::RepublishIgnoresArguments) => {}
            Some(_) => {
                return Err(CsiError::AlreadyExists(
                    "published to the node with other arguments".into(),
                ));
            }
            None => {
                let attached = st
                    .controller_pubs
                    .keys()
                    .filter(|(_, n)| *n == key.1)
                    .count() as i64;
                if attached >= MAX_VOLUMES_PER_NODE && !self.has(Fault::NoAttachLimit) {
                    return Err(CsiError::ResourceExhausted(format!(
                        "node {} has {MAX_VOLUMES_PER_NODE} volumes attached",
                        key.1
                    )));
                }
                st.controller_pubs.insert(key, args);
            }
        }
        Ok(ControllerPublishVolumeResponse {
            publish_context: [(
                super::PUBLISH_CONTEXT_KEY.to_string(),
                super::device_of(&req.volume_id),
            )]
            .into(),
        })
    }

    async fn controller_unpublish_volume(
        &self,
        _: &CallContext,
        req: ControllerUnpublishVolumeRequest,
    ) -> CsiResult<ControllerUnpublishVolumeResponse> {
        self.lock().controller_pubs.retain(|(v, n), _| {
            !(*v == req.volume_id && (req.node_id.is_empty() || *n == req.node_id))
        });
        Ok(ControllerUnpublishVolumeResponse {})
    }

    async fn validate_volume_capabilities(
        &self,
        _: &CallContext,
        req: ValidateVolumeCapabilitiesRequest,
    ) -> CsiResult<ValidateVolumeCapabilitiesResponse> {
        let st = self.lock();
        let v = self.volume(&st, &req.volume_id)?;
        let block = is_block(&v.request.volume_capabilities);
        if req
            .volume_capabilities
            .iter()
            .any(|c| c.is_block() != block)
        {
            return Ok(not_confirmed("the access type differs from the volume's"));
        }
        Ok(confirmed(req))
    }

    async fn list_volumes(
        &self,
        _: &CallContext,
        req: ListVolumesRequest,
    ) -> CsiResult<ListVolumesResponse> {
        let st = self.lock();
        let volumes = st.volumes.values().map(|v| &v.volume);
        let all: Vec<list_volumes_response::Entry> = volumes
            .chain(&st.deleted_volumes)
            .map(|v| list_volumes_response::Entry {
                volume: Some(v.clone()),
                status: Some(list_volumes_response::VolumeStatus {
                    published_node_ids: st.published_nodes(&v.volume_id),
                    volume_condition: None,
                }),
            })
            .collect();
        let max = self.page_size(req.max_entries);
        let page = paginate(all, max, &req.starting_token)?;
        Ok(ListVolumesResponse {
            entries: page.entries,
            next_token: page.next_token,
        })
    }

    async fn get_capacity(
        &self,
        _: &CallContext,
        _: GetCapacityRequest,
    ) -> CsiResult<GetCapacityResponse> {
        let available = self.opts.total_capacity - self.lock().used();
        Ok(GetCapacityResponse {
            available_capacity: available,
            maximum_volume_size: Some(available),
            minimum_volume_size: None,
        })
    }

    async fn create_snapshot(
        &self,
        _: &CallContext,
        req: CreateSnapshotRequest,
    ) -> CsiResult<CreateSnapshotResponse> {
        self.snapshot_create(req)
    }

    async fn delete_snapshot(
        &self,
        _: &CallContext,
        req: DeleteSnapshotRequest,
    ) -> CsiResult<DeleteSnapshotResponse> {
        self.snapshot_delete(req)
    }

    async fn list_snapshots(
        &self,
        _: &CallContext,
        req: ListSnapshotsRequest,
    ) -> CsiResult<ListSnapshotsResponse> {
        self.snapshot_list(req)
    }

    async fn get_snapshot(
        &self,
        _: &CallContext,
        req: GetSnapshotRequest,
    ) -> CsiResult<GetSnapshotResponse> {
        self.snapshot_get(req)
    }

    async fn controller_expand_volume(
        &self,
        _: &CallContext,
        req: ControllerExpandVolumeRequest,
    ) -> CsiResult<ControllerExpandVolumeResponse> {
        let range = req.capacity_range.unwrap_or_default();
        let mut st = self.lock();
        let v = self.volume_mut(&mut st, &req.volume_id)?;
        if range.limit_bytes > 0 && v.volume.capacity_bytes > range.limit_bytes {
            return Err(CsiError::OutOfRange(
                "the volume is already larger than limit_bytes".into(),
            ));
        }
        v.volume.capacity_bytes = v.volume.capacity_bytes.max(range.required_bytes);
        Ok(ControllerExpandVolumeResponse {
            capacity_bytes: v.volume.capacity_bytes,
            node_expansion_required: !is_block(&v.request.volume_capabilities),
        })
    }

    async fn controller_get_volume(
        &self,
        _: &CallContext,
        req: ControllerGetVolumeRequest,
    ) -> CsiResult<ControllerGetVolumeResponse> {
        let st = self.lock();
        let v = self.volume(&st, &req.volume_id)?;
        Ok(ControllerGetVolumeResponse {
            volume: Some(v.volume.clone()),
            status: Some(controller_get_volume_response::VolumeStatus {
                published_node_ids: st.published_nodes(&req.volume_id),
                volume_condition: None,
            }),
        })
    }

    async fn controller_modify_volume(
        &self,
        _: &CallContext,
        req: ControllerModifyVolumeRequest,
    ) -> CsiResult<ControllerModifyVolumeResponse> {
        // Empty is "modify nothing" (proto3 cannot tell it from absent).
        if req.mutable_parameters.is_empty() && self.has(Fault::RequiresMutableParameters) {
            return Err(CsiError::required("mutable_parameters"));
        }
        // The keys were checked by the server against the declaration.
        let mut st = self.lock();
        let v = self.volume_mut(&mut st, &req.volume_id)?;
        v.request.mutable_parameters.extend(req.mutable_parameters);
        Ok(ControllerModifyVolumeResponse {})
    }
}
