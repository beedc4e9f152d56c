//! Attach and detach for real: loop devices and by-id links (root only).
//! Every test detaches what it attached, and `Dirs` cleans up after a failure.

mod common;

use std::time::Duration;

use cloud_block::api::ActionStatus;
use cloud_block::client::{ConflictKind, ProviderClient};
use common::{Dirs, is_link, start, volume_request, wait};

fn backing_file_of(device: &std::path::Path) -> std::path::PathBuf {
    let name = device.file_name().unwrap().to_str().unwrap();
    let text = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).unwrap();
    text.trim_end().into()
}

#[tokio::test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
async fn attach_makes_a_device_and_a_link_and_detach_removes_both() {
    let dirs = Dirs::new();
    let provider = start(&dirs, &[]);
    let client = provider.client();
    let v = client
        .create_volume(&volume_request("disk", 1))
        .await
        .unwrap();
    let action = client.attach(&v.id, "node-a").await.unwrap();
    assert_eq!(action.status, ActionStatus::InProgress);
    assert_eq!(wait(&client, &action).await.status, ActionStatus::Completed);
    assert_eq!(client.get_volume(&v.id).await.unwrap().node_ids, ["node-a"]);

    let link = dirs.link(&v.id);
    assert!(is_link(&link));
    let device = std::fs::read_link(&link).unwrap();
    assert!(
        device.to_str().unwrap().starts_with("/dev/loop"),
        "{device:?}"
    );
    assert_eq!(backing_file_of(&device), dirs.volume_file(&v.id));
    assert_eq!(dirs.loops_of(&v.id), std::slice::from_ref(&device));
    // What is written to the device lands in the volume's file.
    std::os::unix::fs::FileExt::write_at(
        &std::fs::OpenOptions::new().write(true).open(&link).unwrap(),
        b"via-the-device",
        4096,
    )
    .unwrap();
    let mut buf = [0u8; 14];
    std::os::unix::fs::FileExt::read_at(
        &std::fs::File::open(dirs.volume_file(&v.id)).unwrap(),
        &mut buf,
        4096,
    )
    .unwrap();
    assert_eq!(&buf, b"via-the-device");

    // Repeats and conflicts, as a cloud answers them.
    let e = client.attach(&v.id, "node-a").await.unwrap_err();
    assert_eq!(e.conflict(), Some(&ConflictKind::AlreadyAttached), "{e}");
    let e = client.attach(&v.id, "node-b").await.unwrap_err();
    assert_eq!(
        e.conflict(),
        Some(&ConflictKind::AttachedElsewhere {
            node_id: Some("node-a".into())
        })
    );
    let e = client.delete_volume(&v.id).await.unwrap_err();
    assert_eq!(e.conflict(), Some(&ConflictKind::VolumeAttached));
    let e = client.detach(&v.id, "node-b").await.unwrap_err();
    assert_eq!(e.conflict(), Some(&ConflictKind::NotAttached));

    // Resize while attached: the device grows too.
    let grown = client.resize(&v.id, 2).await.unwrap();
    assert_eq!(wait(&client, &grown).await.status, ActionStatus::Completed);
    let info = mount_utils::LoopDevice::open(&device).unwrap();
    assert_eq!(info.size().unwrap(), 2 << 30);
    drop(info);

    let detach = client.detach(&v.id, "node-a").await.unwrap();
    assert_eq!(wait(&client, &detach).await.status, ActionStatus::Completed);
    assert!(!is_link(&link), "link removed");
    assert!(dirs.loops_of(&v.id).is_empty(), "device detached");
    let e = client.detach(&v.id, "node-a").await.unwrap_err();
    assert_eq!(e.conflict(), Some(&ConflictKind::NotAttached));
    client.delete_volume(&v.id).await.unwrap();
    provider.stop();
}

#[tokio::test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
async fn a_stuck_attach_makes_no_device_until_it_completes() {
    let dirs = Dirs::new();
    let provider = start(&dirs, &["--fault-stuck-action-secs", "3"]);
    let client = provider.client();
    let v = client
        .create_volume(&volume_request("slow", 1))
        .await
        .unwrap();
    let action = client.attach(&v.id, "node-a").await.unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        client.get_action(action.id).await.unwrap().status,
        ActionStatus::InProgress
    );
    assert!(!is_link(&dirs.link(&v.id)) && dirs.loops_of(&v.id).is_empty());
    assert!(client.get_volume(&v.id).await.unwrap().node_ids.is_empty());
    // A retry of the attach finds the running action instead of starting one.
    let e = client.attach(&v.id, "node-a").await.unwrap_err();
    assert_eq!(
        e.conflict(),
        Some(&ConflictKind::ActionInProgress {
            action_id: Some(action.id)
        })
    );
    assert_eq!(wait(&client, &action).await.status, ActionStatus::Completed);
    assert!(is_link(&dirs.link(&v.id)));
    provider.stop();
    // Dirs' drop detaches it.
}

