//! The rules' decision tables, case by case.

use super::*;
use crate::observe::Owner;
use crate::record::VolumeSource;
use csi_proto::v1::VolumeCapability;
use csi_proto::v1::volume_capability::access_mode::Mode;
use tonic::Code;

fn cap(c: VolumeCapability) -> Capability {
    Capability::from_proto(Some(&c), "volume_capability").unwrap()
}

fn mount_cap() -> VolumeCapability {
    VolumeCapability::mount("ext4").with_access_mode(Mode::SingleNodeWriter)
}

fn at(kind: PathKind, mounts: &[Owner]) -> PathFacts {
    PathFacts {
        kind,
        mounts: mounts.to_vec(),
    }
}

fn staged(path: &str, c: &VolumeCapability, state: StageState) -> StageRecord {
    StageRecord {
        volume_id: "v".into(),
        path: path.into(),
        capability: cap(c.clone()),
        readonly: false,
        source: VolumeSource::Image("/img".into()),
        device: None,
        formatted: true,
        mount_id: None,
        publish_context: Default::default(),
        volume_context: Default::default(),
        state,
    }
}

fn code<T: std::fmt::Debug>(r: Result<T, NodeError>) -> Result<T, Code> {
    r.map_err(|e| csi_driver::CsiError::from(e).code())
}

#[test]
fn read_only_always_wins() {
    let flags = |m: Mode, f: &[&str]| {
        cap(VolumeCapability::mount("")
            .with_access_mode(m)
            .with_mount_flags(f.to_vec()))
    };
    let rw = flags(Mode::SingleNodeWriter, &["rw", "noexec"]);
    assert!(!effective_readonly(false, &rw));
    assert!(effective_readonly(true, &rw));
    assert_eq!(mount_options(&rw, true).unwrap(), ["ro", "rw", "noexec"]);
    assert!(MountOptions::parse(&mount_options(&rw, true).unwrap()).is_read_only());
    assert_eq!(mount_options(&rw, false).unwrap(), ["rw", "noexec"]);
    let reader = flags(Mode::SingleNodeReaderOnly, &["rw,nosuid"]);
    assert!(effective_readonly(false, &reader));
    let multi_reader = flags(Mode::MultiNodeReaderOnly, &["rw"]);
    assert!(effective_readonly(false, &multi_reader));
    let ro_flag = flags(Mode::SingleNodeWriter, &["ro", "rw"]);
    assert!(effective_readonly(false, &ro_flag), "ro is sticky");
}

#[test]
fn flags_that_change_the_operation_are_refused_by_index_only() {
    for bad in ["remount", "bind", "rbind", "rshared", "private"] {
        let c = cap(mount_cap().with_mount_flags(["noatime", &format!("password=hunter2,{bad}")]));
        let err = mount_options(&c, false).unwrap_err();
        assert_eq!(
            err,
            NodeError::invalid(
                "volume_capability.mount.mount_flags[1]",
                "changes the kind of mount and is not allowed"
            ),
            "{bad}"
        );
        assert!(!err.to_string().contains("hunter2"));
    }
}

fn stage_req(path: &str, c: &VolumeCapability) -> NodeStageVolumeRequest {
    NodeStageVolumeRequest {
        volume_id: "v".into(),
        staging_target_path: path.into(),
        volume_capability: Some(c.clone()),
        ..Default::default()
    }
}

