//! The operation gate: at most one operation per nested key, with
//! per-key exponential backoff (kubelet's `nestedpendingoperations`).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::GateError;
use crate::types::{Key, OperationKind};

/// Identifies an operation.
///
/// Nesting: `pod: None` / `node: None` act as wildcards, so a volume-level key
/// (both `None`) conflicts with every operation on the volume, a pod key with
/// the same pod or any key without a pod, and likewise for nodes. The
/// operation name does not take part in the conflict check, only in backoff.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OperationKey<V, P, N> {
    /// The volume.
    pub volume: V,
    /// The pod, for per-pod work (publish/unpublish).
    pub pod: Option<P>,
    /// The node, for per-node work (attach/detach of multi-node volumes).
    pub node: Option<N>,
    /// Which operation.
    pub operation: OperationKind,
}

impl<V, P, N> OperationKey<V, P, N> {
    /// A volume-level key.
    pub fn volume(volume: V, operation: OperationKind) -> Self {
        Self {
            volume,
            pod: None,
            node: None,
            operation,
        }
    }

    /// A pod-level key.
    pub fn pod(volume: V, pod: P, operation: OperationKind) -> Self {
        Self {
            volume,
            pod: Some(pod),
            node: None,
            operation,
        }
    }

    /// A node-level key.
    pub fn node(volume: V, node: N, operation: OperationKind) -> Self {
        Self {
            volume,
            pod: None,
            node: Some(node),
            operation,
        }
    }
}

/// Backoff settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffConfig {
    /// Wait after the first failure (500 ms).
    pub initial: Duration,
    /// Upper bound of the wait (2 min 2 s, as in Kubernetes).
    pub max: Duration,
    /// A failure more than this long after the previous backoff window
    /// ended restarts the backoff at `initial`, and such a stale record is
    /// dropped. Default: `max`. An operation retried as soon as its window
    /// ends keeps doubling; one nobody retried for that long (the pod went
    /// away, a new one came hours later) starts afresh.
    ///
    /// `None` never resets, as Kubernetes does (kubernetes#116886): see
    /// [`BackoffConfig::never_reset`].
    pub reset_after: Option<Duration>,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        let max = Duration::from_secs(122);
        Self {
            initial: Duration::from_millis(500),
            max,
            reset_after: Some(max),
        }
    }
}

impl BackoffConfig {
    /// Kubernetes' policy: the backoff of a key only restarts after a
    /// success. Records of volumes that left the desired and the actual
    /// state are still purged.
    pub fn never_reset() -> Self {
        Self {
            reset_after: None,
            ..Self::default()
        }
    }

    /// Whether a record whose window ended at `until` is stale at `now`.
    fn is_stale(&self, until: Instant, now: Instant) -> bool {
        self.reset_after
            .is_some_and(|reset| now.saturating_duration_since(until) > reset)
    }
}

#[derive(Debug, Clone)]
struct Backoff {
    last_error_at: Instant,
    wait: Duration,
    last_error: String,
}

impl Backoff {
    fn until(&self) -> Instant {
        self.last_error_at + self.wait
    }
}

#[derive(Debug, Clone)]
struct Record<P, N> {
    pod: Option<P>,
    node: Option<N>,
    operation: OperationKind,
    pending: bool,
    backoff: Option<Backoff>,
}

fn part_matches<T: PartialEq>(a: Option<&T>, b: Option<&T>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a == b,
        _ => true,
    }
}

impl<P: PartialEq, N: PartialEq> Record<P, N> {
    fn nests(&self, pod: Option<&P>, node: Option<&N>) -> bool {
        part_matches(self.pod.as_ref(), pod) && part_matches(self.node.as_ref(), node)
    }

    fn is_exact(&self, pod: Option<&P>, node: Option<&N>, op: OperationKind) -> bool {
        self.operation == op && self.pod.as_ref() == pod && self.node.as_ref() == node
    }
}

/// Gate state: records indexed by volume, so checks cost O(records of that volume).
#[derive(Debug)]
pub struct GateState<V, P, N> {
    records: HashMap<V, Vec<Record<P, N>>>,
    config: BackoffConfig,
}

