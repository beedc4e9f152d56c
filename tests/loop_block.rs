//! The loop-block example over its real unix socket, as root, with real
//! loop devices, mkfs and mounts: the conformance suite in mount mode (ext4,
//! xfs when installed) and block mode, data surviving unstage/re-stage,
//! online expansion, re-attachment after a restart, and nothing (no mount,
//! no loop device) left behind.

mod support;

use std::path::{Path, PathBuf};

use csi_kit::conformance::{AccessType, Config, Report, Status, Suite};
use csi_kit::mount::require_root;
use csi_kit::mount::testing::{assert_no_loop_device_for, have_program};
use support::{Driver, mounts_under, run_isolated};

/// Runs the suite against a fresh loop-block; `fs_type` None means block.
async fn run_suite(fs_type: Option<&str>, size: i64, skip: &[&str]) -> Report {
    let dir = tempfile::tempdir().expect("tempdir");
    let statedir = dir.path().join("state");
    let driver = Driver::start("loop-block", &statedir, &[]);
    driver.client().await;
    let staging = dir.path().join("staging");
    let targets = dir.path().join("targets");
    std::fs::create_dir_all(&staging).unwrap();
    std::fs::create_dir_all(&targets).unwrap();
    let mut config = Config::new(driver.endpoint.clone()).driver_log(&driver.log);
    config.staging_dir = staging;
    config.target_dir = targets;
    config.volume_size = size;
    config.access_type = match fs_type {
        Some(fs) => AccessType::Mount {
            fs_type: fs.to_owned(),
        },
        None => AccessType::Block,
    };
    for pattern in skip {
        config = config.skip(*pattern);
    }
    let report = Suite::new(config).run().await.expect("suite runs");
    println!("{report}");
    assert!(
        report.is_success(),
        "conformance failures:\n{report}\n--- driver log tail ---\n{}",
        tail(&driver.log_text())
    );
    let skipped: Vec<String> = report
        .results
        .iter()
        .filter_map(|r| match &r.status {
            Status::Skipped(why) => Some(format!("{}: {why}", r.id)),
            _ => None,
        })
        .filter(|s| !s.ends_with("not advertised"))
        .filter(|s| !skip.iter().any(|p| s.starts_with(p.trim_end_matches('*'))))
        .collect();
    assert_eq!(
        skipped,
        Vec::<String>::new(),
        "only what loop-block does not advertise may be skipped"
    );
    assert_clean(dir.path(), &statedir);
    report
}

/// No mount below `dir`, no loop device on any backing file in `statedir`.
fn assert_clean(dir: &Path, statedir: &Path) {
    let leftover = mounts_under(dir);
    assert!(leftover.is_empty(), "mounts left behind: {leftover:?}");
    for image in images(statedir) {
        assert_no_loop_device_for(&image);
    }
}

/// Every backing file and snapshot copy of a driver instance.
fn images(statedir: &Path) -> Vec<PathBuf> {
    ["volumes", "snapshots"]
        .iter()
        .filter_map(|d| std::fs::read_dir(statedir.join(d)).ok())
        .flat_map(|entries| entries.flatten().map(|e| e.path()))
        .collect()
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(80)..].join("\n")
}

/// Whether this process may grow a mounted ext4 (EXT4_IOC_RESIZE_FS needs
/// CAP_SYS_RESOURCE, bit 24 of CapEff, which some sandboxes drop for root).
fn has_cap_sys_resource() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 24) != 0)
}

/// Suite patterns to skip for a filesystem that cannot be grown online here.
fn online_growth_skips(fs_type: &str) -> Vec<&'static str> {
    if fs_type.starts_with("ext") && !has_cap_sys_resource() {
        eprintln!(
            "note: node.expand_volume skipped for {fs_type}: growing a mounted ext4 needs \
             CAP_SYS_RESOURCE, which this process lacks (CapEff bit 24)"
        );
        vec!["node.expand_volume"]
    } else {
        Vec::new()
    }
}

#[test]
fn loop_block_conformance_mount_ext4() {
    require_root!("loop_block_conformance_mount_ext4");
    if !have_program("loop_block_conformance_mount_ext4", "mkfs.ext4") {
        return;
    }
    run_isolated("loop-block-ext4", || async {
        let skips = online_growth_skips("ext4");
        run_suite(Some("ext4"), 32 << 20, &skips).await;
    });
}

#[test]
fn loop_block_conformance_mount_default_fs() {
    require_root!("loop_block_conformance_mount_default_fs");
    run_isolated("loop-block-default-fs", || async {
        // An empty fs_type: the driver formats ext4.
        let skips = online_growth_skips("ext4");
        run_suite(Some(""), 32 << 20, &skips).await;
    });
}

#[test]
fn loop_block_conformance_mount_xfs() {
    require_root!("loop_block_conformance_mount_xfs");
    if !have_program("loop_block_conformance_mount_xfs", "mkfs.xfs") {
        return;
    }
    run_isolated("loop-block-xfs", || async {
        // mkfs.xfs refuses filesystems under 300 MiB; sparse files keep it cheap.
        run_suite(Some("xfs"), 320 << 20, &[]).await;
    });
}

#[test]
fn loop_block_conformance_block() {
    require_root!("loop_block_conformance_block");
    run_isolated("loop-block-block", || async {
        run_suite(None, 16 << 20, &[]).await;
    });
}
