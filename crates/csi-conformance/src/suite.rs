//! The runner: discovers capabilities, runs each check with its own cleanup
//! registry and collects a [`Report`].

use std::collections::HashMap;
use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::time::Instant;

use csi_client::{ClientOptions, CsiClient, Endpoint, UnaryRequest};
use csi_proto::methods::Service;
use csi_proto::v1::controller_service_capability::rpc::Type as CtrlCap;
use csi_proto::v1::group_controller_service_capability::rpc::Type as GroupCap;
use csi_proto::v1::node_service_capability::rpc::Type as NodeCap;
use csi_proto::v1::plugin_capability::service::Type as PluginCap;
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::*;
use futures::future::BoxFuture;
use tonic::{Code, Status as GrpcStatus};

use crate::config::{SecretKind, SuiteAccessType, SuiteConfig, pattern_matches};
use crate::report::{CheckResult, Failure, Group, Report, Status};

/// Why the suite could not run at all (as opposed to a check failing).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The endpoint is malformed or unreachable.
    #[error(transparent)]
    Connect(#[from] csi_client::ConnectError),
    /// The staging or target parent directory is unusable.
    #[error("cannot prepare {path}: {source}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// Metadata of one check, as listed by [`Suite::checks`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckInfo {
    /// Stable id, usable in [`SuiteConfig::skip`].
    pub id: &'static str,
    /// The group, also usable in [`SuiteConfig::skip`].
    pub group: Group,
    /// What the check verifies.
    pub description: &'static str,
}

pub(crate) type CheckFn = for<'a> fn(&'a mut Ctx) -> BoxFuture<'a, Outcome>;

pub(crate) struct Check {
    pub info: CheckInfo,
    pub run: CheckFn,
}

/// How a check body ends early: a broken rule or a reason to skip.
#[derive(Debug)]
pub(crate) enum Stop {
    Fail(Box<Failure>),
    Skip(String),
}

pub(crate) type Outcome<T = ()> = Result<T, Stop>;

pub(crate) fn fail<T>(message: impl Into<String>) -> Outcome<T> {
    Err(Stop::Fail(Box::new(Failure::new(message))))
}

pub(crate) fn skip<T>(reason: impl Into<String>) -> Outcome<T> {
    Err(Stop::Skip(reason.into()))
}

pub use csi_proto::code_name;

/// The answer to one RPC, kept with the redacted request for failure reports.
pub(crate) struct Call<T> {
    pub rpc: &'static str,
    pub request: String,
    pub result: Result<T, GrpcStatus>,
}

fn describe(result: &Result<impl Sized, GrpcStatus>) -> String {
    match result {
        Ok(_) => "OK".to_string(),
        Err(s) => format!("{}: {}", code_name(s.code()), s.message()),
    }
}

impl<T> Call<T> {
    pub fn failure(&self, expected: impl Into<String>, message: impl Into<String>) -> Stop {
        Stop::Fail(Box::new(Failure {
            rpc: Some(self.rpc.to_string()),
            request: Some(self.request.clone()),
            expected: Some(expected.into()),
            actual: Some(describe(&self.result)),
            message: message.into(),
        }))
    }

    /// A failure about the content of a successful answer.
    pub fn bad(&self, message: impl Into<String>) -> Stop {
        Stop::Fail(Box::new(Failure {
            rpc: Some(self.rpc.to_string()),
            request: Some(self.request.clone()),
            expected: None,
            actual: None,
            message: message.into(),
        }))
    }

    /// The answer, or a failure expecting OK.
    pub fn value(&self) -> Outcome<&T> {
        match &self.result {
            Ok(v) => Ok(v),
            Err(_) => Err(self.failure("OK", "the call must succeed")),
        }
    }

    /// Fails with `message` unless `cond` holds.
    pub fn ensure(&self, cond: bool, message: impl Into<String>) -> Outcome {
        if cond { Ok(()) } else { Err(self.bad(message)) }
    }

    /// Requires OK.
    pub fn ok(self) -> Outcome<T> {
        match self.result {
            Ok(v) => Ok(v),
            Err(_) => Err(self.failure("OK", "the call must succeed")),
        }
    }

