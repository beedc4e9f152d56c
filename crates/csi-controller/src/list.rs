//! The read-only RPCs: ValidateVolumeCapabilities, ListVolumes,
//! ControllerGetVolume and GetCapacity.

use csi_driver::{CallContext, CsiResult};
use csi_proto::v1::*;

use crate::backend::ControllerBackend;
use crate::records::VolumeRecord;
use crate::service::ControllerService;
use crate::wire::{confirmed, page};

impl<B: ControllerBackend> ControllerService<B> {
    pub(crate) async fn validate_rpc(
        &self,
        ctx: &CallContext,
        req: ValidateVolumeCapabilitiesRequest,
    ) -> CsiResult<ValidateVolumeCapabilitiesResponse> {
        let (volume, _) = self.volume_and_nodes(ctx, &req.volume_id).await?;
        let caps = &req.volume_capabilities;
        let message = if let Some(cap) = caps.iter().find(|c| !volume.access.fits(c)) {
            let kind = if cap.is_block() { "block" } else { "mount" };
            Some(format!(
                "volume {} does not support {kind} access",
                volume.id
            ))
        } else {
            let mut checked = self.backend().check_capabilities(caps);
            if checked.is_ok() && !req.mutable_parameters.is_empty() {
                checked = match self.backend().modification() {
                    Some(m) => m
                        .mutable_parameters(&volume.mutable_parameters, &req.mutable_parameters)
                        .map(drop),
                    None => Err(csi_driver::CsiError::invalid(
                        "mutable_parameters",
                        "this plugin has no mutable parameters",
                    )),
                };
            }
            checked.err().map(|e| e.to_string())
        };
        match message {
            Some(message) => Ok(ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message,
            }),
            None => Ok(confirmed(req)),
        }
    }

    pub(crate) async fn list_volumes_rpc(
        &self,
        ctx: &CallContext,
        req: ListVolumesRequest,
    ) -> CsiResult<ListVolumesResponse> {
        if let Some(catalog) = self.catalog() {
            let listed = self
                .deadline(ctx)
                .retry(|| catalog.list_volumes(&req.starting_token, req.max_entries))
                .await?;
            let entries = (listed.entries.into_iter())
                .map(|v| list_volumes_response::Entry {
                    volume: Some(v.record.message()),
                    status: Some(list_volumes_response::VolumeStatus {
                        published_node_ids: v.attached.into_keys().collect(),
                        volume_condition: self.backend().volume_condition(&v.record),
                    }),
                })
                .collect();
            return Ok(ListVolumesResponse {
                entries,
                next_token: listed.next_token,
            });
        }
        let (entries, next_token) = self.local()?.volumes.read(|all| {
            let all: Vec<&VolumeRecord> = all.values().filter(|v| !v.ephemeral).collect();
            page(all, req.max_entries, &req.starting_token, |v| {
                let (published_node_ids, volume_condition) = self.status_of(v);
                list_volumes_response::Entry {
                    volume: Some(v.message()),
                    status: Some(list_volumes_response::VolumeStatus {
                        published_node_ids,
                        volume_condition,
                    }),
                }
            })
        })?;
        Ok(ListVolumesResponse {
            entries,
            next_token,
        })
    }

    pub(crate) async fn get_volume_rpc(
        &self,
        ctx: &CallContext,
        req: ControllerGetVolumeRequest,
    ) -> CsiResult<ControllerGetVolumeResponse> {
        let (volume, published_node_ids) = self.volume_and_nodes(ctx, &req.volume_id).await?;
        Ok(ControllerGetVolumeResponse {
            status: Some(controller_get_volume_response::VolumeStatus {
                published_node_ids,
                volume_condition: self.backend().volume_condition(&volume),
            }),
            volume: Some(volume.message()),
        })
    }

    pub(crate) async fn get_capacity_rpc(
        &self,
        _ctx: &CallContext,
        req: GetCapacityRequest,
    ) -> CsiResult<GetCapacityResponse> {
        let ours = self.segment();
        let c = self.config();
        let elsewhere = c.topology_key.is_some()
            && (req.accessible_topology.as_ref())
                .is_some_and(|t| t.segments.iter().any(|(k, v)| ours.get(k) != Some(v)));
        Ok(GetCapacityResponse {
            available_capacity: if elsewhere {
                0
            } else {
                self.available_capacity()
            },
            maximum_volume_size: (c.max_size > 0).then_some(c.max_size),
            minimum_volume_size: (c.min_size > 0).then_some(c.min_size),
        })
    }
}
