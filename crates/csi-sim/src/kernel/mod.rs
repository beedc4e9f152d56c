//! The real-kernel companion (feature `kernel`): the same workloads as
//! the simulator, run against a driver's own program on real mounts, loop
//! devices and filesystems, with a SIGKILL at every step.
//!
//! The driver is built with crash-points armed (its test builds), so a
//! process started with `CSI_KIT_CRASH_AT=<k>` dies right before its k-th
//! effect (`<k>:after`: right after it). For each workload the driver
//! supports, [`explore`] runs it once with a trace to count its steps N,
//! then once for every k in 1..=N (and after the last step of every call):
//! the driver dies there, is started again without the hook on the same
//! state, and the CO retries as Kubernetes does (an uncertain stage or
//! publish retried until certain, a pod deleted meanwhile torn down) until
//! the workload is done. Checked on the real world: every acknowledged
//! volume and snapshot is listed and keeps the data written through its
//! pods, read-only publications are read-only, every call gets its final
//! answer, and at the end nothing is listed, mounted under the run's
//! directory, attached from its files or left in the driver's data
//! directories. A violation prints `workload:step:before|after`;
//! `CSI_KIT_CRASH_REPLAY=workload:step:before|after` runs that one alone
//! and prints its events and the driver's log.
//!
//! A target whose storage is a process of its own (a cloud provider) names
//! it among its [`Auxiliary`] processes: each run starts them in its
//! directory before the driver, only the driver is killed, and they are
//! stopped once the run is checked (whatever they left attached under the
//! run's directory is detached then).
//!
//! It needs root (mounts, loop devices) and runs each workload in a
//! private mount namespace.

mod auxiliary;
mod check;
mod co;
mod process;

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crash_points::{CrashPlan, When};
use futures::StreamExt;

pub use auxiliary::Auxiliary;
pub use process::Layout;

use crate::workload::{SimWorkload, workloads};
use auxiliary::AuxiliaryProcess;
use co::Co;

/// The variable naming one run to replay: `workload:step:before|after`.
pub const REPLAY_ENV: &str = "CSI_KIT_CRASH_REPLAY";

/// A workload name with this suffix (`lifecycle+block`) in
/// [`KernelTarget::workloads`] is that workload with block volumes: the
/// CO's data is written to the device, not a file.
pub const BLOCK_SUFFIX: &str = "+block";

/// A workload name with this suffix (`expand-online+xfs`) in
/// [`KernelTarget::workloads`] is that workload with mount volumes of xfs,
/// each at least [`XFS_MIN_VOLUME`]: an xfs grows while mounted with
/// CAP_SYS_ADMIN alone, where an ext4 also needs CAP_SYS_RESOURCE, which
/// some sandboxes drop for root.
pub const XFS_SUFFIX: &str = "+xfs";

/// Bytes of the smallest xfs volume (mkfs.xfs refuses under 300 MiB).
pub const XFS_MIN_VOLUME: i64 = 320 << 20;

/// A workload's name without [`BLOCK_SUFFIX`] or [`XFS_SUFFIX`].
fn base_name(name: &str) -> &str {
    [BLOCK_SUFFIX, XFS_SUFFIX]
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix))
        .unwrap_or(name)
}

/// The variable setting how many runs go at once (default 2).
pub const JOBS_ENV: &str = "CSI_KIT_CRASH_JOBS";

/// A driver program under test.
#[derive(Debug, Clone)]
pub struct KernelTarget {
    /// Its name, in reports.
    pub name: &'static str,
    /// The program, built with crash-points armed.
    pub program: PathBuf,
    /// Its flags for a run's directories: the state directory, the
    /// endpoint `unix://{socket}`, the node id, the fastest settings.
    pub args: fn(&Layout) -> Vec<String>,
    /// The node id it reports.
    pub node_id: &'static str,
    /// Bytes a workload's GiB becomes (small volumes are fast).
    pub volume_unit: i64,
    /// Directories holding volume and snapshot data, empty once all are
    /// deleted.
    pub data_dirs: fn(&Layout) -> Vec<PathBuf>,
    /// The workloads of [`workloads`] it supports, by name (with
    /// [`BLOCK_SUFFIX`]: with block volumes).
    pub workloads: &'static [&'static str],
    /// Variables it is started with (a test's token, never a real secret).
    pub env: &'static [(&'static str, &'static str)],
    /// Processes started before it in each run, which its crash spares;
    /// their addresses are in the [`Layout`] its `args` get.
    pub auxiliaries: Vec<Auxiliary>,
}

