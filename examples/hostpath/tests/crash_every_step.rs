//! The real-kernel crash companion of csi-sim: hostpath killed with SIGKILL
//! right before each step of each workload it serves (and right after each
//! call's last step), started again on the same state, the CO's retries
//! replayed; nothing acknowledged may be lost, nothing left mounted,
//! attached or on disk. csi-sim's `kernel` module does the work;
//! `CSI_KIT_CRASH_REPLAY=workload:step:before|after` reruns one run.
//!
//! Group snapshots are offered only with `--statedir` on a filesystem of
//! its own, which the cut freezes, and `--snapshotdir` on another: the
//! second test runs that workload so, on an ext4 the `state-fs` auxiliary
//! makes for each run (a crash during the cut leaves it frozen, which the
//! restarted driver must thaw).

use csi_sim::kernel::{Auxiliary, KernelTarget, Layout, assert_survives};

/// The workloads it serves on a state directory that is not a filesystem
/// of its own: all but the group snapshot.
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

/// The auxiliary that gives a run's `--statedir` a filesystem of its own:
/// a 32 MiB ext4 image in its directory, loop-mounted on the state
/// directory before the driver starts; it then sleeps until the run ends
/// (the harness unmounts and detaches what is left under the run).
const STATE_FS: &str = "state-fs";
const STATE_FS_SCRIPT: &str = r#"set -e
img="$1/disk.img"
truncate -s 32M "$img"
mkfs.ext4 -q -F "$img" >&2
mkdir -p "$2"
mount -o loop "$img" "$2"
echo "ready $2"
exec sleep 86400
"#;

fn state_fs_args(l: &Layout) -> Vec<String> {
    let dir = l.auxiliary_dir(STATE_FS).to_string_lossy().into_owned();
    let state = l.state.to_string_lossy().into_owned();
    ["-c", STATE_FS_SCRIPT, "state-fs", &dir, &state]
        .map(String::from)
        .to_vec()
}

/// Snapshots beside the run's state directory, on the run's own
/// filesystem (not the frozen one).
fn group_args(l: &Layout) -> Vec<String> {
    let mut args = args(l);
    let snapshots = l.base.join("snapshots").to_string_lossy().into_owned();
    args.extend(["--snapshotdir".into(), snapshots]);
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

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn hostpath_on_a_filesystem_of_its_own_survives_a_crash_at_every_step_of_a_group_snapshot() {
    mount_utils::require_root!(
        "hostpath_on_a_filesystem_of_its_own_survives_a_crash_at_every_step_of_a_group_snapshot"
    );
    let target = KernelTarget {
        name: "hostpath (state on its own ext4)",
        program: env!("CARGO_BIN_EXE_hostpath").into(),
        args: group_args,
        node_id: "crash-node",
        volume_unit: 1 << 20,
        data_dirs: |l| vec![l.state.join("volumes"), l.base.join("snapshots")],
        workloads: &["group-snapshot"],
        env: &[],
        auxiliaries: vec![Auxiliary {
            name: STATE_FS,
            program: "/bin/sh".into(),
            args: state_fs_args,
            env: &[],
            ready_prefix: "ready ",
        }],
    };
    assert_survives(&target);
}
