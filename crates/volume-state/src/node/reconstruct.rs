//! Rebuilding the node's actual state after a restart, from the mounts
//! found on disk and the journal of the previous run.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use super::actual::{
    ActualNodeState, ActualVolume, AttachState, DeviceState, PodMount, PodMountState,
};
use crate::journal::VolumeIntent;
use crate::mounts::{MountEvidence, MountTable};
use crate::types::{AttachInfo, Key, VolumeSpec};

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

impl<V: Key, P: Key> ActualNodeState<V, P> {
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
    // The size the node confirmed, not the spec's: the spec carries what
    // is wanted now, which an interrupted expansion has not reached.
    entry.size = record.and_then(|r| r.size);
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
