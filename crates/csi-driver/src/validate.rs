//! Spec validation of requests (CSI spec, "Error Scheme" and "Field
//! Requirements"): pure functions, one
//! [`Validate`] impl per request type that has field rules (a request
//! without any, e.g. Probe, needs none: see
//! [`CsiRequest::validate`](crate::CsiRequest::validate)). Every failure is
//! INVALID_ARGUMENT with a message that starts with the offending field's
//! path, except two the spec's error tables assign otherwise: OUT_OF_RANGE
//! for a negative snapshot-metadata offset, and NOT_FOUND for a relative
//! `volume_path` (it names no volume), answered only after every other field
//! rule so a request that also lacks a required field still gets
//! INVALID_ARGUMENT.
//!
//! # Required repeated and map fields
//!
//! proto3 cannot tell an empty list or map from an absent one, so a field
//! the spec marks REQUIRED is rejected when empty only where emptiness has
//! no meaning of its own:
//!
//! | field | empty | why |
//! |---|---|---|
//! | CreateVolume / ValidateVolumeCapabilities `volume_capabilities` | INVALID_ARGUMENT | nothing to provision or validate |
//! | CreateVolumeGroupSnapshot `source_volume_ids` | INVALID_ARGUMENT | a group of nothing |
//! | ControllerModifyVolume `mutable_parameters` | accepted | "modify nothing": the spec forbids changes based on absent keys, so an empty map is a well-defined no-op; COs send it for a VolumeAttributesClass without parameters, and csi-sanity expects OK (existing volume) or NOT_FOUND (unknown volume) |
//! | Get/DeleteVolumeGroupSnapshot `snapshot_ids` | accepted | the id alone names the group; the spec's rule for the list is a mismatch check (SHOULD), which drivers apply when it is given; csi-sanity expects NOT_FOUND / OK for an unknown id sent without it |

use std::collections::HashMap;

use csi_proto::v1::volume_capability::AccessType;
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::volume_content_source::Type as SourceType;
use csi_proto::v1::*;

use crate::error::CsiError;

/// Maximum bytes of a string field.
pub const MAX_STRING: usize = 128;
/// Maximum total bytes (keys plus values) of a map field.
pub const MAX_MAP: usize = 4096;
/// Maximum bytes of a node id.
pub const MAX_NODE_ID: usize = 256;
/// Maximum bytes of a path (the OS limit; the spec asks for at least 128).
pub const MAX_PATH: usize = 4096;
/// Maximum total bytes of mount flags.
pub const MAX_MOUNT_FLAGS: usize = 4096;

/// A request that can check itself against the spec's field rules.
///
/// [`CsiRequest::validate`]: crate::CsiRequest::validate
pub trait Validate {
    /// `Ok` when every field rule holds.
    fn validate(&self) -> Result<(), CsiError>;
}

type Res = Result<(), CsiError>;

/// A string that may be empty but not longer than 128 bytes.
pub fn optional_string(field: &str, value: &str) -> Res {
    if value.len() > MAX_STRING {
        return Err(CsiError::invalid(
            field,
            format!("longer than {MAX_STRING} bytes ({})", value.len()),
        ));
    }
    Ok(())
}

/// A required string of at most 128 bytes (ids, tokens).
pub fn required_string(field: &str, value: &str) -> Res {
    if value.is_empty() {
        return Err(CsiError::required(field));
    }
    optional_string(field, value)
}

/// Whether `c` is one of the control characters names must not contain.
pub fn is_forbidden_name_char(c: char) -> bool {
    matches!(c, '\u{0}'..='\u{8}' | '\u{b}' | '\u{c}' | '\u{e}'..='\u{1f}' | '\u{7f}'..='\u{9f}')
}

/// A required name (CreateVolume, CreateSnapshot, group snapshot): ≤ 128
/// bytes, none of the control characters the spec excludes.
pub fn name(field: &str, value: &str) -> Res {
    required_string(field, value)?;
    if let Some(c) = value.chars().find(|c| is_forbidden_name_char(*c)) {
        return Err(CsiError::invalid(
            field,
            format!("contains control character U+{:04X}", c as u32),
        ));
    }
    Ok(())
}

/// A node id: required unless `optional`, at most 256 bytes.
pub fn node_id(field: &str, value: &str, optional: bool) -> Res {
    if value.is_empty() && !optional {
        return Err(CsiError::required(field));
    }
    if value.len() > MAX_NODE_ID {
        return Err(CsiError::invalid(
            field,
            format!("longer than {MAX_NODE_ID} bytes"),
        ));
    }
    Ok(())
}

