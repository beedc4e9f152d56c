//! The records in memory, loaded from the store at start.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::error::NodeError;
use crate::record::{NodeVolumeRecord, PublishRecord, StageRecord};
use csi_store::{Scan, Table as StoreTable};

#[derive(Default)]
pub(super) struct Table {
    pub(super) records: BTreeMap<String, NodeVolumeRecord>,
    /// Volumes reported abnormal, with why.
    pub(super) abnormal: BTreeMap<String, String>,
    /// Targets whose publication record is unreadable, with why.
    pub(super) abnormal_paths: BTreeMap<PathBuf, String>,
    pub(super) busy_volumes: BTreeSet<String>,
    pub(super) busy_paths: BTreeSet<PathBuf>,
}

impl Table {
    /// Adds the stored stages and publications to the records; what was
    /// set aside (now or in an earlier run) and not recorded anew since is
    /// reported abnormal.
    pub(super) fn load(
        &mut self,
        staged: &StoreTable<StageRecord>,
        published: &StoreTable<PublishRecord>,
    ) -> Result<(), NodeError> {
        let unreadable = |why: &str| format!("its node record is unreadable ({why}); set aside");
        let Scan {
            records,
            quarantined,
        } = staged.scan()?;
        for (vol, s) in records {
            if s.volume_id == vol {
                self.entry(&vol).stage = Some(s);
            } else {
                self.abnormal.insert(vol, unreadable("another volume's"));
            }
        }
        for q in quarantined {
            if let Some(vol) = q.key {
                tracing::warn!(volume = %vol, reason = %q.reason, "unreadable stage record set aside");
                self.abnormal.insert(vol, unreadable(&q.reason));
            }
        }
        for vol in staged.quarantined_keys()? {
            if !self.records.contains_key(&vol) {
                self.abnormal
                    .entry(vol)
                    .or_insert_with(|| unreadable("set aside earlier"));
            }
        }
        let Scan {
            records,
            quarantined,
        } = published.scan()?;
        for (target, p) in records {
            if p.target == Path::new(&target) {
                self.entry(&p.volume_id.clone()).publications.push(p);
            } else {
                self.abnormal_paths
                    .insert(target.into(), unreadable("another target's"));
            }
        }
        for q in quarantined {
            if let Some(target) = q.key {
                tracing::warn!(%target, reason = %q.reason, "unreadable publication record set aside");
                self.abnormal_paths
                    .insert(target.into(), unreadable(&q.reason));
            }
        }
        for target in published.quarantined_keys()? {
            let target = PathBuf::from(target);
            if !self
                .records
                .values()
                .any(|r| r.publication(&target).is_some())
            {
                self.abnormal_paths
                    .entry(target)
                    .or_insert_with(|| unreadable("set aside earlier"));
            }
        }
        Ok(())
    }

    pub(super) fn entry(&mut self, volume: &str) -> &mut NodeVolumeRecord {
        self.records
            .entry(volume.to_owned())
            .or_insert_with(|| NodeVolumeRecord::new(volume))
    }
}
