//! An in-memory reference CSI driver: correct by default, deliberately broken
//! with [`Fault`]s.
//!
//! It is a driver like any other: the csi-driver traits implemented over
//! in-memory state, served by csi-server through the real layers, so
//! validation, capability gating, the mutable-parameter check and locking
//! are the library's, not a second copy. Repeat rules, paging and
//! idempotency come from csi-driver's helpers. A fault is an override: of a
//! driver method (skip a rule), of the declaration (do not declare the
//! accepted mutable parameters), of the stack (a layer answering before
//! validation does), or of the serving (no `:authority` adapter).
//!
//! On NodePublish it creates the target path (a directory for mount, a file
//! for block) and removes it on NodeUnpublish, so path rules are observable
//! without mounting. It accepts the mutable parameters in
//! [`ACCEPTED_MUTABLE_PARAMETERS`] and reports (and enforces) an attach limit
//! of [`MAX_VOLUMES_PER_NODE`]. Every request is logged (secrets redacted,
//! unless [`Fault::LeaksSecretsToLog`]).
//!
//! ```no_run
//! # async fn example() -> std::io::Result<()> {
//! use csi_conformance::fake::{Fault, FakeDriver};
//!
//! let server = FakeDriver::new().with_fault(Fault::NoPaging).serve().await?;
//! println!("serving on {} logging to {}", server.endpoint(), server.log_path().display());
//! server.shutdown().await;
//! # Ok(()) }
//! ```

//!
//! Files by what they serve: [`FakeDriver`]'s volumes and attachments
//! (`controller.rs`), snapshots (`snapshots.rs`), group snapshots
//! (`group.rs`), the node (`node.rs`), its state (`state.rs`) and the
//! faults served as layers (`layers.rs`).

mod controller;
mod group;
mod layers;
mod node;
mod snapshots;
mod state;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use csi_proto::v1::*;
use csi_server::tower;
use csi_server::{
    Builtin, Capabilities, ControllerRpc, CsiError, CsiResult, GroupControllerRpc, NodeRpc,
    PluginInfo, PluginService, Position, ServeMode, Server, ServerBuilder, VolumeExpansion,
};

use layers::{EarlyAnswers, FaultLayer, RequestLog};
use state::{Options, State, Vol};

/// A deliberate spec violation, to prove the suite notices it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fault {
    /// Answers INTERNAL instead of NOT_FOUND when a volume does not exist.
    WrongCodeForMissingVolume,
    /// ListVolumes and ListSnapshots ignore `max_entries`.
    NoPaging,
    /// Every CreateVolume makes a new volume, even for a known name.
    NotIdempotentCreate,
    /// Writes request secrets to the driver log in plain text.
    LeaksSecretsToLog,
    /// NodeStageVolume of a missing volume echoes the request's secrets in
    /// its error message.
    LeaksSecretsInErrors,
    /// NodeUnpublishVolume leaves the target path behind.
    NoTargetCleanup,
    /// NodePublishVolume lets single-node volumes be published at many targets.
    NoRepeatTable,
    /// NodePublishVolume applies the STAGE_UNSTAGE rule (FAILED_PRECONDITION
    /// for a missing staging_target_path) before checking required fields.
    StagingCheckedFirst,
    /// NodeGetVolumeStats and NodeExpandVolume answer INVALID_ARGUMENT for a
    /// relative volume_path instead of NOT_FOUND.
    RelativeVolumePathInvalid,
    /// CreateVolume and ControllerModifyVolume take any mutable parameter.
    AcceptsAnyMutableParameter,
    /// ControllerModifyVolume rejects an empty mutable_parameters as missing.
    RequiresMutableParameters,
    /// Get/DeleteVolumeGroupSnapshot reject an empty snapshot_ids as missing.
    RequiresSnapshotIds,
    /// ControllerPublishVolume ignores the max_volumes_per_node it reports.
    NoAttachLimit,
    /// Refuses a `:authority` that is not a valid URI authority, such as
    /// the socket path gRPC C-core and grpc-java send, as a server built on
    /// h2 does (csi-server's `any_authority(false)`).
    StrictAuthority,
    /// CreateVolume and CreateSnapshot reject names longer than
    /// [`SHORT_NAME_LIMIT`] bytes, below the spec's 128 (as a driver that
    /// puts the name in a provider's shorter tag would).
    ShortNameLimit,
    /// ControllerPublishVolume of a volume already published to the node
    /// with another `readonly` or capability answers OK, not ALREADY_EXISTS.
    RepublishIgnoresArguments,
    /// ListVolumes and ListSnapshots go on listing what was deleted (as a
    /// driver listing from a stale cache would).
    ListsDeleted,
    /// ListSnapshots filtered by a source_volume_id that does not exist
    /// answers NOT_FOUND instead of an empty list.
    UnknownSourceNotFound,
    /// CreateVolume refuses mutable_parameters (a VolumeAttributesClass)
    /// it accepts in ControllerModifyVolume.
    MutableParametersOnlyOnModify,
    /// CreateVolume reports half the capacity it was asked for.
    CapacityBelowRequired,
    /// NodeGetVolumeStats answers for any path, not only where the volume
    /// is staged or published.
    StatsAtAnyPath,
    /// NodeGetInfo reports no accessible_topology although the plugin
    /// advertises VOLUME_ACCESSIBILITY_CONSTRAINTS.
    NoNodeTopology,
    /// ListSnapshots entries lack their creation_time (CreateSnapshot's
    /// answer has it).
    ListedSnapshotsWithoutTime,
}