#[test]
fn stage_table() {
    use StageDecision::*;
    let (m, b) = (
        mount_cap(),
        VolumeCapability::block().with_access_mode(Mode::SingleNodeWriter),
    );
    let other_cap = VolumeCapability::mount("xfs").with_access_mode(Mode::SingleNodeWriter);
    let this = [Owner::ThisVolume];
    let foreign = [Owner::ThisVolume, Owner::Other];
    let dir = PathKind::Directory;
    let rec = staged("/s", &m, StageState::Staged);
    let staging = staged("/s", &m, StageState::Staging);
    let block_rec = staged("/s", &b, StageState::Staged);
    let other_path = staged("/other", &m, StageState::Staged);
    type Case<'a> = (
        &'a str,
        &'a VolumeCapability,
        Option<&'a StageRecord>,
        Option<&'a str>,
        PathFacts,
        bool,
        Result<StageDecision, Code>,
    );
    #[rustfmt::skip]
    let cases: Vec<Case> = vec![
        ("fresh", &m, None, None, at(PathKind::Absent, &[]), false, Ok(Stage { resume: false, mounted: false })),
        ("repeat, verified", &m, Some(&rec), None, at(dir, &this), false, Ok(AlreadyStaged)),
        ("repeat, mount gone", &m, Some(&rec), None, at(dir, &[]), false, Ok(Stage { resume: true, mounted: false })),
        ("repeat, replaced by another mount", &m, Some(&rec), None, at(dir, &[Owner::Other]), false, Err(Code::AlreadyExists)),
        ("repeat, something mounted over it", &m, Some(&rec), None, at(dir, &foreign), false, Err(Code::AlreadyExists)),
        ("interrupted stage", &m, Some(&staging), None, at(dir, &this), false, Ok(Stage { resume: true, mounted: true })),
        ("other capability", &other_cap, Some(&rec), None, at(dir, &this), false, Err(Code::AlreadyExists)),
        ("other path", &m, Some(&other_path), None, at(dir, &[]), false, Err(Code::AlreadyExists)),
        ("path recorded for another volume", &m, None, Some("w"), at(dir, &[Owner::Other]), false, Err(Code::AlreadyExists)),
        ("path merely mounted by someone else", &m, None, None, at(dir, &[Owner::Other]), false, Err(Code::AlreadyExists)),
        ("lost record, verifiably this volume", &m, None, None, at(dir, &this), false, Ok(Stage { resume: false, mounted: true })),
        ("symlink", &m, None, None, at(PathKind::Symlink, &[]), false, Err(Code::FailedPrecondition)),
        ("regular file", &m, None, None, at(PathKind::File { len: 0 }, &[]), false, Err(Code::FailedPrecondition)),
        ("block repeat, device attached", &b, Some(&block_rec), None, at(dir, &[]), true, Ok(AlreadyStaged)),
        ("block repeat, device gone", &b, Some(&block_rec), None, at(dir, &[]), false, Ok(Stage { resume: true, mounted: false })),
        ("block at a path holding a foreign mount", &b, None, None, at(dir, &[Owner::Other]), false, Err(Code::AlreadyExists)),
    ];
    for (name, c, rec, claimed, path, attached, want) in cases {
        let facts = StageFacts {
            staged: rec,
            path_claimed_by: claimed,
            path: &path,
            device_attached: attached,
        };
        let got = code(decide_stage(&stage_req("/s", c), &cap(c.clone()), &facts));
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn unstage_table() {
    use UnstageDecision::*;
    let m = mount_cap();
    let rec = staged("/s", &m, StageState::Staged);
    let elsewhere = staged("/elsewhere", &m, StageState::Staged);
    let dir = PathKind::Directory;
    let this = [Owner::ThisVolume];
    let published = [PathBuf::from("/pods/a")];
    type Case<'a> = (
        &'a str,
        Option<&'a StageRecord>,
        bool,
        Option<&'a str>,
        PathFacts,
        &'a [PathBuf],
        bool,
        Result<UnstageDecision, Code>,
    );
    #[rustfmt::skip]
    let cases: Vec<Case> = vec![
        ("staged", Some(&rec), true, None, at(dir, &this), &[], true, Ok(Unstage { unmount: true })),
        ("still published", Some(&rec), true, None, at(dir, &this), &published, true, Err(Code::FailedPrecondition)),
        ("lost record but still bound at a target", None, true, None, at(dir, &[]), &published, true, Err(Code::FailedPrecondition)),
        ("not staged", None, true, None, at(dir, &[]), &[], false, Ok(NotStaged)),
        ("not staged, device left by a crash", None, true, None, at(dir, &[]), &[], true, Ok(Unstage { unmount: false })),
        ("lost record, verifiably this volume", None, true, None, at(dir, &this), &[], true, Ok(Unstage { unmount: true })),
        ("unknown volume", None, false, None, at(dir, &[]), &[], false, Err(Code::NotFound)),
        ("another volume's staging path", None, true, Some("w"), at(dir, &[Owner::Other]), &[], false, Err(Code::NotFound)),
        ("staged elsewhere", Some(&elsewhere), true, None, at(dir, &[]), &[], true, Err(Code::NotFound)),
        ("foreign mount, no record", None, true, None, at(dir, &[Owner::Other]), &[], false, Err(Code::NotFound)),
        ("foreign mount over ours", Some(&rec), true, None, at(dir, &[Owner::ThisVolume, Owner::Other]), &[], true, Err(Code::FailedPrecondition)),
        ("record, mount already gone", Some(&rec), true, None, at(dir, &[]), &[], false, Ok(Unstage { unmount: false })),
    ];
    for (name, rec, known, claimed, path, in_use, attached, want) in cases {
        let facts = UnstageFacts {
            staged: rec,
            known,
            path_claimed_by: claimed,
            path: &path,
            in_use_at: in_use,
            device_attached: attached,
        };
        assert_eq!(
            code(decide_unstage("v", Path::new("/s"), &facts)),
            want,
            "{name}"
        );
    }
}

