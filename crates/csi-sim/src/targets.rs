//! The library's own services as a target: csi-controller's engine and
//! csi-node's node service over a directory-volume driver (the README's
//! walkthrough) on the world's fakes. The only file that constructs those
//! services, so their renames change this file alone. And the standard
//! workloads as another driver runs them ([`workloads_for`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use csi_controller::{
    AttachBackend, AttachState, BackendError, BackendResult, Config, ControllerBackend,
    ControllerService, DataOnDisk, ExpandBackend, GroupSnapshotBackend, IdKind, SnapshotBackend,
    SnapshotRecord, VolumeRecord,
};
use csi_driver::clock::FakeClock;
use csi_driver::{CsiError, CsiResult, async_trait};
use csi_node::{
    NodeBackend, NodeInfo, NodeService, RestoreReport, VolumeInfo, VolumeLocator, VolumeSource,
};
use csi_store::FileStore;
use mount_utils::{LoopDevices, Mounter};

use crate::runner::{DataView, Services, SimReport, SimRunner};
use crate::workload::{Call, Content, SimWorkload, workloads};
use crate::world::{ProviderFault, SimFault, World};
use crate::wrap::{SimLoops, SimMounter};

/// The node id of the simulated node.
pub const NODE_ID: &str = "node-1";

/// The Retry-After of a throttled provider call.
pub const THROTTLED_FOR: Duration = Duration::from_secs(1);

/// Directory volumes kept by a simulated storage provider: each call to it
/// is one step (it happens whole or not at all, and may fail as a
/// provider's call does), and its data outlives any crash of the driver. Every volume and snapshot directory
/// holds an `owner` file naming the id it was made for, so data showing
/// through another id's path is seen.
#[derive(Clone)]
pub struct SimDirs {
    world: World,
    generation: u64,
    root: PathBuf,
}

impl SimDirs {
    /// The provider as the world's current process reaches it.
    pub fn new(world: &World) -> Self {
        let root = world.host_dir().join("provider");
        for kind in ["volumes", "snapshots"] {
            let _ = std::fs::create_dir_all(root.join(kind));
        }
        SimDirs {
            world: world.clone(),
            generation: world.generation(),
            root,
        }
    }

    fn dir(&self, kind: &str, id: &str) -> PathBuf {
        self.root.join(kind).join(id)
    }

    /// One provider call whose change is `effect`: made unless the call
    /// fails before it; a failed call is transient (the CO retries).
    fn call<T>(&self, what: &str, effect: impl FnOnce() -> CsiResult<T>) -> BackendResult<T> {
        match self.world.provider_call(self.generation, what) {
            Ok(None) => Ok(effect()?),
            Ok(Some(fault)) => {
                if fault.applied() {
                    // Only the answer is lost.
                    let _ = effect();
                }
                let retry_after = (fault == ProviderFault::Throttled).then_some(THROTTLED_FOR);
                Err(BackendError::Transient {
                    message: format!("{what}: {}", SimFault::Provider(fault)),
                    retry_after,
                })
            }
            Err(e) => Err(CsiError::from(std::io::Error::from_raw_os_error(e as i32)).into()),
        }
    }

    /// Makes the directory; one already made for `id` (by a call whose
    /// answer was lost) is the same volume.
    fn make(&self, kind: &str, id: &str) -> CsiResult<()> {
        let dir = self.dir(kind, id);
        if std::fs::read_to_string(dir.join("owner")).is_ok_and(|owner| owner == id) {
            return Ok(());
        }
        std::fs::create_dir(&dir)
            .and_then(|()| std::fs::write(dir.join("owner"), id))
            .map_err(|e| csi_controller::io_failure("creating", &dir, e))
    }

    fn remove(&self, kind: &str, id: &str) -> CsiResult<bool> {
        csi_controller::remove_path(&self.dir(kind, id))
    }

    /// Makes a volume or snapshot (`kind` is its directory); a failed call
    /// may have made it all the same (a timeout after the provider did),
    /// so it is deleted again: a failed create leaves nothing behind.
    fn create(&self, kind: &str, id: &str) -> BackendResult<()> {
        self.call(&format!("create {kind}/{id}"), || self.make(kind, id))
            .inspect_err(|_| {
                // Fails only in a process that crashed: its restart sweeps.
                let _ = self.call(&format!("delete {kind}/{id}"), || self.remove(kind, id));
            })
    }

    fn owners(&self, kind: &str) -> BTreeMap<String, String> {
        let Ok(entries) = std::fs::read_dir(self.root.join(kind)) else {
            return BTreeMap::new();
        };
        entries
            .flatten()
            .map(|e| {
                let owner = std::fs::read_to_string(e.path().join("owner")).unwrap_or_default();
                (e.file_name().to_string_lossy().into_owned(), owner)
            })
            .collect()
    }
}

