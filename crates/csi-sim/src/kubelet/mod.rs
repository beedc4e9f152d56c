//! volume-state's reconcilers as the CO: a simulated kubelet (desired and
//! actual node state, the node reconciler with its durable journal on the
//! world's filesystem) and the attach/detach controller, both driving the
//! driver through a volume plugin. A workload is a sequence of changes to
//! what the API server holds (volumes provisioned, pods added and
//! deleted, the kubelet restarted); after each one the reconcilers run
//! until they converge, and the invariants are checked.
//!
//! A volume in use is expanded as Kubernetes does it: the resizer's
//! ControllerExpandVolume, then the PV's capacity (the size the kubelet
//! wants for the pods' volume) grows, and the node reconciler must bring
//! the node to it with NodeExpandVolume, also across a restart between the
//! two.
//!
//! A crash drops the driver's and the kubelet's memory; both restart on
//! the same world, the kubelet from its journal and the mount table as
//! kubelet reconstructs. The attach controller runs elsewhere (in the
//! controller manager) and keeps its state.

mod plugin;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use csi_driver::{CallContext, Method};
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::{CapacityRange, ControllerExpandVolumeRequest, ListVolumesRequest};
use csi_store::FileStore;
use volume_state::controller::{
    ActualAttachState, AttachConfig, AttachReconciler, DesiredAttachState,
};
use volume_state::csi::default_capability;
use volume_state::journal::{Journal, RecordJournalStore};
use volume_state::node::{
    ActualNodeState, AttachMode, DesiredNodeState, DeviceState, DiscoveredMount, NodeReconciler,
    PodMountState,
};
use volume_state::{FakeClock, NodeAccess, Reconcile, VolumeSpec};

use self::plugin::{SimMountTable, SimVolumePlugin};
use crate::co::Co;
use crate::runner::{LocalFuture, MAX_ATTEMPTS, Outcome, Scenario, Start};
use crate::targets::NODE_ID;
use crate::workload::Call;
use crate::world::World;

const GIB: i64 = 1 << 30;

/// Passes the reconcilers get to converge after a change (each failed
/// operation waits out its backoff, a crash costs a restart).
pub const MAX_PASSES: usize = 40;

/// Where the kubelet keeps its journal on the world's filesystem.
const KUBELET_DIR: &str = "/state/kubelet";

/// A change to what the API server holds, or to the kubelet.
#[derive(Debug, Clone)]
pub enum Change {
    /// The provisioner creates volume `pv` (CreateVolume, retried).
    Provision(&'static str),
    /// The provisioner deletes volume `pv` (DeleteVolume, retried).
    Deprovision(&'static str),
    /// A pod is scheduled to the node.
    AddPod(Pod),
    /// A pod is deleted.
    DeletePod(&'static str),
    /// The resizer grows volume `pv` to `size` bytes
    /// (ControllerExpandVolume, retried); then the PV's capacity, the size
    /// the kubelet wants for the pods' volume, is `size`. The CO raises it
    /// whatever `node_expansion_required` said, as for a driver whose node
    /// must grow the filesystem (csi-kit's library, whose volumes are
    /// directories, answers NodeExpandVolume with nothing to grow).
    Expand {
        /// The volume.
        pv: &'static str,
        /// Its new size in bytes.
        size: i64,
    },
    /// The kubelet restarts (its memory lost, the driver kept) after
    /// `after_passes` passes of work on the change before.
    RestartKubelet {
        /// Passes run before the restart.
        after_passes: usize,
    },
}

/// A pod and the volume it mounts.
#[derive(Debug, Clone, Copy)]
pub struct Pod {
    /// Its name.
    pub name: &'static str,
    /// The volume it mounts.
    pub pv: &'static str,
    /// It mounts the volume read-only.
    pub read_only: bool,
}

/// A sequence of changes, explored by [`SimRunner::explore_kubelet`](crate::SimRunner::explore_kubelet).
#[derive(Debug, Clone)]
pub struct KubeletWorkload {
    /// Its name, in reports and replays.
    pub name: &'static str,
    /// The changes, in order.
    pub changes: Vec<Change>,
}

/// The standard kubelet workloads: two pods sharing a staged volume (one
/// read-only) from provisioning to deletion, restarts of the kubelet
/// with a volume in use and between unpublish and unstage
/// (kubernetes#85476), and a volume in use expanded twice, the kubelet
/// restarted between the first ControllerExpandVolume and its
/// NodeExpandVolume.
pub fn kubelet_workloads() -> Vec<KubeletWorkload> {
    use Change::*;
    let add = |name, pv, read_only| {
        AddPod(Pod {
            name,
            pv,
            read_only,
        })
    };
    vec![
        KubeletWorkload {
            name: "kubelet-shared",
            changes: vec![
                Provision("pv-a"),
                add("pod-1", "pv-a", false),
                add("pod-2", "pv-a", true),
                DeletePod("pod-1"),
                DeletePod("pod-2"),
                Deprovision("pv-a"),
            ],
        },
        KubeletWorkload {
            name: "kubelet-restart",
            changes: vec![
                Provision("pv-a"),
                add("pod-1", "pv-a", false),
                RestartKubelet { after_passes: 0 },
                DeletePod("pod-1"),
                // Unpublished, then the kubelet stops before the unstage.
                RestartKubelet { after_passes: 1 },
            ],
        },
        KubeletWorkload {
            name: "kubelet-expand-online",
            changes: vec![
                Provision("pv-a"),
                add("pod-1", "pv-a", false),
                Expand {
                    pv: "pv-a",
                    size: 2 * GIB,
                },
                // Grown by the controller; the kubelet stops before it
                // expands the node.
                RestartKubelet { after_passes: 0 },
                Expand {
                    pv: "pv-a",
                    size: 3 * GIB,
                },
                DeletePod("pod-1"),
                Deprovision("pv-a"),
            ],
        },
    ]
}

impl Scenario for KubeletWorkload {
    fn name(&self) -> &'static str {
        self.name
    }

    // The kubelet's volume plugin asks for its own access modes (two pods
    // share a volume), so the runner's is not used here.
    fn run<'a>(&'a self, start: &'a Start, world: &'a World, _: Mode) -> LocalFuture<'a, Outcome> {
        Box::pin(self.apply_all(start, world))
    }
}

