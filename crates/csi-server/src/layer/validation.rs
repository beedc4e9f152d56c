//! Rejects requests that break the spec's field rules before the driver (or
//! any lookup) sees them.

use tower::Layer;

use super::CsiCall;
use super::precheck::{Precheck, Prechecked};
use crate::error::CsiError;
use crate::request::CsiRequest;

/// Runs [`CsiRequest::validate`] on every request; a failure is answered
/// without calling the service below.
#[derive(Debug, Clone, Copy, Default)]
pub struct ValidationLayer;

impl Precheck for ValidationLayer {
    fn answer<Req: CsiRequest>(
        &self,
        call: &CsiCall<Req>,
    ) -> Option<Result<Req::Output, CsiError>> {
        call.request.validate().err().map(Err)
    }
}

impl<S> Layer<S> for ValidationLayer {
    type Service = Validation<S>;

    fn layer(&self, inner: S) -> Validation<S> {
        self.switched(inner, true)
    }
}

/// The service of [`ValidationLayer`].
pub type Validation<S> = Prechecked<ValidationLayer, S>;
