//! From a call's method and message to the driver, generated from the
//! method table: each RPC's request is decoded and sent through the layer
//! stack as a [`CsiCall`], [`DriverService`] at the bottom of the stack
//! hands it to the driver trait method, and the answer comes back as gRPC
//! messages and a status for the transport to write.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use csi_proto::methods::{Method, RpcRequest};
use csi_proto::v1 as csi;
use futures::future::BoxFuture;
use futures::{Stream, StreamExt};
use tonic::Status;
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

        impl Drivers {
            /// Whether a driver for `service` is present.
            pub(crate) fn serves(&self, service: csi_proto::methods::Service) -> bool {
                match service {
                    $(csi_proto::methods::Service::$svc => self.$srust.is_some(),)*
                }
            }
        }

        impl Dispatch {
            /// The answer to a call of `method` whose request message (without
            /// gRPC's prefix) is `message`.
            pub(crate) fn answer(
                self: &Arc<Self>,
                method: Method,
                message: &[u8],
                timeout: Option<Duration>,
            ) -> BoxFuture<'static, Answer> {
                match method {
                    $($(
                        Method::$m => self.unary::<csi::$req>(message, timeout),
                    )* $(
                        Method::$sm => self.server_streaming::<csi::$sreq, csi::$sresp>(message, timeout),
                    )*)*
                }
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

/// What every call shares: the stack, the declaration, the services with
/// a driver, the id counter.
pub(crate) struct Dispatch {
    stack: BoxCsiService,
    declared: Arc<Declared>,
    served: Vec<csi_proto::methods::Service>,
    next_id: AtomicU64,
}

impl Dispatch {
    pub(crate) fn new(
        stack: BoxCsiService,
        declared: Arc<Declared>,
        drivers: &Drivers,
    ) -> Arc<Self> {
        let all = csi_proto::methods::Service::ALL.iter().copied();
        Arc::new(Self {
            stack,
            declared,
            served: all.filter(|s| drivers.serves(*s)).collect(),
            next_id: AtomicU64::new(1),
        })
    }

    /// Whether `method`'s service has a driver here.
    pub(crate) fn serves(&self, method: Method) -> bool {
        self.served.contains(&method.info().service)
    }

    async fn call<Req: Route>(
        &self,
        request: Req,
        timeout: Option<Duration>,
    ) -> Result<Req::Output, Status> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let ctx = CallContext::new(id, Req::METHOD, self.declared.clone())
            .with_deadline(timeout.map(|t| std::time::Instant::now() + t));
        self.stack
            .call_one(CsiCall::with_context(ctx, request))
            .await
            .map_err(Status::from)
    }

    fn unary<Req>(
        self: &Arc<Self>,
        message: &[u8],
        timeout: Option<Duration>,
    ) -> BoxFuture<'static, Answer>
    where
        Req: Route + RpcRequest,
        Req: crate::request::CsiRequest<Output = <Req as RpcRequest>::Response>,
    {
        let this = self.clone();
        decoded(message, move |request: Req| {
            Box::pin(async move {
                match this.call(request, timeout).await {
                    Ok(response) => {
                        let mut answer = Answer::default();
                        answer.push(&response);
                        answer
                    }
                    Err(status) => Answer::failed(status),
                }
            })
        })
    }

    fn server_streaming<Req, T>(
        self: &Arc<Self>,
        message: &[u8],
        timeout: Option<Duration>,
    ) -> BoxFuture<'static, Answer>
    where
        Req: Route<Output = ResponseStream<T>> + RpcRequest,
        T: prost::Message + Send + 'static,
    {
        let this = self.clone();
        decoded(message, move |request: Req| {
            Box::pin(async move {
                let mut items = match this.call(request, timeout).await {
                    Ok(stream) => into_status_stream(stream.0),
                    Err(status) => return Answer::failed(status),
                };
                let mut answer = Answer::default();
                while answer.status.is_none()
                    && let Some(item) = items.next().await
                {
                    match item {
                        Ok(item) => answer.push(&item),
                        Err(status) => answer.status = Some(status),
                    }
                }
                answer
            })
        })
    }
}

/// `run` on the request decoded from `message`, or INTERNAL naming the
/// message type when it does not decode.
fn decoded<Req: RpcRequest>(
    message: &[u8],
    run: impl FnOnce(Req) -> BoxFuture<'static, Answer>,
) -> BoxFuture<'static, Answer> {
    match Req::decode(message) {
        Ok(request) => run(request),
        Err(e) => Box::pin(futures::future::ready(Answer::failed(Status::internal(
            format!(
                "the request is not a valid {} message: {e}",
                Req::METHOD.info().request
            ),
        )))),
    }
}

/// A call's answer before it is written: its messages, each with gRPC's
/// 5-byte prefix, and its status unless OK.
#[derive(Debug, Default)]
pub(crate) struct Answer {
    pub(crate) messages: Vec<u8>,
    pub(crate) status: Option<Status>,
}

impl Answer {
    fn failed(status: Status) -> Self {
        Self {
            messages: Vec::new(),
            status: Some(status),
        }
    }

    /// Appends one message: uncompressed, its length, its encoding. One
    /// too large for gRPC's 4-byte length ends the answer instead.
    fn push(&mut self, message: &impl prost::Message) {
        let len = message.encoded_len();
        let Ok(prefix) = u32::try_from(len) else {
            self.status = Some(Status::resource_exhausted(format!(
                "an answer message of {len} bytes does not fit gRPC's framing"
            )));
            return;
        };
        self.messages.reserve(5 + len);
        self.messages.push(0);
        self.messages.extend_from_slice(&prefix.to_be_bytes());
        // Encoding into a Vec only fails for want of capacity, reserved above.
        let _ = message.encode(&mut self.messages);
    }
}

/// Maps driver errors to statuses and a panic while producing an item to
/// INTERNAL (which ends the stream).
fn into_status_stream<T: Send + 'static>(
    stream: CsiStream<T>,
) -> impl Stream<Item = Result<T, Status>> + Send + Unpin {
    AssertUnwindSafe(stream)
        .catch_unwind()
        .map(|item| match item {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(Status::from(e)),
            Err(_) => Err(Status::internal("internal error: the driver panicked")),
        })
}
