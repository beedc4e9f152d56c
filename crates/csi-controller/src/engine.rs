//! The generic controller: every Controller and GroupController RPC over
//! the [`Tables`], claims and ledger, with the storage work delegated to a
//! [`VolumeBackend`]. Blocking work runs in a blocking task that holds its
//! claims to the end, so a cancelled call finishes once and a retry
//! meanwhile gets ABORTED.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use csi_driver::helpers::capacity::{CapacityPolicy, resolve_capacity};
use csi_driver::helpers::idempotency::{compare_snapshot, compare_volume};
use csi_driver::{
    CallContext, Capabilities, ControllerRpc, CsiError, CsiResult, GroupControllerRpc,
    PluginService, VolumeExpansion, async_trait, blocking,
};
use csi_proto::v1::*;
use csi_store::{FileStore, RecordStore};
use prost::Message;

use crate::records::{GroupSnapshotRecord, SnapshotRecord, Tables, VolumeRecord};
use crate::state::{InFlight, Ledger, Res, Reservation};
use crate::util::{Access, DataOnDisk, IdKind, Source, confirmed, now_nanos, page, sorted, to_map};

/// The storage side of a driver: what the engine asks of it, always from a
/// blocking task, after validating the request and claiming every id
/// involved. Every method that makes data must leave nothing behind when it
/// fails; every delete is idempotent.
pub trait VolumeBackend: Send + Sync + 'static {
    /// Makes the data of a new volume of `volume.capacity_bytes` bytes and
    /// access type `volume.access`: empty, or filled from `volume.source`
    /// (a recorded snapshot or volume of the same access type).
    fn create_volume(&self, volume: &VolumeRecord) -> CsiResult<()>;
    /// Removes whatever data volume `id` has; true if there was some.
    fn delete_volume(&self, id: &str) -> CsiResult<bool>;
    /// Cuts `snapshot` of its source volume.
    fn create_snapshot(&self, snapshot: &SnapshotRecord) -> CsiResult<()>;
    /// Removes whatever data snapshot `id` has; true if there was some.
    fn delete_snapshot(&self, id: &str) -> CsiResult<bool>;
    /// Grows `volume` to `size` bytes.
    fn expand_volume(&self, volume: &VolumeRecord, size: i64) -> CsiResult<()>;
    /// The data that exists, for the startup sweep of data no record owns.
    fn data(&self) -> DataOnDisk;
    /// Free bytes where volumes are made.
    fn free_space(&self) -> i64;

    /// Checks capabilities beyond the access type (e.g. the filesystems
    /// the node can make); INVALID_ARGUMENT naming the field.
    fn check_capabilities(&self, _caps: &[VolumeCapability]) -> CsiResult<()> {
        Ok(())
    }
    /// The mutable parameters after applying `requested` to `current`
    /// (INVALID_ARGUMENT naming a key it cannot take). Default: merged.
    fn mutable_parameters(
        &self,
        current: &BTreeMap<String, String>,
        requested: &HashMap<String, String>,
    ) -> CsiResult<BTreeMap<String, String>> {
        let mut all = current.clone();
        all.extend(sorted(requested));
        Ok(all)
    }
    /// Applies changed mutable parameters (before they are recorded).
    fn modify_volume(
        &self,
        _volume: &VolumeRecord,
        _new: &BTreeMap<String, String>,
    ) -> CsiResult<()> {
        Ok(())
    }
    /// Whether the node must act after a volume of `access` grew.
    fn node_expansion_required(&self, access: Access) -> bool {
        access == Access::Block
    }
    /// The health of a volume's data, if the backend reports it.
    fn volume_condition(&self, _volume: &VolumeRecord) -> Option<VolumeCondition> {
        None
    }
    /// ControllerPublish's publish context.
    fn publish_context(&self, _volume: &VolumeRecord) -> HashMap<String, String> {
        HashMap::new()
    }
    /// Why volume `id` must not be deleted now (e.g. the node side still
    /// holds it): the reason, read as `volume <id> <reason>`.
    fn in_use(&self, _id: &str) -> Option<String> {
        None
    }
    /// Cuts every member of a group snapshot at one point in time (each
    /// with its source volume), or fails leaving no member's data behind.
    fn cut_group(&self, _members: &[(SnapshotRecord, VolumeRecord)]) -> CsiResult<()> {
        Err(CsiError::unimplemented("CreateVolumeGroupSnapshot"))
    }
}