impl<V: Key, P: Key, N: Key> GateState<V, P, N> {
    /// Whether an operation nesting with (volume, pod, node) is running.
    pub fn is_pending(&self, volume: &V, pod: Option<&P>, node: Option<&N>) -> bool {
        self.records
            .get(volume)
            .is_some_and(|rs| rs.iter().any(|r| r.pending && r.nests(pod, node)))
    }

    /// [`can_start`](Self::can_start) without building a key (no clones).
    pub fn can_start_parts(
        &self,
        volume: &V,
        pod: Option<&P>,
        node: Option<&N>,
        operation: OperationKind,
        now: Instant,
    ) -> bool {
        let Some(records) = self.records.get(volume) else {
            return true;
        };
        !records.iter().any(|r| {
            (r.pending && r.nests(pod, node))
                || (r.is_exact(pod, node, operation)
                    && r.backoff.as_ref().is_some_and(|b| now < b.until()))
        })
    }

    /// When the exact key may start again, if it is inside a backoff window.
    pub fn backoff_until(&self, key: &OperationKey<V, P, N>, now: Instant) -> Option<Instant> {
        self.exact(key)
            .and_then(|r| r.backoff.as_ref())
            .map(Backoff::until)
            .filter(|until| now < *until)
    }

    /// Whether the exact key is outside any backoff window (pending is not checked).
    pub fn is_safe_to_retry(&self, key: &OperationKey<V, P, N>, now: Instant) -> bool {
        self.backoff_until(key, now).is_none()
    }

    /// Whether `key` could start now: nothing nested is pending and it is not in backoff.
    pub fn can_start(&self, key: &OperationKey<V, P, N>, now: Instant) -> bool {
        !self.is_pending(&key.volume, key.pod.as_ref(), key.node.as_ref())
            && self.is_safe_to_retry(key, now)
    }

    /// The earliest end of a backoff window after `now`, used to wake the runner.
    pub fn next_retry_at(&self, now: Instant) -> Option<Instant> {
        self.records
            .values()
            .flatten()
            .filter(|r| !r.pending)
            .filter_map(|r| r.backoff.as_ref().map(Backoff::until))
            .filter(|until| *until > now)
            .min()
    }

    /// Drops every record that is not running and either belongs to a
    /// volume `keep` rejects (it left both the desired and the actual
    /// state) or is stale (see [`BackoffConfig::reset_after`]). Returns how
    /// many were dropped; keeps memory bounded by the volumes in use.
    pub fn purge(&mut self, now: Instant, mut keep: impl FnMut(&V) -> bool) -> usize {
        let config = self.config;
        let mut dropped = 0;
        self.records.retain(|volume, records| {
            let before = records.len();
            if keep(volume) {
                records.retain(|r| {
                    r.pending
                        || r.backoff
                            .as_ref()
                            .is_some_and(|b| !config.is_stale(b.until(), now))
                });
            } else {
                records.retain(|r| r.pending);
            }
            dropped += before - records.len();
            !records.is_empty()
        });
        dropped
    }

    /// Number of records (pending or backing off).
    pub fn len(&self) -> usize {
        self.records.values().map(Vec::len).sum()
    }

