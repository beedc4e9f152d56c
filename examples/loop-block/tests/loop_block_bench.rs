//! Time from CreateVolume to a published mount for a 1 GiB loop-block
//! volume (create → ControllerPublish → NodeStage with mkfs.ext4 →
//! NodePublish), next to the same steps with shell tools (truncate,
//! losetup, mkfs.ext4, mount). Ignored by default; run as root with
//! `cargo test --release --test loop_block_bench -- --ignored --nocapture`.
//! Figures are recorded in docs/benchmarks.md.

use e2e_support as support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::*;
use mount_utils::require_root;
use mount_utils::testing::{assert_no_loop_device_for, detach_loop_devices_under};
use support::{Driver, calls, mounts_under, run_isolated};

/// The driver under test, built by cargo for this package's tests.
const LOOP_BLOCK: &str = env!("CARGO_BIN_EXE_loop-block");

const ROUNDS: usize = 7;
const GIB: i64 = 1 << 30;

fn sh(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().expect(program);
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// truncate, losetup, mkfs.ext4 (the driver's flags: -F -m0), mount.
fn shell_round(dir: &Path) -> Duration {
    let (image, mnt) = (dir.join("shell.img"), dir.join("shell-mnt"));
    std::fs::create_dir_all(&mnt).unwrap();
    let (img, mp) = (image.to_str().unwrap(), mnt.to_str().unwrap());
    let start = Instant::now();
    sh("truncate", &["-s", "1G", img]);
    let dev = sh("losetup", &["-f", "--show", img]);
    sh("mkfs.ext4", &["-q", "-F", "-m0", &dev]);
    sh("mount", &[&dev, mp]);
    let took = start.elapsed();
    sh("umount", &[mp]);
    sh("losetup", &["-d", &dev]);
    std::fs::remove_file(&image).unwrap();
    took
}

async fn driver_round(client: &csi_client::CsiClient, dir: &Path, round: usize) -> Duration {
    let cap = VolumeCapability::mount("ext4").with_access_mode(Mode::SingleNodeWriter);
    let (staging, target) = (dir.join("staging"), dir.join("pods").join("target"));
    std::fs::create_dir_all(&staging).unwrap();
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    let node_id = calls::node_id(client).await;
    let start = Instant::now();
    let req = CreateVolumeRequest {
        name: format!("bench-{round}"),
        capacity_range: Some(CapacityRange::exactly(GIB)),
        volume_capabilities: vec![cap.clone()],
        ..Default::default()
    };
    let volume = calls::create_volume(client, req).await;
    let id = volume.volume_id;
    let publish_context = client
        .controller()
        .controller_publish_volume(ControllerPublishVolumeRequest {
            volume_id: id.clone(),
            node_id: node_id.clone(),
            volume_capability: Some(cap.clone()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .publish_context;
    calls::node_stage(client, &id, publish_context.clone(), &staging, cap.clone()).await;
    calls::node_publish(client, &id, publish_context, (&staging, &target), cap).await;
    let took = start.elapsed();
    calls::tear_down(client, &id, &node_id, (&staging, &target)).await;
    took
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

#[test]
#[ignore = "benchmark: run explicitly as root with --ignored --nocapture"]
fn create_to_published_mount_1gib() {
    require_root!("create_to_published_mount_1gib");
    run_isolated("loop-block-bench", || async {
        let dir = tempfile::tempdir().unwrap();
        let statedir = dir.path().join("state");
        let driver = Driver::start(LOOP_BLOCK, &statedir, &["--log", "warn"]);
        let client = driver.client().await;
        // One warm-up round each (page cache, binaries), then alternate.
        driver_round(&client, dir.path(), 0).await;
        shell_round(dir.path());
        let (mut ours, mut shell) = (Vec::new(), Vec::new());
        for round in 1..=ROUNDS {
            ours.push(driver_round(&client, dir.path(), round).await);
            shell.push(shell_round(dir.path()));
        }
        let (o, s) = (median(ours.clone()), median(shell.clone()));
        println!("rounds: {ROUNDS} (after one warm-up each), 1 GiB, ext4");
        println!(
            "loop-block  create→publish: median {} (all: {:?})",
            ms(o),
            ours
        );
        println!(
            "shell tools truncate→mount: median {} (all: {:?})",
            ms(s),
            shell
        );
        println!(
            "ratio loop-block / shell: {:.2}",
            o.as_secs_f64() / s.as_secs_f64()
        );
        assert_eq!(mounts_under(dir.path()), Vec::<std::path::PathBuf>::new());
        assert_eq!(
            detach_loop_devices_under(dir.path()),
            0,
            "nothing left attached"
        );
        assert_no_loop_device_for(&dir.path().join("shell.img"));
    });
}