impl DataView for SimDirs {
    fn volumes(&self) -> BTreeMap<String, String> {
        self.owners("volumes")
    }
    fn snapshots(&self) -> BTreeMap<String, String> {
        self.owners("snapshots")
    }
}

#[async_trait]
impl ControllerBackend for SimDirs {
    async fn create_volume(&self, v: &mut VolumeRecord) -> BackendResult<()> {
        self.create("volumes", &v.id)
    }
    async fn delete_volume(&self, id: &str) -> BackendResult<bool> {
        self.call(&format!("delete volumes/{id}"), || {
            self.remove("volumes", id)
        })
    }
    fn snapshots(&self) -> Option<&dyn SnapshotBackend> {
        Some(self)
    }
    fn expansion(&self) -> Option<&dyn ExpandBackend> {
        Some(self)
    }
    fn group_snapshots(&self) -> Option<&dyn GroupSnapshotBackend> {
        Some(self)
    }
    fn attacher(&self) -> Option<&dyn AttachBackend> {
        Some(self)
    }
    fn clones_volumes(&self) -> bool {
        true
    }
    fn data(&self) -> DataOnDisk {
        let mut data = DataOnDisk::default();
        for (kind, id_kind) in [("volumes", IdKind::Volume), ("snapshots", IdKind::Snapshot)] {
            let (ours, foreign) = csi_controller::data_by_id(&self.root.join(kind), id_kind, &[""]);
            data.foreign.extend(foreign);
            match kind {
                "volumes" => data.volumes = ours,
                _ => data.snapshots = ours,
            }
        }
        data
    }
    fn free_space(&self) -> Option<i64> {
        Some(1 << 40)
    }
}

#[async_trait]
impl SnapshotBackend for SimDirs {
    async fn create_snapshot(&self, s: &mut SnapshotRecord) -> BackendResult<()> {
        self.create("snapshots", &s.id)
    }
    async fn delete_snapshot(&self, id: &str) -> BackendResult<bool> {
        self.call(&format!("delete snapshots/{id}"), || {
            self.remove("snapshots", id)
        })
    }
}

#[async_trait]
impl ExpandBackend for SimDirs {
    async fn expand_volume(&self, v: &VolumeRecord, size: i64) -> BackendResult<()> {
        self.call(&format!("expand volume {} to {size}", v.id), || Ok(()))
    }
}

#[async_trait]
impl GroupSnapshotBackend for SimDirs {
    async fn cut_group(&self, members: &[(SnapshotRecord, VolumeRecord)]) -> BackendResult<()> {
        let remove_all = || {
            for (snap, _) in members {
                self.remove("snapshots", &snap.id)?;
            }
            Ok(())
        };
        let cut = self.call(&format!("cut group of {} members", members.len()), || {
            for (snap, _) in members {
                if let Err(e) = self.make("snapshots", &snap.id) {
                    let _ = remove_all();
                    return Err(e);
                }
            }
            Ok(())
        });
        // As in create: a lost answer may hide a cut that was made.
        cut.inspect_err(|_| {
            let _ = self.call("delete the group's members", remove_all);
        })
    }
}

/// Attachments are only recorded (the data is on the node already).
#[async_trait]
impl AttachBackend for SimDirs {
    async fn attach(&self, _: &VolumeRecord, _: &str, _: bool) -> BackendResult<AttachState> {
        Ok(AttachState::Attached(Default::default()))
    }
    async fn detach(&self, _: &str, _: &str) -> BackendResult<()> {
        Ok(())
    }
}

impl VolumeLocator for SimDirs {
    fn source(&self, id: &str) -> Option<VolumeSource> {
        let dir = self.dir("volumes", id);
        (IdKind::Volume.is_valid(id) && dir.is_dir()).then_some(VolumeSource::Directory(dir))
    }
}

impl NodeBackend for SimDirs {
    fn volume(&self, id: &str) -> Option<VolumeInfo> {
        self.source(id).map(|_| VolumeInfo::new(false, 0))
    }
}

/// csi-controller's defaults with a clock that never waits: a retry's
/// backoff costs no real time.
pub fn config(node_id: &str) -> Config {
    let mut config = Config::new(node_id);
    config.clock = Arc::new(FakeClock::default());
    config
}

