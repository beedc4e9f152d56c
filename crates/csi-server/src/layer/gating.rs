//! Answers UNIMPLEMENTED for RPCs whose capability was not declared, and
//! applies the field-level capability rules (staging path, content
//! sources, mutable parameters).

use std::sync::Arc;

use futures::future::{self, BoxFuture};

use super::{Call, CallResult, Layer, Next};
use crate::capabilities::Capabilities;
use crate::error::CsiError;

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

    /// The decision for one call, without running it.
    pub fn check(&self, call: &Call) -> Result<(), CsiError> {
        if let Some(req) = call.method.requirement() {
            if !self.capabilities.satisfies(req) {
                return Err(CsiError::Unimplemented(format!(
                    "{} is not supported: the plugin does not declare {}",
                    call.method,
                    requirement_name(req)
                )));
            }
        }
        call.request().check_capabilities(&self.capabilities)
    }
}

fn requirement_name(req: crate::method::Requirement) -> &'static str {
    use crate::method::Requirement as R;
    match req {
        R::Controller(r) => r.as_str_name(),
        R::Node(r) => r.as_str_name(),
        R::GroupController(r) => r.as_str_name(),
        R::Plugin(s) => s.as_str_name(),
    }
}

impl Layer for GatingLayer {
    fn call<'a>(&'a self, call: Call, next: Next<'a>) -> BoxFuture<'a, CallResult> {
        match self.check(&call) {
            Ok(()) => next.run(call),
            Err(e) => Box::pin(future::ready(Err(e))),
        }
    }
}
