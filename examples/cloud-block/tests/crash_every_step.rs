//! The real-kernel crash companion: cloud-block (`--mode both`)
//! killed with SIGKILL right before each step of each workload it serves
//! (and right after each call's last step): a provider call that changes
//! the cloud, the node's mkfs, mounts and records. `cloud-provider` runs
//! beside it as the storage, with its loop devices and by-id links, and is
//! never killed; the driver is started again on the same state and the
//! CO's retries replayed. Nothing acknowledged may be lost, nothing left
//! mounted, attached, linked or held by the provider. csi-sim's `kernel`
//! module does the work; `CSI_KIT_CRASH_REPLAY=workload:step:before|after`
//! reruns one run.

use csi_sim::kernel::{Auxiliary, KernelTarget, Layout, assert_survives};

const NODE: &str = "crash-node";
const PROVIDER: &str = "provider";
/// A test's token, for the provider and the driver alike.
const TOKEN_ENV: &[(&str, &str)] = &[("CLOUD_PROVIDER_TOKEN", "crash-test-token")];

/// What it serves: all but group snapshots (it declares none; the report
/// says so), the clone included (CLONE_VOLUME: the provider copies); the
/// lifecycle with block volumes too (published as the device). Online
/// expansion runs on xfs where root lacks CAP_SYS_RESOURCE
/// (`with_online_expansion`).
const WORKLOADS: &[&str] = &[
    "lifecycle",
    "lifecycle+block",
    "snapshot-restore-clone",
    "shared-staging",
    "expand-online",
];

fn provider_args(l: &Layout) -> Vec<String> {
    let dir = l.auxiliary_dir(PROVIDER);
    let path = |p: &str| dir.join(p).to_string_lossy().into_owned();
    let (data, devices) = (path("data"), path("by-id"));
    let args = ["--listen", "127.0.0.1:0", "--data-dir", &data];
    let args = args
        .into_iter()
        .chain(["--device-dir", &devices, "--log", "warn"]);
    args.map(String::from).collect()
}

fn driver_args(l: &Layout) -> Vec<String> {
    let mut args = l.driver_flags(NODE);
    let devices = l.auxiliary_dir(PROVIDER).join("by-id");
    args.extend([
        "--mode".into(),
        "both".into(),
        format!("--provider-url={}", l.address(PROVIDER)),
        format!("--device-dir={}", devices.display()),
        "--device-timeout-secs=10".into(),
    ]);
    args
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn cloud_block_survives_a_crash_at_every_step() {
    mount_utils::require_root!("cloud_block_survives_a_crash_at_every_step");
    let workloads = e2e_support::with_online_expansion(WORKLOADS);
    let provider = Auxiliary {
        name: PROVIDER,
        program: env!("CARGO_BIN_EXE_cloud-provider").into(),
        args: provider_args,
        env: TOKEN_ENV,
        ready_prefix: "listening on ",
    };
    let target = KernelTarget {
        name: "cloud-block",
        program: env!("CARGO_BIN_EXE_cloud-block").into(),
        args: driver_args,
        node_id: NODE,
        // The provider's sizes are whole GiB (sparse files).
        volume_unit: 1 << 30,
        data_dirs: |l| {
            let provider = l.auxiliary_dir(PROVIDER);
            let data = provider.join("data");
            vec![
                data.join("volumes"),
                data.join("snapshots"),
                provider.join("by-id"),
            ]
        },
        workloads,
        env: TOKEN_ENV,
        auxiliaries: vec![provider],
    };
    assert_survives(&target);
}
