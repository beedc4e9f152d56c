//! Turns a panic in a driver method into INTERNAL for that call; the
//! server keeps serving.

use std::any::Any;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use futures::future::Either;
use tower::Layer;

use super::CsiCall;
use super::wrap::{Wrap, WrapFuture, WrapInner, Wrapped};
use crate::error::CsiError;
use crate::request::CsiRequest;

/// Catches panics below it, in `call` and in the future it returns.
#[derive(Debug, Clone, Copy, Default)]
pub struct CatchPanicLayer;

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

impl<S> Layer<S> for CatchPanicLayer {
    type Service = CatchPanic<S>;

    fn layer(&self, inner: S) -> CatchPanic<S> {
        self.switched(inner, true)
    }
}

/// The service of [`CatchPanicLayer`].
pub type CatchPanic<S> = Wrapped<CatchPanicLayer, S>;

impl<S> Wrap<S> for CatchPanicLayer {
    fn around<Req: CsiRequest>(&self, inner: &mut S, call: CsiCall<Req>) -> WrapFuture<S, Req>
    where
        S: WrapInner<Req>,
    {
        let method = Req::METHOD;
        let request_id = call.ctx.request_id;
        // AssertUnwindSafe: after a panic the call's state is dropped, and
        // shared state is only reachable through locks that tolerate poison.
        let future = match std::panic::catch_unwind(AssertUnwindSafe(|| inner.call(call))) {
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