    /// Whether there are no records.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    fn exact(&self, key: &OperationKey<V, P, N>) -> Option<&Record<P, N>> {
        self.records
            .get(&key.volume)?
            .iter()
            .find(|r| r.is_exact(key.pod.as_ref(), key.node.as_ref(), key.operation))
    }

    fn start(&mut self, key: &OperationKey<V, P, N>, now: Instant) -> Result<(), GateError> {
        if self.is_pending(&key.volume, key.pod.as_ref(), key.node.as_ref()) {
            return Err(GateError::AlreadyExists);
        }
        let records = self.records.entry(key.volume.clone()).or_default();
        match records
            .iter_mut()
            .find(|r| r.is_exact(key.pod.as_ref(), key.node.as_ref(), key.operation))
        {
            Some(record) => {
                if let Some(backoff) = record.backoff.as_ref().filter(|b| now < b.until()) {
                    return Err(GateError::Backoff {
                        until: backoff.until(),
                        last_error: backoff.last_error.clone(),
                    });
                }
                record.pending = true;
            }
            None => records.push(Record {
                pod: key.pod.clone(),
                node: key.node.clone(),
                operation: key.operation,
                pending: true,
                backoff: None,
            }),
        }
        Ok(())
    }

    fn finish(&mut self, key: &OperationKey<V, P, N>, result: Result<(), String>, now: Instant) {
        let Some(records) = self.records.get_mut(&key.volume) else {
            return;
        };
        let Some(index) = records
            .iter()
            .position(|r| r.is_exact(key.pod.as_ref(), key.node.as_ref(), key.operation))
        else {
            return;
        };
        match result {
            Ok(()) => {
                records.swap_remove(index);
                if records.is_empty() {
                    self.records.remove(&key.volume);
                }
            }
            Err(message) => {
                let record = &mut records[index];
                record.pending = false;
                let wait = next_wait(&self.config, record.backoff.as_ref(), now);
                record.backoff = Some(Backoff {
                    last_error_at: now,
                    wait,
                    last_error: message,
                });
            }
        }
    }
}

/// The wait after a failure at `now`, given the previous backoff (pure).
///
/// `previous` is (time of the previous failure, its wait); the backoff
/// restarts when the previous window ended more than `reset_after` ago.
pub fn next_wait_after_failure(
    config: &BackoffConfig,
    previous: Option<(Instant, Duration)>,
    now: Instant,
) -> Duration {
    match previous {
        None => config.initial,
        Some((last_error_at, wait)) if config.is_stale(last_error_at + wait, now) => config.initial,
        Some((_, wait)) => (wait * 2).min(config.max),
    }
}

fn next_wait(config: &BackoffConfig, previous: Option<&Backoff>, now: Instant) -> Duration {
    next_wait_after_failure(config, previous.map(|b| (b.last_error_at, b.wait)), now)
}

/// Serialises operations per nested key and spaces out retries of failed ones.
///
/// Thread-safe; lock it once with [`OperationGate::state`] for many queries.
#[derive(Debug)]
pub struct OperationGate<V, P, N> {
    state: Mutex<GateState<V, P, N>>,
}

impl<V: Key, P: Key, N: Key> Default for OperationGate<V, P, N> {
    fn default() -> Self {
        Self::new(BackoffConfig::default())
    }
}

impl<V: Key, P: Key, N: Key> OperationGate<V, P, N> {
    /// An empty gate.
    pub fn new(config: BackoffConfig) -> Self {
        Self {
            state: Mutex::new(GateState {
                records: HashMap::new(),
                config,
            }),
        }
    }

    /// Locks the gate for read-only queries (used by planners for a whole pass).
    pub fn state(&self) -> MutexGuard<'_, GateState<V, P, N>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks `key` pending, or says why it cannot start.
    pub fn try_start(&self, key: &OperationKey<V, P, N>, now: Instant) -> Result<(), GateError> {
        self.state().start(key, now)
    }

    /// Ends a started operation: success forgets the key, failure starts or
    /// doubles its backoff.
    pub fn finish(&self, key: &OperationKey<V, P, N>, result: Result<(), String>, now: Instant) {
        self.state().finish(key, result, now)
    }

    /// Whether an operation nesting with (volume, pod, node) is running.
    pub fn is_pending(&self, volume: &V, pod: Option<&P>, node: Option<&N>) -> bool {
        self.state().is_pending(volume, pod, node)
    }

    /// See [`GateState::purge`].
    pub fn purge(&self, now: Instant, keep: impl FnMut(&V) -> bool) -> usize {
        self.state().purge(now, keep)
    }