/// A shared backend (tests keep a handle on a fake this way).
impl<B: VolumeBackend> VolumeBackend for Arc<B> {
    fn create_volume(&self, volume: &VolumeRecord) -> CsiResult<()> {
        (**self).create_volume(volume)
    }
    fn delete_volume(&self, id: &str) -> CsiResult<bool> {
        (**self).delete_volume(id)
    }
    fn create_snapshot(&self, snapshot: &SnapshotRecord) -> CsiResult<()> {
        (**self).create_snapshot(snapshot)
    }
    fn delete_snapshot(&self, id: &str) -> CsiResult<bool> {
        (**self).delete_snapshot(id)
    }
    fn expand_volume(&self, volume: &VolumeRecord, size: i64) -> CsiResult<()> {
        (**self).expand_volume(volume, size)
    }
    fn data(&self) -> DataOnDisk {
        (**self).data()
    }
    fn free_space(&self) -> i64 {
        (**self).free_space()
    }
    fn check_capabilities(&self, caps: &[VolumeCapability]) -> CsiResult<()> {
        (**self).check_capabilities(caps)
    }
    fn mutable_parameters(
        &self,
        current: &BTreeMap<String, String>,
        requested: &HashMap<String, String>,
    ) -> CsiResult<BTreeMap<String, String>> {
        (**self).mutable_parameters(current, requested)
    }
    fn modify_volume(
        &self,
        volume: &VolumeRecord,
        new: &BTreeMap<String, String>,
    ) -> CsiResult<()> {
        (**self).modify_volume(volume, new)
    }
    fn node_expansion_required(&self, access: Access) -> bool {
        (**self).node_expansion_required(access)
    }
    fn volume_condition(&self, volume: &VolumeRecord) -> Option<VolumeCondition> {
        (**self).volume_condition(volume)
    }
    fn publish_context(&self, volume: &VolumeRecord) -> HashMap<String, String> {
        (**self).publish_context(volume)
    }
    fn in_use(&self, id: &str) -> Option<String> {
        (**self).in_use(id)
    }
    fn cut_group(&self, members: &[(SnapshotRecord, VolumeRecord)]) -> CsiResult<()> {
        (**self).cut_group(members)
    }
}

/// What the engine offers and its limits.
#[derive(Debug, Clone)]
pub struct Config {
    /// The node volumes are published to (ControllerPublish of another
    /// node is NOT_FOUND) and the topology segment's value.
    pub node_id: String,
    /// Total bytes handed out (0: the backend's free space decides).
    pub capacity: i64,
    /// With no `capacity`: refuse a create or expansion larger than the
    /// backend's free space (sparse images must not overcommit).
    pub refuse_beyond_free_space: bool,
    /// Size of a volume whose request gives no capacity range.
    pub default_size: i64,
    /// Smallest volume (0: none).
    pub min_size: i64,
    /// Largest volume (0: none).
    pub max_size: i64,
    /// Rounding unit of mount volumes.
    pub mount_unit: i64,
    /// Rounding unit of block volumes.
    pub block_unit: i64,
    /// The topology key whose value is `node_id` (None: no topology).
    pub topology_key: Option<String>,
    /// ControllerPublish/Unpublish are offered.
    pub attach: bool,
    /// Most volumes attached to one node (0: no limit).
    pub attach_limit: i64,
    /// Group snapshots are offered (the backend implements `cut_group`).
    pub group_snapshots: bool,
    /// DeleteVolume of a volume with snapshots is FAILED_PRECONDITION.
    pub keep_snapshot_sources: bool,
    /// The backend reports volume conditions.
    pub volume_condition: bool,
}

impl Config {
    /// Defaults: 1 GiB volumes of any size, whole MiB for block, no
    /// capacity limit, topology, attach or group snapshots.
    pub fn new(node_id: impl Into<String>) -> Self {
        Self {
            node_id: node_id.into(),
            capacity: 0,
            refuse_beyond_free_space: false,
            default_size: 1 << 30,
            min_size: 0,
            max_size: 0,
            mount_unit: 1,
            block_unit: 1 << 20,
            topology_key: None,
            attach: false,
            attach_limit: 0,
            group_snapshots: false,
            keep_snapshot_sources: false,
            volume_condition: false,
        }
    }
}

impl Config {
    /// `caps` plus what an engine with this configuration serves under its configuration: the
    /// controller service and RPCs, online expansion, group snapshots and
    /// topology when on.
    pub fn capabilities(&self, caps: Capabilities) -> Capabilities {
        use ControllerRpc as C;
        let c = self;
        let mut rpcs = vec![
            C::CreateDeleteVolume,
            C::ListVolumes,
            C::GetCapacity,
            C::CreateDeleteSnapshot,
            C::ListSnapshots,
            C::GetSnapshot,
            C::CloneVolume,
            C::ExpandVolume,
            C::GetVolume,
            C::SingleNodeMultiWriter,
            C::ModifyVolume,
        ];
        if c.volume_condition {
            rpcs.push(C::VolumeCondition);
        }
        if c.attach {
            rpcs.extend([
                C::PublishUnpublishVolume,
                C::PublishReadonly,
                C::ListVolumesPublishedNodes,
            ]);
        }
        let mut caps = caps
            .plugin(PluginService::ControllerService)
            .volume_expansion(VolumeExpansion::Online)
            .controller(rpcs);
        if c.group_snapshots {
            caps = caps
                .plugin(PluginService::GroupControllerService)
                .group_controller([GroupControllerRpc::CreateDeleteGetVolumeGroupSnapshot]);
        }
        if c.topology_key.is_some() {
            caps = caps.plugin(PluginService::VolumeAccessibilityConstraints);
        }
        caps
    }
}

struct Inner<B> {
    config: Config,
    backend: B,
    tables: Tables,
    in_flight: Arc<InFlight>,
    ledger: Arc<Ledger>,
}

