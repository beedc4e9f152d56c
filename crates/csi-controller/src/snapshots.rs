//! CreateSnapshot, DeleteSnapshot, ListSnapshots and GetSnapshot, over
//! local records or the provider's catalog.

use csi_driver::helpers::idempotency::compare_snapshot;
use csi_driver::{CallContext, CsiError, CsiResult};
use csi_proto::v1::*;

use crate::backend::{ControllerBackend, ProviderSnapshot, SnapshotBackend};
use crate::create_volume::no_catalog;
use crate::ids::IdKind;
use crate::records::SnapshotRecord;
use crate::service::{ControllerService, not_found};
use crate::state::Res;
use crate::wire::{now_nanos, page, sorted, to_map};

impl<B: ControllerBackend> ControllerService<B> {
    fn snapshotter(&self, rpc: &str) -> CsiResult<&dyn SnapshotBackend> {
        self.backend()
            .snapshots()
            .ok_or_else(|| CsiError::unimplemented(rpc))
    }

    pub(crate) async fn create_snapshot_rpc(
        &self,
        ctx: &CallContext,
        req: CreateSnapshotRequest,
    ) -> CsiResult<CreateSnapshotResponse> {
        self.snapshotter("CreateSnapshot")?;
        let mut claim = self
            .in_flight()
            .claim("CreateSnapshot", &[(Res::SnapshotName, &req.name)])?;
        if self.catalog().is_some() {
            let (this, deadline) = (self.clone(), self.deadline(ctx));
            return self
                .run(claim, async move {
                    let catalog = this.catalog().ok_or_else(no_catalog)?;
                    let snapshotter = this.snapshotter("CreateSnapshot")?;
                    let found = deadline.retry(|| catalog.snapshot_by_name(&req.name)).await?;
                    let found = match found {
                        Some(found) => found,
                        None => {
                            let id = &req.source_volume_id;
                            let volume = deadline.retry(|| catalog.volume(id)).await?;
                            let volume = volume.ok_or_else(|| not_found("volume", id))?.record;
                            let plan = new_snapshot(&req, volume.capacity_bytes, volume.access);
                            let made = deadline
                                .retry(|| async {
                                    if let Some(s) = catalog.snapshot_by_name(&req.name).await? {
                                        return Ok(s);
                                    }
                                    let mut made = plan.clone();
                                    snapshotter.create_snapshot(&mut made).await?;
                                    let ready = catalog.snapshot(&made.id).await?.is_some_and(|s| s.ready);
                                    Ok(ProviderSnapshot { record: made, ready })
                                })
                                .await?;
                            tracing::info!(snapshot = %made.record.id, volume = %id, "created snapshot");
                            made
                        }
                    };
                    let snapshot = provider_message(&found);
                    compare_snapshot(&snapshot, &to_map(&found.record.parameters), &req)?;
                    Ok(CreateSnapshotResponse {
                        snapshot: Some(snapshot),
                    })
                })
                .await;
        }
        let t = self.local()?;
        if let Some(existing) = t.snapshots.by_name(&req.name) {
            let snapshot = existing.message();
            compare_snapshot(&snapshot, &to_map(&existing.parameters), &req)?;
            return Ok(CreateSnapshotResponse {
                snapshot: Some(snapshot),
            });
        }
        // The source stays while it is copied: DeleteVolume of it is ABORTED.
        claim.also(&[(Res::Volume, &req.source_volume_id)])?;
        let volume = self.known_volume(&req.source_volume_id)?;
        let record = new_snapshot(&req, volume.capacity_bytes, volume.access);
        claim.also(&[(Res::Snapshot, &record.id)])?;
        let (this, mut saved) = (self.clone(), record.clone());
        self.run(claim, async move {
            let snapshotter = this.snapshotter("CreateSnapshot")?;
            snapshotter.create_snapshot(&mut saved).await?;
            if let Err(e) = this.local()?.snapshots.put(&saved.id, saved.clone()) {
                let _ = snapshotter.delete_snapshot(&saved.id).await;
                return Err(e.into());
            }
            Ok(())
        })
        .await?;
        tracing::info!(snapshot = %record.id, volume = %volume.id, "created snapshot");
        Ok(CreateSnapshotResponse {
            snapshot: Some(record.message()),
        })
    }

