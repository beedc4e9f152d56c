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
mod tests;
