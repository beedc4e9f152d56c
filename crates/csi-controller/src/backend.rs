//! [`ControllerBackend`]: what a driver implements for the controller
//! side, and the optional abilities it hands out. The service declares
//! exactly the capabilities of the abilities a backend provides, so a
//! driver writes nothing for what it does not do.
//!
//! Two kinds of backend fit:
//! - **local data** (no [`ControllerBackend::catalog`]): the service keeps
//!   the records in csi-store and the backend makes, copies, grows and
//!   removes data;
//! - **a provider that is the source of truth** (a
//!   [`VolumeCatalog`]): no state directory; the service finds volumes by
//!   name (CreateVolume's idempotency across restarts and replicas), gets
//!   them by id and lists them through the catalog, and polls what the
//!   provider is still making until it is ready.
//!
//! Every method that changes something is called after the request was
//! validated and its ids claimed, from work that holds the claims to its
//! end (a cancelled call's work finishes once; a retry meanwhile gets
//! ABORTED). For local data that work runs on a blocking-pool thread, so
//! the backend may do blocking filesystem work directly; a provider's runs
//! as a tokio task, so its methods must not block.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use csi_driver::{CsiResult, async_trait};
use csi_proto::v1::{VolumeCapability, VolumeCondition};

use crate::access::Access;
use crate::error::BackendResult;
use crate::files::DataOnDisk;
use crate::records::{Attached, SnapshotRecord, VolumeRecord};
use crate::wire::sorted;

/// The controller side of a driver: make and remove volumes, and hand out
/// the optional abilities it has.
#[async_trait]
pub trait ControllerBackend: Send + Sync + 'static {
    /// Makes a new volume of `volume.capacity_bytes` bytes and access type
    /// `volume.access`: empty, or filled from `volume.source` (a snapshot,
    /// or a volume when [`Self::clones_volumes`]). `volume.id` is a fresh
    /// id the service made; a provider that names volumes itself replaces
    /// it with its own. Leaves nothing behind when it fails.
    async fn create_volume(&self, volume: &mut VolumeRecord) -> BackendResult<()>;

    /// Removes volume `id` (idempotent); true if there was something.
    async fn delete_volume(&self, id: &str) -> BackendResult<bool>;

    /// The provider's view of volumes and snapshots, when the provider is
    /// the source of truth (then the service keeps no records).
    fn catalog(&self) -> Option<&dyn VolumeCatalog> {
        None
    }
    /// Snapshots (CREATE_DELETE_SNAPSHOT, LIST_SNAPSHOTS, GET_SNAPSHOT, and
    /// restores from them).
    fn snapshots(&self) -> Option<&dyn SnapshotBackend> {
        None
    }
    /// Growing volumes (EXPAND_VOLUME, online).
    fn expansion(&self) -> Option<&dyn ExpandBackend> {
        None
    }
    /// Mutable parameters (MODIFY_VOLUME).
    fn modification(&self) -> Option<&dyn ModifyBackend> {
        None
    }
    /// Group snapshots (the GroupController service; local data only).
    fn group_snapshots(&self) -> Option<&dyn GroupSnapshotBackend> {
        None
    }
    /// Attaching to nodes (PUBLISH_UNPUBLISH_VOLUME).
    fn attacher(&self) -> Option<&dyn AttachBackend> {
        None
    }
    /// Whether `create_volume` can fill a volume from another (CLONE_VOLUME).
    fn clones_volumes(&self) -> bool {
        false
    }
    /// Whether [`Self::volume_condition`] reports (VOLUME_CONDITION).
    fn reports_volume_condition(&self) -> bool {
        false
    }
    /// The CreateVolume parameter keys it accepts; `None`: any. Another
    /// key is INVALID_ARGUMENT naming it (`csi.storage.k8s.io/` keys, which
    /// the provisioner adds, always pass).
    fn accepted_parameters(&self) -> Option<&[&str]> {
        None
    }
    /// Checks capabilities beyond the access type (e.g. the filesystems
    /// the node can make); INVALID_ARGUMENT naming the field.
    fn check_capabilities(&self, _caps: &[VolumeCapability]) -> CsiResult<()> {
        Ok(())
    }
    /// The health of a volume's data.
    fn volume_condition(&self, _volume: &VolumeRecord) -> Option<VolumeCondition> {
        None
    }
    /// Why volume `id` must not be deleted now (e.g. the node side still
    /// holds it), read as `volume <id> <reason>`.
    fn in_use(&self, _id: &str) -> Option<String> {
        None
    }
    /// Local data only: the data that exists, for the startup sweep of
    /// data no record owns.
    fn data(&self) -> DataOnDisk {
        DataOnDisk::default()
    }
    /// Local data only: free bytes where volumes are made (GET_CAPACITY
    /// is declared when this or `Config::capacity` says).
    fn free_space(&self) -> Option<i64> {
        None
    }
}

