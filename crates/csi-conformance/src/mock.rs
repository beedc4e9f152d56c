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
//! use csi_conformance::mock::{Fault, MockDriver};
//!
//! let server = MockDriver::new().with_fault(Fault::NoPaging).serve().await?;
//! println!("serving on {} logging to {}", server.endpoint(), server.log_path().display());
//! server.shutdown().await;
//! # Ok(()) }
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use csi_proto::v1::*;
use csi_server::helpers::capacity::{CapacityPolicy, resolve_capacity};
use csi_server::helpers::confirm::{confirmed, not_confirmed};
use csi_server::helpers::idempotency::{compare_snapshot, compare_volume};
use csi_server::helpers::paging::paginate;
use csi_server::helpers::publish::{Publication, PublishArgs, PublishDecision, check_publish};
use csi_server::helpers::stage::{StageDecision, Staging, check_stage};
use csi_server::layer::CsiCall;
use csi_server::tower;
use csi_server::{
    Builtin, CallContext, Capabilities, Controller, ControllerRpc, CsiError, CsiRequest, CsiResult,
    GroupController, GroupControllerRpc, Method, Node, NodeRpc, PluginInfo, Position, Server,
    ServerBuilder, VolumeExpansion,
};
use futures::future::{Either, Ready, ready};

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
    /// Served by tonic as it comes, which resets requests whose
    /// `:authority` is the socket path (what gRPC C-core and grpc-java send).
    StrictAuthority,
}

/// The mutable parameter keys the mock accepts.
pub const ACCEPTED_MUTABLE_PARAMETERS: &[&str] = &["iops", "throughput"];

/// The attach limit NodeGetInfo reports and ControllerPublishVolume enforces.
pub const MAX_VOLUMES_PER_NODE: i64 = 8;

#[derive(Debug, Clone)]
struct Vol {
    /// The CreateVolume that made it (secrets dropped), for idempotency.
    request: CreateVolumeRequest,
    volume: Volume,
}

#[derive(Debug, Clone)]
struct Snap {
    name: String,
    parameters: HashMap<String, String>,
    snapshot: Snapshot,
}

#[derive(Debug, Clone)]
struct Grp {
    name: String,
    sources: Vec<String>,
    params: HashMap<String, String>,
    group: VolumeGroupSnapshot,
}

#[derive(Debug, Default)]
struct State {
    seq: u64,
    volumes: BTreeMap<String, Vol>,
    snapshots: BTreeMap<String, Snap>,
    groups: BTreeMap<String, Grp>,
    /// (volume, node) → (capability, readonly).
    controller_pubs: HashMap<(String, String), (Option<VolumeCapability>, bool)>,
    /// volume → where and how it is staged.
    staged: HashMap<String, Staging>,
    /// volume → its publications.
    node_pubs: HashMap<String, Vec<Publication>>,
}

impl State {
    fn next_id(&mut self, kind: &str) -> String {
        self.seq += 1;
        format!("mock-{kind}-{:08}", self.seq)
    }

    fn used(&self) -> i64 {
        self.volumes.values().map(|v| v.volume.capacity_bytes).sum()
    }

    fn in_use(&self, volume_id: &str) -> bool {
        self.controller_pubs.keys().any(|(v, _)| v == volume_id)
            || self.staged.contains_key(volume_id)
            || self.node_pubs.get(volume_id).is_some_and(|p| !p.is_empty())
    }

