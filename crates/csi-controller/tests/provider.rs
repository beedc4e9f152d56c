//! The service over a provider that is the source of truth (FakeProvider,
//! no store): idempotency by name, operations resumed after a deadline,
//! transient errors and Retry-After, bad answers, capabilities and attach.
//! Time is a FakeClock: nothing here waits for real.

use std::sync::Arc;
use std::time::Duration;

use csi_controller::{
    BackendError, Config, ControllerService, FakeControllerBackend, FakeProvider, Offers,
};
use csi_driver::clock::{Clock, FakeClock};
use csi_driver::{
    CallContext, Capabilities, Code, Controller, ControllerRpc, FakeBlockingRunner, Method,
    PluginService, v1::*,
};

type Service = ControllerService<Arc<FakeProvider>>;

fn world() -> (Service, Arc<FakeProvider>, Arc<FakeClock>) {
    let clock = Arc::new(FakeClock::new());
    let provider = Arc::new(FakeProvider::new(clock.clone()));
    (service(&provider, &clock), provider, clock)
}

/// A controller (a restart, or another replica) over the same provider.
fn service(provider: &Arc<FakeProvider>, clock: &Arc<FakeClock>) -> Service {
    let config = Config {
        clock: clock.clone(),
        ..Config::new("controller")
    };
    ControllerService::without_store(config, provider.clone()).unwrap()
}

/// A call whose caller waits `secs` seconds of the fake clock.
fn ctx(clock: &FakeClock, secs: u64) -> CallContext {
    CallContext::detached(0, Method::CreateVolume)
        .with_deadline(Some(clock.now() + Duration::from_secs(secs)))
}

fn create_req(name: &str) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange::at_least(1 << 30)),
        volume_capabilities: vec![VolumeCapability::mount("ext4")],
        ..Default::default()
    }
}

async fn create(
    s: &Service,
    ctx: &CallContext,
    name: &str,
) -> Result<Volume, csi_driver::CsiError> {
    Ok(s.create_volume(ctx, create_req(name))
        .await?
        .volume
        .unwrap())
}

#[tokio::test]
async fn a_name_is_one_volume_across_repeats_and_restarts() {
    let (s, provider, clock) = world();
    let v = create(&s, &ctx(&clock, 10), "pvc-1").await.unwrap();
    assert_eq!(create(&s, &ctx(&clock, 10), "pvc-1").await.unwrap(), v);
    let restarted = service(&provider, &clock);
    assert_eq!(
        create(&restarted, &ctx(&clock, 10), "pvc-1").await.unwrap(),
        v
    );
    let bigger = CreateVolumeRequest {
        capacity_range: Some(CapacityRange::at_least(2 << 30)),
        ..create_req("pvc-1")
    };
    let err = restarted
        .create_volume(&ctx(&clock, 10), bigger)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
    assert_eq!(provider.creates(), 1);
    assert!(s.tables().is_none(), "no records are kept");
    let delete = DeleteVolumeRequest {
        volume_id: v.volume_id.clone(),
        ..Default::default()
    };
    restarted
        .delete_volume(&ctx(&clock, 10), delete.clone())
        .await
        .unwrap();
    // A provider that answers 404 about what is gone: still OK.
    provider.fail_next(BackendError::NotFound("HTTP 404".into()));
    restarted
        .delete_volume(&ctx(&clock, 10), delete)
        .await
        .unwrap();
    assert!(provider.volume_names().is_empty());
}

#[tokio::test]
async fn a_create_that_outlives_its_deadline_is_resumed_by_the_retry() {
    let (s, provider, clock) = world();
    provider.set_action_time(Duration::from_secs(30));
    let err = create(&s, &ctx(&clock, 10), "slow").await.unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    assert!(
        s.in_flight().is_empty(),
        "the claim went with the call's work"
    );
    // The CO retries (here from a restarted controller): found by name,
    // waited for, never made twice.
    let restarted = service(&provider, &clock);
    let v = create(&restarted, &ctx(&clock, 60), "slow").await.unwrap();
    assert_eq!(provider.creates(), 1);
    assert_eq!(provider.volume_names(), ["slow"]);
    assert!(v.volume_id.starts_with("pv-"), "the provider's own id");
}

#[tokio::test]
async fn transient_errors_are_retried_and_a_retry_after_is_honoured() {
    let (s, provider, clock) = world();
    provider.fail_next(BackendError::transient("503 Service Unavailable"));
    provider.fail_next(BackendError::Transient {
        message: "429 Too Many Requests".into(),
        retry_after: Some(Duration::from_secs(7)),
    });
    provider.fail_next(BackendError::transient("connection refused"));
    create(&s, &ctx(&clock, 60), "pvc").await.unwrap();
    let sleeps = clock.sleeps();
    assert!(sleeps.contains(&Duration::from_secs(7)), "{sleeps:?}");
    assert!(clock.elapsed() >= Duration::from_secs(7));
    assert_eq!(provider.creates(), 1);
}

