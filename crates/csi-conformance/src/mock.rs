//! An in-memory reference CSI driver: correct by default, deliberately broken
//! with [`Fault`]s.
//!
//! It implements the generated tonic server traits directly, keeps every
//! volume, snapshot, publication and staging in memory, and on NodePublish
//! creates the target path (a directory for mount, a file for block) and
//! removes it on NodeUnpublish, so path rules are observable without mounting.
//! It accepts the mutable parameters in [`ACCEPTED_MUTABLE_PARAMETERS`] and
//! reports (and enforces) an attach limit of [`MAX_VOLUMES_PER_NODE`].
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
use std::fmt::Debug;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::TryStreamExt;

use csi_proto::v1::controller_server::{Controller, ControllerServer};
use csi_proto::v1::controller_service_capability::rpc::Type as CtrlCap;
use csi_proto::v1::group_controller_server::{GroupController, GroupControllerServer};
use csi_proto::v1::group_controller_service_capability::rpc::Type as GroupCap;
use csi_proto::v1::identity_server::{Identity, IdentityServer};
use csi_proto::v1::node_server::{Node, NodeServer};
use csi_proto::v1::node_service_capability::rpc::Type as NodeCap;
use csi_proto::v1::plugin_capability::service::Type as PluginCap;
use csi_proto::v1::plugin_capability::volume_expansion::Type as Expansion;
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::*;
use tonic::{Request, Response, Status};

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

type Result<T> = std::result::Result<Response<T>, Status>;

#[derive(Debug, Clone)]
struct Vol {
    name: String,
    capacity: i64,
    caps: Vec<VolumeCapability>,
    params: HashMap<String, String>,
    mutable: HashMap<String, String>,
    source: Option<VolumeContentSource>,
    context: HashMap<String, String>,
}

#[derive(Debug, Clone)]
struct Snap {
    name: String,
    snapshot: Snapshot,
}

#[derive(Debug, Clone)]
struct Grp {
    name: String,
    sources: Vec<String>,
    params: HashMap<String, String>,
    group: VolumeGroupSnapshot,
}

#[derive(Debug, Clone, PartialEq)]
struct PubArgs {
    cap: Option<VolumeCapability>,
    readonly: bool,
    staging: String,
    volume_context: HashMap<String, String>,
    publish_context: HashMap<String, String>,
}

#[derive(Debug, Default)]
struct State {
    seq: u64,
    volumes: BTreeMap<String, Vol>,
    snapshots: BTreeMap<String, Snap>,
    groups: BTreeMap<String, Grp>,
    controller_pubs: HashMap<(String, String), (Option<VolumeCapability>, bool)>,
    staged: HashMap<(String, String), Option<VolumeCapability>>,
    node_pubs: HashMap<String, (String, PubArgs)>,
}

impl State {
    fn next_id(&mut self, kind: &str) -> String {
        self.seq += 1;
        format!("mock-{kind}-{:08}", self.seq)
    }

    fn used(&self) -> i64 {
        self.volumes.values().map(|v| v.capacity).sum()
    }

