//! The provider as its own process over real HTTP, through the client:
//! volumes, paging, auth, snapshots, resize, the fault mode and restarts.
//! Nothing here needs root (no attach); see `attach.rs` for that.

mod common;

use std::time::{Duration, Instant};

use cloud_block::api::{
    ActionStatus, CreateSnapshotRequest, PageRequest, SnapshotFilter, VolumeFilter,
};
use cloud_block::client::{ConflictKind, HttpProvider, ProviderClient, ProviderError};
use cloud_block::token::Token;
use common::{Dirs, TOKEN, raw, start, volume_request, wait};

#[tokio::test]
async fn volumes_by_name_with_paging_and_delete() {
    let dirs = Dirs::new();
    let provider = start(&dirs, &[]);
    let client = provider.client();
    let mut ids = Vec::new();
    for n in 0..5 {
        let v = client
            .create_volume(&volume_request(&format!("pvc-{n}"), 1))
            .await
            .unwrap();
        assert_eq!((v.region.as_str(), v.size_gigabytes), ("dev-1", 1));
        assert_eq!(v.tags, ["k8s:test"]);
        assert!(dirs.volume_file(&v.id).exists(), "a volume is a file");
        ids.push(v.id);
    }
    let got = client.get_volume(&ids[2]).await.unwrap();
    assert_eq!(got.name, "pvc-2");

    // Every volume exactly once, two per page, oldest first.
    let mut names = Vec::new();
    let mut page = PageRequest {
        page: 1,
        per_page: 2,
    };
    loop {
        let answer = client
            .list_volumes(&VolumeFilter::default(), page)
            .await
            .unwrap();
        assert_eq!(answer.total, 5);
        assert!(answer.items.len() <= 2);
        names.extend(answer.items.into_iter().map(|v| v.name));
        match answer.next_page {
            Some(next) => page.page = next,
            None => break,
        }
    }
    names.sort();
    assert_eq!(names, ["pvc-0", "pvc-1", "pvc-2", "pvc-3", "pvc-4"]);
    let by_name = VolumeFilter {
        name: Some("pvc-3".into()),
        region: None,
    };
    let found = client
        .list_volumes(&by_name, PageRequest::default())
        .await
        .unwrap();
    assert_eq!(
        found.items.iter().map(|v| &v.id).collect::<Vec<_>>(),
        [&ids[3]]
    );

    // An existing name: a conflict, as a cloud answers; nothing new is made.
    let e = client
        .create_volume(&volume_request("pvc-3", 2))
        .await
        .unwrap_err();
    assert_eq!(e.conflict(), Some(&ConflictKind::NameTaken), "{e}");
    let all = client
        .list_volumes(&VolumeFilter::default(), PageRequest::default())
        .await
        .unwrap();
    assert_eq!(all.total, 5);

    // A bad value: invalid, naming the field.
    let e = client
        .create_volume(&volume_request("big", 1 << 40))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, ProviderError::Invalid { message } if message.contains("size_gigabytes")),
        "{e}"
    );

    client.delete_volume(&ids[0]).await.unwrap();
    assert!(!dirs.volume_file(&ids[0]).exists());
    assert!(client.get_volume(&ids[0]).await.unwrap_err().is_not_found());
    assert!(
        client
            .delete_volume(&ids[0])
            .await
            .unwrap_err()
            .is_not_found()
    );
    // Not a provider id: not found, and never put into a URL.
    assert!(
        client
            .get_volume("../admin/faults")
            .await
            .unwrap_err()
            .is_not_found()
    );
    let (status, _) = raw(
        &provider.endpoint,
        "GET",
        "/v2/volumes/..%2Fstate.json",
        Some(TOKEN),
        "",
    );
    assert_eq!(status, 404);
    provider.stop();
}

#[tokio::test]
async fn no_token_is_401_and_the_token_never_shows() {
    let dirs = Dirs::new();
    let provider = start(&dirs, &[]);
    let (status, body) = raw(&provider.endpoint, "GET", "/v2/volumes", None, "");
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("unauthorized"));
    let (status, _) = raw(&provider.endpoint, "GET", "/healthz", None, "");
    assert_eq!(status, 200, "the health check needs no token");
    let (status, _) = raw(&provider.endpoint, "PUT", "/admin/faults", None, "{}");
    assert_eq!(status, 401, "nor does the admin endpoint go without one");

    let wrong = HttpProvider::new(
        &provider.endpoint,
        Token::new("not-the-token", "t").unwrap(),
    )
    .unwrap();
    let e = wrong.list_regions().await.unwrap_err();
    assert!(
        matches!(e, ProviderError::Unauthorized { status: 401, .. }),
        "{e}"
    );
    assert!(!e.is_transient());
    assert!(
        !e.to_string().contains("not-the-token") && !format!("{e:?}").contains("not-the-token")
    );
    let regions = provider.client().list_regions().await.unwrap();
    assert_eq!(regions[0].slug, "dev-1");
    provider.stop();
    let log = std::fs::read_to_string(dirs.data().parent().unwrap().join("provider.log")).unwrap();
    assert!(log.contains("request"), "requests are logged");
    assert!(
        !log.contains(TOKEN) && !log.contains("not-the-token"),
        "tokens are not"
    );
}

