//! Middleware as layers around the driver. Every RPC goes through one
//! generic dispatch that wraps the request in a type-erased [`Call`] and runs
//! the [`Stack`]; each layer sees the call, may answer or fail it, or pass
//! it on with [`Next::run`].
//!
//! The default order, outermost first: tracing, metrics, panic catching,
//! RPC capability gating, validation, field-level capability rules,
//! readiness (Probe only), locking, driver.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::error::CsiError;
use crate::method::Method;
use crate::request::CsiRequest;

mod gating;
mod locking;
#[cfg(feature = "metrics")]
mod metrics;
mod panic;
mod readiness;
mod tracing;
mod validation;

pub use gating::GatingLayer;
pub use locking::{LockMap, LockingLayer};
#[cfg(feature = "metrics")]
pub use metrics::{MetricsLayer, MetricsTask};
pub use panic::CatchPanicLayer;
pub use readiness::{Readiness, ReadinessLayer, ReadinessState};
pub use tracing::TracingLayer;
pub use validation::ValidationLayer;

/// One call on its way to the driver.
pub struct Call {
    /// A per-server counter.
    pub request_id: u64,
    /// The RPC.
    pub method: Method,
    request: Box<dyn CsiRequest>,
}

impl Call {
    /// Wraps a request.
    pub fn new(request_id: u64, request: impl CsiRequest) -> Self {
        Self {
            request_id,
            method: request.method(),
            request: Box::new(request),
        }
    }

    /// The request, for inspection (its `Debug` redacts secrets).
    pub fn request(&self) -> &dyn CsiRequest {
        &*self.request
    }

    fn into_request<T: CsiRequest>(self) -> Result<T, CsiError> {
        self.request
            .into_any()
            .downcast::<T>()
            .map(|b| *b)
            .map_err(|_| CsiError::Internal("request type does not match the method".into()))
    }
}

impl fmt::Debug for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Call")
            .field("request_id", &self.request_id)
            .field("method", &self.method)
            .field("request", &self.request)
            .finish()
    }
}

trait AnyDebug: Any + fmt::Debug + Send {
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;
}

impl<T: Any + fmt::Debug + Send> AnyDebug for T {
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
}

/// A driver response, type-erased while it travels back through the layers.
pub struct BoxResponse(Box<dyn AnyDebug>);

impl BoxResponse {
    /// Wraps a response.
    pub fn new<T: Any + fmt::Debug + Send>(response: T) -> Self {
        Self(Box::new(response))
    }

    /// The concrete response, or `None` if it is another type.
    pub fn downcast<T: Any>(self) -> Option<T> {
        self.0.into_any().downcast::<T>().ok().map(|b| *b)
    }
}

impl fmt::Debug for BoxResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// What a layer returns.
pub type CallResult = Result<BoxResponse, CsiError>;

type Endpoint<'a> = Box<dyn FnOnce(Call) -> BoxFuture<'static, CallResult> + Send + 'a>;

/// The rest of the stack below a layer.
pub struct Next<'a> {
    layers: &'a [Arc<dyn Layer>],
    endpoint: Endpoint<'a>,
}

impl<'a> Next<'a> {
    /// Passes the call to the next layer, or to the driver.
    pub fn run(self, call: Call) -> BoxFuture<'a, CallResult> {
        match self.layers.split_first() {
            Some((layer, rest)) => layer.call(
                call,
                Next {
                    layers: rest,
                    endpoint: self.endpoint,
                },
            ),
            None => (self.endpoint)(call),
        }
    }
}

/// A middleware layer.
pub trait Layer: Send + Sync + 'static {
    /// Handles `call`, usually by doing something around `next.run(call)`.
    fn call<'a>(&'a self, call: Call, next: Next<'a>) -> BoxFuture<'a, CallResult>;
}

/// An ordered list of layers, outermost first.
#[derive(Clone, Default)]
pub struct Stack {
    layers: Vec<Arc<dyn Layer>>,
}

impl fmt::Debug for Stack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stack")
            .field("layers", &self.layers.len())
            .finish()
    }
}

impl Stack {
    /// An empty stack: calls go straight to the driver.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a layer inside the ones already pushed.
    pub fn push(mut self, layer: impl Layer) -> Self {
        self.layers.push(Arc::new(layer));
        self
    }

    /// Adds a shared layer inside the ones already pushed.
    pub fn push_arc(mut self, layer: Arc<dyn Layer>) -> Self {
        self.layers.push(layer);
        self
    }

    /// The number of layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// Whether the stack has no layers.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// Runs `request` through the layers and then `handler`.
    pub async fn call<Req, Resp, F, Fut>(
        &self,
        request_id: u64,
        request: Req,
        handler: F,
    ) -> Result<Resp, CsiError>
    where
        Req: CsiRequest,
        Resp: Any + fmt::Debug + Send,
        F: FnOnce(Req) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Resp, CsiError>> + Send + 'static,
    {
        let endpoint: Endpoint<'_> = Box::new(move |call: Call| {
            Box::pin(async move {
                let req = call.into_request::<Req>()?;
                handler(req).await.map(BoxResponse::new)
            })
        });
        let next = Next {
            layers: &self.layers,
            endpoint,
        };
        let response = next.run(Call::new(request_id, request)).await?;
        response.downcast::<Resp>().ok_or_else(|| {
            CsiError::Internal("a layer answered with the wrong response type".into())
        })
    }
}
