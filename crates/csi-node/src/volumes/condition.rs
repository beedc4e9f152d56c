//! What NodeGetVolumeStats and NodeExpandVolume learn of a volume at a path.

use csi_proto::v1::VolumeCondition;

use super::{NodeVolumes, View, not_there, restoring, volume_path};
use crate::error::NodeError;
use crate::observe::shows_device;
use crate::record::NodeVolumeRecord;

impl NodeVolumes {
    /// The volume's record when `path` is its staging path or one of its
    /// targets, for NodeGetVolumeStats and NodeExpandVolume (the staged
    /// device and the staging path); NOT_FOUND otherwise.
    pub fn record_at(&self, volume_id: &str, path: &str) -> Result<NodeVolumeRecord, NodeError> {
        let path = volume_path(volume_id, path)?;
        self.not_restoring(volume_id)?;
        self.record(volume_id)
            .filter(|r| r.names(&path))
            .ok_or_else(|| not_there(volume_id, &path))
    }

    /// ABORTED while `volume_id` has yet to be put back after a restart.
    pub(super) fn not_restoring(&self, volume_id: &str) -> Result<(), NodeError> {
        match self.table().restoring_volumes.contains(volume_id) {
            true => Err(restoring(volume_id)),
            false => Ok(()),
        }
    }

    /// For NodeGetVolumeStats: the condition of `volume_id` at `path` (its
    /// staging path, a target, or for a raw block volume any block device
    /// node of its device, such as the pod's `volumeDevices` path), checked
    /// now. NOT_FOUND when the volume is not there; a volume whose record is
    /// unreadable or that could not be restored is abnormal at any path.
    pub fn volume_condition(
        &self,
        volume_id: &str,
        path: &str,
    ) -> Result<VolumeCondition, NodeError> {
        let path = volume_path(volume_id, path)?;
        let (record, abnormal) = {
            let t = self.table();
            if t.restoring_volumes.contains(volume_id) {
                return Err(restoring(volume_id));
            }
            let why = t
                .abnormal
                .get(volume_id)
                .or_else(|| t.abnormal_paths.get(&path));
            (t.records.get(volume_id).cloned(), why.cloned())
        };
        let named = record.as_ref().is_some_and(|r| r.names(&path));
        let abnormal_here = |message: String| VolumeCondition {
            abnormal: true,
            message,
        };
        if let (Some(why), true) = (&abnormal, named || record.is_none()) {
            return Ok(abnormal_here(why.clone()));
        }
        let table = self.table_for_call()?;
        let view = View::of_call(self.inner.mounter.as_ref(), table.as_ref());
        let ids = self.identities(volume_id, record.as_ref(), &view)?;
        if !named {
            // A raw block volume is also wherever its device node is: the
            // kubelet asks at the pod's volumeDevices path.
            let stage = record.as_ref().and_then(|r| r.stage.as_ref());
            return match ids
                .devices
                .iter()
                .chain(&ids.attached)
                .find(|d| shows_device(&path, d))
            {
                Some(d) if stage.is_some_and(|s| s.capability.is_block()) => Ok(VolumeCondition {
                    abnormal: false,
                    message: format!("its device {} is present", d.path.display()),
                }),
                _ => Err(not_there(volume_id, &path)),
            };
        }
        let (here, _) = view.facts(&path, &ids)?;
        let stage = record.as_ref().and_then(|r| r.stage.as_ref());
        let block_stage = stage.is_some_and(|s| s.path == path && s.capability.is_block());
        Ok(if here.has_foreign_mount() {
            abnormal_here(format!("something else is mounted at {}", path.display()))
        } else if block_stage {
            match ids.device() {
                Some(d) => VolumeCondition {
                    abnormal: false,
                    message: format!("attached as {}", d.path.display()),
                },
                None => abnormal_here("its device is no longer attached".into()),
            }
        } else if here.is_ours() {
            VolumeCondition {
                abnormal: false,
                message: "mounted".into(),
            }
        } else {
            abnormal_here(format!("{} is not mounted", path.display()))
        })
    }
}