/// A map of at most 4 KiB (keys plus values).
pub fn map(field: &str, m: &HashMap<String, String>) -> Res {
    let total: usize = m.iter().map(|(k, v)| k.len() + v.len()).sum();
    if total > MAX_MAP {
        return Err(CsiError::invalid(
            field,
            format!("larger than {MAX_MAP} bytes ({total})"),
        ));
    }
    Ok(())
}

/// A required, non-empty map of at most 4 KiB.
pub fn required_map(field: &str, m: &HashMap<String, String>) -> Res {
    if m.is_empty() {
        return Err(CsiError::required(field));
    }
    map(field, m)
}

/// A secrets map: ≤ 4 KiB, keys of alphanumerics, `-`, `_` and `.`.
/// Messages name the key, never a value.
pub fn secrets(field: &str, m: &HashMap<String, String>) -> Res {
    map(field, m)?;
    for key in m.keys() {
        let ok = !key.is_empty()
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !ok {
            return Err(CsiError::invalid(
                format!("{field}[{key:?}]"),
                "secret keys may contain only alphanumerics, '-', '_' and '.'",
            ));
        }
    }
    Ok(())
}

/// An absolute path: required unless `optional`, no NUL, ≤ the OS limit.
pub fn path(field: &str, value: &str, optional: bool) -> Res {
    if value.is_empty() {
        return if optional {
            Ok(())
        } else {
            Err(CsiError::required(field))
        };
    }
    if !value.starts_with('/') {
        return Err(CsiError::invalid(field, "must be an absolute path"));
    }
    path_chars(field, value)
}

/// No NUL, at most the OS limit.
fn path_chars(field: &str, value: &str) -> Res {
    if value.contains('\0') {
        return Err(CsiError::invalid(field, "contains a NUL byte"));
    }
    if value.len() > MAX_PATH {
        return Err(CsiError::invalid(
            field,
            format!("longer than {MAX_PATH} bytes"),
        ));
    }
    Ok(())
}

/// The `volume_path` of NodeGetVolumeStats and NodeExpandVolume: required,
/// no NUL, ≤ the OS limit. A relative path passes here and is answered by
/// [`path_names_volume`] once every other field has been checked.
pub fn volume_path(field: &str, value: &str) -> Res {
    if value.is_empty() {
        return Err(CsiError::required(field));
    }
    path_chars(field, value)
}

/// NOT_FOUND for a relative `volume_path`: no volume can be published or
/// staged there (the spec's code for "volume not found on volume_path").
pub fn path_names_volume(field: &str, value: &str) -> Res {
    if value.is_empty() || value.starts_with('/') {
        return Ok(());
    }
    Err(CsiError::NotFound(format!(
        "{field} {value:?} names no volume: it is not an absolute path"
    )))
}

/// One volume capability: access type and a known, non-UNKNOWN access mode
/// are both required.
pub fn volume_capability(field: &str, cap: &VolumeCapability) -> Res {
    match &cap.access_type {
        None => return Err(CsiError::required(format!("{field}.access_type"))),
        Some(AccessType::Block(_)) => {}
        Some(AccessType::Mount(m)) => {
            optional_string(&format!("{field}.mount.fs_type"), &m.fs_type)?;
            optional_string(
                &format!("{field}.mount.volume_mount_group"),
                &m.volume_mount_group,
            )?;
            let flags: usize = m.mount_flags.iter().map(String::len).sum();
            if flags > MAX_MOUNT_FLAGS {
                return Err(CsiError::invalid(
                    format!("{field}.mount.mount_flags"),
                    format!("larger than {MAX_MOUNT_FLAGS} bytes"),
                ));
            }
        }
    }
    let mode_field = format!("{field}.access_mode");
    match &cap.access_mode {
        None => Err(CsiError::required(mode_field)),
        Some(m) => match Mode::try_from(m.mode) {
            Ok(Mode::Unknown) => Err(CsiError::invalid(mode_field, "must not be UNKNOWN")),
            Ok(_) => Ok(()),
            Err(_) => Err(CsiError::invalid(
                mode_field,
                format!("unknown access mode {}", m.mode),
            )),
        },
    }
}

/// A required volume capability.
pub fn required_capability(field: &str, cap: Option<&VolumeCapability>) -> Res {
    match cap {
        None => Err(CsiError::required(field)),
        Some(c) => volume_capability(field, c),
    }
}

