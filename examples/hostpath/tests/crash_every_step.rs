//! The real-kernel crash companion of csi-sim: hostpath killed with SIGKILL
//! right before each step of each workload it serves (and right after each
//! call's last step), started again on the same state, the CO's retries
//! replayed; nothing acknowledged may be lost, nothing left mounted,
//! attached or on disk. csi-sim's `kernel` module does the work;
//! `CSI_KIT_CRASH_REPLAY=workload:step:before|after` reruns one run.

use csi_sim::kernel::{KernelTarget, Layout, assert_survives};

/// Group snapshots need the state dir on a filesystem of its own (they
/// freeze it): not served in this setting.
const WORKLOADS: &[&str] = &[
    "lifecycle",
    "snapshot-restore-clone",
    "expand-online",
    "shared-staging",
];

fn args(l: &Layout) -> Vec<String> {
    let mut args = l.driver_flags("crash-node");
    // With attach, so ControllerPublish and its records are covered too.
    args.push("--enable-attach".into());
    args
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn hostpath_survives_a_crash_at_every_step() {
    mount_utils::require_root!("hostpath_survives_a_crash_at_every_step");
    let target = KernelTarget {
        name: "hostpath",
        program: env!("CARGO_BIN_EXE_hostpath").into(),
        args,
        node_id: "crash-node",
        volume_unit: 8 << 20,
        data_dirs: |l| vec![l.state.join("volumes"), l.state.join("snapshots")],
        workloads: WORKLOADS,
        env: &[],
        auxiliaries: Vec::new(),
    };
    assert_survives(&target);
}
