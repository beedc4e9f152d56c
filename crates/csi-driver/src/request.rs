//! What the layers need to know about any request: [`CsiRequest`],
//! implemented for every request type from the method table, and the
//! field-level capability rules.

use std::fmt;

use csi_proto::methods::RpcRequest;
use csi_proto::v1::controller_service_capability::rpc::Type as ControllerRpc;
use csi_proto::v1::node_service_capability::rpc::Type as NodeRpc;
use csi_proto::v1::volume_content_source::Type as SourceType;
use csi_proto::v1::*;

use crate::capabilities::Capabilities;
use crate::driver::ResponseStream;
use crate::error::CsiError;

pub use csi_proto::methods::{KeyKind, LockKey};

/// A CSI request as the layers see it: its RPC, lock keys and volume id
/// (from [`RpcRequest`], generated from csi.proto), its field rules
/// ([`Validate`](crate::Validate)) and its capability rules. Implemented for
/// every request type of `csi_proto::v1`; `Debug` is the redacting one from
/// csi-proto, so a layer may log the request.
pub trait CsiRequest: RpcRequest {
    /// What the driver answers: the response, or for a streaming RPC a
    /// [`ResponseStream`] of responses.
    type Output: fmt::Debug + Send + 'static;

    /// The spec's field rules ([`Validate`](crate::Validate)); `Ok` for a
    /// request without any.
    fn validate(&self) -> Result<(), CsiError>;

    /// Field-level capability rules (beyond the RPC's own capability): a
    /// content source, mutable parameters or a missing staging path the
    /// declared capabilities do not allow.
    fn check_capabilities(&self, caps: &Capabilities) -> Result<(), CsiError>;

    /// The answer of a plugin that is not ready yet, for RPCs that have one
    /// (Probe: `ready=false`).
    fn not_ready_response() -> Option<Self::Output> {
        None
    }
}

/// Picks a request's [`Validate`](crate::Validate) and [`FieldCapabilities`]
/// impls when it has them and "no rules" otherwise (autoref
/// specialization: the by-value impl wins when its bound holds), so no list
/// of rule-free requests is kept by hand.
mod rules {
    use super::{Capabilities, CsiError, FieldCapabilities};
    use crate::validate::Validate;

    pub struct Rules<'a, T>(pub &'a T);

    pub trait HasValidate {
        fn validate(&self) -> Result<(), CsiError>;
    }
    pub trait HasNoValidate {
        fn validate(&self) -> Result<(), CsiError> {
            Ok(())
        }
    }
    impl<T: Validate> HasValidate for Rules<'_, T> {
        fn validate(&self) -> Result<(), CsiError> {
            self.0.validate()
        }
    }
    impl<T> HasNoValidate for &Rules<'_, T> {}

    pub trait HasCapabilities {
        fn capabilities(&self, caps: &Capabilities) -> Result<(), CsiError>;
    }
    pub trait HasNoCapabilities {
        fn capabilities(&self, _caps: &Capabilities) -> Result<(), CsiError> {
            Ok(())
        }
    }
    impl<T: FieldCapabilities> HasCapabilities for Rules<'_, T> {
        fn capabilities(&self, caps: &Capabilities) -> Result<(), CsiError> {
            self.0.field_capabilities(caps)
        }
    }
    impl<T> HasNoCapabilities for &Rules<'_, T> {}
}

macro_rules! csi_requests {
    (() $($svc:ident {
        unary: [$($m:ident { rust: $fn:ident, request: $req:ident, response: $resp:ident, $($_uk:ident: $_uv:tt,)* })*],
        server_streaming: [$($sm:ident { rust: $sfn:ident, request: $sreq:ident, response: $sresp:ident, $($_sk:ident: $_sv:tt,)* })*],
        $($_k:ident: $_v:tt,)*
    })*) => {
        $($(
            csi_requests!(@one $req, $resp);
        )* $(
            csi_requests!(@one $sreq, ResponseStream<$sresp>);
        )*)*
    };
    (@one $req:ident, $out:ty) => {
        impl CsiRequest for $req {
            type Output = $out;

            fn validate(&self) -> Result<(), CsiError> {
                #[allow(unused_imports)]
                use rules::{HasNoValidate as _, HasValidate as _};
                (&rules::Rules(self)).validate()
            }

            fn check_capabilities(&self, caps: &Capabilities) -> Result<(), CsiError> {
                #[allow(unused_imports)]
                use rules::{HasCapabilities as _, HasNoCapabilities as _};
                (&rules::Rules(self)).capabilities(caps)
            }

            fn not_ready_response() -> Option<Self::Output> {
                not_ready_response!($req)
            }
        }
    };
}

