//! DeleteVolume: refused while attached or in use; the record goes before
//! the data (a crash between leaves data the startup sweep removes).

use csi_driver::{CallContext, CsiError, CsiResult};
use csi_proto::v1::*;

use crate::backend::ControllerBackend;
use crate::create_volume::no_catalog;
use crate::ids::IdKind;
use crate::service::ControllerService;
use crate::state::Res;

impl<B: ControllerBackend> ControllerService<B> {
    pub(crate) async fn delete_volume_rpc(
        &self,
        ctx: &CallContext,
        req: DeleteVolumeRequest,
    ) -> CsiResult<DeleteVolumeResponse> {
        let local = self.catalog().is_none();
        if local && !IdKind::Volume.is_valid(&req.volume_id) {
            return Ok(DeleteVolumeResponse {});
        }
        let claim = self
            .in_flight()
            .claim("DeleteVolume", &[(Res::Volume, &req.volume_id)])?;
        let (this, deadline) = (self.clone(), self.deadline(ctx));
        self.run(claim, async move {
            let id = &req.volume_id;
            if local {
                return this.remove_volume(id).await;
            }
            let catalog = this.catalog().ok_or_else(no_catalog)?;
            if let Some(found) = deadline.retry(|| catalog.volume(id)).await? {
                if let Some(node) = found.attached.keys().next() {
                    return Err(busy(id, format!("is attached to node {node}")));
                }
                if let Some(why) = this.backend().in_use(id) {
                    return Err(busy(id, why));
                }
                deadline.retry(|| this.backend().delete_volume(id)).await?;
                tracing::info!(volume = %id, "deleted volume");
            }
            Ok(())
        })
        .await?;
        Ok(DeleteVolumeResponse {})
    }

    /// DeleteVolume's work on local data, under the volume's claim: the
    /// record goes first (refused while the volume is in use), then the
    /// data. With no record, data an unacknowledged create or a half-done
    /// delete left is removed.
    async fn remove_volume(&self, id: &str) -> CsiResult<()> {
        let t = self.local()?;
        let removed = t.volumes.update(id, |slot| {
            if slot.is_none() {
                return Ok(None);
            }
            if let Some(node) = t.attached_nodes(id).first() {
                return Err(busy(id, format!("is attached to node {node}")));
            }
            if let Some(why) = self.backend().in_use(id) {
                return Err(busy(id, why));
            }
            if self.config().keep_snapshot_sources
                && t.snapshots
                    .read(|all| all.values().any(|s| s.source_volume_id == id))
            {
                return Err(busy(id, "has snapshots; delete them first".into()));
            }
            Ok(slot.take())
        })?;
        match removed {
            Some(v) => {
                self.ledger().release(v.capacity_bytes);
                self.backend().delete_volume(id).await?;
                tracing::info!(volume = %id, "deleted volume");
            }
            None => {
                if self.backend().delete_volume(id).await? {
                    tracing::warn!(volume = %id, "removed data of a volume with no record");
                }
            }
        }
        Ok(())
    }
}

fn busy(id: &str, why: String) -> CsiError {
    CsiError::FailedPrecondition(format!("volume {id} {why}"))
}