fn publish_req(target: &str, c: &VolumeCapability, readonly: bool) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: "v".into(),
        staging_target_path: "/s".into(),
        target_path: target.into(),
        readonly,
        volume_capability: Some(c.clone()),
        ..Default::default()
    }
}

fn published(req: &NodePublishVolumeRequest, state: PublishState) -> PublishRecord {
    let c = cap(req.volume_capability.clone().unwrap());
    PublishRecord {
        volume_id: req.volume_id.clone(),
        target: req.target_path.clone().into(),
        staging_path: req.staging_target_path.clone().into(),
        effective_readonly: effective_readonly(req.readonly, &c),
        capability: c,
        readonly: req.readonly,
        publish_context: Default::default(),
        volume_context: Default::default(),
        state,
    }
}

#[test]
fn publish_table() {
    use PublishDecision::*;
    let m = mount_cap();
    let b = VolumeCapability::block().with_access_mode(Mode::SingleNodeWriter);
    let st = staged("/s", &m, StageState::Staged);
    let block_st = staged("/s", &b, StageState::Staged);
    let unfinished = staged("/s", &m, StageState::Staging);
    let first = publish_req("/t", &m, false);
    let pubs = [published(&first, PublishState::Published)];
    let interrupted = [published(&first, PublishState::Publishing)];
    let dir = PathKind::Directory;
    let this = [Owner::ThisVolume];
    type Case<'a> = (
        &'a str,
        NodePublishVolumeRequest,
        &'a [PublishRecord],
        Option<&'a StageRecord>,
        Option<&'a str>,
        PathFacts,
        Result<PublishDecision, Code>,
    );
    #[rustfmt::skip]
    let cases: Vec<Case> = vec![
        ("fresh", first.clone(), &[], Some(&st), None, at(PathKind::Absent, &[]), Ok(Publish { resume: false, mounted: false })),
        ("repeat, verified", first.clone(), &pubs, Some(&st), None, at(dir, &this), Ok(AlreadyPublished)),
        ("repeat, mount gone", first.clone(), &pubs, Some(&st), None, at(dir, &[]), Ok(Publish { resume: true, mounted: false })),
        ("interrupted publish", first.clone(), &interrupted, Some(&st), None, at(dir, &this), Ok(Publish { resume: true, mounted: true })),
        ("repeat with other readonly", publish_req("/t", &m, true), &pubs, Some(&st), None, at(dir, &this), Err(Code::AlreadyExists)),
        ("second target, single writer", publish_req("/t2", &m, false), &pubs, Some(&st), None, at(PathKind::Absent, &[]), Err(Code::FailedPrecondition)),
        ("target recorded for another volume", first.clone(), &[], Some(&st), Some("w"), at(dir, &[Owner::Other]), Err(Code::AlreadyExists)),
        ("target merely mounted by someone else", first.clone(), &[], Some(&st), None, at(dir, &[Owner::Other]), Err(Code::AlreadyExists)),
        ("repeat, replaced by a foreign mount", first.clone(), &pubs, Some(&st), None, at(dir, &[Owner::Other]), Err(Code::AlreadyExists)),
        ("symlink target", first.clone(), &[], Some(&st), None, at(PathKind::Symlink, &[]), Err(Code::FailedPrecondition)),
        ("not staged", first.clone(), &[], None, None, at(PathKind::Absent, &[]), Err(Code::FailedPrecondition)),
        ("staging unfinished", first.clone(), &[], Some(&unfinished), None, at(PathKind::Absent, &[]), Err(Code::FailedPrecondition)),
        ("mount target is a regular file", first.clone(), &[], Some(&st), None, at(PathKind::File { len: 0 }, &[]), Err(Code::FailedPrecondition)),
        ("block onto a file with data", publish_req("/t", &b, false), &[], Some(&block_st), None, at(PathKind::File { len: 5 }, &[]), Err(Code::FailedPrecondition)),
        ("block onto an empty file", publish_req("/t", &b, false), &[], Some(&block_st), None, at(PathKind::File { len: 0 }, &[]), Ok(Publish { resume: false, mounted: false })),
        ("block onto a directory", publish_req("/t", &b, false), &[], Some(&block_st), None, at(dir, &[]), Err(Code::FailedPrecondition)),
        ("block published over a mount volume's stage", publish_req("/t", &b, false), &[], Some(&st), None, at(PathKind::Absent, &[]), Err(Code::FailedPrecondition)),
    ];
    for (name, req, pubs, st, claimed, target, want) in cases {
        let c = cap(req.volume_capability.clone().unwrap());
        let facts = PublishFacts {
            known: true,
            publications: pubs,
            staged: st,
            target_claimed_by: claimed,
            target: &target,
            single_node_multi_writer: false,
        };
        assert_eq!(code(decide_publish(&req, &c, &facts)), want, "{name}");
    }
    let target = at(PathKind::Absent, &[]);
    let unknown = PublishFacts {
        known: false,
        publications: &[],
        staged: None,
        target_claimed_by: None,
        target: &target,
        single_node_multi_writer: false,
    };
    assert_eq!(
        code(decide_publish(&first, &cap(m), &unknown)),
        Err(Code::NotFound)
    );
}

