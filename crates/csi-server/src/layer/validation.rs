//! Rejects requests that break the spec's field rules before the driver (or
//! any lookup) sees them.

use futures::future::{self, BoxFuture};

use super::{Call, CallResult, Layer, Next};

/// Runs [`Validate`](crate::Validate) on every request; a failure is
/// answered without calling the driver.
#[derive(Debug, Clone, Copy, Default)]
pub struct ValidationLayer;

impl Layer for ValidationLayer {
    fn call<'a>(&'a self, call: Call, next: Next<'a>) -> BoxFuture<'a, CallResult> {
        match call.request().validate_request() {
            Ok(()) => next.run(call),
            Err(e) => Box::pin(future::ready(Err(e))),
        }
    }
}
