//! The volume plugin interface the reconcilers drive, and a fake for tests.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use crate::error::{ErrorKind, PluginError};
use crate::types::{AttachInfo, Key, VolumeSpec};

/// Arguments of [`VolumePlugin::stage`] (CSI NodeStageVolume).
#[derive(Debug, Clone)]
pub struct StageRequest<V> {
    /// The volume.
    pub volume: V,
    /// Its spec (capability: access mode, fs type, mount options, attributes).
    pub spec: Arc<VolumeSpec>,
    /// Where to stage.
    pub staging_path: PathBuf,
    /// What attach reported (device path, publish context).
    pub attach: Arc<AttachInfo>,
}

/// Arguments of [`VolumePlugin::publish`] (CSI NodePublishVolume).
#[derive(Debug, Clone)]
pub struct PublishRequest<V> {
    /// The volume.
    pub volume: V,
    /// Its spec; `spec.read_only` says whether to publish read-only.
    pub spec: Arc<VolumeSpec>,
    /// The pod's mount point.
    pub target_path: PathBuf,
    /// The staging path, if the volume was staged.
    pub staging_path: Option<PathBuf>,
    /// What attach reported (device path, publish context).
    pub attach: Arc<AttachInfo>,
}

/// Arguments of [`VolumePlugin::expand`] (CSI NodeExpandVolume).
#[derive(Debug, Clone)]
pub struct ExpandRequest<V> {
    /// The volume.
    pub volume: V,
    /// Its spec.
    pub spec: Arc<VolumeSpec>,
    /// A path where the volume is published.
    pub volume_path: PathBuf,
    /// The staging path, if staged.
    pub staging_path: Option<PathBuf>,
    /// The requested size in bytes.
    pub new_size: u64,
}

/// Performs the real work for a volume: attach, stage, publish and back.
///
/// Calls must be idempotent: after an uncertain failure or a restart the
/// reconciler repeats them. The error kind decides the next state (see
/// [`crate::transition`]).
#[async_trait]
pub trait VolumePlugin<V: Key, N: Key>: Send + Sync {
    /// Attaches `volume` to `node` (CSI ControllerPublishVolume).
    async fn attach(
        &self,
        volume: &V,
        node: &N,
        spec: &VolumeSpec,
    ) -> Result<AttachInfo, PluginError>;

    /// Waits until someone else (the attach/detach controller) has attached
    /// `volume` to `node` and returns the attachment's details.
    async fn wait_for_attach(
        &self,
        volume: &V,
        node: &N,
        spec: &VolumeSpec,
    ) -> Result<AttachInfo, PluginError>;

    /// Detaches `volume` from `node` (CSI ControllerUnpublishVolume).
    async fn detach(&self, volume: &V, node: &N) -> Result<(), PluginError>;

    /// Stages the device (CSI NodeStageVolume).
    async fn stage(&self, request: &StageRequest<V>) -> Result<(), PluginError>;

    /// Unstages the device (CSI NodeUnstageVolume).
    async fn unstage(&self, volume: &V, staging_path: &Path) -> Result<(), PluginError>;

    /// Publishes the volume for a pod (CSI NodePublishVolume).
    async fn publish(&self, request: &PublishRequest<V>) -> Result<(), PluginError>;

    /// Unpublishes the volume from a pod's path (CSI NodeUnpublishVolume).
    async fn unpublish(&self, volume: &V, target_path: &Path) -> Result<(), PluginError>;

    /// Expands the filesystem on the node; returns the new size in bytes.
    async fn expand(&self, request: &ExpandRequest<V>) -> Result<u64, PluginError>;
}

/// A [`VolumePlugin`] method, for fault injection and call counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PluginMethod {
    /// [`VolumePlugin::attach`]
    Attach,
    /// [`VolumePlugin::wait_for_attach`]
    WaitForAttach,
    /// [`VolumePlugin::detach`]
    Detach,
    /// [`VolumePlugin::stage`]
    Stage,
    /// [`VolumePlugin::unstage`]
    Unstage,
    /// [`VolumePlugin::publish`]
    Publish,
    /// [`VolumePlugin::unpublish`]
    Unpublish,
    /// [`VolumePlugin::expand`]
    Expand,
}

/// A call recorded by [`FakeVolumePlugin`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginCall<V, N> {
    /// Which method.
    pub method: PluginMethod,
    /// The volume.
    pub volume: V,
    /// The node, for attach, wait-for-attach and detach.
    pub node: Option<N>,
    /// The staging or target path, for node operations.
    pub path: Option<PathBuf>,
}

#[derive(Debug)]
struct Fault<V> {
    method: PluginMethod,
    volume: Option<V>,
    /// `None`: forever.
    remaining: Option<u32>,
    kind: Option<ErrorKind>,
    delay: Option<Duration>,
}

