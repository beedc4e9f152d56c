//! What the driver calls: [`ProviderClient`], one async method per provider
//! call, with [`HttpProvider`] over the network and (feature `testing`)
//! `FakeProvider` in memory and `SimProvider` in csi-sim's world beside it.
//!
//! Every failure is a [`ProviderError`] that says what the caller has to
//! decide: retry later ([`is_transient`](ProviderError::is_transient), with
//! [`retry_after`](ProviderError::retry_after)), the thing is gone, a
//! [`Conflict`](ProviderError::Conflict) of a known [`ConflictKind`], bad
//! credentials, a bad request, or an answer that made no sense.

use std::time::Duration;

use async_trait::async_trait;

use crate::api::{
    Action, CreateSnapshotRequest, CreateVolumeRequest, Page, PageRequest, Region, Snapshot,
    SnapshotFilter, Volume, VolumeFilter,
};

mod backend_error;
#[cfg(feature = "testing")]
mod fake;
mod http;
#[cfg(feature = "testing")]
mod sim;
mod window;

pub use backend_error::{found, running, taken_is_transient};
#[cfg(feature = "testing")]
pub use fake::{FakeCall, FakeProvider};
pub use http::HttpProvider;
#[cfg(feature = "testing")]
pub use sim::{SIM_ACTION_CALLS, SIM_RETRY_AFTER, SIM_TIMEOUT, SimProvider};
pub use window::{page, read_window};

/// Which rule of the provider a request ran into.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConflictKind {
    /// The name is taken (CreateVolume/CreateSnapshot: look the name up).
    NameTaken,
    /// The volume is attached, or being attached, to another node.
    AttachedElsewhere {
        /// That node, when the provider said.
        node_id: Option<String>,
    },
    /// The volume is already attached to the node asked for.
    AlreadyAttached,
    /// The volume is not attached to the node a detach named.
    NotAttached,
    /// Another action on the volume has not ended: poll it.
    ActionInProgress {
        /// That action, when the provider said.
        action_id: Option<u64>,
    },
    /// A delete of a volume that is still attached.
    VolumeAttached,
    /// The node has as many volumes attached as it may.
    AttachLimit,
    /// A conflict this client does not know (the provider's error id).
    Other(String),
}

impl std::fmt::Display for ConflictKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConflictKind::NameTaken => f.write_str("name taken"),
            ConflictKind::AttachedElsewhere { .. } => f.write_str("attached elsewhere"),
            ConflictKind::AlreadyAttached => f.write_str("already attached"),
            ConflictKind::NotAttached => f.write_str("not attached"),
            ConflictKind::ActionInProgress { .. } => f.write_str("action in progress"),
            ConflictKind::VolumeAttached => f.write_str("volume attached"),
            ConflictKind::AttachLimit => f.write_str("attach limit"),
            ConflictKind::Other(id) => write!(f, "{id}"),
        }
    }
}

/// A provider call that did not succeed. Never holds the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProviderError {
    /// 429: retry after the time the provider asked for (transient).
    #[error("provider rate limit hit (HTTP 429){}: {message}", after(.retry_after))]
    RateLimited {
        /// The `Retry-After` the provider sent.
        retry_after: Option<Duration>,
        /// The provider's message.
        message: String,
    },
    /// A 5xx answer (transient).
    #[error("provider unavailable (HTTP {status}): {message}")]
    Unavailable {
        /// The status.
        status: u16,
        /// The provider's message.
        message: String,
    },
    /// No answer within the client's timeout (transient; the call may have
    /// taken effect).
    #[error("provider call {request} timed out after {after:?}")]
    Timeout {
        /// Method and path.
        request: String,
        /// The timeout.
        after: Duration,
    },
    /// The connection was refused or broke (transient).
    #[error("cannot reach the provider for {request}: {reason}")]
    Connection {
        /// Method and path.
        request: String,
        /// What the transport said.
        reason: String,
    },
    /// 404: no such volume, snapshot or action.
    #[error("not found: {message}")]
    NotFound {
        /// The provider's message.
        message: String,
    },
    /// The request broke one of the provider's rules.
    #[error("conflict ({kind}): {message}")]
    Conflict {
        /// Which rule.
        kind: ConflictKind,
        /// The provider's message.
        message: String,
    },
    /// 401 or 403: the token is missing, wrong or not allowed.
    #[error("provider refused the credentials (HTTP {status}): {message}")]
    Unauthorized {
        /// 401 or 403.
        status: u16,
        /// The provider's message.
        message: String,
    },
    /// 400 or 422: the provider refused a value (the message names the field).
    #[error("invalid request: {message}")]
    Invalid {
        /// The provider's message.
        message: String,
    },
    /// An answer that is not what the API promises.
    #[error("unexpected answer to {request}: {reason}")]
    Garbage {
        /// Method and path.
        request: String,
        /// What was wrong with it (no body contents).
        reason: String,
    },
}

