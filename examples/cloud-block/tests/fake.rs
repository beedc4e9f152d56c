//! FakeProvider answers as the provider process does: one scenario runs
//! against both and must see the same results. Plus the fake's own knobs.

mod common;

use cloud_block::api::{ActionStatus, CreateSnapshotRequest, PageRequest, VolumeFilter};
use cloud_block::client::{ConflictKind, FakeCall, FakeProvider, ProviderClient, ProviderError};
use common::{Dirs, start, volume_request, wait};

/// What a scenario saw, without ids and times (which differ by design).
async fn scenario(client: &dyn ProviderClient) -> Vec<String> {
    let mut seen = Vec::new();
    let mut note = |what: &str, r: Result<String, ProviderError>| {
        let shown = match r {
            Ok(s) => format!("{what}: ok {s}"),
            Err(e) => format!("{what}: {}", kind(&e)),
        };
        seen.push(shown);
    };
    let a = client.create_volume(&volume_request("a", 1)).await.unwrap();
    let b = client.create_volume(&volume_request("b", 2)).await.unwrap();
    let again = client.create_volume(&volume_request("a", 1)).await;
    note("create again", again.map(|v| v.name));
    let zero = client.create_volume(&volume_request("zero", 0)).await;
    note("size 0", zero.map(|v| v.name));
    let page = client
        .list_volumes(
            &VolumeFilter::default(),
            PageRequest {
                page: 1,
                per_page: 1,
            },
        )
        .await;
    note(
        "page 1",
        page.map(|p| format!("{} {:?} {}", p.items.len(), p.next_page, p.total)),
    );
    let resize = client.resize(&b.id, 1).await;
    note("shrink", resize.map(|a| format!("{:?}", a.status)));
    let grow = client.resize(&b.id, 3).await.unwrap();
    let grown = wait(client, &grow).await;
    note("grow", Ok(format!("{:?}", grown.status)));
    let size = client
        .get_volume(&b.id)
        .await
        .map(|v| v.size_gigabytes.to_string());
    note("size", size);
    let snap = CreateSnapshotRequest {
        name: "s".into(),
        tags: vec!["x".into()],
    };
    let s = client.create_snapshot(&a.id, &snap).await.unwrap();
    let dup = client.create_snapshot(&b.id, &snap).await;
    note("snapshot again", dup.map(|s| s.name));
    let detach = client.detach(&a.id, "nobody").await;
    note(
        "detach unattached",
        detach.map(|a| format!("{:?}", a.status)),
    );
    let bad_tag = CreateSnapshotRequest {
        name: "t".into(),
        tags: vec!["no spaces".into()],
    };
    note(
        "bad tag",
        client
            .create_snapshot(&a.id, &bad_tag)
            .await
            .map(|s| s.name),
    );
    note(
        "delete snapshot",
        client.delete_snapshot(&s.id).await.map(|()| String::new()),
    );
    note(
        "delete a",
        client.delete_volume(&a.id).await.map(|()| String::new()),
    );
    note("get a", client.get_volume(&a.id).await.map(|v| v.name));
    note(
        "odd id",
        client.get_volume("not-an-id").await.map(|v| v.name),
    );
    note(
        "action 999",
        client.get_action(999).await.map(|a| a.resource_id),
    );
    seen
}

fn kind(e: &ProviderError) -> String {
    match e {
        ProviderError::Conflict { kind, .. } => format!("conflict {kind}"),
        ProviderError::Invalid { .. } => "invalid".into(),
        ProviderError::NotFound { .. } => "not found".into(),
        other => format!("other {other}"),
    }
}

#[tokio::test]
async fn the_fake_answers_as_the_provider_process_does() {
    let fake = FakeProvider::new();
    let from_fake = scenario(&fake).await;

    let dirs = Dirs::new();
    let provider = start(&dirs, &[]);
    let from_process = scenario(&provider.client()).await;
    provider.stop();

    assert_eq!(from_fake, from_process);
    assert!(from_fake.contains(&"create again: conflict name taken".to_owned()));
    assert!(from_fake.contains(&"page 1: ok 1 Some(2) 2".to_owned()));
}

#[tokio::test]
async fn the_fake_records_calls_fails_on_demand_and_holds_actions() {
    let fake = FakeProvider::new();
    let v = fake.create_volume(&volume_request("v", 1)).await.unwrap();
    fake.fail_next([ProviderError::RateLimited {
        retry_after: Some(std::time::Duration::from_secs(2)),
        message: "slow down".into(),
    }]);
    let e = fake.get_volume(&v.id).await.unwrap_err();
    assert!(e.is_transient());
    assert_eq!(
        fake.get_volume(&v.id).await.unwrap(),
        v,
        "only the next call fails"
    );

    fake.hold_actions(true);
    let action = fake.attach(&v.id, "n").await.unwrap();
    assert_eq!(action.status, ActionStatus::InProgress);
    let e = fake.attach(&v.id, "n").await.unwrap_err();
    assert_eq!(
        e.conflict(),
        Some(&ConflictKind::ActionInProgress {
            action_id: Some(action.id)
        })
    );
    let ended = fake.finish_actions(Ok(()));
    assert_eq!(ended[0].status, ActionStatus::Completed);
    assert_eq!(fake.get_volume(&v.id).await.unwrap().node_ids, ["n"]);
    assert_eq!(fake.count("attach"), 2);
    assert_eq!(
        fake.calls()[0],
        FakeCall {
            method: "create_volume",
            target: "v".into()
        }
    );
}

/// ControllerPublishVolume reads the volume once before its attach: the
/// attachment lookup that follows takes that read and asks only for the
/// volume's actions. The attach is then polled as before.
#[tokio::test]
async fn a_publish_reads_the_volume_once_before_attaching() {
    use cloud_block::driver::{CloudController, controller_config};
    use csi_controller::ControllerService;
    use csi_driver::v1::volume_capability::access_mode::Mode;
    use csi_driver::v1::*;
    use csi_driver::{CallContext, Controller, Method};
    use std::sync::Arc;

    let fake = Arc::new(FakeProvider::new());
    let backend = CloudController {
        client: fake.clone(),
        region: "dev-1".into(),
    };
    let service = ControllerService::without_store(controller_config("dev-1"), backend).unwrap();
    let cap = VolumeCapability::mount("ext4").with_access_mode(Mode::SingleNodeWriter);
    let create = CreateVolumeRequest {
        name: "pvc-1".into(),
        volume_capabilities: vec![cap.clone()],
        ..Default::default()
    };
    let ctx = CallContext::detached(0, Method::CreateVolume);
    let made = service.create_volume(&ctx, create).await.unwrap();
    let id = made.volume.unwrap().volume_id;
    let before = fake.calls().len();
    let publish = ControllerPublishVolumeRequest {
        volume_id: id.clone(),
        node_id: "node-a".into(),
        volume_capability: Some(cap),
        ..Default::default()
    };
    let ctx = CallContext::detached(0, Method::ControllerPublishVolume);
    let published = service.controller_publish_volume(&ctx, publish).await;
    assert!(!published.unwrap().publish_context.is_empty());
    let calls = fake.calls();
    let methods: Vec<&str> = calls[before..].iter().map(|c| c.method).collect();
    let attach = methods.iter().position(|m| *m == "attach");
    let attach = attach.unwrap_or_else(|| panic!("no attach: {methods:?}"));
    assert_eq!(
        methods[..attach],
        ["get_volume", "list_volume_actions"],
        "one read, then the actions: {methods:?}"
    );
    assert_eq!(fake.get_volume(&id).await.unwrap().node_ids, ["node-a"]);
}
