//! The `Server` builder: endpoint, mode, driver services, layers; then
//! `serve()` until SIGTERM/SIGINT with a graceful shutdown.
//!
//! One file over 700 lines: the builder's options and the serve loop share
//! the private state of one server.

use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use csi_proto::v1::plugin_capability::service::Type as PluginService;
use tower::Layer;

use crate::capabilities::{Capabilities, PluginInfo};
use crate::dispatch::{Dispatch, DriverService, Drivers};
use crate::driver::{
    Controller, Declared, DefaultIdentity, GroupController, Identity, Node, SnapshotMetadata,
};
use crate::endpoint::{Endpoint, EndpointError};
use crate::error::CsiError;
use crate::layer::{
    BoxCsiService, CatchPanicLayer, CsiService, GatingLayer, LockMap, LockingLayer, Precheck,
    Readiness, ReadinessLayer, TracingLayer, ValidationLayer, Wrap,
};
use crate::socket::{self, SocketError};

/// Which services this instance serves. The spec leaves it to the plugin to
/// know its mode; a mode whose driver is missing fails at build time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ServeMode {
    /// Identity plus Controller (and GroupController, SnapshotMetadata when given).
    Controller,
    /// Identity plus Node.
    Node,
    /// Everything given.
    #[default]
    Both,
}

impl ServeMode {
    fn controller(self) -> bool {
        matches!(self, Self::Controller | Self::Both)
    }
    fn node(self) -> bool {
        matches!(self, Self::Node | Self::Both)
    }
}

impl FromStr for ServeMode {
    type Err = ServerError;

    /// `controller`, `node` or `both` (also `all`), case-insensitive.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "controller" => Ok(Self::Controller),
            "node" => Ok(Self::Node),
            "both" | "all" => Ok(Self::Both),
            _ => Err(ServerError::Config(format!(
                "unknown mode {s:?}: expected controller, node or both"
            ))),
        }
    }
}

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The endpoint is missing or malformed.
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    /// A `tcp://` endpoint without [`ServerBuilder::allow_tcp`].
    #[error(
        "{0} is a TCP endpoint; CSI plugins listen on unix sockets unless allow_tcp(true) is set"
    )]
    TcpNotAllowed(String),
    /// The declaration or mode is inconsistent.
    #[error("misconfigured server: {0}")]
    Config(String),
    /// The unix socket could not be created.
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// Binding a TCP address failed.
    #[error("cannot listen on {addr}: {source}")]
    Tcp {
        /// The address.
        addr: std::net::SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Installing the signal handlers failed.
    #[error("cannot install signal handlers: {0}")]
    Signal(std::io::Error),
    /// The metrics endpoint could not start.
    #[cfg(feature = "metrics")]
    #[error("metrics endpoint {addr}: {source}")]
    Metrics {
        /// The address.
        addr: std::net::SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl From<CsiError> for ServerError {
    fn from(e: CsiError) -> Self {
        Self::Config(e.to_string())
    }
}

/// A built-in layer, to place custom layers relative to
/// ([`ServerBuilder::layer_at`]). In the default order, outermost first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Builtin {
    /// [`TracingLayer`].
    Tracing,
    /// The metrics layer (feature `metrics`).
    Metrics,
    /// [`CatchPanicLayer`].
    CatchPanic,
    /// [`GatingLayer`]: UNIMPLEMENTED for an undeclared RPC (and, with
    /// validation off, the field-level capability rules too).
    Gating,
    /// [`ValidationLayer`].
    Validation,
    /// [`GatingLayer::fields`]: the field-level capability rules, after
    /// validation (present when both gating and validation are on).
    FieldRules,
    /// [`ReadinessLayer`].
    Readiness,
    /// [`LockingLayer`].
    Locking,
}

impl Builtin {
    /// Every built-in layer, outermost first.
    pub const ORDER: [Builtin; 8] = [
        Self::Tracing,
        Self::Metrics,
        Self::CatchPanic,
        Self::Gating,
        Self::Validation,
        Self::FieldRules,
        Self::Readiness,
        Self::Locking,
    ];
}

/// Where a custom layer goes in the stack. Placing relative to a built-in
/// layer that is turned off puts the custom layer where it would have been.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    /// Outside every built-in layer (it sees calls before tracing does).
    Outermost,
    /// Just outside a built-in layer.
    Outside(Builtin),
    /// Just inside a built-in layer.
    Inside(Builtin),
    /// Inside every built-in layer, just outside the driver.
    Innermost,
}

