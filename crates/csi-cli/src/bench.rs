//! `csi bench`: a load generator for any CSI driver.
//!
//! Workers run a workload in a loop until a duration or an iteration count is
//! reached, timing every RPC. Every volume the bench creates is recorded in a
//! registry with how far it got (controller-published, staged, published), and
//! whatever is left at the end (after an error or Ctrl-C) is torn down in
//! reverse order before the summary is printed.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use csi_client::{CsiClient, UnaryRequest};
use csi_proto::v1::controller_service_capability::rpc::Type as CtrlCap;
use csi_proto::v1::node_service_capability::rpc::Type as NodeCap;
use csi_proto::v1::*;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};

use crate::args::{CapabilityArgs, parse_kv, parse_size, to_map};
use crate::output::Format;

/// What each iteration does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// Probe only: the round-trip cost of the driver and its framework.
    Probe,
    /// CreateVolume then DeleteVolume.
    CreateDelete,
    /// Create → (ControllerPublish) → (NodeStage) → NodePublish → NodeUnpublish
    /// → (NodeUnstage) → (ControllerUnpublish) → Delete.
    Lifecycle,
}

/// Arguments of `csi bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// The workload to run.
    #[arg(long, value_enum, default_value_t = Workload::Probe)]
    workload: Workload,
    /// Concurrent workers.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// How long to run (e.g. 10s, 500ms, 2m); default 10s unless --count is given.
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// How many iterations to run in total.
    #[arg(long, conflicts_with = "duration")]
    count: Option<u64>,
    /// Size of each volume.
    #[arg(long, value_parser = parse_size, default_value = "1Mi")]
    size: i64,
    #[command(flatten)]
    cap: CapabilityArgs,
    /// A CreateVolume parameter (repeatable).
    #[arg(long = "param", value_parser = parse_kv)]
    params: Vec<(String, String)>,
    /// Parent directory for staging and target paths (default: a new temp dir).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Each worker waits this long between its iterations (e.g. 12ms), not
    /// timed: a CO calls a driver now and then, and a call to a process that
    /// has been idle costs more than one in a tight loop.
    #[arg(long, value_parser = parse_duration)]
    pause: Option<Duration>,
    /// Do not draw a progress bar.
    #[arg(long)]
    no_progress: bool,
}

