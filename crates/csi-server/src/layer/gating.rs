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

use tower::Layer;

use super::CsiCall;
use super::precheck::{Precheck, Prechecked};
use crate::capabilities::Capabilities;
use crate::error::CsiError;
use crate::request::CsiRequest;

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

    /// The decision for one request, without running it.
    pub fn check<Req: CsiRequest>(&self, request: &Req) -> Result<(), CsiError> {
        if self.rpcs
            && let Some(req) = Req::METHOD.requirement()
            && !self.capabilities.satisfies(req)
        {
            return Err(CsiError::Unimplemented(format!(
                "{} is not supported: the plugin does not declare {}",
                Req::METHOD,
                req.as_str_name()
            )));
        }
        if self.fields {
            request.check_capabilities(&self.capabilities)?;
        }
        Ok(())
    }
}

impl Precheck for GatingLayer {
    fn answer<Req: CsiRequest>(
        &self,
        call: &CsiCall<Req>,
    ) -> Option<Result<Req::Output, CsiError>> {
        self.check(&call.request).err().map(Err)
    }
}

impl<S> Layer<S> for GatingLayer {
    type Service = Gating<S>;

    fn layer(&self, inner: S) -> Gating<S> {
        self.switched(inner, true)
    }
}

/// The service of [`GatingLayer`].
pub type Gating<S> = Prechecked<GatingLayer, S>;
