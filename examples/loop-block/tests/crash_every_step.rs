//! The real-kernel crash companion of csi-sim: loop-block killed with
//! SIGKILL right before each step of each workload (and right after each
//! call's last step): loop devices, mkfs, ext4 mounts and the state store
//! for real, the driver started again on the same state, the CO's retries
//! replayed; nothing acknowledged may be lost, nothing left mounted,
//! attached or on disk. csi-sim's `kernel` module does the work;
//! `CSI_KIT_CRASH_REPLAY=workload:step:before|after` reruns one run.

use csi_sim::kernel::{KernelTarget, assert_survives};

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn loop_block_survives_a_crash_at_every_step() {
    mount_utils::require_root!("loop_block_survives_a_crash_at_every_step");
    let workloads = e2e_support::with_online_expansion(&[
        "lifecycle",
        "snapshot-restore-clone",
        "expand-online",
        "group-snapshot",
        "shared-staging",
    ]);
    let target = KernelTarget {
        name: "loop-block",
        program: env!("CARGO_BIN_EXE_loop-block").into(),
        args: |l| l.driver_flags("crash-node"),
        node_id: "crash-node",
        // Disks are whole MiB; 16 MiB formats as ext4 in a blink.
        volume_unit: 16 << 20,
        data_dirs: |l| vec![l.state.join("volumes"), l.state.join("snapshots")],
        workloads,
        env: &[],
        auxiliaries: Vec::new(),
    };
    assert_survives(&target);
}
