//! csi-conformance against cloud-block as a cluster runs it: a
//! `cloud-provider` process, the driver's controller and node as two more
//! (the suite on both sockets), with NodeStage and CreateVolume secrets
//! from a csi-sanity secrets file. Mount and block access, root only (real
//! loop devices and mounts), each in a private mount namespace; nothing is
//! left attached, mounted or stored at the provider.

mod common;

use std::path::Path;

use common::driver::{Driver, NODE, scratch};
use common::{Dirs, start};
use csi_conformance::{Report, Secrets, Status, Suite, SuiteAccessType, SuiteConfig};

/// Secrets in the format of csi-sanity's `--csi.secrets` file: the node
/// must take them and never echo them (the values are long enough for the
/// log scan).
const SECRETS_FILE: &str = "\
NodeStageVolumeSecret:
  username: stage-user-3e91c7
  password: \"stage-password-5d2b9e0a\"
CreateVolumeSecret:
  token: \"create-token-81c4a0f6\"
";

/// Checks that must run, not be skipped: the point of this run.
const MUST_PASS: [&str; 3] = [
    "identity.split_endpoints",
    "general.secrets_not_in_errors",
    "general.secrets_not_in_logs",
];

/// What the provider does not offer, so the driver does not declare it
/// (the checks say so and skip): capacity, modify, group snapshots.
const NOT_OFFERED: [&str; 10] = [
    "controller.get_capacity",
    "controller.modify_volume.missing_volume",
    "controller.modify_volume.empty_parameters",
    "controller.modify_volume.unaccepted_parameter",
    "controller.create_volume.mutable_parameters",
    "controller.create_volume.unaccepted_mutable_parameter",
    "group-controller.get_capabilities",
    "group-controller.lifecycle",
    "group-controller.get.missing",
    "group-controller.delete.missing",
];

fn mounts_under(dir: &Path) -> Vec<String> {
    let info = std::fs::read_to_string("/proc/thread-self/mountinfo").unwrap();
    let dir = dir.to_string_lossy().into_owned();
    (info.lines())
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&dir))
        .map(str::to_owned)
        .collect()
}

/// Whether this process may grow a mounted ext4 (EXT4_IOC_RESIZE_FS needs
/// CAP_SYS_RESOURCE, bit 24 of CapEff, which some sandboxes drop for root).
fn has_cap_sys_resource() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    (status.lines())
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 24) != 0)
}

/// The mount run's filesystem, and what it must skip: the driver's default
/// (ext4) when a mounted ext4 can be grown here, else xfs (xfs_growfs needs
/// only CAP_SYS_ADMIN), else ext4 without node.expand_volume.
fn mount_fs() -> (&'static str, Vec<String>) {
    if has_cap_sys_resource() {
        return ("", Vec::new());
    }
    let xfs = std::process::Command::new("mkfs.xfs").arg("-V").output();
    if xfs.is_ok_and(|o| o.status.success()) {
        eprintln!(
            "note: the mount run uses xfs: ext4 cannot be grown online without CAP_SYS_RESOURCE"
        );
        return ("xfs", Vec::new());
    }
    eprintln!("note: node.expand_volume skipped: no CAP_SYS_RESOURCE for ext4, no mkfs.xfs");
    ("", vec!["node.expand_volume".to_owned()])
}

/// The checks skipped for want of a capability, but those `NOT_OFFERED`
/// names; and whether each of those was skipped.
fn unexpected_skips(report: &Report) -> Vec<String> {
    for id in NOT_OFFERED {
        let status = report.get(id).map(|r| &r.status);
        assert!(
            matches!(status, Some(Status::Skipped(_))),
            "{id}: {status:?}"
        );
    }
    (report.results.iter())
        .filter(|r| !NOT_OFFERED.contains(&r.id.as_str()))
        .filter_map(|r| match &r.status {
            Status::Skipped(why) if !why.starts_with("skipped by configuration") => {
                Some(format!("{}: {why}", r.id))
            }
            _ => None,
        })
        .collect()
}

async fn run_suite(block: bool, fs_type: &'static str, skip: Vec<String>) -> Report {
    let dirs = Dirs::new();
    // The provider knows the one node, so a made-up node id is NOT_FOUND.
    let provider = start(&dirs, &["--node", NODE]);
    let scratch = scratch();
    let controller = Driver::controller(&scratch.path().join("controller"), &provider).await;
    let node = Driver::node(&scratch.path().join("node"), &dirs, &[]).await;
    let mut config = SuiteConfig::new(&node.endpoint)
        .controller_endpoint(&controller.endpoint)
        .driver_log(node.log_path("node"));
    config.controller_log = Some(controller.log_path("controller"));
    config.staging_dir = scratch.path().join("staging");
    config.target_dir = scratch.path().join("target");
    config.secrets = Secrets::from_sanity_yaml(SECRETS_FILE).unwrap();
    config.skip = skip;
    config.access_type = match block {
        true => SuiteAccessType::Block,
        false => SuiteAccessType::Mount {
            fs_type: fs_type.to_owned(),
        },
    };
    let report = Suite::new(config).run().await.expect("the suite runs");
    eprintln!("{report}");
    assert_eq!(report.failed(), 0, "{report}");
    for id in MUST_PASS {
        let status = report.get(id).map(|r| &r.status);
        assert!(matches!(status, Some(Status::Passed)), "{id}: {status:?}");
    }
    assert_eq!(mounts_under(scratch.path()), Vec::<String>::new());
    assert_eq!(provider.volume_names().await, Vec::<String>::new());
    drop((node, controller));
    provider.stop();
    report
}

/// Runs the suite in a private mount namespace of its own; the checks it
/// skipped that it should have run.
fn isolated(name: &str, block: bool, fs_type: &'static str, skip: Vec<String>) -> Vec<String> {
    let report = mount_utils::testing::in_private_mount_ns(name, move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        runtime.unwrap().block_on(run_suite(block, fs_type, skip))
    });
    unexpected_skips(&report)
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn split_mount_access_with_node_stage_secrets() {
    let (fs_type, skip) = mount_fs();
    let skipped = isolated("cloud-block-mount", false, fs_type, skip);
    assert_eq!(skipped, Vec::<String>::new());
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn split_block_access_with_node_stage_secrets() {
    let skipped = isolated("cloud-block-block", true, "", Vec::new());
    assert_eq!(skipped, Vec::<String>::new());
}
