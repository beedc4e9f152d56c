//! The runner: a workload is run once to count its steps, then once per
//! step and fault with that fault planned, restarting the driver after a
//! crash and retrying calls the way the CO does, checking the invariants
//! after every call that got its final answer.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use csi_driver::{CallContext, Controller, CsiError, GroupController, Method, Node};
use csi_node::testing::requests::{cap, publish_req, stage_req, unpublish_req, unstage_req};
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::*;
use mount_utils::Mounter;

use crate::targets::NODE_ID;
use crate::world::{FAULTS, Fault, World};

/// What the runner reads of the driver's data besides its answers: every
/// volume's and snapshot's data by id, with the id its data says it was
/// made for.
pub trait DataView: Send + Sync {
    /// Volume data: id → owner.
    fn volumes(&self) -> BTreeMap<String, String>;
    /// Snapshot data: id → owner.
    fn snapshots(&self) -> BTreeMap<String, String>;
}

/// A started driver: its services and a view of its data.
pub struct Services {
    /// The Controller service.
    pub controller: Arc<dyn Controller>,
    /// The GroupController service, if it has one.
    pub group: Option<Arc<dyn GroupController>>,
    /// The Node service.
    pub node: Arc<dyn Node>,
    /// Its data.
    pub data: Arc<dyn DataView>,
}

/// Starts a driver on a world (at first and after every crash): opens its
/// state, runs its startup recovery and returns its services.
pub type Start = dyn Fn(&World) -> Result<Services, String> + Sync;

