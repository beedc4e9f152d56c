//! Turns a panic in a driver method into INTERNAL for that call; the
//! server keeps serving.

use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use futures::future::BoxFuture;

use super::{Call, CallResult, Layer, Next};
use crate::error::CsiError;

/// Catches panics below it.
#[derive(Debug, Clone, Copy, Default)]
pub struct CatchPanicLayer;

impl Layer for CatchPanicLayer {
    fn call<'a>(&'a self, call: Call, next: Next<'a>) -> BoxFuture<'a, CallResult> {
        let method = call.method;
        let request_id = call.request_id;
        // AssertUnwindSafe: after a panic the call's state is dropped, and
        // shared state is only reachable through locks that tolerate poison.
        Box::pin(AssertUnwindSafe(next.run(call)).catch_unwind().map(
            move |outcome| match outcome {
                Ok(result) => result,
                Err(payload) => {
                    let what = payload
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| payload.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    ::tracing::error!(%method, request_id, panic = %what, "driver panicked");
                    Err(CsiError::Internal(format!(
                        "internal error: {method} panicked in the driver"
                    )))
                }
            },
        ))
    }
}
