//! The spec's repeat rules and this crate's ownership rules, as pure
//! functions of plain data: the records, and what is at the path
//! ([`PathFacts`]). They run before any syscall; [`NodeVolumes`] gathers the
//! facts, asks, and only then acts.
//!
//! Ownership: a path is touched only when a record of this volume names it
//! or when what is mounted there is verifiably this volume (its device and
//! root in mountinfo). Everything else is refused without side effects.
//!
//! [`NodeVolumes`]: crate::NodeVolumes

use std::path::{Path, PathBuf};

pub use csi_driver::helpers::publish::PublishDecision;
use csi_driver::helpers::publish::{Publication, check_publish};
pub use csi_driver::helpers::stage::StageDecision;
use csi_driver::helpers::stage::{Staging, check_stage};
use csi_proto::v1::{NodePublishVolumeRequest, NodeStageVolumeRequest};
use mount_utils::MountOptions;

use crate::error::NodeError;
use crate::observe::{PathFacts, PathKind};
use crate::record::{Capability, PublishRecord, PublishState, StageRecord, StageState};

/// Whether a mount of `cap` must be read-only: asked for, a reader-only
/// access mode, or an `ro` among its flags. Read-only always wins over `rw`.
pub fn effective_readonly(requested: bool, cap: &Capability) -> bool {
    requested || cap.mode().is_read_only() || MountOptions::parse(cap.flags()).is_read_only()
}

/// The options for mounting `cap`: `ro` first when `readonly` (mount-utils
/// keeps `ro` sticky, so no later `rw` undoes it), then its flags. A flag
/// that would turn the mount into another operation (a remount of whatever
/// is there, a bind, a propagation change) is INVALID_ARGUMENT naming its
/// index, never its value.
pub fn mount_options(cap: &Capability, readonly: bool) -> Result<Vec<String>, NodeError> {
    for (i, flag) in cap.flags().iter().enumerate() {
        let o = MountOptions::parse(&[flag]);
        if o.is_remount() || o.is_bind() || !o.propagation.is_empty() {
            return Err(NodeError::invalid(
                format!("volume_capability.mount.mount_flags[{i}]"),
                "changes the kind of mount and is not allowed",
            ));
        }
    }
    let ro = readonly.then(|| "ro".to_owned());
    Ok(ro.into_iter().chain(cap.flags().iter().cloned()).collect())
}

/// ALREADY_EXISTS: `path` holds a mount that is not `volume`.
fn occupied(volume: &str, path: &Path) -> NodeError {
    NodeError::already_exists(format!(
        "something other than volume {volume} is mounted at {}",
        path.display()
    ))
}

/// FAILED_PRECONDITION: a mount that is not `volume` lies over its own.
pub(crate) fn covered(volume: &str, path: &Path) -> NodeError {
    NodeError::failed_precondition(format!(
        "something other than volume {volume} is mounted over {}; not touching it",
        path.display()
    ))
}

/// What NodeStage's decision depends on.
#[derive(Debug, Clone)]
pub struct StageFacts<'a> {
    /// This volume's stage record.
    pub staged: Option<&'a StageRecord>,
    /// Another volume whose record names the staging path.
    pub path_claimed_by: Option<&'a str>,
    /// The staging path.
    pub path: &'a PathFacts,
    /// This volume's device is attached (block access).
    pub device_attached: bool,
}

/// NodeStage: the spec's repeat rule (same path and capability is OK,
/// anything else ALREADY_EXISTS), made safe: OK only when the path shows
/// exactly this volume; another volume, recorded or merely mounted, is
/// ALREADY_EXISTS; a symlink is never followed.
pub fn decide_stage(
    req: &NodeStageVolumeRequest,
    cap: &Capability,
    facts: &StageFacts<'_>,
) -> Result<StageDecision, NodeError> {
    let path = Path::new(&req.staging_target_path);
    let existing = facts.staged.map(|s| Staging {
        staging_target_path: s.path.to_string_lossy().into_owned(),
        volume_capability: Some(s.capability.to_proto()),
    });
    check_stage(existing.as_ref(), req)?;
    if let Some(other) = facts.path_claimed_by {
        return Err(NodeError::already_exists(format!(
            "{} is in use by volume {other}",
            path.display()
        )));
    }
    check_not_symlink(facts.path, "staging_target_path", path)?;
    if facts.path.has_foreign_mount() {
        return Err(occupied(&req.volume_id, path));
    }
    let mounted = facts.path.is_ours();
    if let Some(s) = facts.staged {
        let complete = if cap.is_block() {
            facts.device_attached
        } else {
            mounted
        };
        if s.state == StageState::Staged && complete {
            return Ok(StageDecision::AlreadyStaged);
        }
    }
    if !cap.is_block()
        && !mounted
        && !matches!(facts.path.kind, PathKind::Absent | PathKind::Directory)
    {
        return Err(NodeError::failed_precondition(format!(
            "staging_target_path {} is not a directory",
            path.display()
        )));
    }
    Ok(StageDecision::Stage {
        resume: facts.staged.is_some(),
        mounted,
    })
}