/// One CO call; volumes, snapshots and groups are named by the CO's names
/// and mapped to the ids the driver answered with.
#[derive(Debug, Clone)]
pub enum Call {
    /// CreateVolume `pv` of `size` bytes, empty or from a snapshot or volume.
    CreateVolume {
        /// The CO's name.
        pv: &'static str,
        /// Bytes.
        size: i64,
        /// Content source.
        from: Option<Content>,
    },
    /// DeleteVolume.
    DeleteVolume(&'static str),
    /// ControllerPublishVolume to the node.
    ControllerPublish(&'static str),
    /// ControllerUnpublishVolume from the node.
    ControllerUnpublish(&'static str),
    /// NodeStageVolume.
    Stage(&'static str),
    /// NodeUnstageVolume.
    Unstage(&'static str),
    /// NodePublishVolume for a pod.
    Publish {
        /// The volume.
        pv: &'static str,
        /// The pod.
        pod: &'static str,
        /// Read only.
        readonly: bool,
        /// The pod is deleted if the first answer is not OK: the CO then
        /// tears the publication down instead of retrying it.
        deleted_if_uncertain: bool,
    },
    /// NodeUnpublishVolume for a pod.
    Unpublish(&'static str, &'static str),
    /// ControllerExpandVolume, then NodeExpandVolume at the pod's path.
    Expand {
        /// The volume.
        pv: &'static str,
        /// The pod it is published for.
        pod: &'static str,
        /// New size.
        size: i64,
    },
    /// CreateSnapshot `snap` of a volume.
    CreateSnapshot(&'static str, &'static str),
    /// DeleteSnapshot.
    DeleteSnapshot(&'static str),
    /// CreateVolumeGroupSnapshot of volumes.
    CreateGroup(&'static str, Vec<&'static str>),
    /// DeleteVolumeGroupSnapshot.
    DeleteGroup(&'static str),
}

/// A new volume's content source.
#[derive(Debug, Clone, Copy)]
pub enum Content {
    /// A snapshot, by the CO's name.
    Snapshot(&'static str),
    /// A volume, by the CO's name.
    Volume(&'static str),
}

/// A CO's sequence of calls.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Its name, in reports and replays.
    pub name: &'static str,
    /// The calls, in order.
    pub calls: Vec<Call>,
}

const GIB: i64 = 1 << 30;

/// The standard workloads of issue 22.
pub fn workloads() -> Vec<Workload> {
    use Call::*;
    let publish = |pv, pod, readonly, deleted_if_uncertain| Publish {
        pv,
        pod,
        readonly,
        deleted_if_uncertain,
    };
    let create = |pv, from| CreateVolume {
        pv,
        size: GIB,
        from,
    };
    vec![
        Workload {
            name: "lifecycle",
            calls: vec![
                create("pv-a", None),
                ControllerPublish("pv-a"),
                Stage("pv-a"),
                publish("pv-a", "pod-1", false, false),
                Unpublish("pv-a", "pod-1"),
                Unstage("pv-a"),
                ControllerUnpublish("pv-a"),
                DeleteVolume("pv-a"),
            ],
        },
        Workload {
            name: "snapshot-restore-clone",
            calls: vec![
                create("pv-a", None),
                CreateSnapshot("snap-a", "pv-a"),
                create("pv-b", Some(Content::Snapshot("snap-a"))),
                create("pv-c", Some(Content::Volume("pv-b"))),
                DeleteVolume("pv-c"),
                DeleteVolume("pv-b"),
                DeleteSnapshot("snap-a"),
                DeleteVolume("pv-a"),
            ],
        },
        Workload {
            name: "expand-online",
            calls: vec![
                create("pv-a", None),
                Stage("pv-a"),
                publish("pv-a", "pod-1", false, false),
                Expand {
                    pv: "pv-a",
                    pod: "pod-1",
                    size: 2 * GIB,
                },
                Unpublish("pv-a", "pod-1"),
                Unstage("pv-a"),
                DeleteVolume("pv-a"),
            ],
        },
        Workload {
            name: "group-snapshot",
            calls: vec![
                create("pv-a", None),
                create("pv-b", None),
                CreateGroup("group-1", vec!["pv-a", "pv-b"]),
                DeleteGroup("group-1"),
                DeleteVolume("pv-b"),
                DeleteVolume("pv-a"),
            ],
        },
        Workload {
            name: "shared-staging",
            calls: vec![
                create("pv-a", None),
                Stage("pv-a"),
                publish("pv-a", "pod-1", false, false),
                publish("pv-a", "pod-2", true, true),
                Unpublish("pv-a", "pod-2"),
                Unpublish("pv-a", "pod-1"),
                Unstage("pv-a"),
                DeleteVolume("pv-a"),
            ],
        },
    ]
}

/// How many times the CO tries one call before the run counts it as never
/// answered (Kubernetes retries forever with backoff; one fault needs a
/// few, a crash one more for the restart).
pub const MAX_ATTEMPTS: usize = 8;

/// An invariant that did not hold, with the run that shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The workload.
    pub workload: String,
    /// The step the fault was planned at (`None`: the run without one).
    pub step: Option<u64>,
    /// The fault.
    pub fault: Option<Fault>,
    /// What broke.
    pub what: String,
}

impl Violation {
    /// The replay triple, `workload:step:fault`.
    pub fn replay_spec(&self) -> String {
        match (self.step, self.fault) {
            (Some(s), Some(f)) => format!("{}:{s}:{f}", self.workload),
            _ => format!("{}:-:-", self.workload),
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (replay with CSI_SIM_REPLAY={}): {}",
            self.replay_spec(),
            self.replay_spec(),
            self.what
        )
    }
}

/// What a campaign covered and found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Steps of each workload's run without faults.
    pub steps: Vec<(String, u64)>,
    /// Steps of the driver's start (the same in every workload, so
    /// explored with the first workload only; 0 until then).
    pub start_steps: u64,
    /// Runs executed (with and without faults).
    pub runs: u64,
    /// Runs whose planned step was never reached (the run took another
    /// path than the counting run).
    pub unreached: u64,
    /// Invariant violations.
    pub violations: Vec<Violation>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "driver start: {} steps x {} faults (explored once)",
            self.start_steps,
            FAULTS.len()
        )?;
        for (w, s) in &self.steps {
            writeln!(f, "workload {w}: {s} steps x {} faults", FAULTS.len())?;
        }
        writeln!(
            f,
            "runs executed: {} ({} with the planned step unreached); invariant violations: {}",
            self.runs,
            self.unreached,
            self.violations.len()
        )?;
        for v in &self.violations {
            writeln!(f, "  {v}")?;
        }
        Ok(())
    }
}

/// Runs workloads against a driver.
pub struct Runner<'a> {
    start: &'a Start,
    rt: tokio::runtime::Runtime,
}

impl<'a> Runner<'a> {
    /// A runner for the driver `start` starts.
    pub fn new(start: &'a Start) -> Self {
        Runner {
            start,
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a tokio runtime"),
        }
    }

    /// Every step of `workload` with every fault; a replay of one run
    /// instead when `CSI_SIM_REPLAY` names one of this workload.
    pub fn explore(&self, workload: &Workload, report: &mut Report) {
        if let Ok(spec) = std::env::var("CSI_SIM_REPLAY") {
            if spec.split(':').next() == Some(workload.name) {
                match self.replay(workload, &spec) {
                    Ok((trace, violations)) => {
                        for line in trace {
                            eprintln!("{line}");
                        }
                        report.runs += 1;
                        report.violations.extend(violations);
                    }
                    Err(e) => panic!("CSI_SIM_REPLAY={spec}: {e}"),
                }
            }
            return;
        }
        let (steps, start_steps, violations) = self.run(workload, None);
        report.runs += 1;
        report.violations.extend(violations);
        report.steps.push((workload.name.to_owned(), steps));
        // The start is the same in every workload: explored once.
        let first = match report.start_steps {
            0 => 0,
            _ => start_steps,
        };
        report.start_steps = start_steps;
        for k in first..steps {
            for fault in FAULTS {
                let world = self.run_world(workload, Some((k, fault)), report);
                if world.is_some_and(|w| w.fired().is_none()) {
                    report.unreached += 1;
                }
            }
        }
    }

    /// One run named `workload:step:fault`, with its trace.
    pub fn replay(
        &self,
        workload: &Workload,
        spec: &str,
    ) -> Result<(Vec<String>, Vec<Violation>), String> {
        let mut parts = spec.split(':');
        let (Some(_), Some(step), Some(fault), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err("expected workload:step:fault".into());
        };
        let step: u64 = step.parse().map_err(|e| format!("step {step:?}: {e}"))?;
        let fault: Fault = fault.parse().map_err(|e| format!("{e}"))?;
        let world = World::new(Some((step, fault))).map_err(|e| e.to_string())?;
        world.trace();
        let (violations, _) = self.run_in(&world, workload, Some((step, fault)));
        Ok((world.traced(), violations))
    }

    /// One run, counted in `report`; its world.
    fn run_world(
        &self,
        workload: &Workload,
        plan: Option<(u64, Fault)>,
        report: &mut Report,
    ) -> Option<World> {
        report.runs += 1;
        let world = match World::new(plan) {
            Ok(w) => w,
            Err(e) => {
                report
                    .violations
                    .push(violation(workload, plan, format!("no world: {e}")));
                return None;
            }
        };
        let (violations, _) = self.run_in(&world, workload, plan);
        report.violations.extend(violations);
        Some(world)
    }

    /// One run; its steps, the steps of the driver's first start, and
    /// its violations.
    fn run(&self, workload: &Workload, plan: Option<(u64, Fault)>) -> (u64, u64, Vec<Violation>) {
        let world = match World::new(plan) {
            Ok(w) => w,
            Err(e) => {
                return (
                    0,
                    0,
                    vec![violation(workload, plan, format!("no world: {e}"))],
                );
            }
        };
        let (violations, start_steps) = self.run_in(&world, workload, plan);
        (world.steps(), start_steps, violations)
    }

    fn run_in(
        &self,
        world: &World,
        workload: &Workload,
        plan: Option<(u64, Fault)>,
    ) -> (Vec<Violation>, u64) {
        let mut co = Co {
            world: world.clone(),
            start: self.start,
            services: None,
            model: Model::default(),
            start_steps: None,
        };
        let mut found = Vec::new();
        self.rt.block_on(async {
            for (i, call) in workload.calls.iter().enumerate() {
                if let Err(e) = co.perform(call).await {
                    found.push(format!("call {i} ({call:?}): {e}"));
                    return;
                }
                if let Err(e) = co.check().await {
                    found.push(format!("after call {i} ({call:?}): {e}"));
                    return;
                }
            }
        });
        let found = found
            .into_iter()
            .map(|what| violation(workload, plan, what))
            .collect();
        (found, co.start_steps.unwrap_or(0))
    }
}

fn violation(workload: &Workload, plan: Option<(u64, Fault)>, what: String) -> Violation {
    Violation {
        workload: workload.name.to_owned(),
        step: plan.map(|p| p.0),
        fault: plan.map(|p| p.1),
        what,
    }
}

/// What the CO believes: what it created and what kubelet has set up.
#[derive(Debug, Default)]
struct Model {
    volumes: BTreeMap<&'static str, String>,
    snapshots: BTreeMap<&'static str, String>,
    groups: BTreeMap<&'static str, (String, Vec<String>)>,
    staged: BTreeSet<&'static str>,
    published: BTreeMap<(&'static str, &'static str), bool>,
}

struct Co<'a> {
    world: World,
    start: &'a Start,
    services: Option<Services>,
    model: Model,
    /// Steps made when the driver first started.
    start_steps: Option<u64>,
}

/// One attempt's answer: OK, or an error worth retrying.
type Answer = Result<(), CsiError>;

impl Co<'_> {
    fn staging(&self, pv: &str) -> PathBuf {
        self.world.host_dir().join("kubelet/staging").join(pv)
    }

    fn target(&self, pv: &str, pod: &str) -> PathBuf {
        self.world
            .host_dir()
            .join("kubelet/pods")
            .join(pod)
            .join(pv)
            .join("mount")
    }

    fn id(&self, pv: &str) -> String {
        self.model.volumes.get(pv).cloned().unwrap_or_default()
    }

    /// The driver, started (again) when it is not running.
    fn services(&mut self) -> Result<&Services, String> {
        if self.world.crashed() {
            self.services = None;
            self.world.restart();
        }
        if self.services.is_none() {
            let mut last = String::new();
            for _ in 0..MAX_ATTEMPTS {
                match (self.start)(&self.world) {
                    Ok(s) => {
                        self.services = Some(s);
                        self.start_steps.get_or_insert(self.world.steps());
                        break;
                    }
                    Err(e) => {
                        last = e;
                        if self.world.crashed() {
                            self.world.restart();
                        }
                    }
                }
            }
            if self.services.is_none() {
                return Err(format!("the driver does not start: {last}"));
            }
        }
        Ok(self.services.as_ref().expect("started above"))
    }

    /// Retries `call` until it is answered OK, as the CO does.
    async fn perform(&mut self, call: &Call) -> Result<(), String> {
        let mut call = call.clone();
        let mut last = String::new();
        for _ in 0..MAX_ATTEMPTS {
            let answer = self.attempt(&call).await?;
            if self.world.crashed() {
                self.services = None;
                last = format!("driver crashed ({answer:?})");
                continue;
            }
            match answer {
                Ok(()) => return Ok(()),
                Err(e) => {
                    last = e.to_string();
                    if let Call::Publish {
                        pv,
                        pod,
                        deleted_if_uncertain: true,
                        ..
                    } = call
                    {
                        // The pod is gone: tear its publication down.
                        call = Call::Unpublish(pv, pod);
                    }
                }
            }
        }
        Err(format!(
            "no final answer after {MAX_ATTEMPTS} attempts: {last}"
        ))
    }

    async fn attempt(&mut self, call: &Call) -> Result<Answer, String> {
        let ctx = |m| CallContext::detached(0, m);
        let mount_cap = || cap(false, Mode::SingleNodeWriter, &[]);
        let s = self.services()?;
        let (controller, node, group) = (s.controller.clone(), s.node.clone(), s.group.clone());
        Ok(match call {
            Call::CreateVolume { pv, size, from } => {
                let source = match from {
                    None => None,
                    Some(Content::Snapshot(n)) => Some(
                        csi_controller::Source::Snapshot(
                            self.model.snapshots.get(n).cloned().unwrap_or_default(),
                        )
                        .message(),
                    ),
                    Some(Content::Volume(n)) => {
                        Some(csi_controller::Source::Volume(self.id(n)).message())
                    }
                };
                let req = CreateVolumeRequest {
                    name: (*pv).into(),
                    capacity_range: Some(CapacityRange {
                        required_bytes: *size,
                        limit_bytes: 0,
                    }),
                    volume_capabilities: vec![mount_cap()],
                    volume_content_source: source,
                    ..Default::default()
                };
                match controller
                    .create_volume(&ctx(Method::CreateVolume), req)
                    .await
                {
                    Ok(r) => {
                        let id = r.volume.map(|v| v.volume_id).unwrap_or_default();
                        self.model.volumes.insert(pv, id);
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            Call::DeleteVolume(pv) => {
                let req = DeleteVolumeRequest {
                    volume_id: self.id(pv),
                    ..Default::default()
                };
                let r = controller
                    .delete_volume(&ctx(Method::DeleteVolume), req)
                    .await;
                r.map(|_| {
                    self.model.volumes.remove(pv);
                })
            }
            Call::ControllerPublish(pv) => {
                let req = ControllerPublishVolumeRequest {
                    volume_id: self.id(pv),
                    node_id: NODE_ID.into(),
                    volume_capability: Some(mount_cap()),
                    ..Default::default()
                };
                let r = controller
                    .controller_publish_volume(&ctx(Method::ControllerPublishVolume), req)
                    .await;
                r.map(drop)
            }
            Call::ControllerUnpublish(pv) => {
                let req = ControllerUnpublishVolumeRequest {
                    volume_id: self.id(pv),
                    node_id: NODE_ID.into(),
                    ..Default::default()
                };
                let r = controller
                    .controller_unpublish_volume(&ctx(Method::ControllerUnpublishVolume), req)
                    .await;
                r.map(drop)
            }
            Call::Stage(pv) => {
                let staging = self.staging(pv);
                let _ = std::fs::create_dir_all(staging.parent().expect("a parent"));
                let req = stage_req(&self.id(pv), &staging, mount_cap());
                let r = node
                    .node_stage_volume(&ctx(Method::NodeStageVolume), req)
                    .await;
                r.map(|_| {
                    self.model.staged.insert(pv);
                })
            }
            Call::Unstage(pv) => {
                let req = unstage_req(&self.id(pv), &self.staging(pv));
                let r = node
                    .node_unstage_volume(&ctx(Method::NodeUnstageVolume), req)
                    .await;
                r.map(|_| {
                    self.model.staged.remove(pv);
                })
            }
            Call::Publish {
                pv, pod, readonly, ..
            } => {
                let target = self.target(pv, pod);
                let _ = std::fs::create_dir_all(target.parent().expect("a parent"));
                let mut req = publish_req(&self.id(pv), &self.staging(pv), &target, mount_cap());
                req.readonly = *readonly;
                let r = node
                    .node_publish_volume(&ctx(Method::NodePublishVolume), req)
                    .await;
                r.map(|_| {
                    self.model.published.insert((pv, pod), *readonly);
                })
            }
            Call::Unpublish(pv, pod) => {
                let req = unpublish_req(&self.id(pv), &self.target(pv, pod));
                let r = node
                    .node_unpublish_volume(&ctx(Method::NodeUnpublishVolume), req)
                    .await;
                r.map(|_| {
                    self.model.published.remove(&(*pv, *pod));
                })
            }
            Call::Expand { pv, pod, size } => {
                let range = Some(CapacityRange {
                    required_bytes: *size,
                    limit_bytes: 0,
                });
                let req = ControllerExpandVolumeRequest {
                    volume_id: self.id(pv),
                    capacity_range: range,
                    volume_capability: Some(mount_cap()),
                    ..Default::default()
                };
                let r = controller
                    .controller_expand_volume(&ctx(Method::ControllerExpandVolume), req)
                    .await;
                match r {
                    Ok(resp) if resp.node_expansion_required => {
                        let req = NodeExpandVolumeRequest {
                            volume_id: self.id(pv),
                            volume_path: self.target(pv, pod).to_string_lossy().into(),
                            staging_target_path: self.staging(pv).to_string_lossy().into(),
                            capacity_range: range,
                            volume_capability: Some(mount_cap()),
                            ..Default::default()
                        };
                        let r = node
                            .node_expand_volume(&ctx(Method::NodeExpandVolume), req)
                            .await;
                        r.map(drop)
                    }
                    r => r.map(drop),
                }
            }
            Call::CreateSnapshot(snap, pv) => {
                let req = CreateSnapshotRequest {
                    source_volume_id: self.id(pv),
                    name: (*snap).into(),
                    ..Default::default()
                };
                match controller
                    .create_snapshot(&ctx(Method::CreateSnapshot), req)
                    .await
                {
                    Ok(r) => {
                        let id = r.snapshot.map(|s| s.snapshot_id).unwrap_or_default();
                        self.model.snapshots.insert(snap, id);
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            Call::DeleteSnapshot(snap) => {
                let req = DeleteSnapshotRequest {
                    snapshot_id: self.model.snapshots.get(snap).cloned().unwrap_or_default(),
                    ..Default::default()
                };
                let r = controller
                    .delete_snapshot(&ctx(Method::DeleteSnapshot), req)
                    .await;
                r.map(|_| {
                    self.model.snapshots.remove(snap);
                })
            }
            Call::CreateGroup(name, pvs) => {
                let group = group.ok_or("the driver has no GroupController")?;
                let req = CreateVolumeGroupSnapshotRequest {
                    name: (*name).into(),
                    source_volume_ids: pvs.iter().map(|p| self.id(p)).collect(),
                    ..Default::default()
                };
                match group
                    .create_volume_group_snapshot(&ctx(Method::CreateVolumeGroupSnapshot), req)
                    .await
                {
                    Ok(r) => {
                        let g = r.group_snapshot.unwrap_or_default();
                        let members = g.snapshots.into_iter().map(|s| s.snapshot_id).collect();
                        self.model
                            .groups
                            .insert(name, (g.group_snapshot_id, members));
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            Call::DeleteGroup(name) => {
                let group = group.ok_or("the driver has no GroupController")?;
                let (id, members) = self.model.groups.get(name).cloned().unwrap_or_default();
                let req = DeleteVolumeGroupSnapshotRequest {
                    group_snapshot_id: id,
                    snapshot_ids: members,
                    ..Default::default()
                };
                let r = group
                    .delete_volume_group_snapshot(&ctx(Method::DeleteVolumeGroupSnapshot), req)
                    .await;
                r.map(|_| {
                    self.model.groups.remove(name);
                })
            }
        })
    }

    /// The invariants, after a call got its final answer.
    async fn check(&mut self) -> Result<(), String> {
        let ctx = |m| CallContext::detached(0, m);
        let s = self.services()?;
        let (controller, data) = (s.controller.clone(), s.data.clone());
        // Records (as ListVolumes and ListSnapshots answer) = what the CO
        // was told exists = the data that exists, each owned by its id.
        let listed: BTreeSet<String> = controller
            .list_volumes(&ctx(Method::ListVolumes), ListVolumesRequest::default())
            .await
            .map_err(|e| format!("ListVolumes: {e}"))?
            .entries
            .into_iter()
            .filter_map(|e| e.volume.map(|v| v.volume_id))
            .collect();
        let acked: BTreeSet<String> = self.model.volumes.values().cloned().collect();
        let volumes = data.volumes();
        compare("volumes listed", &listed, "volumes the CO holds", &acked)?;
        let present: BTreeSet<String> = volumes.keys().cloned().collect();
        compare("volume data", &present, "volumes the CO holds", &acked)?;
        let snaps: BTreeSet<String> = controller
            .list_snapshots(&ctx(Method::ListSnapshots), ListSnapshotsRequest::default())
            .await
            .map_err(|e| format!("ListSnapshots: {e}"))?
            .entries
            .into_iter()
            .filter_map(|e| e.snapshot.map(|s| s.snapshot_id))
            .collect();
        let acked_snaps: BTreeSet<String> = self
            .model
            .snapshots
            .values()
            .cloned()
            .chain(self.model.groups.values().flat_map(|g| g.1.clone()))
            .collect();
        compare(
            "snapshots listed",
            &snaps,
            "snapshots the CO holds",
            &acked_snaps,
        )?;
        let snapshot_data = data.snapshots();
        let present: BTreeSet<String> = snapshot_data.keys().cloned().collect();
        compare(
            "snapshot data",
            &present,
            "snapshots the CO holds",
            &acked_snaps,
        )?;
        for (id, owner) in volumes.iter().chain(&snapshot_data) {
            if id != owner {
                return Err(format!("the data at {id} is {owner:?}'s"));
            }
        }
        // The mount table = what kubelet set up, each from its own volume,
        // read-only where asked.
        let mounts: BTreeMap<PathBuf, mount_utils::MountInfo> = self
            .world
            .mounter()
            .mount_points()
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter(|m| m.mount_point != std::path::Path::new("/"))
            .map(|m| (m.mount_point.clone(), m))
            .collect();
        let mut expected = BTreeMap::new();
        for pv in &self.model.staged {
            expected.insert(self.staging(pv), (*pv, false));
        }
        for ((pv, pod), ro) in &self.model.published {
            expected.insert(self.target(pv, pod), (*pv, *ro));
        }
        let found: BTreeSet<&PathBuf> = mounts.keys().collect();
        let wanted: BTreeSet<&PathBuf> = expected.keys().collect();
        if found != wanted {
            return Err(format!("mounts {found:?}, expected {wanted:?}"));
        }
        for (path, (pv, ro)) in &expected {
            let m = &mounts[path];
            let id = self.id(pv);
            if !m.root.ends_with(&id) {
                return Err(format!("{path:?} shows {:?}, not volume {id}", m.root));
            }
            let is_ro = m.mount_options.iter().any(|o| o == "ro");
            if is_ro != *ro {
                return Err(format!("{path:?} is read-only: {is_ro}, asked: {ro}"));
            }
        }
        let attached = self.world.loops().attached();
        if !attached.is_empty() {
            return Err(format!("loop devices no volume uses: {attached:?}"));
        }
        Ok(())
    }
}

fn compare(
    a_name: &str,
    a: &BTreeSet<String>,
    b_name: &str,
    b: &BTreeSet<String>,
) -> Result<(), String> {
    if a == b {
        return Ok(());
    }
    let extra: Vec<_> = a.difference(b).collect();
    let missing: Vec<_> = b.difference(a).collect();
    Err(format!(
        "{a_name} differ from {b_name}: extra {extra:?}, missing {missing:?}"
    ))
}