/// Parses `10s`, `500ms`, `2m`, `1h` or plain seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (num, unit) = text.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 10s"))?;
    match unit {
        "" | "s" => Ok(Duration::from_secs(n)),
        "ms" => Ok(Duration::from_millis(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        "h" => Ok(Duration::from_secs(n * 3600)),
        _ => Err(format!(
            "{text:?}: unknown unit {unit:?} (use ms, s, m or h)"
        )),
    }
}

/// Latencies and errors of one worker (merged at the end).
#[derive(Default)]
struct Stats {
    latency: BTreeMap<&'static str, Histogram<u64>>,
    errors: BTreeMap<(&'static str, String), u64>,
}

impl Stats {
    /// Failed calls of `rpc`, whatever their code.
    fn errors_of(&self, rpc: &str) -> u64 {
        self.errors
            .iter()
            .filter(|((r, _), _)| *r == rpc)
            .map(|(_, n)| n)
            .sum()
    }

    fn record(&mut self, rpc: &'static str, took: Duration, result: Result<(), tonic::Code>) {
        let h = self.latency.entry(rpc).or_insert_with(|| {
            Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds")
        });
        let _ = h.record(took.as_micros().clamp(1, 3_600_000_000) as u64);
        if let Err(code) = result {
            *self.errors.entry((rpc, format!("{code:?}"))).or_default() += 1;
        }
    }

    fn merge(&mut self, other: Stats) {
        for (rpc, h) in other.latency {
            match self.latency.get_mut(rpc) {
                Some(mine) => {
                    let _ = mine.add(&h);
                }
                None => {
                    self.latency.insert(rpc, h);
                }
            }
        }
        for (k, n) in other.errors {
            *self.errors.entry(k).or_default() += n;
        }
    }
}

/// How far a volume created by the bench got, so cleanup can undo it.
#[derive(Debug, Clone, Default)]
struct Progress {
    controller_published: bool,
    staged: Option<String>,
    published: Option<String>,
}

/// Everything the workers share.
struct Shared {
    client: CsiClient,
    workload: Workload,
    capability: VolumeCapability,
    size: i64,
    params: HashMap<String, String>,
    secrets: HashMap<String, String>,
    work_dir: PathBuf,
    node_id: String,
    controller_publish: bool,
    stage: bool,
    stop: AtomicBool,
    started: AtomicU64,
    completed: AtomicU64,
    limit: Option<u64>,
    deadline: Option<Instant>,
    pause: Option<Duration>,
    registry: Mutex<HashMap<String, Progress>>,
    run_id: String,
}

impl Shared {
    fn next_iteration(&self) -> Option<u64> {
        if self.stop.load(Ordering::Relaxed) || self.deadline.is_some_and(|d| Instant::now() >= d) {
            return None;
        }
        let n = self.started.fetch_add(1, Ordering::Relaxed);
        match self.limit {
            Some(limit) if n >= limit => None,
            _ => Some(n),
        }
    }

    fn update(&self, volume_id: &str, f: impl FnOnce(&mut Progress)) {
        if let Some(p) = self
            .registry
            .lock()
            .expect("registry lock")
            .get_mut(volume_id)
        {
            f(p);
        }
    }
}

/// Times one RPC and records it; returns the response or the status code.
/// Sends one request and records its latency and outcome under the RPC's name.
macro_rules! timed {
    ($stats:expr, $client:expr, $req:expr) => {{
        let req = $req;
        let rpc = rpc_name(&req);
        let start = Instant::now();
        let result = $client.call(req).await;
        let took = start.elapsed();
        $stats.record(rpc, took, result.as_ref().map(drop).map_err(|s| s.code()));
        result.map_err(|status| status.code())
    }};
}

fn rpc_name<Req: UnaryRequest>(_: &Req) -> &'static str {
    Req::METHOD.name()
}

/// Runs the bench and prints the summary.
pub async fn run(
    client: CsiClient,
    args: BenchArgs,
    out: Format,
    secrets: HashMap<String, String>,
) -> Result<std::process::ExitCode, String> {
    if args.workers == 0 {
        return Err("--workers must be at least 1".into());
    }
    let (controller_publish, stage, node_id) = discover(&client, args.workload).await?;
    let own_dir = args.work_dir.is_none();
    let work_dir = match &args.work_dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("csi-bench-{}", std::process::id())),
    };
    if args.workload == Workload::Lifecycle {
        std::fs::create_dir_all(&work_dir)
            .map_err(|e| format!("cannot create {}: {e}", work_dir.display()))?;
    }
    let duration = match (args.duration, args.count) {
        (None, None) => Some(Duration::from_secs(10)),
        (d, _) => d,
    };
    let shared = Arc::new(Shared {
        client,
        workload: args.workload,
        capability: args.cap.capability(),
        size: args.size,
        params: to_map(&args.params),
        secrets,
        work_dir: work_dir.clone(),
        node_id,
        controller_publish,
        stage,
        stop: AtomicBool::new(false),
        started: AtomicU64::new(0),
        completed: AtomicU64::new(0),
        limit: args.count,
        deadline: duration.map(|d| Instant::now() + d),
        // `--pause 0` means none: a zero tokio sleep still waits for the
        // timer's next millisecond tick.
        pause: args.pause.filter(|p| !p.is_zero()),
        registry: Mutex::new(HashMap::new()),
        run_id: format!(
            "{}-{}",
            std::process::id(),
            Instant::now().elapsed().subsec_nanos()
        ),
    });

    let progress = progress_bar(&args, out, duration);
    let ticker = {
        let shared = shared.clone();
        let progress = progress.clone();
        tokio::spawn(async move {
            loop {
                progress.set_position(shared.completed.load(Ordering::Relaxed));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let interrupt = {
        let shared = shared.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                shared.stop.store(true, Ordering::Relaxed);
            }
        })
    };

    let started = Instant::now();
    let workers: Vec<_> = (0..args.workers)
        .map(|w| {
            let shared = shared.clone();
            tokio::spawn(async move { worker(shared, w).await })
        })
        .collect();
    let mut stats = Stats::default();
    for w in workers {
        stats.merge(w.await.map_err(|e| format!("worker failed: {e}"))?);
    }
    let elapsed = started.elapsed();
    ticker.abort();
    interrupt.abort();
    progress.finish_and_clear();

    let leftover = cleanup(&shared, &mut stats).await;
    if own_dir && args.workload == Workload::Lifecycle {
        let _ = std::fs::remove_dir(&work_dir);
    }
    let interrupted = shared.stop.load(Ordering::Relaxed);
    let iterations = shared.completed.load(Ordering::Relaxed);
    print_summary(
        &args,
        out,
        &stats,
        elapsed,
        iterations,
        &leftover,
        interrupted,
    );
    if !leftover.is_empty() {
        return Err(format!(
            "{} volume(s) could not be cleaned up: {}",
            leftover.len(),
            leftover.join(", ")
        ));
    }
    if iterations == 0 && !interrupted {
        return Err("no iteration succeeded".into());
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// Which optional steps the lifecycle needs, and the node id to publish to.
async fn discover(client: &CsiClient, workload: Workload) -> Result<(bool, bool, String), String> {
    if workload != Workload::Lifecycle {
        return Ok((false, false, String::new()));
    }
    async fn ask<Req: UnaryRequest>(client: &CsiClient, req: Req) -> Result<Req::Response, String> {
        client
            .call(req)
            .await
            .map_err(|s| format!("{}: {:?}: {}", Req::METHOD.name(), s.code(), s.message()))
    }
    let ctrl = ask(client, ControllerGetCapabilitiesRequest {}).await?;
    let node = ask(client, NodeGetCapabilitiesRequest {}).await?;
    let info = ask(client, NodeGetInfoRequest {}).await?;
    let controller_publish = ctrl
        .capabilities
        .iter()
        .any(|c| c.rpc_type() == Some(CtrlCap::PublishUnpublishVolume));
    let stage = node
        .capabilities
        .iter()
        .any(|c| c.rpc_type() == Some(NodeCap::StageUnstageVolume));
    Ok((controller_publish, stage, info.node_id))
}

fn progress_bar(args: &BenchArgs, out: Format, duration: Option<Duration>) -> ProgressBar {
    if args.no_progress || out == Format::Json {
        return ProgressBar::hidden();
    }
    match (args.count, duration) {
        (Some(n), _) => {
            let bar = ProgressBar::new(n);
            bar.set_style(
                ProgressStyle::with_template("{bar:40} {pos}/{len} iterations {per_sec} {elapsed}")
                    .expect("valid template"),
            );
            bar
        }
        (None, d) => {
            let bar = ProgressBar::new_spinner();
            let total = d.map(|d| format!("{:?}", d)).unwrap_or_default();
            bar.set_style(
                ProgressStyle::with_template(&format!(
                    "{{spinner}} {{pos}} iterations {{per_sec}} {{elapsed}}/{total}"
                ))
                .expect("valid template"),
            );
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        }
    }
}

async fn worker(shared: Arc<Shared>, index: usize) -> Stats {
    let mut stats = Stats::default();
    // The worker's paths; a failed iteration may leave its volume there
    // (for the cleanup), so the next one moves to fresh paths.
    let mut paths = format!("worker-{index}");
    let mut failures = 0;
    // A worker's first iteration starts at once; `--pause` goes between.
    let mut pause_before = None;
    while let Some(n) = shared.next_iteration() {
        if let Some(pause) = pause_before {
            tokio::time::sleep(pause).await;
        }
        pause_before = shared.pause;
        let ok = match shared.workload {
            Workload::Probe => timed!(stats, shared.client, ProbeRequest {}).is_ok(),
            Workload::CreateDelete | Workload::Lifecycle => {
                iteration(
                    &shared,
                    &mut stats,
                    &format!("csi-bench-{}-{index}-{n}", shared.run_id),
                    &paths,
                )
                .await
            }
        };
        if ok {
            shared.completed.fetch_add(1, Ordering::Relaxed);
        } else {
            failures += 1;
            paths = format!("worker-{index}-{failures}");
        }
    }
    stats
}

/// One create … delete iteration; a failed step stops it and leaves the
/// volume in the registry for cleanup. It stages and publishes under
/// `paths`, which a worker keeps from one iteration to the next, as a CO
/// reuses a path once it is unpublished and unstaged: making and removing
/// directories is the client's own work, which would take the CPU the
/// driver under test needs (on ext4 without a journal each mkdir scans
/// past the inodes deleted in the last minutes).
async fn iteration(shared: &Shared, stats: &mut Stats, name: &str, paths: &str) -> bool {
    let req = CreateVolumeRequest {
        name: name.to_owned(),
        capacity_range: Some(CapacityRange::at_least(shared.size)),
        volume_capabilities: vec![shared.capability.clone()],
        parameters: shared.params.clone(),
        secrets: shared.secrets.clone(),
        ..Default::default()
    };
    let Ok(resp) = timed!(stats, shared.client, req) else {
        return false;
    };
    let Some(volume) = resp.volume else {
        return false;
    };
    let id = volume.volume_id;
    shared
        .registry
        .lock()
        .expect("registry lock")
        .insert(id.clone(), Progress::default());

    if shared.workload == Workload::Lifecycle {
        let dir = shared.work_dir.join(paths);
        if !dir.is_dir() && std::fs::create_dir_all(&dir).is_err() {
            return false;
        }
        let mut publish_context = HashMap::new();
        if shared.controller_publish {
            let req = ControllerPublishVolumeRequest {
                volume_id: id.clone(),
                node_id: shared.node_id.clone(),
                volume_capability: Some(shared.capability.clone()),
                secrets: shared.secrets.clone(),
                volume_context: volume.volume_context.clone(),
                readonly: false,
            };
            match timed!(stats, shared.client, req) {
                Ok(r) => publish_context = r.publish_context,
                Err(_) => return false,
            }
            shared.update(&id, |p| p.controller_published = true);
        }
        let staging = dir.join("staging");
        if shared.stage {
            if !staging.is_dir() && std::fs::create_dir_all(&staging).is_err() {
                return false;
            }
            let req = NodeStageVolumeRequest {
                volume_id: id.clone(),
                publish_context: publish_context.clone(),
                staging_target_path: path_str(&staging),
                volume_capability: Some(shared.capability.clone()),
                secrets: shared.secrets.clone(),
                volume_context: volume.volume_context.clone(),
            };
            if timed!(stats, shared.client, req).is_err() {
                return false;
            }
            shared.update(&id, |p| p.staged = Some(path_str(&staging)));
        }
        let target = dir.join("target");
        let req = NodePublishVolumeRequest {
            volume_id: id.clone(),
            publish_context,
            staging_target_path: if shared.stage {
                path_str(&staging)
            } else {
                String::new()
            },
            target_path: path_str(&target),
            volume_capability: Some(shared.capability.clone()),
            readonly: false,
            secrets: shared.secrets.clone(),
            volume_context: volume.volume_context.clone(),
        };
        if timed!(stats, shared.client, req).is_err() {
            return false;
        }
        shared.update(&id, |p| p.published = Some(path_str(&target)));
        return teardown(shared, stats, &id).await;
    }
    teardown(shared, stats, &id).await
}

/// Undoes whatever the registry says was done to `id`, in reverse order.
async fn teardown(shared: &Shared, stats: &mut Stats, id: &str) -> bool {
    let Some(progress) = shared
        .registry
        .lock()
        .expect("registry lock")
        .get(id)
        .cloned()
    else {
        return true;
    };
    if let Some(target) = progress.published {
        let req = NodeUnpublishVolumeRequest {
            volume_id: id.to_owned(),
            target_path: target,
        };
        if timed!(stats, shared.client, req).is_err() {
            return false;
        }
        shared.update(id, |p| p.published = None);
    }
    if let Some(staging) = progress.staged {
        let req = NodeUnstageVolumeRequest {
            volume_id: id.to_owned(),
            staging_target_path: staging,
        };
        if timed!(stats, shared.client, req).is_err() {
            return false;
        }
        shared.update(id, |p| p.staged = None);
    }
    if progress.controller_published {
        let req = ControllerUnpublishVolumeRequest {
            volume_id: id.to_owned(),
            node_id: shared.node_id.clone(),
            secrets: shared.secrets.clone(),
        };
        if timed!(stats, shared.client, req).is_err() {
            return false;
        }
        shared.update(id, |p| p.controller_published = false);
    }
    let req = DeleteVolumeRequest {
        volume_id: id.to_owned(),
        secrets: shared.secrets.clone(),
    };
    if timed!(stats, shared.client, req).is_err() {
        return false;
    }
    shared.registry.lock().expect("registry lock").remove(id);
    true
}

/// Tears down every volume still in the registry (a few attempts each);
/// returns the ids that could not be removed.
async fn cleanup(shared: &Shared, stats: &mut Stats) -> Vec<String> {
    for _attempt in 0..3 {
        let ids: Vec<String> = shared
            .registry
            .lock()
            .expect("registry lock")
            .keys()
            .cloned()
            .collect();
        if ids.is_empty() {
            break;
        }
        for id in ids {
            teardown(shared, stats, &id).await;
        }
    }
    let _ = std::fs::read_dir(&shared.work_dir).map(|entries| {
        for e in entries.flatten() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    });
    shared
        .registry
        .lock()
        .expect("registry lock")
        .keys()
        .cloned()
        .collect()
}

fn path_str(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn millis(us: u64) -> f64 {
    us as f64 / 1000.0
}

fn print_summary(
    args: &BenchArgs,
    out: Format,
    stats: &Stats,
    elapsed: Duration,
    iterations: u64,
    leftover: &[String],
    interrupted: bool,
) {
    let secs = elapsed.as_secs_f64().max(1e-9);
    let throughput = iterations as f64 / secs;
    if out == Format::Json {
        let rpcs: serde_json::Map<String, serde_json::Value> = stats
            .latency
            .iter()
            .map(|(rpc, h)| {
                let errors = stats.errors_of(rpc);
                (
                    rpc.to_string(),
                    serde_json::json!({
                        "count": h.len(),
                        "errors": errors,
                        "p50_ms": millis(h.value_at_quantile(0.50)),
                        "p90_ms": millis(h.value_at_quantile(0.90)),
                        "p99_ms": millis(h.value_at_quantile(0.99)),
                        "max_ms": millis(h.max()),
                    }),
                )
            })
            .collect();
        let errors: Vec<_> = stats
            .errors
            .iter()
            .map(|((rpc, code), n)| serde_json::json!({"rpc": rpc, "code": code, "count": n}))
            .collect();
        let doc = serde_json::json!({
            "workload": format!("{:?}", args.workload),
            "workers": args.workers,
            "pause_ms": args.pause.map(|p| p.as_secs_f64() * 1e3),
            "elapsed_seconds": secs,
            "iterations": iterations,
            "iterations_per_second": throughput,
            "interrupted": interrupted,
            "rpcs": rpcs,
            "errors": errors,
            "leftover_volumes": leftover,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).expect("JSON prints")
        );
        return;
    }
    println!(
        "workload {:?}, {} worker(s){}, {:.2}s{}: {} iterations, {:.1}/s",
        args.workload,
        args.workers,
        args.pause
            .map(|p| format!(", {p:?} between iterations"))
            .unwrap_or_default(),
        secs,
        if interrupted { " (interrupted)" } else { "" },
        iterations,
        throughput
    );
    println!(
        "{:<26} {:>8} {:>7} {:>9} {:>9} {:>9} {:>9}",
        "rpc", "count", "errors", "p50 ms", "p90 ms", "p99 ms", "max ms"
    );
    for (rpc, h) in &stats.latency {
        let errors = stats.errors_of(rpc);
        println!(
            "{:<26} {:>8} {:>7} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
            rpc,
            h.len(),
            errors,
            millis(h.value_at_quantile(0.50)),
            millis(h.value_at_quantile(0.90)),
            millis(h.value_at_quantile(0.99)),
            millis(h.max())
        );
    }
    if !stats.errors.is_empty() {
        println!("errors by code:");
        for ((rpc, code), n) in &stats.errors {
            println!("  {rpc} {code}: {n}");
        }
    }
    println!("cleanup: {} volume(s) left behind", leftover.len());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert!(parse_duration("3 weeks").is_err());
    }

    #[test]
    fn stats_merge_adds_counts_and_errors() {
        let mut a = Stats::default();
        a.record("Probe", Duration::from_micros(100), Ok(()));
        let mut b = Stats::default();
        b.record(
            "Probe",
            Duration::from_micros(300),
            Err(tonic::Code::Aborted),
        );
        b.record("CreateVolume", Duration::from_millis(2), Ok(()));
        a.merge(b);
        assert_eq!(a.latency["Probe"].len(), 2);
        assert_eq!(a.latency["CreateVolume"].len(), 1);
        assert_eq!(a.errors[&("Probe", "Aborted".to_string())], 1);
    }
}