/// The topology segment the fake driver's node and volumes are in.
pub const TOPOLOGY_SEGMENT: (&str, &str) = ("topology.fake.csi.example.com/zone", "zone-1");

fn topology() -> Topology {
    let (key, value) = TOPOLOGY_SEGMENT;
    Topology {
        segments: [(key.to_owned(), value.to_owned())].into(),
    }
}

/// The name length [`Fault::ShortNameLimit`] allows.
pub const SHORT_NAME_LIMIT: usize = 100;

/// The mutable parameter keys the fake driver accepts.
pub const ACCEPTED_MUTABLE_PARAMETERS: &[&str] = &["iops", "throughput"];

/// The publish_context key ControllerPublishVolume returns and the node
/// calls of a controller-published volume require.
pub const PUBLISH_CONTEXT_KEY: &str = "fake/device";

fn device_of(volume_id: &str) -> String {
    format!("/dev/fake/{volume_id}")
}

/// The attach limit NodeGetInfo reports and ControllerPublishVolume enforces.
pub const MAX_VOLUMES_PER_NODE: i64 = 8;

/// The in-memory driver. Cloning shares the state.
#[derive(Debug, Clone)]
pub struct FakeDriver {
    state: Arc<Mutex<State>>,
    opts: Arc<Options>,
}

impl Default for FakeDriver {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeDriver {
    /// A correct driver named `fake.csi.example.com` on node `fake-node`,
    /// advertising every capability it implements (STAGE_UNSTAGE included).
    pub fn new() -> Self {
        Self {
            state: Arc::default(),
            opts: Arc::new(Options {
                name: "fake.csi.example.com".into(),
                node_id: "fake-node".into(),
                faults: HashSet::new(),
                log: None,
                total_capacity: csi_proto::size::TIB * 1024,
                stage_unstage: true,
            }),
        }
    }

    fn opts_mut(&mut self) -> &mut Options {
        Arc::get_mut(&mut self.opts).expect("configure the driver before cloning or serving it")
    }

    /// Adds a fault. Configure before cloning or serving.
    pub fn with_fault(mut self, fault: Fault) -> Self {
        self.opts_mut().faults.insert(fault);
        self
    }

    /// Reports `name` as the plugin name instead of `fake.csi.example.com`.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.opts_mut().name = name.into();
        self
    }

    /// Logs every request (secrets redacted unless [`Fault::LeaksSecretsToLog`]) to `path`.
    pub fn with_log(mut self, path: impl Into<PathBuf>) -> Self {
        self.opts_mut().log = Some(path.into());
        self
    }

    /// Does not advertise STAGE_UNSTAGE_VOLUME (NodePublish needs no staging).
    pub fn without_stage_unstage(mut self) -> Self {
        self.opts_mut().stage_unstage = false;
        self
    }

    /// The node id NodeGetInfo reports.
    pub fn node_id(&self) -> &str {
        &self.opts.node_id
    }

