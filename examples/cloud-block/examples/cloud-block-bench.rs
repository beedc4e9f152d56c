//! The benchmark client of `scripts/bench-cloud-block.sh` (which starts the
//! provider and the driver's controller and node, and cleans up after).
//!
//! Create-to-published time of a 1 GiB ext4 volume, round by round in
//! rotating order on three paths:
//! - through the driver: CreateVolume → ControllerPublishVolume →
//!   NodeStageVolume → NodePublishVolume over its sockets;
//! - direct, the baseline of the overhead: the requests the driver's
//!   controller sends the provider, made by this client over HTTP in the
//!   same order and polled on the same schedule (the driver's
//!   `RetryPolicy`), then the node's storage work done here by hand: wait
//!   for the link, probe the device with `blkid -p` (a device is formatted
//!   only when it holds nothing), `mkfs.ext4 -F -m0`, mount(2), bind
//!   mount(2);
//! - minimal, for reference: create, attach and its action polled every
//!   millisecond; no probe before the format.
//!
//! Also NodeStageVolume of an attached device: its first stage (formats)
//! and a stage of the already formatted device. Teardown is never timed.
//! Root only.

#[path = "support/as_the_driver.rs"]
mod as_the_driver;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use cloud_block::api::{self, Action, ActionStatus, device_link_name};
use cloud_block::client::{HttpProvider, ProviderClient, ProviderError};
use cloud_block::token::{TOKEN_ENV, Token};
use csi_client::CsiClient;
use csi_controller::RetryPolicy;
use csi_driver::v1::volume_capability::access_mode::Mode;
use csi_driver::v1::*;
use mount_utils::{DiskFormat, LinuxMounter, SafeFormatAndMount, SystemExec};
use nix::mount::{MntFlags, MsFlags};

const GIB: i64 = 1 << 30;

#[derive(Debug, Parser)]
struct Args {
    /// The provider's URL (the token is in CLOUD_PROVIDER_TOKEN).
    #[arg(long)]
    provider: String,
    /// The driver's controller endpoint.
    #[arg(long)]
    controller: String,
    /// The driver's node endpoint.
    #[arg(long)]
    node: String,
    /// The node id the node plugin serves as.
    #[arg(long)]
    node_id: String,
    /// The provider's device directory.
    #[arg(long)]
    device_dir: PathBuf,
    /// Where staging and target paths are made.
    #[arg(long)]
    work: PathBuf,
    /// Timed rounds per path (after one warm-up round each).
    #[arg(long, default_value_t = 60)]
    rounds: usize,
    /// The region the driver's controller makes volumes in.
    #[arg(long, default_value = "dev-1")]
    region: String,
}

/// How a direct round talks to the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direct {
    /// The driver's requests, in its order, on its poll schedule.
    SameCalls,
    /// Create, attach, the action polled every millisecond; no probe.
    Minimal,
}

/// Milliseconds of each step of one create-to-published run.
#[derive(Debug, Default, Clone)]
struct Steps {
    create: f64,
    attach: f64,
    stage: f64,
    publish: f64,
}

impl Steps {
    fn total(&self) -> f64 {
        self.create + self.attach + self.stage + self.publish
    }
}

