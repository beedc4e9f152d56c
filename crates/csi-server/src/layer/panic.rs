//! Turns a panic in a driver method into INTERNAL for that call; the
//! server keeps serving.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::task::{Context, Poll};

use futures::future::{Either, ErrInto};
use futures::{FutureExt, TryFutureExt};
use tower::{Layer, Service};

use super::{CsiCall, CsiFuture};
use crate::error::CsiError;
use crate::request::CsiRequest;

/// Catches panics below it, in `call` and in the future it returns.
#[derive(Debug, Clone, Copy, Default)]
pub struct CatchPanicLayer;

impl<S> Layer<S> for CatchPanicLayer {
    type Service = CatchPanic<S>;

    fn layer(&self, inner: S) -> CatchPanic<S> {
        CatchPanic { inner, on: true }
    }
}

/// The service of [`CatchPanicLayer`].
#[derive(Debug, Clone)]
pub struct CatchPanic<S> {
    inner: S,
    on: bool,
}

impl<S> CatchPanic<S> {
    /// Around `inner`, or passing calls straight through when `on` is false.
    pub(crate) fn switched(inner: S, on: bool) -> Self {
        Self { inner, on }
    }
}

fn internal(
    method: csi_proto::methods::Method,
    request_id: u64,
    payload: &(dyn Any + Send),
) -> CsiError {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    ::tracing::error!(%method, request_id, panic = %what, "driver panicked");
    CsiError::Internal(format!("internal error: {method} panicked in the driver"))
}

impl<S, Req> Service<CsiCall<Req>> for CatchPanic<S>
where
    Req: CsiRequest,
    S: Service<CsiCall<Req>, Response = Req::Output>,
    S::Error: Into<CsiError>,
    S::Future: Send + 'static,
{
    type Response = Req::Output;
    type Error = CsiError;
    type Future = Either<ErrInto<S::Future, CsiError>, CsiFuture<Req::Output>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), CsiError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, call: CsiCall<Req>) -> Self::Future {
        if !self.on {
            return Either::Left(self.inner.call(call).err_into());
        }
        let method = Req::METHOD;
        let request_id = call.ctx.request_id;
        // AssertUnwindSafe: after a panic the call's state is dropped, and
        // shared state is only reachable through locks that tolerate poison.
        let future = match std::panic::catch_unwind(AssertUnwindSafe(|| self.inner.call(call))) {
            Ok(future) => future,
            Err(payload) => {
                let err = internal(method, request_id, &*payload);
                return Either::Right(Box::pin(futures::future::ready(Err(err))));
            }
        };
        Either::Right(Box::pin(AssertUnwindSafe(future).catch_unwind().map(
            move |outcome| match outcome {
                Ok(result) => result.map_err(Into::into),
                Err(payload) => Err(internal(method, request_id, &*payload)),
            },
        )))
    }
}
