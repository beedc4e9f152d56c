//! Answers UNIMPLEMENTED for RPCs whose capability was not declared, and
//! applies the field-level capability rules (staging path, content
//! sources, mutable parameters).
//!
//! The two are separate decisions with a validation step between them: an
//! undeclared RPC is UNIMPLEMENTED whatever the request holds, but a
//! request missing a required field is INVALID_ARGUMENT before any
//! capability rule (a NodePublishVolume without volume_id and without
//! staging_target_path is INVALID_ARGUMENT, not FAILED_PRECONDITION). The
//! server therefore runs [`GatingLayer::rpcs`] before the validation layer
//! and [`GatingLayer::fields`] after it.

use std::sync::Arc;

use futures::future::{self, BoxFuture};

use super::{Call, CallResult, Layer, Next};
use crate::capabilities::Capabilities;
use crate::error::CsiError;

/// Capability gating against the declared [`Capabilities`].
#[derive(Debug, Clone)]
pub struct GatingLayer {
    capabilities: Arc<Capabilities>,
    rpcs: bool,
    fields: bool,
}

impl GatingLayer {
    /// Both decisions in one layer, the RPC first (for stacks without a
    /// validation layer).
    pub fn new(capabilities: Capabilities) -> Self {
        Self {
            capabilities: Arc::new(capabilities),
            rpcs: true,
            fields: true,
        }
    }

    /// Only the RPC decision: UNIMPLEMENTED for an undeclared RPC.
    pub fn rpcs(capabilities: Capabilities) -> Self {
        Self {
            fields: false,
            ..Self::new(capabilities)
        }
    }

    /// Only the field-level rules, for a layer inside validation.
    pub fn fields(capabilities: Capabilities) -> Self {
        Self {
            rpcs: false,
            ..Self::new(capabilities)
        }
    }

    /// The decision for one call, without running it.
    pub fn check(&self, call: &Call) -> Result<(), CsiError> {
        if self.rpcs {
            if let Some(req) = call.method.requirement() {
                if !self.capabilities.satisfies(req) {
                    return Err(CsiError::Unimplemented(format!(
                        "{} is not supported: the plugin does not declare {}",
                        call.method,
                        requirement_name(req)
                    )));
                }
            }
        }
        if self.fields {
            call.request().check_capabilities(&self.capabilities)?;
        }
        Ok(())
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