    /// NOT_FOUND unless `volume_id` is published or staged at `path`.
    fn available_at(&self, volume_id: &str, path: &str) -> std::result::Result<(), Status> {
        let published = self
            .node_pubs
            .get(path)
            .is_some_and(|(id, _)| id == volume_id);
        let staged = self
            .staged
            .contains_key(&(volume_id.to_owned(), path.to_owned()));
        if published || staged {
            Ok(())
        } else {
            Err(Status::not_found(format!(
                "volume {volume_id} is not available at {path}"
            )))
        }
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

    fn log(&self, rpc: &str, req: &impl Debug, secrets: &HashMap<String, String>) {
        let Some(path) = &self.opts.log else { return };
        let mut line = format!("{rpc} {req:?}");
        if self.has(Fault::LeaksSecretsToLog) && !secrets.is_empty() {
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

    fn missing_volume(&self, id: &str) -> Status {
        if self.has(Fault::WrongCodeForMissingVolume) {
            Status::internal(format!("lookup of volume {id} failed"))
        } else {
            Status::not_found(format!("volume {id} does not exist"))
        }
    }

    /// Serves the driver on a unix socket in a fresh temporary directory,
    /// logging to `driver.log` beside it unless a log path was set.
    pub async fn serve(mut self) -> std::io::Result<MockServer> {
        let dir = tempfile::tempdir()?;
        let socket = dir.path().join("csi.sock");
        if self.opts.log.is_none() {
            self.opts_mut().log = Some(dir.path().join("driver.log"));
        }
        let log_path = self.opts.log.clone().unwrap_or_default();
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)?;
        let listener = tokio::net::UnixListener::bind(&socket)?;
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let strict = self.has(Fault::StrictAuthority);
        let router = tonic::transport::Server::builder()
            .add_service(IdentityServer::new(self.clone()))
            .add_service(ControllerServer::new(self.clone()))
            .add_service(NodeServer::new(self.clone()))
            .add_service(GroupControllerServer::new(self));
        let stop = async {
            let _ = rx.await;
        };
        let task = tokio::spawn(async move {
            let _ = if strict {
                router.serve_with_incoming_shutdown(incoming, stop).await
            } else {
                let incoming = incoming.map_ok(csi_server::authority::AnyAuthority::new);
                router.serve_with_incoming_shutdown(incoming, stop).await
            };
        });
        Ok(MockServer {
            endpoint: format!("unix://{}", socket.display()),
            log_path,
            shutdown: Some(tx),
            task: Some(task),
            _dir: dir,
        })
    }
}

/// A running [`MockDriver`]; stops when shut down or dropped.
#[derive(Debug)]
pub struct MockServer {
    endpoint: String,
    log_path: PathBuf,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl MockServer {
    /// The `unix://` endpoint to connect to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The driver's log file.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Stops serving and waits for the server task to end.
    pub async fn shutdown(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for MockServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

fn invalid(msg: impl Into<String>) -> Status {
    Status::invalid_argument(msg.into())
}

fn check_caps(caps: &[VolumeCapability]) -> std::result::Result<(), Status> {
    for c in caps {
        if c.access_type.is_none() {
            return Err(invalid("volume_capability.access_type is required"));
        }
        if c.access_mode() == Mode::Unknown {
            return Err(invalid("volume_capability.access_mode is required"));
        }
    }
    Ok(())
}

/// NOT_FOUND: a relative path cannot hold a volume.
fn absolute_volume_path(path: &str, relative_invalid: bool) -> std::result::Result<(), Status> {
    match (path.starts_with('/'), relative_invalid) {
        (true, _) => Ok(()),
        (false, true) => Err(invalid("volume_path must be absolute")),
        (false, false) => Err(Status::not_found(format!(
            "volume_path {path:?} names no volume"
        ))),
    }
}

fn require(value: &str, field: &str) -> std::result::Result<(), Status> {
    if value.is_empty() {
        Err(invalid(format!("{field} is required")))
    } else {
        Ok(())
    }
}

/// One page of `items` for `max_entries`/`starting_token`; the token is the
/// index of the next item.
fn page<T: Clone>(
    items: &[T],
    max_entries: i32,
    token: &str,
    no_paging: bool,
) -> std::result::Result<(Vec<T>, String), Status> {
    if max_entries < 0 {
        return Err(invalid("max_entries must not be negative"));
    }
    let start: usize = if token.is_empty() {
        0
    } else {
        match token.parse::<usize>() {
            Ok(n) if n <= items.len() => n,
            _ => {
                return Err(Status::aborted(format!(
                    "starting_token {token:?} is not valid"
                )));
            }
        }
    };
    if no_paging || max_entries == 0 {
        return Ok((items[start..].to_vec(), String::new()));
    }
    let end = (start + max_entries as usize).min(items.len());
    let next = if end < items.len() {
        end.to_string()
    } else {
        String::new()
    };
    Ok((items[start..end].to_vec(), next))
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

impl MockDriver {
    /// INVALID_ARGUMENT naming the first key the mock does not accept.
    fn check_mutable(&self, params: &HashMap<String, String>) -> std::result::Result<(), Status> {
        if self.has(Fault::AcceptsAnyMutableParameter) {
            return Ok(());
        }
        match params
            .keys()
            .filter(|k| !ACCEPTED_MUTABLE_PARAMETERS.contains(&k.as_str()))
            .min()
        {
            Some(k) => Err(invalid(format!(
                "mutable_parameters[{k:?}]: not accepted (accepted: {})",
                ACCEPTED_MUTABLE_PARAMETERS.join(", ")
            ))),
            None => Ok(()),
        }
    }

    fn volume(&self, id: &str, v: &Vol) -> Volume {
        Volume {
            capacity_bytes: v.capacity,
            volume_id: id.to_string(),
            volume_context: v.context.clone(),
            content_source: v.source.clone(),
            accessible_topology: vec![],
        }
    }
}

#[tonic::async_trait]
impl Identity for MockDriver {
    async fn get_plugin_info(
        &self,
        _r: Request<GetPluginInfoRequest>,
    ) -> Result<GetPluginInfoResponse> {
        Ok(Response::new(GetPluginInfoResponse {
            name: self.opts.name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: HashMap::new(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _r: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<GetPluginCapabilitiesResponse> {
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities: vec![
                PluginCap::ControllerService.into(),
                PluginCap::GroupControllerService.into(),
                Expansion::Online.into(),
            ],
        }))
    }

    async fn probe(&self, _r: Request<ProbeRequest>) -> Result<ProbeResponse> {
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}

#[tonic::async_trait]
impl Controller for MockDriver {
    async fn create_volume(&self, r: Request<CreateVolumeRequest>) -> Result<CreateVolumeResponse> {
        let req = r.into_inner();
        self.log("CreateVolume", &req, &req.secrets);
        require(&req.name, "name")?;
        if req.volume_capabilities.is_empty() {
            return Err(invalid("volume_capabilities is required"));
        }
        check_caps(&req.volume_capabilities)?;
        self.check_mutable(&req.mutable_parameters)?;
        let range = req.capacity_range.unwrap_or_default();
        if range.required_bytes < 0 || range.limit_bytes < 0 {
            return Err(invalid("capacity_range must not be negative"));
        }
        if range.limit_bytes > 0 && range.required_bytes > range.limit_bytes {
            return Err(Status::out_of_range("required_bytes exceeds limit_bytes"));
        }
        let mut st = self.lock();
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
                        Status::not_found(format!("snapshot {} does not exist", s.snapshot_id))
                    })?,
            ),
            Some(volume_content_source::Type::Volume(v)) => Some(
                st.volumes
                    .get(&v.volume_id)
                    .map(|v| v.capacity)
                    .ok_or_else(|| {
                        Status::not_found(format!("volume {} does not exist", v.volume_id))
                    })?,
            ),
            None => None,
        };
        let mut size = if range.required_bytes > 0 {
            range.required_bytes
        } else if range.limit_bytes > 0 {
            range.limit_bytes
        } else {
            csi_proto::size::GIB
        };
        if let Some(src) = source_size {
            if range.limit_bytes > 0 && src > range.limit_bytes {
                return Err(Status::out_of_range(
                    "the source is larger than limit_bytes",
                ));
            }
            size = size.max(src);
        }
        if !self.has(Fault::NotIdempotentCreate) {
            if let Some((id, v)) = st.volumes.iter().find(|(_, v)| v.name == req.name) {
                let fits = v.capacity >= range.required_bytes
                    && (range.limit_bytes == 0 || v.capacity <= range.limit_bytes);
                if fits
                    && v.caps == req.volume_capabilities
                    && v.params == req.parameters
                    && v.source == req.volume_content_source
                {
                    return Ok(Response::new(CreateVolumeResponse {
                        volume: Some(self.volume(id, v)),
                    }));
                }
                return Err(Status::already_exists(format!(
                    "volume {} exists with incompatible arguments",
                    req.name
                )));
            }
        }
        if st.used() + size > self.opts.total_capacity {
            return Err(Status::resource_exhausted("out of capacity"));
        }
        let id = st.next_id("vol");
        let vol = Vol {
            name: req.name.clone(),
            capacity: size,
            caps: req.volume_capabilities,
            params: req.parameters,
            mutable: req.mutable_parameters,
            source: req.volume_content_source,
            context: [("mock/name".to_string(), req.name)].into(),
        };
        let out = self.volume(&id, &vol);
        st.volumes.insert(id, vol);
        Ok(Response::new(CreateVolumeResponse { volume: Some(out) }))
    }

    async fn delete_volume(&self, r: Request<DeleteVolumeRequest>) -> Result<DeleteVolumeResponse> {
        let req = r.into_inner();
        self.log("DeleteVolume", &req, &req.secrets);
        require(&req.volume_id, "volume_id")?;
        let mut st = self.lock();
        let in_use = st.controller_pubs.keys().any(|(v, _)| *v == req.volume_id)
            || st.staged.keys().any(|(v, _)| *v == req.volume_id)
            || st.node_pubs.values().any(|(v, _)| *v == req.volume_id);
        if in_use {
            return Err(Status::failed_precondition(format!(
                "volume {} is in use",
                req.volume_id
            )));
        }
        st.volumes.remove(&req.volume_id);
        Ok(Response::new(DeleteVolumeResponse {}))
    }

    async fn controller_publish_volume(
        &self,
        r: Request<ControllerPublishVolumeRequest>,
    ) -> Result<ControllerPublishVolumeResponse> {
        let req = r.into_inner();
        self.log("ControllerPublishVolume", &req, &req.secrets);
        require(&req.volume_id, "volume_id")?;
        require(&req.node_id, "node_id")?;
        let cap = req
            .volume_capability
            .clone()
            .ok_or_else(|| invalid("volume_capability is required"))?;
        check_caps(std::slice::from_ref(&cap))?;
        let mut st = self.lock();
        if !st.volumes.contains_key(&req.volume_id) {
            return Err(self.missing_volume(&req.volume_id));
        }
        if req.node_id != self.opts.node_id {
            return Err(Status::not_found(format!(
                "node {} does not exist",
                req.node_id
            )));
        }
        let key = (req.volume_id.clone(), req.node_id);
        let args = (req.volume_capability, req.readonly);
        let attached = st
            .controller_pubs
            .keys()
            .filter(|(_, n)| *n == key.1)
            .count() as i64;
        if !st.controller_pubs.contains_key(&key)
            && attached >= MAX_VOLUMES_PER_NODE
            && !self.has(Fault::NoAttachLimit)
        {
            return Err(Status::resource_exhausted(format!(
                "node {} has {MAX_VOLUMES_PER_NODE} volumes attached",
                key.1
            )));
        }
        match st.controller_pubs.get(&key) {
            Some(existing) if *existing != args => {
                return Err(Status::already_exists(
                    "published to the node with other arguments",
                ));
            }
            _ => {
                st.controller_pubs.insert(key, args);
            }
        }
        Ok(Response::new(ControllerPublishVolumeResponse {
            publish_context: [(
                "mock/device".to_string(),
                format!("/dev/mock/{}", req.volume_id),
            )]
            .into(),
        }))
    }

    async fn controller_unpublish_volume(
        &self,
        r: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<ControllerUnpublishVolumeResponse> {
        let req = r.into_inner();
        self.log("ControllerUnpublishVolume", &req, &req.secrets);
        require(&req.volume_id, "volume_id")?;
        let mut st = self.lock();
        st.controller_pubs.retain(|(v, n), _| {
            !(*v == req.volume_id && (req.node_id.is_empty() || *n == req.node_id))
        });
        Ok(Response::new(ControllerUnpublishVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        r: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<ValidateVolumeCapabilitiesResponse> {
        let req = r.into_inner();
        self.log("ValidateVolumeCapabilities", &req, &req.secrets);
        require(&req.volume_id, "volume_id")?;
        if req.volume_capabilities.is_empty() {
            return Err(invalid("volume_capabilities is required"));
        }
        check_caps(&req.volume_capabilities)?;
        let st = self.lock();
        let v = st
            .volumes
            .get(&req.volume_id)
            .ok_or_else(|| self.missing_volume(&req.volume_id))?;
        let block = v.caps.first().is_some_and(|c| c.is_block());
        if req
            .volume_capabilities
            .iter()
            .any(|c| c.is_block() != block)
        {
            return Ok(Response::new(ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: "the access type differs from the volume's".into(),
            }));
        }
        Ok(Response::new(ValidateVolumeCapabilitiesResponse {
            confirmed: Some(validate_volume_capabilities_response::Confirmed {
                volume_context: req.volume_context,
                volume_capabilities: req.volume_capabilities,
                parameters: req.parameters,
                mutable_parameters: req.mutable_parameters,
            }),
            message: String::new(),
        }))
    }

    async fn list_volumes(&self, r: Request<ListVolumesRequest>) -> Result<ListVolumesResponse> {
        let req = r.into_inner();
        self.log("ListVolumes", &req, &HashMap::new());
        let st = self.lock();
        let all: Vec<list_volumes_response::Entry> = st
            .volumes
            .iter()
            .map(|(id, v)| list_volumes_response::Entry {
                volume: Some(self.volume(id, v)),
                status: Some(list_volumes_response::VolumeStatus {
                    published_node_ids: st
                        .controller_pubs
                        .keys()
                        .filter(|(v, _)| v == id)
                        .map(|(_, n)| n.clone())
                        .collect(),
                    volume_condition: None,
                }),
            })
            .collect();
        let (entries, next_token) = page(
            &all,
            req.max_entries,
            &req.starting_token,
            self.has(Fault::NoPaging),
        )?;
        Ok(Response::new(ListVolumesResponse {
            entries,
            next_token,
        }))
    }

    async fn get_capacity(&self, r: Request<GetCapacityRequest>) -> Result<GetCapacityResponse> {
        let req = r.into_inner();
        self.log("GetCapacity", &req, &HashMap::new());
        check_caps(&req.volume_capabilities)?;
        let available = self.opts.total_capacity - self.lock().used();
        Ok(Response::new(GetCapacityResponse {
            available_capacity: available,
            maximum_volume_size: Some(available),
            minimum_volume_size: None,
        }))
    }

    async fn controller_get_capabilities(
        &self,
        _r: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<ControllerGetCapabilitiesResponse> {
        let caps = [
            CtrlCap::CreateDeleteVolume,
            CtrlCap::PublishUnpublishVolume,
            CtrlCap::ListVolumes,
            CtrlCap::GetCapacity,
            CtrlCap::CreateDeleteSnapshot,
            CtrlCap::ListSnapshots,
            CtrlCap::CloneVolume,
            CtrlCap::PublishReadonly,
            CtrlCap::ExpandVolume,
            CtrlCap::ListVolumesPublishedNodes,
            CtrlCap::GetVolume,
            CtrlCap::SingleNodeMultiWriter,
            CtrlCap::ModifyVolume,
            CtrlCap::GetSnapshot,
        ];
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities: caps.into_iter().map(Into::into).collect(),
        }))
    }

    async fn create_snapshot(
        &self,
        r: Request<CreateSnapshotRequest>,
    ) -> Result<CreateSnapshotResponse> {
        let req = r.into_inner();
        self.log("CreateSnapshot", &req, &req.secrets);
        require(&req.name, "name")?;
        require(&req.source_volume_id, "source_volume_id")?;
        let mut st = self.lock();
        if let Some(s) = st.snapshots.values().find(|s| s.name == req.name) {
            if s.snapshot.source_volume_id == req.source_volume_id {
                return Ok(Response::new(CreateSnapshotResponse {
                    snapshot: Some(s.snapshot.clone()),
                }));
            }
            return Err(Status::already_exists(format!(
                "snapshot {} exists with another source",
                req.name
            )));
        }
        let size = st
            .volumes
            .get(&req.source_volume_id)
            .map(|v| v.capacity)
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
                snapshot: snapshot.clone(),
            },
        );
        Ok(Response::new(CreateSnapshotResponse {
            snapshot: Some(snapshot),
        }))
    }

    async fn delete_snapshot(
        &self,
        r: Request<DeleteSnapshotRequest>,
    ) -> Result<DeleteSnapshotResponse> {
        let req = r.into_inner();
        self.log("DeleteSnapshot", &req, &req.secrets);
        require(&req.snapshot_id, "snapshot_id")?;
        let mut st = self.lock();
        if st
            .snapshots
            .get(&req.snapshot_id)
            .is_some_and(|s| !s.snapshot.group_snapshot_id.is_empty())
        {
            return Err(invalid(
                "the snapshot belongs to a group; delete the group snapshot",
            ));
        }
        st.snapshots.remove(&req.snapshot_id);
        Ok(Response::new(DeleteSnapshotResponse {}))
    }

    async fn list_snapshots(
        &self,
        r: Request<ListSnapshotsRequest>,
    ) -> Result<ListSnapshotsResponse> {
        let req = r.into_inner();
        self.log("ListSnapshots", &req, &req.secrets);
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
        let (entries, next_token) = page(
            &all,
            req.max_entries,
            &req.starting_token,
            self.has(Fault::NoPaging),
        )?;
        Ok(Response::new(ListSnapshotsResponse {
            entries,
            next_token,
        }))
    }

    async fn get_snapshot(&self, r: Request<GetSnapshotRequest>) -> Result<GetSnapshotResponse> {
        let req = r.into_inner();
        self.log("GetSnapshot", &req, &req.secrets);
        require(&req.snapshot_id, "snapshot_id")?;
        let st = self.lock();
        let s = st.snapshots.get(&req.snapshot_id).ok_or_else(|| {
            Status::not_found(format!("snapshot {} does not exist", req.snapshot_id))
        })?;
        Ok(Response::new(GetSnapshotResponse {
            snapshot: Some(s.snapshot.clone()),
        }))
    }

    async fn controller_expand_volume(
        &self,
        r: Request<ControllerExpandVolumeRequest>,
    ) -> Result<ControllerExpandVolumeResponse> {
        let req = r.into_inner();
        self.log("ControllerExpandVolume", &req, &req.secrets);
        require(&req.volume_id, "volume_id")?;
        let range = req
            .capacity_range
            .ok_or_else(|| invalid("capacity_range is required"))?;
        let mut st = self.lock();
        let v = st
            .volumes
            .get_mut(&req.volume_id)
            .ok_or_else(|| self.missing_volume(&req.volume_id))?;
        if range.limit_bytes > 0 && v.capacity > range.limit_bytes {
            return Err(Status::out_of_range(
                "the volume is already larger than limit_bytes",
            ));
        }
        v.capacity = v.capacity.max(range.required_bytes);
        let block = v.caps.first().is_some_and(|c| c.is_block());
        Ok(Response::new(ControllerExpandVolumeResponse {
            capacity_bytes: v.capacity,
            node_expansion_required: !block,
        }))
    }

    async fn controller_get_volume(
        &self,
        r: Request<ControllerGetVolumeRequest>,
    ) -> Result<ControllerGetVolumeResponse> {
        let req = r.into_inner();
        self.log("ControllerGetVolume", &req, &HashMap::new());
        require(&req.volume_id, "volume_id")?;
        let st = self.lock();
        let v = st
            .volumes
            .get(&req.volume_id)
            .ok_or_else(|| self.missing_volume(&req.volume_id))?;
        Ok(Response::new(ControllerGetVolumeResponse {
            volume: Some(self.volume(&req.volume_id, v)),
            status: Some(controller_get_volume_response::VolumeStatus {
                published_node_ids: st
                    .controller_pubs
                    .keys()
                    .filter(|(v, _)| *v == req.volume_id)
                    .map(|(_, n)| n.clone())
                    .collect(),
                volume_condition: None,
            }),
        }))
    }

    async fn controller_modify_volume(
        &self,
        r: Request<ControllerModifyVolumeRequest>,
    ) -> Result<ControllerModifyVolumeResponse> {
        let req = r.into_inner();
        self.log("ControllerModifyVolume", &req, &req.secrets);
        require(&req.volume_id, "volume_id")?;
        // Empty is "modify nothing" (proto3 cannot tell it from absent).
        if req.mutable_parameters.is_empty() && self.has(Fault::RequiresMutableParameters) {
            return Err(invalid("mutable_parameters is required"));
        }
        // Every key before any change: INVALID_ARGUMENT means nothing applied.
        self.check_mutable(&req.mutable_parameters)?;
        let mut st = self.lock();
        let v = st
            .volumes
            .get_mut(&req.volume_id)
            .ok_or_else(|| self.missing_volume(&req.volume_id))?;
        v.mutable.extend(req.mutable_parameters);
        Ok(Response::new(ControllerModifyVolumeResponse {}))
    }
}

/// Whether a volume published with `cap` may be published at more targets.
fn shared(cap: &Option<VolumeCapability>) -> bool {
    let mode = cap
        .as_ref()
        .map(|c| c.access_mode())
        .unwrap_or(Mode::Unknown);
    mode.is_multi_node() || mode == Mode::SingleNodeMultiWriter
}

#[tonic::async_trait]
impl Node for MockDriver {
    async fn node_stage_volume(
        &self,
        r: Request<NodeStageVolumeRequest>,
    ) -> Result<NodeStageVolumeResponse> {
        let req = r.into_inner();
        self.log("NodeStageVolume", &req, &req.secrets);
        if !self.opts.stage_unstage {
            return Err(Status::unimplemented(
                "STAGE_UNSTAGE_VOLUME is not advertised",
            ));
        }
        require(&req.volume_id, "volume_id")?;
        require(&req.staging_target_path, "staging_target_path")?;
        let cap = req
            .volume_capability
            .clone()
            .ok_or_else(|| invalid("volume_capability is required"))?;
        check_caps(std::slice::from_ref(&cap))?;
        let mut st = self.lock();
        if !st.volumes.contains_key(&req.volume_id) {
            return Err(self.missing_volume(&req.volume_id));
        }
        let key = (req.volume_id, req.staging_target_path);
        match st.staged.get(&key) {
            Some(existing) if *existing != req.volume_capability => Err(Status::already_exists(
                "staged at this path with another capability",
            )),
            _ => {
                st.staged.insert(key, req.volume_capability);
                Ok(Response::new(NodeStageVolumeResponse {}))
            }
        }
    }

    async fn node_unstage_volume(
        &self,
        r: Request<NodeUnstageVolumeRequest>,
    ) -> Result<NodeUnstageVolumeResponse> {
        let req = r.into_inner();
        self.log("NodeUnstageVolume", &req, &HashMap::new());
        if !self.opts.stage_unstage {
            return Err(Status::unimplemented(
                "STAGE_UNSTAGE_VOLUME is not advertised",
            ));
        }
        require(&req.volume_id, "volume_id")?;
        require(&req.staging_target_path, "staging_target_path")?;
        let mut st = self.lock();
        let key = (req.volume_id.clone(), req.staging_target_path);
        if st.staged.remove(&key).is_none() && !st.volumes.contains_key(&req.volume_id) {
            return Err(self.missing_volume(&req.volume_id));
        }
        Ok(Response::new(NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        r: Request<NodePublishVolumeRequest>,
    ) -> Result<NodePublishVolumeResponse> {
        let req = r.into_inner();
        self.log("NodePublishVolume", &req, &req.secrets);
        if self.has(Fault::StagingCheckedFirst)
            && self.opts.stage_unstage
            && req.staging_target_path.is_empty()
        {
            return Err(Status::failed_precondition(
                "STAGE_UNSTAGE_VOLUME is advertised: staging_target_path is required",
            ));
        }
        require(&req.volume_id, "volume_id")?;
        require(&req.target_path, "target_path")?;
        let cap = req
            .volume_capability
            .clone()
            .ok_or_else(|| invalid("volume_capability is required"))?;
        check_caps(std::slice::from_ref(&cap))?;
        if self.opts.stage_unstage && req.staging_target_path.is_empty() {
            return Err(Status::failed_precondition(
                "STAGE_UNSTAGE_VOLUME is advertised: staging_target_path is required",
            ));
        }
        let mut st = self.lock();
        if !st.volumes.contains_key(&req.volume_id) {
            return Err(self.missing_volume(&req.volume_id));
        }
        if self.opts.stage_unstage
            && !st
                .staged
                .contains_key(&(req.volume_id.clone(), req.staging_target_path.clone()))
        {
            return Err(Status::failed_precondition(
                "the volume is not staged at staging_target_path",
            ));
        }
        let args = PubArgs {
            cap: req.volume_capability.clone(),
            readonly: req.readonly,
            staging: req.staging_target_path.clone(),
            volume_context: req.volume_context.clone(),
            publish_context: req.publish_context.clone(),
        };
        if let Some((vol, existing)) = st.node_pubs.get(&req.target_path) {
            if *vol == req.volume_id && *existing == args {
                return Ok(Response::new(NodePublishVolumeResponse {}));
            }
            return Err(Status::already_exists(format!(
                "{} is published with other arguments",
                req.target_path
            )));
        }
        let elsewhere = st.node_pubs.values().any(|(v, _)| *v == req.volume_id);
        if elsewhere && !shared(&args.cap) && !self.has(Fault::NoRepeatTable) {
            return Err(Status::failed_precondition(format!(
                "volume {} is already published at another target and its access mode is single-node",
                req.volume_id
            )));
        }
        let target = Path::new(&req.target_path);
        let created = if cap.is_block() {
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(target)
                .map(drop)
        } else {
            std::fs::create_dir(target).or_else(|e| if target.is_dir() { Ok(()) } else { Err(e) })
        };
        created.map_err(|e| Status::internal(format!("cannot create {}: {e}", req.target_path)))?;
        st.node_pubs.insert(req.target_path, (req.volume_id, args));
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        r: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<NodeUnpublishVolumeResponse> {
        let req = r.into_inner();
        self.log("NodeUnpublishVolume", &req, &HashMap::new());
        require(&req.volume_id, "volume_id")?;
        require(&req.target_path, "target_path")?;
        let mut st = self.lock();
        match st.node_pubs.get(&req.target_path) {
            Some((vol, _)) if *vol == req.volume_id => {
                st.node_pubs.remove(&req.target_path);
                if !self.has(Fault::NoTargetCleanup) {
                    let p = Path::new(&req.target_path);
                    let removed = if p.is_dir() {
                        std::fs::remove_dir(p)
                    } else {
                        std::fs::remove_file(p)
                    };
                    removed.map_err(|e| {
                        Status::internal(format!("cannot remove {}: {e}", req.target_path))
                    })?;
                }
            }
            _ if !st.volumes.contains_key(&req.volume_id) => {
                return Err(self.missing_volume(&req.volume_id));
            }
            _ => {}
        }
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        r: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<NodeGetVolumeStatsResponse> {
        let req = r.into_inner();
        self.log("NodeGetVolumeStats", &req, &HashMap::new());
        require(&req.volume_id, "volume_id")?;
        require(&req.volume_path, "volume_path")?;
        absolute_volume_path(&req.volume_path, self.has(Fault::RelativeVolumePathInvalid))?;
        let st = self.lock();
        let v = st
            .volumes
            .get(&req.volume_id)
            .ok_or_else(|| self.missing_volume(&req.volume_id))?;
        st.available_at(&req.volume_id, &req.volume_path)?;
        let mut usage = vec![VolumeUsage {
            available: v.capacity,
            total: v.capacity,
            used: 0,
            unit: volume_usage::Unit::Bytes as i32,
        }];
        if !v.caps.first().is_some_and(|c| c.is_block()) {
            usage.push(VolumeUsage {
                available: 1 << 20,
                total: 1 << 20,
                used: 0,
                unit: volume_usage::Unit::Inodes as i32,
            });
        }
        Ok(Response::new(NodeGetVolumeStatsResponse {
            usage,
            volume_condition: None,
        }))
    }

    async fn node_expand_volume(
        &self,
        r: Request<NodeExpandVolumeRequest>,
    ) -> Result<NodeExpandVolumeResponse> {
        let req = r.into_inner();
        self.log("NodeExpandVolume", &req, &req.secrets);
        require(&req.volume_id, "volume_id")?;
        require(&req.volume_path, "volume_path")?;
        absolute_volume_path(&req.volume_path, self.has(Fault::RelativeVolumePathInvalid))?;
        let st = self.lock();
        let v = st
            .volumes
            .get(&req.volume_id)
            .ok_or_else(|| self.missing_volume(&req.volume_id))?;
        st.available_at(&req.volume_id, &req.volume_path)?;
        let required = req.capacity_range.map(|c| c.required_bytes).unwrap_or(0);
        Ok(Response::new(NodeExpandVolumeResponse {
            capacity_bytes: v.capacity.max(required),
        }))
    }

    async fn node_get_capabilities(
        &self,
        _r: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<NodeGetCapabilitiesResponse> {
        let mut caps = vec![
            NodeCap::GetVolumeStats,
            NodeCap::ExpandVolume,
            NodeCap::SingleNodeMultiWriter,
        ];
        if self.opts.stage_unstage {
            caps.push(NodeCap::StageUnstageVolume);
        }
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: caps.into_iter().map(Into::into).collect(),
        }))
    }

    async fn node_get_info(&self, _r: Request<NodeGetInfoRequest>) -> Result<NodeGetInfoResponse> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.opts.node_id.clone(),
            max_volumes_per_node: MAX_VOLUMES_PER_NODE,
            accessible_topology: None,
        }))
    }
}

#[tonic::async_trait]
impl GroupController for MockDriver {
    async fn group_controller_get_capabilities(
        &self,
        _r: Request<GroupControllerGetCapabilitiesRequest>,
    ) -> Result<GroupControllerGetCapabilitiesResponse> {
        Ok(Response::new(GroupControllerGetCapabilitiesResponse {
            capabilities: vec![GroupCap::CreateDeleteGetVolumeGroupSnapshot.into()],
        }))
    }

    async fn create_volume_group_snapshot(
        &self,
        r: Request<CreateVolumeGroupSnapshotRequest>,
    ) -> Result<CreateVolumeGroupSnapshotResponse> {
        let req = r.into_inner();
        self.log("CreateVolumeGroupSnapshot", &req, &req.secrets);
        require(&req.name, "name")?;
        if req.source_volume_ids.is_empty() {
            return Err(invalid("source_volume_ids is required"));
        }
        let mut sources = req.source_volume_ids.clone();
        sources.sort();
        let mut st = self.lock();
        if let Some(g) = st.groups.values().find(|g| g.name == req.name) {
            if g.sources == sources && g.params == req.parameters {
                return Ok(Response::new(CreateVolumeGroupSnapshotResponse {
                    group_snapshot: Some(g.group.clone()),
                }));
            }
            return Err(Status::already_exists(format!(
                "group snapshot {} exists with other sources",
                req.name
            )));
        }
        for id in &sources {
            if !st.volumes.contains_key(id) {
                return Err(self.missing_volume(id));
            }
        }
        let gid = st.next_id("group");
        let time = now();
        let mut snapshots = Vec::new();
        for src in &sources {
            let sid = st.next_id("snap");
            let snapshot = Snapshot {
                size_bytes: st.volumes[src].capacity,
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
        Ok(Response::new(CreateVolumeGroupSnapshotResponse {
            group_snapshot: Some(group),
        }))
    }

    async fn delete_volume_group_snapshot(
        &self,
        r: Request<DeleteVolumeGroupSnapshotRequest>,
    ) -> Result<DeleteVolumeGroupSnapshotResponse> {
        let req = r.into_inner();
        self.log("DeleteVolumeGroupSnapshot", &req, &req.secrets);
        require(&req.group_snapshot_id, "group_snapshot_id")?;
        if req.snapshot_ids.is_empty() && self.has(Fault::RequiresSnapshotIds) {
            return Err(invalid("snapshot_ids: required"));
        }
        let mut st = self.lock();
        let Some(g) = st.groups.get(&req.group_snapshot_id) else {
            return Ok(Response::new(DeleteVolumeGroupSnapshotResponse {}));
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
            return Err(invalid("snapshot_ids do not match the group snapshot"));
        }
        st.snapshots.retain(|id, _| !members.contains(id));
        st.groups.remove(&req.group_snapshot_id);
        Ok(Response::new(DeleteVolumeGroupSnapshotResponse {}))
    }

    async fn get_volume_group_snapshot(
        &self,
        r: Request<GetVolumeGroupSnapshotRequest>,
    ) -> Result<GetVolumeGroupSnapshotResponse> {
        let req = r.into_inner();
        self.log("GetVolumeGroupSnapshot", &req, &req.secrets);
        require(&req.group_snapshot_id, "group_snapshot_id")?;
        if req.snapshot_ids.is_empty() && self.has(Fault::RequiresSnapshotIds) {
            return Err(invalid("snapshot_ids: required"));
        }
        let st = self.lock();
        let g = st.groups.get(&req.group_snapshot_id).ok_or_else(|| {
            Status::not_found(format!(
                "group snapshot {} does not exist",
                req.group_snapshot_id
            ))
        })?;
        let members: HashSet<&String> = g.group.snapshots.iter().map(|s| &s.snapshot_id).collect();
        if !req.snapshot_ids.is_empty()
            && req.snapshot_ids.iter().collect::<HashSet<_>>() != members
        {
            return Err(invalid("snapshot_ids do not match the group snapshot"));
        }
        Ok(Response::new(GetVolumeGroupSnapshotResponse {
            group_snapshot: Some(g.group.clone()),
        }))
    }
}
