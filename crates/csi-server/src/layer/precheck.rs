//! The shape shared by the layers that may answer a call themselves before
//! the service below sees it: capability gating, validation, readiness.

use std::task::{Context, Poll};

use futures::TryFutureExt;
use futures::future::{Either, Ready, ready};
use tower::Service;

use super::{CsiCall, PassOr};
use crate::error::CsiError;
use crate::request::CsiRequest;

/// A decision taken on a call before the service below sees it.
pub trait Precheck: Clone {
    /// `Some(answer)` answers the call here; `None` passes it on.
    fn answer<Req: CsiRequest>(&self, call: &CsiCall<Req>)
    -> Option<Result<Req::Output, CsiError>>;

    /// Around `inner`, or passing calls straight through when `on` is false
    /// (the server keeps every built-in layer in one type this way).
    fn switched<S>(&self, inner: S, on: bool) -> Prechecked<Self, S> {
        Prechecked {
            check: self.clone(),
            inner,
            on,
        }
    }
}

/// The service of a [`Precheck`] layer ([`Gating`](super::Gating),
/// [`Validation`](super::Validation), [`ReadinessService`](super::ReadinessService)).
#[derive(Debug, Clone)]
pub struct Prechecked<P, S> {
    check: P,
    inner: S,
    on: bool,
}

impl<P, S, Req> Service<CsiCall<Req>> for Prechecked<P, S>
where
    P: Precheck,
    Req: CsiRequest,
    S: Service<CsiCall<Req>, Response = Req::Output>,
    S::Error: Into<CsiError>,
{
    type Response = Req::Output;
    type Error = CsiError;
    type Future = PassOr<S::Future, Ready<Result<Req::Output, CsiError>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), CsiError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, call: CsiCall<Req>) -> Self::Future {
        if self.on
            && let Some(answer) = self.check.answer(&call)
        {
            return Either::Right(ready(answer));
        }
        Either::Left(self.inner.call(call).err_into())
    }
}
