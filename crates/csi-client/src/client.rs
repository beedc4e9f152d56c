//! A typed CSI client for tools and tests: one connection to an endpoint
//! for unary calls, with a connect timeout, a per-call timeout and
//! transparent reconnects (a broken connection is dialled again on the next
//! call). It has a method per RPC (generated from the method table) and
//! [`CsiClient::call`], generic over the request type.

use std::sync::Arc;
use std::time::Duration;

use csi_proto::methods::RpcRequest;
use csi_proto::v1 as csi;
use csi_proto::v1::controller_client::ControllerClient;
use csi_proto::v1::group_controller_client::GroupControllerClient;
use csi_proto::v1::identity_client::IdentityClient;
use csi_proto::v1::node_client::NodeClient;
use csi_proto::v1::snapshot_metadata_client::SnapshotMetadataClient;
use futures::future::BoxFuture;
use tonic::Status;
use tonic::transport::Channel;

use crate::endpoint::{Endpoint, EndpointError};
use crate::unary::UnaryChannel;

/// Why a connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The endpoint string is not valid.
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    /// Dialing failed or timed out.
    #[error("cannot connect to {endpoint}: {source}")]
    Dial {
        /// Where we tried to connect.
        endpoint: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// tonic refused the endpoint.
    #[error("cannot connect to {endpoint}: {source}")]
    Transport {
        /// Where we tried to connect.
        endpoint: String,
        /// The transport error.
        #[source]
        source: tonic::transport::Error,
    },
    /// The plugin did not answer within the wait budget.
    #[error("{endpoint} did not become reachable within {waited:?}")]
    NotReady {
        /// Where we tried to connect.
        endpoint: String,
        /// How long we waited.
        waited: Duration,
    },
}

/// Connection options.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Dial timeout for each connection attempt.
    pub connect_timeout: Duration,
    /// Deadline for each call (`None` = no deadline).
    pub call_timeout: Option<Duration>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            call_timeout: Some(Duration::from_secs(60)),
        }
    }
}

/// A connection to a CSI plugin, handing out a client per service. Cloning
/// is cheap and shares the connection.
///
/// Unary calls (a method per RPC, [`call`](Self::call)) go straight onto
/// one HTTP/2 connection, each request in one write. The tonic clients
/// ([`node`](Self::node) and the others, [`channel`](Self::channel)) and the
/// streaming RPCs use a tonic channel of their own, dialled on first use.
#[derive(Debug, Clone)]
pub struct CsiClient {
    channel: Channel,
    unary: Arc<UnaryChannel>,
    endpoint: Endpoint,
}

impl CsiClient {
    /// Connects to `endpoint` (e.g. `unix:///run/csi/csi.sock`) with default options.
    pub async fn connect(endpoint: &str) -> Result<Self, ConnectError> {
        Self::connect_with(endpoint.parse()?, ClientOptions::default()).await
    }

    /// Connects to a parsed endpoint with explicit options.
    pub async fn connect_with(
        endpoint: Endpoint,
        options: ClientOptions,
    ) -> Result<Self, ConnectError> {
        let channel = Self::tonic_endpoint(&endpoint, &options)?.connect_lazy();
        let unary = UnaryChannel::connect(endpoint.clone(), options)
            .await
            .map_err(|source| ConnectError::Dial {
                endpoint: endpoint.to_string(),
                source,
            })?;
        Ok(Self {
            channel,
            unary: Arc::new(unary),
            endpoint,
        })
    }

