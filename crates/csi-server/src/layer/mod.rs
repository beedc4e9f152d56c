//! Middleware as [`tower`] layers over a typed call. Every RPC becomes a
//! [`CsiCall<Req>`] (the request and its [`CallContext`]) sent to a
//! [`tower::Service`] whose response is the driver's answer
//! ([`CsiRequest::Output`]) and whose error is a [`CsiError`]. Each built-in
//! layer is a `tower::Layer` generic over the request type, bounded by
//! [`CsiRequest`], so it reads the request's method, lock keys and rules
//! without downcasts; any other tower layer (a timeout, a concurrency
//! limit, your own) composes with them, at any position
//! ([`ServerBuilder::layer_at`](crate::ServerBuilder::layer_at)).
//!
//! The default order, outermost first: tracing, metrics, panic catching,
//! RPC capability gating, validation, field-level capability rules,
//! readiness (Probe only), locking, driver.
//!
//! A layer of your own is an ordinary tower layer:
//!
//! ```
//! use std::task::{Context, Poll};
//! use csi_server::layer::CsiCall;
//! use csi_server::{CsiError, CsiRequest};
//!
//! /// Refuses every call while maintenance is on.
//! #[derive(Clone)]
//! struct Maintenance<S>(S);
//!
//! impl<S, Req> tower::Service<CsiCall<Req>> for Maintenance<S>
//! where
//!     Req: CsiRequest,
//!     S: tower::Service<CsiCall<Req>, Response = Req::Output, Error = CsiError>,
//! {
//!     type Response = Req::Output;
//!     type Error = CsiError;
//!     type Future = futures::future::Either<
//!         S::Future,
//!         futures::future::Ready<Result<Req::Output, CsiError>>,
//!     >;
//!
//!     fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), CsiError>> {
//!         self.0.poll_ready(cx)
//!     }
//!
//!     fn call(&mut self, call: CsiCall<Req>) -> Self::Future {
//!         if Req::METHOD.name().starts_with("Create") {
//!             let busy = CsiError::Unavailable("maintenance".into());
//!             return futures::future::Either::Right(futures::future::ready(Err(busy)));
//!         }
//!         futures::future::Either::Left(self.0.call(call))
//!     }
//! }
//! // Added with `ServerBuilder::layer(tower::layer::layer_fn(Maintenance))`.
//! ```

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use tower::util::BoxCloneSyncService;
use tower::{Service, ServiceExt};

use crate::driver::CallContext;
use crate::error::CsiError;
use crate::request::CsiRequest;

mod gating;
mod locking;
#[cfg(feature = "metrics")]
mod metrics;
mod panic;
mod precheck;
mod readiness;
mod tracing;
mod validation;
mod wrap;

/// The future of a layer that passes a call on to the service below (its
/// error converted into [`CsiError`]) or answers it itself with `A`.
pub(crate) type PassOr<F, A> = futures::future::Either<futures::future::ErrInto<F, CsiError>, A>;

pub use gating::{Gating, GatingLayer};
pub use locking::{LockGuard, LockMap, Locking, LockingLayer};
#[cfg(feature = "metrics")]
pub use metrics::{Metrics, MetricsLayer, MetricsTask};
pub use panic::{CatchPanic, CatchPanicLayer};
pub use precheck::{Precheck, Prechecked};
pub use readiness::{Readiness, ReadinessLayer, ReadinessService, ReadinessState};
pub use tracing::{Tracing, TracingLayer};
pub use validation::{Validation, ValidationLayer};
pub use wrap::{Wrap, WrapFuture, WrapInner, Wrapped};

/// One call on its way to the driver: the request and what the driver
/// method will be given besides it.
pub struct CsiCall<Req> {
    /// The call's context (request id, method, declaration).
    pub ctx: CallContext,
    /// The request; its `Debug` redacts secrets.
    pub request: Req,
}

impl<Req: CsiRequest> CsiCall<Req> {
    /// A call with an empty declaration, for running layers outside a server.
    pub fn new(request_id: u64, request: Req) -> Self {
        Self {
            ctx: CallContext::detached(request_id, Req::METHOD),
            request,
        }
    }

    /// A call with the given context.
    pub fn with_context(ctx: CallContext, request: Req) -> Self {
        Self { ctx, request }
    }
}

impl<Req: fmt::Debug> fmt::Debug for CsiCall<Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CsiCall")
            .field("request_id", &self.ctx.request_id)
            .field("method", &self.ctx.method)
            .field("request", &self.request)
            .finish()
    }
}

/// What a call through the stack returns.
pub type CsiFuture<T> = BoxFuture<'static, Result<T, CsiError>>;

