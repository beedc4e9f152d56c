//! [`FakeVolumePlugin`]: an in-memory [`VolumePlugin`] for tests, with
//! injected failures, delays and holds.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use crate::error::{ErrorKind, PluginError};
use crate::plugin::{ExpandRequest, MountResult, PublishRequest, StageRequest, VolumePlugin};
use crate::types::{AttachInfo, Key, OperationKind, VolumeSpec};

/// A call recorded by [`FakeVolumePlugin`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginCall<V, N> {
    /// Which method, named by the operation it serves:
    /// [`OperationKind::VerifyAttached`] for `wait_for_attach`, never
    /// `CleanupOrphan` (that runs `unpublish` and `unstage`).
    pub method: OperationKind,
    /// The volume.
    pub volume: V,
    /// The node, for attach, wait-for-attach and detach.
    pub node: Option<N>,
    /// The staging or target path, for node operations.
    pub path: Option<PathBuf>,
}

/// A start or an end of a call, recorded by [`FakeVolumePlugin`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginEvent<V, N> {
    /// The call began (before any injected delay, hold or failure).
    Started(PluginCall<V, N>),
    /// The call returned this result.
    Finished(PluginCall<V, N>, Result<(), PluginError>),
}

#[derive(Debug)]
enum Effect {
    Fail(ErrorKind),
    Delay(Duration),
    Hold(Arc<HoldState>),
}

#[derive(Debug)]
struct Fault<V> {
    method: OperationKind,
    volume: Option<V>,
    /// `None`: forever.
    remaining: Option<u32>,
    effect: Effect,
}

#[derive(Debug)]
struct HoldState {
    entered: tokio::sync::watch::Sender<bool>,
    release: tokio::sync::Semaphore,
}

/// A call held in flight by [`FakeVolumePlugin::hold`]: wait until it
/// started with [`entered`](Self::entered), let it finish with
/// [`release`](Self::release). Dropping the handle releases the call.
#[derive(Debug)]
pub struct CallHold {
    state: Arc<HoldState>,
}

impl CallHold {
    /// Waits until the held call is in flight.
    pub async fn entered(&self) {
        let mut entered = self.state.entered.subscribe();
        // The sender lives in `state`, so the channel never closes here.
        let _ = entered.wait_for(|in_flight| *in_flight).await;
    }

    /// Whether the held call is in flight (or was released).
    pub fn is_entered(&self) -> bool {
        *self.state.entered.borrow()
    }

    /// Lets the held call go on (to any other fault, then its result).
    pub fn release(&self) {
        // One permit: releasing twice is harmless.
        if self.state.release.available_permits() == 0 {
            self.state.release.add_permits(1);
        }
    }
}

impl Drop for CallHold {
    fn drop(&mut self) {
        self.release();
    }
}

#[derive(Debug)]
struct Recorded<V, N> {
    calls: Vec<PluginCall<V, N>>,
    events: Vec<PluginEvent<V, N>>,
}

/// An in-memory [`VolumePlugin`] for tests: records calls and their start
/// and end, succeeds instantly unless told otherwise, injects failures,
/// delays and holds per method and volume, and reports volume sizes.
///
/// Delays use `tokio::time::sleep`, so they are deterministic under a paused
/// tokio clock. Holds keep a call in flight until the test releases it, to
/// test exclusivity and races.
#[derive(Debug)]
pub struct FakeVolumePlugin<V, N> {
    recorded: Mutex<Recorded<V, N>>,
    faults: Mutex<Vec<Fault<V>>>,
    sizes: Mutex<HashMap<V, u64>>,
    recording: AtomicBool,
}

impl<V: Key, N: Key> Default for FakeVolumePlugin<V, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<V: Key, N: Key> FakeVolumePlugin<V, N> {
    /// A plugin where every call succeeds at once.
    pub fn new() -> Self {
        Self {
            recorded: Mutex::new(Recorded {
                calls: Vec::new(),
                events: Vec::new(),
            }),
            faults: Mutex::new(Vec::new()),
            sizes: Mutex::new(HashMap::new()),
            recording: AtomicBool::new(true),
        }
    }

    /// Turns call and event recording on or off (off keeps memory flat in
    /// benchmarks).
    pub fn set_recording(&self, on: bool) {
        self.recording.store(on, Ordering::Relaxed);
    }

    /// The next call of `method` on `volume` (any volume if `None`) fails with `kind`.
    pub fn fail_once(&self, method: OperationKind, volume: Option<V>, kind: ErrorKind) {
        self.fail_times(method, volume, 1, kind);
    }

