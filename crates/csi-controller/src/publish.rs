//! ControllerPublish/Unpublish: the spec's repeat rules and the attach
//! limit, then the backend's attach (whose in-flight action a retry finds
//! and polls, never starting a second one) and its publish context.

use std::collections::HashMap;

use csi_driver::{CallContext, CsiError, CsiResult};
use csi_proto::v1::*;

use crate::backend::{AttachBackend, AttachState, ControllerBackend, ProviderVolume};
use crate::ids::IdKind;
use crate::records::VolumeRecord;
use crate::retry::Deadline;
use crate::service::{ControllerService, not_found};

impl<B: ControllerBackend> ControllerService<B> {
    pub(crate) async fn controller_publish_rpc(
        &self,
        ctx: &CallContext,
        req: ControllerPublishVolumeRequest,
    ) -> CsiResult<ControllerPublishVolumeResponse> {
        let attacher = self
            .backend()
            .attacher()
            .ok_or_else(|| CsiError::unimplemented("ControllerPublishVolume"))?;
        let cap = req.volume_capability.clone().unwrap_or_default();
        let multi_node = cap.access_mode().is_multi_node();
        let deadline = self.deadline(ctx);
        let mut recorded_now = false;
        let (volume, read) = match self.catalog() {
            None => {
                let volume = self.known_volume(&req.volume_id)?;
                if req.node_id != self.config().node_id {
                    return Err(not_found("node", &req.node_id));
                }
                check_access(&volume, &cap)?;
                let limit = self.config().attach_limit;
                let nodes = self
                    .local()?
                    .attachments
                    .get(&volume.id)
                    .unwrap_or_default();
                recorded_now = !nodes.contains_key(&req.node_id);
                let (id, node, readonly) = (volume.id.clone(), req.node_id.clone(), req.readonly);
                self.off_runtime(move |t| t.attach(&id, &node, readonly, multi_node, limit))
                    .await?;
                (volume, None)
            }
            Some(catalog) => {
                let found = (self.provider_volume(catalog, &deadline, &req.volume_id)).await?;
                check_access(&found.record, &cap)?;
                let id = &found.record.id;
                match found.attached.get(&req.node_id) {
                    Some(was) if *was != req.readonly => {
                        return Err(CsiError::AlreadyExists(format!(
                            "volume {id} is published to {} with readonly={was}",
                            req.node_id
                        )));
                    }
                    Some(_) => {}
                    None => {
                        if let Some(other) = found.attached.keys().next().filter(|_| !multi_node) {
                            return Err(CsiError::FailedPrecondition(format!(
                                "volume {id} is published to node {other}"
                            )));
                        }
                    }
                }
                (found.record.clone(), Some(found))
            }
        };
        let publish_context = attach(attacher, &deadline, &volume, read.as_ref(), &req).await;
        if publish_context.is_err() && recorded_now {
            // Local bookkeeping follows the backend: undo this call's record.
            let (id, node) = (volume.id.clone(), req.node_id.clone());
            self.off_runtime(move |t| t.detach(&id, &node)).await?;
        }
        Ok(ControllerPublishVolumeResponse {
            publish_context: publish_context?,
        })
    }

    pub(crate) async fn controller_unpublish_rpc(
        &self,
        ctx: &CallContext,
        req: ControllerUnpublishVolumeRequest,
    ) -> CsiResult<ControllerUnpublishVolumeResponse> {
        let attacher = self
            .backend()
            .attacher()
            .ok_or_else(|| CsiError::unimplemented("ControllerUnpublishVolume"))?;
        // A missing volume or node counts as unpublished (the spec's SHOULD).
        let local = self.catalog().is_none();
        if local && !IdKind::Volume.is_valid(&req.volume_id) {
            return Ok(ControllerUnpublishVolumeResponse {});
        }
        let deadline = self.deadline(ctx);
        deadline
            .retry(|| attacher.detach(&req.volume_id, &req.node_id))
            .await?;
        if local {
            let (id, node) = (req.volume_id.clone(), req.node_id.clone());
            self.off_runtime(move |t| t.detach(&id, &node)).await?;
        }
        Ok(ControllerUnpublishVolumeResponse {})
    }
}

fn check_access(volume: &VolumeRecord, cap: &VolumeCapability) -> CsiResult<()> {
    if !volume.access.fits(cap) {
        return Err(CsiError::invalid(
            "volume_capability",
            format!("volume {} was not created for this access type", volume.id),
        ));
    }
    Ok(())
}

/// The attachment of `volume` to the request's node, started only if the
/// backend knows of none, and polled until attached. `read`: the volume as
/// the provider reported it just before (its first lookup need not read it
/// again; a retry of the lookup does).
async fn attach(
    attacher: &dyn AttachBackend,
    deadline: &Deadline,
    volume: &VolumeRecord,
    read: Option<&ProviderVolume>,
    req: &ControllerPublishVolumeRequest,
) -> CsiResult<HashMap<String, String>> {
    let node = &req.node_id;
    let mut read = read;
    let mut state = deadline
        .retry(|| match read.take() {
            Some(v) => attacher.attachment_of(v, node),
            None => attacher.attachment(&volume.id, node),
        })
        .await?;
    if state.is_none() {
        let mut retried = false;
        state = Some(
            deadline
                .retry(|| {
                    // A transient failure may have started the attach; the
                    // first attempt follows the lookup above.
                    let look = std::mem::replace(&mut retried, true);
                    async move {
                        if look && let Some(s) = attacher.attachment(&volume.id, node).await? {
                            return Ok(s);
                        }
                        attacher.attach(volume, node, req.readonly).await
                    }
                })
                .await?,
        );
    }
    if let Some(AttachState::Attached(context)) = state {
        return Ok(context);
    }
    let what = format!("the attach of volume {} to node {node}", volume.id);
    deadline
        .wait_until_ready(&what, || async {
            match attacher.attachment(&volume.id, node).await? {
                Some(AttachState::Attached(context)) => Ok(Some(context)),
                Some(AttachState::Attaching) => Ok(None),
                None => Err(CsiError::Aborted(format!(
                    "{what} was dropped by the provider; retry"
                ))
                .into()),
            }
        })
        .await
}