/// A driver's data as its controller backend lists it
/// ([`ControllerBackend::data`]): each id's data is its own, and an entry
/// no id owns shows as data of its path, so the checks report it. A mount
/// of a loop device shows the volume whose data is the device's backing
/// file; any other mount the last component of its root.
pub struct BackendData<B> {
    backend: B,
    world: World,
}

impl<B: ControllerBackend> BackendData<B> {
    /// `backend`'s data, with the loop devices of `world`.
    pub fn new(backend: B, world: &World) -> Self {
        BackendData {
            backend,
            world: world.clone(),
        }
    }

    fn by_id(found: Vec<(String, PathBuf)>, foreign: &[PathBuf]) -> BTreeMap<String, String> {
        let paths = foreign.iter().map(|p| p.display().to_string());
        (found.into_iter().map(|(id, path)| match id.as_str() {
            "" => path.display().to_string(),
            _ => id,
        }))
        .chain(paths)
        .map(|id| (id.clone(), id))
        .collect()
    }

    fn volume_of_file(&self, file: &Path) -> Option<String> {
        let volumes = self.backend.data().volumes;
        volumes
            .into_iter()
            .find(|(_, p)| p == file)
            .map(|(id, _)| id)
    }
}

impl<B: ControllerBackend> DataView for BackendData<B> {
    fn volumes(&self) -> BTreeMap<String, String> {
        let data = self.backend.data();
        Self::by_id(data.volumes, &data.foreign)
    }
    fn snapshots(&self) -> BTreeMap<String, String> {
        Self::by_id(self.backend.data().snapshots, &[])
    }
    fn volume_at(&self, mount: &mount_utils::MountInfo) -> Option<String> {
        match self.world.loops().info(Path::new(&mount.source)) {
            Ok(Some(device)) => self.volume_of_file(&device.backing_file),
            _ => Some(mount.root.file_name()?.to_string_lossy().into_owned()),
        }
    }
    fn loop_volume(&self, device: &mount_utils::LoopDeviceInfo) -> Option<String> {
        self.volume_of_file(&device.backing_file)
    }
    fn declared(&self) -> Option<Declared> {
        Some(declared_by(&self.backend))
    }
}

/// What a controller over `backend` declares: CLONE_VOLUME, group
/// snapshots and PUBLISH_UNPUBLISH_VOLUME, as csi-controller's service
/// derives them from the backend.
pub fn declared_by<B: ControllerBackend + ?Sized>(backend: &B) -> Declared {
    Declared {
        clones: backend.clones_volumes(),
        group_snapshots: backend.group_snapshots().is_some(),
        attaches: backend.attacher().is_some(),
    }
}

/// A target's start fails unless the node's restore after the crash
/// brought back every volume: an abnormal one is what the run is there to
/// find.
pub fn all_restored(report: RestoreReport) -> Result<(), String> {
    if report.abnormal.is_empty() {
        Ok(())
    } else {
        Err(format!("abnormal after restore: {:?}", report.abnormal))
    }
}

/// Starts the library's services on `world` as a driver's main would:
/// the engine on its state directory with the startup sweep, the node
/// service on its own with the restore of what was staged and published.
pub async fn library(world: &World) -> Result<Services, String> {
    let dirs = Arc::new(SimDirs::new(world));
    let fs = world.fs().handle();
    let store = FileStore::open_on(fs.clone(), "/state/controller").map_err(|e| e.to_string())?;
    let engine = ControllerService::with_store(Arc::new(store), config(NODE_ID), dirs.clone())?;
    engine.reconcile().await.map_err(|e| e.to_string())?;
    let node_store = FileStore::open_on(fs, "/state/node").map_err(|e| e.to_string())?;
    let mounter: Arc<dyn Mounter> = Arc::new(SimMounter::new(world));
    // Every device seam is the world's: nothing reads the host's /dev.
    let (loops, devices) = (
        Arc::new(SimLoops::new(world)),
        world.block_devices().clone(),
    );
    let node = NodeService::builder(dirs.clone(), NodeInfo::new(NODE_ID), mounter)
        .volumes(|v| v.loop_devices(loops).block_devices(devices))
        .open(Arc::new(node_store))
        .map_err(|e| e.to_string())?;
    all_restored(node.restore())?;
    Ok(Services {
        controller: Arc::new(engine.clone()),
        group: Some(Arc::new(engine)),
        node: Arc::new(node),
        data: dirs,
    })
}

/// Explores every step of every workload with every fault, prints the
/// coverage, and panics (a test's failure) when a workload was not
/// covered or an invariant broke, listing each violation with its replay.
/// With `CSI_SIM_REPLAY` set, only the named run is made and checked.
/// Every standard workload ([`workloads`]) must be among `workloads` or
/// reported left out: see [`assert_survives_in`] and [`assert_serves`].
pub fn assert_survives(runner: &SimRunner<'_>, workloads: &[SimWorkload]) -> SimReport {
    assert_survives_in(runner, workloads, SimReport::default())
}

