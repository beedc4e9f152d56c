//! From tonic to the driver, generated from the method table: the tonic
//! service impls turn each RPC into a [`CsiCall`] sent through the layer
//! stack, and [`DriverService`] at the bottom of the stack hands it to the
//! driver trait method.

use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use csi_proto::methods::RpcRequest;
use csi_proto::v1 as csi;
use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status};
use tower::Service;

use crate::driver::{
    CallContext, Controller, CsiResult, CsiStream, Declared, GroupController, Identity, Node,
    ResponseStream, SnapshotMetadata,
};
use crate::error::CsiError;
use crate::layer::{BoxCsiService, CsiCall, CsiFuture, ErasedRequest};

/// A request type the driver set can answer: every CSI request.
#[doc(hidden)]
pub trait Route: ErasedRequest {
    /// Calls the driver method of this request's RPC.
    fn call_driver(drivers: &Drivers, ctx: CallContext, req: Self) -> CsiFuture<Self::Output>;
}

fn not_provided<T>(ctx: &CallContext) -> CsiResult<T> {
    Err(CsiError::Unimplemented(format!(
        "{} is not served by this plugin (not in its mode, or not provided)",
        ctx.method
    )))
}

macro_rules! dispatch {
    (() $($svc:ident {
        unary: [$($m:ident { rust: $fn:ident, request: $req:ident, response: $resp:ident, $($_uk:ident: $_uv:tt,)* })*],
        server_streaming: [$($sm:ident { rust: $sfn:ident, request: $sreq:ident, response: $sresp:ident, doc: $_smdoc:literal, stream: $stream:ident, })*],
        doc: $sdoc:literal, rust: $srust:ident, client_mod: $_cmod:ident, client: $_client:ident,
        server_mod: $smod:ident, server_trait: $strait:ident, server: $server:ident,
    })*) => {
        /// The drivers a server serves, one per service.
        #[derive(Clone, Default)]
        pub struct Drivers {
            $(
                #[doc = $sdoc]
                pub $srust: Option<Arc<dyn $svc>>,
            )*
        }

        impl std::fmt::Debug for Drivers {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct("Drivers")
                    $(.field(stringify!($srust), &self.$srust.is_some()))*
                    .finish()
            }
        }

        $($(
            impl Route for csi::$req {
                fn call_driver(drivers: &Drivers, ctx: CallContext, req: Self) -> CsiFuture<Self::Output> {
                    match drivers.$srust.clone() {
                        Some(driver) => Box::pin(async move { driver.$fn(&ctx, req).await }),
                        None => Box::pin(futures::future::ready(not_provided(&ctx))),
                    }
                }
            }
        )* $(
            impl Route for csi::$sreq {
                fn call_driver(drivers: &Drivers, ctx: CallContext, req: Self) -> CsiFuture<Self::Output> {
                    match drivers.$srust.clone() {
                        Some(driver) => Box::pin(async move {
                            driver.$sfn(&ctx, req).await.map(ResponseStream)
                        }),
                        None => Box::pin(futures::future::ready(not_provided(&ctx))),
                    }
                }
            }
        )*)*

        $(
            #[tonic::async_trait]
            impl csi::$smod::$strait for Dispatch {
                $(
                    async fn $fn(&self, request: Request<csi::$req>) -> Result<Response<csi::$resp>, Status> {
                        self.unary(request).await
                    }
                )*
                $(
                    type $stream = StatusStream<csi::$sresp>;

                    async fn $sfn(&self, request: Request<csi::$sreq>) -> Result<Response<Self::$stream>, Status> {
                        let stream = self.call(request).await?;
                        Ok(Response::new(into_status_stream(stream.0)))
                    }
                )*
            }
        )*

        impl Dispatch {
            /// The tonic routes of the services present in `drivers`.
            pub(crate) fn routes(self: &Arc<Self>, drivers: &Drivers) -> tonic::service::RoutesBuilder {
                let mut routes = tonic::service::RoutesBuilder::default();
                $(
                    if drivers.$srust.is_some() {
                        routes.add_service(csi::$smod::$server::from_arc(self.clone()));
                    }
                )*
                routes
            }
        }
    };
}

csi_proto::for_each_method!(dispatch);

/// The bottom of the stack: calls the driver.
#[derive(Clone, Debug)]
pub struct DriverService {
    drivers: Arc<Drivers>,
}

impl DriverService {
    /// Serves `drivers`.
    pub fn new(drivers: Drivers) -> Self {
        Self {
            drivers: Arc::new(drivers),
        }
    }
}

impl<Req: Route> Service<CsiCall<Req>> for DriverService {
    type Response = Req::Output;
    type Error = CsiError;
    type Future = CsiFuture<Req::Output>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), CsiError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: CsiCall<Req>) -> Self::Future {
        Req::call_driver(&self.drivers, call.ctx, call.request)
    }
}

/// What every tonic service shares: the stack, the declaration, the id counter.
pub(crate) struct Dispatch {
    stack: BoxCsiService,
    declared: Arc<Declared>,
    next_id: AtomicU64,
}

impl Dispatch {
    pub(crate) fn new(stack: BoxCsiService, declared: Arc<Declared>) -> Arc<Self> {
        Arc::new(Self {
            stack,
            declared,
            next_id: AtomicU64::new(1),
        })
    }

    async fn call<Req: Route>(&self, request: Request<Req>) -> Result<Req::Output, Status> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let timeout = (request.metadata().get("grpc-timeout"))
            .and_then(|v| v.to_str().ok())
            .and_then(csi_driver::clock::parse_grpc_timeout);
        let ctx = CallContext::new(id, Req::METHOD, self.declared.clone())
            .with_deadline(timeout.map(|t| std::time::Instant::now() + t));
        self.stack
            .call_one(CsiCall::with_context(ctx, request.into_inner()))
            .await
            .map_err(Status::from)
    }

    async fn unary<Req>(&self, request: Request<Req>) -> Result<Response<Req::Output>, Status>
    where
        Req: Route + RpcRequest<Response = <Req as crate::request::CsiRequest>::Output>,
    {
        self.call(request).await.map(Response::new)
    }
}

/// A gRPC response stream.
pub(crate) type StatusStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// Maps driver errors to statuses and a panic while producing an item to
/// INTERNAL (which ends the stream).
fn into_status_stream<T: Send + 'static>(stream: CsiStream<T>) -> StatusStream<T> {
    Box::pin(
        AssertUnwindSafe(stream)
            .catch_unwind()
            .map(|item| match item {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(e)) => Err(Status::from(e)),
                Err(_) => Err(Status::internal("internal error: the driver panicked")),
            }),
    )
}
