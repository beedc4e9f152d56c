//! Answers UNIMPLEMENTED for RPCs whose capability was not declared, and
//! applies the field-level capability rules (staging path, content
//! sources, mutable parameters).

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::TryFutureExt;
use futures::future::{Either, ErrInto, Ready, ready};
use tower::{Layer, Service};

use super::CsiCall;
use crate::capabilities::Capabilities;
use crate::error::CsiError;
use crate::request::CsiRequest;

/// Capability gating against the declared [`Capabilities`].
#[derive(Debug, Clone)]
pub struct GatingLayer {
    capabilities: Arc<Capabilities>,
}

impl GatingLayer {
    /// Gates by `capabilities`.
    pub fn new(capabilities: Capabilities) -> Self {
        Self {
            capabilities: Arc::new(capabilities),
        }
    }

    /// The decision for one request, without running it.
    pub fn check<Req: CsiRequest>(&self, request: &Req) -> Result<(), CsiError> {
        if let Some(req) = Req::METHOD.requirement() {
            if !self.capabilities.satisfies(req) {
                return Err(CsiError::Unimplemented(format!(
                    "{} is not supported: the plugin does not declare {}",
                    Req::METHOD,
                    req.as_str_name()
                )));
            }
        }
        request.check_capabilities(&self.capabilities)
    }
}

impl<S> Layer<S> for GatingLayer {
    type Service = Gating<S>;

    fn layer(&self, inner: S) -> Gating<S> {
        Gating {
            layer: self.clone(),
            inner,
        }
    }
}

/// The service of [`GatingLayer`].
#[derive(Debug, Clone)]
pub struct Gating<S> {
    layer: GatingLayer,
    inner: S,
}

impl<S, Req> Service<CsiCall<Req>> for Gating<S>
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
        match self.layer.check(&call.request) {
            Ok(()) => Either::Left(self.inner.call(call).err_into()),
            Err(e) => Either::Right(ready(Err(e))),
        }
    }
}