    /// Requires one of `codes`, a non-empty message and empty details (the
    /// spec's error scheme); `Code::Ok` in `codes` accepts success.
    pub fn code_in(self, codes: &[Code], why: &str) -> Outcome<Result<T, GrpcStatus>> {
        let expected = codes
            .iter()
            .map(|c| code_name(*c))
            .collect::<Vec<_>>()
            .join(" or ");
        let actual = match &self.result {
            Ok(_) => Code::Ok,
            Err(s) => s.code(),
        };
        if !codes.contains(&actual) {
            return Err(self.failure(expected, why));
        }
        if let Err(s) = &self.result {
            if s.message().trim().is_empty() {
                return Err(self.failure(
                    expected,
                    "status.message must be human-readable when the code is not OK",
                ));
            }
            if !s.details().is_empty() {
                return Err(self.failure(expected, "status.details must be empty"));
            }
        }
        Ok(self.result)
    }

    /// Like [`code_in`](Self::code_in), when the answer itself is not needed.
    pub fn expect(self, codes: &[Code], why: &str) -> Outcome {
        self.code_in(codes, why).map(drop)
    }

    /// Requires exactly `code` (not OK).
    pub fn code(self, code: Code, why: &str) -> Outcome<GrpcStatus> {
        match self.code_in(&[code], why)? {
            Err(s) => Ok(s),
            Ok(_) => unreachable!("code_in accepted OK although it was not listed"),
        }
    }
}

/// Something a check created that must be torn down afterwards.
#[derive(Debug, Clone)]
pub(crate) enum Resource {
    Volume(String),
    Snapshot(String),
    GroupSnapshot(String, Vec<String>),
    ControllerPublish { volume: String, node: String },
    Staged { volume: String, path: String },
    Published { volume: String, target: String },
    Dir(PathBuf),
}

/// What the driver advertised, fetched once per run.
#[derive(Debug, Clone, Default)]
pub(crate) struct Caps {
    pub plugin: Vec<PluginCap>,
    pub plugin_err: Option<String>,
    pub controller: Vec<CtrlCap>,
    pub controller_err: Option<String>,
    pub node: Vec<NodeCap>,
    pub node_err: Option<String>,
    pub group: Vec<GroupCap>,
    pub group_err: Option<String>,
    pub node_id: Option<String>,
    /// NodeGetInfo's max_volumes_per_node (0: none reported).
    pub max_volumes_per_node: i64,
}

/// State shared by a check body: the client, the config, what the driver
/// advertised and the cleanup registry.
pub(crate) struct Ctx {
    /// Identity, Controller and GroupController calls go here.
    pub controller: CsiClient,
    /// Node calls go here: the same connection unless the endpoints are split.
    pub node: CsiClient,
    pub config: SuiteConfig,
    pub caps: Caps,
    cleanup: Vec<Resource>,
    run_id: String,
    counter: u64,
    /// RPCs whose error message carried a secret value (already redacted).
    pub leaks: std::sync::Mutex<Vec<String>>,
    /// A secret value unique to the run that `general.secrets_not_in_errors`
    /// sends besides the configured secrets.
    pub marker: String,
}

impl Ctx {
    /// Sends one request to the endpoint serving its service, with the
    /// suite's per-call timeout; the answer keeps the RPC's name and the
    /// redacted request for failure reports.
    pub async fn rpc<Req: UnaryRequest>(&self, req: Req) -> Call<Req::Response> {
        let client = match Req::METHOD.service() {
            Service::Node => &self.node,
            _ => &self.controller,
        };
        self.rpc_on(client, req).await
    }

    /// [`rpc`](Self::rpc) on a chosen connection. An error message that
    /// carries a configured secret is recorded for
    /// `general.secrets_not_in_errors` and redacted, so no report repeats it.
    pub async fn rpc_on<Req: UnaryRequest>(
        &self,
        client: &CsiClient,
        req: Req,
    ) -> Call<Req::Response> {
        let rpc = Req::METHOD.name();
        let request = format!("{req:?}");
        let fut = client.call(req);
        let result = match tokio::time::timeout(self.config.timeouts.rpc, fut).await {
            Ok(r) => r,
            Err(_) => Err(GrpcStatus::deadline_exceeded(format!(
                "no answer within {:?}",
                self.config.timeouts.rpc
            ))),
        };
        let result = result.map_err(|s| self.redact(rpc, s));
        Call {
            rpc,
            request,
            result,
        }
    }

    fn redact(&self, rpc: &str, status: GrpcStatus) -> GrpcStatus {
        let markers = self.secret_values();
        if !markers
            .iter()
            .any(|m| status.message().contains(m.as_str()))
        {
            return status;
        }
        let mut message = status.message().to_string();
        for m in &markers {
            message = message.replace(m.as_str(), "<SECRET>");
        }
        let mut leaks = self.leaks.lock().unwrap_or_else(|e| e.into_inner());
        leaks.push(format!("{rpc} ({}): {message}", code_name(status.code())));
        GrpcStatus::with_details(status.code(), message, status.details().to_vec().into())
    }

