use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::Notify;

use crate::error::{ErrorKind, PluginError};
use crate::journal::VolumeIntent;
use crate::mounts::{MountEvidence, MountTable};
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
/// scanner, e.g. mount-utils), with what is actually mounted at its paths.
///
/// Build it with [`DiscoveredMount::new`] and say what you know:
/// [`checked`](Self::checked) looks both paths up in a [`MountTable`], so
/// reconstruction can compare what is mounted with what the journal
/// recorded; [`verified`](Self::verified) vouches for the mounts yourself.
/// An unchecked mount is trusted for nothing: it is staged and published
/// again, and its volume attached again.
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
    /// The device path, if known; used only when a mount proves the volume
    /// still attached.
    pub device_path: Option<PathBuf>,
    /// What is mounted at `target_path`.
    pub target: MountEvidence,
    /// What is mounted at the staging path (the discovered one, else the
    /// spec's).
    pub staging: MountEvidence,
}

impl<V, P> DiscoveredMount<V, P> {
    /// A mount of `volume` for `pod` at `target_path`, nothing checked.
    pub fn new(volume: V, pod: P, target_path: impl Into<PathBuf>) -> Self {
        Self {
            volume,
            pod,
            target_path: target_path.into(),
            staging_path: None,
            device_path: None,
            target: MountEvidence::Unchecked,
            staging: MountEvidence::Unchecked,
        }
    }

    /// The volume looks staged at `path`.
    pub fn with_staging_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.staging_path = Some(path.into());
        self
    }

    /// The device path the scanner found.
    pub fn with_device_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.device_path = Some(path.into());
        self
    }

    /// Looks up what is mounted at the target and staging paths.
    pub fn checked(mut self, table: &dyn MountTable) -> Self {
        self.target = MountEvidence::of(table, &self.target_path);
        if let Some(path) = &self.staging_path {
            self.staging = MountEvidence::of(table, path);
        }
        self
    }

    /// The caller verified that this volume is mounted at both paths: it
    /// is not staged or published again.
    pub fn verified(mut self) -> Self {
        self.target = MountEvidence::Verified;
        self.staging = MountEvidence::Verified;
        self
    }
}

/// What [`ActualNodeState::reconstruct`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReconstructionReport {
    /// Pod mounts added (uncertain unless verified).
    pub reconstructed: usize,
    /// Pod mounts trusted as mounted: verified, or the same source as the
    /// journal recorded.
    pub verified: usize,
    /// Paths where something else than the journal recorded is mounted
    /// (another volume): never used as this volume's mount.
    pub mismatched: usize,
    /// Volumes known only from the journal (no mount found), e.g. staged
    /// with no pod left: torn down if unwanted.
    pub from_journal: usize,
    /// Mounts without metadata or journal record, to be cleaned up once.
    pub orphans: usize,
}

/// An immutable view of the actual state of world.
#[derive(Debug, Clone)]
pub struct ActualNodeSnapshot<V, P> {
    volumes: BTreeMap<V, Arc<ActualVolume<P>>>,
    orphans: BTreeMap<(V, P), DiscoveredMount<V, P>>,
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