/// An invariant that did not hold, with the run that shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelViolation {
    /// The workload.
    pub workload: String,
    /// Where the driver was killed (`None`: the run without a crash).
    pub plan: Option<CrashPlan>,
    /// What broke.
    pub what: String,
}

impl KernelViolation {
    /// `workload:step:before|after`, the value of [`REPLAY_ENV`] that
    /// reruns it.
    pub fn replay_spec(&self) -> String {
        match self.plan {
            Some(p) => format!("{}:{p}", self.workload),
            None => format!("{}:-", self.workload),
        }
    }
}

impl fmt::Display for KernelViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let spec = self.replay_spec();
        write!(f, "{spec} ({REPLAY_ENV}={spec}): {}", self.what)
    }
}

/// What a campaign covered and found.
#[derive(Debug, Clone, Default)]
pub struct KernelReport {
    /// The driver.
    pub driver: String,
    /// Steps of each workload's run without a crash, start included.
    pub steps: Vec<(String, u64)>,
    /// Steps of the driver's first start (explored with the first
    /// workload only: the same in every one).
    pub start_steps: u64,
    /// The workloads' steps by kind (`mount`, `provider-attach`, ...),
    /// from the runs without a crash.
    pub kinds: std::collections::BTreeMap<String, u64>,
    /// Runs executed.
    pub runs: u64,
    /// Runs in which the driver never reached its planned step (it took
    /// another path than the counting run).
    pub unreached: u64,
    /// Invariant violations.
    pub violations: Vec<KernelViolation>,
    /// Standard workloads, or parts of one, not run against this driver,
    /// and why: printed, so nothing is left out silently.
    pub skipped: Vec<(String, String)>,
    /// Wall time.
    pub elapsed: Duration,
}

impl fmt::Display for KernelReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}: start {} steps (explored once)",
            self.driver, self.start_steps
        )?;
        for (w, s) in &self.steps {
            writeln!(f, "  workload {w}: {s} steps")?;
        }
        for (w, why) in &self.skipped {
            writeln!(f, "  workload {w}: {why}")?;
        }
        if !self.kinds.is_empty() {
            let kinds: Vec<String> = self.kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
            writeln!(f, "  steps by kind: {}", kinds.join(", "))?;
        }
        writeln!(
            f,
            "  runs: {} ({} with the planned step unreached) in {:.1?}; invariant violations: {}",
            self.runs,
            self.unreached,
            self.elapsed,
            self.violations.len()
        )?;
        for v in &self.violations {
            writeln!(f, "  {v}")?;
        }
        Ok(())
    }
}

/// [`explore`], the report printed, and a panic unless some run ran and
/// none found a violation: a driver test's whole body.
pub fn assert_survives(target: &KernelTarget) -> KernelReport {
    let report = explore(target);
    println!("{report}");
    assert!(report.runs > 0, "no run");
    assert!(report.violations.is_empty(), "{report}");
    report
}

/// Every step of every workload `target` supports, killed before it, and
/// after the last step of each call; or, when [`REPLAY_ENV`] is set, that
/// one run with its events and the driver's log printed.
pub fn explore(target: &KernelTarget) -> KernelReport {
    let target = target.clone();
    mount_utils::testing::in_private_mount_ns("crash-companion", move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let started = Instant::now();
        let mut report = KernelReport {
            driver: target.name.to_owned(),
            ..KernelReport::default()
        };
        let all = workloads();
        for w in &all {
            let named = |n: &&str| base_name(n) == w.name;
            if !target.workloads.iter().any(named) {
                report.skipped.push((
                    w.name.to_owned(),
                    "not run: not among the workloads the target says its driver serves here"
                        .into(),
                ));
            }
        }
        let mut chosen = Vec::new();
        for name in target.workloads {
            let base = base_name(name);
            match all.iter().find(|w| w.name == base) {
                Some(w) => chosen.push(SimWorkload {
                    name,
                    calls: w.calls.clone(),
                }),
                None => report.violations.push(KernelViolation {
                    workload: (*name).to_owned(),
                    plan: None,
                    what: "no such workload in csi-sim's list".into(),
                }),
            }
        }
        match std::env::var(REPLAY_ENV) {
            Ok(spec) => rt.block_on(replay(&target, &chosen, &spec, &mut report)),
            Err(_) => {
                for w in &chosen {
                    rt.block_on(explore_one(&target, w, &mut report));
                }
            }
        }
        report.elapsed = started.elapsed();
        report
    })
}

