//! Local data's startup sweep and inline ephemeral volumes (which exist
//! only in the records).

use std::collections::BTreeMap;

use csi_driver::{CsiError, CsiResult};

use crate::access::Access;
use crate::backend::ControllerBackend;
use crate::ids::IdKind;
use crate::records::VolumeRecord;
use crate::service::ControllerService;

impl<B: ControllerBackend> ControllerService<B> {
    /// Startup reconciliation of local data, before serving: finishes
    /// group snapshots a crash left half saved or half removed, and
    /// removes data no record owns (unacknowledged creates, half-done
    /// deletes), logging each; the data of records set aside as unreadable
    /// is kept. Nothing to do when the provider is the source of truth.
    pub async fn reconcile(&self) -> CsiResult<()> {
        let Some(t) = self.tables() else {
            return Ok(());
        };
        let snapshots = self.backend().snapshots();
        for snap in t.settle_groups()? {
            if let Some(s) = snapshots {
                s.delete_snapshot(&snap.id).await?;
            }
        }
        let data = self.backend().data();
        for (id, path) in data.volumes {
            if !t.volumes.contains(&id) && !t.quarantined_volumes.contains(&id) {
                tracing::warn!(path = %path.display(), "volume data with no record (left by a crash); removing it");
                self.backend().delete_volume(&id).await?;
            }
        }
        for (id, path) in data.snapshots {
            if id.is_empty() || !t.snapshots.contains(&id) && !t.quarantined_snapshots.contains(&id)
            {
                tracing::warn!(path = %path.display(), "snapshot data with no record (left by a crash); removing it");
                match (id.is_empty(), snapshots) {
                    (false, Some(s)) => s.delete_snapshot(&id).await.map(drop)?,
                    _ => crate::files::remove_path(&path).map(drop)?,
                }
            }
        }
        for path in data.foreign {
            tracing::warn!(path = %path.display(), "not this driver's data; not touched");
        }
        Ok(())
    }

    /// The inline ephemeral volume named `name`, if it exists.
    pub fn ephemeral_named(&self, name: &str) -> Option<VolumeRecord> {
        self.tables()?.volumes.read(|all| {
            all.values()
                .find(|v| v.ephemeral && v.name == name)
                .cloned()
        })
    }

    /// The inline ephemeral volume `name` (a default-sized mount volume),
    /// made now if it does not exist; and whether it was made now. Called
    /// from the node side's blocking work: the backend's future is run to
    /// its end on this thread.
    pub fn create_ephemeral(&self, name: &str) -> CsiResult<(VolumeRecord, bool)> {
        if let Some(v) = self.ephemeral_named(name) {
            return Ok((v, false));
        }
        let mut record = VolumeRecord {
            id: IdKind::Volume.generate(),
            name: name.to_owned(),
            capacity_bytes: self.config().default_size,
            access: Access::Mount,
            source: None,
            parameters: BTreeMap::new(),
            mutable_parameters: BTreeMap::new(),
            topology: BTreeMap::new(),
            request: Vec::new(),
            ephemeral: true,
        };
        // Outside any capacity limit: the pod is already scheduled.
        let reservation = self.ledger().reserve(record.capacity_bytes, 0);
        futures::executor::block_on(self.make_volume(&mut record, reservation))?;
        Ok((record, true))
    }

    /// Removes an inline ephemeral volume: its record, then its data.
    pub fn remove_ephemeral(&self, volume: &VolumeRecord) -> CsiResult<()> {
        let t = self.local()?;
        if t.volumes.remove(&volume.id)?.is_some() {
            self.ledger().release(volume.capacity_bytes);
        }
        futures::executor::block_on(self.backend().delete_volume(&volume.id))
            .map_err(CsiError::from)?;
        // Best effort: on a full disk a repeated unpublish gets NOT_FOUND.
        if let Err(e) = t.retire_ephemeral(&volume.name) {
            tracing::warn!(volume = %volume.id, error = %e, "could not remember a removed ephemeral volume");
        }
        Ok(())
    }

    /// Whether an inline ephemeral volume `name` existed and was removed.
    pub fn was_retired(&self, name: &str) -> bool {
        self.tables()
            .is_some_and(|t| t.retired_ephemeral.contains_key(name))
    }
}