/// A list of capabilities, each valid; at least one when `required`.
pub fn volume_capabilities(field: &str, caps: &[VolumeCapability], required: bool) -> Res {
    if required && caps.is_empty() {
        return Err(CsiError::required(field));
    }
    for (i, cap) in caps.iter().enumerate() {
        volume_capability(&format!("{field}[{i}]"), cap)?;
    }
    Ok(())
}

/// A capacity range: non-negative bounds, limit ≥ required when both set.
pub fn capacity_range(field: &str, range: Option<&CapacityRange>, required: bool) -> Res {
    let Some(r) = range else {
        return if required {
            Err(CsiError::required(field))
        } else {
            Ok(())
        };
    };
    if r.required_bytes < 0 {
        return Err(CsiError::invalid(
            format!("{field}.required_bytes"),
            "must not be negative",
        ));
    }
    if r.limit_bytes < 0 {
        return Err(CsiError::invalid(
            format!("{field}.limit_bytes"),
            "must not be negative",
        ));
    }
    if r.limit_bytes > 0 && r.limit_bytes < r.required_bytes {
        return Err(CsiError::invalid(
            format!("{field}.limit_bytes"),
            "must not be smaller than required_bytes",
        ));
    }
    if required && r.required_bytes == 0 && r.limit_bytes == 0 {
        return Err(CsiError::invalid(
            field,
            "one of required_bytes and limit_bytes must be set",
        ));
    }
    Ok(())
}

fn topology_name_part(s: &str) -> bool {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    !s.is_empty()
        && s.len() <= 63
        && s.starts_with(alnum)
        && s.ends_with(alnum)
        && s.chars().all(|c| alnum(c) || matches!(c, '-' | '_' | '.'))
}

fn dns_prefix(s: &str) -> bool {
    let ok_label = |l: &str| {
        !l.is_empty()
            && l.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && l.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && l.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    };
    !s.is_empty() && s.len() <= 63 && s.split('.').all(ok_label)
}

/// A topology segment key: `[prefix/]name`, prefix a lowercase DNS
/// subdomain ≤ 63, name ≤ 63 with alphanumerics at both ends.
pub fn topology_key(key: &str) -> bool {
    match key.split_once('/') {
        Some((prefix, name)) => dns_prefix(prefix) && topology_name_part(name),
        None => topology_name_part(key),
    }
}

/// A topology: valid keys, values ≤ 63 bytes, keys unique ignoring case.
pub fn topology(field: &str, t: &Topology) -> Res {
    let mut seen = std::collections::HashSet::new();
    for (k, v) in &t.segments {
        let f = format!("{field}.segments[{k:?}]");
        if !topology_key(k) {
            return Err(CsiError::invalid(f, "invalid topology key"));
        }
        if v.len() > 63 {
            return Err(CsiError::invalid(f, "value longer than 63 bytes"));
        }
        if !seen.insert(k.to_ascii_lowercase()) {
            return Err(CsiError::invalid(
                f,
                "duplicate key (keys are case-insensitive)",
            ));
        }
    }
    Ok(())
}

/// Accessibility requirements: every topology valid; when requisite is
/// given, every preferred topology must be in it.
pub fn topology_requirement(field: &str, r: &TopologyRequirement) -> Res {
    for (i, t) in r.requisite.iter().enumerate() {
        topology(&format!("{field}.requisite[{i}]"), t)?;
    }
    for (i, t) in r.preferred.iter().enumerate() {
        let f = format!("{field}.preferred[{i}]");
        topology(&f, t)?;
        if !r.requisite.is_empty() && !r.requisite.contains(t) {
            return Err(CsiError::invalid(f, "not in requisite"));
        }
    }
    Ok(())
}

fn max_entries(field: &str, n: i32) -> Res {
    if n < 0 {
        return Err(CsiError::invalid(field, "must not be negative"));
    }
    Ok(())
}

fn id_list(field: &str, ids: &[String], required: bool) -> Res {
    if required && ids.is_empty() {
        return Err(CsiError::required(field));
    }
    for (i, id) in ids.iter().enumerate() {
        required_string(&format!("{field}[{i}]"), id)?;
    }
    Ok(())
}