impl KubeletWorkload {
    /// Applies every change, letting the reconcilers converge and checking
    /// the invariants after each one (a change a restart interrupts is
    /// checked once the restarted kubelet converged).
    async fn apply_all(&self, start: &Start, world: &World) -> Outcome {
        let mut cluster = Cluster::new(world, start);
        let mut found = Vec::new();
        for (i, change) in self.changes.iter().enumerate() {
            let interrupted = match self.changes.get(i + 1) {
                Some(Change::RestartKubelet { after_passes }) => Some(*after_passes),
                _ => None,
            };
            if let Err(e) = cluster.apply(change, interrupted).await {
                found.push(format!("change {i} ({change:?}): {e}"));
                break;
            }
            if interrupted.is_some() {
                continue;
            }
            if let Err(e) = cluster.check().await {
                found.push(format!("after change {i} ({change:?}): {e}"));
                break;
            }
        }
        found.extend(cluster.plugin.take_found());
        (found, cluster.co.start_steps.unwrap_or(0))
    }
}

/// The kubelet's process: its state, rebuilt at every start.
struct Kubelet {
    desired: Arc<DesiredNodeState<String, String>>,
    actual: Arc<ActualNodeState<String, String>>,
    node: NodeReconciler<String, String, String>,
}

/// The simulated cluster: the API server's objects, the attach controller,
/// the node's kubelet and the driver.
struct Cluster<'a> {
    co: Co<'a>,
    /// Pod → (volume, read-only).
    pods: BTreeMap<&'static str, (&'static str, bool)>,
    /// Each volume's capacity as the PV says (what the pods want).
    sizes: BTreeMap<&'static str, i64>,
    kubelet: Option<Kubelet>,
    attach: AttachReconciler<String, String, String>,
    attach_desired: Arc<DesiredAttachState<String, String, String>>,
    attach_actual: Arc<ActualAttachState<String, String>>,
    plugin: Arc<SimVolumePlugin>,
    clock: FakeClock,
}

impl<'a> Cluster<'a> {
    fn new(world: &World, start: &'a Start) -> Self {
        let clock = FakeClock::new();
        let attach_desired = Arc::new(DesiredAttachState::new());
        let attach_actual = Arc::new(ActualAttachState::new());
        let plugin = Arc::new(SimVolumePlugin::new(world, attach_actual.clone()));
        let attach = AttachReconciler::new(
            AttachConfig::default(),
            attach_desired.clone(),
            attach_actual.clone(),
            plugin.clone(),
        )
        .with_clock(Arc::new(clock.clone()));
        Cluster {
            co: Co::new(world, start, Mode::SingleNodeWriter),
            pods: BTreeMap::new(),
            sizes: BTreeMap::new(),
            kubelet: None,
            attach,
            attach_desired,
            attach_actual,
            plugin,
            clock,
        }
    }