/// A type-erased service for one request type.
#[doc(hidden)]
pub type Slot<Req> = BoxCloneSyncService<CsiCall<Req>, <Req as CsiRequest>::Output, CsiError>;

macro_rules! erased {
    (() $($svc:ident {
        unary: [$($m:ident { rust: $fn:ident, request: $req:ident, response: $resp:ident, $($_uk:ident: $_uv:tt,)* })*],
        server_streaming: [$($sm:ident { rust: $sfn:ident, request: $sreq:ident, response: $sresp:ident, $($_sk:ident: $_sv:tt,)* })*],
        $($_k:ident: $_v:tt,)*
    })*) => {
        /// A service that serves every CSI request type: what a stack of
        /// layers over the driver is. Implemented by every service that is
        /// a `tower::Service<CsiCall<Req>>` for each request type `Req`
        /// (answering `Req::Output`, failing with an error that converts
        /// into [`CsiError`]), is `Clone + Send + Sync + 'static`, and whose
        /// futures are `Send + 'static`.
        pub trait CsiService: Clone + Send + Sync + 'static
            $($( + Service<CsiCall<csi_proto::v1::$req>, Response = <csi_proto::v1::$req as CsiRequest>::Output, Error: Into<CsiError>, Future: Send + 'static> )*
              $( + Service<CsiCall<csi_proto::v1::$sreq>, Response = <csi_proto::v1::$sreq as CsiRequest>::Output, Error: Into<CsiError>, Future: Send + 'static> )*)*
        {
        }

        impl<S> CsiService for S where S: Clone + Send + Sync + 'static
            $($( + Service<CsiCall<csi_proto::v1::$req>, Response = <csi_proto::v1::$req as CsiRequest>::Output, Error: Into<CsiError>, Future: Send + 'static> )*
              $( + Service<CsiCall<csi_proto::v1::$sreq>, Response = <csi_proto::v1::$sreq as CsiRequest>::Output, Error: Into<CsiError>, Future: Send + 'static> )*)*
        {
        }

        /// One boxed service per request type.
        #[doc(hidden)]
        pub struct Slots {
            $($( $fn: Slot<csi_proto::v1::$req>, )* $( $sfn: Slot<csi_proto::v1::$sreq>, )*)*
        }

        impl BoxCsiService {
            /// Boxes `service` once per request type.
            pub fn new<S: CsiService>(service: S) -> Self {
                Self(Arc::new(Slots {
                    $($(
                        $fn: BoxCloneSyncService::new(
                            <S as ServiceExt<CsiCall<csi_proto::v1::$req>>>::map_err(service.clone(), Into::into),
                        ),
                    )* $(
                        $sfn: BoxCloneSyncService::new(
                            <S as ServiceExt<CsiCall<csi_proto::v1::$sreq>>>::map_err(service.clone(), Into::into),
                        ),
                    )*)*
                }))
            }
        }

        $($(
            impl ErasedRequest for csi_proto::v1::$req {
                fn slot(slots: &Slots) -> &Slot<Self> {
                    &slots.$fn
                }
            }
        )* $(
            impl ErasedRequest for csi_proto::v1::$sreq {
                fn slot(slots: &Slots) -> &Slot<Self> {
                    &slots.$sfn
                }
            }
        )*)*
    };
}

csi_proto::for_each_method!(erased);

/// A request type [`BoxCsiService`] has a slot for: every CSI request.
#[doc(hidden)]
pub trait ErasedRequest: CsiRequest {
    /// This type's boxed service.
    fn slot(slots: &Slots) -> &Slot<Self>;
}

/// A [`CsiService`] behind one box per request type: cheap to clone,
/// `Send + Sync`, and a `CsiService` itself, so any layer can wrap it.
/// Each call clones the boxed service for its request type and drives it
/// to readiness before calling it.
#[derive(Clone)]
pub struct BoxCsiService(Arc<Slots>);

impl fmt::Debug for BoxCsiService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BoxCsiService")
    }
}

impl BoxCsiService {
    /// Sends one call through the stack (readiness included).
    pub fn call_one<Req: ErasedRequest>(&self, call: CsiCall<Req>) -> OneCall<Req> {
        Req::slot(&self.0).clone().oneshot(call)
    }
}

/// The future of one call through a [`BoxCsiService`].
pub type OneCall<Req> = tower::util::Oneshot<Slot<Req>, CsiCall<Req>>;

impl<Req: ErasedRequest> Service<CsiCall<Req>> for BoxCsiService {
    type Response = Req::Output;
    type Error = CsiError;
    type Future = OneCall<Req>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), CsiError>> {
        // Readiness is that of the clone each call makes (see `call_one`).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: CsiCall<Req>) -> Self::Future {
        self.call_one(call)
    }
}
