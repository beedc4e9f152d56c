use super::*;
use crate::api::{ActionKind, ActionRequest};

fn id(n: u8) -> String {
    format!("00000000-0000-4000-8000-0000000000{n:02x}")
}

fn create(cloud: &mut Cloud, name: &str, n: u8) -> Result<Volume, ApiError> {
    let req = CreateVolumeRequest {
        name: name.into(),
        size_gigabytes: 1,
        ..Default::default()
    };
    cloud.create_volume(&Limits::default(), &req, id(n), "2026-01-01T00:00:00Z")
}

fn act(cloud: &mut Cloud, vol: u8, kind: ActionKind, node: &str) -> Result<Action, ApiError> {
    let req = ActionRequest {
        kind,
        node_id: Some(node.into()),
        size_gigabytes: None,
    };
    cloud.start_action(&Limits::default(), &id(vol), &req, "t")
}

#[test]
fn names_are_unique_per_region_and_fields_are_named() {
    let mut cloud = Cloud::default();
    create(&mut cloud, "a", 1).unwrap();
    let e = create(&mut cloud, "a", 2).unwrap_err();
    assert_eq!((e.status, e.body.id.as_str()), (409, error_id::NAME_TAKEN));
    let e = create(&mut cloud, "", 3).unwrap_err();
    assert!(e.body.message.starts_with("name:"), "{e:?}");
}

#[test]
fn attach_rules_follow_a_cloud() {
    let mut cloud = Cloud::default();
    create(&mut cloud, "a", 1).unwrap();
    let a = act(&mut cloud, 1, ActionKind::Attach, "n1").unwrap();
    let e = act(&mut cloud, 1, ActionKind::Attach, "n1").unwrap_err();
    assert_eq!(
        e.body.action_id,
        Some(a.id),
        "a retry finds the running action"
    );
    cloud.finish_action(a.id, Ok(()), "t");
    assert_eq!(cloud.volume(&id(1)).unwrap().node_ids, ["n1"]);
    let e = act(&mut cloud, 1, ActionKind::Attach, "n1").unwrap_err();
    assert_eq!(
        (e.status, e.body.id.as_str()),
        (422, error_id::ALREADY_ATTACHED)
    );
    let e = act(&mut cloud, 1, ActionKind::Attach, "n2").unwrap_err();
    assert_eq!(e.body.node_id.as_deref(), Some("n1"));
    let e = cloud.delete_volume(&id(1)).unwrap_err();
    assert_eq!(e.body.id, error_id::VOLUME_ATTACHED);
    let e = act(&mut cloud, 1, ActionKind::Detach, "n2").unwrap_err();
    assert_eq!(e.body.id, error_id::NOT_ATTACHED);
    let d = act(&mut cloud, 1, ActionKind::Detach, "n1").unwrap();
    cloud.finish_action(d.id, Err("boom".into()), "t");
    assert_eq!(
        cloud.volume(&id(1)).unwrap().node_ids,
        ["n1"],
        "errored: unchanged"
    );
    let d = act(&mut cloud, 1, ActionKind::Detach, "n1").unwrap();
    cloud.finish_action(d.id, Ok(()), "t");
    cloud.delete_volume(&id(1)).unwrap();
}

#[test]
fn a_deleted_volume_takes_its_actions_with_it() {
    let mut cloud = Cloud::default();
    create(&mut cloud, "a", 1).unwrap();
    create(&mut cloud, "b", 2).unwrap();
    let mut ended = Vec::new();
    for kind in [ActionKind::Attach, ActionKind::Detach] {
        let a = act(&mut cloud, 1, kind, "n1").unwrap();
        cloud.finish_action(a.id, Ok(()), "t");
        ended.push(a.id);
    }
    let kept = act(&mut cloud, 2, ActionKind::Attach, "n1").unwrap();
    cloud.finish_action(kept.id, Ok(()), "t");
    cloud.delete_volume(&id(1)).unwrap();
    for gone in ended {
        let e = cloud.action(gone).unwrap_err();
        assert_eq!((e.status, e.body.id.as_str()), (404, error_id::NOT_FOUND));
    }
    assert_eq!(cloud.action(kept.id).unwrap().resource_id, id(2));
    let (listed, _, total) = cloud.list_actions(&id(2), PageRequest::default()).unwrap();
    assert_eq!((listed.len(), total), (1, 1));
}

#[test]
fn attach_limit_counts_running_attaches() {
    let mut cloud = Cloud::default();
    let limits = Limits {
        max_volumes_per_node: 1,
        ..Limits::default()
    };
    create(&mut cloud, "a", 1).unwrap();
    create(&mut cloud, "b", 2).unwrap();
    let req = ActionRequest {
        kind: ActionKind::Attach,
        node_id: Some("n".into()),
        size_gigabytes: None,
    };
    cloud.start_action(&limits, &id(1), &req, "t").unwrap();
    let e = cloud.start_action(&limits, &id(2), &req, "t").unwrap_err();
    assert_eq!(e.body.id, error_id::ATTACH_LIMIT);
}

#[test]
fn pages_cover_everything_once() {
    let mut cloud = Cloud::default();
    for n in 0..5 {
        create(&mut cloud, &format!("v{n}"), n).unwrap();
    }
    let mut seen = Vec::new();
    let mut page = PageRequest {
        page: 1,
        per_page: 2,
    };
    loop {
        let (items, next, total) = cloud.list_volumes(&VolumeFilter::default(), page);
        assert_eq!(total, 5);
        seen.extend(items.into_iter().map(|v| v.name));
        match next {
            Some(p) => page.page = p,
            None => break,
        }
    }
    assert_eq!(seen, ["v0", "v1", "v2", "v3", "v4"]);
}

#[test]
fn provider_ids_are_canonical_uuids_only() {
    assert!(is_provider_id(&id(1)));
    assert!(!is_provider_id("../state.json"));
    assert!(!is_provider_id(&id(0xab).to_uppercase()));
}

#[test]
fn attach_to_a_node_the_cloud_does_not_have_is_not_found() {
    let mut cloud = Cloud::default();
    let limits = Limits {
        nodes: vec!["n1".into()],
        ..Limits::default()
    };
    create(&mut cloud, "a", 1).unwrap();
    let req = |node: &str| ActionRequest {
        kind: ActionKind::Attach,
        node_id: Some(node.into()),
        size_gigabytes: None,
    };
    let e = (cloud.start_action(&limits, &id(1), &req("n9"), "t")).unwrap_err();
    assert_eq!((e.status, e.body.id.as_str()), (404, error_id::NOT_FOUND));
    assert!(e.body.message.contains("n9"), "{e:?}");
    cloud
        .start_action(&limits, &id(1), &req("n1"), "t")
        .unwrap();
}