/// Only Probe has a not-ready answer.
macro_rules! not_ready_response {
    (ProbeRequest) => {
        Some(ProbeResponse { ready: Some(false) })
    };
    ($other:ident) => {
        None
    };
}

csi_proto::for_each_method!(csi_requests);

/// Field-level capability rules of one request type. Requests without
/// any need no impl.
pub trait FieldCapabilities {
    /// `Ok` when the declared capabilities allow every field that is set.
    fn field_capabilities(&self, caps: &Capabilities) -> Result<(), CsiError>;
}

fn no_mutable_parameters(
    caps: &Capabilities,
    m: &std::collections::HashMap<String, String>,
) -> Result<(), CsiError> {
    if !m.is_empty() && !caps.has_controller(ControllerRpc::ModifyVolume) {
        return Err(CsiError::invalid(
            "mutable_parameters",
            "not supported: the plugin does not declare MODIFY_VOLUME",
        ));
    }
    Ok(())
}

/// MODIFY_VOLUME declared, and every key one the driver declared it accepts.
fn accepted_mutable_parameters(
    caps: &Capabilities,
    m: &std::collections::HashMap<String, String>,
) -> Result<(), CsiError> {
    no_mutable_parameters(caps, m)?;
    match caps.accepted_mutable_parameters() {
        Some(accepted) => {
            crate::helpers::mutable::check_accepted("mutable_parameters", m, accepted)
        }
        None => Ok(()),
    }
}

impl FieldCapabilities for CreateVolumeRequest {
    fn field_capabilities(&self, caps: &Capabilities) -> Result<(), CsiError> {
        match self
            .volume_content_source
            .as_ref()
            .and_then(|s| s.r#type.as_ref())
        {
            Some(SourceType::Snapshot(_))
                if !caps.has_controller(ControllerRpc::CreateDeleteSnapshot) =>
            {
                return Err(CsiError::invalid(
                    "volume_content_source.snapshot",
                    "not supported: the plugin does not declare CREATE_DELETE_SNAPSHOT",
                ));
            }
            Some(SourceType::Volume(_)) if !caps.has_controller(ControllerRpc::CloneVolume) => {
                return Err(CsiError::invalid(
                    "volume_content_source.volume",
                    "not supported: the plugin does not declare CLONE_VOLUME",
                ));
            }
            _ => {}
        }
        accepted_mutable_parameters(caps, &self.mutable_parameters)
    }
}

impl FieldCapabilities for ControllerModifyVolumeRequest {
    fn field_capabilities(&self, caps: &Capabilities) -> Result<(), CsiError> {
        accepted_mutable_parameters(caps, &self.mutable_parameters)
    }
}

impl FieldCapabilities for ValidateVolumeCapabilitiesRequest {
    fn field_capabilities(&self, caps: &Capabilities) -> Result<(), CsiError> {
        no_mutable_parameters(caps, &self.mutable_parameters)
    }
}

/// The volume context key kubelet sets to `"true"` for a CSI inline
/// ephemeral volume (published without NodeStage).
pub const EPHEMERAL_CONTEXT_KEY: &str = "csi.storage.k8s.io/ephemeral";

impl FieldCapabilities for NodePublishVolumeRequest {
    fn field_capabilities(&self, caps: &Capabilities) -> Result<(), CsiError> {
        // Kubelet never stages CSI inline ephemeral volumes, so they are exempt.
        let ephemeral = self
            .volume_context
            .get(EPHEMERAL_CONTEXT_KEY)
            .is_some_and(|v| v == "true");
        if self.staging_target_path.is_empty()
            && caps.has_node(NodeRpc::StageUnstageVolume)
            && !ephemeral
        {
            return Err(CsiError::FailedPrecondition(
                "staging_target_path is required: the plugin declares STAGE_UNSTAGE_VOLUME".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod ephemeral_tests {
    use super::*;

    #[test]
    fn inline_ephemeral_publish_needs_no_staging_path() {
        let caps = Capabilities::new().node([NodeRpc::StageUnstageVolume]);
        let mut req = NodePublishVolumeRequest {
            volume_id: "v".into(),
            target_path: "/t".into(),
            ..Default::default()
        };
        let err = req.field_capabilities(&caps).unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
        req.volume_context
            .insert(EPHEMERAL_CONTEXT_KEY.into(), "true".into());
        assert!(req.field_capabilities(&caps).is_ok());
    }
}