type BoxLayer = Box<dyn FnOnce(BoxCsiService) -> BoxCsiService + Send>;

/// The built-in layers as configured (`false`: turned off).
struct Builtins {
    tracing: bool,
    #[cfg(feature = "metrics")]
    metrics: crate::layer::MetricsLayer,
    catch_panics: bool,
    gating: (GatingLayer, bool),
    validation: bool,
    field_rules: (GatingLayer, bool),
    readiness: ReadinessLayer,
    locking: (LockingLayer, bool),
}

impl Builtins {
    /// The built-in layers of `run` that are on, in their order, around
    /// `inner`, boxed once. Every built-in layer is in the type, switched
    /// off when not in the run, so there is one linear nesting whatever the
    /// configuration (and one instantiation: generic code over every request
    /// type is what makes this crate's build large).
    fn compose(&self, run: &[Builtin], inner: BoxCsiService) -> BoxCsiService {
        if run.is_empty() {
            return inner;
        }
        let has = |b: Builtin| run.contains(&b);
        let s = self
            .locking
            .0
            .switched(inner, self.locking.1 && has(Builtin::Locking));
        let s = self.readiness.switched(s, has(Builtin::Readiness));
        let s = self
            .field_rules
            .0
            .switched(s, self.field_rules.1 && has(Builtin::FieldRules));
        let s = ValidationLayer.switched(s, self.validation && has(Builtin::Validation));
        let s = self
            .gating
            .0
            .switched(s, self.gating.1 && has(Builtin::Gating));
        let s = CatchPanicLayer.switched(s, self.catch_panics && has(Builtin::CatchPanic));
        #[cfg(feature = "metrics")]
        let s = self.metrics.switched(s, has(Builtin::Metrics));
        BoxCsiService::new(TracingLayer.switched(s, self.tracing && has(Builtin::Tracing)))
    }
}

/// Configures a [`Server`]. Every layer is on by default.
pub struct ServerBuilder {
    info: PluginInfo,
    capabilities: Capabilities,
    mode: ServeMode,
    endpoint: Option<Endpoint>,
    allow_tcp: bool,
    any_authority: bool,
    drivers: Drivers,
    readiness: Option<Readiness>,
    grace_period: Duration,
    lock_wait: Duration,
    lock_map: Arc<LockMap>,
    tracing: bool,
    catch_panics: bool,
    gating: bool,
    validation: bool,
    locking: bool,
    custom_layers: Vec<(Position, BoxLayer)>,
    services_elsewhere: bool,
    #[cfg(feature = "metrics")]
    metrics: Option<std::net::SocketAddr>,
}