async fn explore_one(target: &KernelTarget, w: &SimWorkload, report: &mut KernelReport) {
    let counted = run(target, w, None).await;
    report.runs += 1;
    report.violations.extend(counted.violations);
    for pv in counted.not_cloned {
        report.skipped.push((
            w.name.to_owned(),
            format!(
                "left out: the clone {pv} (its CreateVolume and DeleteVolume): the driver \
                 declares no CLONE_VOLUME, so the CO asks for none"
            ),
        ));
    }
    let Some(trace) = counted.trace else {
        return;
    };
    report.steps.push((w.name.to_owned(), trace.steps));
    // The start is the same in every workload: explored once.
    let first = match report.start_steps {
        0 => 1,
        _ => trace.start_steps + 1,
    };
    report.start_steps = trace.start_steps;
    for kind in &trace.kinds {
        *report.kinds.entry(kind.clone()).or_default() += 1;
    }
    let befores = (first..=trace.steps).map(|step| (step, When::Before));
    let afters = (trace.call_ends.iter().copied())
        .filter(|&s| s >= first)
        .map(|step| (step, When::After));
    let plans: std::collections::BTreeSet<_> = befores.chain(afters).collect();
    let runs = plans
        .into_iter()
        .map(|(step, when)| run(target, w, Some(CrashPlan { step, when })));
    let mut runs = futures::stream::iter(runs).buffer_unordered(jobs());
    let mut found = Vec::new();
    while let Some(r) = runs.next().await {
        report.runs += 1;
        report.unreached += u64::from(!r.died);
        found.extend(r.violations);
    }
    found.sort_by_key(|v| v.plan);
    report.violations.extend(found);
}

/// Runs at once: [`JOBS_ENV`], else 2 (a run mostly waits on its driver).
fn jobs() -> usize {
    let jobs = std::env::var(JOBS_ENV).ok().and_then(|j| j.parse().ok());
    jobs.unwrap_or(2).max(1)
}

async fn replay(
    target: &KernelTarget,
    chosen: &[SimWorkload],
    spec: &str,
    report: &mut KernelReport,
) {
    let Some((name, plan)) = spec.split_once(':') else {
        panic!("{REPLAY_ENV}={spec}: expected workload:step:before|after");
    };
    let Some(w) = chosen.iter().find(|w| w.name == name) else {
        return; // another driver's workload
    };
    let plan = match plan {
        "-" => None,
        p => Some(
            p.parse::<CrashPlan>()
                .unwrap_or_else(|e| panic!("{REPLAY_ENV}: {e}")),
        ),
    };
    let r = run(target, w, plan).await;
    for e in &r.events {
        eprintln!("{e}");
    }
    eprintln!("--- driver log ---\n{}", r.log);
    report.runs += 1;
    report.unreached += u64::from(plan.is_some() && !r.died);
    report.violations.extend(r.violations);
}

/// What the counting run learnt.
struct Trace {
    /// Every step of the workload.
    steps: u64,
    /// Steps of the first start.
    start_steps: u64,
    /// The last step of each call that made any.
    call_ends: Vec<u64>,
    /// Each step's kind, the start's excluded.
    kinds: Vec<String>,
}

/// One run's outcome.
struct RunOutcome {
    violations: Vec<KernelViolation>,
    /// Whether the driver died (the plan fired).
    died: bool,
    /// The counting run's trace.
    trace: Option<Trace>,
    /// Clones the CO did not ask for (the driver declares no CLONE_VOLUME).
    not_cloned: Vec<&'static str>,
    events: Vec<String>,
    log: String,
}