    /// Every secret value the suite may send that is long enough to search
    /// for: the configured ones and the run's marker.
    pub fn secret_values(&self) -> Vec<String> {
        let mut values = self.config.secrets.log_markers();
        values.push(self.marker.clone());
        values
    }

    /// Whether the controller and node are served on different endpoints.
    pub fn is_split(&self) -> bool {
        self.config.controller_endpoint.is_some()
    }

    pub fn has_plugin(&self, cap: PluginCap) -> bool {
        self.caps.plugin.contains(&cap)
    }
    pub fn has_ctrl(&self, cap: CtrlCap) -> bool {
        self.caps.controller.contains(&cap)
    }
    pub fn has_node(&self, cap: NodeCap) -> bool {
        self.caps.node.contains(&cap)
    }

    /// Skips unless the controller advertises `cap`.
    pub fn need_ctrl(&self, cap: CtrlCap) -> Outcome {
        if let Some(e) = &self.caps.controller_err {
            return skip(format!("controller capabilities unavailable: {e}"));
        }
        if self.has_ctrl(cap) {
            Ok(())
        } else {
            skip(format!(
                "controller capability {} not advertised",
                cap.as_str_name()
            ))
        }
    }

    /// Skips unless the node service answered NodeGetCapabilities.
    pub fn need_node_service(&self) -> Outcome {
        match &self.caps.node_err {
            Some(e) => skip(format!("node service unavailable: {e}")),
            None => Ok(()),
        }
    }

    pub fn need_node(&self, cap: NodeCap) -> Outcome {
        self.need_node_service()?;
        if self.has_node(cap) {
            Ok(())
        } else {
            skip(format!(
                "node capability {} not advertised",
                cap.as_str_name()
            ))
        }
    }

    pub fn need_group(&self) -> Outcome {
        if !self.has_plugin(PluginCap::GroupControllerService) {
            return skip("plugin capability GROUP_CONTROLLER_SERVICE not advertised");
        }
        if let Some(e) = &self.caps.group_err {
            return fail(format!("GroupControllerGetCapabilities failed: {e}"));
        }
        if self
            .caps
            .group
            .contains(&GroupCap::CreateDeleteGetVolumeGroupSnapshot)
        {
            Ok(())
        } else {
            skip(
                "group controller capability CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT not advertised",
            )
        }
    }

    pub fn node_id(&self) -> Outcome<String> {
        match &self.caps.node_id {
            Some(id) => Ok(id.clone()),
            None => skip("NodeGetInfo did not return a node id"),
        }
    }

    pub fn secrets(&self, kind: SecretKind) -> HashMap<String, String> {
        self.config.secrets.get(kind)
    }

    /// A name unique to this run and check.
    pub fn name(&mut self, what: &str) -> String {
        self.counter += 1;
        format!(
            "{}-{}-{what}-{}",
            self.config.test_volume_prefix, self.run_id, self.counter
        )
    }

    /// A [`name`](Self::name) padded to `len` bytes (cut, keeping its
    /// start, if it is longer), as the longest names a CO may send.
    pub fn name_of_length(&mut self, what: &str, len: usize) -> String {
        let mut name = self.name(what);
        if name.len() < len {
            name.push('-');
            name.extend(std::iter::repeat_n('x', len.saturating_sub(name.len())));
        }
        let mut end = len.min(name.len());
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        name.truncate(end);
        name
    }

    pub fn register(&mut self, r: Resource) {
        self.cleanup.push(r);
    }

    /// The configured capability with another access mode.
    pub fn capability_with(&self, mode: Mode) -> VolumeCapability {
        match &self.config.access_type {
            SuiteAccessType::Mount { fs_type } => VolumeCapability::mount(fs_type.clone()),
            SuiteAccessType::Block => VolumeCapability::block(),
        }
        .with_access_mode(mode)
    }

    /// The configured capability.
    pub fn capability(&self) -> VolumeCapability {
        self.capability_with(self.config.access_mode)
    }

    pub fn is_block(&self) -> bool {
        self.config.access_type == SuiteAccessType::Block
    }

    pub fn create_request(&mut self, what: &str) -> CreateVolumeRequest {
        CreateVolumeRequest {
            name: self.name(what),
            capacity_range: Some(CapacityRange::at_least(self.config.volume_size)),
            volume_capabilities: vec![self.capability()],
            parameters: self.config.parameters.clone(),
            secrets: self.secrets(SecretKind::CreateVolume),
            ..Default::default()
        }
    }