    /// Whether the exact key is outside its backoff window.
    pub fn is_safe_to_retry(&self, key: &OperationKey<V, P, N>, now: Instant) -> bool {
        self.state().is_safe_to_retry(key, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Gate = OperationGate<&'static str, &'static str, &'static str>;
    type K = OperationKey<&'static str, &'static str, &'static str>;

    fn key(pod: Option<&'static str>, node: Option<&'static str>) -> K {
        OperationKey {
            volume: "v",
            pod,
            node,
            operation: OperationKind::Publish,
        }
    }

    #[test]
    fn nesting_rules_table() {
        let now = Instant::now();
        let vol = key(None, None);
        let p1 = key(Some("p1"), None);
        let p2 = key(Some("p2"), None);
        let n1 = key(None, Some("n1"));
        let n2 = key(None, Some("n2"));
        let p1n1 = key(Some("p1"), Some("n1"));
        let p1n2 = key(Some("p1"), Some("n2"));
        let other_volume = OperationKey {
            volume: "w",
            ..vol.clone()
        };
        // (running, new, conflicts)
        let table = [
            (&vol, &vol, true),
            (&vol, &p1, true),
            (&vol, &n1, true),
            (&p1, &vol, true),
            (&p1, &p1, true),
            (&p1, &p2, false),
            (&p1, &n1, true), // pod part and node part each have a wildcard
            (&n1, &vol, true),
            (&n1, &n1, true),
            (&n1, &n2, false),
            (&n1, &p1, true),
            (&p1n1, &p1n2, false),
            (&p1n1, &p1, true),
            (&p1n1, &n2, false),
            (&vol, &other_volume, false),
        ];
        for (running, new, conflicts) in table {
            let gate = Gate::default();
            gate.try_start(running, now).unwrap();
            assert_eq!(
                gate.is_pending(&new.volume, new.pod.as_ref(), new.node.as_ref()),
                conflicts
            );
            let got = gate.try_start(new, now);
            assert_eq!(
                got.is_err(),
                conflicts,
                "running {running:?} new {new:?} -> {got:?}"
            );
            if conflicts {
                assert_eq!(got, Err(GateError::AlreadyExists));
            }
        }
    }

    #[test]
    fn backoff_doubles_from_500ms_and_caps_at_2m2s() {
        let gate = Gate::default();
        let k = key(None, None);
        let mut now = Instant::now();
        let expected_ms = [
            500, 1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 122_000, 122_000,
        ];
        for wait in expected_ms {
            gate.try_start(&k, now).unwrap();
            assert_eq!(gate.try_start(&k, now), Err(GateError::AlreadyExists));
            gate.finish(&k, Err("boom".into()), now);
            let until = now + Duration::from_millis(wait);
            assert_eq!(
                gate.try_start(&k, now),
                Err(GateError::Backoff {
                    until,
                    last_error: "boom".into()
                })
            );
            let just_before = until - Duration::from_millis(1);
            assert!(!gate.is_safe_to_retry(&k, just_before));
            assert!(gate.try_start(&k, just_before).is_err());
            assert!(gate.is_safe_to_retry(&k, until));
            now = until;
        }
        // Success forgets the record: the next failure starts at 500 ms again.
        gate.try_start(&k, now).unwrap();
        gate.finish(&k, Ok(()), now);
        assert!(gate.state().is_empty());
        gate.try_start(&k, now).unwrap();
        gate.finish(&k, Err("again".into()), now);
        assert_eq!(
            gate.state().backoff_until(&k, now),
            Some(now + Duration::from_millis(500))
        );
    }

    #[test]
    fn backoff_is_per_exact_key_and_pending_is_nested() {
        let gate = Gate::default();
        let now = Instant::now();
        let publish = key(Some("p1"), None);
        let unpublish = OperationKey {
            operation: OperationKind::Unpublish,
            ..publish.clone()
        };
        gate.try_start(&publish, now).unwrap();
        gate.finish(&publish, Err("x".into()), now);
        assert!(!gate.is_safe_to_retry(&publish, now));
        // Another operation name on the same pod is not in backoff.
        assert!(gate.is_safe_to_retry(&unpublish, now));
        gate.try_start(&unpublish, now).unwrap();
        // The failed record is not pending, so only the running one blocks.
        assert!(gate.is_pending(&"v", None, None));
        assert!(!gate.is_pending(&"v", Some(&"p2"), None));
        assert_eq!(gate.state().len(), 2);
    }

    #[test]
    fn reset_after_restarts_backoff_by_default_but_not_when_never_reset() {
        let k = key(None, None);
        for (config, expect) in [
            (BackoffConfig::never_reset(), Duration::from_secs(1)),
            (BackoffConfig::default(), Duration::from_millis(500)),
        ] {
            let gate = Gate::new(config);
            let now = Instant::now();
            gate.try_start(&k, now).unwrap();
            gate.finish(&k, Err("a".into()), now);
            let later = now + Duration::from_secs(600);
            gate.try_start(&k, later).unwrap();
            gate.finish(&k, Err("b".into()), later);
            assert_eq!(gate.state().backoff_until(&k, later), Some(later + expect));
        }
    }

    #[test]
    fn retrying_when_the_window_ends_keeps_doubling_past_the_reset_period() {
        // The window end, not the previous failure, starts the reset clock:
        // at the 122 s cap a retry comes 122 s after the failure, yet the
        // backoff must stay capped rather than fall back to 500 ms.
        let gate = Gate::default();
        let k = key(None, None);
        let mut now = Instant::now();
        let mut waits = Vec::new();
        for _ in 0..12 {
            gate.try_start(&k, now).unwrap();
            // The operation itself takes a while.
            now += Duration::from_secs(5);
            gate.finish(&k, Err("slow".into()), now);
            let until = gate.state().backoff_until(&k, now).unwrap();
            waits.push((until - now).as_millis());
            now = until;
        }
        assert_eq!(
            waits,
            [
                500, 1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 122_000, 122_000, 122_000,
                122_000
            ]
        );
    }

    #[test]
    fn purge_drops_unwanted_and_stale_records_but_never_running_ones() {
        let gate = Gate::default();
        let now = Instant::now();
        let on = |volume: &'static str, pod: &'static str| OperationKey {
            volume,
            pod: Some(pod),
            node: None,
            operation: OperationKind::Publish,
        };
        for k in [on("gone", "a"), on("kept", "a"), on("stale", "a")] {
            gate.try_start(&k, now).unwrap();
            gate.finish(&k, Err("x".into()), now);
        }
        gate.try_start(&on("gone", "b"), now).unwrap(); // still running
        let later = now + Duration::from_secs(60);
        let keep = |v: &&str| *v != "gone";
        assert_eq!(gate.state().purge(later, keep), 1);
        assert_eq!(gate.state().len(), 3);
        assert!(gate.is_pending(&"gone", Some(&"b"), None));
        // Past the window (500 ms) plus reset_after (122 s): stale.
        let much_later = now + Duration::from_secs(123);
        assert_eq!(gate.state().purge(much_later, keep), 2);
        assert_eq!(gate.state().len(), 1, "the running record stays");
        // Kubernetes' policy keeps stale records of wanted volumes.
        let gate = Gate::new(BackoffConfig::never_reset());
        gate.try_start(&on("kept", "a"), now).unwrap();
        gate.finish(&on("kept", "a"), Err("x".into()), now);
        let hours = now + Duration::from_secs(3 * 3600);
        assert_eq!(gate.state().purge(hours, keep), 0);
        assert_eq!(gate.state().purge(hours, |_| false), 1);
        assert!(gate.state().is_empty());
    }

    #[test]
    fn next_retry_at_is_the_earliest_backoff_end() {
        let gate = Gate::default();
        let now = Instant::now();
        assert_eq!(gate.state().next_retry_at(now), None);
        let a = key(Some("a"), None);
        let b = key(Some("b"), None);
        gate.try_start(&a, now).unwrap();
        gate.finish(&a, Err("x".into()), now);
        gate.try_start(&b, now).unwrap();
        gate.finish(&b, Err("x".into()), now);
        gate.try_start(&b, now + Duration::from_secs(1)).unwrap();
        gate.finish(&b, Err("x".into()), now + Duration::from_secs(1));
        assert_eq!(
            gate.state().next_retry_at(now),
            Some(now + Duration::from_millis(500))
        );
        assert_eq!(
            gate.state().next_retry_at(now + Duration::from_millis(600)),
            Some(now + Duration::from_secs(2))
        );
    }
}
