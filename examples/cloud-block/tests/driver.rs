//! The `cloud-block` driver as the CO meets it: a `cloud-provider`
//! process, the driver's controller and node as processes of their own
//! (`--mode controller`, `--mode node`), spoken to over their sockets.
//! Crashes are real SIGKILLs; attaches are real loop devices and links
//! (root only). Every test leaves no process, mount, loop device or link.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::driver::{Driver, NODE, scratch};
use common::{Dirs, start};
use crash_points::{CRASH_AT_ENV, CRASH_TRACE_ENV, CrashPlan, When, read_trace};
use csi_driver::v1::volume_capability::access_mode::Mode;
use csi_driver::v1::*;
use tonic::Code;

const GIB: i64 = 1 << 30;

fn cap(block: bool, fs: &str) -> VolumeCapability {
    let cap = if block {
        VolumeCapability::block()
    } else {
        VolumeCapability::mount(fs)
    };
    cap.with_access_mode(Mode::SingleNodeWriter)
}

fn create_req(name: &str, block: bool) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: GIB,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![cap(block, "ext4")],
        ..Default::default()
    }
}

/// Whether anything is mounted at or under `path`.
fn mounted_under(path: &Path) -> bool {
    let path = path.to_string_lossy().into_owned();
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines()
        .any(|l| l.split(' ').nth(4).is_some_and(|m| m.starts_with(&path)))
}

#[tokio::test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
async fn a_controller_killed_during_creates_leaves_one_volume_per_name() {
    let dirs = Dirs::new();
    // Slow answers: the kill lands while creates are in flight.
    let provider = start(&dirs, &["--fault-latency-ms", "300"]);
    let scratch = scratch();
    let dir = scratch.path().join("controller");
    let mut controller = Driver::controller(&dir, &provider).await;
    let names: Vec<String> = (0..10).map(|i| format!("pvc-crash-{i}")).collect();
    let mut calls = Vec::new();
    for name in names.iter().chain(names.iter()) {
        let client = controller.client.clone();
        let req = create_req(name, false);
        calls.push(tokio::spawn(async move { client.call(req).await }));
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    controller.kill();
    for call in calls {
        // Answered before the kill, or cut off by it: either is fine.
        let _ = call.await.unwrap();
    }
    // Restarted with nothing on disk: the provider is the source of truth.
    let mut controller = Driver::controller(&dir, &provider).await;
    let mut ids = HashMap::new();
    for name in names.iter().chain(names.iter()) {
        let volume = controller
            .client
            .call(create_req(name, false))
            .await
            .unwrap();
        let id = volume.volume.unwrap().volume_id;
        assert_eq!(ids.entry(name.clone()).or_insert(id.clone()), &id, "{name}");
    }
    let mut want = names.clone();
    want.sort();
    assert_eq!(
        provider.volume_names().await,
        want,
        "exactly one volume per name"
    );
    assert_keeps_no_state(&dir);
    for id in ids.values() {
        let req = DeleteVolumeRequest {
            volume_id: id.clone(),
            secrets: Default::default(),
        };
        controller.client.call(req).await.unwrap();
    }
    assert!(provider.volume_names().await.is_empty());
    controller.kill();
    provider.stop();
}

/// The controller wrote nothing but its logs into `dir`.
fn assert_keeps_no_state(dir: &Path) {
    let files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        files
            .iter()
            .all(|f| f.to_string_lossy().starts_with("controller.")),
        "the controller keeps no state: {files:?}"
    );
}

/// Creates a volume and attaches it to the node: (volume, publish context).
async fn attached(
    controller: &Driver,
    name: &str,
    block: bool,
) -> (Volume, HashMap<String, String>) {
    let volume = controller
        .client
        .call(create_req(name, block))
        .await
        .unwrap();
    let volume = volume.volume.unwrap();
    let req = ControllerPublishVolumeRequest {
        volume_id: volume.volume_id.clone(),
        node_id: NODE.into(),
        volume_capability: Some(cap(block, "ext4")),
        volume_context: volume.volume_context.clone(),
        ..Default::default()
    };
    let published = controller.client.call(req).await.unwrap();
    (volume, published.publish_context)
}

async fn detach_and_delete(controller: &Driver, id: &str) {
    let req = ControllerUnpublishVolumeRequest {
        volume_id: id.into(),
        node_id: NODE.into(),
        secrets: Default::default(),
    };
    controller.client.call(req).await.unwrap();
    let req = DeleteVolumeRequest {
        volume_id: id.into(),
        secrets: Default::default(),
    };
    controller.client.call(req).await.unwrap();
}