impl std::fmt::Debug for ServerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerBuilder")
            .field("info", &self.info)
            .field("mode", &self.mode)
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl ServerBuilder {
    /// The declared capabilities.
    pub fn capabilities(mut self, capabilities: Capabilities) -> Self {
        self.capabilities = capabilities;
        self
    }

    /// The mode (default: [`ServeMode::Both`]).
    pub fn mode(mut self, mode: ServeMode) -> Self {
        self.mode = mode;
        self
    }

    /// The plugin's other services run in another process (controller and
    /// node apart): the service capabilities declared for them stay in
    /// GetPluginCapabilities, which describes the whole plugin, so both
    /// processes answer it alike (off by default: only what is served here).
    pub fn services_elsewhere(mut self, on: bool) -> Self {
        self.services_elsewhere = on;
        self
    }

    /// An explicit endpoint; without one, `CSI_ENDPOINT` is read at build.
    pub fn endpoint(mut self, endpoint: Endpoint) -> Self {
        self.endpoint = Some(endpoint);
        self
    }

    /// Allows a `tcp://` endpoint (off by default: the spec wants unix sockets).
    pub fn allow_tcp(mut self, allow: bool) -> Self {
        self.allow_tcp = allow;
        self
    }

    /// Whether any `:authority` is served (default on), as clients that
    /// send the socket path there (gRPC C-core, grpc-java) need. Off, a
    /// `:authority` that is not a valid URI authority is answered INTERNAL,
    /// as a strict HTTP/2 server rejects it; only to test that a client or
    /// suite notices such a server.
    pub fn any_authority(mut self, on: bool) -> Self {
        self.any_authority = on;
        self
    }

    /// Overrides the Identity defaults.
    pub fn identity<I: Identity>(mut self, identity: Arc<I>) -> Self {
        self.drivers.identity = Some(identity);
        self
    }

    /// The Controller driver.
    pub fn controller<C: Controller>(mut self, controller: Arc<C>) -> Self {
        self.drivers.controller = Some(controller);
        self
    }

    /// The Node driver.
    pub fn node<N: Node>(mut self, node: Arc<N>) -> Self {
        self.drivers.node = Some(node);
        self
    }

    /// The GroupController driver (served in controller mode).
    pub fn group_controller<G: GroupController>(mut self, group: Arc<G>) -> Self {
        self.drivers.group_controller = Some(group);
        self
    }

    /// The SnapshotMetadata driver (served in controller mode).
    pub fn snapshot_metadata<S: SnapshotMetadata>(mut self, service: Arc<S>) -> Self {
        self.drivers.snapshot_metadata = Some(service);
        self
    }

    /// A readiness handle the driver flips; Probe answers `ready=false`
    /// until it does. Without one, the server reports ready as soon as it
    /// listens.
    pub fn readiness(mut self, readiness: Readiness) -> Self {
        self.readiness = Some(readiness);
        self
    }

    /// How long in-flight calls may run after a shutdown signal (default 30 s).
    pub fn grace_period(mut self, grace: Duration) -> Self {
        self.grace_period = grace;
        self
    }

    /// How long a call waits for a busy resource before ABORTED (default 0:
    /// fail at once and let the CO retry with backoff).
    pub fn lock_wait(mut self, wait: Duration) -> Self {
        self.lock_wait = wait;
        self
    }

    /// Uses a given lock map, e.g. to inspect it in tests.
    pub fn lock_map(mut self, map: Arc<LockMap>) -> Self {
        self.lock_map = map;
        self
    }

    /// Turns the tracing layer on or off.
    pub fn tracing(mut self, on: bool) -> Self {
        self.tracing = on;
        self
    }

    /// Turns panic catching on or off.
    pub fn catch_panics(mut self, on: bool) -> Self {
        self.catch_panics = on;
        self
    }

    /// Turns capability gating on or off.
    pub fn capability_gating(mut self, on: bool) -> Self {
        self.gating = on;
        self
    }

    /// Turns spec validation on or off.
    pub fn validation(mut self, on: bool) -> Self {
        self.validation = on;
        self
    }

    /// Turns per-resource locking on or off.
    pub fn locking(mut self, on: bool) -> Self {
        self.locking = on;
        self
    }

    /// Adds a tower layer just outside the driver (inside the built-in
    /// ones): `layer_at(Position::Innermost, layer)`.
    pub fn layer<L>(self, layer: L) -> Self
    where
        L: Layer<BoxCsiService> + Send + 'static,
        L::Service: CsiService,
    {
        self.layer_at(Position::Innermost, layer)
    }

    /// Adds a tower layer at `position`. Any layer whose service handles
    /// every [`CsiCall`](crate::layer::CsiCall) type fits: the built-in
    /// ones, `tower::timeout::TimeoutLayer` (an expired call is
    /// DEADLINE_EXCEEDED), `tower::limit::ConcurrencyLimitLayer`, or your
    /// own. Layers added at the same position nest in the order added,
    /// the first outermost.
    ///
    /// ```
    /// use std::time::Duration;
    /// use csi_server::{Builtin, PluginInfo, Position, Server};
    ///
    /// let builder = Server::builder(PluginInfo::new("x.example.com", "1").unwrap())
    ///     // A deadline for the driver's work, inside the lock.
    ///     .layer_at(
    ///         Position::Inside(Builtin::Locking),
    ///         tower::timeout::TimeoutLayer::new(Duration::from_secs(120)),
    ///     )
    ///     // At most 16 calls at once, before any other work.
    ///     .layer_at(Position::Outermost, tower::limit::ConcurrencyLimitLayer::new(16));
    /// ```
    ///
    /// The stack clones a layer's service for every call, so state a layer
    /// keeps must be shared between clones (`ConcurrencyLimit` does so;
    /// `tower::limit::RateLimit` does not and needs a `tower::buffer` in
    /// front of it).
    pub fn layer_at<L>(mut self, position: Position, layer: L) -> Self
    where
        L: Layer<BoxCsiService> + Send + 'static,
        L::Service: CsiService,
    {
        self.custom_layers.push((
            position,
            Box::new(move |inner| BoxCsiService::new(layer.layer(inner))),
        ));
        self
    }

    /// Serves Prometheus metrics on `addr` (`GET /metrics`).
    #[cfg(feature = "metrics")]
    pub fn metrics_addr(mut self, addr: std::net::SocketAddr) -> Self {
        self.metrics = Some(addr);
        self
    }

    /// Checks the configuration and builds the server.
    pub fn build(self) -> Result<Server, ServerError> {
        let endpoint = match self.endpoint {
            Some(e) => e,
            None => Endpoint::from_env()?,
        };
        if let Endpoint::Tcp(_) = endpoint
            && !self.allow_tcp
        {
            return Err(ServerError::TcpNotAllowed(endpoint.to_string()));
        }
        let mode = self.mode;
        let mut drivers = self.drivers;
        if mode.controller() && drivers.controller.is_none() {
            return Err(ServerError::Config(format!(
                "mode {mode:?} needs a controller driver"
            )));
        }
        if mode.node() && drivers.node.is_none() {
            return Err(ServerError::Config(format!(
                "mode {mode:?} needs a node driver"
            )));
        }
        if !mode.controller() {
            drivers.controller = None;
            drivers.group_controller = None;
            drivers.snapshot_metadata = None;
        }
        if !mode.node() {
            drivers.node = None;
        }
        if drivers.identity.is_none() {
            drivers.identity = Some(Arc::new(DefaultIdentity));
        }

        let mut capabilities = self.capabilities;
        capabilities.check()?;
        // Service capabilities follow what this instance serves.
        let elsewhere = |s| self.services_elsewhere && capabilities.has_plugin(s);
        let controller_elsewhere = elsewhere(PluginService::ControllerService);
        capabilities.set_plugin(
            PluginService::ControllerService,
            drivers.controller.is_some() || controller_elsewhere,
        );
        capabilities.set_plugin(
            PluginService::GroupControllerService,
            drivers.group_controller.is_some(),
        );
        capabilities.set_plugin(
            PluginService::SnapshotMetadataService,
            drivers.snapshot_metadata.is_some(),
        );

        let (readiness, ready_on_listen) = match self.readiness {
            Some(r) => (r, false),
            None => (Readiness::new(), true),
        };

        #[cfg(feature = "metrics")]
        let metrics = crate::layer::MetricsLayer::new();
        // Undeclared RPC first, then missing or invalid fields, then the
        // field-level capability rules (see layer::gating).
        let builtins = Builtins {
            tracing: self.tracing,
            #[cfg(feature = "metrics")]
            metrics: metrics.clone(),
            catch_panics: self.catch_panics,
            gating: if self.validation {
                (GatingLayer::rpcs(capabilities.clone()), self.gating)
            } else {
                (GatingLayer::new(capabilities.clone()), self.gating)
            },
            validation: self.validation,
            field_rules: (
                GatingLayer::fields(capabilities.clone()),
                self.gating && self.validation,
            ),
            readiness: ReadinessLayer::new(readiness.clone()),
            locking: (
                LockingLayer::with_map(self.lock_map.clone(), self.lock_wait),
                self.locking,
            ),
        };
        // Outermost first: custom layers, and runs of built-in ones between them.
        enum Entry {
            Builtin(Builtin),
            Custom(BoxLayer),
        }
        let mut custom = self.custom_layers;
        let mut take = |p: Position| -> Vec<Entry> {
            let (here, rest): (Vec<_>, Vec<_>) = custom.drain(..).partition(|(q, _)| *q == p);
            custom = rest;
            here.into_iter().map(|(_, l)| Entry::Custom(l)).collect()
        };
        let mut order: Vec<Entry> = take(Position::Outermost);
        for b in Builtin::ORDER {
            order.extend(take(Position::Outside(b)));
            order.push(Entry::Builtin(b));
            order.extend(take(Position::Inside(b)));
        }
        order.extend(take(Position::Innermost));

        // Inside out. A run of built-in layers is composed statically and
        // boxed once: boxing between layers costs allocations per call.
        let driver = BoxCsiService::new(DriverService::new(drivers.clone()));
        let mut stack: Option<BoxCsiService> = None;
        let mut run = Vec::new();
        for entry in order.into_iter().rev() {
            match entry {
                Entry::Builtin(b) => run.push(b),
                Entry::Custom(layer) => {
                    let inner = builtins.compose(&run, stack.take().unwrap_or(driver.clone()));
                    run.clear();
                    stack = Some(layer(inner));
                }
            }
        }
        let stack = builtins.compose(&run, stack.unwrap_or(driver));

        let dispatch = Dispatch::new(
            stack,
            Arc::new(Declared {
                info: self.info,
                capabilities,
            }),
            &drivers,
        );
        Ok(Server {
            endpoint,
            any_authority: self.any_authority,
            dispatch,
            readiness,
            ready_on_listen,
            grace_period: self.grace_period,
            lock_map: self.lock_map,
            #[cfg(feature = "metrics")]
            metrics: (metrics, self.metrics),
        })
    }
}

