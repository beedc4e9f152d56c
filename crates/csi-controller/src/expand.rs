//! ControllerExpandVolume: growth reserved against capacity, then made
//! by the backend, then recorded.

use csi_driver::{CallContext, CsiError, CsiResult};
use csi_proto::v1::*;

use crate::backend::ControllerBackend;
use crate::create_volume::no_catalog;
use crate::service::ControllerService;
use crate::state::Res;

impl<B: ControllerBackend> ControllerService<B> {
    pub(crate) async fn controller_expand_rpc(
        &self,
        ctx: &CallContext,
        req: ControllerExpandVolumeRequest,
    ) -> CsiResult<ControllerExpandVolumeResponse> {
        let expander = (self.backend().expansion())
            .ok_or_else(|| CsiError::unimplemented("ControllerExpandVolume"))?;
        let claim = self
            .in_flight()
            .claim("ControllerExpandVolume", &[(Res::Volume, &req.volume_id)])?;
        let (volume, _) = self.volume_and_nodes(ctx, &req.volume_id).await?;
        let size = self.volume_size(req.capacity_range.as_ref(), volume.access)?;
        let node_expansion_required = expander.node_expansion_required(volume.access);
        if size <= volume.capacity_bytes {
            return Ok(ControllerExpandVolumeResponse {
                capacity_bytes: volume.capacity_bytes,
                node_expansion_required,
            });
        }
        let local = self.catalog().is_none();
        let reservation = match local {
            true => Some(self.reserve(
                size - volume.capacity_bytes,
                &format!("to grow to {}", csi_proto::size::format_bytes(size)),
            )?),
            false => None,
        };
        let (this, deadline) = (self.clone(), self.deadline(ctx));
        self.run(claim, async move {
            let expander = (this.backend().expansion()).ok_or_else(no_catalog)?;
            deadline
                .retry(|| expander.expand_volume(&volume, size))
                .await?;
            if local {
                this.local()?.volumes.update(&volume.id, |slot| {
                    if let Some(v) = slot {
                        v.capacity_bytes = size;
                    }
                    Ok(())
                })?;
            }
            if let Some(r) = reservation {
                r.keep();
            }
            tracing::info!(volume = %volume.id, size, "grew volume");
            Ok(())
        })
        .await?;
        Ok(ControllerExpandVolumeResponse {
            capacity_bytes: size,
            node_expansion_required,
        })
    }
}
