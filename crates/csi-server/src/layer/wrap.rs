//! The shape shared by the layers that wrap a call and its future:
//! tracing, metrics, panic catching, locking.

use std::task::{Context, Poll};

use futures::TryFutureExt;
use futures::future::{Either, ErrInto};
use tower::Service;

use super::{CsiCall, CsiFuture};
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

/// What a wrapping layer does around one call of the service `S` below.
///
/// Generic over `S` so a layer can ask more of the service below than
/// [`WrapInner`] does: locking clones it into the task that owns the work.
pub trait Wrap<S>: Clone {
    /// Calls `inner` with `call`, doing this layer's work around the call
    /// and its future, or passing the call straight on
    /// ([`Either::Left`](futures::future::Either::Left)) when there is no
    /// work to do for it.
    fn around<Req: CsiRequest>(&self, inner: &mut S, call: CsiCall<Req>) -> WrapFuture<S, Req>
    where
        S: WrapInner<Req>;

    /// Around `inner`, or passing calls straight through when `on` is false
    /// (the server keeps every built-in layer in one type this way).
    fn switched(&self, inner: S, on: bool) -> Wrapped<Self, S> {
        Wrapped::new(self.clone(), inner, on)
    }
}

/// The future of [`Wrap::around`]: the service below's own, its error
/// converted, or the layer's boxed one.
pub type WrapFuture<S, Req> = Either<
    ErrInto<<S as Service<CsiCall<Req>>>::Future, CsiError>,
    CsiFuture<<Req as CsiRequest>::Output>,
>;

/// The service of a [`Wrap`] layer ([`Tracing`](super::Tracing),
/// [`CatchPanic`](super::CatchPanic), [`Locking`](super::Locking), and
/// `Metrics` with feature `metrics`).
#[derive(Debug, Clone)]
pub struct Wrapped<W, S> {
    wrap: W,
    inner: S,
    on: bool,
}

impl<W, S> Wrapped<W, S> {
    /// `wrap` around `inner`; with `on` false, calls pass straight through.
    pub(crate) fn new(wrap: W, inner: S, on: bool) -> Self {
        Self { wrap, inner, on }
    }
}

impl<W: Wrap<S>, S: WrapInner<Req>, Req: CsiRequest> Service<CsiCall<Req>> for Wrapped<W, S> {
    type Response = Req::Output;
    type Error = CsiError;
    type Future = WrapFuture<S, Req>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), CsiError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, call: CsiCall<Req>) -> Self::Future {
        if !self.on {
            return Either::Left(self.inner.call(call).err_into());
        }
        self.wrap.around(&mut self.inner, call)
    }
}