/// A configured CSI server; see [`Server::builder`].
pub struct Server {
    endpoint: Endpoint,
    any_authority: bool,
    dispatch: Arc<Dispatch>,
    readiness: Readiness,
    ready_on_listen: bool,
    grace_period: Duration,
    lock_map: Arc<LockMap>,
    #[cfg(feature = "metrics")]
    metrics: (crate::layer::MetricsLayer, Option<std::net::SocketAddr>),
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("endpoint", &self.endpoint)
            .field("grace_period", &self.grace_period)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// Starts configuring a server for the plugin `info`.
    pub fn builder(info: PluginInfo) -> ServerBuilder {
        ServerBuilder {
            info,
            capabilities: Capabilities::new(),
            mode: ServeMode::Both,
            endpoint: None,
            allow_tcp: false,
            any_authority: true,
            drivers: Drivers::default(),
            readiness: None,
            grace_period: Duration::from_secs(30),
            lock_wait: Duration::ZERO,
            lock_map: LockMap::new(),
            tracing: true,
            catch_panics: true,
            gating: true,
            validation: true,
            locking: true,
            custom_layers: Vec::new(),
            services_elsewhere: false,
            #[cfg(feature = "metrics")]
            metrics: None,
        }
    }

    /// The endpoint the server listens on.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The readiness handle Probe answers from.
    pub fn readiness(&self) -> Readiness {
        self.readiness.clone()
    }