    pub(crate) async fn delete_snapshot_rpc(
        &self,
        ctx: &CallContext,
        req: DeleteSnapshotRequest,
    ) -> CsiResult<DeleteSnapshotResponse> {
        self.snapshotter("DeleteSnapshot")?;
        let local = self.catalog().is_none();
        if local && !IdKind::Snapshot.is_valid(&req.snapshot_id) {
            return Ok(DeleteSnapshotResponse {});
        }
        // ABORTED while a volume is being restored from it.
        let claim = self
            .in_flight()
            .claim("DeleteSnapshot", &[(Res::Snapshot, &req.snapshot_id)])?;
        let (this, id, deadline) = (self.clone(), req.snapshot_id, self.deadline(ctx));
        self.run(claim, async move {
            let snapshotter = this.snapshotter("DeleteSnapshot")?;
            if local {
                this.local()?.snapshots.update(&id, |slot| match slot {
                    Some(s) if s.group_snapshot_id.is_some() => Err(CsiError::invalid(
                        "snapshot_id",
                        format!(
                            "snapshot {id} belongs to a group snapshot; delete the group instead"
                        ),
                    )),
                    _ => Ok(slot.take()),
                })?;
            }
            // With or without a record: data left by a crash goes too.
            deadline
                .retry(|| snapshotter.delete_snapshot(&id))
                .await
                .map(drop)
                .map_err(CsiError::from)
        })
        .await?;
        Ok(DeleteSnapshotResponse {})
    }

    pub(crate) async fn list_snapshots_rpc(
        &self,
        ctx: &CallContext,
        req: ListSnapshotsRequest,
    ) -> CsiResult<ListSnapshotsResponse> {
        self.snapshotter("ListSnapshots")?;
        if let Some(catalog) = self.catalog() {
            let deadline = self.deadline(ctx);
            if !req.snapshot_id.is_empty() {
                let found = deadline
                    .retry(|| catalog.snapshot(&req.snapshot_id))
                    .await?;
                let entries = found
                    .filter(|s| {
                        req.source_volume_id.is_empty()
                            || s.record.source_volume_id == req.source_volume_id
                    })
                    .map(|s| list_snapshots_response::Entry {
                        snapshot: Some(provider_message(&s)),
                    })
                    .into_iter()
                    .collect();
                return Ok(ListSnapshotsResponse {
                    entries,
                    next_token: String::new(),
                });
            }
            let listed = deadline
                .retry(|| {
                    catalog.list_snapshots(
                        &req.source_volume_id,
                        &req.starting_token,
                        req.max_entries,
                    )
                })
                .await?;
            return Ok(ListSnapshotsResponse {
                entries: (listed.entries.iter())
                    .map(|s| list_snapshots_response::Entry {
                        snapshot: Some(provider_message(s)),
                    })
                    .collect(),
                next_token: listed.next_token,
            });
        }
        let (entries, next_token) = self.local()?.snapshots.read(|all| {
            let all: Vec<&SnapshotRecord> = all
                .values()
                .filter(|s| req.snapshot_id.is_empty() || s.id == req.snapshot_id)
                .filter(|s| {
                    req.source_volume_id.is_empty() || s.source_volume_id == req.source_volume_id
                })
                .collect();
            page(all, req.max_entries, &req.starting_token, |s| {
                list_snapshots_response::Entry {
                    snapshot: Some(s.message()),
                }
            })
        })?;
        Ok(ListSnapshotsResponse {
            entries,
            next_token,
        })
    }

    pub(crate) async fn get_snapshot_rpc(
        &self,
        ctx: &CallContext,
        req: GetSnapshotRequest,
    ) -> CsiResult<GetSnapshotResponse> {
        self.snapshotter("GetSnapshot")?;
        let snapshot = match self.catalog() {
            Some(catalog) => {
                let id = &req.snapshot_id;
                let found = self.deadline(ctx).retry(|| catalog.snapshot(id)).await?;
                provider_message(&found.ok_or_else(|| not_found("snapshot", id))?)
            }
            None => self.known_snapshot(&req.snapshot_id)?.message(),
        };
        Ok(GetSnapshotResponse {
            snapshot: Some(snapshot),
        })
    }
}

fn new_snapshot(req: &CreateSnapshotRequest, size: i64, access: crate::Access) -> SnapshotRecord {
    SnapshotRecord {
        id: IdKind::Snapshot.generate(),
        name: req.name.clone(),
        source_volume_id: req.source_volume_id.clone(),
        size_bytes: size,
        access,
        created_unix_nanos: now_nanos(),
        group_snapshot_id: None,
        parameters: sorted(&req.parameters),
    }
}

fn provider_message(s: &ProviderSnapshot) -> Snapshot {
    Snapshot {
        ready_to_use: s.ready,
        ..s.record.message()
    }
}