fn content_source(field: &str, s: Option<&VolumeContentSource>) -> Res {
    let Some(s) = s else { return Ok(()) };
    match &s.r#type {
        None => Err(CsiError::required(format!("{field}.type"))),
        Some(SourceType::Snapshot(snap)) => {
            required_string(&format!("{field}.snapshot.snapshot_id"), &snap.snapshot_id)
        }
        Some(SourceType::Volume(v)) => {
            required_string(&format!("{field}.volume.volume_id"), &v.volume_id)
        }
    }
}

impl Validate for CreateVolumeRequest {
    fn validate(&self) -> Res {
        name("name", &self.name)?;
        capacity_range("capacity_range", self.capacity_range.as_ref(), false)?;
        volume_capabilities("volume_capabilities", &self.volume_capabilities, true)?;
        map("parameters", &self.parameters)?;
        secrets("secrets", &self.secrets)?;
        content_source("volume_content_source", self.volume_content_source.as_ref())?;
        if let Some(r) = &self.accessibility_requirements {
            topology_requirement("accessibility_requirements", r)?;
        }
        map("mutable_parameters", &self.mutable_parameters)
    }
}

impl Validate for DeleteVolumeRequest {
    fn validate(&self) -> Res {
        required_string("volume_id", &self.volume_id)?;
        secrets("secrets", &self.secrets)
    }
}

impl Validate for ControllerPublishVolumeRequest {
    fn validate(&self) -> Res {
        required_string("volume_id", &self.volume_id)?;
        node_id("node_id", &self.node_id, false)?;
        required_capability("volume_capability", self.volume_capability.as_ref())?;
        secrets("secrets", &self.secrets)?;
        map("volume_context", &self.volume_context)
    }
}

impl Validate for ControllerUnpublishVolumeRequest {
    fn validate(&self) -> Res {
        required_string("volume_id", &self.volume_id)?;
        // Empty node_id means "unpublish from every node".
        node_id("node_id", &self.node_id, true)?;
        secrets("secrets", &self.secrets)
    }
}

impl Validate for ValidateVolumeCapabilitiesRequest {
    fn validate(&self) -> Res {
        required_string("volume_id", &self.volume_id)?;
        map("volume_context", &self.volume_context)?;
        volume_capabilities("volume_capabilities", &self.volume_capabilities, true)?;
        map("parameters", &self.parameters)?;
        secrets("secrets", &self.secrets)?;
        map("mutable_parameters", &self.mutable_parameters)
    }
}

impl Validate for ListVolumesRequest {
    fn validate(&self) -> Res {
        max_entries("max_entries", self.max_entries)?;
        optional_string("starting_token", &self.starting_token)
    }
}

impl Validate for GetCapacityRequest {
    fn validate(&self) -> Res {
        volume_capabilities("volume_capabilities", &self.volume_capabilities, false)?;
        map("parameters", &self.parameters)?;
        if let Some(t) = &self.accessible_topology {
            topology("accessible_topology", t)?;
        }
        Ok(())
    }
}

impl Validate for CreateSnapshotRequest {
    fn validate(&self) -> Res {
        required_string("source_volume_id", &self.source_volume_id)?;
        name("name", &self.name)?;
        secrets("secrets", &self.secrets)?;
        map("parameters", &self.parameters)
    }
}

impl Validate for DeleteSnapshotRequest {
    fn validate(&self) -> Res {
        required_string("snapshot_id", &self.snapshot_id)?;
        secrets("secrets", &self.secrets)
    }
}

impl Validate for ListSnapshotsRequest {
    fn validate(&self) -> Res {
        max_entries("max_entries", self.max_entries)?;
        optional_string("starting_token", &self.starting_token)?;
        optional_string("source_volume_id", &self.source_volume_id)?;
        optional_string("snapshot_id", &self.snapshot_id)?;
        secrets("secrets", &self.secrets)
    }
}

impl Validate for GetSnapshotRequest {
    fn validate(&self) -> Res {
        required_string("snapshot_id", &self.snapshot_id)?;
        secrets("secrets", &self.secrets)
    }
}

impl Validate for ControllerExpandVolumeRequest {
    fn validate(&self) -> Res {
        required_string("volume_id", &self.volume_id)?;
        capacity_range("capacity_range", self.capacity_range.as_ref(), true)?;
        secrets("secrets", &self.secrets)?;
        if let Some(c) = &self.volume_capability {
            volume_capability("volume_capability", c)?;
        }
        Ok(())
    }
}

impl Validate for ControllerGetVolumeRequest {
    fn validate(&self) -> Res {
        required_string("volume_id", &self.volume_id)
    }
}

