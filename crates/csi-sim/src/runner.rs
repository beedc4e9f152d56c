//! The runner: a workload is run once to count its steps, then once per
//! step and fault with that fault planned, restarting the driver after a
//! crash and retrying calls the way the CO does, checking the invariants
//! after every call that got its final answer.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use csi_driver::{Controller, GroupController, Node};
use csi_proto::v1::volume_capability::access_mode::Mode;

use crate::co::Co;
use crate::kubelet::KubeletWorkload;
use crate::workload::SimWorkload;
use crate::world::{Effect, FAULTS, FIRED_MARK, SimFault, World};

/// What the runner reads of the driver's data besides its answers: every
/// volume's and snapshot's data by id, with the id its data says it was
/// made for.
pub trait DataView: Send + Sync {
    /// Volume data: id → owner.
    fn volumes(&self) -> BTreeMap<String, String>;
    /// Snapshot data: id → owner.
    fn snapshots(&self) -> BTreeMap<String, String>;
    /// The id of the volume whose data `mount` shows: by default the
    /// last component of the mount's root (a directory volume is bound
    /// from a directory named by its id).
    fn volume_at(&self, mount: &mount_utils::MountInfo) -> Option<String> {
        let name = mount.root.file_name()?;
        Some(name.to_string_lossy().into_owned())
    }
    /// The id of the volume a loop device serves (by default none: a
    /// driver that stages through loop devices says which).
    fn loop_volume(&self, device: &mount_utils::LoopDeviceInfo) -> Option<String> {
        let _ = device;
        None
    }
    /// The ids of the volumes the storage provider has attached to a node
    /// (by default `None`: the driver attaches nothing outside itself, so
    /// the runner does not compare attachments).
    fn attached_volumes(&self) -> Option<BTreeSet<String>> {
        None
    }
    /// What the driver's controller declares, from its backend (by default
    /// `None`: unknown). [`targets::assert_serves`](crate::targets::assert_serves)
    /// checks a test's [`Declared`](crate::targets::Declared) against it, so
    /// a capability the driver gained does not stay left out of the
    /// workloads.
    fn declared(&self) -> Option<crate::targets::Declared> {
        None
    }
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

/// What a [`Start`] returns: the started driver, once its startup
/// recovery (async in csi-controller) has run.
pub type Started = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Services, String>>>>;

/// Starts a driver on a world (at first and after every crash): opens its
/// state, runs its startup recovery and returns its services.
pub type Start = dyn Fn(&World) -> Started + Sync;

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
    pub fault: Option<SimFault>,
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
pub struct SimReport {
    /// Steps of each workload's run without faults.
    pub steps: Vec<(String, u64)>,
    /// Intermediate crash states explored in each workload (over all its
    /// steps; see [`SimFault::CrashState`]).
    pub crash_states: Vec<(String, u64)>,
    /// Steps of the driver's start (the same in every workload, so
    /// explored with the first workload only; 0 until then).
    pub start_steps: u64,
    /// Runs executed (with and without faults).
    pub runs: u64,
    /// Runs and violations per fault kind ([`SimFault::kind`]).
    pub by_fault: BTreeMap<String, FaultTally>,
    /// Runs whose planned step was never reached (the run took another
    /// path than the counting run).
    pub unreached: u64,
    /// Invariant violations.
    pub violations: Vec<Violation>,
    /// Workloads, or parts of one, the target does not run, and why
    /// ([`skip`](Self::skip)): printed, so nothing is left out silently.
    pub skipped: Vec<(String, String)>,
}

impl SimReport {
    /// Records that `workload` (or a part of it) is not run against this
    /// target, and why (the driver does not offer what it needs): `why`
    /// is printed after the workload's name, e.g. "not run: ..." or "left
    /// out: its clone ...".
    pub fn skip(&mut self, workload: &str, why: impl Into<String>) {
        self.skipped.push((workload.to_owned(), why.into()));
    }