fn stage_req(
    volume: &Volume,
    context: &HashMap<String, String>,
    staging: &Path,
    fs: &str,
) -> NodeStageVolumeRequest {
    NodeStageVolumeRequest {
        volume_id: volume.volume_id.clone(),
        publish_context: context.clone(),
        staging_target_path: staging.to_string_lossy().into(),
        volume_capability: Some(cap(false, fs)),
        volume_context: volume.volume_context.clone(),
        ..Default::default()
    }
}

/// The node's step that mounts a new volume's filesystem, from the trace of
/// a node staging another volume (a node started on a fresh state dir makes
/// the same steps in the same order): a plan to crash right before it.
async fn first_mount_step(scratch: &Path, dirs: &Dirs, controller: &Driver) -> CrashPlan {
    let trace = scratch.join("node-trace");
    let trace_env = [(CRASH_TRACE_ENV, trace.to_str().unwrap())];
    let node = Driver::node(&scratch.join("traced-node"), dirs, &trace_env).await;
    let (volume, context) = attached(controller, "pvc-traced", false).await;
    let staging = scratch.join("traced-staging");
    std::fs::create_dir(&staging).unwrap();
    let req = stage_req(&volume, &context, &staging, "ext4");
    node.client.call(req).await.unwrap();
    let unstage = NodeUnstageVolumeRequest {
        volume_id: volume.volume_id.clone(),
        staging_target_path: staging.to_string_lossy().into(),
    };
    node.client.call(unstage).await.unwrap();
    drop(node);
    detach_and_delete(controller, &volume.volume_id).await;
    let entries = read_trace(&trace).unwrap();
    let kinds: Vec<&str> = entries.iter().map(|e| e.kind.as_str()).collect();
    let mount = entries.iter().find(|e| e.kind == "mount");
    let mount = mount.unwrap_or_else(|| panic!("no mount in the node's trace: {kinds:?}"));
    let mkfs = kinds.iter().position(|k| k.starts_with("exec mkfs"));
    assert!(
        mkfs.is_some_and(|i| (i as u64) < mount.step),
        "the device is formatted before it is mounted: {kinds:?}"
    );
    CrashPlan {
        step: mount.step,
        when: When::Before,
    }
}

#[tokio::test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
async fn a_node_killed_before_mounting_finishes_the_stage_when_retried() {
    let dirs = Dirs::new();
    let provider = start(&dirs, &[]);
    let scratch = scratch();
    let controller = Driver::controller(&scratch.path().join("controller"), &provider).await;
    let plan = first_mount_step(scratch.path(), &dirs, &controller).await;
    let node_dir = scratch.path().join("node");
    let (plan_text, trace) = (plan.to_string(), scratch.path().join("crash-trace"));
    let crash = [
        (CRASH_AT_ENV, plan_text.as_str()),
        (CRASH_TRACE_ENV, trace.to_str().unwrap()),
    ];
    let mut node = Driver::node(&node_dir, &dirs, &crash).await;
    let (volume, context) = attached(&controller, "pvc-node-crash", false).await;
    let link = dirs.link(&volume.volume_id);
    assert!(common::is_link(&link));

    let staging = scratch.path().join("staging");
    std::fs::create_dir(&staging).unwrap();
    let req = stage_req(&volume, &context, &staging, "ext4");
    assert!(
        node.client.call(req.clone()).await.is_err(),
        "the node died"
    );
    let status = node.wait();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9), "killed at {plan}: {status}");
    let last = read_trace(&trace).unwrap().pop().unwrap();
    assert_eq!((last.step, last.kind.as_str()), (plan.step, "mount"));
    assert!(!mounted_under(&staging), "it crashed before mounting");

    let node = Driver::node(&node_dir, &dirs, &[]).await;
    node.client.call(req.clone()).await.unwrap();
    assert!(mounted_under(&staging));
    node.client.call(req).await.unwrap(); // a repeat is fine
    let unstage = NodeUnstageVolumeRequest {
        volume_id: volume.volume_id.clone(),
        staging_target_path: staging.to_string_lossy().into(),
    };
    node.client.call(unstage).await.unwrap();
    assert!(
        !mounted_under(scratch.path()),
        "NodeUnstage leaves no mount"
    );
    detach_and_delete(&controller, &volume.volume_id).await;
    assert!(!common::is_link(&link), "no link left");
    assert!(
        dirs.loops_of(&volume.volume_id).is_empty(),
        "no loop device left"
    );
    drop((node, controller));
    provider.stop();
}

