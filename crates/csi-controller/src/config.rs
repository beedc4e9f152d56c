//! [`Config`]: what the service offers, its limits, and its seams (clock,
//! blocking runner, retry policy).

use std::sync::Arc;
use std::time::Duration;

use csi_driver::clock::{Clock, SystemClock};
use csi_driver::{BlockingRunner, TokioBlocking};

/// What the service offers and its limits. Which RPCs it serves comes from
/// the backend's abilities, not from here.
#[derive(Debug, Clone)]
pub struct Config {
    /// Local data: the node volumes are published to (ControllerPublish
    /// of another node is NOT_FOUND) and the topology segment's value.
    pub node_id: String,
    /// Total bytes handed out (0: the backend's free space decides).
    pub capacity: i64,
    /// With no `capacity`: refuse a create or expansion larger than the
    /// backend's free space (sparse images must not overcommit).
    pub refuse_beyond_free_space: bool,
    /// Size of a volume whose request gives no capacity range.
    pub default_size: i64,
    /// Smallest volume (0: none).
    pub min_size: i64,
    /// Largest volume (0: none).
    pub max_size: i64,
    /// Rounding unit of mount volumes.
    pub mount_unit: i64,
    /// Rounding unit of block volumes.
    pub block_unit: i64,
    /// The topology key whose value is `node_id` (None: no topology).
    pub topology_key: Option<String>,
    /// Local data: most volumes attached to one node (0: no limit).
    pub attach_limit: i64,
    /// DeleteVolume of a volume with snapshots is FAILED_PRECONDITION.
    pub keep_snapshot_sources: bool,
    /// Backoff of transient provider errors and of polling for readiness.
    pub retry: RetryPolicy,
    /// Where time comes from (a fake in tests).
    pub clock: Arc<dyn Clock>,
    /// Where blocking work starts (a failing fake in tests).
    pub runner: Arc<dyn BlockingRunner>,
}

/// Backoff within a call's deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The first wait.
    pub initial: Duration,
    /// The longest wait (a Retry-After may ask for more, up to the deadline).
    pub max: Duration,
    /// How long a call without a deadline keeps trying.
    pub budget: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(5),
            budget: Duration::from_secs(60),
        }
    }
}

impl Config {
    /// Defaults: 1 GiB volumes of any size, whole MiB for block, no
    /// capacity limit, topology or attach limit; the system clock and
    /// tokio's blocking pool.
    pub fn new(node_id: impl Into<String>) -> Self {
        Self {
            node_id: node_id.into(),
            capacity: 0,
            refuse_beyond_free_space: false,
            default_size: 1 << 30,
            min_size: 0,
            max_size: 0,
            mount_unit: 1,
            block_unit: 1 << 20,
            topology_key: None,
            attach_limit: 0,
            keep_snapshot_sources: false,
            retry: RetryPolicy::default(),
            clock: Arc::new(SystemClock),
            runner: Arc::new(TokioBlocking),
        }
    }
}
