//! The NodePublishVolume repeat-call table (CSI spec, "NodePublishVolume"):
//! whether a publish of a volume already published on this node is a no-op, a new
//! publication, ALREADY_EXISTS or FAILED_PRECONDITION.

use std::collections::HashMap;

use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::{NodePublishVolumeRequest, VolumeCapability};

use crate::error::CsiError;

/// Everything of a NodePublish request except the target path and the
/// secrets ("P" in the spec's table).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PublishArgs {
    /// The staging path.
    pub staging_target_path: String,
    /// The capability.
    pub volume_capability: Option<VolumeCapability>,
    /// Read-only publish.
    pub readonly: bool,
    /// The publish context.
    pub publish_context: HashMap<String, String>,
    /// The volume context.
    pub volume_context: HashMap<String, String>,
}

impl PublishArgs {
    /// The comparable arguments of `req`.
    pub fn of(req: &NodePublishVolumeRequest) -> Self {
        Self {
            staging_target_path: req.staging_target_path.clone(),
            volume_capability: req.volume_capability.clone(),
            readonly: req.readonly,
            publish_context: req.publish_context.clone(),
            volume_context: req.volume_context.clone(),
        }
    }
}

/// An existing publication of the volume on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publication {
    /// Where it is published ("T").
    pub target_path: String,
    /// With which arguments ("P").
    pub args: PublishArgs,
}

/// What the driver should do with a NodePublish call. csi-node's rules
/// answer with the same type, knowing more (a record and the mount table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishDecision {
    /// Identical publication exists: return OK without doing anything.
    AlreadyPublished,
    /// Publish at the target. [`check_publish`] knows only the repeat table
    /// and always answers `resume: false, mounted: false`.
    Publish {
        /// A record of this publication exists (an interrupted or lost one).
        resume: bool,
        /// The target already shows this volume.
        mounted: bool,
    },
}

impl PublishDecision {
    /// A publication with nothing done yet.
    pub const NEW: PublishDecision = PublishDecision::Publish {
        resume: false,
        mounted: false,
    };
}

/// Applies the repeat table. `snmw_declared`: whether the node declares
/// SINGLE_NODE_MULTI_WRITER.
pub fn check_publish(
    existing: &[Publication],
    req: &NodePublishVolumeRequest,
    snmw_declared: bool,
) -> Result<PublishDecision, CsiError> {
    let args = PublishArgs::of(req);
    if let Some(same_target) = existing.iter().find(|p| p.target_path == req.target_path) {
        return if same_target.args == args {
            Ok(PublishDecision::AlreadyPublished)
        } else {
            Err(CsiError::AlreadyExists(format!(
                "volume {} is already published at {} with different arguments",
                req.volume_id, req.target_path
            )))
        };
    }
    if existing.is_empty() {
        return Ok(PublishDecision::NEW);
    }
    let mode = req
        .volume_capability
        .as_ref()
        .map_or(Mode::Unknown, VolumeCapability::access_mode);
    let many_targets =
        mode.is_multi_node() || (mode == Mode::SingleNodeMultiWriter && snmw_declared);
    if many_targets {
        Ok(PublishDecision::NEW)
    } else {
        Err(CsiError::FailedPrecondition(format!(
            "volume {} is already published at another target and access mode {} allows only one",
            req.volume_id,
            mode.as_str_name()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    fn req(mode: Mode, target: &str, readonly: bool) -> NodePublishVolumeRequest {
        NodePublishVolumeRequest {
            volume_id: "v".into(),
            target_path: target.into(),
            readonly,
            volume_capability: Some(VolumeCapability::mount("ext4").with_access_mode(mode)),
            secrets: [(
                "k".to_string(),
                if readonly { "a" } else { "b" }.to_string(),
            )]
            .into(),
            ..Default::default()
        }
    }

    /// The spec's table, for every mode and with and without the SNMW
    /// capability: (same T, same P), (same T, other P), (other T, same P),
    /// (other T, other P).
    #[test]
    fn exhaustive_repeat_table() {
        use PublishDecision::*;
        for snmw in [false, true] {
            for mode in Mode::KNOWN {
                let many = mode.is_multi_node() || (mode == Mode::SingleNodeMultiWriter && snmw);
                let other_target = if many {
                    Ok(PublishDecision::NEW)
                } else {
                    Err(Code::FailedPrecondition)
                };
                let expected = [
                    Ok(AlreadyPublished),
                    Err(Code::AlreadyExists),
                    other_target,
                    other_target,
                ];
                let first = req(mode, "/t1", false);
                let existing = [Publication {
                    target_path: "/t1".into(),
                    args: PublishArgs::of(&first),
                }];
                let calls = [
                    req(mode, "/t1", false),
                    req(mode, "/t1", true),
                    req(mode, "/t2", false),
                    req(mode, "/t2", true),
                ];
                for (call, want) in calls.iter().zip(expected) {
                    let got = check_publish(&existing, call, snmw).map_err(|e| e.code());
                    assert_eq!(got, want, "mode {mode:?} snmw {snmw} call {call:?}");
                }
                assert_eq!(check_publish(&[], &first, snmw), Ok(PublishDecision::NEW));
            }
        }
    }

    #[test]
    fn secrets_are_not_part_of_the_comparison() {
        let a = req(Mode::SingleNodeWriter, "/t", false);
        let mut b = a.clone();
        b.secrets.insert("other".into(), "x".into());
        assert_eq!(PublishArgs::of(&a), PublishArgs::of(&b));
    }
}