struct Bench {
    args: Args,
    provider: HttpProvider,
    /// The driver's poll schedule.
    retry: RetryPolicy,
    /// The node's storage work done by hand.
    storage: SafeFormatAndMount,
    controller: CsiClient,
    node: CsiClient,
    n: usize,
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

fn cap() -> VolumeCapability {
    VolumeCapability::mount("ext4").with_access_mode(Mode::SingleNodeWriter)
}

/// The `p`th percentile (nearest rank) of `values`.
fn percentile(values: &[f64], p: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// The 2.5th and 97.5th percentiles of median(driver) / median(direct)
/// over rounds drawn with replacement, a round's two paths kept together
/// (they ran back to back). Seeded, so a run's figures can be recomputed.
fn ratio_interval(driver: &[f64], direct: &[f64]) -> (f64, f64) {
    const RESAMPLES: usize = 4000;
    let mut rng = fastrand::Rng::with_seed(20);
    let n = driver.len().min(direct.len());
    let mut ratios = Vec::with_capacity(RESAMPLES);
    let (mut d, mut h) = (vec![0.0; n], vec![0.0; n]);
    for _ in 0..RESAMPLES {
        for i in 0..n {
            let pick = rng.usize(..n);
            (d[i], h[i]) = (driver[pick], direct[pick]);
        }
        ratios.push(percentile(&d, 50.0) / percentile(&h, 50.0));
    }
    (percentile(&ratios, 2.5), percentile(&ratios, 97.5))
}

fn list(values: &[f64]) -> String {
    let v: Vec<String> = values.iter().map(|x| format!("{x:.1}")).collect();
    v.join(", ")
}

impl Bench {
    /// Fresh staging and target paths (the target's parent exists, the
    /// target does not, as a CO passes them).
    fn paths(&mut self, side: &str) -> (PathBuf, PathBuf) {
        self.n += 1;
        let base = self.args.work.join(format!("{side}-{}", self.n));
        let staging = base.join("staging");
        std::fs::create_dir_all(&staging).expect("staging dir");
        (staging, base.join("target"))
    }

    /// Through the driver; also times a second NodeStage of the formatted
    /// device after an unstage.
    async fn driver_round(&mut self) -> (Steps, f64) {
        let (staging, target) = self.paths("driver");
        let name = format!("bench-driver-{}", self.n);
        let mut steps = Steps::default();
        let t = Instant::now();
        let req = CreateVolumeRequest {
            name,
            capacity_range: Some(CapacityRange {
                required_bytes: GIB,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![cap()],
            ..Default::default()
        };
        let volume = self.controller.call(req).await.expect("CreateVolume");
        let volume = volume.volume.expect("a volume");
        steps.create = ms(t);
        let t = Instant::now();
        let req = ControllerPublishVolumeRequest {
            volume_id: volume.volume_id.clone(),
            node_id: self.args.node_id.clone(),
            volume_capability: Some(cap()),
            volume_context: volume.volume_context.clone(),
            ..Default::default()
        };
        let published = self.controller.call(req).await.expect("ControllerPublish");
        steps.attach = ms(t);
        let stage = NodeStageVolumeRequest {
            volume_id: volume.volume_id.clone(),
            publish_context: published.publish_context.clone(),
            staging_target_path: staging.to_string_lossy().into(),
            volume_capability: Some(cap()),
            volume_context: volume.volume_context.clone(),
            ..Default::default()
        };
        let t = Instant::now();
        self.node.call(stage.clone()).await.expect("NodeStage");
        steps.stage = ms(t);
        let t = Instant::now();
        let req = NodePublishVolumeRequest {
            volume_id: volume.volume_id.clone(),
            publish_context: published.publish_context.clone(),
            staging_target_path: staging.to_string_lossy().into(),
            target_path: target.to_string_lossy().into(),
            volume_capability: Some(cap()),
            volume_context: volume.volume_context.clone(),
            ..Default::default()
        };
        self.node.call(req).await.expect("NodePublish");
        steps.publish = ms(t);

        let id = volume.volume_id;
        let req = NodeUnpublishVolumeRequest {
            volume_id: id.clone(),
            target_path: target.to_string_lossy().into(),
        };
        self.node.call(req).await.expect("NodeUnpublish");
        let unstage = NodeUnstageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.to_string_lossy().into(),
        };
        self.node.call(unstage.clone()).await.expect("NodeUnstage");
        let t = Instant::now();
        self.node.call(stage).await.expect("NodeStage again");
        let restage = ms(t);
        self.node.call(unstage).await.expect("NodeUnstage again");
        let req = ControllerUnpublishVolumeRequest {
            volume_id: id.clone(),
            node_id: self.args.node_id.clone(),
            secrets: HashMap::new(),
        };
        self.controller
            .call(req)
            .await
            .expect("ControllerUnpublish");
        let req = DeleteVolumeRequest {
            volume_id: id,
            secrets: HashMap::new(),
        };
        self.controller.call(req).await.expect("DeleteVolume");
        (steps, restage)
    }

    /// Polls a started action every millisecond until it completes.
    async fn until_done(&self, started: Result<Action, ProviderError>) {
        let id = started.expect("an action").id;
        let ended = as_the_driver::until_done(&self.provider, id).await;
        let action = ended.expect("GET action");
        assert_eq!(
            action.status,
            ActionStatus::Completed,
            "action {id}: {:?}",
            action.error
        );
    }

    /// Creates and attaches a volume with the driver's requests: a lookup
    /// by name before the create; the volume read and the attachment
    /// looked up before the attach (its actions: the volume was just
    /// read), then polled with the driver's backoff.
    async fn create_and_attach_as_the_driver(
        &self,
        req: &api::CreateVolumeRequest,
        steps: &mut Steps,
    ) -> api::Volume {
        let t = Instant::now();
        let volume = as_the_driver::create(&self.provider, req).await;
        let volume = volume.expect("create");
        steps.create = ms(t);
        let t = Instant::now();
        let node = &self.args.node_id;
        let schedule = (self.retry.initial, self.retry.max);
        let attached = as_the_driver::attach(&self.provider, &volume.id, node, schedule).await;
        attached.expect("attach");
        steps.attach = ms(t);
        volume
    }

    /// The provider's calls over HTTP, then the node's storage work by hand.
    async fn direct_round(&mut self, how: Direct) -> Steps {
        let (staging, target) = self.paths("direct");
        let name = format!("bench-direct-{}", self.n);
        let mut steps = Steps::default();
        let node = &self.args.node_id;
        let volume = match how {
            Direct::SameCalls => {
                let req = api::CreateVolumeRequest {
                    name,
                    size_gigabytes: 1,
                    region: Some(self.args.region.clone()),
                    ..Default::default()
                };
                self.create_and_attach_as_the_driver(&req, &mut steps).await
            }
            Direct::Minimal => {
                let t = Instant::now();
                let req = api::CreateVolumeRequest {
                    name,
                    size_gigabytes: 1,
                    ..Default::default()
                };
                let volume = self.provider.create_volume(&req).await.expect("create");
                steps.create = ms(t);
                let t = Instant::now();
                self.until_done(self.provider.attach(&volume.id, node).await)
                    .await;
                steps.attach = ms(t);
                volume
            }
        };
        let t = Instant::now();
        let link = self.args.device_dir.join(device_link_name(&volume.id));
        while !link.exists() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let device = std::fs::canonicalize(&link).expect("the link's device");
        let device_name = device.to_string_lossy();
        if how == Direct::SameCalls {
            let found = self.storage.probe(&device_name).expect("blkid -p");
            assert_eq!(found, DiskFormat::Unformatted, "a new volume holds nothing");
        }
        (self.storage)
            .format(&device_name, "ext4", &[])
            .expect("mkfs.ext4");
        mount(Some(&device), &staging, Some("ext4"), MsFlags::empty());
        steps.stage = ms(t);
        let t = Instant::now();
        std::fs::create_dir(&target).expect("target dir");
        mount(Some(&staging), &target, None, MsFlags::MS_BIND);
        steps.publish = ms(t);

        for path in [&target, &staging] {
            nix::mount::umount2(path, MntFlags::empty()).expect("umount");
        }
        self.until_done(self.provider.detach(&volume.id, node).await)
            .await;
        self.provider
            .delete_volume(&volume.id)
            .await
            .expect("delete");
        steps
    }
}

fn mount(source: Option<&Path>, target: &Path, fs: Option<&str>, flags: MsFlags) {
    nix::mount::mount(source, target, fs, flags, None::<&str>).expect("mount(2)");
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = Args::parse();
    let token = std::env::var(TOKEN_ENV).expect("CLOUD_PROVIDER_TOKEN");
    let token = Token::new(&token, TOKEN_ENV).expect("a token");
    let provider = HttpProvider::new(&args.provider, token).expect("provider URL");
    let controller = CsiClient::connect(&args.controller)
        .await
        .expect("controller");
    let node = CsiClient::connect(&args.node).await.expect("node");
    let rounds = args.rounds;
    let retry = cloud_block::driver::controller_config(&args.region).retry;
    let storage = SafeFormatAndMount::new(Arc::new(LinuxMounter::new()), Arc::new(SystemExec));
    let mut bench = Bench {
        args,
        provider,
        retry,
        storage,
        controller,
        node,
        n: 0,
    };
    // Warm-up: first connections, page cache, the provider's state file.
    bench.driver_round().await;
    bench.direct_round(Direct::SameCalls).await;
    bench.direct_round(Direct::Minimal).await;
    let mut driver = Vec::new();
    let mut restage = Vec::new();
    let mut direct = Vec::new();
    let mut minimal = Vec::new();
    for round in 0..rounds {
        // Each path goes first, second and third in turn.
        for path in 0..3 {
            match (round + path) % 3 {
                0 => {
                    let (steps, again) = bench.driver_round().await;
                    driver.push(steps);
                    restage.push(again);
                }
                1 => direct.push(bench.direct_round(Direct::SameCalls).await),
                _ => minimal.push(bench.direct_round(Direct::Minimal).await),
            }
        }
    }
    let totals = |s: &[Steps]| s.iter().map(Steps::total).collect::<Vec<_>>();
    let (d, h, m) = (totals(&driver), totals(&direct), totals(&minimal));
    println!("create-to-published, 1 GiB ext4, {rounds} rounds in rotating order (ms):");
    let paths = [
        ("driver", &driver, &d),
        ("direct", &direct, &h),
        ("minimal", &minimal, &m),
    ];
    for (label, steps, all) in paths {
        let step =
            |f: fn(&Steps) -> f64| percentile(&steps.iter().map(f).collect::<Vec<_>>(), 50.0);
        println!(
            "  {label}: median {:.1} (create {:.1}, attach {:.1}, stage {:.1}, publish {:.1}); all: {}",
            percentile(all, 50.0),
            step(|s| s.create),
            step(|s| s.attach),
            step(|s| s.stage),
            step(|s| s.publish),
            list(all)
        );
    }
    let median = |v: &[f64]| percentile(v, 50.0);
    println!(
        "  ratio driver / direct (medians): {:.3}; driver / minimal: {:.2}",
        median(&d) / median(&h),
        median(&d) / median(&m)
    );
    let (low, high) = ratio_interval(&d, &h);
    let paired: Vec<f64> = d.iter().zip(&h).map(|(d, h)| d / h).collect();
    println!(
        "  driver / direct: 95% interval of the ratio of medians [{low:.3}, {high:.3}] \
         (bootstrap over rounds); median of the rounds' own ratios {:.3}",
        median(&paired)
    );
    // Both paths poll the attach action on one schedule, so whether it
    // ends just before or just after a poll moves a round's attach step by
    // milliseconds either way. Taking each round's direct attach step for
    // the driver too leaves that out (and the driver's ControllerPublish
    // round trip with it: a lower bound).
    let even: Vec<f64> = driver
        .iter()
        .zip(&direct)
        .map(|(d, h)| d.total() - d.attach + h.attach)
        .collect();
    println!(
        "  driver / direct with each round's direct attach step in both (a lower bound): {:.3}",
        median(&even) / median(&h)
    );
    let first: Vec<f64> = driver.iter().map(|s| s.stage).collect();
    let direct_stage: Vec<f64> = direct.iter().map(|s| s.stage).collect();
    println!(
        "NodeStageVolume of an attached device (ms): first (formats) p50 {:.1} p90 {:.1}; \
         already formatted p50 {:.1} p90 {:.1}; direct (probe, mkfs, mount) p50 {:.1} p90 {:.1}",
        percentile(&first, 50.0),
        percentile(&first, 90.0),
        percentile(&restage, 50.0),
        percentile(&restage, 90.0),
        percentile(&direct_stage, 50.0),
        percentile(&direct_stage, 90.0)
    );
}
