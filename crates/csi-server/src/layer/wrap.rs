//! The shape shared by the layers that wrap every call and its future:
//! tracing, metrics, panic catching.

use std::task::{Context, Poll};

use futures::TryFutureExt;
use futures::future::Either;
use tower::Service;

use super::{CsiCall, CsiFuture, PassOr};
use crate::error::CsiError;
use crate::request::CsiRequest;

/// A service below a wrapping layer, for request type `Req`: it answers
/// `Req::Output`, fails with an error that converts into [`CsiError`], and
/// its futures are `Send + 'static` (what [`Wrap::around`] may box).
pub trait WrapInner<Req: CsiRequest>:
    Service<CsiCall<Req>, Response = Req::Output, Error: Into<CsiError>, Future: Send + 'static>
{
}

impl<Req, S> WrapInner<Req> for S
where
    Req: CsiRequest,
    S: Service<CsiCall<Req>, Response = Req::Output>,
    S::Error: Into<CsiError>,
    S::Future: Send + 'static,
{
}

/// What a wrapping layer does around one call of the service below.
pub trait Wrap: Clone {
    /// Calls `inner` with `call`, doing this layer's work around the call
    /// and its future.
    fn around<Req: CsiRequest, S: WrapInner<Req>>(
        &self,
        inner: &mut S,
        call: CsiCall<Req>,
    ) -> CsiFuture<Req::Output>;

    /// Around `inner`, or passing calls straight through when `on` is false
    /// (the server keeps every built-in layer in one type this way).
    fn switched<S>(&self, inner: S, on: bool) -> Wrapped<Self, S> {
        Wrapped {
            wrap: self.clone(),
            inner,
            on,
        }
    }
}

/// The service of a [`Wrap`] layer ([`Tracing`](super::Tracing),
/// [`CatchPanic`](super::CatchPanic), and `Metrics` with feature `metrics`).
#[derive(Debug, Clone)]
pub struct Wrapped<W, S> {
    wrap: W,
    inner: S,
    on: bool,
}

impl<W: Wrap, S: WrapInner<Req>, Req: CsiRequest> Service<CsiCall<Req>> for Wrapped<W, S> {
    type Response = Req::Output;
    type Error = CsiError;
    type Future = PassOr<S::Future, CsiFuture<Req::Output>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), CsiError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, call: CsiCall<Req>) -> Self::Future {
        if !self.on {
            return Either::Left(self.inner.call(call).err_into());
        }
        Either::Right(self.wrap.around(&mut self.inner, call))
    }
}