#[tokio::test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
async fn an_errored_attach_leaves_nothing() {
    let dirs = Dirs::new();
    let provider = start(&dirs, &["--fault-action-error-rate", "1"]);
    let client = provider.client();
    let v = client
        .create_volume(&volume_request("fails", 1))
        .await
        .unwrap();
    let action = client.attach(&v.id, "node-a").await.unwrap();
    let ended = wait(&client, &action).await;
    assert_eq!(ended.status, ActionStatus::Errored);
    assert!(ended.error.is_some());
    assert!(client.get_volume(&v.id).await.unwrap().node_ids.is_empty());
    assert!(!is_link(&dirs.link(&v.id)) && dirs.loops_of(&v.id).is_empty());
    provider.stop();
}

#[tokio::test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
async fn restarts_keep_attachments_and_remake_lost_devices() {
    let dirs = Dirs::new();
    let provider = start(&dirs, &[]);
    let client = provider.client();
    let v = client
        .create_volume(&volume_request("kept", 1))
        .await
        .unwrap();
    let w = client
        .create_volume(&volume_request("idle", 1))
        .await
        .unwrap();
    let action = client.attach(&v.id, "node-a").await.unwrap();
    wait(&client, &action).await;
    let device = std::fs::read_link(dirs.link(&v.id)).unwrap();
    // SIGTERM detaches nothing.
    provider.stop();
    assert_eq!(std::fs::read_link(dirs.link(&v.id)).unwrap(), device);
    assert_eq!(dirs.loops_of(&v.id), std::slice::from_ref(&device));

    // Restarted after a crash: the same device, no second one.
    let provider = start(&dirs, &[]);
    let client = provider.client();
    assert_eq!(client.get_volume(&v.id).await.unwrap().node_ids, ["node-a"]);
    assert_eq!(dirs.loops_of(&v.id), std::slice::from_ref(&device));
    assert!(dirs.loops_of(&w.id).is_empty());
    provider.crash();

    // As after a reboot: device and link gone; the start makes them again.
    mount_utils::loopdev::detach(&device).unwrap();
    std::fs::remove_file(dirs.link(&v.id)).unwrap();
    let provider = start(&dirs, &[]);
    let link = dirs.link(&v.id);
    assert!(is_link(&link));
    assert_eq!(
        backing_file_of(&std::fs::read_link(&link).unwrap()),
        dirs.volume_file(&v.id)
    );
    provider.stop();

    // --cleanup: no device, no link, and the state says detached.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cloud-provider"))
        .arg("--cleanup")
        .arg("--data-dir")
        .arg(dirs.data())
        .arg("--device-dir")
        .arg(dirs.devices())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!is_link(&link) && dirs.loops_of(&v.id).is_empty());
    let provider = start(&dirs, &[]);
    assert!(
        provider
            .client()
            .get_volume(&v.id)
            .await
            .unwrap()
            .node_ids
            .is_empty()
    );
    assert!(
        dirs.loops_of(&v.id).is_empty(),
        "a start after cleanup re-attaches nothing"
    );
    provider.stop();
}

#[tokio::test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
async fn an_attach_interrupted_by_a_crash_is_resumed() {
    let dirs = Dirs::new();
    let provider = start(&dirs, &["--fault-stuck-action-secs", "30"]);
    let client = provider.client();
    let v = client
        .create_volume(&volume_request("resumed", 1))
        .await
        .unwrap();
    let action = client.attach(&v.id, "node-a").await.unwrap();
    provider.crash();
    let provider = start(&dirs, &[]);
    let client = provider.client();
    assert_eq!(wait(&client, &action).await.status, ActionStatus::Completed);
    assert!(is_link(&dirs.link(&v.id)));
    assert_eq!(dirs.loops_of(&v.id).len(), 1);
    provider.stop();
}
