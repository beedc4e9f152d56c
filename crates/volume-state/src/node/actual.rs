use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use tokio::sync::Notify;

use crate::error::PluginError;
use crate::transition::{Outcome, Progress, after_setup, after_teardown};
use crate::types::{AttachInfo, Key, VolumeSpec};

/// Whether a volume is attached to this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttachState {
    /// Attached (or needs no attachment).
    Attached,
    /// Maybe attached: attach again before use, detach before forgetting.
    Uncertain,
    /// Not attached.
    Detached,
}

impl AttachState {
    fn progress(self) -> Progress {
        match self {
            AttachState::Attached => Progress::Done,
            AttachState::Uncertain => Progress::Uncertain,
            AttachState::Detached => Progress::Absent,
        }
    }

    fn from_progress(p: Progress) -> Self {
        match p {
            Progress::Done => AttachState::Attached,
            Progress::Uncertain => AttachState::Uncertain,
            Progress::Absent => AttachState::Detached,
        }
    }
}

/// Whether the device is staged (globally mounted).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DeviceState {
    /// Not staged.
    NotMounted,
    /// Maybe staged: stage again before use, unstage before forgetting.
    Uncertain,
    /// Staged.
    Mounted {
        /// Device path used for staging, if known.
        device_path: Option<PathBuf>,
        /// Where it is staged.
        staging_path: PathBuf,
    },
}

impl DeviceState {
    fn progress(&self) -> Progress {
        match self {
            DeviceState::NotMounted => Progress::Absent,
            DeviceState::Uncertain => Progress::Uncertain,
            DeviceState::Mounted { .. } => Progress::Done,
        }
    }
}

/// Per-pod publish state; a pod without an entry is not mounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PodMountState {
    /// Maybe mounted.
    Uncertain,
    /// Mounted.
    Mounted,
}

/// A pod's mount of a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodMount {
    /// Mounted or uncertain.
    pub state: PodMountState,
    /// The pod's target path.
    pub target_path: PathBuf,
    /// Publish must run again (e.g. after a spec change) even though mounted.
    pub remount_required: bool,
}

/// What is known to be done for one volume on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActualVolume<P> {
    /// The spec the volume was set up with.
    pub spec: Arc<VolumeSpec>,
    /// Attachment.
    pub attach: AttachState,
    /// What the last successful attach reported; kept when the device is
    /// unstaged so a later stage can reuse the device path.
    pub attach_info: Arc<AttachInfo>,
    /// Device (stage) state.
    pub device: DeviceState,
    /// Last staging path used; needed to unstage an uncertain device.
    pub staging_path: Option<PathBuf>,
    /// Pods with the volume mounted or maybe mounted.
    pub pods: BTreeMap<P, PodMount>,
    /// Filesystem size as last staged or expanded, if known.
    pub size: Option<u64>,
}

impl<P> ActualVolume<P> {
    fn new(spec: Arc<VolumeSpec>) -> Self {
        Self {
            spec,
            attach: AttachState::Detached,
            attach_info: Arc::default(),
            device: DeviceState::NotMounted,
            staging_path: None,
            pods: BTreeMap::new(),
            size: None,
        }
    }
}

/// A mount found on disk after a restart (convert from your mount table
/// scanner, e.g. mount-utils).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveredMount<V, P> {
    /// The volume.
    pub volume: V,
    /// The pod whose directory holds the mount.
    pub pod: P,
    /// The pod's target path.
    pub target_path: PathBuf,
    /// The staging path, if the volume looks staged.
    pub staging_path: Option<PathBuf>,
    /// The device path, if known.
    pub device_path: Option<PathBuf>,
}

/// What [`ActualStateOfWorld::reconstruct`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReconstructionReport {
    /// Pod mounts added as uncertain.
    pub reconstructed: usize,
    /// Mounts without metadata, to be cleaned up once.
    pub orphans: usize,
}

/// An immutable view of the actual state of world.
#[derive(Debug, Clone)]
pub struct ActualSnapshot<V, P> {
    volumes: BTreeMap<V, Arc<ActualVolume<P>>>,
    orphans: BTreeMap<(V, P), DiscoveredMount<V, P>>,
}

impl<V: Key, P: Key> ActualSnapshot<V, P> {
    /// Volumes with any state on this node, in key order.
    pub fn volumes(&self) -> impl Iterator<Item = (&V, &ActualVolume<P>)> {
        self.volumes.iter().map(|(v, a)| (v, a.as_ref()))
    }

    /// One volume.
    pub fn get(&self, volume: &V) -> Option<&ActualVolume<P>> {
        self.volumes.get(volume).map(Arc::as_ref)
    }

    /// A pod's mount of a volume.
    pub fn pod_mount(&self, volume: &V, pod: &P) -> Option<&PodMount> {
        self.get(volume)?.pods.get(pod)
    }

    /// Discovered mounts that could not be reconstructed and are not yet cleaned.
    pub fn orphans(&self) -> impl Iterator<Item = &DiscoveredMount<V, P>> {
        self.orphans.values()
    }