    /// NOT_FOUND unless `volume_id` is published or staged at `path`.
    fn available_at(&self, volume_id: &str, path: &str) -> CsiResult<()> {
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

    fn published_nodes(&self, volume_id: &str) -> Vec<String> {
        self.controller_pubs
            .keys()
            .filter(|(v, _)| v == volume_id)
            .map(|(_, n)| n.clone())
            .collect()
    }
}

#[derive(Debug)]
struct Options {
    name: String,
    node_id: String,
    faults: HashSet<Fault>,
    log: Option<PathBuf>,
    total_capacity: i64,
    stage_unstage: bool,
}

/// The in-memory driver. Cloning shares the state.
#[derive(Debug, Clone)]
pub struct MockDriver {
    state: Arc<Mutex<State>>,
    opts: Arc<Options>,
}

impl Default for MockDriver {
    fn default() -> Self {
        Self::new()
    }
}

impl MockDriver {
    /// A correct driver named `mock.csi.example.com` on node `mock-node`,
    /// advertising every capability it implements (STAGE_UNSTAGE included).
    pub fn new() -> Self {
        Self {
            state: Arc::default(),
            opts: Arc::new(Options {
                name: "mock.csi.example.com".into(),
                node_id: "mock-node".into(),
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

    fn missing_volume(&self, id: &str) -> CsiError {
        if self.has(Fault::WrongCodeForMissingVolume) {
            CsiError::Internal(format!("lookup of volume {id} failed"))
        } else {
            CsiError::NotFound(format!("volume {id} does not exist"))
        }
    }

    /// What the mock declares.
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
                    move |inner| RequestLog {
                        inner,
                        log: log.clone(),
                        leak,
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
                tower::layer::layer_fn(move |inner| EarlyAnswers {
                    inner,
                    faults: early.clone(),
                    stage_unstage,
                }),
            );
        }
        builder
    }

    /// Serves the driver on a unix socket in a fresh temporary directory,
    /// logging to `driver.log` beside it unless a log path was set.
    pub async fn serve(mut self) -> std::io::Result<MockServer> {
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
        Ok(MockServer { running, log_path })
    }
}

/// A running [`MockDriver`]; stops when shut down or dropped.
#[derive(Debug)]
pub struct MockServer {
    running: crate::in_process::Running,
    log_path: PathBuf,
}

impl MockServer {
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

/// Logs every request as `<Method> <redacted request>`; with
/// [`Fault::LeaksSecretsToLog`] also its secrets, in plain text.
#[derive(Clone)]
struct RequestLog<S> {
    inner: S,
    log: Option<PathBuf>,
    leak: bool,
}

impl<S, Req> tower::Service<CsiCall<Req>> for RequestLog<S>
where
    Req: CsiRequest,
    S: tower::Service<CsiCall<Req>, Response = Req::Output, Error = CsiError>,
{
    type Response = Req::Output;
    type Error = CsiError;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), CsiError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: CsiCall<Req>) -> S::Future {
        if let Some(path) = &self.log {
            let mut line = format!("{} {:?}", Req::METHOD, call.request);
            if let Some(secrets) = call
                .request
                .secrets()
                .filter(|s| self.leak && !s.is_empty())
            {
                line.push_str(&format!(" secrets={secrets:?}"));
            }
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
            {
                let _ = writeln!(f, "{line}");
            }
        }
        self.inner.call(call)
    }
}

/// The faults that answer before validation does.
#[derive(Clone)]
struct EarlyAnswers<S> {
    inner: S,
    faults: Vec<Fault>,
    stage_unstage: bool,
}

/// The request as another type of the same RPC (the layer is generic over
/// the request type; the faults concern specific RPCs).
fn view<T: prost::Message + Default>(request: &impl prost::Message) -> T {
    T::decode(request.encode_to_vec().as_slice()).unwrap_or_default()
}

impl<S> EarlyAnswers<S> {
    fn answer<Req: CsiRequest>(&self, request: &Req) -> Option<CsiError> {
        let relative = |path: &str| !path.is_empty() && !path.starts_with('/');
        match Req::METHOD {
            Method::NodePublishVolume if self.faults.contains(&Fault::StagingCheckedFirst) => {
                let req: NodePublishVolumeRequest = view(request);
                (self.stage_unstage && req.staging_target_path.is_empty()).then(|| {
                    CsiError::FailedPrecondition(
                        "STAGE_UNSTAGE_VOLUME is advertised: staging_target_path is required"
                            .into(),
                    )
                })
            }
            Method::NodeGetVolumeStats
                if self.faults.contains(&Fault::RelativeVolumePathInvalid) =>
            {
                let req: NodeGetVolumeStatsRequest = view(request);
                relative(&req.volume_path)
                    .then(|| CsiError::invalid("volume_path", "must be absolute"))
            }
            Method::NodeExpandVolume if self.faults.contains(&Fault::RelativeVolumePathInvalid) => {
                let req: NodeExpandVolumeRequest = view(request);
                relative(&req.volume_path)
                    .then(|| CsiError::invalid("volume_path", "must be absolute"))
            }
            _ => None,
        }
    }
}

impl<S, Req> tower::Service<CsiCall<Req>> for EarlyAnswers<S>
where
    Req: CsiRequest,
    S: tower::Service<CsiCall<Req>, Response = Req::Output, Error = CsiError>,
{
    type Response = Req::Output;
    type Error = CsiError;
    type Future = Either<S::Future, Ready<Result<Req::Output, CsiError>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), CsiError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: CsiCall<Req>) -> Self::Future {
        match self.answer(&call.request) {
            Some(e) => Either::Right(ready(Err(e))),
            None => Either::Left(self.inner.call(call)),
        }
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

#[csi_server::async_trait]
impl Controller for MockDriver {
    async fn create_volume(
        &self,
        _: &CallContext,
        mut req: CreateVolumeRequest,
    ) -> CsiResult<CreateVolumeResponse> {
        req.secrets.clear();
        let mut st = self.lock();
        if !self.has(Fault::NotIdempotentCreate) {
            if let Some(v) = st.volumes.values().find(|v| v.request.name == req.name) {
                compare_volume(&v.request, &v.volume, &req)?;
                return Ok(CreateVolumeResponse {
                    volume: Some(v.volume.clone()),
                });
            }
        }
        let source_size = match req
            .volume_content_source
            .as_ref()
            .and_then(|s| s.r#type.as_ref())
        {
            Some(volume_content_source::Type::Snapshot(s)) => Some(
                st.snapshots
                    .get(&s.snapshot_id)
                    .map(|s| s.snapshot.size_bytes)
                    .ok_or_else(|| {
                        CsiError::NotFound(format!("snapshot {} does not exist", s.snapshot_id))
                    })?,
            ),
            Some(volume_content_source::Type::Volume(v)) => Some(
                st.volumes
                    .get(&v.volume_id)
                    .map(|v| v.volume.capacity_bytes)
                    .ok_or_else(|| {
                        CsiError::NotFound(format!("volume {} does not exist", v.volume_id))
                    })?,
            ),
            None => None,
        };
        let policy = CapacityPolicy::new(csi_proto::size::GIB, 1);
        let mut size = resolve_capacity(req.capacity_range.as_ref(), &policy)?;
        if let Some(src) = source_size {
            let limit = req.capacity_range.as_ref().map_or(0, |r| r.limit_bytes);
            if limit > 0 && src > limit {
                return Err(CsiError::OutOfRange(
                    "the source is larger than limit_bytes".into(),
                ));
            }
            size = size.max(src);
        }
        if st.used() + size > self.opts.total_capacity {
            return Err(CsiError::ResourceExhausted("out of capacity".into()));
        }
        let id = st.next_id("vol");
        let volume = Volume {
            capacity_bytes: size,
            volume_id: id.clone(),
            volume_context: [("mock/name".to_string(), req.name.clone())].into(),
            content_source: req.volume_content_source.clone(),
            accessible_topology: vec![],
        };
        st.volumes.insert(
            id,
            Vol {
                request: req,
                volume: volume.clone(),
            },
        );
        Ok(CreateVolumeResponse {
            volume: Some(volume),
        })
    }

    async fn delete_volume(
        &self,
        _: &CallContext,
        req: DeleteVolumeRequest,
    ) -> CsiResult<DeleteVolumeResponse> {
        let mut st = self.lock();
        if st.in_use(&req.volume_id) {
            return Err(CsiError::FailedPrecondition(format!(
                "volume {} is in use",
                req.volume_id
            )));
        }
        st.volumes.remove(&req.volume_id);
        Ok(DeleteVolumeResponse {})
    }

    async fn controller_publish_volume(
        &self,
        _: &CallContext,
        req: ControllerPublishVolumeRequest,
    ) -> CsiResult<ControllerPublishVolumeResponse> {
        let mut st = self.lock();
        if !st.volumes.contains_key(&req.volume_id) {
            return Err(self.missing_volume(&req.volume_id));
        }
        if req.node_id != self.opts.node_id {
            return Err(CsiError::NotFound(format!(
                "node {} does not exist",
                req.node_id
            )));
        }
        let key = (req.volume_id.clone(), req.node_id);
        let args = (req.volume_capability, req.readonly);
        match st.controller_pubs.get(&key) {
            Some(existing) if *existing == args => {}
            Some(_) => {
                return Err(CsiError::AlreadyExists(
                    "published to the node with other arguments".into(),
                ));
            }
            None => {
                let attached = st
                    .controller_pubs
                    .keys()
                    .filter(|(_, n)| *n == key.1)
                    .count() as i64;
                if attached >= MAX_VOLUMES_PER_NODE && !self.has(Fault::NoAttachLimit) {
                    return Err(CsiError::ResourceExhausted(format!(
                        "node {} has {MAX_VOLUMES_PER_NODE} volumes attached",
                        key.1
                    )));
                }
                st.controller_pubs.insert(key, args);
            }
        }
        Ok(ControllerPublishVolumeResponse {
            publish_context: [(
                "mock/device".to_string(),
                format!("/dev/mock/{}", req.volume_id),
            )]
            .into(),
        })
    }

    async fn controller_unpublish_volume(
        &self,
        _: &CallContext,
        req: ControllerUnpublishVolumeRequest,
    ) -> CsiResult<ControllerUnpublishVolumeResponse> {
        self.lock().controller_pubs.retain(|(v, n), _| {
            !(*v == req.volume_id && (req.node_id.is_empty() || *n == req.node_id))
        });
        Ok(ControllerUnpublishVolumeResponse {})
    }

    async fn validate_volume_capabilities(
        &self,
        _: &CallContext,
        req: ValidateVolumeCapabilitiesRequest,
    ) -> CsiResult<ValidateVolumeCapabilitiesResponse> {
        let st = self.lock();
        let v = st
            .volumes
            .get(&req.volume_id)
            .ok_or_else(|| self.missing_volume(&req.volume_id))?;
        let block = is_block(&v.request.volume_capabilities);
        if req
            .volume_capabilities
            .iter()
            .any(|c| c.is_block() != block)
        {
            return Ok(not_confirmed("the access type differs from the volume's"));
        }
        Ok(confirmed(req))
    }

    async fn list_volumes(
        &self,
        _: &CallContext,
        req: ListVolumesRequest,
    ) -> CsiResult<ListVolumesResponse> {
        let st = self.lock();
        let all: Vec<list_volumes_response::Entry> = st
            .volumes
            .iter()
            .map(|(id, v)| list_volumes_response::Entry {
                volume: Some(v.volume.clone()),
                status: Some(list_volumes_response::VolumeStatus {
                    published_node_ids: st.published_nodes(id),
                    volume_condition: None,
                }),
            })
            .collect();
        let max = if self.has(Fault::NoPaging) {
            0
        } else {
            req.max_entries
        };
        let page = paginate(all, max, &req.starting_token)?;
        Ok(ListVolumesResponse {
            entries: page.entries,
            next_token: page.next_token,
        })
    }

    async fn get_capacity(
        &self,
        _: &CallContext,
        _: GetCapacityRequest,
    ) -> CsiResult<GetCapacityResponse> {
        let available = self.opts.total_capacity - self.lock().used();
        Ok(GetCapacityResponse {
            available_capacity: available,
            maximum_volume_size: Some(available),
            minimum_volume_size: None,
        })
    }

    async fn create_snapshot(
        &self,
        _: &CallContext,
        req: CreateSnapshotRequest,
    ) -> CsiResult<CreateSnapshotResponse> {
        let mut st = self.lock();
        if let Some(s) = st.snapshots.values().find(|s| s.name == req.name) {
            compare_snapshot(&s.snapshot, &s.parameters, &req)?;
            return Ok(CreateSnapshotResponse {
                snapshot: Some(s.snapshot.clone()),
            });
        }
        let size = st
            .volumes
            .get(&req.source_volume_id)
            .map(|v| v.volume.capacity_bytes)
            .ok_or_else(|| self.missing_volume(&req.source_volume_id))?;
        let id = st.next_id("snap");
        let snapshot = Snapshot {
            size_bytes: size,
            snapshot_id: id.clone(),
            source_volume_id: req.source_volume_id,
            creation_time: Some(now()),
            ready_to_use: true,
            group_snapshot_id: String::new(),
        };
        st.snapshots.insert(
            id,
            Snap {
                name: req.name,
                parameters: req.parameters,
                snapshot: snapshot.clone(),
            },
        );
        Ok(CreateSnapshotResponse {
            snapshot: Some(snapshot),
        })
    }

    async fn delete_snapshot(
        &self,
        _: &CallContext,
        req: DeleteSnapshotRequest,
    ) -> CsiResult<DeleteSnapshotResponse> {
        let mut st = self.lock();
        if st
            .snapshots
            .get(&req.snapshot_id)
            .is_some_and(|s| !s.snapshot.group_snapshot_id.is_empty())
        {
            return Err(CsiError::invalid(
                "snapshot_id",
                "the snapshot belongs to a group; delete the group snapshot",
            ));
        }
        st.snapshots.remove(&req.snapshot_id);
        Ok(DeleteSnapshotResponse {})
    }

    async fn list_snapshots(
        &self,
        _: &CallContext,
        req: ListSnapshotsRequest,
    ) -> CsiResult<ListSnapshotsResponse> {
        let st = self.lock();
        let all: Vec<list_snapshots_response::Entry> = st
            .snapshots
            .values()
            .filter(|s| req.snapshot_id.is_empty() || s.snapshot.snapshot_id == req.snapshot_id)
            .filter(|s| {
                req.source_volume_id.is_empty()
                    || s.snapshot.source_volume_id == req.source_volume_id
            })
            .map(|s| list_snapshots_response::Entry {
                snapshot: Some(s.snapshot.clone()),
            })
            .collect();
        let max = if self.has(Fault::NoPaging) {
            0
        } else {
            req.max_entries
        };
        let page = paginate(all, max, &req.starting_token)?;
        Ok(ListSnapshotsResponse {
            entries: page.entries,
            next_token: page.next_token,
        })
    }

    async fn get_snapshot(
        &self,
        _: &CallContext,
        req: GetSnapshotRequest,
    ) -> CsiResult<GetSnapshotResponse> {
        let st = self.lock();
        let s = st.snapshots.get(&req.snapshot_id).ok_or_else(|| {
            CsiError::NotFound(format!("snapshot {} does not exist", req.snapshot_id))
        })?;
        Ok(GetSnapshotResponse {
            snapshot: Some(s.snapshot.clone()),
        })
    }

    async fn controller_expand_volume(
        &self,
        _: &CallContext,
        req: ControllerExpandVolumeRequest,
    ) -> CsiResult<ControllerExpandVolumeResponse> {
        let range = req.capacity_range.unwrap_or_default();
        let mut st = self.lock();
        let v = st
            .volumes
            .get_mut(&req.volume_id)
            .ok_or_else(|| self.missing_volume(&req.volume_id))?;
        if range.limit_bytes > 0 && v.volume.capacity_bytes > range.limit_bytes {
            return Err(CsiError::OutOfRange(
                "the volume is already larger than limit_bytes".into(),
            ));
        }
        v.volume.capacity_bytes = v.volume.capacity_bytes.max(range.required_bytes);
        Ok(ControllerExpandVolumeResponse {
            capacity_bytes: v.volume.capacity_bytes,
            node_expansion_required: !is_block(&v.request.volume_capabilities),
        })
    }

    async fn controller_get_volume(
        &self,
        _: &CallContext,
        req: ControllerGetVolumeRequest,
    ) -> CsiResult<ControllerGetVolumeResponse> {
        let st = self.lock();
        let v = st
            .volumes
            .get(&req.volume_id)
            .ok_or_else(|| self.missing_volume(&req.volume_id))?;
        Ok(ControllerGetVolumeResponse {
            volume: Some(v.volume.clone()),
            status: Some(controller_get_volume_response::VolumeStatus {
                published_node_ids: st.published_nodes(&req.volume_id),
                volume_condition: None,
            }),
        })
    }

    async fn controller_modify_volume(
        &self,
        _: &CallContext,
        req: ControllerModifyVolumeRequest,
    ) -> CsiResult<ControllerModifyVolumeResponse> {
        // Empty is "modify nothing" (proto3 cannot tell it from absent).
        if req.mutable_parameters.is_empty() && self.has(Fault::RequiresMutableParameters) {
            return Err(CsiError::required("mutable_parameters"));
        }
        // The keys were checked by the server against the declaration.
        let mut st = self.lock();
        let v = st
            .volumes
            .get_mut(&req.volume_id)
            .ok_or_else(|| self.missing_volume(&req.volume_id))?;
        v.request.mutable_parameters.extend(req.mutable_parameters);
        Ok(ControllerModifyVolumeResponse {})
    }
}

#[csi_server::async_trait]
impl Node for MockDriver {
    async fn node_stage_volume(
        &self,
        _: &CallContext,
        req: NodeStageVolumeRequest,
    ) -> CsiResult<NodeStageVolumeResponse> {
        let mut st = self.lock();
        if !st.volumes.contains_key(&req.volume_id) {
            return Err(self.missing_volume(&req.volume_id));
        }
        if check_stage(st.staged.get(&req.volume_id), &req)? != StageDecision::AlreadyStaged {
            st.staged.insert(
                req.volume_id,
                Staging {
                    staging_target_path: req.staging_target_path,
                    volume_capability: req.volume_capability,
                },
            );
        }
        Ok(NodeStageVolumeResponse {})
    }

    async fn node_unstage_volume(
        &self,
        _: &CallContext,
        req: NodeUnstageVolumeRequest,
    ) -> CsiResult<NodeUnstageVolumeResponse> {
        let mut st = self.lock();
        let here = st
            .staged
            .get(&req.volume_id)
            .is_some_and(|s| s.staging_target_path == req.staging_target_path);
        if here {
            st.staged.remove(&req.volume_id);
        } else if !st.volumes.contains_key(&req.volume_id) {
            return Err(self.missing_volume(&req.volume_id));
        }
        Ok(NodeUnstageVolumeResponse {})
    }

    async fn node_publish_volume(
        &self,
        _: &CallContext,
        req: NodePublishVolumeRequest,
    ) -> CsiResult<NodePublishVolumeResponse> {
        let mut st = self.lock();
        if !st.volumes.contains_key(&req.volume_id) {
            return Err(self.missing_volume(&req.volume_id));
        }
        let staged_here = st
            .staged
            .get(&req.volume_id)
            .is_some_and(|s| s.staging_target_path == req.staging_target_path);
        if self.opts.stage_unstage && !staged_here {
            return Err(CsiError::FailedPrecondition(
                "the volume is not staged at staging_target_path".into(),
            ));
        }
        let mut existing = st
            .node_pubs
            .get(&req.volume_id)
            .cloned()
            .unwrap_or_default();
        if self.has(Fault::NoRepeatTable) {
            // Only the same-target rule: any other target is a new one.
            existing.retain(|p| p.target_path == req.target_path);
        }
        if check_publish(&existing, &req, true)? == PublishDecision::AlreadyPublished {
            return Ok(NodePublishVolumeResponse {});
        }
        if st
            .node_pubs
            .iter()
            .any(|(v, p)| *v != req.volume_id && p.iter().any(|p| p.target_path == req.target_path))
        {
            return Err(CsiError::AlreadyExists(format!(
                "another volume is published at {}",
                req.target_path
            )));
        }
        let target = Path::new(&req.target_path);
        let block = req
            .volume_capability
            .as_ref()
            .is_some_and(VolumeCapability::is_block);
        if block {
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(target)?;
        } else if let Err(e) = std::fs::create_dir(target) {
            if !target.is_dir() {
                return Err(e.into());
            }
        }
        st.node_pubs
            .entry(req.volume_id.clone())
            .or_default()
            .push(Publication {
                target_path: req.target_path.clone(),
                args: PublishArgs::of(&req),
            });
        Ok(NodePublishVolumeResponse {})
    }

    async fn node_unpublish_volume(
        &self,
        _: &CallContext,
        req: NodeUnpublishVolumeRequest,
    ) -> CsiResult<NodeUnpublishVolumeResponse> {
        let mut st = self.lock();
        let pubs = st.node_pubs.entry(req.volume_id.clone()).or_default();
        let before = pubs.len();
        pubs.retain(|p| p.target_path != req.target_path);
        if pubs.len() < before {
            if !self.has(Fault::NoTargetCleanup) {
                let p = Path::new(&req.target_path);
                if p.is_dir() {
                    std::fs::remove_dir(p)?;
                } else {
                    std::fs::remove_file(p)?;
                }
            }
        } else if !st.volumes.contains_key(&req.volume_id) {
            return Err(self.missing_volume(&req.volume_id));
        }
        Ok(NodeUnpublishVolumeResponse {})
    }

    async fn node_get_volume_stats(
        &self,
        _: &CallContext,
        req: NodeGetVolumeStatsRequest,
    ) -> CsiResult<NodeGetVolumeStatsResponse> {
        let st = self.lock();
        let v = st
            .volumes
            .get(&req.volume_id)
            .ok_or_else(|| self.missing_volume(&req.volume_id))?;
        st.available_at(&req.volume_id, &req.volume_path)?;
        let capacity = v.volume.capacity_bytes;
        let mut usage = vec![VolumeUsage {
            available: capacity,
            total: capacity,
            used: 0,
            unit: volume_usage::Unit::Bytes as i32,
        }];
        if !is_block(&v.request.volume_capabilities) {
            usage.push(VolumeUsage {
                available: 1 << 20,
                total: 1 << 20,
                used: 0,
                unit: volume_usage::Unit::Inodes as i32,
            });
        }
        Ok(NodeGetVolumeStatsResponse {
            usage,
            volume_condition: None,
        })
    }

    async fn node_expand_volume(
        &self,
        _: &CallContext,
        req: NodeExpandVolumeRequest,
    ) -> CsiResult<NodeExpandVolumeResponse> {
        let st = self.lock();
        let v = st
            .volumes
            .get(&req.volume_id)
            .ok_or_else(|| self.missing_volume(&req.volume_id))?;
        st.available_at(&req.volume_id, &req.volume_path)?;
        let required = req.capacity_range.map_or(0, |c| c.required_bytes);
        Ok(NodeExpandVolumeResponse {
            capacity_bytes: v.volume.capacity_bytes.max(required),
        })
    }

    async fn node_get_info(
        &self,
        _: &CallContext,
        _: NodeGetInfoRequest,
    ) -> CsiResult<NodeGetInfoResponse> {
        Ok(NodeGetInfoResponse {
            node_id: self.opts.node_id.clone(),
            max_volumes_per_node: MAX_VOLUMES_PER_NODE,
            accessible_topology: None,
        })
    }
}

#[csi_server::async_trait]
impl GroupController for MockDriver {
    async fn create_volume_group_snapshot(
        &self,
        _: &CallContext,
        req: CreateVolumeGroupSnapshotRequest,
    ) -> CsiResult<CreateVolumeGroupSnapshotResponse> {
        let mut sources = req.source_volume_ids.clone();
        sources.sort();
        let mut st = self.lock();
        if let Some(g) = st.groups.values().find(|g| g.name == req.name) {
            if g.sources == sources && g.params == req.parameters {
                return Ok(CreateVolumeGroupSnapshotResponse {
                    group_snapshot: Some(g.group.clone()),
                });
            }
            return Err(CsiError::AlreadyExists(format!(
                "group snapshot {} exists with other sources",
                req.name
            )));
        }
        if let Some(id) = sources.iter().find(|id| !st.volumes.contains_key(*id)) {
            return Err(self.missing_volume(id));
        }
        let gid = st.next_id("group");
        let time = now();
        let mut snapshots = Vec::new();
        for src in &sources {
            let sid = st.next_id("snap");
            let snapshot = Snapshot {
                size_bytes: st.volumes[src].volume.capacity_bytes,
                snapshot_id: sid.clone(),
                source_volume_id: src.clone(),
                creation_time: Some(time),
                ready_to_use: true,
                group_snapshot_id: gid.clone(),
            };
            st.snapshots.insert(
                sid.clone(),
                Snap {
                    name: format!("{}/{sid}", req.name),
                    parameters: req.parameters.clone(),
                    snapshot: snapshot.clone(),
                },
            );
            snapshots.push(snapshot);
        }
        let group = VolumeGroupSnapshot {
            group_snapshot_id: gid.clone(),
            snapshots,
            creation_time: Some(time),
            ready_to_use: true,
        };
        st.groups.insert(
            gid,
            Grp {
                name: req.name,
                sources,
                params: req.parameters,
                group: group.clone(),
            },
        );
        Ok(CreateVolumeGroupSnapshotResponse {
            group_snapshot: Some(group),
        })
    }

    async fn delete_volume_group_snapshot(
        &self,
        _: &CallContext,
        req: DeleteVolumeGroupSnapshotRequest,
    ) -> CsiResult<DeleteVolumeGroupSnapshotResponse> {
        if req.snapshot_ids.is_empty() && self.has(Fault::RequiresSnapshotIds) {
            return Err(CsiError::required("snapshot_ids"));
        }
        let mut st = self.lock();
        let Some(g) = st.groups.get(&req.group_snapshot_id) else {
            return Ok(DeleteVolumeGroupSnapshotResponse {});
        };
        let members: HashSet<String> = g
            .group
            .snapshots
            .iter()
            .map(|s| s.snapshot_id.clone())
            .collect();
        if !req.snapshot_ids.is_empty()
            && req.snapshot_ids.iter().cloned().collect::<HashSet<_>>() != members
        {
            return Err(CsiError::invalid(
                "snapshot_ids",
                "do not match the group snapshot",
            ));
        }
        st.snapshots.retain(|id, _| !members.contains(id));
        st.groups.remove(&req.group_snapshot_id);
        Ok(DeleteVolumeGroupSnapshotResponse {})
    }

    async fn get_volume_group_snapshot(
        &self,
        _: &CallContext,
        req: GetVolumeGroupSnapshotRequest,
    ) -> CsiResult<GetVolumeGroupSnapshotResponse> {
        if req.snapshot_ids.is_empty() && self.has(Fault::RequiresSnapshotIds) {
            return Err(CsiError::required("snapshot_ids"));
        }
        let st = self.lock();
        let g = st.groups.get(&req.group_snapshot_id).ok_or_else(|| {
            CsiError::NotFound(format!(
                "group snapshot {} does not exist",
                req.group_snapshot_id
            ))
        })?;
        let members: HashSet<&String> = g.group.snapshots.iter().map(|s| &s.snapshot_id).collect();
        if !req.snapshot_ids.is_empty()
            && req.snapshot_ids.iter().collect::<HashSet<_>>() != members
        {
            return Err(CsiError::invalid(
                "snapshot_ids",
                "do not match the group snapshot",
            ));
        }
        Ok(GetVolumeGroupSnapshotResponse {
            group_snapshot: Some(g.group.clone()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_declaration_is_consistent_and_follows_the_faults() {
        let caps = MockDriver::new().capabilities();
        assert!(caps.check().is_ok());
        assert!(caps.has_node(NodeRpc::StageUnstageVolume));
        assert!(caps.accepted_mutable_parameters().is_some());
        let caps = MockDriver::new()
            .without_stage_unstage()
            .with_fault(Fault::AcceptsAnyMutableParameter)
            .capabilities();
        assert!(!caps.has_node(NodeRpc::StageUnstageVolume));
        assert!(caps.accepted_mutable_parameters().is_none());
    }
}