/// What NodeUnstage should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnstageDecision {
    /// Not staged here and nothing of it attached: OK, nothing to do.
    NotStaged,
    /// Unmount the path (`unmount`), release the volume's devices, forget.
    Unstage {
        /// The path shows this volume.
        unmount: bool,
    },
}

/// What NodeUnstage's decision depends on.
#[derive(Debug, Clone)]
pub struct UnstageFacts<'a> {
    /// This volume's stage record.
    pub staged: Option<&'a StageRecord>,
    /// The driver knows the volume.
    pub known: bool,
    /// Another volume whose record names the staging path.
    pub path_claimed_by: Option<&'a str>,
    /// The staging path.
    pub path: &'a PathFacts,
    /// Where the volume is still in use: its publication records and
    /// mounts showing it elsewhere.
    pub in_use_at: &'a [PathBuf],
    /// A device of the volume is attached.
    pub device_attached: bool,
}

/// NodeUnstage: still published anywhere is FAILED_PRECONDITION (detaching
/// would hand the device to the next volume while a pod writes through it);
/// a path that is not this volume's is NOT_FOUND and left alone; not
/// staged is OK, after releasing a device left attached by a crash.
pub fn decide_unstage(
    volume_id: &str,
    path: &Path,
    facts: &UnstageFacts<'_>,
) -> Result<UnstageDecision, NodeError> {
    if let Some(s) = facts.staged.filter(|s| s.path != path) {
        return Err(NodeError::not_found(format!(
            "volume {volume_id} is staged at {}, not at {}",
            s.path.display(),
            path.display()
        )));
    }
    if let Some(other) = facts.path_claimed_by {
        return Err(NodeError::not_found(format!(
            "{} is the staging path of volume {other}, not of {volume_id}",
            path.display()
        )));
    }
    if facts.staged.is_none() && !facts.known {
        return Err(NodeError::not_found(format!(
            "volume {volume_id} does not exist"
        )));
    }
    if facts.path.has_foreign_mount() {
        return Err(if facts.staged.is_some() {
            covered(volume_id, path)
        } else {
            NodeError::not_found(format!(
                "volume {volume_id} is not staged at {}",
                path.display()
            ))
        });
    }
    if let Some(first) = facts.in_use_at.first() {
        return Err(NodeError::failed_precondition(format!(
            "volume {volume_id} is still published at {} ({} in all); unpublish it first",
            first.display(),
            facts.in_use_at.len()
        )));
    }
    let mounted = facts.path.is_ours();
    if facts.staged.is_none() && !mounted && !facts.device_attached {
        return Ok(UnstageDecision::NotStaged);
    }
    Ok(UnstageDecision::Unstage { unmount: mounted })
}

/// What NodePublish's decision depends on.
#[derive(Debug, Clone)]
pub struct PublishFacts<'a> {
    /// The driver knows the volume.
    pub known: bool,
    /// This volume's publications.
    pub publications: &'a [PublishRecord],
    /// This volume's stage record.
    pub staged: Option<&'a StageRecord>,
    /// Another volume whose record names the target.
    pub target_claimed_by: Option<&'a str>,
    /// The target.
    pub target: &'a PathFacts,
    /// The plugin declares SINGLE_NODE_MULTI_WRITER.
    pub single_node_multi_writer: bool,
}

/// NodePublish: the spec's repeat table (csi-driver's
/// [`check_publish`]), made safe: OK only when the target shows exactly
/// this volume; another volume at the target is ALREADY_EXISTS; a symlink
/// is never followed; a block volume is never mounted over a non-empty
/// file (FAILED_PRECONDITION: the node holds data the call did not create;
/// ALREADY_EXISTS would claim a volume is there).
pub fn decide_publish(
    req: &NodePublishVolumeRequest,
    cap: &Capability,
    facts: &PublishFacts<'_>,
) -> Result<PublishDecision, NodeError> {
    let target = Path::new(&req.target_path);
    if !facts.known && facts.publications.is_empty() && facts.staged.is_none() {
        return Err(NodeError::not_found(format!(
            "volume {} does not exist",
            req.volume_id
        )));
    }
    check_not_symlink(facts.target, "target_path", target)?;
    if let Some(other) = facts.target_claimed_by {
        return Err(NodeError::already_exists(format!(
            "{} is in use by volume {other}",
            target.display()
        )));
    }
    if facts.target.has_foreign_mount() {
        return Err(occupied(&req.volume_id, target));
    }
    let existing: Vec<Publication> = facts
        .publications
        .iter()
        .map(|p| Publication {
            target_path: p.target.to_string_lossy().into_owned(),
            args: p.args(),
        })
        .collect();
    let mounted = facts.target.is_ours();
    let same = facts.publications.iter().find(|p| p.target == target);
    if check_publish(&existing, req, facts.single_node_multi_writer)?
        == PublishDecision::AlreadyPublished
        && same.is_some_and(|p| p.state == PublishState::Published)
        && mounted
    {
        return Ok(PublishDecision::AlreadyPublished);
    }
    if !req.staging_target_path.is_empty() {
        let staging = Path::new(&req.staging_target_path);
        let s = facts.staged.ok_or_else(|| {
            NodeError::failed_precondition(format!("volume {} is not staged", req.volume_id))
        })?;
        if s.path != staging {
            return Err(NodeError::failed_precondition(format!(
                "volume {} is staged at {}, not at {}",
                req.volume_id,
                s.path.display(),
                staging.display()
            )));
        }
        if s.state != StageState::Staged {
            return Err(NodeError::failed_precondition(format!(
                "staging of volume {} has not finished",
                req.volume_id
            )));
        }
        if s.capability.is_block() != cap.is_block() {
            return Err(NodeError::failed_precondition(format!(
                "volume {} is staged for {} access",
                req.volume_id,
                if s.capability.is_block() {
                    "block"
                } else {
                    "mount"
                }
            )));
        }
    }
    if !mounted {
        check_target_kind(facts.target.kind, cap.is_block(), target)?;
    }
    Ok(PublishDecision::Publish {
        resume: same.is_some(),
        mounted,
    })
}