    /// The next `times` calls fail with `kind`.
    pub fn fail_times(
        &self,
        method: OperationKind,
        volume: Option<V>,
        times: u32,
        kind: ErrorKind,
    ) {
        self.push_fault(method, volume, Some(times), Effect::Fail(kind));
    }

    /// Every call fails with `kind` until [`clear_faults`](Self::clear_faults).
    pub fn fail_always(&self, method: OperationKind, volume: Option<V>, kind: ErrorKind) {
        self.push_fault(method, volume, None, Effect::Fail(kind));
    }

    /// The next `times` calls take `delay` (then succeed unless another fault applies).
    pub fn delay(&self, method: OperationKind, volume: Option<V>, times: u32, delay: Duration) {
        self.push_fault(method, volume, Some(times), Effect::Delay(delay));
    }

    /// The next call of `method` on `volume` (any volume if `None`) stays
    /// in flight until the returned handle releases it; then other faults
    /// apply as usual.
    pub fn hold(&self, method: OperationKind, volume: Option<V>) -> CallHold {
        let state = Arc::new(HoldState {
            entered: tokio::sync::watch::Sender::new(false),
            release: tokio::sync::Semaphore::new(0),
        });
        self.push_fault(method, volume, Some(1), Effect::Hold(state.clone()));
        CallHold { state }
    }

    /// Stage and publish of `volume` report `bytes` as its size; expand
    /// changes it.
    pub fn set_size(&self, volume: V, bytes: u64) {
        self.sizes_lock().insert(volume, bytes);
    }

    /// The size last set or expanded to.
    pub fn size(&self, volume: &V) -> Option<u64> {
        self.sizes_lock().get(volume).copied()
    }

    /// Removes all injected faults; held calls are released.
    pub fn clear_faults(&self) {
        for fault in self.faults_lock().drain(..) {
            if let Effect::Hold(state) = fault.effect {
                CallHold { state }.release();
            }
        }
    }

    /// All recorded calls, oldest first.
    pub fn calls(&self) -> Vec<PluginCall<V, N>> {
        self.recorded_lock().calls.clone()
    }

    /// Returns and forgets the recorded calls.
    pub fn take_calls(&self) -> Vec<PluginCall<V, N>> {
        std::mem::take(&mut self.recorded_lock().calls)
    }

    /// Starts and ends of calls, in order.
    pub fn events(&self) -> Vec<PluginEvent<V, N>> {
        self.recorded_lock().events.clone()
    }

    /// Returns and forgets the recorded events.
    pub fn take_events(&self) -> Vec<PluginEvent<V, N>> {
        std::mem::take(&mut self.recorded_lock().events)
    }

    /// The most calls matching `filter` that were in flight at once,
    /// according to the recorded events.
    pub fn max_concurrent(&self, filter: impl Fn(&PluginCall<V, N>) -> bool) -> usize {
        let mut now = 0usize;
        let mut max = 0;
        for event in &self.recorded_lock().events {
            match event {
                PluginEvent::Started(call) if filter(call) => {
                    now += 1;
                    max = max.max(now);
                }
                PluginEvent::Finished(call, _) if filter(call) => now -= 1,
                _ => {}
            }
        }
        max
    }

    /// The recorded calls as (method, volume) pairs.
    pub fn call_summary(&self) -> Vec<(OperationKind, V)> {
        summary(self.calls())
    }

    /// Returns and forgets the recorded calls as (method, volume) pairs.
    pub fn take_call_summary(&self) -> Vec<(OperationKind, V)> {
        summary(self.take_calls())
    }

    /// How many calls of `method` were recorded.
    pub fn count(&self, method: OperationKind) -> usize {
        self.recorded_lock()
            .calls
            .iter()
            .filter(|c| c.method == method)
            .count()
    }

    fn recorded_lock(&self) -> std::sync::MutexGuard<'_, Recorded<V, N>> {
        self.recorded.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn faults_lock(&self) -> std::sync::MutexGuard<'_, Vec<Fault<V>>> {
        self.faults.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sizes_lock(&self) -> std::sync::MutexGuard<'_, HashMap<V, u64>> {
        self.sizes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push_fault(
        &self,
        method: OperationKind,
        volume: Option<V>,
        remaining: Option<u32>,
        effect: Effect,
    ) {
        self.faults_lock().push(Fault {
            method,
            volume,
            remaining,
            effect,
        });
    }

