//! [`ControllerService`]: the type, its constructors, what it declares,
//! and what the RPCs share (lookups, capacity, topology, running work
//! that outlives a cancelled call). The RPCs themselves are one file per
//! operation beside this one.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use csi_driver::helpers::capacity::{CapacityPolicy, resolve_capacity};
use csi_driver::{
    CallContext, Capabilities, ControllerRpc, CsiError, CsiResult, GroupControllerRpc,
    PluginService, VolumeExpansion, blocking_on,
};
use csi_proto::v1::*;
use csi_store::{FileStore, RecordStore};

use crate::access::Access;
use crate::backend::{ControllerBackend, ProviderVolume, VolumeCatalog};
use crate::config::Config;
use crate::ids::IdKind;
use crate::records::{SnapshotRecord, Tables, VolumeRecord};
use crate::retry::Deadline;
use crate::state::{Claim, InFlight, Ledger, Reservation};

struct Inner<B> {
    config: Config,
    backend: B,
    /// Local data: the records. None when the backend's catalog is the
    /// source of truth.
    tables: Option<Tables>,
    in_flight: Arc<InFlight>,
    ledger: Arc<Ledger>,
}

/// The whole Controller and GroupController service over a
/// [`ControllerBackend`]: cheap to clone, serve it with
/// `Server::builder(..).controller(Arc::new(service))`.
pub struct ControllerService<B> {
    inner: Arc<Inner<B>>,
}

impl<B> Clone for ControllerService<B> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

/// A [`ControllerService`] that does not keep it alive: for what the
/// service's own backend holds (a node side that reads the records), so
/// no reference cycle keeps the state directory locked.
pub struct WeakControllerService<B> {
    inner: std::sync::Weak<Inner<B>>,
}

impl<B> WeakControllerService<B> {
    /// The service, while it lives.
    pub fn upgrade(&self) -> Option<ControllerService<B>> {
        self.inner
            .upgrade()
            .map(|inner| ControllerService { inner })
    }
}

impl<B> ControllerService<B> {
    /// A handle that does not keep the service alive.
    pub fn downgrade(&self) -> WeakControllerService<B> {
        WeakControllerService {
            inner: Arc::downgrade(&self.inner),
        }
    }
}

pub(crate) fn not_found(what: &str, id: &str) -> CsiError {
    CsiError::NotFound(format!("{what} {id:?} does not exist"))
}

impl<B: ControllerBackend> ControllerService<B> {
    /// The service over local data recorded in the locked state directory
    /// `files` (see [`crate::open_state`]), importing an earlier version's
    /// `state.json`.
    pub fn open(files: FileStore, config: Config, backend: B) -> Result<Self, String> {
        crate::records::import_state_file(&files)?;
        Self::with_store(Arc::new(files), config, backend)
    }

    /// The service over local data recorded in any record store
    /// (csi-store's `FakeStore` in tests).
    pub fn with_store(
        store: Arc<dyn RecordStore>,
        config: Config,
        backend: B,
    ) -> Result<Self, String> {
        if backend.catalog().is_some() {
            return Err("the backend's catalog is the source of truth: use ControllerService::without_store".into());
        }
        let tables = Tables::open(store).map_err(|e| e.to_string())?;
        let used = tables
            .volumes
            .read(|all| all.values().map(|v| v.capacity_bytes).sum());
        Ok(Self::new(config, backend, Some(tables), used))
    }

    /// The service over a provider that is the source of truth (the
    /// backend has a [`VolumeCatalog`]): no state directory at all.
    pub fn without_store(config: Config, backend: B) -> Result<Self, String> {
        if backend.catalog().is_none() {
            return Err("a backend without a catalog needs records: use ControllerService::open or with_store".into());
        }
        Ok(Self::new(config, backend, None, 0))
    }

    fn new(config: Config, backend: B, tables: Option<Tables>, used: i64) -> Self {
        Self {
            inner: Arc::new(Inner {
                config,
                backend,
                tables,
                in_flight: InFlight::new(),
                ledger: Ledger::new(used),
            }),
        }
    }