#[tokio::test]
async fn transient_errors_past_the_deadline_are_unavailable() {
    let (s, provider, clock) = world();
    provider.fail_next(BackendError::Transient {
        message: "429 Too Many Requests".into(),
        retry_after: Some(Duration::from_secs(30)),
    });
    let err = create(&s, &ctx(&clock, 10), "pvc").await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(clock.sleeps().is_empty(), "no wait beyond the deadline");
    assert!(provider.volume_names().is_empty());
}

#[tokio::test]
async fn a_refused_token_or_garbage_is_a_clear_error_and_nothing_is_made() {
    let (s, provider, clock) = world();
    provider.fail_next(BackendError::Unauthorized("HTTP 401".into()));
    let err = create(&s, &ctx(&clock, 10), "pvc").await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    assert!(err.to_string().contains("refused the credentials"), "{err}");
    provider.fail_next(BackendError::Malformed(
        "expected JSON, got \"<html>\"".into(),
    ));
    let err = create(&s, &ctx(&clock, 10), "pvc").await.unwrap_err();
    assert_eq!(err.code(), Code::Internal);
    assert!(err.to_string().contains("could not be read"), "{err}");
    assert!(provider.volume_names().is_empty());
    assert_eq!(provider.creates(), 0);
}

#[tokio::test]
async fn unknown_parameters_are_invalid_naming_the_key() {
    let (s, provider, clock) = world();
    let req = CreateVolumeRequest {
        parameters: [
            ("type".to_owned(), "ssd".to_owned()),
            ("csi.storage.k8s.io/pvc/name".to_owned(), "data".to_owned()),
            ("tpye".to_owned(), "ssd".to_owned()),
        ]
        .into(),
        ..create_req("pvc")
    };
    let err = s.create_volume(&ctx(&clock, 10), req).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.to_string().contains("parameters.tpye"), "{err}");
    assert_eq!(provider.calls(), 0);
}

#[tokio::test]
async fn only_what_the_backend_provides_is_declared() {
    let clock = Arc::new(FakeClock::new());
    let has = |caps: &Capabilities, rpc| caps.has_controller(rpc);
    let minimal = Arc::new(FakeProvider::volumes_only(clock.clone()));
    let s = service(&minimal, &clock);
    let caps = s.capabilities(Capabilities::new());
    assert!(has(&caps, ControllerRpc::CreateDeleteVolume));
    for rpc in [
        ControllerRpc::CreateDeleteSnapshot,
        ControllerRpc::CloneVolume,
        ControllerRpc::ExpandVolume,
        ControllerRpc::ModifyVolume,
        ControllerRpc::PublishUnpublishVolume,
        ControllerRpc::GetCapacity,
    ] {
        assert!(!has(&caps, rpc), "{rpc:?}");
    }
    assert!(caps.expansion().is_none());
    let (full, _, _) = world();
    let caps = full.capabilities(Capabilities::new());
    for rpc in [
        ControllerRpc::CreateDeleteSnapshot,
        ControllerRpc::ExpandVolume,
        ControllerRpc::PublishUnpublishVolume,
    ] {
        assert!(has(&caps, rpc), "{rpc:?}");
    }
    assert!(!has(&caps, ControllerRpc::CloneVolume));
    assert!(!caps.has_plugin(PluginService::GroupControllerService));
    // Local data: the abilities offered, no more.
    let offers = Offers {
        snapshots: true,
        ..Offers::default()
    };
    let local = ControllerService::with_store(
        Arc::new(csi_store::FakeStore::new()),
        Config::new("n1"),
        FakeControllerBackend::with_offers(offers),
    )
    .unwrap();
    let caps = local.capabilities(Capabilities::new());
    assert!(has(&caps, ControllerRpc::CreateDeleteSnapshot));
    assert!(has(&caps, ControllerRpc::GetCapacity));
    assert!(!has(&caps, ControllerRpc::CloneVolume));
    assert!(!has(&caps, ControllerRpc::ModifyVolume));
    assert!(!caps.has_plugin(PluginService::GroupControllerService));
}

fn publish(volume_id: &str, node: &str) -> ControllerPublishVolumeRequest {
    ControllerPublishVolumeRequest {
        volume_id: volume_id.into(),
        node_id: node.into(),
        volume_capability: Some(VolumeCapability::mount("ext4")),
        ..Default::default()
    }
}

