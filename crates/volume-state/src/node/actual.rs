use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::Notify;

use super::reconstruct::DiscoveredMount;
use crate::error::{ErrorKind, PluginError};
use crate::plugin::MountResult;
use crate::state_cell::StateCell;
use crate::transition::{Progress, StepOutcome, after_setup, after_teardown};
use crate::types::{AttachInfo, Key, VolumeSpec};

/// Whether a volume is attached to a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttachState {
    /// Attached (or needs no attachment).
    Attached,
    /// An attach may or may not have happened (it failed uncertainly):
    /// attach again before use, detach before forgetting.
    Uncertain,
    /// A confirmed attachment whose detach failed: maybe still attached.
    /// Like [`Uncertain`](Self::Uncertain) for its own node, but the
    /// controller does not attach a single-node volume elsewhere meanwhile.
    DetachUncertain,
    /// Not attached.
    Detached,
}

impl AttachState {
    fn progress(self) -> Progress {
        match self {
            AttachState::Attached => Progress::Done,
            AttachState::Uncertain | AttachState::DetachUncertain => Progress::Uncertain,
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

    /// The state after an attach (or verify-attached) with `outcome`.
    ///
    /// As [`after_setup`], except that a failed attach never clears
    /// [`DetachUncertain`](Self::DetachUncertain): the earlier confirmed
    /// attachment may still be there whatever this call says.
    pub fn after_attach(self, outcome: StepOutcome) -> Self {
        match (self, outcome) {
            (AttachState::DetachUncertain, StepOutcome::Failed(_)) => AttachState::DetachUncertain,
            (state, outcome) => Self::from_progress(after_setup(state.progress(), outcome)),
        }
    }

    /// The state after a detach with `outcome`
    /// ([`Detached`](Self::Detached) means forget the attachment).
    ///
    /// As [`after_teardown`], except that a failed detach of a confirmed (or
    /// already detach-uncertain) attachment becomes
    /// [`DetachUncertain`](Self::DetachUncertain).
    pub fn after_detach(self, outcome: StepOutcome) -> Self {
        match (self, outcome) {
            // The call did not start: nothing changed.
            (state, StepOutcome::Failed(ErrorKind::Transient)) => state,
            (AttachState::Attached | AttachState::DetachUncertain, StepOutcome::Failed(_)) => {
                AttachState::DetachUncertain
            }
            (state, outcome) => Self::from_progress(after_teardown(state.progress(), outcome)),
        }
    }

    /// Whether the volume is, or may still be, held by a confirmed
    /// attachment (what blocks a single-node volume elsewhere).
    pub fn may_hold(self) -> bool {
        matches!(self, AttachState::Attached | AttachState::DetachUncertain)
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
    pub(super) fn new(spec: Arc<VolumeSpec>) -> Self {
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

/// An immutable view of the actual state of world.
#[derive(Debug, Clone)]
pub struct ActualNodeSnapshot<V, P> {
    pub(super) volumes: BTreeMap<V, Arc<ActualVolume<P>>>,
    pub(super) orphans: BTreeMap<(V, P), DiscoveredMount<V, P>>,
}

impl<V: Key, P: Key> ActualNodeSnapshot<V, P> {
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

    /// Whether a discovered mount of `volume` awaits its cleanup.
    pub fn has_orphan(&self, volume: &V) -> bool {
        self.orphans.keys().any(|(v, _)| v == volume)
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
/// [`DesiredNodeState`](super::DesiredNodeState).
#[derive(Debug)]
pub struct ActualNodeState<V, P> {
    cell: StateCell<ActualNodeSnapshot<V, P>>,
}

impl<V: Key, P: Key> Default for ActualNodeState<V, P> {
    fn default() -> Self {
        Self::new()
    }
}

impl<V: Key, P: Key> ActualNodeState<V, P> {
    /// An empty actual state.
    pub fn new() -> Self {
        Self {
            cell: StateCell::new(ActualNodeSnapshot {
                volumes: BTreeMap::new(),
                orphans: BTreeMap::new(),
            }),
        }
    }

    /// The current state.
    pub fn snapshot(&self) -> Arc<ActualNodeSnapshot<V, P>> {
        self.cell.snapshot()
    }

    /// Signalled after every change.
    pub fn changed(&self) -> Arc<Notify> {
        self.cell.changed()
    }

    pub(super) fn update<T>(&self, f: impl FnOnce(&mut ActualNodeSnapshot<V, P>) -> T) -> T {
        self.cell.update(|s| (f(s), true))
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
            entry.attach = entry.attach.after_attach(StepOutcome::of(result));
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
            match entry.attach.after_detach(StepOutcome::of(result)) {
                AttachState::Detached => {
                    s.volumes.remove(volume);
                }
                state => Arc::make_mut(entry).attach = state,
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

    /// Applies a stage result; a size it reports becomes the volume's size.
    pub fn apply_stage(
        &self,
        volume: &V,
        staging_path: &Path,
        result: &Result<MountResult, PluginError>,
    ) {
        self.update_volume(volume, |entry| {
            entry.staging_path = Some(staging_path.to_path_buf());
            entry.device = match after_setup(entry.device.progress(), StepOutcome::of(result)) {
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
            learn_size(entry, result);
        })
    }

    /// Applies an unstage result; the attach info (device path) is kept.
    pub fn apply_unstage(&self, volume: &V, result: &Result<(), PluginError>) {
        self.update_volume(volume, |entry| {
            entry.device = match after_teardown(entry.device.progress(), StepOutcome::of(result)) {
                Progress::Absent => DeviceState::NotMounted,
                Progress::Uncertain => DeviceState::Uncertain,
                Progress::Done => entry.device.clone(),
            };
        })
    }

    /// Applies a publish result for `pod`; a size it reports becomes the
    /// volume's size.
    pub fn apply_publish(
        &self,
        volume: &V,
        pod: &P,
        target_path: &Path,
        result: &Result<MountResult, PluginError>,
    ) {
        self.update_volume(volume, |entry| {
            let previous = entry.pods.get(pod);
            let progress = match previous.map(|m| m.state) {
                None => Progress::Absent,
                Some(PodMountState::Uncertain) => Progress::Uncertain,
                Some(PodMountState::Mounted) => Progress::Done,
            };
            let remount_required = previous.is_some_and(|m| m.remount_required) && result.is_err();
            let state = match after_setup(progress, StepOutcome::of(result)) {
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
            learn_size(entry, result);
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
            match after_teardown(progress, StepOutcome::of(result)) {
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
}

/// Records a successful stage or publish's size: the size the plugin
/// reports, else (first mount) the spec's desired size.
fn learn_size<P>(entry: &mut ActualVolume<P>, result: &Result<MountResult, PluginError>) {
    match result {
        Ok(MountResult { size: Some(size) }) => entry.size = Some(*size),
        Ok(_) if entry.size.is_none() => entry.size = entry.spec.desired_size,
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use AttachState::*;

    #[test]
    fn attach_state_transitions_exhaustive() {
        let states = [Attached, Uncertain, DetachUncertain, Detached];
        let final_ = StepOutcome::Failed(ErrorKind::Final);
        let unsure = StepOutcome::Failed(ErrorKind::Uncertain);
        let transient = StepOutcome::Failed(ErrorKind::Transient);
        let attach = |s: AttachState, o| match (s, o) {
            (_, StepOutcome::Succeeded) => Attached,
            (DetachUncertain, _) => DetachUncertain,
            (Attached, _) => Attached,
            (s, o) if o == transient => s,
            (_, o) if o == final_ => Detached,
            _ => Uncertain,
        };
        let detach = |s: AttachState, o| match (s, o) {
            (_, StepOutcome::Succeeded) => Detached,
            (s, o) if o == transient => s,
            (Attached | DetachUncertain, _) => DetachUncertain,
            _ => Uncertain,
        };
        let mut cases = 0;
        for s in states {
            for o in StepOutcome::ALL {
                assert_eq!(s.after_attach(o), attach(s, o), "attach {s:?} {o:?}");
                assert_eq!(s.after_detach(o), detach(s, o), "detach {s:?} {o:?}");
                cases += 1;
            }
        }
        assert_eq!(cases, 16);
        // The detach cases that matter most, spelled out.
        assert_eq!(Attached.after_detach(unsure), DetachUncertain);
        assert_eq!(Uncertain.after_detach(final_), Uncertain);
        assert!(DetachUncertain.may_hold() && Attached.may_hold());
        assert!(!Uncertain.may_hold() && !Detached.may_hold());
    }

    #[test]
    fn a_reported_size_wins_and_the_spec_fills_in_only_when_unknown() {
        let spec = Arc::new(VolumeSpec {
            desired_size: Some(10),
            ..VolumeSpec::default()
        });
        let mut entry = ActualVolume::<u32>::new(spec);
        learn_size(&mut entry, &Err(PluginError::final_error("x")));
        assert_eq!(entry.size, None);
        learn_size(&mut entry, &Ok(MountResult::default()));
        assert_eq!(entry.size, Some(10));
        learn_size(&mut entry, &Ok(MountResult::with_size(8)));
        assert_eq!(entry.size, Some(8));
        learn_size(&mut entry, &Ok(MountResult::default()));
        assert_eq!(entry.size, Some(8));
    }
}