    /// Adds `other`'s coverage and findings (a campaign run in parts).
    pub fn merge(&mut self, other: SimReport) {
        self.steps.extend(other.steps);
        self.crash_states.extend(other.crash_states);
        self.start_steps = self.start_steps.max(other.start_steps);
        self.runs += other.runs;
        for (kind, t) in other.by_fault {
            let mine = self.by_fault.entry(kind).or_default();
            mine.runs += t.runs;
            mine.violations += t.violations;
        }
        self.unreached += other.unreached;
        self.violations.extend(other.violations);
        self.skipped.extend(other.skipped);
    }
}

/// The runs made with one kind of fault and the violations they found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultTally {
    /// Runs with this fault planned.
    pub runs: u64,
    /// Violations those runs found.
    pub violations: u64,
}

impl fmt::Display for SimReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "driver start: {} steps (explored once)",
            self.start_steps,
        )?;
        for (w, s) in &self.steps {
            let states = self
                .crash_states
                .iter()
                .find(|(n, _)| n == w)
                .map_or(0, |(_, c)| *c);
            // Each fault is tried at every step it applies to: the runs per
            // fault follow.
            writeln!(
                f,
                "workload {w}: {s} steps, {states} intermediate crash states"
            )?;
        }
        for (w, why) in &self.skipped {
            writeln!(f, "workload {w}: {why}")?;
        }
        for (kind, t) in &self.by_fault {
            writeln!(f, "  {kind}: {} runs, {} violations", t.runs, t.violations)?;
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
pub struct SimRunner<'a> {
    start: &'a Start,
    mode: Mode,
    threads: usize,
}

/// Overrides the number of threads a runner explores on
/// ([`SimRunner::threads`]).
pub const THREADS_ENV: &str = "CSI_SIM_THREADS";

/// A single-threaded runtime: a run's futures are not `Send`, and every
/// run is driven on the thread that made its world.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

impl<'a> SimRunner<'a> {
    /// A runner for the driver `start` starts, exploring on as many
    /// threads as the machine has cores (or `CSI_SIM_THREADS`).
    pub fn new(start: &'a Start) -> Self {
        let threads = std::env::var(THREADS_ENV)
            .ok()
            .and_then(|n| n.parse().ok())
            .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
            .unwrap_or(1);
        SimRunner {
            start,
            mode: Mode::SingleNodeWriter,
            threads,
        }
    }

    /// Explores on `n` threads (at least one). Runs are independent, each
    /// on its own world, and the report lists them in the same order
    /// whatever `n` is.
    pub fn threads(mut self, n: usize) -> Self {
        self.threads = n.max(1);
        self
    }

    /// What the driver declares, as its data view says
    /// ([`DataView::declared`]) once started on a fresh world; `None` when
    /// it does not say or does not start.
    pub fn declared(&self) -> Option<crate::targets::Declared> {
        let world = World::new(None).ok()?;
        let services = runtime().block_on((self.start)(&world)).ok()?;
        services.data.declared()
    }

    /// The access mode the CO asks for (SINGLE_NODE_WRITER by default;
    /// Kubernetes asks SINGLE_NODE_MULTI_WRITER for a ReadWriteOnce volume
    /// of a driver that declares it, so two pods on the node may share it).
    pub fn access_mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Every step of `workload` with every fault; a replay of one run
    /// instead when `CSI_SIM_REPLAY` names one of this workload.
    pub fn explore(&self, workload: &SimWorkload, report: &mut SimReport) {
        self.explore_scenario(workload, report)
    }