    /// Retries [`connect_with`](Self::connect_with) until it succeeds or `wait`
    /// elapses: for tests and tools that start a plugin and then talk to it.
    pub async fn connect_when_ready(
        endpoint: Endpoint,
        options: ClientOptions,
        wait: Duration,
    ) -> Result<Self, ConnectError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match Self::connect_with(endpoint.clone(), options.clone()).await {
                Ok(client) => return Ok(client),
                Err(ConnectError::Dial { .. }) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(ConnectError::Dial { .. }) => {
                    return Err(ConnectError::NotReady {
                        endpoint: endpoint.to_string(),
                        waited: wait,
                    });
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A client that dials on first use instead of now.
    pub fn connect_lazy(endpoint: Endpoint, options: ClientOptions) -> Result<Self, ConnectError> {
        let channel = Self::tonic_endpoint(&endpoint, &options)?.connect_lazy();
        let unary = Arc::new(UnaryChannel::lazy(endpoint.clone(), options));
        Ok(Self {
            channel,
            unary,
            endpoint,
        })
    }

    fn tonic_endpoint(
        endpoint: &Endpoint,
        options: &ClientOptions,
    ) -> Result<tonic::transport::Endpoint, ConnectError> {
        let mut e = tonic::transport::Endpoint::from_shared(endpoint.connect_uri())
            .map_err(|source| ConnectError::Transport {
                endpoint: endpoint.to_string(),
                source,
            })?
            .connect_timeout(options.connect_timeout);
        if let Some(t) = options.call_timeout {
            e = e.timeout(t);
        }
        Ok(e)
    }

    /// The endpoint this client talks to.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The underlying channel, for generated clients not covered here.
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// The Identity service.
    pub fn identity(&self) -> IdentityClient<Channel> {
        IdentityClient::new(self.channel.clone())
    }

    /// The Controller service.
    pub fn controller(&self) -> ControllerClient<Channel> {
        ControllerClient::new(self.channel.clone())
    }

    /// The Node service.
    pub fn node(&self) -> NodeClient<Channel> {
        NodeClient::new(self.channel.clone())
    }

    /// The GroupController service.
    pub fn group_controller(&self) -> GroupControllerClient<Channel> {
        GroupControllerClient::new(self.channel.clone())
    }

    /// The SnapshotMetadata service.
    pub fn snapshot_metadata(&self) -> SnapshotMetadataClient<Channel> {
        SnapshotMetadataClient::new(self.channel.clone())
    }
}

/// A unary CSI request: every request type but the streaming ones, so
/// [`CsiClient::call`] can send any of them.
pub trait UnaryRequest: RpcRequest {
    /// Sends the request on `client`'s connection.
    fn send(
        client: &CsiClient,
        request: Self,
    ) -> BoxFuture<'static, Result<Self::Response, Status>>;
}

impl CsiClient {
    /// Sends any unary request, e.g. `client.call(ProbeRequest {})`.
    pub async fn call<Req: UnaryRequest>(&self, request: Req) -> Result<Req::Response, Status> {
        Req::send(self, request).await
    }
}

macro_rules! client_methods {
    (() $($svc:ident {
        unary: [$($m:ident { rust: $fn:ident, request: $req:ident, response: $resp:ident, doc: $doc:literal, })*],
        server_streaming: [$($sm:ident { rust: $sfn:ident, request: $sreq:ident, response: $sresp:ident, doc: $smdoc:literal, $($_sk:ident: $_sv:tt,)* })*],
        doc: $_sdoc:literal, rust: $_srust:ident, client_mod: $cmod:ident, client: $client:ident,
        $($_k:ident: $_v:tt,)*
    })*) => {
        impl CsiClient {
            $($(
                #[doc = $doc]
                pub async fn $fn(&self, request: csi::$req) -> Result<csi::$resp, Status> {
                    self.unary.call(request).await
                }
            )* $(
                #[doc = $smdoc]
                pub async fn $sfn(&self, request: csi::$sreq) -> Result<tonic::Streaming<csi::$sresp>, Status> {
                    csi::$cmod::$client::new(self.channel.clone())
                        .$sfn(request)
                        .await
                        .map(tonic::Response::into_inner)
                }
            )*)*
        }

        $($(
            impl UnaryRequest for csi::$req {
                fn send(client: &CsiClient, request: Self) -> BoxFuture<'static, Result<csi::$resp, Status>> {
                    let client = client.clone();
                    Box::pin(async move { client.$fn(request).await })
                }
            }
        )*)*
    };
}

csi_proto::for_each_method!(client_methods);