impl Validate for ControllerModifyVolumeRequest {
    fn validate(&self) -> Res {
        required_string("volume_id", &self.volume_id)?;
        secrets("secrets", &self.secrets)?;
        // May be empty: see the module docs.
        map("mutable_parameters", &self.mutable_parameters)
    }
}

impl Validate for NodeStageVolumeRequest {
    fn validate(&self) -> Res {
        required_string("volume_id", &self.volume_id)?;
        map("publish_context", &self.publish_context)?;
        path("staging_target_path", &self.staging_target_path, false)?;
        required_capability("volume_capability", self.volume_capability.as_ref())?;
        secrets("secrets", &self.secrets)?;
        map("volume_context", &self.volume_context)
    }
}

impl Validate for NodeUnstageVolumeRequest {
    fn validate(&self) -> Res {
        required_string("volume_id", &self.volume_id)?;
        path("staging_target_path", &self.staging_target_path, false)
    }
}

impl Validate for NodePublishVolumeRequest {
    fn validate(&self) -> Res {
        required_string("volume_id", &self.volume_id)?;
        map("publish_context", &self.publish_context)?;
        path("staging_target_path", &self.staging_target_path, true)?;
        path("target_path", &self.target_path, false)?;
        required_capability("volume_capability", self.volume_capability.as_ref())?;
        secrets("secrets", &self.secrets)?;
        map("volume_context", &self.volume_context)
    }
}

impl Validate for NodeUnpublishVolumeRequest {
    fn validate(&self) -> Res {
        required_string("volume_id", &self.volume_id)?;
        path("target_path", &self.target_path, false)
    }
}

impl Validate for NodeGetVolumeStatsRequest {
    fn validate(&self) -> Res {
        required_string("volume_id", &self.volume_id)?;
        volume_path("volume_path", &self.volume_path)?;
        path("staging_target_path", &self.staging_target_path, true)?;
        path_names_volume("volume_path", &self.volume_path)
    }
}

impl Validate for NodeExpandVolumeRequest {
    fn validate(&self) -> Res {
        required_string("volume_id", &self.volume_id)?;
        volume_path("volume_path", &self.volume_path)?;
        capacity_range("capacity_range", self.capacity_range.as_ref(), false)?;
        path("staging_target_path", &self.staging_target_path, true)?;
        if let Some(c) = &self.volume_capability {
            volume_capability("volume_capability", c)?;
        }
        secrets("secrets", &self.secrets)?;
        path_names_volume("volume_path", &self.volume_path)
    }
}

impl Validate for CreateVolumeGroupSnapshotRequest {
    fn validate(&self) -> Res {
        name("name", &self.name)?;
        id_list("source_volume_ids", &self.source_volume_ids, true)?;
        secrets("secrets", &self.secrets)?;
        map("parameters", &self.parameters)
    }
}

impl Validate for DeleteVolumeGroupSnapshotRequest {
    fn validate(&self) -> Res {
        required_string("group_snapshot_id", &self.group_snapshot_id)?;
        // May be empty (see the module docs); given ids must not be.
        id_list("snapshot_ids", &self.snapshot_ids, false)?;
        secrets("secrets", &self.secrets)
    }
}

impl Validate for GetVolumeGroupSnapshotRequest {
    fn validate(&self) -> Res {
        required_string("group_snapshot_id", &self.group_snapshot_id)?;
        id_list("snapshot_ids", &self.snapshot_ids, false)?;
        secrets("secrets", &self.secrets)
    }
}

fn starting_offset(field: &str, offset: i64) -> Res {
    if offset < 0 {
        // The error table assigns OUT_OF_RANGE to a negative offset.
        return Err(CsiError::OutOfRange(format!(
            "{field}: must not be negative"
        )));
    }
    Ok(())
}

impl Validate for GetMetadataAllocatedRequest {
    fn validate(&self) -> Res {
        required_string("snapshot_id", &self.snapshot_id)?;
        starting_offset("starting_offset", self.starting_offset)?;
        max_entries("max_results", self.max_results)?;
        secrets("secrets", &self.secrets)
    }
}

impl Validate for GetMetadataDeltaRequest {
    fn validate(&self) -> Res {
        required_string("base_snapshot_id", &self.base_snapshot_id)?;
        required_string("target_snapshot_id", &self.target_snapshot_id)?;
        starting_offset("starting_offset", self.starting_offset)?;
        max_entries("max_results", self.max_results)?;
        secrets("secrets", &self.secrets)
    }
}