#[test]
fn unpublish_table() {
    use UnpublishDecision::*;
    let rec = published(
        &publish_req("/t", &mount_cap(), false),
        PublishState::Published,
    );
    let dir = PathKind::Directory;
    let this = [Owner::ThisVolume];
    type Case<'a> = (
        &'a str,
        bool,
        Option<&'a PublishRecord>,
        Option<&'a str>,
        PathFacts,
        Result<UnpublishDecision, Code>,
    );
    #[rustfmt::skip]
    let cases: Vec<Case> = vec![
        ("published", true, Some(&rec), None, at(dir, &this), Ok(Unpublish { unmount: true, remove: true })),
        ("record, mount gone", true, Some(&rec), None, at(dir, &[]), Ok(Unpublish { unmount: false, remove: true })),
        ("repeat", true, None, None, at(PathKind::Absent, &[]), Ok(NotPublished)),
        ("no record, empty dir left alone", true, None, None, at(dir, &[]), Ok(NotPublished)),
        ("unknown volume at a recorded target", false, None, Some("w"), at(dir, &[Owner::Other]), Err(Code::NotFound)),
        ("known volume at another volume's target", true, None, Some("w"), at(dir, &[Owner::Other]), Err(Code::NotFound)),
        ("unknown volume", false, None, None, at(dir, &[]), Err(Code::NotFound)),
        ("foreign tmpfs, no record", true, None, None, at(dir, &[Owner::Other]), Err(Code::NotFound)),
        ("foreign mount over ours", true, Some(&rec), None, at(dir, &[Owner::ThisVolume, Owner::Other]), Err(Code::FailedPrecondition)),
        ("lost record, verifiably this volume", true, None, None, at(dir, &this), Ok(Unpublish { unmount: true, remove: true })),
        ("recorded target became a symlink", true, Some(&rec), None, at(PathKind::Symlink, &[]), Ok(Unpublish { unmount: false, remove: false })),
        ("unrecorded symlink", true, None, None, at(PathKind::Symlink, &[]), Ok(NotPublished)),
    ];
    for (name, known, rec, claimed, target, want) in cases {
        let facts = UnpublishFacts {
            known,
            record: rec,
            target_claimed_by: claimed,
            target: &target,
        };
        assert_eq!(
            code(decide_unpublish("v", Path::new("/t"), &facts)),
            want,
            "{name}"
        );
    }
}