/// The generic Controller and GroupController: cheap to clone, serve it
/// with `Server::builder(..).controller(Arc::new(engine))`.
pub struct Engine<B> {
    inner: Arc<Inner<B>>,
}

impl<B> Clone for Engine<B> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

/// An [`Engine`] that does not keep it alive: for what the engine's own
/// backend holds (a node side whose volume locator reads the records), so
/// no reference cycle keeps the state directory locked.
pub struct WeakEngine<B> {
    inner: std::sync::Weak<Inner<B>>,
}

impl<B> WeakEngine<B> {
    /// The engine, while it lives.
    pub fn upgrade(&self) -> Option<Engine<B>> {
        self.inner.upgrade().map(|inner| Engine { inner })
    }
}

impl<B> Engine<B> {
    /// A handle that does not keep the engine alive.
    pub fn downgrade(&self) -> WeakEngine<B> {
        WeakEngine {
            inner: Arc::downgrade(&self.inner),
        }
    }
}

fn not_found(what: &str, id: &str) -> CsiError {
    CsiError::NotFound(format!("{what} {id:?} does not exist"))
}

impl<B: VolumeBackend> Engine<B> {
    /// The engine over the locked state directory `files` (see
    /// [`crate::open_state`]), importing an earlier version's `state.json`.
    pub fn open(files: FileStore, config: Config, backend: B) -> Result<Self, String> {
        crate::records::import_state_file(&files)?;
        Self::with_store(Arc::new(files), config, backend)
    }

