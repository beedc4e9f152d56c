//! CreateVolume + DeleteVolume with 2,000 volumes present vs 10, for both
//! example drivers, state on a tmpfs (so the figures are the drivers' own
//! work, not the disk's). The target: the median at 2,000 within
//! 1.2x of the median at 10 (it was 13–16x while every change rewrote one
//! state file). Ignored by default; run as root with
//! `cargo test --release --test controller_bench -- --ignored --nocapture`
//! (after `cargo build --release --examples`). Figures go to
//! docs/benchmarks.md.

use e2e_support as support;

use std::time::{Duration, Instant};

use csi_kit::client::CsiClient;
use csi_kit::mount::{Mounter, require_root};
use csi_kit::proto::v1::volume_capability::access_mode::Mode;
use csi_kit::proto::v1::*;
use support::{Driver, calls, run_isolated_in_tempdir};

/// Create+delete pairs timed per measurement.
const PAIRS: usize = 300;
/// Measurements at each population, alternating 10 / 2,000.
const ROUNDS: usize = 3;

fn request(driver: &str, name: String) -> CreateVolumeRequest {
    let cap = if driver == "hostpath" {
        VolumeCapability::mount("")
    } else {
        VolumeCapability::block()
    };
    CreateVolumeRequest {
        name,
        capacity_range: Some(CapacityRange::exactly(1 << 20)),
        volume_capabilities: vec![cap.with_access_mode(Mode::SingleNodeWriter)],
        ..Default::default()
    }
}

async fn create(client: &CsiClient, driver: &str, name: String) -> String {
    calls::create_volume(client, request(driver, name))
        .await
        .volume_id
}

async fn delete(client: &CsiClient, id: String) {
    calls::delete_volume(client, &id).await;
}

/// Grows or shrinks the population to `n` volumes (8 calls in flight).
async fn populate(client: &CsiClient, driver: &'static str, ids: &mut Vec<String>, n: usize) {
    while ids.len() != n {
        let batch = (ids.len().abs_diff(n)).min(8);
        let mut calls = Vec::new();
        for _ in 0..batch {
            let client = client.clone();
            if ids.len() < n {
                let name = format!("pop-{}", uuid::Uuid::new_v4().simple());
                calls.push(tokio::spawn(async move {
                    Some(create(&client, driver, name).await)
                }));
            } else {
                let id = ids.pop().unwrap();
                calls.push(tokio::spawn(async move {
                    delete(&client, id).await;
                    None
                }));
            }
        }
        for call in calls {
            ids.extend(call.await.unwrap());
        }
    }
}

/// Median of `PAIRS` sequential create+delete pairs.
async fn measure(client: &CsiClient, driver: &str, round: usize) -> Duration {
    let mut times = Vec::with_capacity(PAIRS);
    for i in 0..PAIRS {
        let start = Instant::now();
        let id = create(client, driver, format!("bench-{round}-{i}")).await;
        delete(client, id).await;
        times.push(start.elapsed());
    }
    times.sort();
    times[PAIRS / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

#[test]
#[ignore = "benchmark: run explicitly as root, release build"]
fn create_delete_cost_does_not_grow_with_the_volumes_present() {
    require_root!("create_delete_cost_does_not_grow_with_the_volumes_present");
    for driver in ["hostpath", "loop-block"] {
        run_isolated_in_tempdir(&format!("{driver}-bench"), move |dir| async move {
            let statedir = dir.join("state");
            std::fs::create_dir_all(&statedir).unwrap();
            csi_kit::mount::LinuxMounter::new()
                .mount("tmpfs", &statedir, "tmpfs", &["size=4g"])
                .unwrap();
            let d = Driver::start(driver, &statedir, &["--log", "warn"]);
            let client = d.client().await;
            let mut ids = Vec::new();
            let (mut at10, mut at2000) = (Vec::new(), Vec::new());
            for round in 0..ROUNDS {
                populate(&client, driver, &mut ids, 10).await;
                at10.push(measure(&client, driver, round * 2).await);
                populate(&client, driver, &mut ids, 2000).await;
                at2000.push(measure(&client, driver, round * 2 + 1).await);
            }
            populate(&client, driver, &mut ids, 0).await;
            let median = |v: &[Duration]| {
                let mut v = v.to_vec();
                v.sort();
                v[v.len() / 2]
            };
            let (m10, m2000) = (median(&at10), median(&at2000));
            println!("{driver}: CreateVolume+DeleteVolume median of {PAIRS} pairs, state on tmpfs");
            println!(
                "  with 10 volumes:    {} (rounds: {})",
                ms(m10),
                list(&at10)
            );
            println!(
                "  with 2,000 volumes: {} (rounds: {})",
                ms(m2000),
                list(&at2000)
            );
            println!(
                "  ratio 2,000 / 10:   {:.2}x",
                m2000.as_secs_f64() / m10.as_secs_f64()
            );
        });
    }
}

fn list(v: &[Duration]) -> String {
    v.iter().map(|d| ms(*d)).collect::<Vec<_>>().join(", ")
}
