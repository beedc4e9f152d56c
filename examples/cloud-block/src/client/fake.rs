//! [`FakeProvider`]: the provider's rules in memory, for unit tests of code
//! above [`ProviderClient`]. It runs the same [`Cloud`] the provider process
//! runs, so its answers (conflicts, not-found, paging) are the real ones; it
//! records every call and can fail the next ones or hold actions in progress.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use std::time::SystemTime;

use async_trait::async_trait;

use super::http::{check_id, error_of};
use super::{ProviderClient, ProviderError};
use crate::api::{
    Action, ActionKind, ActionRequest, CreateSnapshotRequest, CreateVolumeRequest, Page,
    PageRequest, Region, Snapshot, SnapshotFilter, Volume, VolumeFilter, rfc3339,
};
use crate::cloud::{ApiError, Cloud, Limits};

/// One call the fake received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeCall {
    /// The [`ProviderClient`] method, for example `create_volume`.
    pub method: &'static str,
    /// What it was about: a name or an id (empty for lists).
    pub target: String,
}

#[derive(Default)]
struct Inner {
    cloud: Cloud,
    calls: Vec<FakeCall>,
    failures: VecDeque<ProviderError>,
    hold_actions: bool,
}

/// An in-memory [`ProviderClient`]. Actions complete as they start unless
/// [`hold_actions`](FakeProvider::hold_actions) keeps them in progress.
#[derive(Default)]
pub struct FakeProvider {
    limits: Limits,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for FakeProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeProvider")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

fn to_error(e: ApiError) -> ProviderError {
    error_of("fake", e.status, None, Some(e.body))
}

fn now() -> String {
    rfc3339(SystemTime::now())
}

impl FakeProvider {
    /// A provider with the default region (`dev-1`) and limits.
    pub fn new() -> Self {
        Self::default()
    }

    /// A provider with these regions and limits.
    pub fn with_limits(limits: Limits) -> Self {
        FakeProvider {
            limits,
            inner: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A test that panicked while holding the lock left consistent data.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the call and answers with the next queued failure, if any.
    fn enter(
        &self,
        method: &'static str,
        target: &str,
    ) -> Result<MutexGuard<'_, Inner>, ProviderError> {
        let mut inner = self.lock();
        inner.calls.push(FakeCall {
            method,
            target: target.to_owned(),
        });
        match inner.failures.pop_front() {
            Some(e) => Err(e),
            None => Ok(inner),
        }
    }

    /// Makes the next calls fail with these errors, in order (then succeed).
    pub fn fail_next(&self, errors: impl IntoIterator<Item = ProviderError>) {
        self.lock().failures.extend(errors);
    }

    /// Every call so far, oldest first.
    pub fn calls(&self) -> Vec<FakeCall> {
        self.lock().calls.clone()
    }

    /// How many calls of `method` were made.
    pub fn count(&self, method: &str) -> usize {
        self.lock()
            .calls
            .iter()
            .filter(|c| c.method == method)
            .count()
    }

    /// Keeps actions started from now on in progress until
    /// [`finish_actions`](Self::finish_actions).
    pub fn hold_actions(&self, hold: bool) {
        self.lock().hold_actions = hold;
    }

    /// Completes (`Ok`) or errs every held action; returns them.
    pub fn finish_actions(&self, outcome: Result<(), String>) -> Vec<Action> {
        let mut inner = self.lock();
        let now = now();
        inner
            .cloud
            .running()
            .into_iter()
            .filter_map(|a| inner.cloud.finish_action(a.id, outcome.clone(), &now))
            .collect()
    }

    /// A copy of everything the fake holds, to assert on.
    pub fn cloud(&self) -> Cloud {
        self.lock().cloud.clone()
    }

    fn action(
        &self,
        method: &'static str,
        volume_id: &str,
        req: ActionRequest,
    ) -> Result<Action, ProviderError> {
        let mut inner = self.enter(method, volume_id)?;
        check_id("volume", volume_id)?;
        let now = now();
        let action = inner
            .cloud
            .start_action(&self.limits, volume_id, &req, &now)
            .map_err(to_error)?;
        if inner.hold_actions {
            return Ok(action);
        }
        Ok(inner
            .cloud
            .finish_action(action.id, Ok(()), &now)
            .unwrap_or(action))
    }
}

#[async_trait]
impl ProviderClient for FakeProvider {
    async fn list_regions(&self) -> Result<Vec<Region>, ProviderError> {
        drop(self.enter("list_regions", "")?);
        Ok(self.limits.region_list())
    }