#[tokio::test]
async fn a_token_from_a_file() {
    let dirs = Dirs::new();
    let file = dirs.data().parent().unwrap().join("token");
    std::fs::write(&file, "from-a-secret\n").unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_cloud-provider"));
    cmd.args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dirs.data())
        .arg("--device-dir")
        .arg(dirs.devices())
        .arg("--token-file")
        .arg(&file)
        .env_remove("CLOUD_PROVIDER_TOKEN")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    let mut child = cmd.spawn().unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let endpoint = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap()
        .to_owned();
    let client = HttpProvider::new(&endpoint, Token::new("from-a-secret", "t").unwrap()).unwrap();
    let listed = client.list_regions().await;
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(listed.is_ok(), "{listed:?}");
}

#[tokio::test]
async fn throttling_carries_retry_after() {
    let dirs = Dirs::new();
    let provider = start(&dirs, &[]);
    provider.set_faults(r#"{"throttle_rate": 1.0, "retry_after_secs": 7}"#);
    let client = provider.client();
    let e = client.list_regions().await.unwrap_err();
    assert!(matches!(e, ProviderError::RateLimited { .. }), "{e}");
    assert_eq!(e.retry_after(), Some(Duration::from_secs(7)));
    assert!(e.is_transient());
    provider.set_faults("{}");
    client.list_regions().await.unwrap();
    provider.stop();
}

#[tokio::test]
async fn the_error_rate_fails_that_share_of_calls() {
    let dirs = Dirs::new();
    let provider = start(&dirs, &["--fault-error-rate", "0.5", "--fault-seed", "42"]);
    let client = provider.client();
    let (mut failed, mut passed) = (0, 0);
    for _ in 0..60 {
        match client.list_regions().await {
            Ok(_) => passed += 1,
            Err(e @ ProviderError::Unavailable { status: 503, .. }) => {
                assert!(e.is_transient());
                failed += 1;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(
        (15..=45).contains(&failed),
        "{failed} of 60 failed at rate 0.5"
    );
    assert_eq!(failed + passed, 60);

    // A lost answer: the call failed for the client but took effect.
    provider.set_faults(r#"{"lost_reply_rate": 1.0}"#);
    let e = client
        .create_volume(&volume_request("lost", 1))
        .await
        .unwrap_err();
    assert!(e.is_transient(), "{e}");
    provider.set_faults("{}");
    let by_name = VolumeFilter {
        name: Some("lost".into()),
        region: None,
    };
    let found = client
        .list_volumes(&by_name, PageRequest::default())
        .await
        .unwrap();
    assert_eq!(found.items.len(), 1, "a retry finds it by name");
    provider.stop();
}

#[tokio::test]
async fn latency_and_timeouts_and_refused_connections() {
    let dirs = Dirs::new();
    let provider = start(&dirs, &["--fault-latency-ms", "300"]);
    let started = Instant::now();
    provider.client().list_regions().await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));
    let impatient = provider.client().with_timeout(Duration::from_millis(50));
    let e = impatient.list_regions().await.unwrap_err();
    assert!(
        matches!(e, ProviderError::Timeout { .. }) && e.is_transient(),
        "{e}"
    );
    provider.stop();

    // Nothing listens on port 1 (tcpmux) of loopback.
    let nowhere = HttpProvider::new("http://127.0.0.1:1", Token::new(TOKEN, "t").unwrap()).unwrap();
    let e = nowhere.list_regions().await.unwrap_err();
    assert!(
        matches!(e, ProviderError::Connection { .. }) && e.is_transient(),
        "{e}"
    );
}

#[tokio::test]
async fn a_garbage_answer_is_a_clear_error() {
    let dirs = Dirs::new();
    let provider = start(&dirs, &[]);
    let client = provider.client();
    let v = client.create_volume(&volume_request("g", 1)).await.unwrap();
    provider.set_faults(r#"{"garbage_next": 1}"#);
    let e = client.get_volume(&v.id).await.unwrap_err();
    let ProviderError::Garbage { request, reason } = &e else {
        panic!("{e}");
    };
    assert_eq!(request, &format!("GET /v2/volumes/{}", v.id));
    assert!(
        reason.contains("not the expected JSON") && reason.contains("expected value"),
        "{reason}"
    );
    assert!(!e.is_transient());
    assert_eq!(
        client.get_volume(&v.id).await.unwrap(),
        v,
        "only the next answer"
    );
    provider.stop();
}

#[tokio::test]
async fn a_stuck_action_completes_after_its_time() {
    let dirs = Dirs::new();
    let provider = start(&dirs, &[]);
    let client = provider.client();
    let v = client
        .create_volume(&volume_request("grow", 1))
        .await
        .unwrap();
    provider.set_faults(r#"{"stuck_action_secs": 3}"#);
    let started = Instant::now();
    let action = client.resize(&v.id, 3).await.unwrap();
    assert_eq!(action.status, ActionStatus::InProgress);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        client.get_action(action.id).await.unwrap().status,
        ActionStatus::InProgress
    );
    let e = client.resize(&v.id, 4).await.unwrap_err();
    assert_eq!(
        e.conflict(),
        Some(&ConflictKind::ActionInProgress {
            action_id: Some(action.id)
        })
    );
    let ended = wait(&client, &action).await;
    assert_eq!(ended.status, ActionStatus::Completed);
    assert!(started.elapsed() >= Duration::from_secs(3));
    assert_eq!(client.get_volume(&v.id).await.unwrap().size_gigabytes, 3);
    assert_eq!(
        std::fs::metadata(dirs.volume_file(&v.id)).unwrap().len(),
        3 << 30
    );
    let listed = client
        .list_volume_actions(&v.id, PageRequest::default())
        .await
        .unwrap();
    assert_eq!(listed.items[0].id, action.id, "newest first");
    // Volumes only grow.
    let e = client.resize(&v.id, 2).await.unwrap_err();
    assert!(matches!(e, ProviderError::Invalid { .. }), "{e}");
    provider.stop();
}

#[tokio::test]
async fn snapshots_and_volumes_made_from_them() {
    let dirs = Dirs::new();
    let provider = start(&dirs, &[]);
    let client = provider.client();
    let v = client
        .create_volume(&volume_request("source", 2))
        .await
        .unwrap();
    std::os::unix::fs::FileExt::write_at(
        &std::fs::OpenOptions::new()
            .write(true)
            .open(dirs.volume_file(&v.id))
            .unwrap(),
        b"payload",
        1 << 20,
    )
    .unwrap();
    let req = CreateSnapshotRequest {
        name: "snap".into(),
        tags: vec![],
    };
    let s = client.create_snapshot(&v.id, &req).await.unwrap();
    assert_eq!(
        (s.resource_id.as_str(), s.min_disk_size),
        (v.id.as_str(), 2)
    );
    let e = client.create_snapshot(&v.id, &req).await.unwrap_err();
    assert_eq!(e.conflict(), Some(&ConflictKind::NameTaken));
    let filter = SnapshotFilter {
        name: Some("snap".into()),
        resource_id: None,
    };
    let listed = client
        .list_snapshots(&filter, PageRequest::default())
        .await
        .unwrap();
    assert_eq!(listed.items, std::slice::from_ref(&s));

    let mut from = volume_request("restored", 1);
    from.snapshot_id = Some(s.id.clone());
    let e = client.create_volume(&from).await.unwrap_err();
    assert!(
        matches!(&e, ProviderError::Invalid { message } if message.contains("min_disk_size")),
        "{e}"
    );
    from.size_gigabytes = 3;
    let restored = client.create_volume(&from).await.unwrap();
    let mut buf = [0u8; 7];
    std::os::unix::fs::FileExt::read_at(
        &std::fs::File::open(dirs.volume_file(&restored.id)).unwrap(),
        &mut buf,
        1 << 20,
    )
    .unwrap();
    assert_eq!(&buf, b"payload");
    assert_eq!(
        std::fs::metadata(dirs.volume_file(&restored.id))
            .unwrap()
            .len(),
        3 << 30
    );

    client.delete_snapshot(&s.id).await.unwrap();
    assert!(client.get_snapshot(&s.id).await.unwrap_err().is_not_found());
    assert!(
        client
            .delete_snapshot(&s.id)
            .await
            .unwrap_err()
            .is_not_found()
    );
    provider.stop();
}

#[tokio::test]
async fn clones_copy_a_volume_of_the_region() {
    let dirs = Dirs::new();
    let provider = start(&dirs, &["--region", "dev-1,dev-2"]);
    let client = provider.client();
    let v = client
        .create_volume(&volume_request("original", 2))
        .await
        .unwrap();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(dirs.volume_file(&v.id))
        .unwrap();
    std::os::unix::fs::FileExt::write_at(&file, b"payload", 1 << 20).unwrap();

    // Smaller than the source, two sources, no such volume: refused, nothing made.
    let mut req = volume_request("clone", 1);
    req.source_volume_id = Some(v.id.clone());
    let invalid = |e: &ProviderError, field: &str| matches!(e, ProviderError::Invalid { message } if message.contains(field));
    let e = client.create_volume(&req).await.unwrap_err();
    assert!(invalid(&e, "size_gigabytes"), "{e}");
    req.size_gigabytes = 3;
    req.snapshot_id = Some("00000000-0000-4000-8000-000000000001".into());
    let e = client.create_volume(&req).await.unwrap_err();
    assert!(invalid(&e, "source_volume_id"), "{e}");
    req.snapshot_id = None;
    req.source_volume_id = Some("00000000-0000-4000-8000-00000000dead".into());
    assert!(client.create_volume(&req).await.unwrap_err().is_not_found());
    req.source_volume_id = Some("../state".into());
    assert!(client.create_volume(&req).await.unwrap_err().is_not_found());
    let mut elsewhere = volume_request("elsewhere", 1);
    elsewhere.region = Some("dev-2".into());
    let elsewhere = client.create_volume(&elsewhere).await.unwrap();
    req.source_volume_id = Some(elsewhere.id.clone());
    let e = client.create_volume(&req).await.unwrap_err();
    assert!(
        invalid(&e, "source_volume_id") && e.to_string().contains("dev-2"),
        "{e}"
    );
    let all = client
        .list_volumes(&VolumeFilter::default(), PageRequest::default())
        .await
        .unwrap();
    assert_eq!(all.items.len(), 2, "nothing made");

    req.source_volume_id = Some(v.id.clone());
    let clone = client.create_volume(&req).await.unwrap();
    let mut buf = [0u8; 7];
    let copy = std::fs::File::open(dirs.volume_file(&clone.id)).unwrap();
    std::os::unix::fs::FileExt::read_at(&copy, &mut buf, 1 << 20).unwrap();
    assert_eq!(&buf, b"payload");
    assert_eq!(copy.metadata().unwrap().len(), 3 << 30);
    // The copy is its own: the source can go.
    client.delete_volume(&v.id).await.unwrap();
    assert_eq!(
        client.get_volume(&clone.id).await.unwrap().size_gigabytes,
        3
    );
    provider.stop();
}

#[tokio::test]
async fn a_restart_keeps_every_volume_and_snapshot() {
    let dirs = Dirs::new();
    let provider = start(&dirs, &[]);
    let client = provider.client();
    let a = client.create_volume(&volume_request("a", 1)).await.unwrap();
    let s = client
        .create_snapshot(
            &a.id,
            &CreateSnapshotRequest {
                name: "s".into(),
                tags: vec![],
            },
        )
        .await
        .unwrap();
    provider.stop();

    let provider = start(&dirs, &[]);
    let client = provider.client();
    assert_eq!(client.get_volume(&a.id).await.unwrap(), a);
    assert_eq!(client.get_snapshot(&s.id).await.unwrap(), s);
    let b = client.create_volume(&volume_request("b", 1)).await.unwrap();
    // A crash right after a create: the volume was saved before the answer.
    provider.crash();

    let provider = start(&dirs, &[]);
    let client = provider.client();
    assert_eq!(client.get_volume(&b.id).await.unwrap(), b);
    // A second provider on the same data directory is refused.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cloud-provider"))
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dirs.data())
        .arg("--device-dir")
        .arg(dirs.devices())
        .env("CLOUD_PROVIDER_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use"));
    provider.stop();
}

#[tokio::test]
async fn a_file_no_record_names_is_swept_at_start() {
    let dirs = Dirs::new();
    let provider = start(&dirs, &[]);
    provider.stop();
    let stray = dirs.volume_file("0f0e0d0c-0b0a-4908-8706-050403020100");
    std::fs::write(&stray, b"left by a crash").unwrap();
    let provider = start(&dirs, &[]);
    assert!(!stray.exists());
    provider.stop();
}

#[tokio::test]
async fn concurrent_creates_of_the_same_names_make_one_volume_each() {
    let dirs = Dirs::new();
    let provider = start(&dirs, &[]);
    let client = std::sync::Arc::new(provider.client());
    let calls: Vec<_> = (0..20)
        .map(|n| {
            let client = client.clone();
            tokio::spawn(async move {
                client
                    .create_volume(&volume_request(&format!("c-{}", n % 10), 1))
                    .await
            })
        })
        .collect();
    let (mut made, mut taken) = (0, 0);
    for call in calls {
        match call.await.unwrap() {
            Ok(_) => made += 1,
            Err(e) if e.conflict() == Some(&ConflictKind::NameTaken) => taken += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!((made, taken), (10, 10));
    let all = client
        .list_volumes(&VolumeFilter::default(), PageRequest::default())
        .await
        .unwrap();
    assert_eq!(all.total, 10);
    let files = std::fs::read_dir(dirs.data().join("volumes"))
        .unwrap()
        .count();
    assert_eq!(files, 10, "no file for a refused create");
    provider.stop();
}
