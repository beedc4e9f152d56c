//! ValidateVolumeCapabilities' two answers. A driver that supports all of
//! a request confirms exactly what was asked (the spec: the confirmed
//! fields echo the request); otherwise it leaves `confirmed` unset and
//! says why in `message`, which is still an OK response.

use csi_proto::v1::{
    ValidateVolumeCapabilitiesRequest, ValidateVolumeCapabilitiesResponse,
    validate_volume_capabilities_response::Confirmed,
};

/// Everything asked for is supported: the request's context, capabilities
/// and parameters, confirmed.
pub fn confirmed(req: ValidateVolumeCapabilitiesRequest) -> ValidateVolumeCapabilitiesResponse {
    ValidateVolumeCapabilitiesResponse {
        confirmed: Some(Confirmed {
            volume_context: req.volume_context,
            volume_capabilities: req.volume_capabilities,
            parameters: req.parameters,
            mutable_parameters: req.mutable_parameters,
        }),
        message: String::new(),
    }
}

/// Something asked for is not supported, and why.
pub fn not_confirmed(message: impl Into<String>) -> ValidateVolumeCapabilitiesResponse {
    ValidateVolumeCapabilitiesResponse {
        confirmed: None,
        message: message.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_proto::v1::VolumeCapability;

    #[test]
    fn confirmed_echoes_the_request_and_not_confirmed_says_why() {
        let req = ValidateVolumeCapabilitiesRequest {
            volume_id: "v".into(),
            volume_capabilities: vec![VolumeCapability::mount("ext4")],
            parameters: [("a".to_owned(), "b".to_owned())].into(),
            ..Default::default()
        };
        let yes = confirmed(req.clone()).confirmed.unwrap();
        assert_eq!(yes.volume_capabilities, req.volume_capabilities);
        assert_eq!(yes.parameters, req.parameters);
        let no = not_confirmed("block only");
        assert!(no.confirmed.is_none());
        assert_eq!(no.message, "block only");
    }
}