#[tokio::test]
async fn attach_goes_through_the_backend_and_a_slow_one_is_polled_not_restarted() {
    let (s, provider, clock) = world();
    let v = create(&s, &ctx(&clock, 10), "pvc").await.unwrap();
    provider.set_action_time(Duration::from_secs(20));
    let err = s
        .controller_publish_volume(&ctx(&clock, 5), publish(&v.volume_id, "node-a"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    let published = s
        .controller_publish_volume(&ctx(&clock, 60), publish(&v.volume_id, "node-a"))
        .await
        .unwrap();
    assert_eq!(provider.attaches(), 1, "the in-flight attach was resumed");
    assert_eq!(
        published.publish_context.get("device").map(String::as_str),
        Some(format!("/dev/disk/by-id/fake-{}", v.volume_id).as_str())
    );
    // A single-node volume on a second node, and a delete while attached.
    let err = s
        .controller_publish_volume(&ctx(&clock, 60), publish(&v.volume_id, "node-b"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    let delete = DeleteVolumeRequest {
        volume_id: v.volume_id.clone(),
        ..Default::default()
    };
    let err = s
        .delete_volume(&ctx(&clock, 10), delete.clone())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    let unpublish = ControllerUnpublishVolumeRequest {
        volume_id: v.volume_id.clone(),
        node_id: "node-a".into(),
        ..Default::default()
    };
    s.controller_unpublish_volume(&ctx(&clock, 10), unpublish.clone())
        .await
        .unwrap();
    s.controller_unpublish_volume(&ctx(&clock, 10), unpublish)
        .await
        .unwrap();
    s.delete_volume(&ctx(&clock, 10), delete).await.unwrap();
}

#[tokio::test]
async fn create_and_publish_make_no_redundant_provider_calls() {
    let (s, provider, clock) = world();
    let v = create(&s, &ctx(&clock, 10), "pvc").await.unwrap();
    // The lookup by name, the create, and the readiness read (this
    // provider's volumes are not ready when created).
    assert_eq!(provider.calls(), 3);
    s.controller_publish_volume(&ctx(&clock, 10), publish(&v.volume_id, "node-a"))
        .await
        .unwrap();
    // The volume, the lookup of an attach in flight, the attach, and one
    // poll (this provider's attach answers that it is attaching).
    assert_eq!(provider.calls(), 7);
    assert_eq!((provider.creates(), provider.attaches()), (1, 1));
}

#[tokio::test]
async fn snapshots_are_found_by_name_and_listed_in_pages() {
    let (s, provider, clock) = world();
    let v = create(&s, &ctx(&clock, 10), "pvc").await.unwrap();
    let req = CreateSnapshotRequest {
        name: "snap".into(),
        source_volume_id: v.volume_id.clone(),
        ..Default::default()
    };
    let snap = s
        .create_snapshot(&ctx(&clock, 10), req.clone())
        .await
        .unwrap();
    let again = service(&provider, &clock)
        .create_snapshot(&ctx(&clock, 10), req)
        .await
        .unwrap();
    assert_eq!(again, snap);
    for name in ["b", "c"] {
        create(&s, &ctx(&clock, 10), name).await.unwrap();
    }
    let list = ListVolumesRequest {
        max_entries: 2,
        ..Default::default()
    };
    let first = s
        .list_volumes(&ctx(&clock, 10), list.clone())
        .await
        .unwrap();
    assert_eq!(first.entries.len(), 2);
    let rest = ListVolumesRequest {
        starting_token: first.next_token,
        ..list
    };
    let second = s.list_volumes(&ctx(&clock, 10), rest).await.unwrap();
    assert_eq!(second.entries.len(), 1);
    assert!(second.next_token.is_empty());
}

#[tokio::test]
async fn expansion_goes_to_the_provider_after_a_transient_error() {
    let (s, provider, clock) = world();
    let v = create(&s, &ctx(&clock, 10), "pvc").await.unwrap();
    provider.fail_next(BackendError::transient("502 Bad Gateway"));
    let req = ControllerExpandVolumeRequest {
        volume_id: v.volume_id.clone(),
        capacity_range: Some(CapacityRange::at_least(3 << 30)),
        ..Default::default()
    };
    let grown = s
        .controller_expand_volume(&ctx(&clock, 10), req)
        .await
        .unwrap();
    assert_eq!(grown.capacity_bytes, 3 << 30);
    let get = ControllerGetVolumeRequest {
        volume_id: v.volume_id,
    };
    let got = s
        .controller_get_volume(&ctx(&clock, 10), get)
        .await
        .unwrap();
    assert_eq!(got.volume.unwrap().capacity_bytes, 3 << 30);
}

/// No thread can be made for the first CreateVolume: it fails with
/// RESOURCE_EXHAUSTED, its claim is released, and the retry succeeds at once
/// instead of being ABORTED.
#[tokio::test]
async fn work_that_cannot_start_releases_its_claims_and_the_retry_succeeds() {
    let backend = Arc::new(FakeControllerBackend::new());
    let config = Config {
        runner: Arc::new(FakeBlockingRunner::failing(1)),
        ..Config::new("n1")
    };
    let s = ControllerService::with_store(
        Arc::new(csi_store::FakeStore::new()),
        config,
        backend.clone(),
    )
    .unwrap();
    let ctx = CallContext::detached(0, Method::CreateVolume);
    let err = s.create_volume(&ctx, create_req("pvc")).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    assert!(s.in_flight().is_empty(), "no claim left behind");
    assert_eq!(s.ledger().used(), 0, "no capacity left reserved");
    let v = s.create_volume(&ctx, create_req("pvc")).await.unwrap();
    assert!(v.volume.is_some());
    assert_eq!(backend.data().made, 1);
}