    /// The lock map of the locking layer (empty when no call is in flight).
    pub fn lock_map(&self) -> Arc<LockMap> {
        self.lock_map.clone()
    }

    /// The metrics registry's text exposition (feature `metrics`).
    #[cfg(feature = "metrics")]
    pub fn metrics_text(&self) -> String {
        self.metrics.0.encode()
    }

    /// Serves until SIGTERM or SIGINT, then shuts down gracefully.
    pub async fn serve(self) -> Result<(), ServerError> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).map_err(ServerError::Signal)?;
        let mut int = signal(SignalKind::interrupt()).map_err(ServerError::Signal)?;
        self.serve_with_shutdown(async move {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM received, shutting down"),
                _ = int.recv() => tracing::info!("SIGINT received, shutting down"),
            }
        })
        .await
    }

    /// Serves until `shutdown` completes; then stops accepting, lets
    /// in-flight calls finish within the grace period, and removes the
    /// socket.
    pub async fn serve_with_shutdown<F>(self, shutdown: F) -> Result<(), ServerError>
    where
        F: Future<Output = ()> + Send,
    {
        #[cfg(feature = "metrics")]
        let _metrics_task = match self.metrics.1 {
            Some(addr) => Some(
                self.metrics
                    .0
                    .serve(addr)
                    .await
                    .map_err(|source| ServerError::Metrics { addr, source })?,
            ),
            None => None,
        };
        let calls = crate::transport::Calls {
            dispatch: self.dispatch,
            strict_authority: !self.any_authority,
        };
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let stop = async move {
            let _ = stop_rx.await;
        };
        match &self.endpoint {
            Endpoint::Unix(path) => {
                let (listener, file) = socket::bind(path)?;
                let listener = tokio::net::UnixListener::from_std(listener).map_err(|source| {
                    SocketError::Io {
                        path: path.clone(),
                        op: "register with the runtime",
                        source,
                    }
                })?;
                if self.ready_on_listen {
                    self.readiness.set_ready();
                }
                tracing::info!(endpoint = %self.endpoint, "serving");
                let accept = || async { listener.accept().await.map(|(stream, _)| stream) };
                let serving = crate::transport::serve(accept, calls, stop);
                drain(
                    serving,
                    shutdown,
                    stop_tx,
                    self.grace_period,
                    &self.lock_map,
                )
                .await;
                file.remove();
                Ok(())
            }
            Endpoint::Tcp(addr) => {
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|source| ServerError::Tcp {
                        addr: *addr,
                        source,
                    })?;
                if self.ready_on_listen {
                    self.readiness.set_ready();
                }
                tracing::info!(endpoint = %self.endpoint, "serving");
                let accept = || async {
                    let (stream, _) = listener.accept().await?;
                    stream.set_nodelay(true)?;
                    Ok(stream)
                };
                let serving = crate::transport::serve(accept, calls, stop);
                drain(
                    serving,
                    shutdown,
                    stop_tx,
                    self.grace_period,
                    &self.lock_map,
                )
                .await;
                Ok(())
            }
        }
    }
}

/// Runs `serving` until `shutdown`, then tells it to stop and gives
/// in-flight calls `grace` to finish, including work whose caller went away
/// (it holds its locks until it ends), before dropping them.
async fn drain<S, F>(
    serving: S,
    shutdown: F,
    stop: tokio::sync::oneshot::Sender<()>,
    grace: Duration,
    locks: &LockMap,
) where
    S: Future<Output = ()>,
    F: Future<Output = ()>,
{
    tokio::pin!(serving);
    tokio::select! {
        () = &mut serving => return,
        () = shutdown => {}
    }
    let _ = stop.send(());
    let deadline = tokio::time::Instant::now() + grace;
    if tokio::time::timeout_at(deadline, serving).await.is_err() {
        tracing::warn!(
            ?grace,
            "in-flight calls did not finish within the grace period"
        );
        return;
    }
    if tokio::time::timeout_at(deadline, locks.idle())
        .await
        .is_err()
    {
        tracing::warn!(
            ?grace,
            "operations whose callers went away did not finish within the grace period"
        );
    }
}