    /// Takes one use of the first fault of each kind that applies.
    fn take_faults(
        &self,
        method: OperationKind,
        volume: &V,
    ) -> (Option<Arc<HoldState>>, Option<Duration>, Option<ErrorKind>) {
        let mut faults = self.faults_lock();
        let mut hold = None;
        let mut delay = None;
        let mut kind = None;
        for fault in faults.iter_mut() {
            if fault.method != method
                || fault.volume.as_ref().is_some_and(|v| v != volume)
                || fault.remaining == Some(0)
            {
                continue;
            }
            let taken = match &fault.effect {
                Effect::Hold(state) if hold.is_none() => {
                    hold = Some(state.clone());
                    true
                }
                Effect::Delay(d) if delay.is_none() => {
                    delay = Some(*d);
                    true
                }
                Effect::Fail(k) if kind.is_none() => {
                    kind = Some(*k);
                    true
                }
                _ => false,
            };
            if taken && let Some(n) = fault.remaining.as_mut() {
                *n -= 1;
            }
        }
        faults.retain(|f| f.remaining != Some(0));
        (hold, delay, kind)
    }

    async fn call(
        &self,
        method: OperationKind,
        volume: &V,
        node: Option<&N>,
        path: Option<&Path>,
    ) -> Result<(), PluginError> {
        let recording = self.recording.load(Ordering::Relaxed);
        let call = recording.then(|| PluginCall {
            method,
            volume: volume.clone(),
            node: node.cloned(),
            path: path.map(Path::to_path_buf),
        });
        if let Some(call) = &call {
            let mut recorded = self.recorded_lock();
            recorded.calls.push(call.clone());
            recorded.events.push(PluginEvent::Started(call.clone()));
        }
        // Hold first, then delay, then failure: one call may take one of each.
        let (hold, delay, kind) = self.take_faults(method, volume);
        if let Some(hold) = hold {
            hold.entered.send_replace(true);
            if let Ok(permit) = hold.release.acquire().await {
                permit.forget();
            }
        }
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        let result = match kind {
            Some(kind) => Err(PluginError::new(
                kind,
                format!("injected {kind:?} failure of {method:?}"),
            )),
            None => Ok(()),
        };
        if let Some(call) = call {
            self.recorded_lock()
                .events
                .push(PluginEvent::Finished(call, result.clone()));
        }
        result
    }

    fn mount_result(&self, volume: &V) -> MountResult {
        MountResult {
            size: self.size(volume),
        }
    }
}

#[async_trait]
impl<V: Key, N: Key> VolumePlugin<V, N> for FakeVolumePlugin<V, N> {
    async fn attach(
        &self,
        volume: &V,
        node: &N,
        _spec: &VolumeSpec,
    ) -> Result<AttachInfo, PluginError> {
        self.call(OperationKind::Attach, volume, Some(node), None)
            .await?;
        Ok(AttachInfo {
            device_path: Some(PathBuf::from(format!("/dev/fake/{volume:?}"))),
            publish_context: Default::default(),
        })
    }

    async fn wait_for_attach(
        &self,
        volume: &V,
        node: &N,
        _spec: &VolumeSpec,
    ) -> Result<AttachInfo, PluginError> {
        self.call(OperationKind::VerifyAttached, volume, Some(node), None)
            .await?;
        Ok(AttachInfo {
            device_path: Some(PathBuf::from(format!("/dev/fake/{volume:?}"))),
            publish_context: Default::default(),
        })
    }

    async fn detach(&self, volume: &V, node: &N) -> Result<(), PluginError> {
        self.call(OperationKind::Detach, volume, Some(node), None)
            .await
    }

    async fn stage(&self, request: &StageRequest<V>) -> Result<MountResult, PluginError> {
        self.call(
            OperationKind::Stage,
            &request.volume,
            None,
            Some(&request.staging_path),
        )
        .await?;
        Ok(self.mount_result(&request.volume))
    }

    async fn unstage(&self, volume: &V, staging_path: &Path) -> Result<(), PluginError> {
        self.call(OperationKind::Unstage, volume, None, Some(staging_path))
            .await
    }

    async fn publish(&self, request: &PublishRequest<V>) -> Result<MountResult, PluginError> {
        self.call(
            OperationKind::Publish,
            &request.volume,
            None,
            Some(&request.target_path),
        )
        .await?;
        Ok(self.mount_result(&request.volume))
    }

    async fn unpublish(&self, volume: &V, target_path: &Path) -> Result<(), PluginError> {
        self.call(OperationKind::Unpublish, volume, None, Some(target_path))
            .await
    }

    async fn expand(&self, request: &ExpandRequest<V>) -> Result<u64, PluginError> {
        self.call(
            OperationKind::Expand,
            &request.volume,
            None,
            Some(&request.volume_path),
        )
        .await?;
        // Like a driver: never shrinks, reports the size it reached.
        let mut sizes = self.sizes_lock();
        let size = sizes.entry(request.volume.clone()).or_insert(0);
        *size = (*size).max(request.new_size);
        Ok(*size)
    }
}