/// A volume as a provider reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderVolume {
    /// Its facts (`request` may be empty: repeats are compared field by field).
    pub record: VolumeRecord,
    /// Whether it can be used (false while the provider is still making it).
    pub ready: bool,
    /// The nodes it is attached (or attaching) to → read-only.
    pub attached: Attached,
}

/// A snapshot as a provider reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderSnapshot {
    /// Its facts.
    pub record: SnapshotRecord,
    /// Whether it can be restored from (READY_TO_USE).
    pub ready: bool,
}

/// One page of a provider's listing.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderPage<T> {
    /// The entries.
    pub entries: Vec<T>,
    /// Where the next page starts (empty: none).
    pub next_token: String,
}

impl<T> Default for ProviderPage<T> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            next_token: String::new(),
        }
    }
}

/// The provider's view of its volumes and snapshots, when it is the
/// source of truth. An invalid `starting_token` is ABORTED
/// (`BackendError::Csi(CsiError::Aborted(..))`), as the spec says.
#[async_trait]
pub trait VolumeCatalog: Send + Sync {
    /// The volume created under CreateVolume name `name`.
    async fn volume_by_name(&self, name: &str) -> BackendResult<Option<ProviderVolume>>;
    /// Volume `id`.
    async fn volume(&self, id: &str) -> BackendResult<Option<ProviderVolume>>;
    /// Whether a volume is ready once the provider answered its create, so
    /// CreateVolume answers from that record instead of polling
    /// [`Self::volume`]. Default: false (polled until ready).
    fn ready_when_created(&self) -> bool {
        false
    }
    /// A page of volumes (`max_entries` 0: the provider's page size).
    async fn list_volumes(
        &self,
        starting_token: &str,
        max_entries: i32,
    ) -> BackendResult<ProviderPage<ProviderVolume>>;
    /// The snapshot created under CreateSnapshot name `name`.
    async fn snapshot_by_name(&self, _name: &str) -> BackendResult<Option<ProviderSnapshot>> {
        Ok(None)
    }
    /// Snapshot `id`.
    async fn snapshot(&self, _id: &str) -> BackendResult<Option<ProviderSnapshot>> {
        Ok(None)
    }
    /// A page of snapshots, of `source_volume_id` only when not empty.
    async fn list_snapshots(
        &self,
        _source_volume_id: &str,
        _starting_token: &str,
        _max_entries: i32,
    ) -> BackendResult<ProviderPage<ProviderSnapshot>> {
        Ok(ProviderPage::default())
    }
}

/// Snapshots of volumes.
#[async_trait]
pub trait SnapshotBackend: Send + Sync {
    /// Cuts `snapshot` of its source volume. A provider that names
    /// snapshots itself replaces `snapshot.id` with its own.
    async fn create_snapshot(&self, snapshot: &mut SnapshotRecord) -> BackendResult<()>;
    /// Removes snapshot `id` (idempotent); true if there was something.
    async fn delete_snapshot(&self, id: &str) -> BackendResult<bool>;
}

/// Growing volumes.
#[async_trait]
pub trait ExpandBackend: Send + Sync {
    /// Grows `volume` to `size` bytes.
    async fn expand_volume(&self, volume: &VolumeRecord, size: i64) -> BackendResult<()>;
    /// Whether the node must act after a volume of `access` grew.
    fn node_expansion_required(&self, access: Access) -> bool {
        access == Access::Block
    }
}