    fn has(&self, f: Fault) -> bool {
        self.opts.faults.contains(&f)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock must not wedge every later call.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The name check [`Fault::ShortNameLimit`] adds.
    fn check_name(&self, name: &str) -> CsiResult<()> {
        if self.has(Fault::ShortNameLimit) && name.len() > SHORT_NAME_LIMIT {
            let reason = format!("longer than {SHORT_NAME_LIMIT} bytes");
            return Err(CsiError::invalid("name", reason));
        }
        Ok(())
    }

    fn missing_volume(&self, id: &str) -> CsiError {
        if self.has(Fault::WrongCodeForMissingVolume) {
            CsiError::Internal(format!("lookup of volume {id} failed"))
        } else {
            CsiError::NotFound(format!("volume {id} does not exist"))
        }
    }

    /// The volume `id`, or the missing-volume error (which a fault may get wrong).
    fn volume<'a>(&self, st: &'a State, id: &str) -> CsiResult<&'a Vol> {
        st.volumes.get(id).ok_or_else(|| self.missing_volume(id))
    }

    /// [`volume`](Self::volume), to change.
    fn volume_mut<'a>(&self, st: &'a mut State, id: &str) -> CsiResult<&'a mut Vol> {
        st.volumes
            .get_mut(id)
            .ok_or_else(|| self.missing_volume(id))
    }

    /// The page size a List call honours: none with [`Fault::NoPaging`].
    fn page_size(&self, max_entries: i32) -> i32 {
        if self.has(Fault::NoPaging) {
            0
        } else {
            max_entries
        }
    }

    /// What the fake driver declares.
    pub fn capabilities(&self) -> Capabilities {
        let mut node = vec![
            NodeRpc::GetVolumeStats,
            NodeRpc::ExpandVolume,
            NodeRpc::SingleNodeMultiWriter,
        ];
        if self.opts.stage_unstage {
            node.push(NodeRpc::StageUnstageVolume);
        }
        let caps = Capabilities::new()
            .plugin(PluginService::VolumeAccessibilityConstraints)
            .volume_expansion(VolumeExpansion::Online)
            .controller([
                ControllerRpc::CreateDeleteVolume,
                ControllerRpc::PublishUnpublishVolume,
                ControllerRpc::ListVolumes,
                ControllerRpc::GetCapacity,
                ControllerRpc::CreateDeleteSnapshot,
                ControllerRpc::ListSnapshots,
                ControllerRpc::CloneVolume,
                ControllerRpc::PublishReadonly,
                ControllerRpc::ExpandVolume,
                ControllerRpc::ListVolumesPublishedNodes,
                ControllerRpc::GetVolume,
                ControllerRpc::SingleNodeMultiWriter,
                ControllerRpc::ModifyVolume,
                ControllerRpc::GetSnapshot,
            ])
            .node(node)
            .group_controller([GroupControllerRpc::CreateDeleteGetVolumeGroupSnapshot]);
        if self.has(Fault::AcceptsAnyMutableParameter) {
            caps
        } else {
            caps.mutable_parameters(ACCEPTED_MUTABLE_PARAMETERS.iter().copied())
        }
    }

    /// A server builder serving this driver (controller, node and group
    /// controller) with its declaration, log and fault layers; the caller
    /// sets the endpoint. What [`serve`](Self::serve) and
    /// [`run_in_process`](crate::run_in_process) use.
    pub fn server_builder(&self) -> ServerBuilder {
        let info = PluginInfo::new(self.opts.name.as_str(), env!("CARGO_PKG_VERSION"))
            .expect("a valid plugin name");
        let driver = Arc::new(self.clone());
        let mut builder = Server::builder(info)
            .capabilities(self.capabilities())
            .controller(driver.clone())
            .node(driver.clone())
            .group_controller(driver)
            .any_authority(!self.has(Fault::StrictAuthority))
            .layer_at(
                Position::Outermost,
                tower::layer::layer_fn({
                    let log = self.opts.log.clone();
                    let leak = self.has(Fault::LeaksSecretsToLog);
                    move |inner| FaultLayer {
                        before: RequestLog {
                            log: log.clone(),
                            leak,
                        },
                        inner,
                    }
                }),
            );
        let early: Vec<Fault> = [Fault::StagingCheckedFirst, Fault::RelativeVolumePathInvalid]
            .into_iter()
            .filter(|f| self.has(*f))
            .collect();
        if !early.is_empty() {
            let stage_unstage = self.opts.stage_unstage;
            builder = builder.layer_at(
                Position::Outside(Builtin::Validation),
                tower::layer::layer_fn(move |inner| FaultLayer {
                    before: EarlyAnswers {
                        faults: early.clone(),
                        stage_unstage,
                    },
                    inner,
                }),
            );
        }
        builder
    }

    /// Serves the driver on a unix socket in a fresh temporary directory,
    /// logging to `driver.log` beside it unless a log path was set.
    pub async fn serve(mut self) -> std::io::Result<FakeServer> {
        let dir = tempfile::tempdir()?;
        if self.opts.log.is_none() {
            self.opts_mut().log = Some(dir.path().join("driver.log"));
        }
        let log_path = self.opts.log.clone().unwrap_or_default();
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)?;
        let running = crate::in_process::serve(self.server_builder(), dir)
            .await
            .map_err(std::io::Error::other)?;
        Ok(FakeServer { running, log_path })
    }

    /// Serves the driver split: [`ServeMode::Controller`] on one socket and
    /// [`ServeMode::Node`] on another, each in its own temporary directory,
    /// sharing this driver's state and log (`driver.log` beside the node
    /// socket unless a log path was set).
    pub async fn serve_split(mut self) -> std::io::Result<FakeSplitServer> {
        let node_dir = tempfile::tempdir()?;
        let controller_dir = tempfile::tempdir()?;
        if self.opts.log.is_none() {
            self.opts_mut().log = Some(node_dir.path().join("driver.log"));
        }
        let log_path = self.opts.log.clone().unwrap_or_default();
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)?;
        let serve = |mode, dir| crate::in_process::serve(self.server_builder().mode(mode), dir);
        let node = serve(ServeMode::Node, node_dir)
            .await
            .map_err(std::io::Error::other)?;
        let controller = serve(ServeMode::Controller, controller_dir)
            .await
            .map_err(std::io::Error::other)?;
        Ok(FakeSplitServer {
            controller,
            node,
            log_path,
        })
    }
}