    fn spec(&self, pv: &str) -> VolumeSpec {
        VolumeSpec {
            attachable: true,
            staging_path: Some(self.co.staging(pv)),
            // Pods on one node share it (SINGLE_NODE_WRITER allows one target).
            access_mode: NodeAccess::MultiNode,
            desired_size: self.sizes.get(pv).and_then(|s| u64::try_from(*s).ok()),
            ..VolumeSpec::default()
        }
    }

    /// The volume name of a driver's volume id.
    fn pv_of(&self, id: &str) -> Option<&'static str> {
        self.co
            .model
            .volumes
            .iter()
            .find(|(_, v)| v.as_str() == id)
            .map(|(pv, _)| *pv)
    }

    /// The volumes pods use, by id.
    fn used(&self) -> BTreeSet<String> {
        self.pods.values().map(|(pv, _)| self.co.id(pv)).collect()
    }

    async fn apply(&mut self, change: &Change, interrupted: Option<usize>) -> Result<(), String> {
        match change {
            Change::Provision(pv) => {
                let create = Call::CreateVolume {
                    pv,
                    size: GIB,
                    from: None,
                };
                self.co.perform(&create).await?;
                self.sizes.insert(pv, GIB);
            }
            Change::Deprovision(pv) => self.co.perform(&Call::DeleteVolume(pv)).await?,
            Change::AddPod(Pod {
                name: pod,
                pv,
                read_only,
            }) => {
                self.pods.insert(pod, (pv, *read_only));
                let (id, spec) = (self.co.id(pv), Arc::new(self.spec(pv)));
                if let Some(k) = &self.kubelet {
                    let target = self.co.target(pv, pod);
                    k.desired
                        .add_pod(id.clone(), spec.clone(), (*pod).into(), target);
                }
                self.attach_desired
                    .add_pod(NODE_ID.into(), id, spec, (*pod).into());
            }
            Change::DeletePod(pod) => {
                if let Some((pv, _)) = self.pods.remove(pod) {
                    let id = self.co.id(pv);
                    if let Some(k) = &self.kubelet {
                        k.desired.remove_pod(&id, &(*pod).into());
                    }
                    self.attach_desired
                        .remove_pod(&NODE_ID.into(), &id, &(*pod).into());
                }
            }
            Change::Expand { pv, size } => {
                self.controller_expand(pv, *size).await?;
                self.sizes.insert(pv, *size);
                let (id, spec) = (self.co.id(pv), Arc::new(self.spec(pv)));
                if let Some(k) = &self.kubelet {
                    for (pod, _) in self.pods.iter().filter(|(_, (p, _))| p == pv) {
                        let target = self.co.target(pv, pod);
                        k.desired
                            .add_pod(id.clone(), spec.clone(), (*pod).into(), target);
                    }
                }
            }
            Change::RestartKubelet { .. } => self.kubelet = None,
        }
        let read_only = self.pods.iter().filter(|(_, (_, ro))| *ro);
        let read_only = read_only
            .map(|(pod, (pv, _))| self.co.target(pv, pod))
            .collect();
        self.plugin.set_pods(self.used(), read_only);
        match interrupted {
            Some(passes) => self.settle(passes).await.map(drop),
            None => match self.settle(MAX_PASSES).await? {
                true => Ok(()),
                false => Err(format!(
                    "not converged within {MAX_PASSES} passes: {}",
                    self.divergence().unwrap_or_default()
                )),
            },
        }
    }

    /// The resizer's ControllerExpandVolume, retried until answered OK. A
    /// crash during it takes the kubelet's memory too.
    async fn controller_expand(&mut self, pv: &str, size: i64) -> Result<(), String> {
        let mut last = String::new();
        for _ in 0..MAX_ATTEMPTS {
            let req = ControllerExpandVolumeRequest {
                volume_id: self.co.id(pv),
                capacity_range: Some(CapacityRange {
                    required_bytes: size,
                    limit_bytes: 0,
                }),
                volume_capability: Some(default_capability(&self.spec(pv))),
                ..Default::default()
            };
            let controller = self.co.services().await?.controller.clone();
            let r = controller
                .controller_expand_volume(
                    &CallContext::detached(0, Method::ControllerExpandVolume),
                    req,
                )
                .await;
            if self.co.world.crashed() {
                self.kubelet = None;
                last = format!("driver crashed ({r:?})");
                continue;
            }
            match r {
                Ok(_) => return Ok(()),
                Err(e) => last = e.to_string(),
            }
        }
        Err(format!(
            "ControllerExpandVolume: no final answer after {MAX_ATTEMPTS} attempts: {last}"
        ))
    }

    /// Runs up to `passes` passes of both reconcilers; whether they
    /// converged.
    async fn settle(&mut self, passes: usize) -> Result<bool, String> {
        for _ in 0..passes {
            self.running().await?;
            let k = self.kubelet.as_ref().expect("started above");
            // The node's status: what it uses, then what it reported.
            let in_use = k.node.volumes_in_use();
            self.attach_actual
                .set_volumes_in_use(&NODE_ID.into(), &in_use);
            k.desired.mark_volumes_reported_in_use(&in_use);
            let a = self.attach.run_pass().await;
            let n = k.node.run_pass().await;
            if self.co.world.crashed() {
                self.kubelet = None;
                continue;
            }
            if a.planned + n.planned > 0 {
                continue;
            }
            if self.divergence().is_none() {
                return Ok(true);
            }
            // Nothing may start before a backoff ends: wait for it.
            let wait = [self.attach.next_retry_in(), k.node.next_retry_in()]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(Duration::from_secs(1));
            self.clock.advance(wait.max(Duration::from_millis(1)));
        }
        Ok(self.kubelet.is_some() && self.divergence().is_none())
    }

    /// The driver and the kubelet, (re)started where they are not running.
    async fn running(&mut self) -> Result<(), String> {
        let mut last = String::new();
        for _ in 0..MAX_ATTEMPTS {
            if self.co.world.crashed() {
                self.kubelet = None;
            }
            let s = self.co.services().await?;
            self.plugin
                .set_driver((s.controller.clone(), s.node.clone()));
            if self.kubelet.is_some() {
                return Ok(());
            }
            match self.start_kubelet() {
                Ok(k) => {
                    self.kubelet = Some(k);
                    return Ok(());
                }
                Err(e) => last = e,
            }
        }
        Err(format!("the kubelet does not start: {last}"))
    }

    /// Starts the kubelet as after a restart: its journal, the pods'
    /// mounts found on the node, the pods the API server lists.
    fn start_kubelet(&self) -> Result<Kubelet, String> {
        let world = &self.co.world;
        let store = FileStore::open_on(world.fs().handle(), KUBELET_DIR)
            .map_err(|e| format!("journal store: {e}"))?;
        let store = RecordJournalStore::<String, String>::with_store(Arc::new(store))
            .map_err(|e| e.to_string())?;
        let journal = Arc::new(Journal::open(Arc::new(store)).map_err(|e| e.to_string())?);
        let table = Arc::new(SimMountTable::new(world));
        let actual = Arc::new(ActualNodeState::new());
        let found = self.scan(&table);
        actual.reconstruct_with_journal(found, &journal.records(), |id| {
            self.pv_of(id).map(|pv| self.spec(pv))
        });
        let desired = Arc::new(DesiredNodeState::new());
        for (pod, (pv, _)) in &self.pods {
            let target = self.co.target(pv, pod);
            desired.add_pod(self.co.id(pv), self.spec(pv), (*pod).into(), target);
        }
        desired.mark_populated();
        let node = NodeReconciler::new(
            NODE_ID.into(),
            AttachMode::ByController,
            desired.clone(),
            actual.clone(),
            self.plugin.clone(),
        )
        .with_journal(journal)
        .with_mount_table(table)
        .with_clock(Arc::new(self.clock.clone()));
        Ok(Kubelet {
            desired,
            actual,
            node,
        })
    }

    /// The pods' volume directories with a mount point left, as kubelet
    /// finds them after a restart.
    fn scan(&self, table: &SimMountTable) -> Vec<DiscoveredMount<String, String>> {
        let pods_dir = self.co.world.host_dir().join("kubelet/pods");
        let mut found = Vec::new();
        for pod in std::fs::read_dir(&pods_dir).into_iter().flatten().flatten() {
            for volume in std::fs::read_dir(pod.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                if !volume.path().join("mount").is_dir() {
                    continue;
                }
                let pv = volume.file_name().to_string_lossy().into_owned();
                let id = self
                    .co
                    .model
                    .volumes
                    .get(pv.as_str())
                    .cloned()
                    .unwrap_or(pv.clone());
                let pod = pod.file_name().to_string_lossy().into_owned();
                found.push(
                    DiscoveredMount::new(id, pod, volume.path().join("mount"))
                        .with_staging_path(self.co.staging(&pv))
                        .checked(table),
                );
            }
        }
        found.sort_by(|a, b| (&a.volume, &a.pod).cmp(&(&b.volume, &b.pod)));
        found
    }

    /// How the reconcilers' states differ from what the pods want, if
    /// they do.
    fn divergence(&self) -> Option<String> {
        let Some(k) = &self.kubelet else {
            return Some("the kubelet is not running".into());
        };
        let actual = k.actual.snapshot();
        let used = self.used();
        let have: BTreeSet<String> = actual.volumes().map(|(v, _)| v.clone()).collect();
        if have != used || actual.orphans().next().is_some() {
            return Some(format!("node volumes {have:?}, wanted {used:?}"));
        }
        for (id, v) in actual.volumes() {
            let mounted: BTreeSet<&str> = v.pods.keys().map(String::as_str).collect();
            let wanted: BTreeSet<&str> = self
                .pods
                .iter()
                .filter(|(_, (pv, _))| self.co.id(pv) == *id)
                .map(|(pod, _)| *pod)
                .collect();
            if mounted != wanted {
                return Some(format!(
                    "{id} mounted for {mounted:?}, wanted by {wanted:?}"
                ));
            }
        }
        for (pod, (pv, _)) in &self.pods {
            let id = self.co.id(pv);
            let Some(v) = actual.get(&id) else {
                return Some(format!("{pv} unknown to the kubelet"));
            };
            if !matches!(v.device, DeviceState::Mounted { .. }) {
                return Some(format!("{pv} not staged: {:?}", v.device));
            }
            let mounted = v.pods.get(*pod).map(|m| m.state);
            if mounted != Some(PodMountState::Mounted) {
                return Some(format!("{pv} for {pod}: {mounted:?}"));
            }
            let wanted = self.spec(pv).desired_size;
            if v.size.is_none_or(|s| wanted.is_some_and(|w| s < w)) {
                return Some(format!(
                    "{pv} at {:?} bytes on the node, wanted {wanted:?}",
                    v.size
                ));
            }
        }
        let node = NODE_ID.to_owned();
        let attached: BTreeSet<String> = self
            .attach_actual
            .snapshot()
            .volumes()
            .filter(|(_, a)| a.nodes.contains_key(&node))
            .map(|(v, _)| v.clone())
            .collect();
        (attached != used).then(|| format!("attached {attached:?}, wanted {used:?}"))
    }

    /// The runner's invariants with the pods' volumes as what the CO set
    /// up, and the driver's attachments as what the pods use.
    async fn check(&mut self) -> Result<(), String> {
        self.co.model.staged = self.pods.values().map(|(pv, _)| *pv).collect();
        self.co.model.published = self
            .pods
            .iter()
            .map(|(pod, (pv, ro))| ((*pv, *pod), *ro))
            .collect();
        self.co.check().await?;
        // The node's filesystem has the size the PV has (NodeExpandVolume
        // answered OK for it).
        for pv in self.pods.values().map(|(pv, _)| *pv) {
            let (id, wanted) = (self.co.id(pv), self.sizes.get(pv).copied().unwrap_or(GIB));
            let have = self.plugin.node_size(&id).unwrap_or(GIB);
            if have < wanted {
                return Err(format!(
                    "{pv} is {have} bytes on the node, the PV {wanted}: its expansion was lost"
                ));
            }
        }
        let s = self.co.services().await?;
        let listed = s
            .controller
            .list_volumes(
                &CallContext::detached(0, Method::ListVolumes),
                ListVolumesRequest::default(),
            )
            .await
            .map_err(|e| format!("ListVolumes: {e}"))?;
        let published: BTreeSet<String> = listed
            .entries
            .into_iter()
            .filter(|e| {
                e.status
                    .as_ref()
                    .is_some_and(|s| s.published_node_ids.iter().any(|n| n == NODE_ID))
            })
            .filter_map(|e| e.volume.map(|v| v.volume_id))
            .collect();
        let used = self.used();
        if published != used {
            return Err(format!(
                "volumes the driver has published to the node {published:?}, used by pods {used:?}"
            ));
        }
        Ok(())
    }
}