fn check_target_kind(kind: PathKind, block: bool, target: &Path) -> Result<(), NodeError> {
    let refuse = |what: &str| {
        Err(NodeError::failed_precondition(format!(
            "target_path {} {what}; refusing to publish over it",
            target.display()
        )))
    };
    match (kind, block) {
        (PathKind::Absent, _)
        | (PathKind::Directory, false)
        | (PathKind::File { len: 0 }, true) => Ok(()),
        (PathKind::File { .. }, true) => refuse("is a regular file with data"),
        (PathKind::File { .. }, false) => refuse("is a regular file, not a directory"),
        (PathKind::Directory, true) => refuse("is a directory, not a file"),
        _ => refuse("is neither a directory nor a regular file"),
    }
}

fn check_not_symlink(facts: &PathFacts, field: &str, path: &Path) -> Result<(), NodeError> {
    if facts.kind == PathKind::Symlink {
        return Err(NodeError::failed_precondition(format!(
            "{field} {} is a symbolic link; it is never followed",
            path.display()
        )));
    }
    Ok(())
}

/// What NodeUnpublish should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnpublishDecision {
    /// Nothing of this volume is there: OK, nothing touched.
    NotPublished,
    /// Unmount this volume there (`unmount`), remove the file or directory
    /// if it is empty (`remove`), forget.
    Unpublish {
        /// The target shows this volume.
        unmount: bool,
        /// Remove the (empty) target.
        remove: bool,
    },
}

/// What NodeUnpublish's decision depends on.
#[derive(Debug, Clone)]
pub struct UnpublishFacts<'a> {
    /// The driver knows the volume.
    pub known: bool,
    /// This volume's publication at the target.
    pub record: Option<&'a PublishRecord>,
    /// Another volume whose record names the target.
    pub target_claimed_by: Option<&'a str>,
    /// The target.
    pub target: &'a PathFacts,
}

/// NodeUnpublish: a target recorded for another volume, or an unknown
/// volume, is NOT_FOUND. A target no record names is touched only when
/// what is mounted there is verifiably this volume. When something else is
/// mounted there the answer is NOT_FOUND, not OK: OK would tell the CO the
/// target is clean and free to reuse, which it is not, and NOT_FOUND is the
/// spec's code for "this volume is not here"; nothing is touched either way.
pub fn decide_unpublish(
    volume_id: &str,
    target: &Path,
    facts: &UnpublishFacts<'_>,
) -> Result<UnpublishDecision, NodeError> {
    if let Some(other) = facts.target_claimed_by {
        return Err(NodeError::not_found(format!(
            "{} holds volume {other}, not {volume_id}",
            target.display()
        )));
    }
    if facts.record.is_none() && !facts.known {
        return Err(NodeError::not_found(format!(
            "volume {volume_id} does not exist"
        )));
    }
    if facts.target.kind == PathKind::Symlink {
        // Nothing can be mounted on a symlink itself: forget a record, never
        // follow the link.
        return Ok(match facts.record {
            Some(_) => UnpublishDecision::Unpublish {
                unmount: false,
                remove: false,
            },
            None => UnpublishDecision::NotPublished,
        });
    }
    if facts.target.has_foreign_mount() {
        return Err(match facts.record {
            Some(_) => covered(volume_id, target),
            None => NodeError::not_found(format!(
                "volume {volume_id} is not published at {}; what is mounted there is not this volume",
                target.display()
            )),
        });
    }
    let mounted = facts.target.is_ours();
    if facts.record.is_none() && !mounted {
        return Ok(UnpublishDecision::NotPublished);
    }
    Ok(UnpublishDecision::Unpublish {
        unmount: mounted,
        remove: true,
    })
}

#[cfg(test)]
mod tests {
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
            let c =
                cap(mount_cap().with_mount_flags(["noatime", &format!("password=hunter2,{bad}")]));
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
}
