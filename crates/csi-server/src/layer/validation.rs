//! Rejects requests that break the spec's field rules before the driver (or
//! any lookup) sees them.

use std::task::{Context, Poll};

use futures::TryFutureExt;
use futures::future::{Either, ErrInto, Ready, ready};
use tower::{Layer, Service};

use super::CsiCall;
use crate::error::CsiError;
use crate::request::CsiRequest;

/// Runs [`CsiRequest::validate`] on every request; a failure is answered
/// without calling the service below.
#[derive(Debug, Clone, Copy, Default)]
pub struct ValidationLayer;

impl<S> Layer<S> for ValidationLayer {
    type Service = Validation<S>;

    fn layer(&self, inner: S) -> Validation<S> {
        Validation { inner }
    }
}

/// The service of [`ValidationLayer`].
#[derive(Debug, Clone)]
pub struct Validation<S> {
    inner: S,
}

impl<S, Req> Service<CsiCall<Req>> for Validation<S>
where
    Req: CsiRequest,
    S: Service<CsiCall<Req>, Response = Req::Output>,
    S::Error: Into<CsiError>,
{
    type Response = Req::Output;
    type Error = CsiError;
    type Future = Either<ErrInto<S::Future, CsiError>, Ready<Result<Req::Output, CsiError>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), CsiError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, call: CsiCall<Req>) -> Self::Future {
        match call.request.validate() {
            Ok(()) => Either::Left(self.inner.call(call).err_into()),
            Err(e) => Either::Right(ready(Err(e))),
        }
    }
}