    async fn create_volume(&self, req: &CreateVolumeRequest) -> Result<Volume, ProviderError> {
        let mut inner = self.enter("create_volume", &req.name)?;
        let id = uuid::Uuid::new_v4().to_string();
        inner
            .cloud
            .create_volume(&self.limits, req, id, &now())
            .map_err(to_error)
    }

    async fn get_volume(&self, id: &str) -> Result<Volume, ProviderError> {
        let inner = self.enter("get_volume", id)?;
        check_id("volume", id)?;
        inner.cloud.volume(id).cloned().map_err(to_error)
    }

    async fn list_volumes(
        &self,
        filter: &VolumeFilter,
        page: PageRequest,
    ) -> Result<Page<Volume>, ProviderError> {
        let inner = self.enter("list_volumes", filter.name.as_deref().unwrap_or(""))?;
        let (items, next_page, total) = inner.cloud.list_volumes(filter, page);
        Ok(Page {
            items,
            next_page,
            total,
        })
    }

    async fn delete_volume(&self, id: &str) -> Result<(), ProviderError> {
        let mut inner = self.enter("delete_volume", id)?;
        check_id("volume", id)?;
        inner.cloud.delete_volume(id).map(drop).map_err(to_error)
    }

    async fn attach(&self, volume_id: &str, node_id: &str) -> Result<Action, ProviderError> {
        let req = ActionRequest {
            kind: ActionKind::Attach,
            node_id: Some(node_id.to_owned()),
            size_gigabytes: None,
        };
        self.action("attach", volume_id, req)
    }

    async fn detach(&self, volume_id: &str, node_id: &str) -> Result<Action, ProviderError> {
        let req = ActionRequest {
            kind: ActionKind::Detach,
            node_id: Some(node_id.to_owned()),
            size_gigabytes: None,
        };
        self.action("detach", volume_id, req)
    }

    async fn resize(&self, volume_id: &str, size_gigabytes: u64) -> Result<Action, ProviderError> {
        let req = ActionRequest {
            kind: ActionKind::Resize,
            node_id: None,
            size_gigabytes: Some(size_gigabytes),
        };
        self.action("resize", volume_id, req)
    }

    async fn get_action(&self, id: u64) -> Result<Action, ProviderError> {
        let inner = self.enter("get_action", &id.to_string())?;
        inner.cloud.action(id).cloned().map_err(to_error)
    }

    async fn list_volume_actions(
        &self,
        volume_id: &str,
        page: PageRequest,
    ) -> Result<Page<Action>, ProviderError> {
        let inner = self.enter("list_volume_actions", volume_id)?;
        check_id("volume", volume_id)?;
        let (items, next_page, total) = inner
            .cloud
            .list_actions(volume_id, page)
            .map_err(to_error)?;
        Ok(Page {
            items,
            next_page,
            total,
        })
    }

    async fn create_snapshot(
        &self,
        volume_id: &str,
        req: &CreateSnapshotRequest,
    ) -> Result<Snapshot, ProviderError> {
        let mut inner = self.enter("create_snapshot", &req.name)?;
        check_id("volume", volume_id)?;
        let id = uuid::Uuid::new_v4().to_string();
        inner
            .cloud
            .create_snapshot(volume_id, req, id, &now())
            .map_err(to_error)
    }

    async fn get_snapshot(&self, id: &str) -> Result<Snapshot, ProviderError> {
        let inner = self.enter("get_snapshot", id)?;
        check_id("snapshot", id)?;
        inner.cloud.snapshot(id).cloned().map_err(to_error)
    }

    async fn list_snapshots(
        &self,
        filter: &SnapshotFilter,
        page: PageRequest,
    ) -> Result<Page<Snapshot>, ProviderError> {
        let inner = self.enter("list_snapshots", filter.name.as_deref().unwrap_or(""))?;
        let (items, next_page, total) = inner.cloud.list_snapshots(filter, page);
        Ok(Page {
            items,
            next_page,
            total,
        })
    }

    async fn delete_snapshot(&self, id: &str) -> Result<(), ProviderError> {
        let mut inner = self.enter("delete_snapshot", id)?;
        check_id("snapshot", id)?;
        inner.cloud.delete_snapshot(id).map(drop).map_err(to_error)
    }
}
