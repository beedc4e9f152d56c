//! Secrets never appear in Debug output: every request type that holds a
//! `csi_secret` field (found from the descriptor, not a hand-kept list) is
//! filled with a marker in its secret fields and checked.

mod common;

use common::SECRET_MARKER;
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::{NodePublishVolumeRequest, VolumeCapability};
use std::collections::BTreeSet;

#[test]
fn secret_fields_come_from_the_descriptor() {
    let messages: BTreeSet<&str> = csi_proto::redact::SECRET_FIELDS
        .iter()
        .map(|(m, _)| *m)
        .collect();
    // The spec marks 19 fields in 19 request messages, all named `secrets`.
    assert_eq!(csi_proto::redact::SECRET_FIELDS.len(), 19);
    assert_eq!(messages.len(), 19);
    assert!(
        csi_proto::redact::SECRET_FIELDS
            .iter()
            .all(|(_, f)| *f == "secrets")
    );
    assert!(csi_proto::redact::is_secret_field(
        "csi.v1.NodeExpandVolumeRequest",
        "secrets"
    ));
    assert!(!csi_proto::redact::is_secret_field(
        "csi.v1.NodeExpandVolumeRequest",
        "volume_id"
    ));
}

#[test]
fn every_request_with_a_secret_hides_it_and_shows_other_fields() {
    let pool = common::pool();
    let table = common::rust_types();
    let mut checked = 0;
    for (message, _) in csi_proto::redact::SECRET_FIELDS {
        let (_, _, debug) = table.iter().find(|(n, _, _)| n == message).expect(message);
        let desc = pool.get_message_by_name(message).expect(message);
        let filled = common::fill(&desc, 0);
        let bytes = prost::Message::encode_to_vec(&filled);
        let text = debug(&bytes);
        assert!(
            !text.contains(SECRET_MARKER),
            "{message} leaks a secret: {text}"
        );
        assert!(
            !text.contains("secret-key"),
            "{message} leaks a secret key: {text}"
        );
        assert!(text.contains("<1 redacted>"), "{message}: {text}");
        assert!(
            text.contains("visible-"),
            "{message} hides ordinary fields too: {text}"
        );
        checked += 1;
    }
    assert_eq!(checked, 19);
}

#[test]
fn mount_flags_are_masked_in_nested_capabilities() {
    let req = NodePublishVolumeRequest {
        volume_id: "vol-1".into(),
        target_path: "/mnt/target".into(),
        volume_capability: Some(
            VolumeCapability::mount("ext4")
                .with_mount_flags([format!("password={SECRET_MARKER}")])
                .with_access_mode(Mode::SingleNodeWriter),
        ),
        secrets: [("token".to_string(), SECRET_MARKER.to_string())].into(),
        ..Default::default()
    };
    for text in [format!("{req:?}"), format!("{req:#?}")] {
        assert!(!text.contains(SECRET_MARKER), "{text}");
        assert!(text.contains("vol-1") && text.contains("/mnt/target") && text.contains("ext4"));
        // Enum fields still print by name, as prost's derive does.
        assert!(text.contains("SingleNodeWriter"), "{text}");
    }
}