/// Mutable parameters.
#[async_trait]
pub trait ModifyBackend: Send + Sync {
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
    /// Default: nothing to apply, they are only recorded.
    async fn modify_volume(
        &self,
        _volume: &VolumeRecord,
        _new: &BTreeMap<String, String>,
    ) -> BackendResult<()> {
        Ok(())
    }
}

/// Group snapshots (local data only: the service records them).
#[async_trait]
pub trait GroupSnapshotBackend: Send + Sync {
    /// Cuts every member at one point in time (each with its source
    /// volume), or fails leaving no member's data behind.
    async fn cut_group(&self, members: &[(SnapshotRecord, VolumeRecord)]) -> BackendResult<()>;
}

/// Where an attachment stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttachState {
    /// Attached; the publish context for the node.
    Attached(HashMap<String, String>),
    /// The provider's attach action is still running.
    Attaching,
}

/// Attaching volumes to nodes.
#[async_trait]
pub trait AttachBackend: Send + Sync {
    /// Attaches (or starts attaching) `volume` to `node`. Called only when
    /// [`Self::attachment`] knows of no attach of it to `node`.
    async fn attach(
        &self,
        volume: &VolumeRecord,
        node: &str,
        readonly: bool,
    ) -> BackendResult<AttachState>;
    /// Where the attachment of volume `id` to `node` stands, if there is
    /// one (a provider's in-flight attach is found and polled here, never
    /// started twice). Default: none (attaches that finish in the call).
    async fn attachment(&self, _id: &str, _node: &str) -> BackendResult<Option<AttachState>> {
        Ok(None)
    }
    /// [`Self::attachment`] of a volume the caller has just read from the
    /// [`VolumeCatalog`] (ControllerPublishVolume reads it first, for its
    /// repeat rules): a backend whose lookup reads the volume too can use
    /// `volume` instead of a second read. Its attach may have ended since
    /// that read; [`Self::attach`] is then refused by the provider as a
    /// repeat, which a backend answers as attached. Default:
    /// [`Self::attachment`].
    async fn attachment_of(
        &self,
        volume: &ProviderVolume,
        node: &str,
    ) -> BackendResult<Option<AttachState>> {
        self.attachment(&volume.record.id, node).await
    }
    /// Detaches volume `id` from `node` (idempotent; an empty node: from
    /// every node).
    async fn detach(&self, id: &str, node: &str) -> BackendResult<()>;
}

/// A shared backend (tests keep a handle on a fake this way).
#[async_trait]
impl<B: ControllerBackend> ControllerBackend for Arc<B> {
    async fn create_volume(&self, volume: &mut VolumeRecord) -> BackendResult<()> {
        (**self).create_volume(volume).await
    }
    async fn delete_volume(&self, id: &str) -> BackendResult<bool> {
        (**self).delete_volume(id).await
    }
    fn catalog(&self) -> Option<&dyn VolumeCatalog> {
        (**self).catalog()
    }
    fn snapshots(&self) -> Option<&dyn SnapshotBackend> {
        (**self).snapshots()
    }
    fn expansion(&self) -> Option<&dyn ExpandBackend> {
        (**self).expansion()
    }
    fn modification(&self) -> Option<&dyn ModifyBackend> {
        (**self).modification()
    }
    fn group_snapshots(&self) -> Option<&dyn GroupSnapshotBackend> {
        (**self).group_snapshots()
    }
    fn attacher(&self) -> Option<&dyn AttachBackend> {
        (**self).attacher()
    }
    fn clones_volumes(&self) -> bool {
        (**self).clones_volumes()
    }
    fn reports_volume_condition(&self) -> bool {
        (**self).reports_volume_condition()
    }
    fn accepted_parameters(&self) -> Option<&[&str]> {
        (**self).accepted_parameters()
    }
    fn check_capabilities(&self, caps: &[VolumeCapability]) -> CsiResult<()> {
        (**self).check_capabilities(caps)
    }
    fn volume_condition(&self, volume: &VolumeRecord) -> Option<VolumeCondition> {
        (**self).volume_condition(volume)
    }
    fn in_use(&self, id: &str) -> Option<String> {
        (**self).in_use(id)
    }
    fn data(&self) -> DataOnDisk {
        (**self).data()
    }
    fn free_space(&self) -> Option<i64> {
        (**self).free_space()
    }
}
