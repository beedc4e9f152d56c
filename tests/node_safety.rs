//! Node safety of both example drivers with real mounts and loop devices: a
//! driver never touches what it does not own, read-only means read-only, mount
//! flag values never reach a log line or an error, crash leftovers are cleaned
//! up and a volume that cannot be restored is reported abnormal while the rest
//! is served. Runs as root, each test in a private mount namespace (its mounts
//! vanish with it); loop devices are detached by the driver guard even on
//! failure.

use e2e_support as support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use csi_kit::client::CsiClient;
use csi_kit::mount::require_root;
use csi_kit::mount::testing::{assert_no_loop_device_for, have_program};
use csi_kit::proto::v1::volume_capability::access_mode::Mode;
use csi_kit::proto::v1::*;
use support::{Driver, calls, create_and_attach, mounts_under, run_isolated_in_tempdir};
use tonic::Code;

const SECRET: &str = "SECRET-node-safety-5e1f";
const BACKING_FILE_KEY: &str = "loop-block.csi-kit.dev/backing-file";

fn cap(block: bool, mode: Mode, flags: &[&str]) -> VolumeCapability {
    let cap = if block {
        VolumeCapability::block()
    } else {
        VolumeCapability::mount("").with_mount_flags(flags.iter().map(|f| f.to_string()))
    };
    cap.with_access_mode(mode)
}

fn writer(block: bool) -> VolumeCapability {
    cap(block, Mode::SingleNodeWriter, &[])
}

/// A volume ready for NodeStage: its id, publish context and image file
/// (block volumes and every loop-block disk).
struct Vol {
    id: String,
    context: HashMap<String, String>,
    image: Option<PathBuf>,
}

async fn volume(driver: &Driver, client: &CsiClient, name: &str, block: bool) -> Vol {
    let req = CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange::at_least(16 << 20)),
        volume_capabilities: vec![writer(block)],
        ..Default::default()
    };
    if driver.endpoint.contains("loop-block") {
        let (v, _, context) = create_and_attach(client, req).await;
        let image = context.get(BACKING_FILE_KEY).map(PathBuf::from);
        return Vol {
            id: v.volume_id,
            context,
            image,
        };
    }
    let v = calls::create_volume(client, req).await;
    let image = block.then(|| {
        driver
            .statedir
            .join("volumes")
            .join(format!("{}.img", v.volume_id))
    });
    Vol {
        id: v.volume_id,
        context: HashMap::new(),
        image,
    }
}

fn stage_req(v: &Vol, staging: &Path, cap: VolumeCapability) -> NodeStageVolumeRequest {
    NodeStageVolumeRequest {
        volume_id: v.id.clone(),
        publish_context: v.context.clone(),
        staging_target_path: staging.to_string_lossy().into(),
        volume_capability: Some(cap),
        ..Default::default()
    }
}

fn publish_req(
    v: &Vol,
    staging: &Path,
    target: &Path,
    cap: VolumeCapability,
) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: v.id.clone(),
        publish_context: v.context.clone(),
        staging_target_path: staging.to_string_lossy().into(),
        target_path: target.to_string_lossy().into(),
        volume_capability: Some(cap),
        ..Default::default()
    }
}

fn unstage_req(id: &str, staging: &Path) -> NodeUnstageVolumeRequest {
    NodeUnstageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.to_string_lossy().into(),
    }
}

fn unpublish_req(id: &str, target: &Path) -> NodeUnpublishVolumeRequest {
    NodeUnpublishVolumeRequest {
        volume_id: id.into(),
        target_path: target.to_string_lossy().into(),
    }
}

async fn condition(client: &CsiClient, id: &str, path: &Path) -> VolumeCondition {
    client
        .node()
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: id.into(),
            volume_path: path.to_string_lossy().into(),
            ..Default::default()
        })
        .await
        .expect("NodeGetVolumeStats")
        .into_inner()
        .volume_condition
        .expect("condition")
}

/// The mount-table entries at `path` in this namespace.
fn mounts_at(path: &Path) -> Vec<csi_kit::mount::MountInfo> {
    let text = std::fs::read("/proc/thread-self/mountinfo").expect("mountinfo");
    csi_kit::mount::parse_mountinfo(&text)
        .expect("parse mountinfo")
        .into_iter()
        .filter(|m| m.mount_point == path)
        .collect()
}