    /// Every step of `scenario` with every fault, and after a crash at a
    /// step every intermediate crash state the filesystem had there.
    pub(crate) fn explore_scenario(&self, scenario: &dyn Scenario, report: &mut SimReport) {
        let rt = runtime();
        if let Ok(spec) = std::env::var("CSI_SIM_REPLAY") {
            if spec.split(':').next() == Some(scenario.name()) {
                match self.replay_in(&rt, scenario, &spec) {
                    Ok((trace, violations)) => {
                        // A fault planned where it does not apply (a provider
                        // fault at a file step), or past the run's end, never
                        // fires: the run had none.
                        if !trace.iter().any(|l| l.contains(FIRED_MARK)) {
                            report.unreached += 1;
                        }
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
        let (effects, start_steps, violations) = self.run(&rt, scenario, None);
        let steps = effects.len() as u64;
        report.runs += 1;
        report.violations.extend(violations);
        // The start is the same in every workload: explored once.
        let first = match report.start_steps {
            0 => 0,
            _ => start_steps,
        };
        report.start_steps = start_steps;
        let plans: Vec<(u64, SimFault)> = (first..steps)
            .flat_map(|k| {
                let here = effects[k as usize];
                (FAULTS.into_iter())
                    .filter(move |f| f.applies_to(here))
                    .map(move |f| (k, f))
            })
            .collect();
        let mut crash_states = 0;
        for (part, states) in self.on_threads(&plans, |rt, plan, part| {
            self.run_planned(rt, scenario, plan, part)
        }) {
            report.merge(part);
            crash_states += states;
        }
        report.steps.push((scenario.name().to_owned(), steps));
        report
            .crash_states
            .push((scenario.name().to_owned(), crash_states));
    }

    /// `run(rt, plan, report)` for every plan, on up to `self.threads`
    /// threads, each with its own runtime; each plan's report and result
    /// in the order of `plans`.
    fn on_threads<F>(&self, plans: &[(u64, SimFault)], run: F) -> Vec<(SimReport, u64)>
    where
        F: Fn(&tokio::runtime::Runtime, (u64, SimFault), &mut SimReport) -> u64 + Sync,
    {
        let next = AtomicUsize::new(0);
        let worker = || {
            let rt = runtime();
            let mut done = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&plan) = plans.get(i) else {
                    return done;
                };
                let mut part = SimReport::default();
                let result = run(&rt, plan, &mut part);
                done.push((i, part, result));
            }
        };
        let threads = self.threads.min(plans.len()).max(1);
        let mut done: Vec<_> = std::thread::scope(|s| {
            let workers: Vec<_> = (1..threads).map(|_| s.spawn(worker)).collect();
            let mut done = worker();
            for w in workers {
                match w.join() {
                    Ok(d) => done.extend(d),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
            done
        });
        done.sort_by_key(|(i, ..)| *i);
        done.into_iter().map(|(_, part, r)| (part, r)).collect()
    }

    /// The run with `plan`, and after a crash the runs with each
    /// intermediate state the filesystem could keep there; how many of
    /// those there were.
    fn run_planned(
        &self,
        rt: &tokio::runtime::Runtime,
        scenario: &dyn Scenario,
        (k, fault): (u64, SimFault),
        report: &mut SimReport,
    ) -> u64 {
        let world = self.run_world(rt, scenario, Some((k, fault)), report);
        if world.as_ref().is_some_and(|w| w.fired().is_none()) {
            report.unreached += 1;
        }
        if fault != SimFault::Crash {
            return 0;
        }
        let states = world.map_or(0, |w| w.crash_states_seen());
        for i in 0..states {
            self.run_world(rt, scenario, Some((k, SimFault::CrashState(i))), report);
        }
        states as u64
    }

    /// Every step of a simulated kubelet's `workload` (see
    /// [`kubelet`](crate::kubelet)) with every fault, like [`explore`](Self::explore).
    pub fn explore_kubelet(&self, workload: &KubeletWorkload, report: &mut SimReport) {
        self.explore_scenario(workload, report)
    }

    /// One run named `workload:step:fault`, with its trace.
    pub fn replay(
        &self,
        workload: &SimWorkload,
        spec: &str,
    ) -> Result<(Vec<String>, Vec<Violation>), String> {
        self.replay_scenario(workload, spec)
    }

    pub(crate) fn replay_scenario(
        &self,
        scenario: &dyn Scenario,
        spec: &str,
    ) -> Result<(Vec<String>, Vec<Violation>), String> {
        self.replay_in(&runtime(), scenario, spec)
    }

    fn replay_in(
        &self,
        rt: &tokio::runtime::Runtime,
        scenario: &dyn Scenario,
        spec: &str,
    ) -> Result<(Vec<String>, Vec<Violation>), String> {
        let mut parts = spec.split(':');
        let (Some(_), Some(step), Some(fault), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err("expected workload:step:fault".into());
        };
        let step: u64 = step.parse().map_err(|e| format!("step {step:?}: {e}"))?;
        let fault: SimFault = fault.parse().map_err(|e| format!("{e}"))?;
        let world = World::new(Some((step, fault))).map_err(|e| e.to_string())?;
        world.trace();
        let (violations, _) = self.run_in(rt, &world, scenario, Some((step, fault)));
        let mut trace = world.traced();
        if world.fired().is_none() {
            trace.push(format!(
                "{fault} did not fire: no step {step} it applies to was reached, so the run had \
                 no fault"
            ));
        }
        Ok((trace, violations))
    }

    /// One run, counted in `report`; its world.
    fn run_world(
        &self,
        rt: &tokio::runtime::Runtime,
        scenario: &dyn Scenario,
        plan: Option<(u64, SimFault)>,
        report: &mut SimReport,
    ) -> Option<World> {
        report.runs += 1;
        let tally = plan.map(|(_, f)| report.by_fault.entry(f.kind()).or_default());
        if let Some(t) = tally {
            t.runs += 1;
        }
        let world = match World::new(plan) {
            Ok(w) => w,
            Err(e) => {
                report
                    .violations
                    .push(violation(scenario, plan, format!("no world: {e}")));
                return None;
            }
        };
        let (violations, _) = self.run_in(rt, &world, scenario, plan);
        if let Some((_, f)) = plan {
            report.by_fault.entry(f.kind()).or_default().violations += violations.len() as u64;
        }
        report.violations.extend(violations);
        Some(world)
    }

    /// One run; the kind of each of its steps, the steps of the driver's
    /// first start, and its violations.
    fn run(
        &self,
        rt: &tokio::runtime::Runtime,
        scenario: &dyn Scenario,
        plan: Option<(u64, SimFault)>,
    ) -> (Vec<Effect>, u64, Vec<Violation>) {
        let world = match World::new(plan) {
            Ok(w) => w,
            Err(e) => {
                return (
                    Vec::new(),
                    0,
                    vec![violation(scenario, plan, format!("no world: {e}"))],
                );
            }
        };
        let (violations, start_steps) = self.run_in(rt, &world, scenario, plan);
        (world.effects(), start_steps, violations)
    }

    fn run_in(
        &self,
        rt: &tokio::runtime::Runtime,
        world: &World,
        scenario: &dyn Scenario,
        plan: Option<(u64, SimFault)>,
    ) -> (Vec<Violation>, u64) {
        let (found, start_steps) = rt.block_on(scenario.run(self.start, world, self.mode));
        let found = found
            .into_iter()
            .map(|what| violation(scenario, plan, what))
            .collect();
        (found, start_steps)
    }
}

/// Something the runner explores step by step: a CO's workload of calls,
/// or a simulated kubelet's sequence of desired-state changes.
pub(crate) trait Scenario: Sync {
    /// Its name, in reports and replays.
    fn name(&self) -> &'static str;

    /// One run on `world` (with its fault planned).
    fn run<'a>(
        &'a self,
        start: &'a Start,
        world: &'a World,
        mode: Mode,
    ) -> LocalFuture<'a, Outcome>;
}

/// What broke in a run, and the steps made when the driver first started.
pub(crate) type Outcome = (Vec<String>, u64);

/// A boxed future run on the runner's single thread.
pub(crate) type LocalFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + 'a>>;

impl Scenario for SimWorkload {
    fn name(&self) -> &'static str {
        self.name
    }

    fn run<'a>(
        &'a self,
        start: &'a Start,
        world: &'a World,
        mode: Mode,
    ) -> LocalFuture<'a, Outcome> {
        Box::pin(self.perform_all(start, world, mode))
    }
}

impl SimWorkload {
    /// Performs every call, checking the invariants after each answer.
    async fn perform_all(&self, start: &Start, world: &World, mode: Mode) -> Outcome {
        let mut co = Co::new(world, start, mode);
        let mut found = Vec::new();
        for (i, call) in self.calls.iter().enumerate() {
            if let Err(e) = co.perform(call).await {
                found.push(format!("call {i} ({call:?}): {e}"));
                break;
            }
            if let Err(e) = co.check().await {
                found.push(format!("after call {i} ({call:?}): {e}"));
                break;
            }
        }
        (found, co.start_steps.unwrap_or(0))
    }
}

fn violation(scenario: &dyn Scenario, plan: Option<(u64, SimFault)>, what: String) -> Violation {
    Violation {
        workload: scenario.name().to_owned(),
        step: plan.map(|p| p.0),
        fault: plan.map(|p| p.1),
        what,
    }
}
