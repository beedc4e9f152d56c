//! What a volume is: its access type and where its contents came from.

use csi_driver::{CsiError, CsiResult};
use csi_proto::v1::{VolumeCapability, VolumeContentSource, volume_content_source};
use serde::{Deserialize, Serialize};

/// How a volume is consumed: the access type it was created for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Access {
    /// Through a filesystem.
    Mount,
    /// As a raw block device.
    Block,
}

impl Access {
    /// The one access type of a set of capabilities (mixing is INVALID_ARGUMENT).
    pub fn of(caps: &[VolumeCapability]) -> CsiResult<Access> {
        let block = caps.iter().any(VolumeCapability::is_block);
        let mount = caps.iter().any(|c| !c.is_block());
        match (block, mount) {
            (true, true) => Err(CsiError::invalid(
                "volume_capabilities",
                "cannot mix block and mount access for one volume",
            )),
            (true, false) => Ok(Access::Block),
            _ => Ok(Access::Mount),
        }
    }

    /// Whether `cap` asks for this access type.
    pub fn fits(self, cap: &VolumeCapability) -> bool {
        cap.is_block() == (self == Access::Block)
    }
}

/// Where a volume's initial contents came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ContentSource {
    /// Restored from a snapshot.
    Snapshot(String),
    /// Cloned from a volume.
    Volume(String),
}

impl ContentSource {
    /// The source a CreateVolume request names, if any.
    pub fn of(content: Option<&VolumeContentSource>) -> Option<ContentSource> {
        match content?.r#type.as_ref()? {
            volume_content_source::Type::Snapshot(s) => {
                Some(ContentSource::Snapshot(s.snapshot_id.clone()))
            }
            volume_content_source::Type::Volume(v) => {
                Some(ContentSource::Volume(v.volume_id.clone()))
            }
        }
    }

    /// The wire form.
    pub fn message(&self) -> VolumeContentSource {
        use volume_content_source::{SnapshotSource, Type, VolumeSource};
        VolumeContentSource {
            r#type: Some(match self {
                ContentSource::Snapshot(id) => Type::Snapshot(SnapshotSource {
                    snapshot_id: id.clone(),
                }),
                ContentSource::Volume(id) => Type::Volume(VolumeSource {
                    volume_id: id.clone(),
                }),
            }),
        }
    }
}
