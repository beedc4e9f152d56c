//! The NodeStageVolume repeat rule (RULES.md §5): staging a volume that is
//! already staged is OK at the same path with an identical capability, and
//! ALREADY_EXISTS otherwise.

use csi_proto::v1::{NodeStageVolumeRequest, VolumeCapability};

use crate::error::CsiError;

/// Where and how a volume is already staged on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Staging {
    /// The staging path of the earlier NodeStage.
    pub staging_target_path: String,
    /// Its capability.
    pub volume_capability: Option<VolumeCapability>,
}

/// What the driver should do with a NodeStage call. csi-node's rules
/// answer with the same type, knowing more (a record and the mount table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StageDecision {
    /// Staged identically already: return OK without doing anything.
    AlreadyStaged,
    /// Stage it. [`check_stage`] knows only the repeat rule and always
    /// answers `resume: false, mounted: false`.
    Stage {
        /// A record of this stage exists (an interrupted or lost stage).
        resume: bool,
        /// The staging path already shows this volume.
        mounted: bool,
    },
}

impl StageDecision {
    /// A stage with nothing done yet.
    pub const NEW: StageDecision = StageDecision::Stage {
        resume: false,
        mounted: false,
    };
}

/// Applies the repeat rule to `req` given the volume's current staging.
pub fn check_stage(
    existing: Option<&Staging>,
    req: &NodeStageVolumeRequest,
) -> Result<StageDecision, CsiError> {
    match existing {
        None => Ok(StageDecision::NEW),
        Some(s)
            if s.staging_target_path == req.staging_target_path
                && s.volume_capability == req.volume_capability =>
        {
            Ok(StageDecision::AlreadyStaged)
        }
        Some(s) => Err(CsiError::AlreadyExists(format!(
            "volume {} is already staged at {} with another capability or path",
            req.volume_id, s.staging_target_path
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_proto::v1::volume_capability::access_mode::Mode;
    use tonic::Code;

    #[test]
    fn same_path_and_capability_is_ok_anything_else_already_exists() {
        let cap = VolumeCapability::mount("ext4").with_access_mode(Mode::SingleNodeWriter);
        let req = NodeStageVolumeRequest {
            volume_id: "v".into(),
            staging_target_path: "/s".into(),
            volume_capability: Some(cap.clone()),
            ..Default::default()
        };
        assert_eq!(check_stage(None, &req).unwrap(), StageDecision::NEW);
        let same = Staging {
            staging_target_path: "/s".into(),
            volume_capability: Some(cap.clone()),
        };
        assert_eq!(
            check_stage(Some(&same), &req).unwrap(),
            StageDecision::AlreadyStaged
        );
        let other_path = Staging {
            staging_target_path: "/t".into(),
            ..same.clone()
        };
        let other_cap = Staging {
            volume_capability: Some(VolumeCapability::block()),
            ..same
        };
        for s in [other_path, other_cap] {
            assert_eq!(
                check_stage(Some(&s), &req).unwrap_err().code(),
                Code::AlreadyExists
            );
        }
    }
}