fn after(retry_after: &Option<Duration>) -> String {
    retry_after.map_or_else(String::new, |d| format!(", retry after {d:?}"))
}

impl ProviderError {
    /// Whether the same call may succeed later: 429, 5xx, a timeout or a
    /// refused or broken connection.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ProviderError::RateLimited { .. }
                | ProviderError::Unavailable { .. }
                | ProviderError::Timeout { .. }
                | ProviderError::Connection { .. }
        )
    }

    /// How long the provider asked the caller to wait (429's `Retry-After`).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ProviderError::RateLimited { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The conflict's kind, if this is a conflict.
    pub fn conflict(&self) -> Option<&ConflictKind> {
        match self {
            ProviderError::Conflict { kind, .. } => Some(kind),
            _ => None,
        }
    }

    /// Whether this is a not-found answer.
    pub fn is_not_found(&self) -> bool {
        matches!(self, ProviderError::NotFound { .. })
    }
}

/// The provider's API, one method per call. Every method is network I/O.
///
/// Ids not in the provider's format are answered with
/// [`ProviderError::NotFound`] without a request (nothing can have them).
/// Attach, detach and resize start an [`Action`]; poll it with
/// [`get_action`](ProviderClient::get_action) until it is no longer
/// `in-progress`.
#[async_trait]
pub trait ProviderClient: Send + Sync {
    /// Regions volumes can be created in (a cheap call that checks the token).
    async fn list_regions(&self) -> Result<Vec<Region>, ProviderError>;
    /// Creates a volume; a taken name is [`ConflictKind::NameTaken`].
    async fn create_volume(&self, req: &CreateVolumeRequest) -> Result<Volume, ProviderError>;
    /// The volume with `id`.
    async fn get_volume(&self, id: &str) -> Result<Volume, ProviderError>;
    /// A page of volumes matching `filter`, oldest first.
    async fn list_volumes(
        &self,
        filter: &VolumeFilter,
        page: PageRequest,
    ) -> Result<Page<Volume>, ProviderError>;
    /// Deletes a volume (not while it is attached).
    async fn delete_volume(&self, id: &str) -> Result<(), ProviderError>;
    /// Starts attaching a volume to a node.
    async fn attach(&self, volume_id: &str, node_id: &str) -> Result<Action, ProviderError>;
    /// Starts detaching a volume from a node.
    async fn detach(&self, volume_id: &str, node_id: &str) -> Result<Action, ProviderError>;
    /// Starts growing a volume to `size_gigabytes`.
    async fn resize(&self, volume_id: &str, size_gigabytes: u64) -> Result<Action, ProviderError>;
    /// The action with `id`.
    async fn get_action(&self, id: u64) -> Result<Action, ProviderError>;
    /// A page of a volume's actions, newest first (to find one that was
    /// started by a call whose answer was lost).
    async fn list_volume_actions(
        &self,
        volume_id: &str,
        page: PageRequest,
    ) -> Result<Page<Action>, ProviderError>;
    /// Snapshots a volume; a taken name is [`ConflictKind::NameTaken`].
    async fn create_snapshot(
        &self,
        volume_id: &str,
        req: &CreateSnapshotRequest,
    ) -> Result<Snapshot, ProviderError>;
    /// The snapshot with `id`.
    async fn get_snapshot(&self, id: &str) -> Result<Snapshot, ProviderError>;
    /// A page of snapshots matching `filter`, oldest first.
    async fn list_snapshots(
        &self,
        filter: &SnapshotFilter,
        page: PageRequest,
    ) -> Result<Page<Snapshot>, ProviderError>;
    /// Deletes a snapshot.
    async fn delete_snapshot(&self, id: &str) -> Result<(), ProviderError>;
}