fn summary<V, N>(calls: Vec<PluginCall<V, N>>) -> Vec<(OperationKind, V)> {
    calls.into_iter().map(|c| (c.method, c.volume)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn faults_apply_per_method_and_volume_and_run_out() {
        let plugin = FakeVolumePlugin::<&str, &str>::new();
        plugin.fail_times(OperationKind::Detach, Some("a"), 2, ErrorKind::Uncertain);
        plugin.delay(OperationKind::Detach, None, 1, Duration::from_secs(5));
        let start = tokio::time::Instant::now();
        let first = plugin.detach(&"a", &"n").await;
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        assert_eq!(first.unwrap_err().kind, ErrorKind::Uncertain);
        assert!(plugin.detach(&"b", &"n").await.is_ok());
        assert!(plugin.detach(&"a", &"n").await.is_err());
        assert!(plugin.detach(&"a", &"n").await.is_ok());
        assert_eq!(plugin.count(OperationKind::Detach), 4);
        plugin.fail_always(OperationKind::Stage, None, ErrorKind::Final);
        let request = StageRequest {
            volume: "a",
            spec: Arc::default(),
            staging_path: "/s".into(),
            attach: Arc::default(),
        };
        for _ in 0..3 {
            assert_eq!(
                plugin.stage(&request).await.unwrap_err().kind,
                ErrorKind::Final
            );
        }
        plugin.clear_faults();
        assert!(plugin.stage(&request).await.is_ok());
        assert_eq!(plugin.take_calls().len(), 8);
        assert!(plugin.calls().is_empty());
    }

    #[tokio::test]
    async fn a_held_call_stays_in_flight_until_released_and_events_show_it() {
        let plugin = Arc::new(FakeVolumePlugin::<&str, &str>::new());
        let hold = plugin.hold(OperationKind::Detach, Some("a"));
        plugin.fail_once(OperationKind::Detach, Some("a"), ErrorKind::Uncertain);
        let p = plugin.clone();
        let held = tokio::spawn(async move { p.detach(&"a", &"n").await });
        hold.entered().await;
        assert!(hold.is_entered());
        // Other calls go through while the held one waits.
        assert!(plugin.detach(&"b", &"n").await.is_ok());
        assert!(!held.is_finished());
        assert_eq!(
            plugin.max_concurrent(|c| c.method == OperationKind::Detach),
            2
        );
        assert_eq!(plugin.max_concurrent(|c| c.volume == "a"), 1);
        hold.release();
        // The failure injected after the hold still applies once released.
        assert_eq!(held.await.unwrap().unwrap_err().kind, ErrorKind::Uncertain);
        let ends: Vec<_> = plugin
            .events()
            .into_iter()
            .filter_map(|e| match e {
                PluginEvent::Finished(call, result) => Some((call.volume, result.is_ok())),
                PluginEvent::Started(_) => None,
            })
            .collect();
        assert_eq!(ends, [("b", true), ("a", false)]);
        // A dropped handle releases its call; the hold was used up anyway.
        drop(hold);
        assert!(plugin.detach(&"a", &"n").await.is_ok());
        assert_eq!(plugin.take_events().len(), 6);
        assert!(plugin.events().is_empty());
    }

    #[tokio::test]
    async fn sizes_are_reported_by_stage_and_publish_and_grown_by_expand() {
        let plugin = FakeVolumePlugin::<&str, &str>::new();
        let stage = StageRequest {
            volume: "a",
            spec: Arc::default(),
            staging_path: "/s".into(),
            attach: Arc::default(),
        };
        assert_eq!(plugin.stage(&stage).await.unwrap(), MountResult::default());
        plugin.set_size("a", 10);
        assert_eq!(
            plugin.stage(&stage).await.unwrap(),
            MountResult::with_size(10)
        );
        let expand = |new_size| ExpandRequest {
            volume: "a",
            spec: Arc::default(),
            volume_path: "/t".into(),
            staging_path: None,
            new_size,
        };
        assert_eq!(plugin.expand(&expand(20)).await.unwrap(), 20);
        assert_eq!(
            plugin.expand(&expand(15)).await.unwrap(),
            20,
            "never shrinks"
        );
        let publish = PublishRequest {
            volume: "a",
            spec: Arc::default(),
            target_path: "/t".into(),
            staging_path: None,
            attach: Arc::default(),
        };
        assert_eq!(plugin.publish(&publish).await.unwrap().size, Some(20));
        // Holds released by clear_faults do not block.
        let _hold = plugin.hold(OperationKind::Unstage, None);
        plugin.clear_faults();
        assert!(plugin.unstage(&"a", Path::new("/s")).await.is_ok());
    }
}