    /// Sends CreateVolume, registering for cleanup whatever it created.
    pub async fn send_create(&mut self, req: CreateVolumeRequest) -> Call<CreateVolumeResponse> {
        let call = self.rpc(req).await;
        if let Ok(CreateVolumeResponse { volume: Some(v) }) = &call.result
            && !v.volume_id.is_empty()
        {
            self.register(Resource::Volume(v.volume_id.clone()));
        }
        call
    }

    /// Creates a volume (registered for cleanup) and checks the answer's shape.
    pub async fn create_volume_with(&mut self, req: CreateVolumeRequest) -> Outcome<Volume> {
        let call = self.send_create(req).await;
        let resp = match &call.result {
            Ok(r) => r.clone(),
            Err(_) => return Err(call.failure("OK", "creating a test volume must succeed")),
        };
        let Some(vol) = resp.volume else {
            return Err(call.bad("CreateVolumeResponse.volume is required"));
        };
        if vol.volume_id.is_empty() {
            return Err(call.bad("Volume.volume_id is required"));
        }
        if vol.capacity_bytes < 0 {
            return Err(call.bad("Volume.capacity_bytes must not be negative"));
        }
        Ok(vol)
    }

    pub async fn create_volume(&mut self, what: &str) -> Outcome<Volume> {
        self.need_ctrl(CtrlCap::CreateDeleteVolume)?;
        let req = self.create_request(what);
        self.create_volume_with(req).await
    }

    /// A fresh, empty directory for this check under `parent`.
    pub fn fresh_dir(&mut self, parent: &Path, what: &str) -> Outcome<PathBuf> {
        let dir = parent.join(self.name(what));
        std::fs::create_dir_all(&dir)
            .or_else(|e| fail(format!("cannot create {}: {e}", dir.display())))?;
        self.register(Resource::Dir(dir.clone()));
        Ok(dir)
    }

    /// A staging path that exists, as the CO guarantees.
    pub fn staging_path(&mut self) -> Outcome<String> {
        let parent = self.config.staging_dir.clone();
        let dir = self.fresh_dir(&parent, "staging")?;
        Ok(dir.to_string_lossy().into_owned())
    }

    /// A target path whose parent exists but which itself does not.
    pub fn target_path(&mut self) -> Outcome<String> {
        let parent = self.config.target_dir.clone();
        let dir = self.fresh_dir(&parent, "target")?;
        Ok(dir.join("target").to_string_lossy().into_owned())
    }

    /// Tears down what the check registered, newest first. Returns the first
    /// teardown failure: a driver that cannot undo its own work is broken.
    async fn run_cleanup(&mut self) -> Option<Failure> {
        let mut first: Option<Failure> = None;
        let items: Vec<Resource> = self.cleanup.drain(..).rev().collect();
        for item in items {
            if let Err(f) = self.teardown(&item).await {
                first.get_or_insert(f);
            }
        }
        first
    }

    async fn teardown(&self, item: &Resource) -> Result<(), Failure> {
        match item {
            Resource::Volume(id) => accept(
                self.rpc(DeleteVolumeRequest {
                    volume_id: id.clone(),
                    secrets: self.secrets(SecretKind::DeleteVolume),
                })
                .await,
            ),
            Resource::Snapshot(id) => accept(
                self.rpc(DeleteSnapshotRequest {
                    snapshot_id: id.clone(),
                    secrets: self.secrets(SecretKind::DeleteSnapshot),
                })
                .await,
            ),
            Resource::GroupSnapshot(id, snaps) => accept(
                self.rpc(DeleteVolumeGroupSnapshotRequest {
                    group_snapshot_id: id.clone(),
                    snapshot_ids: snaps.clone(),
                    secrets: self.secrets(SecretKind::DeleteVolumeGroupSnapshot),
                })
                .await,
            ),
            Resource::ControllerPublish { volume, node } => accept(
                self.rpc(ControllerUnpublishVolumeRequest {
                    volume_id: volume.clone(),
                    node_id: node.clone(),
                    secrets: self.secrets(SecretKind::ControllerUnpublishVolume),
                })
                .await,
            ),
            Resource::Staged { volume, path } => accept(
                self.rpc(NodeUnstageVolumeRequest {
                    volume_id: volume.clone(),
                    staging_target_path: path.clone(),
                })
                .await,
            ),
            Resource::Published { volume, target } => accept(
                self.rpc(NodeUnpublishVolumeRequest {
                    volume_id: volume.clone(),
                    target_path: target.clone(),
                })
                .await,
            ),
            Resource::Dir(dir) => {
                // Never recursive: a leftover mount below must not be emptied.
                if let Ok(entries) = std::fs::read_dir(dir) {
                    for e in entries.flatten() {
                        let p = e.path();
                        let _ = if p.is_dir() {
                            std::fs::remove_dir(&p)
                        } else {
                            std::fs::remove_file(&p)
                        };
                    }
                }
                let _ = std::fs::remove_dir(dir);
                Ok(())
            }
        }
    }
}