/// [`assert_survives`] on top of `report`, which says what the target
/// leaves out and why ([`SimReport::skip`]): a standard workload neither
/// run nor left out there fails the test, so none is skipped silently.
pub fn assert_survives_in(
    runner: &SimRunner<'_>,
    workloads: &[SimWorkload],
    mut report: SimReport,
) -> SimReport {
    for w in workloads {
        runner.explore(w, &mut report);
    }
    println!("{report}");
    if std::env::var_os("CSI_SIM_REPLAY").is_none() {
        assert_eq!(report.steps.len(), workloads.len(), "{report}");
        assert!(report.steps.iter().all(|(_, s)| *s > 0), "{report}");
        assert_eq!(report.unreached, 0, "{report}");
        for w in self::workloads() {
            let run = report.steps.iter().any(|(n, _)| n == w.name);
            let said = report.skipped.iter().any(|(n, _)| n == w.name);
            assert!(
                run || said,
                "workload {} is neither run nor reported left out\n{report}",
                w.name
            );
        }
    }
    let found: Vec<String> = report.violations.iter().map(|v| v.to_string()).collect();
    assert!(found.is_empty(), "{}", found.join("\n"));
    report
}

/// [`assert_survives`] for a driver that declares `declared`: the
/// standard workloads as the CO runs them against it ([`workloads_for`]),
/// with what that leaves out reported ([`left_out`]). Where the driver's
/// data view says what it declares ([`DataView::declared`]), `declared`
/// must be that.
pub fn assert_serves(runner: &SimRunner<'_>, declared: Declared) -> SimReport {
    if let Some(found) = runner.declared() {
        assert_eq!(
            found, declared,
            "the driver declares {found:?}, the test says {declared:?}"
        );
    }
    let mut report = SimReport::default();
    for (w, why) in left_out(declared) {
        report.skip(w, why);
    }
    assert_survives_in(runner, &workloads_for(declared), report)
}

/// What [`workloads_for`] leaves out of the standard workloads for a
/// driver that declares `declared`, by workload, and why (for
/// [`SimReport::skip`]).
pub fn left_out(declared: Declared) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    for w in workloads() {
        let has = |f: &dyn Fn(&Call) -> bool| w.calls.iter().any(f);
        if !declared.group_snapshots && has(&|c| matches!(c, Call::CreateGroup(..))) {
            out.push((
                w.name,
                "not run: the driver offers no group snapshots (no GroupController), so the CO \
                 asks for none"
                    .to_owned(),
            ));
            continue;
        }
        if !declared.clones {
            let clones = w.calls.iter().filter_map(|c| match c {
                Call::CreateVolume {
                    pv,
                    from: Some(Content::Volume(_)),
                    ..
                } => Some(*pv),
                _ => None,
            });
            for pv in clones {
                out.push((
                    w.name,
                    format!(
                        "left out: the clone {pv} (its CreateVolume and DeleteVolume): the \
                         driver declares no CLONE_VOLUME, so the CO asks for none"
                    ),
                ));
            }
        }
        if !declared.attaches && has(&|c| matches!(c, Call::ControllerPublish(_))) {
            out.push((
                w.name,
                "left out: ControllerPublish and ControllerUnpublish: the driver declares \
                 no PUBLISH_UNPUBLISH_VOLUME, so the CO makes neither"
                    .to_owned(),
            ));
        }
    }
    out
}

/// What a driver declares, for [`workloads_for`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Declared {
    /// CLONE_VOLUME.
    pub clones: bool,
    /// The GroupController service (CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT).
    pub group_snapshots: bool,
    /// PUBLISH_UNPUBLISH_VOLUME: a volume is attached to the node before
    /// NodeStage and detached after NodeUnstage.
    pub attaches: bool,
}

/// The standard workloads as the CO runs them against a driver that
/// declares `declared`: without group snapshots the workload that needs
/// them is left out; without clones the clone (and its deletion) is; a
/// driver that attaches gets ControllerPublish before every NodeStage of
/// a volume not attached yet and ControllerUnpublish after its
/// NodeUnstage; one that does not gets neither.
pub fn workloads_for(declared: Declared) -> Vec<SimWorkload> {
    let needs_group = |w: &SimWorkload| w.calls.iter().any(|c| matches!(c, Call::CreateGroup(..)));
    workloads()
        .into_iter()
        .filter(|w| declared.group_snapshots || !needs_group(w))
        .map(|w| SimWorkload {
            name: w.name,
            calls: adapt(w.calls, declared),
        })
        .collect()
}