    /// The engine over any record store (csi-store's `MemStore` in tests).
    pub fn with_store(
        store: Arc<dyn RecordStore>,
        config: Config,
        backend: B,
    ) -> Result<Self, String> {
        let tables = Tables::open(store).map_err(|e| e.to_string())?;
        let used = tables
            .volumes
            .read(|all| all.values().map(|v| v.capacity_bytes).sum());
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                backend,
                tables,
                in_flight: InFlight::new(),
                ledger: Ledger::new(used),
            }),
        })
    }

    /// The storage backend.
    pub fn backend(&self) -> &B {
        &self.inner.backend
    }

    /// The records.
    pub fn tables(&self) -> &Tables {
        &self.inner.tables
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The claims of work in progress.
    pub fn in_flight(&self) -> &Arc<InFlight> {
        &self.inner.in_flight
    }

    /// Bytes promised to volumes.
    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.inner.ledger
    }

    /// `caps` plus the controller capabilities the engine serves (see
    /// [`Config::capabilities`]).
    pub fn capabilities(&self, caps: Capabilities) -> Capabilities {
        self.config().capabilities(caps)
    }

    /// The record of a volume, or NOT_FOUND (ids the engine could not have
    /// generated never reach the backend).
    pub fn known_volume(&self, id: &str) -> CsiResult<VolumeRecord> {
        IdKind::Volume
            .is_valid(id)
            .then(|| self.tables().volumes.get(id))
            .flatten()
            .ok_or_else(|| not_found("volume", id))
    }

    /// The record of a snapshot, or NOT_FOUND.
    pub fn known_snapshot(&self, id: &str) -> CsiResult<SnapshotRecord> {
        IdKind::Snapshot
            .is_valid(id)
            .then(|| self.tables().snapshots.get(id))
            .flatten()
            .ok_or_else(|| not_found("snapshot", id))
    }

    /// Startup reconciliation, before serving: finishes group snapshots a
    /// crash left half saved or half removed, and removes data no record
    /// owns (unacknowledged creates, half-done deletes), logging each; the
    /// data of records set aside as unreadable is kept.
    pub fn reconcile(&self) -> CsiResult<()> {
        let t = self.tables();
        for snap in t.settle_groups()? {
            self.backend().delete_snapshot(&snap.id)?;
        }
        let data = self.backend().data();
        for (id, path) in data.volumes {
            if !t.volumes.contains(&id) && !t.quarantined_volumes.contains(&id) {
                tracing::warn!(path = %path.display(), "volume data with no record (left by a crash); removing it");
                self.backend().delete_volume(&id)?;
            }
        }
        for (id, path) in data.snapshots {
            if id.is_empty() || !t.snapshots.contains(&id) && !t.quarantined_snapshots.contains(&id)
            {
                tracing::warn!(path = %path.display(), "snapshot data with no record (left by a crash); removing it");
                match id.is_empty() {
                    true => crate::util::remove_path(&path).map(drop)?,
                    false => self.backend().delete_snapshot(&id).map(drop)?,
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
        self.tables().volumes.read(|all| {
            all.values()
                .find(|v| v.ephemeral && v.name == name)
                .cloned()
        })
    }

    /// The inline ephemeral volume `name` (a default-sized mount volume),
    /// made now if it does not exist; and whether it was made now.
    pub fn create_ephemeral(&self, name: &str) -> CsiResult<(VolumeRecord, bool)> {
        if let Some(v) = self.ephemeral_named(name) {
            return Ok((v, false));
        }
        let record = VolumeRecord {
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
        self.make_volume(&record, reservation)?;
        Ok((record, true))
    }

    /// Removes an inline ephemeral volume: its record, then its data.
    pub fn remove_ephemeral(&self, volume: &VolumeRecord) -> CsiResult<()> {
        if self.tables().volumes.remove(&volume.id)?.is_some() {
            self.ledger().release(volume.capacity_bytes);
        }
        self.backend().delete_volume(&volume.id)?;
        // Best effort: on a full disk a repeated unpublish gets NOT_FOUND.
        if let Err(e) = self.tables().retire_ephemeral(&volume.name) {
            tracing::warn!(volume = %volume.id, error = %e, "could not remember a removed ephemeral volume");
        }
        Ok(())
    }

    /// Whether an inline ephemeral volume `name` existed and was removed.
    pub fn was_retired(&self, name: &str) -> bool {
        self.tables().retired_ephemeral.contains_key(name)
    }

    /// Free capacity: the configured total minus what is promised, or the
    /// backend's free space. Never negative.
    pub fn available_capacity(&self) -> i64 {
        let c = self.config();
        let free = if c.capacity > 0 {
            c.capacity - self.ledger().used()
        } else {
            self.backend().free_space()
        };
        free.max(0)
    }

    fn segment(&self) -> BTreeMap<String, String> {
        let c = self.config();
        c.topology_key
            .iter()
            .map(|k| (k.clone(), c.node_id.clone()))
            .collect()
    }

    /// Reserves `bytes` (checked and taken in one step), or RESOURCE_EXHAUSTED.
    fn reserve(&self, bytes: i64, what: &str) -> CsiResult<Reservation> {
        let c = self.config();
        let refused =
            c.capacity <= 0 && c.refuse_beyond_free_space && bytes > self.backend().free_space();
        let reservation = (!refused)
            .then(|| self.ledger().reserve(bytes, c.capacity))
            .flatten();
        reservation.ok_or_else(|| {
            CsiError::ResourceExhausted(format!(
                "not enough capacity {what}: {} left",
                csi_proto::size::format_bytes(self.available_capacity())
            ))
        })
    }

    fn volume_size(&self, range: Option<&CapacityRange>, access: Access) -> CsiResult<i64> {
        let c = self.config();
        let policy = CapacityPolicy {
            default_size: c.default_size,
            min_size: c.min_size,
            max_size: c.max_size,
            unit: if access == Access::Block {
                c.block_unit
            } else {
                c.mount_unit
            },
        };
        resolve_capacity(range, &policy)
    }

    /// Makes a new volume's data, then saves its record; if either fails,
    /// removes what was made (a full disk leaves nothing behind).
    fn make_volume(
        &self,
        record: &VolumeRecord,
        reservation: Option<Reservation>,
    ) -> CsiResult<()> {
        self.backend().create_volume(record)?;
        if let Err(e) = self.tables().volumes.put(&record.id, record.clone()) {
            if let Err(undo) = self.backend().delete_volume(&record.id) {
                tracing::error!(volume = %record.id, error = %undo, "removing the data of a volume whose record could not be saved");
            }
            return Err(e.into());
        }
        if let Some(r) = reservation {
            r.keep();
        }
        Ok(())
    }

    /// DeleteVolume's work, under the volume's claim: the record goes first
    /// (refused while the volume is in use), then the data. With no record,
    /// data an unacknowledged create or a half-done delete left is removed.
    fn remove_volume(&self, id: &str) -> CsiResult<()> {
        let t = self.tables();
        let removed = t.volumes.update(id, |slot| {
            if slot.is_none() {
                return Ok(None);
            }
            let busy =
                |why: String| Err(CsiError::FailedPrecondition(format!("volume {id} {why}")));
            if let Some(node) = t.attached_nodes(id).first() {
                return busy(format!("is attached to node {node}"));
            }
            if let Some(why) = self.backend().in_use(id) {
                return busy(why);
            }
            if self.config().keep_snapshot_sources
                && t.snapshots
                    .read(|all| all.values().any(|s| s.source_volume_id == id))
            {
                return busy("has snapshots; delete them first".into());
            }
            Ok(slot.take())
        })?;
        match removed {
            Some(v) => {
                self.ledger().release(v.capacity_bytes);
                self.backend().delete_volume(id)?;
                tracing::info!(volume = %id, "deleted volume");
            }
            None => {
                if self.backend().delete_volume(id)? {
                    tracing::warn!(volume = %id, "removed data of a volume with no record");
                }
            }
        }
        Ok(())
    }

    /// Whether a topology requirement admits this node.
    fn topology_fits(&self, req: Option<&TopologyRequirement>) -> bool {
        let Some(req) = req else { return true };
        if self.config().topology_key.is_none()
            || req.requisite.is_empty() && req.preferred.is_empty()
        {
            return true;
        }
        let ours = self.segment();
        let fits = |t: &Topology| t.segments.iter().all(|(k, v)| ours.get(k) == Some(v));
        if req.requisite.is_empty() {
            req.preferred.iter().any(fits)
        } else {
            req.requisite.iter().any(fits)
        }
    }

    /// The smallest size a volume made from `source` may have, once the
    /// source is claimed and known to have the same access type.
    fn source_size(
        &self,
        source: &Source,
        access: Access,
        claim: &mut crate::Claim,
    ) -> CsiResult<i64> {
        let (source_access, size) = match source {
            Source::Snapshot(id) => {
                claim.also(&[(Res::Snapshot, id)])?;
                let s = self.known_snapshot(id)?;
                (s.access, s.size_bytes)
            }
            Source::Volume(id) => {
                claim.also(&[(Res::Volume, id)])?;
                let v = self
                    .known_volume(id)
                    .map_err(|_| not_found("source volume", id))?;
                (v.access, v.capacity_bytes)
            }
        };
        if source_access != access {
            return Err(CsiError::invalid(
                "volume_content_source",
                "the source's access type differs from the requested one",
            ));
        }
        Ok(size)
    }

    fn status_of(&self, v: &VolumeRecord) -> (Vec<String>, Option<VolumeCondition>) {
        (
            self.tables().attached_nodes(&v.id),
            self.backend().volume_condition(v),
        )
    }
}

#[async_trait]
impl<B: VolumeBackend> csi_driver::Controller for Engine<B> {
    async fn create_volume(
        &self,
        _ctx: &CallContext,
        req: CreateVolumeRequest,
    ) -> CsiResult<CreateVolumeResponse> {
        let access = Access::of(&req.volume_capabilities)?;
        self.backend()
            .check_capabilities(&req.volume_capabilities)?;
        let mutable = self
            .backend()
            .mutable_parameters(&BTreeMap::new(), &req.mutable_parameters)?;
        // One CreateVolume per name at a time, however long its copy runs.
        let mut claim = self
            .in_flight()
            .claim("CreateVolume", &[(Res::VolumeName, &req.name)])?;
        if let Some(existing) = self.tables().volumes.by_name(&req.name) {
            let original =
                CreateVolumeRequest::decode(existing.request.as_slice()).map_err(|e| {
                    CsiError::Internal(format!("record of volume {}: {e}", existing.id))
                })?;
            let volume = existing.message();
            compare_volume(&original, &volume, &req)?;
            return Ok(CreateVolumeResponse {
                volume: Some(volume),
            });
        }
        if !self.topology_fits(req.accessibility_requirements.as_ref()) {
            return Err(CsiError::ResourceExhausted(format!(
                "node {} is not in the requested topology",
                self.config().node_id
            )));
        }
        let size = self.volume_size(req.capacity_range.as_ref(), access)?;
        // The source must exist, have the same access type, fit, and stay
        // while it is copied (its claim makes deleting it ABORTED meanwhile).
        let source = Source::of(req.volume_content_source.as_ref());
        if let Some(src) = &source {
            let source_size = self.source_size(src, access, &mut claim)?;
            if size < source_size {
                return Err(CsiError::OutOfRange(format!(
                    "capacity_range: {size} bytes is smaller than the source's {source_size} bytes"
                )));
            }
        }
        let reservation = self.reserve(
            size,
            &format!("for {}", csi_proto::size::format_bytes(size)),
        )?;
        let record = VolumeRecord {
            id: IdKind::Volume.generate(),
            name: req.name.clone(),
            capacity_bytes: size,
            access,
            source,
            parameters: sorted(&req.parameters),
            mutable_parameters: mutable,
            topology: self.segment(),
            request: CreateVolumeRequest {
                secrets: Default::default(),
                ..req
            }
            .encode_to_vec(),
            ephemeral: false,
        };
        claim.also(&[(Res::Volume, &record.id)])?;
        let (this, made) = (self.clone(), record.clone());
        blocking(move || {
            let _claim = claim;
            this.make_volume(&made, Some(reservation))
        })
        .await?;
        tracing::info!(volume = %record.id, name = %record.name, size, "created volume");
        Ok(CreateVolumeResponse {
            volume: Some(record.message()),
        })
    }

    async fn delete_volume(
        &self,
        _ctx: &CallContext,
        req: DeleteVolumeRequest,
    ) -> CsiResult<DeleteVolumeResponse> {
        if IdKind::Volume.is_valid(&req.volume_id) {
            let claim = self
                .in_flight()
                .claim("DeleteVolume", &[(Res::Volume, &req.volume_id)])?;
            let this = self.clone();
            blocking(move || {
                let _claim = claim;
                this.remove_volume(&req.volume_id)
            })
            .await?;
        }
        Ok(DeleteVolumeResponse {})
    }

    async fn controller_publish_volume(
        &self,
        _ctx: &CallContext,
        req: ControllerPublishVolumeRequest,
    ) -> CsiResult<ControllerPublishVolumeResponse> {
        let volume = self.known_volume(&req.volume_id)?;
        if req.node_id != self.config().node_id {
            return Err(not_found("node", &req.node_id));
        }
        let cap = req.volume_capability.clone().unwrap_or_default();
        if !volume.access.fits(&cap) {
            return Err(CsiError::invalid(
                "volume_capability",
                format!("volume {} was not created for this access type", volume.id),
            ));
        }
        let multi_node = cap.access_mode().is_multi_node();
        let limit = self.config().attach_limit;
        (self.tables()).attach(&volume.id, &req.node_id, req.readonly, multi_node, limit)?;
        Ok(ControllerPublishVolumeResponse {
            publish_context: self.backend().publish_context(&volume),
        })
    }

    async fn controller_unpublish_volume(
        &self,
        _ctx: &CallContext,
        req: ControllerUnpublishVolumeRequest,
    ) -> CsiResult<ControllerUnpublishVolumeResponse> {
        // A missing volume or node counts as unpublished (the spec's SHOULD).
        if IdKind::Volume.is_valid(&req.volume_id) {
            self.tables().detach(&req.volume_id, &req.node_id)?;
        }
        Ok(ControllerUnpublishVolumeResponse {})
    }

    async fn validate_volume_capabilities(
        &self,
        _ctx: &CallContext,
        req: ValidateVolumeCapabilitiesRequest,
    ) -> CsiResult<ValidateVolumeCapabilitiesResponse> {
        let volume = self.known_volume(&req.volume_id)?;
        let caps = &req.volume_capabilities;
        let message = if let Some(cap) = caps.iter().find(|c| !volume.access.fits(c)) {
            let kind = if cap.is_block() { "block" } else { "mount" };
            Some(format!(
                "volume {} does not support {kind} access",
                volume.id
            ))
        } else {
            let checked = self.backend().check_capabilities(caps).and_then(|()| {
                let b = self.backend();
                b.mutable_parameters(&volume.mutable_parameters, &req.mutable_parameters)
            });
            checked.err().map(|e| e.to_string())
        };
        match message {
            Some(message) => Ok(ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message,
            }),
            None => Ok(confirmed(req)),
        }
    }

    async fn list_volumes(
        &self,
        _ctx: &CallContext,
        req: ListVolumesRequest,
    ) -> CsiResult<ListVolumesResponse> {
        let (entries, next_token) = self.tables().volumes.read(|all| {
            let all: Vec<&VolumeRecord> = all.values().filter(|v| !v.ephemeral).collect();
            page(all, req.max_entries, &req.starting_token, |v| {
                let (published_node_ids, volume_condition) = self.status_of(v);
                list_volumes_response::Entry {
                    volume: Some(v.message()),
                    status: Some(list_volumes_response::VolumeStatus {
                        published_node_ids,
                        volume_condition,
                    }),
                }
            })
        })?;
        Ok(ListVolumesResponse {
            entries,
            next_token,
        })
    }

    async fn get_capacity(
        &self,
        _ctx: &CallContext,
        req: GetCapacityRequest,
    ) -> CsiResult<GetCapacityResponse> {
        let ours = self.segment();
        let elsewhere = self.config().topology_key.is_some()
            && (req.accessible_topology.as_ref())
                .is_some_and(|t| t.segments.iter().any(|(k, v)| ours.get(k) != Some(v)));
        let c = self.config();
        Ok(GetCapacityResponse {
            available_capacity: if elsewhere {
                0
            } else {
                self.available_capacity()
            },
            maximum_volume_size: (c.max_size > 0).then_some(c.max_size),
            minimum_volume_size: (c.min_size > 0).then_some(c.min_size),
        })
    }

    async fn create_snapshot(
        &self,
        _ctx: &CallContext,
        req: CreateSnapshotRequest,
    ) -> CsiResult<CreateSnapshotResponse> {
        let mut claim = self
            .in_flight()
            .claim("CreateSnapshot", &[(Res::SnapshotName, &req.name)])?;
        if let Some(existing) = self.tables().snapshots.by_name(&req.name) {
            let snapshot = existing.message();
            compare_snapshot(&snapshot, &to_map(&existing.parameters), &req)?;
            return Ok(CreateSnapshotResponse {
                snapshot: Some(snapshot),
            });
        }
        // The source stays while it is copied: DeleteVolume of it is ABORTED.
        claim.also(&[(Res::Volume, &req.source_volume_id)])?;
        let volume = self.known_volume(&req.source_volume_id)?;
        let record = SnapshotRecord {
            id: IdKind::Snapshot.generate(),
            name: req.name.clone(),
            source_volume_id: volume.id.clone(),
            size_bytes: volume.capacity_bytes,
            access: volume.access,
            created_unix_nanos: now_nanos(),
            group_snapshot_id: None,
            parameters: sorted(&req.parameters),
        };
        claim.also(&[(Res::Snapshot, &record.id)])?;
        let (this, saved) = (self.clone(), record.clone());
        blocking(move || {
            let _claim = claim;
            this.backend().create_snapshot(&saved)?;
            if let Err(e) = this.tables().snapshots.put(&saved.id, saved.clone()) {
                let _ = this.backend().delete_snapshot(&saved.id);
                return Err(e.into());
            }
            Ok(())
        })
        .await?;
        tracing::info!(snapshot = %record.id, volume = %volume.id, "created snapshot");
        Ok(CreateSnapshotResponse {
            snapshot: Some(record.message()),
        })
    }

    async fn delete_snapshot(
        &self,
        _ctx: &CallContext,
        req: DeleteSnapshotRequest,
    ) -> CsiResult<DeleteSnapshotResponse> {
        if !IdKind::Snapshot.is_valid(&req.snapshot_id) {
            return Ok(DeleteSnapshotResponse {});
        }
        // ABORTED while a volume is being restored from it.
        let claim = self
            .in_flight()
            .claim("DeleteSnapshot", &[(Res::Snapshot, &req.snapshot_id)])?;
        let (this, id) = (self.clone(), req.snapshot_id);
        blocking(move || {
            let _claim = claim;
            this.tables().snapshots.update(&id, |slot| match slot {
                Some(s) if s.group_snapshot_id.is_some() => Err(CsiError::invalid(
                    "snapshot_id",
                    format!("snapshot {id} belongs to a group snapshot; delete the group instead"),
                )),
                _ => Ok(slot.take()),
            })?;
            // With or without a record: data left by a crash goes too.
            this.backend().delete_snapshot(&id).map(drop)
        })
        .await?;
        Ok(DeleteSnapshotResponse {})
    }

    async fn list_snapshots(
        &self,
        _ctx: &CallContext,
        req: ListSnapshotsRequest,
    ) -> CsiResult<ListSnapshotsResponse> {
        let (entries, next_token) = self.tables().snapshots.read(|all| {
            let all: Vec<&SnapshotRecord> = all
                .values()
                .filter(|s| req.snapshot_id.is_empty() || s.id == req.snapshot_id)
                .filter(|s| {
                    req.source_volume_id.is_empty() || s.source_volume_id == req.source_volume_id
                })
                .collect();
            page(all, req.max_entries, &req.starting_token, |s| {
                list_snapshots_response::Entry {
                    snapshot: Some(s.message()),
                }
            })
        })?;
        Ok(ListSnapshotsResponse {
            entries,
            next_token,
        })
    }

    async fn get_snapshot(
        &self,
        _ctx: &CallContext,
        req: GetSnapshotRequest,
    ) -> CsiResult<GetSnapshotResponse> {
        Ok(GetSnapshotResponse {
            snapshot: Some(self.known_snapshot(&req.snapshot_id)?.message()),
        })
    }

    async fn controller_expand_volume(
        &self,
        _ctx: &CallContext,
        req: ControllerExpandVolumeRequest,
    ) -> CsiResult<ControllerExpandVolumeResponse> {
        let claim = self
            .in_flight()
            .claim("ControllerExpandVolume", &[(Res::Volume, &req.volume_id)])?;
        let volume = self.known_volume(&req.volume_id)?;
        let size = self.volume_size(req.capacity_range.as_ref(), volume.access)?;
        let node_expansion_required = self.backend().node_expansion_required(volume.access);
        if size <= volume.capacity_bytes {
            return Ok(ControllerExpandVolumeResponse {
                capacity_bytes: volume.capacity_bytes,
                node_expansion_required,
            });
        }
        let grow = size - volume.capacity_bytes;
        let reservation = self.reserve(
            grow,
            &format!("to grow to {}", csi_proto::size::format_bytes(size)),
        )?;
        let this = self.clone();
        blocking(move || {
            let _claim = claim;
            this.backend().expand_volume(&volume, size)?;
            this.tables().volumes.update(&volume.id, |slot| {
                if let Some(v) = slot {
                    v.capacity_bytes = size;
                }
                Ok(())
            })?;
            reservation.keep();
            tracing::info!(volume = %volume.id, size, "grew volume");
            Ok(())
        })
        .await?;
        Ok(ControllerExpandVolumeResponse {
            capacity_bytes: size,
            node_expansion_required,
        })
    }

    async fn controller_get_volume(
        &self,
        _ctx: &CallContext,
        req: ControllerGetVolumeRequest,
    ) -> CsiResult<ControllerGetVolumeResponse> {
        let volume = self.known_volume(&req.volume_id)?;
        let (published_node_ids, volume_condition) = self.status_of(&volume);
        Ok(ControllerGetVolumeResponse {
            volume: Some(volume.message()),
            status: Some(controller_get_volume_response::VolumeStatus {
                published_node_ids,
                volume_condition,
            }),
        })
    }

    async fn controller_modify_volume(
        &self,
        _ctx: &CallContext,
        req: ControllerModifyVolumeRequest,
    ) -> CsiResult<ControllerModifyVolumeResponse> {
        let claim = self
            .in_flight()
            .claim("ControllerModifyVolume", &[(Res::Volume, &req.volume_id)])?;
        let volume = self.known_volume(&req.volume_id)?;
        let new = (self.backend())
            .mutable_parameters(&volume.mutable_parameters, &req.mutable_parameters)?;
        if new == volume.mutable_parameters {
            return Ok(ControllerModifyVolumeResponse {});
        }
        let this = self.clone();
        blocking(move || {
            let _claim = claim;
            this.backend().modify_volume(&volume, &new)?;
            this.tables().volumes.update(&volume.id, |slot| {
                let v = slot
                    .as_mut()
                    .ok_or_else(|| not_found("volume", &volume.id))?;
                v.mutable_parameters = new.clone();
                Ok(())
            })?;
            tracing::info!(volume = %volume.id, parameters = ?new, "modified volume");
            Ok(())
        })
        .await?;
        Ok(ControllerModifyVolumeResponse {})
    }
}

#[async_trait]
impl<B: VolumeBackend> csi_driver::GroupController for Engine<B> {
    async fn create_volume_group_snapshot(
        &self,
        _ctx: &CallContext,
        req: CreateVolumeGroupSnapshotRequest,
    ) -> CsiResult<CreateVolumeGroupSnapshotResponse> {
        let mut claim = self.in_flight().claim(
            "CreateVolumeGroupSnapshot",
            &[(Res::GroupSnapshotName, &req.name)],
        )?;
        let existing = self.tables().groups.by_name(&req.name);
        if let Some((g, members)) = existing.and_then(|g| self.tables().group_with_members(&g.id)) {
            g.check_repeat(&req)?;
            return Ok(CreateVolumeGroupSnapshotResponse {
                group_snapshot: Some(g.message(members)),
            });
        }
        let mut volumes: Vec<VolumeRecord> = Vec::new();
        for id in &req.source_volume_ids {
            if volumes.iter().any(|v| &v.id == id) {
                return Err(CsiError::invalid(
                    "source_volume_ids",
                    format!("volume {id} is listed twice"),
                ));
            }
            // The members stay while they are copied.
            claim.also(&[(Res::Volume, id)])?;
            volumes.push(self.known_volume(id)?);
        }
        let group_id = IdKind::GroupSnapshot.generate();
        let created = now_nanos();
        let plan: Vec<(SnapshotRecord, VolumeRecord)> = volumes
            .into_iter()
            .map(|v| {
                let snap = SnapshotRecord {
                    id: IdKind::Snapshot.generate(),
                    name: format!("{}-{}", req.name, v.id),
                    source_volume_id: v.id.clone(),
                    size_bytes: v.capacity_bytes,
                    access: v.access,
                    created_unix_nanos: created,
                    group_snapshot_id: Some(group_id.clone()),
                    parameters: sorted(&req.parameters),
                };
                (snap, v)
            })
            .collect();
        let ids: Vec<(Res, &str)> = plan
            .iter()
            .map(|(s, _)| (Res::Snapshot, s.id.as_str()))
            .collect();
        claim.also(&ids)?;
        let members: Vec<SnapshotRecord> = plan.iter().map(|(s, _)| s.clone()).collect();
        let record = GroupSnapshotRecord {
            id: group_id,
            name: req.name.clone(),
            source_volume_ids: req.source_volume_ids.clone(),
            snapshot_ids: members.iter().map(|s| s.id.clone()).collect(),
            parameters: sorted(&req.parameters),
            created_unix_nanos: created,
        };
        let (this, saved, cut) = (self.clone(), record.clone(), members.clone());
        blocking(move || {
            let _claim = claim;
            this.backend().cut_group(&plan)?;
            if let Err(e) = this.tables().save_group(&saved, &cut) {
                for s in &cut {
                    let _ = this.tables().snapshots.remove(&s.id);
                    let _ = this.backend().delete_snapshot(&s.id);
                }
                return Err(e);
            }
            Ok(())
        })
        .await?;
        tracing::info!(group = %record.id, volumes = ?record.source_volume_ids, "cut group snapshot");
        let messages = members.iter().map(SnapshotRecord::message).collect();
        Ok(CreateVolumeGroupSnapshotResponse {
            group_snapshot: Some(record.message(messages)),
        })
    }

    async fn delete_volume_group_snapshot(
        &self,
        _ctx: &CallContext,
        req: DeleteVolumeGroupSnapshotRequest,
    ) -> CsiResult<DeleteVolumeGroupSnapshotResponse> {
        let id = &req.group_snapshot_id;
        if !IdKind::GroupSnapshot.is_valid(id) {
            return Ok(DeleteVolumeGroupSnapshotResponse {});
        }
        let mut claim = self
            .in_flight()
            .claim("DeleteVolumeGroupSnapshot", &[(Res::GroupSnapshot, id)])?;
        let Some(g) = self.tables().groups.get(id) else {
            return Ok(DeleteVolumeGroupSnapshotResponse {});
        };
        g.check_members(&req.snapshot_ids)?;
        // ABORTED while a volume is being restored from a member.
        let members: Vec<(Res, &str)> = g
            .snapshot_ids
            .iter()
            .map(|s| (Res::Snapshot, s.as_str()))
            .collect();
        claim.also(&members)?;
        let this = self.clone();
        blocking(move || {
            let _claim = claim;
            // Records first, then data: a crash in between leaves data the
            // next start sweeps.
            for snap in this.tables().remove_group(&g)? {
                this.backend().delete_snapshot(&snap.id)?;
            }
            Ok(())
        })
        .await?;
        Ok(DeleteVolumeGroupSnapshotResponse {})
    }

    async fn get_volume_group_snapshot(
        &self,
        _ctx: &CallContext,
        req: GetVolumeGroupSnapshotRequest,
    ) -> CsiResult<GetVolumeGroupSnapshotResponse> {
        let id = &req.group_snapshot_id;
        let (g, members) = IdKind::GroupSnapshot
            .is_valid(id)
            .then(|| self.tables().group_with_members(id))
            .flatten()
            .ok_or_else(|| not_found("group snapshot", id))?;
        g.check_members(&req.snapshot_ids)?;
        Ok(GetVolumeGroupSnapshotResponse {
            group_snapshot: Some(g.message(members)),
        })
    }
}
