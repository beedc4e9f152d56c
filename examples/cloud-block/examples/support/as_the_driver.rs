//! The provider requests cloud-block's controller makes to attach a volume,
//! shared by the bench's direct path and the floor driver, which both make
//! them as the driver does.

use std::time::Duration;

use cloud_block::api::{self, ActionKind, ActionStatus, PageRequest, VolumeFilter};
use cloud_block::client::{ProviderClient, ProviderError};

/// Creates the volume `req` asks for with the driver's requests: a lookup
/// by name (in `req`'s region) first, and the create only if it finds none.
pub async fn create(
    provider: &dyn ProviderClient,
    req: &api::CreateVolumeRequest,
) -> Result<api::Volume, ProviderError> {
    let filter = VolumeFilter {
        name: Some(req.name.clone()),
        region: req.region.clone(),
    };
    let found = provider
        .list_volumes(&filter, PageRequest::default())
        .await?;
    match found.items.into_iter().next() {
        Some(volume) => Ok(volume),
        None => provider.create_volume(req).await,
    }
}

/// Whether `volume` is attached to `node`, asked as the driver asks: its
/// actions first, then the volume (unless `read`, the volume read just
/// before). `None` while an attach runs.
pub async fn attachment(
    provider: &dyn ProviderClient,
    volume: &str,
    node: &str,
    read: Option<&api::Volume>,
) -> Result<Option<bool>, ProviderError> {
    let actions = provider
        .list_volume_actions(volume, PageRequest::default())
        .await?;
    let running = actions.items.iter().any(|a| {
        (a.kind, a.status) == (ActionKind::Attach, ActionStatus::InProgress)
            && a.node_id.as_deref() == Some(node)
    });
    if running {
        return Ok(None);
    }
    let attached = |v: &api::Volume| v.node_ids.iter().any(|n| n == node);
    Ok(Some(match read {
        Some(v) => attached(v),
        None => attached(&provider.get_volume(volume).await?),
    }))
}

/// Attaches `volume` to `node` with the driver's requests: the volume
/// read, the attachment looked up (its actions: the volume was just read),
/// the attach unless it is there, then the lookup polled with the driver's
/// backoff (from `initial`, doubling up to `max`).
pub async fn attach(
    provider: &dyn ProviderClient,
    volume: &str,
    node: &str,
    (initial, max): (Duration, Duration),
) -> Result<(), ProviderError> {
    let read = provider.get_volume(volume).await?;
    if attachment(provider, volume, node, Some(&read)).await? == Some(true) {
        return Ok(());
    }
    if provider.attach(volume, node).await?.status == ActionStatus::InProgress {
        let mut backoff = initial;
        while attachment(provider, volume, node, None).await? != Some(true) {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(max);
        }
    }
    Ok(())
}

/// Polls action `id` every millisecond until it is no longer in progress,
/// and returns it as it ended (teardown, never timed).
pub async fn until_done(
    provider: &dyn ProviderClient,
    id: u64,
) -> Result<api::Action, ProviderError> {
    loop {
        let action = provider.get_action(id).await?;
        if action.status != ActionStatus::InProgress {
            return Ok(action);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