    /// The storage backend.
    pub fn backend(&self) -> &B {
        &self.inner.backend
    }

    /// The records (None when the backend's catalog is the source of truth).
    pub fn tables(&self) -> Option<&Tables> {
        self.inner.tables.as_ref()
    }

    /// The records, for the local-data paths.
    pub(crate) fn local(&self) -> CsiResult<&Tables> {
        self.tables().ok_or_else(|| {
            CsiError::Internal("the service keeps no records for this backend".into())
        })
    }

    /// The provider's catalog, when it is the source of truth.
    pub(crate) fn catalog(&self) -> Option<&dyn VolumeCatalog> {
        self.backend().catalog()
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

    /// How long `ctx`'s call keeps trying.
    pub fn deadline(&self, ctx: &CallContext) -> Deadline {
        Deadline::of(ctx, self.config().clock.clone(), self.config().retry)
    }

    /// `caps` plus exactly what this service serves over its backend: the
    /// controller RPCs of the abilities the backend hands out, online
    /// expansion, group snapshots (local data) and topology when on.
    pub fn capabilities(&self, caps: Capabilities) -> Capabilities {
        use ControllerRpc as C;
        let (b, c) = (self.backend(), self.config());
        let local = b.catalog().is_none();
        let mut rpcs = vec![
            C::CreateDeleteVolume,
            C::ListVolumes,
            C::GetVolume,
            C::SingleNodeMultiWriter,
        ];
        if c.capacity > 0 || b.free_space().is_some() {
            rpcs.push(C::GetCapacity);
        }
        if b.snapshots().is_some() {
            rpcs.extend([C::CreateDeleteSnapshot, C::ListSnapshots, C::GetSnapshot]);
        }
        if b.clones_volumes() {
            rpcs.push(C::CloneVolume);
        }
        if b.expansion().is_some() {
            rpcs.push(C::ExpandVolume);
        }
        if local && b.modification().is_some() {
            rpcs.push(C::ModifyVolume);
        }
        if b.reports_volume_condition() {
            rpcs.push(C::VolumeCondition);
        }
        if b.attacher().is_some() {
            rpcs.extend([
                C::PublishUnpublishVolume,
                C::PublishReadonly,
                C::ListVolumesPublishedNodes,
            ]);
        }
        let mut caps = caps
            .plugin(PluginService::ControllerService)
            .controller(rpcs);
        if b.expansion().is_some() {
            caps = caps.volume_expansion(VolumeExpansion::Online);
        }
        if local && b.group_snapshots().is_some() {
            caps = caps
                .plugin(PluginService::GroupControllerService)
                .group_controller([GroupControllerRpc::CreateDeleteGetVolumeGroupSnapshot]);
        }
        if c.topology_key.is_some() {
            caps = caps.plugin(PluginService::VolumeAccessibilityConstraints);
        }
        caps
    }

    /// Runs `work` holding `claim` to its end, detached from the call, so a
    /// cancelled call's work finishes once and its claims are released on
    /// every path. Local data's work runs on a blocking-pool thread (it may
    /// block on the filesystem); when no thread can start, the answer is
    /// RESOURCE_EXHAUSTED with the claims already released. A provider's
    /// work is async I/O and runs as a task.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        claim: Claim,
        work: impl Future<Output = CsiResult<T>> + Send + 'static,
    ) -> CsiResult<T> {
        if self.catalog().is_some() {
            let task = tokio::spawn(async move {
                let _claim = claim;
                work.await
            });
            return task.await.unwrap_or_else(|e| {
                tracing::error!(error = %e, "controller work panicked or was cancelled");
                Err(CsiError::Internal(
                    "internal error: controller work did not finish".into(),
                ))
            });
        }
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|e| CsiError::Internal(format!("no async runtime: {e}")))?;
        blocking_on(&*self.config().runner, move || {
            let _claim = claim;
            handle.block_on(work)
        })
        .await
    }

    /// Record changes made outside [`run`](Self::run), off the async
    /// runtime: a durable write waits for a flush, and on the runtime it
    /// would hold up every other call (and their share of that flush).
    pub(crate) async fn off_runtime<T: Send + 'static>(
        &self,
        change: impl FnOnce(&Tables) -> CsiResult<T> + Send + 'static,
    ) -> CsiResult<T> {
        let this = self.clone();
        blocking_on(&*self.config().runner, move || change(this.local()?)).await
    }

    /// The record of a volume, or NOT_FOUND (ids the service could not
    /// have generated never reach a local backend).
    pub fn known_volume(&self, id: &str) -> CsiResult<VolumeRecord> {
        let t = self.local()?;
        IdKind::Volume
            .is_valid(id)
            .then(|| t.volumes.get(id))
            .flatten()
            .ok_or_else(|| not_found("volume", id))
    }

    /// The record of a snapshot, or NOT_FOUND.
    pub fn known_snapshot(&self, id: &str) -> CsiResult<SnapshotRecord> {
        let t = self.local()?;
        IdKind::Snapshot
            .is_valid(id)
            .then(|| t.snapshots.get(id))
            .flatten()
            .ok_or_else(|| not_found("snapshot", id))
    }

    /// A volume as the provider reports it, or NOT_FOUND.
    pub(crate) async fn provider_volume(
        &self,
        catalog: &dyn VolumeCatalog,
        deadline: &Deadline,
        id: &str,
    ) -> CsiResult<ProviderVolume> {
        deadline
            .retry(|| catalog.volume(id))
            .await?
            .ok_or_else(|| not_found("volume", id))
    }

    /// A volume and the nodes it is attached to, from either source.
    pub(crate) async fn volume_and_nodes(
        &self,
        ctx: &CallContext,
        id: &str,
    ) -> CsiResult<(VolumeRecord, Vec<String>)> {
        match self.catalog() {
            Some(catalog) => {
                let found = (self.provider_volume(catalog, &self.deadline(ctx), id)).await?;
                Ok((found.record, found.attached.into_keys().collect()))
            }
            None => {
                let v = self.known_volume(id)?;
                let nodes = self.local()?.attached_nodes(&v.id);
                Ok((v, nodes))
            }
        }
    }

    /// Free capacity: the configured total minus what is promised, or the
    /// backend's free space. Never negative.
    pub fn available_capacity(&self) -> i64 {
        let c = self.config();
        let free = if c.capacity > 0 {
            c.capacity - self.ledger().used()
        } else {
            self.backend().free_space().unwrap_or(0)
        };
        free.max(0)
    }

    pub(crate) fn segment(&self) -> BTreeMap<String, String> {
        let c = self.config();
        c.topology_key
            .iter()
            .map(|k| (k.clone(), c.node_id.clone()))
            .collect()
    }

    /// Reserves `bytes` (checked and taken in one step), or RESOURCE_EXHAUSTED.
    pub(crate) fn reserve(&self, bytes: i64, what: &str) -> CsiResult<Reservation> {
        let c = self.config();
        let free = self.backend().free_space().unwrap_or(i64::MAX);
        let refused = c.capacity <= 0 && c.refuse_beyond_free_space && bytes > free;
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

    pub(crate) fn volume_size(
        &self,
        range: Option<&CapacityRange>,
        access: Access,
    ) -> CsiResult<i64> {
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

    /// Whether a topology requirement admits this node.
    pub(crate) fn topology_fits(&self, req: Option<&TopologyRequirement>) -> bool {
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

    pub(crate) fn status_of(&self, v: &VolumeRecord) -> (Vec<String>, Option<VolumeCondition>) {
        let nodes = (self.tables())
            .map(|t| t.attached_nodes(&v.id))
            .unwrap_or_default();
        (nodes, self.backend().volume_condition(v))
    }
}