/// One run in a fresh directory: with `plan`, or counting steps without.
async fn run(target: &KernelTarget, w: &SimWorkload, plan: Option<CrashPlan>) -> RunOutcome {
    let dir = tempfile::Builder::new()
        .prefix("crash-companion-")
        .tempdir();
    let dir = match dir {
        Ok(d) => d,
        Err(e) => return RunOutcome::failed(w, plan, format!("no directory: {e}")),
    };
    let mut layout = Layout::new(dir.path());
    let mut auxiliaries = Vec::new();
    for aux in &target.auxiliaries {
        match AuxiliaryProcess::start(aux, &layout).await {
            Ok((p, address)) => {
                layout.addresses.insert(aux.name, address);
                auxiliaries.push(p);
            }
            Err(e) => {
                stop_all(auxiliaries).await;
                check::clean_up(&layout.base);
                return RunOutcome::failed(w, plan, e);
            }
        }
    }
    let trace_file = layout.base.join("trace");
    let block = w.name.ends_with(BLOCK_SUFFIX);
    let mut co = Co::new(target, layout.clone(), block);
    co.xfs = w.name.ends_with(XFS_SUFFIX);
    // What the auxiliaries mounted and attached (a filesystem of its own
    // for the driver's state) is theirs, not the driver's.
    if !auxiliaries.is_empty() {
        let mounts = check::mounts_under(&layout.base).unwrap_or_default();
        co.spared = (mounts, check::loops_under(&layout.base));
    }
    let mut found = Vec::new();
    let mut trace = None;
    match co.start(plan, Some(&trace_file)).await {
        Err(e) => found.push(e),
        Ok(()) => {
            let start_steps = steps_in(&trace_file);
            let mut call_ends = Vec::new();
            for (i, call) in w.calls.iter().enumerate() {
                if let Err(e) = co.perform(call).await {
                    found.push(format!("call {i} ({call:?}): {e}"));
                    break;
                }
                call_ends.push(steps_in(&trace_file));
                if let Err(e) = check::after_call(&mut co).await {
                    found.push(format!("after call {i} ({call:?}): {e}"));
                    break;
                }
            }
            if plan.is_none() {
                // Without a crash every call is answered OK at once.
                found.extend(
                    co.refused
                        .iter()
                        .map(|r| format!("refused without a crash: {r}")),
                );
            }
            if found.is_empty() {
                let steps = call_ends.last().copied().unwrap_or(start_steps);
                if let Err(e) = check::at_end(&co).await {
                    found.push(format!("at the end: {e}"));
                }
                call_ends.dedup();
                trace = plan.is_none().then(|| Trace {
                    steps,
                    start_steps,
                    call_ends,
                    kinds: kinds_in(&trace_file, start_steps),
                });
            }
        }
    }
    // Only the driver crashes: its storage must have lived through the run.
    for p in &mut auxiliaries {
        if let Some(status) = p.exited() {
            found.push(format!("{} ended during the run: {status}", p.name));
        }
    }
    co.stop().await;
    stop_all(auxiliaries).await;
    check::clean_up(&layout.base);
    let mut log = std::fs::read_to_string(layout.log()).unwrap_or_default();
    for aux in &target.auxiliaries {
        let text = std::fs::read_to_string(layout.auxiliary_log(aux.name));
        let text = text.unwrap_or_default();
        log.push_str(&format!("--- {} log ---\n{text}", aux.name));
    }
    RunOutcome {
        violations: found
            .into_iter()
            .map(|what| violation(w, plan, what))
            .collect(),
        died: co.deaths > 0,
        trace,
        not_cloned: std::mem::take(&mut co.not_cloned),
        events: std::mem::take(&mut co.events),
        log,
    }
}

async fn stop_all(auxiliaries: Vec<AuxiliaryProcess>) {
    for p in auxiliaries {
        p.stop().await;
    }
}

impl RunOutcome {
    /// A run that could not be set up.
    fn failed(w: &SimWorkload, plan: Option<CrashPlan>, what: String) -> Self {
        RunOutcome {
            violations: vec![violation(w, plan, what)],
            died: false,
            trace: None,
            not_cloned: Vec::new(),
            events: Vec::new(),
            log: String::new(),
        }
    }
}

/// The kinds of the steps after the first `skip`.
fn kinds_in(trace: &Path, skip: u64) -> Vec<String> {
    let entries = crash_points::read_trace(trace).unwrap_or_default();
    let made = entries.into_iter().filter(|e| e.step > skip);
    made.map(|e| e.kind).collect()
}

fn steps_in(trace: &Path) -> u64 {
    crash_points::read_trace(trace).map_or(0, |t| t.len() as u64)
}

fn violation(w: &SimWorkload, plan: Option<CrashPlan>, what: String) -> KernelViolation {
    KernelViolation {
        workload: w.name.to_owned(),
        plan,
        what,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_violation_names_the_run_that_replays_it() {
        let v = KernelViolation {
            workload: "lifecycle".into(),
            plan: Some(CrashPlan {
                step: 42,
                when: When::After,
            }),
            what: "still mounted".into(),
        };
        assert_eq!(v.replay_spec(), "lifecycle:42:after");
        let text = v.to_string();
        assert!(
            text.contains("CSI_KIT_CRASH_REPLAY=lifecycle:42:after"),
            "{text}"
        );
        let spec = v.replay_spec();
        let (_, plan) = spec.split_once(':').unwrap();
        assert_eq!(plan.parse::<CrashPlan>().unwrap(), v.plan.unwrap());
    }

    #[test]
    fn the_drivers_flags_name_the_runs_directories() {
        let l = Layout::new(Path::new("/tmp/run"));
        assert_eq!(
            l.driver_flags("n1"),
            [
                "--statedir",
                "/tmp/run/state",
                "--endpoint",
                "unix:///tmp/run/csi.sock",
                "--nodeid",
                "n1",
                "--log",
                "warn"
            ]
        );
    }
}