#[tokio::test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
async fn bad_input_gets_the_spec_code_and_names_what_is_wrong() {
    let dirs = Dirs::new();
    let provider = start(&dirs, &[]);
    let scratch = scratch();
    let controller = Driver::controller(&scratch.path().join("controller"), &provider).await;
    let node = Driver::node(&scratch.path().join("node"), &dirs, &[]).await;
    let staging = scratch.path().join("staging");
    std::fs::create_dir(&staging).unwrap();

    // Unknown parameters: INVALID_ARGUMENT naming the key.
    let mut req = create_req("pvc-bad-param", false);
    req.parameters.insert("fstype-typo".into(), "ext4".into());
    let e = controller.client.call(req).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("parameters.fstype-typo"),
        "{}",
        e.message()
    );

    // A device that never appears: NOT_FOUND naming the device.
    let gone = Volume {
        volume_id: "00000000-0000-4000-8000-00000000dead".into(),
        ..Default::default()
    };
    let name = cloud_block::api::device_link_name(&gone.volume_id);
    let context = HashMap::from([("device-name".to_owned(), name.clone())]);
    let e = node
        .client
        .call(stage_req(&gone, &context, &staging, "ext4"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert!(e.message().contains(&name), "{}", e.message());

    // A publish context without the device's name, or with a name that is
    // not one path component (never followed): the error names the key.
    for (key, value) in [("access", "mount"), ("device-name", "../../etc")] {
        let context = HashMap::from([(key.to_owned(), value.to_owned())]);
        let e = node
            .client
            .call(stage_req(&gone, &context, &staging, "ext4"))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{key}={value}");
        assert!(
            e.message().contains("publish_context[device-name]"),
            "{}",
            e.message()
        );
    }

    // A device holding another filesystem: FAILED_PRECONDITION, untouched.
    let (volume, context) = attached(&controller, "pvc-ext2", false).await;
    let device = std::fs::canonicalize(dirs.link(&volume.volume_id)).unwrap();
    let made = Command::new("mkfs.ext2")
        .arg("-q")
        .arg(&device)
        .status()
        .unwrap();
    assert!(made.success());
    let e = node
        .client
        .call(stage_req(&volume, &context, &staging, "ext4"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    let blkid = Command::new("blkid")
        .args(["-o", "value", "-s", "TYPE"])
        .arg(&device)
        .output();
    assert_eq!(
        String::from_utf8_lossy(&blkid.unwrap().stdout).trim(),
        "ext2",
        "never reformatted"
    );
    assert!(!mounted_under(&staging));
    detach_and_delete(&controller, &volume.volume_id).await;
    assert!(provider.volume_names().await.is_empty());
    drop((node, controller));
    provider.stop();
}

#[tokio::test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
async fn a_provider_refusing_the_token_or_answering_garbage_gets_a_clear_error() {
    let dirs = Dirs::new();
    let provider = start(&dirs, &[]);
    let scratch = scratch();
    let url = format!("--provider-url={}", provider.endpoint);
    let env = [("CLOUD_PROVIDER_TOKEN", "not-the-token")];
    let dir = scratch.path().join("wrong-token");
    let controller = Driver::start(&dir, "controller", &[&url], &env).await;
    let e = controller
        .client
        .call(create_req("pvc-401", false))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{}", e.message());
    assert!(e.message().contains("401"), "{}", e.message());
    assert!(!e.message().contains("not-the-token"));
    assert!(!controller.log("controller").contains("not-the-token"));
    assert!(provider.volume_names().await.is_empty(), "nothing made");
    assert_keeps_no_state(&dir);
    drop(controller);

    let dir = scratch.path().join("garbage");
    let controller = Driver::controller(&dir, &provider).await;
    provider.set_faults(r#"{"garbage_next": 1000}"#);
    let e = controller
        .client
        .call(create_req("pvc-garbage", false))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Internal, "{}", e.message());
    assert!(e.message().contains("could not be read"), "{}", e.message());
    provider.set_faults("{}");
    assert!(provider.volume_names().await.is_empty(), "nothing recorded");
    assert_keeps_no_state(&dir);
    drop(controller);
    provider.stop();
}
