//! NodeGetVolumeStats of raw block volumes at the paths the kubelet uses.
//!
//! For a block volume the kubelet does not ask at the NodePublish target
//! but at the pod's `volumeDevices/...` path: a device node, a symlink to
//! one, or a bind mount of one. Both example drivers must answer wherever
//! the volume's own device is present (same device number), and NOT_FOUND
//! where another device, a character device with the same numbers, or no
//! device is. Runs as root in a private mount namespace, for hostpath and
//! loop-block.

use e2e_support as support;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use csi_kit::client::CsiClient;
use csi_kit::mount::{LinuxMounter, Mounter, require_root};
use csi_kit::proto::v1::volume_capability::access_mode::Mode;
use csi_kit::proto::v1::*;
use nix::sys::stat::{Mode as Perm, SFlag, mknod};
use support::{Driver, calls, create_and_attach, mounts_under, run_isolated_in_tempdir};
use tonic::Code;

const SIZE: i64 = 16 << 20;

fn block_cap() -> VolumeCapability {
    VolumeCapability::block().with_access_mode(Mode::SingleNodeWriter)
}

/// A block volume created, attached, staged and published under `dir`.
struct Published {
    id: String,
    node: String,
    staging: PathBuf,
    target: PathBuf,
}

impl Published {
    async fn new(client: &CsiClient, dir: &Path, name: &str) -> Published {
        let req = CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(CapacityRange::at_least(SIZE)),
            volume_capabilities: vec![block_cap()],
            ..Default::default()
        };
        let (volume, node, publish_context) = create_and_attach(client, req).await;
        let staging = dir.join(format!("{name}-staging"));
        let target = dir.join(format!("{name}-pods/target"));
        std::fs::create_dir_all(&staging).unwrap();
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        let id = volume.volume_id;
        calls::node_stage(client, &id, publish_context.clone(), &staging, block_cap()).await;
        calls::node_publish(
            client,
            &id,
            publish_context,
            (&staging, &target),
            block_cap(),
        )
        .await;
        Published {
            id,
            node,
            staging,
            target,
        }
    }

    /// The device number of the loop device published at the target.
    fn rdev(&self) -> u64 {
        std::fs::metadata(&self.target).unwrap().rdev()
    }

    async fn tear_down(&self, client: &CsiClient) {
        calls::tear_down(client, &self.id, &self.node, (&self.staging, &self.target)).await;
    }
}

async fn stats(
    client: &CsiClient,
    id: &str,
    path: &Path,
) -> Result<NodeGetVolumeStatsResponse, tonic::Status> {
    let req = NodeGetVolumeStatsRequest {
        volume_id: id.into(),
        volume_path: path.to_string_lossy().into(),
        staging_target_path: String::new(),
    };
    Ok(client.node().node_get_volume_stats(req).await?.into_inner())
}

fn bytes_total(r: &NodeGetVolumeStatsResponse) -> i64 {
    r.usage
        .iter()
        .find(|u| u.unit == volume_usage::Unit::Bytes as i32)
        .expect("bytes usage")
        .total
}

fn node(path: &Path, kind: SFlag, rdev: u64) -> PathBuf {
    mknod(path, kind, Perm::from_bits_truncate(0o600), rdev).expect("mknod");
    path.to_owned()
}

/// Two published block volumes; stats of A at every form of its device's
/// path, and NOT_FOUND wherever A's device is not.
async fn stats_follow_the_device(example: &str, args: &[&str], dir: PathBuf) {
    let driver = Driver::start(example, &dir.join("state"), args);
    let client = driver.client().await;
    let a = Published::new(&client, &dir, "pvc-a").await;
    let b = Published::new(&client, &dir, "pvc-b").await;
    assert_ne!(a.rdev(), b.rdev());
    let devs = dir.join("kubelet");
    std::fs::create_dir_all(&devs).unwrap();

    // The kubelet's forms of A's device.
    let device_node = node(&devs.join("a-node"), SFlag::S_IFBLK, a.rdev());
    let link = devs.join("a-link");
    std::os::unix::fs::symlink(&device_node, &link).unwrap();
    let bound = devs.join("a-bind");
    std::fs::File::create(&bound).unwrap();
    LinuxMounter::new()
        .bind_mount(&a.target, &bound, false)
        .unwrap();
    for path in [&a.target, &device_node, &link, &bound] {
        let r = stats(&client, &a.id, path)
            .await
            .unwrap_or_else(|e| panic!("{example}: stats at {}: {e}", path.display()));
        assert_eq!(bytes_total(&r), SIZE, "{example}: {}", path.display());
        if let Some(c) = &r.volume_condition {
            assert!(!c.abnormal, "{example}: {}: {}", path.display(), c.message);
        }
    }

    // Paths where A's device is not.
    let regular = devs.join("a-file");
    std::fs::write(&regular, b"not a device").unwrap();
    let not_a: Vec<(PathBuf, &str)> = vec![
        (
            node(&devs.join("b-node"), SFlag::S_IFBLK, b.rdev()),
            "someone else's device",
        ),
        (
            node(&devs.join("a-char"), SFlag::S_IFCHR, a.rdev()),
            "a character device with A's numbers",
        ),
        (regular, "a regular file"),
        (devs.join("missing"), "nothing"),
        (devs.clone(), "a directory"),
    ];
    for (path, what) in &not_a {
        let code = stats(&client, &a.id, path)
            .await
            .map(drop)
            .unwrap_err()
            .code();
        assert_eq!(
            code,
            Code::NotFound,
            "{example}: {what} at {}",
            path.display()
        );
    }
    // A's device asked for under B's id.
    let code = stats(&client, &b.id, &device_node)
        .await
        .unwrap_err()
        .code();
    assert_eq!(code, Code::NotFound, "{example}: A's device is not B's");

    LinuxMounter::new().unmount(&bound, false).unwrap();
    a.tear_down(&client).await;
    b.tear_down(&client).await;
    assert_eq!(mounts_under(&dir), Vec::<PathBuf>::new());
    drop(driver);
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn hostpath_block_stats_at_the_kubelets_device_paths() {
    require_root!("hostpath_block_stats_at_the_kubelets_device_paths");
    run_isolated_in_tempdir("hostpath-block-stats", |dir| {
        stats_follow_the_device("hostpath", &["--enable-attach"], dir)
    });
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn loop_block_block_stats_at_the_kubelets_device_paths() {
    require_root!("loop_block_block_stats_at_the_kubelets_device_paths");
    run_isolated_in_tempdir("loop-block-block-stats", |dir| {
        stats_follow_the_device("loop-block", &[], dir)
    });
}
