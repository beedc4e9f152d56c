//! Turns a panic in a driver method into INTERNAL for that call; the
//! server keeps serving.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::task::{Context, Poll};

use futures::FutureExt;
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
        CatchPanic { inner }
    }
}

/// The service of [`CatchPanicLayer`].
#[derive(Debug, Clone)]
pub struct CatchPanic<S> {
    inner: S,
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
    type Future = CsiFuture<Req::Output>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), CsiError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, call: CsiCall<Req>) -> Self::Future {
        let method = Req::METHOD;
        let request_id = call.ctx.request_id;
        // AssertUnwindSafe: after a panic the call's state is dropped, and
        // shared state is only reachable through locks that tolerate poison.
        let future = match std::panic::catch_unwind(AssertUnwindSafe(|| self.inner.call(call))) {
            Ok(future) => future,
            Err(payload) => {
                let err = internal(method, request_id, &*payload);
                return Box::pin(futures::future::ready(Err(err)));
            }
        };
        Box::pin(
            AssertUnwindSafe(future)
                .catch_unwind()
                .map(move |outcome| match outcome {
                    Ok(result) => result.map_err(Into::into),
                    Err(payload) => Err(internal(method, request_id, &*payload)),
                }),
        )
    }
}