    /// Number of volumes.
    pub fn len(&self) -> usize {
        self.volumes.len()
    }

    /// Whether nothing is attached, staged, published or orphaned.
    pub fn is_empty(&self) -> bool {
        self.volumes.is_empty() && self.orphans.is_empty()
    }
}

/// What is attached, staged and published on this node (kubelet's actual
/// state of world). Change it only through the updater methods.
///
/// Thread-safe, with copy-on-write `Arc` snapshots like
/// [`DesiredStateOfWorld`](super::DesiredStateOfWorld).
#[derive(Debug)]
pub struct ActualStateOfWorld<V, P> {
    state: RwLock<Arc<ActualSnapshot<V, P>>>,
    changed: Arc<Notify>,
}

impl<V: Key, P: Key> Default for ActualStateOfWorld<V, P> {
    fn default() -> Self {
        Self::new()
    }
}

impl<V: Key, P: Key> ActualStateOfWorld<V, P> {
    /// An empty actual state.
    pub fn new() -> Self {
        Self {
            state: RwLock::new(Arc::new(ActualSnapshot {
                volumes: BTreeMap::new(),
                orphans: BTreeMap::new(),
            })),
            changed: Arc::new(Notify::new()),
        }
    }

    /// The current state.
    pub fn snapshot(&self) -> Arc<ActualSnapshot<V, P>> {
        self.state.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Signalled after every change.
    pub fn changed(&self) -> Arc<Notify> {
        self.changed.clone()
    }

    fn update<T>(&self, f: impl FnOnce(&mut ActualSnapshot<V, P>) -> T) -> T {
        let mut guard = self.state.write().unwrap_or_else(|e| e.into_inner());
        let out = f(Arc::make_mut(&mut guard));
        drop(guard);
        self.changed.notify_one();
        out
    }

    fn update_volume(&self, volume: &V, f: impl FnOnce(&mut ActualVolume<P>)) {
        self.update(|s| {
            if let Some(entry) = s.volumes.get_mut(volume) {
                f(Arc::make_mut(entry));
            }
        })
    }

    /// Applies an attach or verify-attached result.
    pub fn apply_attach(
        &self,
        volume: &V,
        spec: &Arc<VolumeSpec>,
        result: &Result<AttachInfo, PluginError>,
    ) {
        self.update(|s| {
            let entry = s
                .volumes
                .entry(volume.clone())
                .or_insert_with(|| Arc::new(ActualVolume::new(spec.clone())));
            let entry = Arc::make_mut(entry);
            entry.attach = AttachState::from_progress(after_setup(
                entry.attach.progress(),
                Outcome::of(result),
            ));
            if let Ok(info) = result {
                entry.attach_info = Arc::new(info.clone());
                entry.spec = spec.clone();
            }
        })
    }

    /// Marks a volume that needs no attach as attached.
    pub fn mark_attached(&self, volume: &V, spec: &Arc<VolumeSpec>) {
        self.apply_attach(volume, spec, &Ok(AttachInfo::default()))
    }

    /// Applies a detach result; a detached volume is forgotten.
    pub fn apply_detach(&self, volume: &V, result: &Result<(), PluginError>) {
        self.update(|s| {
            let Some(entry) = s.volumes.get_mut(volume) else {
                return;
            };
            match after_teardown(entry.attach.progress(), Outcome::of(result)) {
                Progress::Absent => {
                    s.volumes.remove(volume);
                }
                p => Arc::make_mut(entry).attach = AttachState::from_progress(p),
            }
        })
    }

    /// Forgets a volume without a plugin call (not attachable, or attached
    /// by the controller).
    pub fn mark_detached(&self, volume: &V) {
        self.update(|s| {
            s.volumes.remove(volume);
        })
    }

    /// Applies a stage result.
    pub fn apply_stage(&self, volume: &V, staging_path: &Path, result: &Result<(), PluginError>) {
        self.update_volume(volume, |entry| {
            entry.staging_path = Some(staging_path.to_path_buf());
            entry.device = match after_setup(entry.device.progress(), Outcome::of(result)) {
                Progress::Done => match &entry.device {
                    // A failed re-stage keeps the existing mount as it is.
                    mounted @ DeviceState::Mounted { .. } if result.is_err() => mounted.clone(),
                    _ => DeviceState::Mounted {
                        device_path: entry.attach_info.device_path.clone(),
                        staging_path: staging_path.to_path_buf(),
                    },
                },
                Progress::Uncertain => DeviceState::Uncertain,
                Progress::Absent => DeviceState::NotMounted,
            };
            if result.is_ok() && entry.size.is_none() {
                entry.size = entry.spec.desired_size;
            }
        })
    }

    /// Applies an unstage result; the attach info (device path) is kept.
    pub fn apply_unstage(&self, volume: &V, result: &Result<(), PluginError>) {
        self.update_volume(volume, |entry| {
            entry.device = match after_teardown(entry.device.progress(), Outcome::of(result)) {
                Progress::Absent => DeviceState::NotMounted,
                Progress::Uncertain => DeviceState::Uncertain,
                Progress::Done => entry.device.clone(),
            };
        })
    }

    /// Applies a publish result for `pod`.
    pub fn apply_publish(
        &self,
        volume: &V,
        pod: &P,
        target_path: &Path,
        result: &Result<(), PluginError>,
    ) {
        self.update_volume(volume, |entry| {
            let previous = entry.pods.get(pod);
            let progress = match previous.map(|m| m.state) {
                None => Progress::Absent,
                Some(PodMountState::Uncertain) => Progress::Uncertain,
                Some(PodMountState::Mounted) => Progress::Done,
            };
            let remount_required = previous.is_some_and(|m| m.remount_required) && result.is_err();
            let state = match after_setup(progress, Outcome::of(result)) {
                Progress::Absent => None,
                Progress::Uncertain => Some(PodMountState::Uncertain),
                Progress::Done => Some(PodMountState::Mounted),
            };
            match state {
                Some(state) => {
                    entry.pods.insert(
                        pod.clone(),
                        PodMount {
                            state,
                            target_path: target_path.to_path_buf(),
                            remount_required,
                        },
                    );
                }
                None => {
                    entry.pods.remove(pod);
                }
            }
            if result.is_ok() && entry.size.is_none() {
                entry.size = entry.spec.desired_size;
            }
        })
    }

    /// Applies an unpublish result for `pod`.
    pub fn apply_unpublish(&self, volume: &V, pod: &P, result: &Result<(), PluginError>) {
        self.update_volume(volume, |entry| {
            let Some(mount) = entry.pods.get_mut(pod) else {
                return;
            };
            let progress = match mount.state {
                PodMountState::Uncertain => Progress::Uncertain,
                PodMountState::Mounted => Progress::Done,
            };
            match after_teardown(progress, Outcome::of(result)) {
                Progress::Absent => {
                    entry.pods.remove(pod);
                }
                Progress::Uncertain => mount.state = PodMountState::Uncertain,
                Progress::Done => {}
            }
        })
    }

    /// Applies an expand result: on success the new size is recorded.
    pub fn apply_expand(&self, volume: &V, result: &Result<u64, PluginError>) {
        if let Ok(size) = result {
            self.update_volume(volume, |entry| entry.size = Some(*size));
        }
    }

    /// Requires publish to run again for every pod of `volume`.
    pub fn mark_remount_required(&self, volume: &V) {
        self.update_volume(volume, |entry| {
            for mount in entry.pods.values_mut() {
                mount.remount_required = true;
            }
        })
    }

    /// Forgets an orphan (cleaned once, whatever the result).
    pub fn forget_orphan(&self, volume: &V, pod: &P) {
        self.update(|s| {
            s.orphans.remove(&(volume.clone(), pod.clone()));
        })
    }

    /// Rebuilds state after a restart from mounts found on disk.
    ///
    /// `metadata` returns the spec saved for a volume (e.g. the driver's
    /// per-volume JSON). Everything reconstructed is uncertain, so the
    /// reconciler re-runs attach, stage and publish for pods still wanted and
    /// tears down the rest once the desired state is populated. Mounts without
    /// metadata become orphans, unmounted once.
    pub fn reconstruct(
        &self,
        mounts: impl IntoIterator<Item = DiscoveredMount<V, P>>,
        mut metadata: impl FnMut(&V) -> Option<VolumeSpec>,
    ) -> ReconstructionReport {
        let mut report = ReconstructionReport::default();
        let mut specs: BTreeMap<V, Option<Arc<VolumeSpec>>> = BTreeMap::new();
        self.update(|s| {
            for mount in mounts {
                let spec = specs
                    .entry(mount.volume.clone())
                    .or_insert_with(|| metadata(&mount.volume).map(Arc::new))
                    .clone();
                let Some(spec) = spec else {
                    report.orphans += 1;
                    s.orphans
                        .insert((mount.volume.clone(), mount.pod.clone()), mount);
                    continue;
                };
                report.reconstructed += 1;
                let entry = s
                    .volumes
                    .entry(mount.volume.clone())
                    .or_insert_with(|| Arc::new(ActualVolume::new(spec.clone())));
                let entry = Arc::make_mut(entry);
                entry.attach = if spec.attachable {
                    AttachState::Uncertain
                } else {
                    AttachState::Attached
                };
                if mount.device_path.is_some() {
                    let mut info = (*entry.attach_info).clone();
                    info.device_path = mount.device_path.clone();
                    entry.attach_info = Arc::new(info);
                }
                let staging_path = mount
                    .staging_path
                    .clone()
                    .or_else(|| spec.staging_path.clone());
                if spec.device_mountable() || mount.staging_path.is_some() {
                    entry.device = DeviceState::Uncertain;
                    entry.staging_path = staging_path;
                }
                entry.pods.insert(
                    mount.pod,
                    PodMount {
                        state: PodMountState::Uncertain,
                        target_path: mount.target_path,
                        remount_required: false,
                    },
                );
            }
        });
        report
    }
}