    fn update<T>(&self, f: impl FnOnce(&mut ActualNodeSnapshot<V, P>) -> T) -> T {
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

    /// Rebuilds state after a restart from mounts found on disk; see
    /// [`reconstruct_with_journal`](Self::reconstruct_with_journal), here
    /// without a journal.
    pub fn reconstruct(
        &self,
        mounts: impl IntoIterator<Item = DiscoveredMount<V, P>>,
        metadata: impl FnMut(&V) -> Option<VolumeSpec>,
    ) -> ReconstructionReport {
        self.reconstruct_with_journal(mounts, &BTreeMap::new(), metadata)
    }

    /// Rebuilds state after a restart from mounts found on disk and the
    /// [journal](crate::journal) of the previous run. Call it before the
    /// reconciler runs; volumes already in the actual state are left as
    /// they are.
    ///
    /// `metadata` returns the spec saved for a volume (e.g. the driver's
    /// per-volume JSON); without it, a journal record still gives what
    /// tear-down needs (staging path, whether to detach).
    ///
    /// - A volume with a mount of its own (verified, or whose source the
    ///   journal confirms, or a mount the journal has no source for) is
    ///   still attached: it is marked attached, with the journal's attach
    ///   info, and not attached again.
    /// - A mount is trusted as mounted only if verified or if the journal
    ///   recorded the same source for the path; a staged volume's pod mount
    ///   also needs its staging mount trusted. Anything else is uncertain:
    ///   staged and published again if wanted, torn down once the desired
    ///   state is populated if not. A path where another source is mounted
    ///   is counted as mismatched and never used; nothing is published
    ///   before the volume is staged again.
    /// - Journal records no mount was found for (e.g. staged, last pod
    ///   unpublished, then a restart) become uncertain state, so the
    ///   unstage and detach still happen.
    /// - Mounts with neither metadata nor a journal record become orphans,
    ///   unmounted once.
    pub fn reconstruct_with_journal(
        &self,
        mounts: impl IntoIterator<Item = DiscoveredMount<V, P>>,
        journal: &BTreeMap<V, VolumeIntent<P>>,
        mut metadata: impl FnMut(&V) -> Option<VolumeSpec>,
    ) -> ReconstructionReport {
        let mut report = ReconstructionReport::default();
        let mut found: BTreeMap<V, Vec<DiscoveredMount<V, P>>> = BTreeMap::new();
        for mount in mounts {
            found.entry(mount.volume.clone()).or_default().push(mount);
        }
        for volume in journal.keys() {
            found.entry(volume.clone()).or_default();
        }
        self.update(|s| {
            for (volume, mounts) in found {
                // Already known (e.g. set up since the start): leave it.
                if s.volumes.contains_key(&volume) {
                    continue;
                }
                let record = journal.get(&volume);
                let spec = metadata(&volume)
                    .or_else(|| record.map(fallback_spec))
                    .map(Arc::new);
                let Some(spec) = spec else {
                    for mount in mounts {
                        report.orphans += 1;
                        s.orphans
                            .insert((mount.volume.clone(), mount.pod.clone()), mount);
                    }
                    continue;
                };
                if mounts.is_empty() {
                    report.from_journal += 1;
                }
                let rebuilt = rebuild(&spec, &mounts, record, &mut report);
                s.volumes.insert(volume, Arc::new(rebuilt));
            }
        });
        report
    }
}

/// Enough of a spec to tear down what a journal record says is owed.
fn fallback_spec<P>(record: &VolumeIntent<P>) -> VolumeSpec {
    VolumeSpec {
        attachable: record.attached,
        staging_path: record.staging_path.clone(),
        ..VolumeSpec::default()
    }
}

/// One volume's reconstructed state from its discovered mounts and record.
fn rebuild<V: Key, P: Key>(
    spec: &Arc<VolumeSpec>,
    mounts: &[DiscoveredMount<V, P>],
    record: Option<&VolumeIntent<P>>,
    report: &mut ReconstructionReport,
) -> ActualVolume<P> {
    let mut entry = ActualVolume::new(spec.clone());
    let staged_source = record.and_then(|r| r.staged.as_ref());
    let recorded_staging = record.and_then(|r| r.staging_path.clone());
    let staging_path = if mounts.is_empty() {
        // Known only from the journal: staged only if it says so.
        recorded_staging
    } else {
        mounts
            .iter()
            .find_map(|m| m.staging_path.clone())
            .or(recorded_staging)
            .or_else(|| spec.staging_path.clone())
    };
    let staged = staging_path.is_some();

    // Trusted only if every scan that looked at the staging path agrees.
    let staging_checks = || mounts.iter().map(|m| &m.staging);
    let staging_verified = staged
        && staging_checks().any(|c| c.is_verified(staged_source))
        && !staging_checks().any(|c| c.is_absent(staged_source));
    report.mismatched += staging_checks()
        .filter(|c| c.is_mismatch(staged_source))
        .count()
        .min(1);

    let mut evidence = staging_verified;
    for mount in mounts {
        let recorded = record
            .and_then(|r| r.pods.get(&mount.pod))
            .and_then(|p| p.source.as_ref());
        if mount.target.is_mismatch(recorded) {
            report.mismatched += 1;
            tracing::warn!(path = %mount.target_path.display(), "another source is mounted than the journal recorded; not used");
        }
        let is_mount = matches!(
            mount.target,
            MountEvidence::Verified | MountEvidence::Mounted(_)
        ) && !mount.target.is_absent(recorded);
        evidence |= is_mount;
        let mounted = mount.target.is_verified(recorded) && (!staged || staging_verified);
        report.reconstructed += 1;
        report.verified += usize::from(mounted);
        entry.pods.insert(
            mount.pod.clone(),
            PodMount {
                state: if mounted {
                    PodMountState::Mounted
                } else {
                    PodMountState::Uncertain
                },
                target_path: mount.target_path.clone(),
                remount_required: false,
            },
        );
    }
    // Publishes the journal knows of but the scan did not find.
    for (pod, publish) in record.map(|r| &r.pods).into_iter().flatten() {
        entry.pods.entry(pod.clone()).or_insert_with(|| PodMount {
            state: PodMountState::Uncertain,
            target_path: publish.target_path.clone(),
            remount_required: false,
        });
    }

    // Attached only if a mount proves it: after a reboot the pod
    // directories remain but the device may be gone or renamed.
    entry.attach = if !spec.attachable || evidence {
        AttachState::Attached
    } else {
        AttachState::Uncertain
    };
    if let Some(info) = record.and_then(|r| r.attach_info.as_ref()) {
        entry.attach_info = Arc::new(info.clone());
    } else if evidence && let Some(device_path) = mounts.iter().find_map(|m| m.device_path.clone())
    {
        entry.attach_info = Arc::new(AttachInfo {
            device_path: Some(device_path),
            ..AttachInfo::default()
        });
    }
    if staged {
        entry.staging_path = staging_path.clone();
        entry.device = match staging_path {
            Some(staging_path) if staging_verified => DeviceState::Mounted {
                device_path: entry.attach_info.device_path.clone(),
                staging_path,
            },
            _ => DeviceState::Uncertain,
        };
    }
    entry
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