fn adapt(calls: Vec<Call>, declared: Declared) -> Vec<Call> {
    let clones: Vec<&'static str> = (calls.iter())
        .filter_map(|c| match c {
            Call::CreateVolume {
                pv,
                from: Some(Content::Volume(_)),
                ..
            } => Some(*pv),
            _ => None,
        })
        .collect();
    let (mut out, mut attached) = (Vec::new(), BTreeSet::new());
    for call in calls {
        match &call {
            Call::CreateVolume { pv, .. } | Call::DeleteVolume(pv)
                if !declared.clones && clones.contains(pv) =>
            {
                continue;
            }
            Call::ControllerPublish(pv) => {
                if !declared.attaches {
                    continue;
                }
                attached.insert(*pv);
            }
            Call::ControllerUnpublish(pv) if !declared.attaches || !attached.remove(pv) => {
                continue;
            }
            Call::Stage(pv) if declared.attaches && attached.insert(pv) => {
                out.push(Call::ControllerPublish(pv));
            }
            Call::Unstage(pv) if declared.attaches && attached.remove(pv) => {
                out.push(call.clone());
                out.push(Call::ControllerUnpublish(pv));
                continue;
            }
            _ => {}
        }
        out.push(call);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(calls: &[Call]) -> Vec<String> {
        calls
            .iter()
            .map(|c| {
                format!("{c:?}")
                    .split([' ', '('])
                    .next()
                    .unwrap_or("")
                    .to_owned()
            })
            .collect()
    }

    #[test]
    fn workloads_follow_what_the_driver_declares() {
        let none = Declared {
            clones: false,
            group_snapshots: false,
            attaches: false,
        };
        let ws = workloads_for(none);
        assert!(ws.iter().all(|w| w.name != "group-snapshot"));
        for w in &ws {
            let calls = shape(&w.calls);
            assert!(
                !calls.iter().any(|c| c.starts_with("Controller")),
                "{calls:?}"
            );
            let clone = w.calls.iter().any(|c| {
                matches!(
                    c,
                    Call::CreateVolume {
                        from: Some(Content::Volume(_)),
                        ..
                    }
                )
            });
            assert!(!clone, "{}", w.name);
        }
        let srs = ws
            .iter()
            .find(|w| w.name == "snapshot-restore-clone")
            .unwrap();
        assert!(
            !srs.calls
                .iter()
                .any(|c| matches!(c, Call::DeleteVolume("pv-c")))
        );
        let attaching = Declared {
            attaches: true,
            ..none
        };
        let shared = workloads_for(attaching)
            .into_iter()
            .find(|w| w.name == "shared-staging")
            .unwrap();
        let calls = shape(&shared.calls);
        assert_eq!(&calls[..3], ["CreateVolume", "ControllerPublish", "Stage"]);
        let unstaged = calls.iter().position(|c| c == "Unstage").unwrap();
        assert_eq!(calls[unstaged + 1], "ControllerUnpublish");
        let lifecycle = workloads_for(attaching).remove(0);
        let publishes = shape(&lifecycle.calls);
        let count = publishes
            .iter()
            .filter(|c| *c == "ControllerPublish")
            .count();
        assert_eq!(count, 1, "{publishes:?}");
    }

    #[test]
    fn what_a_driver_does_not_declare_is_reported_left_out() {
        let none = Declared {
            clones: false,
            group_snapshots: false,
            attaches: false,
        };
        let out = left_out(none);
        let said = |w: &str, what: &str| out.iter().any(|(n, why)| *n == w && why.contains(what));
        assert!(said("group-snapshot", "no group snapshots"), "{out:?}");
        assert!(said("snapshot-restore-clone", "CLONE_VOLUME"), "{out:?}");
        assert!(said("lifecycle", "PUBLISH_UNPUBLISH_VOLUME"), "{out:?}");
        // Every workload workloads_for drops is said left out.
        let run: Vec<&str> = workloads_for(none).iter().map(|w| w.name).collect();
        for w in workloads() {
            assert!(
                run.contains(&w.name) || said(w.name, "not run"),
                "{}",
                w.name
            );
        }
        let all = Declared {
            clones: true,
            group_snapshots: true,
            attaches: true,
        };
        assert!(left_out(all).is_empty());
        let mut report = SimReport::default();
        report.skip("group-snapshot", "no GroupController");
        let text = report.to_string();
        assert!(
            text.contains("workload group-snapshot: no GroupController"),
            "{text}"
        );
    }
}