/// Teardown is idempotent by spec; NOT_FOUND means it is already gone.
fn accept<T>(call: Call<T>) -> Result<(), Failure> {
    match call.code_in(&[Code::Ok, Code::NotFound], "cleanup must succeed") {
        Ok(_) | Err(Stop::Skip(_)) => Ok(()),
        Err(Stop::Fail(f)) => Err(Failure {
            message: format!("cleanup: {}", f.message),
            ..*f
        }),
    }
}

/// Runs the conformance checks against one driver.
#[derive(Debug, Clone)]
pub struct Suite {
    config: SuiteConfig,
}

impl Suite {
    /// A suite for `config`.
    pub fn new(config: SuiteConfig) -> Self {
        Self { config }
    }

    /// Every check the suite knows, in run order.
    pub fn checks() -> Vec<CheckInfo> {
        crate::checks::CHECKS.iter().map(|c| c.info).collect()
    }

    /// The configuration.
    pub fn config(&self) -> &SuiteConfig {
        &self.config
    }

    fn selected(&self, info: &CheckInfo) -> Option<String> {
        let g = info.group.as_str();
        if let Some(p) = self
            .config
            .skip
            .iter()
            .find(|p| pattern_matches(p, info.id, g))
        {
            return Some(format!("skipped by configuration ({p})"));
        }
        if !self.config.focus.is_empty()
            && !self
                .config
                .focus
                .iter()
                .any(|p| pattern_matches(p, info.id, g))
        {
            return Some("not selected by focus".to_string());
        }
        None
    }

    /// Connects to the driver and runs every selected check.
    pub async fn run(&self) -> Result<Report, Error> {
        let started = Instant::now();
        for dir in [&self.config.staging_dir, &self.config.target_dir] {
            std::fs::create_dir_all(dir).map_err(|source| Error::Dir {
                path: dir.clone(),
                source,
            })?;
        }
        let endpoint: Endpoint = self
            .config
            .endpoint
            .parse()
            .map_err(csi_client::ConnectError::from)?;
        let options = ClientOptions {
            connect_timeout: self.config.timeouts.connect,
            call_timeout: Some(self.config.timeouts.rpc),
        };
        let node =
            CsiClient::connect_when_ready(endpoint, options.clone(), self.config.timeouts.connect)
                .await?;
        let controller = match &self.config.controller_endpoint {
            Some(e) => {
                let endpoint: Endpoint = e.parse().map_err(csi_client::ConnectError::from)?;
                CsiClient::connect_when_ready(endpoint, options, self.config.timeouts.connect)
                    .await?
            }
            None => node.clone(),
        };
        let mut ctx = Ctx {
            controller,
            node,
            leaks: std::sync::Mutex::default(),
            marker: format!("csi-conformance-marker-{}", uuid::Uuid::new_v4().simple()),
            config: self.config.clone(),
            caps: Caps::default(),
            cleanup: Vec::new(),
            run_id: uuid::Uuid::new_v4().simple().to_string()[..8].to_string(),
            counter: 0,
        };
        let plugin = crate::discover::discover(&mut ctx).await;
        let mut results = Vec::new();
        for check in crate::checks::CHECKS {
            let info = check.info;
            let t0 = Instant::now();
            let status = if let Some(reason) = self.selected(&info) {
                Status::Skipped(reason)
            } else {
                let body = tokio::time::timeout(self.config.timeouts.check, (check.run)(&mut ctx));
                let outcome = match body.await {
                    Ok(o) => o,
                    Err(_) => fail(format!(
                        "check did not finish within {:?}",
                        self.config.timeouts.check
                    )),
                };
                let cleanup = ctx.run_cleanup().await;
                match (outcome, cleanup) {
                    (Err(Stop::Fail(f)), _) => Status::Failed(*f),
                    (_, Some(f)) => Status::Failed(f),
                    (Err(Stop::Skip(reason)), None) => Status::Skipped(reason),
                    (Ok(()), None) => Status::Passed,
                }
            };
            results.push(CheckResult {
                id: info.id.to_string(),
                group: info.group,
                description: info.description.to_string(),
                status,
                duration: t0.elapsed(),
            });
        }
        Ok(Report {
            plugin,
            results,
            duration: started.elapsed(),
        })
    }
}