/// An in-memory [`VolumePlugin`] for tests: records calls, succeeds instantly
/// unless told otherwise, and injects faults per method and volume.
///
/// Delays use `tokio::time::sleep`, so they are deterministic under a paused
/// tokio clock.
#[derive(Debug)]
pub struct FakeVolumePlugin<V, N> {
    calls: Mutex<Vec<PluginCall<V, N>>>,
    faults: Mutex<Vec<Fault<V>>>,
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
            calls: Mutex::new(Vec::new()),
            faults: Mutex::new(Vec::new()),
            recording: AtomicBool::new(true),
        }
    }

    /// Turns call recording on or off (off keeps memory flat in benchmarks).
    pub fn set_recording(&self, on: bool) {
        self.recording.store(on, Ordering::Relaxed);
    }

    /// The next call of `method` on `volume` (any volume if `None`) fails with `kind`.
    pub fn fail_once(&self, method: PluginMethod, volume: Option<V>, kind: ErrorKind) {
        self.fail_times(method, volume, 1, kind);
    }

    /// The next `times` calls fail with `kind`.
    pub fn fail_times(&self, method: PluginMethod, volume: Option<V>, times: u32, kind: ErrorKind) {
        self.push_fault(Fault {
            method,
            volume,
            remaining: Some(times),
            kind: Some(kind),
            delay: None,
        });
    }

    /// Every call fails with `kind` until [`clear_faults`](Self::clear_faults).
    pub fn fail_always(&self, method: PluginMethod, volume: Option<V>, kind: ErrorKind) {
        self.push_fault(Fault {
            method,
            volume,
            remaining: None,
            kind: Some(kind),
            delay: None,
        });
    }

    /// The next `times` calls take `delay` (then succeed unless another fault applies).
    pub fn delay(&self, method: PluginMethod, volume: Option<V>, times: u32, delay: Duration) {
        self.push_fault(Fault {
            method,
            volume,
            remaining: Some(times),
            kind: None,
            delay: Some(delay),
        });
    }

    /// Removes all injected faults.
    pub fn clear_faults(&self) {
        self.faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// All recorded calls, oldest first.
    pub fn calls(&self) -> Vec<PluginCall<V, N>> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Returns and forgets the recorded calls.
    pub fn take_calls(&self) -> Vec<PluginCall<V, N>> {
        std::mem::take(&mut *self.calls.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The recorded calls as (method, volume) pairs.
    pub fn call_summary(&self) -> Vec<(PluginMethod, V)> {
        self.calls()
            .into_iter()
            .map(|c| (c.method, c.volume))
            .collect()
    }

    /// How many calls of `method` were recorded.
    pub fn count(&self, method: PluginMethod) -> usize {
        self.calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|c| c.method == method)
            .count()
    }

    fn push_fault(&self, fault: Fault<V>) {
        self.faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(fault);
    }

    async fn call(
        &self,
        method: PluginMethod,
        volume: &V,
        node: Option<&N>,
        path: Option<&Path>,
    ) -> Result<(), PluginError> {
        if self.recording.load(Ordering::Relaxed) {
            self.calls
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(PluginCall {
                    method,
                    volume: volume.clone(),
                    node: node.cloned(),
                    path: path.map(Path::to_path_buf),
                });
        }
        // Delays first, then failures: one call may consume one of each.
        let (delay, kind) = {
            let mut faults = self.faults.lock().unwrap_or_else(|e| e.into_inner());
            let mut take = |want_delay: bool| {
                let fault = faults.iter_mut().find(|f| {
                    f.method == method
                        && f.volume.as_ref().is_none_or(|v| v == volume)
                        && f.remaining != Some(0)
                        && f.delay.is_some() == want_delay
                })?;
                if let Some(n) = fault.remaining.as_mut() {
                    *n -= 1;
                }
                Some((fault.delay, fault.kind))
            };
            let delay = take(true).and_then(|(d, _)| d);
            let kind = take(false).and_then(|(_, k)| k);
            faults.retain(|f| f.remaining != Some(0));
            (delay, kind)
        };
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        match kind {
            Some(kind) => Err(PluginError::new(
                kind,
                format!("injected {kind:?} failure of {method:?}"),
            )),
            None => Ok(()),
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
        self.call(PluginMethod::Attach, volume, Some(node), None)
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
        self.call(PluginMethod::WaitForAttach, volume, Some(node), None)
            .await?;
        Ok(AttachInfo {
            device_path: Some(PathBuf::from(format!("/dev/fake/{volume:?}"))),
            publish_context: Default::default(),
        })
    }

    async fn detach(&self, volume: &V, node: &N) -> Result<(), PluginError> {
        self.call(PluginMethod::Detach, volume, Some(node), None)
            .await
    }

    async fn stage(&self, request: &StageRequest<V>) -> Result<(), PluginError> {
        self.call(
            PluginMethod::Stage,
            &request.volume,
            None,
            Some(&request.staging_path),
        )
        .await
    }

    async fn unstage(&self, volume: &V, staging_path: &Path) -> Result<(), PluginError> {
        self.call(PluginMethod::Unstage, volume, None, Some(staging_path))
            .await
    }

    async fn publish(&self, request: &PublishRequest<V>) -> Result<(), PluginError> {
        self.call(
            PluginMethod::Publish,
            &request.volume,
            None,
            Some(&request.target_path),
        )
        .await
    }

    async fn unpublish(&self, volume: &V, target_path: &Path) -> Result<(), PluginError> {
        self.call(PluginMethod::Unpublish, volume, None, Some(target_path))
            .await
    }

    async fn expand(&self, request: &ExpandRequest<V>) -> Result<u64, PluginError> {
        self.call(
            PluginMethod::Expand,
            &request.volume,
            None,
            Some(&request.volume_path),
        )
        .await?;
        Ok(request.new_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn faults_apply_per_method_and_volume_and_run_out() {
        let plugin = FakeVolumePlugin::<&str, &str>::new();
        plugin.fail_times(PluginMethod::Detach, Some("a"), 2, ErrorKind::Uncertain);
        plugin.delay(PluginMethod::Detach, None, 1, Duration::from_secs(5));
        let start = tokio::time::Instant::now();
        let first = plugin.detach(&"a", &"n").await;
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        assert_eq!(first.unwrap_err().kind, ErrorKind::Uncertain);
        assert!(plugin.detach(&"b", &"n").await.is_ok());
        assert!(plugin.detach(&"a", &"n").await.is_err());
        assert!(plugin.detach(&"a", &"n").await.is_ok());
        assert_eq!(plugin.count(PluginMethod::Detach), 4);
        plugin.fail_always(PluginMethod::Stage, None, ErrorKind::Final);
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
}