/// A [`FakeDriver`] served as two processes would serve it: a
/// controller-only and a node-only server over the same in-memory state
/// (the stand-in for the storage both sides reach), logging to one file.
#[derive(Debug)]
pub struct FakeSplitServer {
    controller: crate::in_process::Running,
    node: crate::in_process::Running,
    log_path: PathBuf,
}

impl FakeSplitServer {
    /// The controller server's `unix://` endpoint (Identity, Controller,
    /// GroupController).
    pub fn controller_endpoint(&self) -> &str {
        self.controller.endpoint()
    }

    /// The node server's `unix://` endpoint (Identity, Node).
    pub fn node_endpoint(&self) -> &str {
        self.node.endpoint()
    }

    /// The log both servers write.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Stops both servers.
    pub async fn shutdown(self) {
        self.controller.shutdown().await;
        self.node.shutdown().await;
    }
}

/// A running [`FakeDriver`]; stops when shut down or dropped.
#[derive(Debug)]
pub struct FakeServer {
    running: crate::in_process::Running,
    log_path: PathBuf,
}

impl FakeServer {
    /// The `unix://` endpoint to connect to.
    pub fn endpoint(&self) -> &str {
        self.running.endpoint()
    }

    /// The driver's log file.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Stops serving and waits for the server task to end.
    pub async fn shutdown(self) {
        self.running.shutdown().await;
    }
}

fn now() -> prost_types::Timestamp {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    prost_types::Timestamp {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

fn is_block(caps: &[VolumeCapability]) -> bool {
    caps.first().is_some_and(|c| c.is_block())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_declaration_is_consistent_and_follows_the_faults() {
        let caps = FakeDriver::new().capabilities();
        assert!(caps.check().is_ok());
        assert!(caps.has_node(NodeRpc::StageUnstageVolume));
        assert!(caps.accepted_mutable_parameters().is_some());
        let caps = FakeDriver::new()
            .without_stage_unstage()
            .with_fault(Fault::AcceptsAnyMutableParameter)
            .capabilities();
        assert!(!caps.has_node(NodeRpc::StageUnstageVolume));
        assert!(caps.accepted_mutable_parameters().is_none());
    }
}
