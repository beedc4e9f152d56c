//! ControllerModifyVolume (local data): new mutable parameters applied by
//! the backend, then recorded.

use csi_driver::{CallContext, CsiError, CsiResult};
use csi_proto::v1::*;

use crate::backend::ControllerBackend;
use crate::service::{ControllerService, not_found};
use crate::state::Res;

impl<B: ControllerBackend> ControllerService<B> {
    pub(crate) async fn controller_modify_rpc(
        &self,
        _ctx: &CallContext,
        req: ControllerModifyVolumeRequest,
    ) -> CsiResult<ControllerModifyVolumeResponse> {
        let modifier = (self.backend().modification())
            .filter(|_| self.catalog().is_none())
            .ok_or_else(|| CsiError::unimplemented("ControllerModifyVolume"))?;
        let claim = self
            .in_flight()
            .claim("ControllerModifyVolume", &[(Res::Volume, &req.volume_id)])?;
        let volume = self.known_volume(&req.volume_id)?;
        let new =
            modifier.mutable_parameters(&volume.mutable_parameters, &req.mutable_parameters)?;
        if new == volume.mutable_parameters {
            return Ok(ControllerModifyVolumeResponse {});
        }
        let this = self.clone();
        self.run(claim, async move {
            let modifier = (this.backend().modification())
                .ok_or_else(|| CsiError::unimplemented("ControllerModifyVolume"))?;
            modifier.modify_volume(&volume, &new).await?;
            this.local()?.volumes.update(&volume.id, |slot| {
                let v = slot
                    .as_mut()
                    .ok_or_else(|| not_found("volume", &volume.id))?;
                v.mutable_parameters = new.clone();
                Ok(())
            })?;
            tracing::info!(volume = %volume.id, parameters = ?new, "modified volume");
            Ok(())
        })
        .await?;
        Ok(ControllerModifyVolumeResponse {})
    }
}
