//! The fake driver's in-memory state.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;

use csi_proto::v1::*;
use csi_server::helpers::publish::Publication;
use csi_server::helpers::stage::Staging;
use csi_server::{CsiError, CsiResult};

use super::Fault;

#[derive(Debug, Clone)]
pub(super) struct Vol {
    /// The CreateVolume that made it (secrets dropped), for idempotency.
    pub(super) request: CreateVolumeRequest,
    pub(super) volume: Volume,
}

#[derive(Debug, Clone)]
pub(super) struct Snap {
    pub(super) name: String,
    pub(super) parameters: HashMap<String, String>,
    pub(super) snapshot: Snapshot,
}

#[derive(Debug, Clone)]
pub(super) struct Grp {
    pub(super) name: String,
    pub(super) sources: Vec<String>,
    pub(super) params: HashMap<String, String>,
    pub(super) group: VolumeGroupSnapshot,
}

#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) seq: u64,
    pub(super) volumes: BTreeMap<String, Vol>,
    pub(super) snapshots: BTreeMap<String, Snap>,
    pub(super) groups: BTreeMap<String, Grp>,
    /// (volume, node) → (capability, readonly).
    pub(super) controller_pubs: HashMap<(String, String), (Option<VolumeCapability>, bool)>,
    /// volume → where and how it is staged.
    pub(super) staged: HashMap<String, Staging>,
    /// volume → its publications.
    pub(super) node_pubs: HashMap<String, Vec<Publication>>,
    /// What [`Fault::ListsDeleted`] goes on listing.
    pub(super) deleted_volumes: Vec<Volume>,
    pub(super) deleted_snapshots: Vec<Snapshot>,
}

impl State {
    pub(super) fn next_id(&mut self, kind: &str) -> String {
        self.seq += 1;
        format!("fake-{kind}-{:08}", self.seq)
    }

    pub(super) fn used(&self) -> i64 {
        self.volumes.values().map(|v| v.volume.capacity_bytes).sum()
    }

    pub(super) fn in_use(&self, volume_id: &str) -> bool {
        self.controller_pubs.keys().any(|(v, _)| v == volume_id)
            || self.staged.contains_key(volume_id)
            || self.node_pubs.get(volume_id).is_some_and(|p| !p.is_empty())
    }

    /// NOT_FOUND unless `volume_id` is published or staged at `path`.
    pub(super) fn available_at(&self, volume_id: &str, path: &str) -> CsiResult<()> {
        let published = self
            .node_pubs
            .get(volume_id)
            .is_some_and(|p| p.iter().any(|p| p.target_path == path));
        let staged = self
            .staged
            .get(volume_id)
            .is_some_and(|s| s.staging_target_path == path);
        if published || staged {
            Ok(())
        } else {
            Err(CsiError::NotFound(format!(
                "volume {volume_id} is not available at {path}"
            )))
        }
    }

    pub(super) fn published_nodes(&self, volume_id: &str) -> Vec<String> {
        self.controller_pubs
            .keys()
            .filter(|(v, _)| v == volume_id)
            .map(|(_, n)| n.clone())
            .collect()
    }
}

#[derive(Debug)]
pub(super) struct Options {
    pub(super) name: String,
    pub(super) node_id: String,
    pub(super) faults: HashSet<Fault>,
    pub(super) log: Option<PathBuf>,
    pub(super) total_capacity: i64,
    pub(super) stage_unstage: bool,
}
