//! The node calls of a directory volume on a mount table of many mounts,
//! asked about each path with `statmount(2)` and as on kernels before 6.8
//! (the whole table read for each question): median milliseconds per
//! call, the two alternating. Root only; everything happens in a private
//! mount namespace over a temporary directory, and vanishes with it.
//!
//! ```text
//! cargo run --release -p csi-node --example busy-table [MOUNTS, default 1000] [CYCLES, default 100]
//! ```

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use csi_node::testing::requests::{publish_req, stage_req, unpublish_req, unstage_req};
use csi_node::{NodeVolumes, VolumeLocator, VolumeSource};
use csi_proto::v1::VolumeCapability;
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_store::FakeStore;
use mount_utils::testing::{in_private_mount_ns, is_root};
use mount_utils::{LinuxMounter, Mounter};

const CALLS: [&str; 4] = ["NodeStage", "NodePublish", "NodeUnpublish", "NodeUnstage"];

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Stages, publishes, unpublishes and unstages `cycles` directory volumes
/// under `base`; each call's times in ms.
fn lifecycles(base: &Path, mounter: LinuxMounter, round: usize, cycles: usize) -> [Vec<f64>; 4] {
    let data = base.join("data");
    let locator: Arc<dyn VolumeLocator> =
        Arc::new(move |id: &str| Some(VolumeSource::Directory(data.join(id))));
    let mounter: Arc<dyn Mounter> = Arc::new(mounter);
    let node = NodeVolumes::builder(mounter, Arc::new(FakeStore::new()), locator)
        .open()
        .expect("a node");
    let cap = VolumeCapability::mount("ext4").with_access_mode(Mode::SingleNodeWriter);
    let mut times: [Vec<f64>; 4] = Default::default();
    for i in 0..cycles {
        let id = format!("r{round}-{i}");
        std::fs::create_dir(base.join("data").join(&id)).expect("a volume directory");
        let staging = base.join("staging").join(&id);
        let target = base.join("pods").join(&id);
        let timed = |f: &mut dyn FnMut()| {
            let now = Instant::now();
            f();
            now.elapsed().as_secs_f64() * 1e3
        };
        let stage = stage_req(&id, &staging, cap.clone());
        times[0].push(timed(&mut || {
            node.stage(&stage).expect("NodeStage");
        }));
        let publish = publish_req(&id, &staging, &target, cap.clone());
        times[1].push(timed(&mut || {
            node.publish(&publish).expect("NodePublish");
        }));
        let unpublish = unpublish_req(&id, &target);
        times[2].push(timed(&mut || {
            node.unpublish(&unpublish).expect("NodeUnpublish");
        }));
        let unstage = unstage_req(&id, &staging);
        times[3].push(timed(&mut || {
            node.unstage(&unstage).expect("NodeUnstage");
        }));
    }
    times
}

fn main() {
    if !is_root() {
        eprintln!("busy-table: needs root (it mounts)");
        std::process::exit(1);
    }
    let mut args = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("a number"));
    let mounts: usize = args.next().unwrap_or(1000);
    let cycles: usize = args.next().unwrap_or(100);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let base = std::fs::canonicalize(dir.path()).expect("its path");
    in_private_mount_ns("busy-table", || {
        for sub in ["data", "staging", "pods", "filler"] {
            std::fs::create_dir(base.join(sub)).expect("a directory");
        }
        let m = LinuxMounter::new();
        for i in 0..mounts {
            let p = base.join("filler").join(i.to_string());
            std::fs::create_dir(&p).expect("a mount point");
            m.mount("filler", &p, "tmpfs", &["size=64k"])
                .expect("a tmpfs");
        }
        let mut all: [[Vec<f64>; 4]; 2] = Default::default();
        for round in 0..4 {
            let statmount = round % 2 == 0;
            let times = lifecycles(
                &base,
                LinuxMounter::new().with_statmount(statmount),
                round,
                cycles,
            );
            for (all, t) in all[usize::from(!statmount)].iter_mut().zip(times) {
                all.extend(t);
            }
        }
        println!(
            "{mounts} other mounts, {cycles} lifecycles per round, two rounds each, median ms:"
        );
        for (how, times) in ["statmount", "whole table"].iter().zip(all) {
            let figures: Vec<String> = CALLS
                .iter()
                .zip(times)
                .map(|(call, t)| format!("{call} {:.3}", median(t)))
                .collect();
            println!("  {how}: {}", figures.join(", "));
        }
    });
}