/// Ownership, read-only and crash-leftover cases against one driver.
async fn node_calls_touch_only_what_the_driver_owns(example: &str, dir: PathBuf) {
    let driver = Driver::start(example, &dir.join(example), &[]);
    let client = driver.client().await;
    let mut node = client.node();
    let path = |p: &str| dir.join(p);

    // A published block volume cannot be unstaged: its device stays.
    let a = volume(&driver, &client, "a", true).await;
    let (sa, ta) = (path("sa"), path("ta"));
    node.node_stage_volume(stage_req(&a, &sa, writer(true)))
        .await
        .expect("stage a");
    node.node_publish_volume(publish_req(&a, &sa, &ta, writer(true)))
        .await
        .expect("publish a");
    let e = node
        .node_unstage_volume(unstage_req(&a.id, &sa))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    assert!(
        !condition(&client, &a.id, &sa).await.abnormal,
        "still attached"
    );
    assert_eq!(mounts_at(&ta).len(), 1);

    // Block publish onto a user's non-empty file is refused.
    let file = path("user-file");
    std::fs::write(&file, b"the user's data").unwrap();
    assert!(
        node.node_publish_volume(publish_req(&a, &sa, &file, writer(true)))
            .await
            .is_err()
    );
    assert!(mounts_at(&file).is_empty());
    assert_eq!(std::fs::read(&file).unwrap(), b"the user's data");

    // An rw flag cannot make a reader-only volume writable.
    let b = volume(&driver, &client, "b", false).await;
    let (sb, tb) = (path("sb"), path("tb"));
    node.node_stage_volume(stage_req(&b, &sb, writer(false)))
        .await
        .expect("stage b");
    let reader = cap(false, Mode::SingleNodeReaderOnly, &["rw"]);
    node.node_publish_volume(publish_req(&b, &sb, &tb, reader))
        .await
        .expect("publish b");
    let entry = mounts_at(&tb).pop().expect("tb mounted");
    assert!(entry.is_read_only(), "{entry:?}");
    assert!(
        std::fs::write(tb.join("x"), b"x").is_err(),
        "tb is writable"
    );

    // A foreign tmpfs, another volume's paths, a symlink: untouched.
    let foreign = path("foreign");
    std::fs::create_dir(&foreign).unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        &foreign,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .expect("tmpfs");
    let _ = node
        .node_unpublish_volume(unpublish_req(&b.id, &foreign))
        .await;
    assert_eq!(mounts_at(&foreign).len(), 1, "the foreign tmpfs stays");
    let e = node
        .node_unpublish_volume(unpublish_req(&a.id, &tb))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{}", e.message());
    assert!(
        node.node_unstage_volume(unstage_req(&a.id, &sb))
            .await
            .is_err()
    );
    assert_eq!(mounts_at(&sb).len(), 1, "b's staging stays");
    assert_eq!(mounts_at(&tb).len(), 1, "b's target stays");
    let e = node
        .node_publish_volume(publish_req(&b, &sb, &ta, writer(false)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{}", e.message());
    let elsewhere = path("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let link = path("link");
    std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
    assert!(
        node.node_publish_volume(publish_req(&b, &sb, &link, writer(false)))
            .await
            .is_err()
    );
    assert!(mounts_at(&elsewhere).is_empty());

    // Unstage with no record (a crash between attach and save) finds
    // the device by its backing file and detaches it.
    let c = volume(&driver, &client, "c", true).await;
    let image = c.image.clone().expect("image");
    let attached = csi_kit::mount::LoopDevice::attach(&image, &Default::default())
        .expect("attach")
        .keep();
    assert!(attached.exists());
    node.node_unstage_volume(unstage_req(&c.id, &path("sc")))
        .await
        .expect("unstage c");
    assert_no_loop_device_for(&image);

    // Everything ours comes down cleanly.
    for (id, t) in [(&a.id, &ta), (&b.id, &tb)] {
        node.node_unpublish_volume(unpublish_req(id, t))
            .await
            .expect("unpublish");
    }
    for (id, s) in [(&a.id, &sa), (&b.id, &sb)] {
        node.node_unstage_volume(unstage_req(id, s))
            .await
            .expect("unstage");
    }
    assert_eq!(mounts_under(&dir), vec![foreign.clone()]);
    assert_no_loop_device_for(a.image.as_ref().expect("image"));
    nix::mount::umount(&foreign).expect("umount tmpfs");
}

#[test]
fn hostpath_touches_only_what_it_owns() {
    require_root!("hostpath_touches_only_what_it_owns");
    run_isolated_in_tempdir("hostpath_touches_only_what_it_owns", |dir| {
        node_calls_touch_only_what_the_driver_owns("hostpath", dir)
    });
}

#[test]
fn loop_block_touches_only_what_it_owns() {
    require_root!("loop_block_touches_only_what_it_owns");
    if !have_program("loop_block_touches_only_what_it_owns", "mkfs.ext4") {
        return;
    }
    run_isolated_in_tempdir("loop_block_touches_only_what_it_owns", |dir| {
        node_calls_touch_only_what_the_driver_owns("loop-block", dir)
    });
}

/// (6) and (8): after a restart, a staged disk whose first blocks are
/// damaged is reported abnormal and never formatted; the other disk is
/// restored and served.
#[test]
fn loop_block_never_reformats_a_damaged_staged_disk() {
    require_root!("loop_block_never_reformats_a_damaged_staged_disk");
    if !have_program(
        "loop_block_never_reformats_a_damaged_staged_disk",
        "mkfs.ext4",
    ) {
        return;
    }
    run_isolated_in_tempdir(
        "loop_block_never_reformats_a_damaged_staged_disk",
        |dir| async move {
            let mut driver = Driver::start("loop-block", &dir.join("loop-block"), &[]);
            let client = driver.client().await;
            let damaged = volume(&driver, &client, "damaged", false).await;
            let fine = volume(&driver, &client, "fine", true).await;
            let (sd, sf) = (dir.join("sd"), dir.join("sf"));
            let mut node = client.node();
            node.node_stage_volume(stage_req(&damaged, &sd, writer(false)))
                .await
                .expect("stage damaged");
            std::fs::write(sd.join("data"), b"precious").unwrap();
            node.node_stage_volume(stage_req(&fine, &sf, writer(true)))
                .await
                .expect("stage fine");
            // A reboot: the driver dies, mounts and devices are gone.
            driver.kill();
            nix::mount::umount(&sd).expect("umount staging");
            let images = [damaged.image.clone().unwrap(), fine.image.clone().unwrap()];
            for image in &images {
                for dev in csi_kit::mount::loopdev::find_by_backing_file(image).unwrap() {
                    csi_kit::mount::loopdev::detach(&dev).unwrap();
                }
            }
            // The first 64 KiB (ext4's superblock) are lost.
            let mut bytes = std::fs::read(&images[0]).unwrap();
            bytes[..64 << 10].fill(0);
            std::fs::write(&images[0], &bytes).unwrap();

            driver.restart();
            let client = driver.client().await;
            assert!(condition(&client, &damaged.id, &sd).await.abnormal);
            assert!(!condition(&client, &fine.id, &sf).await.abnormal);
            assert!(mounts_at(&sd).is_empty());
            let now = std::fs::read(&images[0]).unwrap();
            assert!(now[..64 << 10].iter().all(|b| *b == 0), "it was formatted");
            assert_eq!(now.len(), bytes.len());

            let mut node = client.node();
            node.node_unstage_volume(unstage_req(&fine.id, &sf))
                .await
                .expect("unstage fine");
            node.node_unstage_volume(unstage_req(&damaged.id, &sd))
                .await
                .expect("unstage damaged");
            for image in &images {
                assert_no_loop_device_for(image);
            }
        },
    );
}

/// (3): both drivers at trace level, stage and publish with a secret in
/// the mount flags, including mounts that fail: the value is in no log
/// line and no error message.
#[test]
fn mount_flag_values_reach_no_log_line_and_no_error() {
    require_root!("mount_flag_values_reach_no_log_line_and_no_error");
    if !have_program(
        "mount_flag_values_reach_no_log_line_and_no_error",
        "mkfs.ext4",
    ) {
        return;
    }
    run_isolated_in_tempdir(
        "mount_flag_values_reach_no_log_line_and_no_error",
        |dir| async move {
            let flag = format!("password={SECRET}");
            let flagged = |flags: &[&str]| cap(false, Mode::SingleNodeWriter, flags);
            for example in ["hostpath", "loop-block"] {
                let driver = Driver::start_logging(example, &dir.join(example), &[], "trace");
                let client = driver.client().await;
                let mut node = client.node();
                let mut errors = Vec::new();
                let v = volume(&driver, &client, "flagged", false).await;
                let (s, t) = (
                    dir.join(format!("{example}-s")),
                    dir.join(format!("{example}-t")),
                );
                // loop-block: ext4 refuses the option, the staging mount fails.
                if let Err(e) = node
                    .node_stage_volume(stage_req(&v, &s, flagged(&[&flag])))
                    .await
                {
                    errors.push(e.message().to_owned());
                    node.node_stage_volume(stage_req(&v, &s, writer(false)))
                        .await
                        .expect("stage");
                }
                // An operation-changing flag next to the secret is refused.
                let e = node
                    .node_publish_volume(publish_req(&v, &s, &t, flagged(&["remount", &flag])))
                    .await
                    .unwrap_err();
                errors.push(e.message().to_owned());
                if let Err(e) = node
                    .node_publish_volume(publish_req(&v, &s, &t, flagged(&[&flag])))
                    .await
                {
                    errors.push(e.message().to_owned());
                }
                node.node_unpublish_volume(unpublish_req(&v.id, &t))
                    .await
                    .expect("unpublish");
                node.node_unstage_volume(unstage_req(&v.id, &s))
                    .await
                    .expect("unstage");
                assert!(mounts_under(&dir).is_empty());
                let log = driver.log_text();
                assert!(
                    log.contains("TRACE") || log.contains("DEBUG"),
                    "{example} logged at trace level"
                );
                for line in log.lines() {
                    assert!(
                        !line.contains(SECRET),
                        "{example} logged a mount flag: {line}"
                    );
                }
                for e in &errors {
                    assert!(
                        !e.contains(SECRET),
                        "{example} put a mount flag in an error: {e}"
                    );
                }
                assert!(!errors.is_empty());
            }
        },
    );
}
