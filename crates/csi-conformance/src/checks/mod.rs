//! The checks, in run order. Each is an async fn over the shared context; the
//! table below gives it an id, a group and a description.

use crate::report::Group;
use crate::suite::{Check, CheckInfo};

mod controller;
mod general;
mod group;
mod identity;
mod node;
mod snapshot;

macro_rules! checks {
    ($( $id:literal, $group:ident, $desc:literal => $f:path; )*) => {
        pub(crate) static CHECKS: &[Check] = &[$(
            Check {
                info: CheckInfo { id: $id, group: Group::$group, description: $desc },
                run: |ctx| Box::pin($f(ctx)),
            },
        )*];
    };
}

checks! {
    "identity.get_plugin_info", Identity,
        "GetPluginInfo returns a DNS-1123 name of at most 63 characters and a vendor_version" => identity::plugin_info;
    "identity.get_plugin_capabilities", Identity,
        "GetPluginCapabilities succeeds and lists only known services" => identity::plugin_capabilities;
    "identity.probe", Identity,
        "Probe succeeds; an absent ready means ready" => identity::probe;
    "identity.split_endpoints", Identity,
        "Split controller and node endpoints report the same plugin name, each is ready and serves its own service" => identity::split_endpoints;

    "controller.get_capabilities", Controller,
        "ControllerGetCapabilities succeeds and its capabilities are consistent" => controller::capabilities;
    "controller.create_volume.missing_name", Controller,
        "CreateVolume without a name is INVALID_ARGUMENT" => controller::create_missing_name;
    "controller.create_volume.missing_capabilities", Controller,
        "CreateVolume without volume_capabilities is INVALID_ARGUMENT" => controller::create_missing_caps;
    "controller.create_volume.capability_without_access_type", Controller,
        "CreateVolume with a capability lacking access_type is INVALID_ARGUMENT" => controller::create_cap_no_access_type;
    "controller.create_volume.capability_without_access_mode", Controller,
        "CreateVolume with a capability lacking access_mode is INVALID_ARGUMENT" => controller::create_cap_no_access_mode;
    "controller.create_volume.capacity", Controller,
        "CreateVolume returns at least required_bytes, or 0 for unknown" => controller::create_capacity;
    "controller.create_volume.idempotent", Controller,
        "A repeated CreateVolume returns the same volume" => controller::create_idempotent;
    "controller.create_volume.incompatible_capacity", Controller,
        "CreateVolume with an existing name and an incompatible capacity is ALREADY_EXISTS" => controller::create_incompatible;
    "controller.create_volume.max_length_name", Controller,
        "CreateVolume with a name of 128 bytes (the spec's string limit) succeeds" => controller::create_max_length_name;
    "controller.create_volume.concurrent", Controller,
        "Concurrent identical CreateVolume calls give OK or ABORTED, one volume id, one volume" => controller::create_concurrent;
    "controller.delete_volume.missing_volume", Controller,
        "DeleteVolume of a volume that does not exist is OK" => controller::delete_missing;
    "controller.delete_volume.empty_id", Controller,
        "DeleteVolume with an empty volume_id is INVALID_ARGUMENT" => controller::delete_empty_id;
    "controller.validate_volume_capabilities.missing_volume", Controller,
        "ValidateVolumeCapabilities of a missing volume is NOT_FOUND" => controller::validate_missing;
    "controller.validate_volume_capabilities.confirmed", Controller,
        "ValidateVolumeCapabilities confirms the capabilities a volume was created with and echoes them" => controller::validate_confirmed;
    "controller.validate_volume_capabilities.missing_fields", Controller,
        "ValidateVolumeCapabilities without volume_id or capabilities is INVALID_ARGUMENT" => controller::validate_missing_fields;
    "controller.list_volumes.paging", Controller,
        "ListVolumes with max_entries=2 pages through every volume exactly once via next_token" => controller::list_paging;
    "controller.list_volumes.created_and_deleted", Controller,
        "ListVolumes lists a new volume once, and no longer once DeleteVolume succeeded" => controller::list_created_and_deleted;
    "controller.list_volumes.invalid_token", Controller,
        "ListVolumes with an invalid starting_token is ABORTED" => controller::list_invalid_token;
    "controller.list_volumes.negative_max_entries", Controller,
        "ListVolumes with a negative max_entries is INVALID_ARGUMENT" => controller::list_negative;
    "controller.get_volume.existing", Controller,
        "ControllerGetVolume returns an existing volume" => controller::get_volume_existing;
    "controller.get_volume.missing_volume", Controller,
        "ControllerGetVolume of a missing volume is NOT_FOUND" => controller::get_volume_missing;
    "controller.get_capacity", Controller,
        "GetCapacity reports available_capacity >= 0" => controller::get_capacity;
    "controller.publish.missing_fields", Controller,
        "ControllerPublish/UnpublishVolume with missing required fields is INVALID_ARGUMENT" => controller::publish_missing_fields;
    "controller.publish.missing_volume", Controller,
        "ControllerPublishVolume of a missing volume is NOT_FOUND" => controller::publish_missing_volume;
    "controller.publish.missing_node", Controller,
        "ControllerPublishVolume to a missing node is NOT_FOUND" => controller::publish_missing_node;
    "controller.publish.idempotent", Controller,
        "ControllerPublishVolume and ControllerUnpublishVolume are idempotent" => controller::publish_idempotent;
    "controller.publish.incompatible", Controller,
        "ControllerPublishVolume of a volume published to the node with another readonly is ALREADY_EXISTS" => controller::publish_incompatible;
    "controller.unpublish.not_published", Controller,
        "ControllerUnpublishVolume of a volume that is not published is OK" => controller::unpublish_not_published;
    "controller.expand_volume.grow", Controller,
        "ControllerExpandVolume grows a volume and is idempotent" => controller::expand_grow;
    "controller.expand_volume.missing_volume", Controller,
        "ControllerExpandVolume of a missing volume is NOT_FOUND" => controller::expand_missing;
    "controller.expand_volume.missing_capacity", Controller,
        "ControllerExpandVolume without capacity_range is INVALID_ARGUMENT" => controller::expand_no_capacity;
    "controller.modify_volume.missing_volume", Controller,
        "ControllerModifyVolume of a missing volume is NOT_FOUND, also with empty mutable_parameters" => controller::modify_missing;
    "controller.modify_volume.empty_parameters", Controller,
        "ControllerModifyVolume of a volume with empty mutable_parameters is OK (and with the configured ones)" => controller::modify_empty;
    "controller.modify_volume.unaccepted_parameter", Controller,
        "ControllerModifyVolume with a mutable parameter the driver does not accept is INVALID_ARGUMENT" => controller::modify_unaccepted;
    "controller.create_volume.mutable_parameters", Controller,
        "CreateVolume with the configured mutable_parameters succeeds, and ControllerModifyVolume takes them again" => controller::create_with_mutable_parameters;
    "controller.create_volume.unaccepted_mutable_parameter", Controller,
        "CreateVolume with a mutable parameter the driver does not accept is INVALID_ARGUMENT" => controller::create_unaccepted_mutable;
    "controller.publish.attach_limit", Controller,
        "ControllerPublishVolume beyond NodeGetInfo's max_volumes_per_node is RESOURCE_EXHAUSTED" => controller::publish_attach_limit;
    "controller.create_volume.clone", Controller,
        "CreateVolume from a volume source clones it; a missing source is NOT_FOUND" => controller::clone_volume;

    "snapshot.create.missing_fields", Snapshot,
        "CreateSnapshot without name or source_volume_id is INVALID_ARGUMENT" => snapshot::create_missing_fields;
    "snapshot.create.idempotent", Snapshot,
        "A repeated CreateSnapshot returns the same snapshot of the right source" => snapshot::create_idempotent;
    "snapshot.create.name_conflict", Snapshot,
        "CreateSnapshot with an existing name and another source is ALREADY_EXISTS" => snapshot::create_conflict;
    "snapshot.create.max_length_name", Snapshot,
        "CreateSnapshot with a name of 128 bytes (the spec's string limit) succeeds" => snapshot::create_max_length_name;
    "snapshot.delete.missing_snapshot", Snapshot,
        "DeleteSnapshot of a missing snapshot is OK; an empty id is INVALID_ARGUMENT" => snapshot::delete_missing;
    "snapshot.list.filters", Snapshot,
        "ListSnapshots filters by snapshot_id and source_volume_id; a missing one gives an empty list" => snapshot::list_filters;
    "snapshot.list.created_and_deleted", Snapshot,
        "ListSnapshots lists a new snapshot once, and no longer once DeleteSnapshot succeeded" => snapshot::list_created_and_deleted;
    "snapshot.list.paging", Snapshot,
        "ListSnapshots pages with next_token; an invalid token is ABORTED" => snapshot::list_paging;
    "snapshot.get.existing", Snapshot,
        "GetSnapshot returns an existing snapshot" => snapshot::get_existing;
    "snapshot.get.missing_snapshot", Snapshot,
        "GetSnapshot of a missing snapshot is NOT_FOUND" => snapshot::get_missing;
    "snapshot.restore", Snapshot,
        "CreateVolume from a snapshot succeeds; a missing snapshot source is NOT_FOUND" => snapshot::restore;
    "snapshot.delete_source_volume", Snapshot,
        "Deleting a volume with snapshots is OK, or FAILED_PRECONDITION leaving the volume unaltered" => snapshot::delete_source;

    "node.get_capabilities", Node,
        "NodeGetCapabilities succeeds" => node::capabilities;
    "node.get_info", Node,
        "NodeGetInfo returns a node_id of 1..=256 bytes, max_volumes_per_node >= 0, and accessible_topology exactly when VOLUME_ACCESSIBILITY_CONSTRAINTS is advertised" => node::info;
    "node.stage.missing_fields", Node,
        "NodeStage/UnstageVolume with missing required fields is INVALID_ARGUMENT" => node::stage_missing_fields;
    "node.stage.idempotent", Node,
        "NodeStageVolume and NodeUnstageVolume are idempotent" => node::stage_idempotent;
    "node.publish.missing_fields", Node,
        "NodePublish/UnpublishVolume with missing required fields is INVALID_ARGUMENT" => node::publish_missing_fields;
    "node.publish.missing_fields_without_staging", Node,
        "NodePublishVolume missing a required field and staging_target_path is INVALID_ARGUMENT, not FAILED_PRECONDITION" => node::publish_missing_fields_without_staging;
    "node.publish.lifecycle", Node,
        "Full lifecycle; the plugin creates the target path and removes it on NodeUnpublishVolume" => node::lifecycle;
    "node.publish.repeat_table", Node,
        "NodePublishVolume repeat-call table by target, arguments and access mode" => node::repeat_table;
    "node.publish.concurrent", Node,
        "Concurrent identical NodePublishVolume calls give OK or ABORTED and one publication" => node::publish_concurrent;
    "node.get_volume_stats.published", Node,
        "NodeGetVolumeStats of a published volume returns usage" => node::stats_published;
    "node.get_volume_stats.missing_path", Node,
        "NodeGetVolumeStats on a path without the volume is NOT_FOUND" => node::stats_missing_path;
    "node.get_volume_stats.relative_path", Node,
        "NodeGetVolumeStats with a relative volume_path is NOT_FOUND" => node::stats_relative_path;
    "node.get_volume_stats.empty_volume_id", Node,
        "NodeGetVolumeStats with an empty volume_id is INVALID_ARGUMENT" => node::stats_empty_id;
    "node.expand_volume", Node,
        "NodeExpandVolume of a published volume succeeds" => node::expand;
    "node.expand_volume.missing_volume", Node,
        "NodeExpandVolume of a missing volume is NOT_FOUND" => node::expand_missing;
    "node.expand_volume.relative_path", Node,
        "NodeExpandVolume with a relative volume_path is NOT_FOUND" => node::expand_relative_path;

    "group-controller.get_capabilities", GroupController,
        "GroupControllerGetCapabilities succeeds" => group::capabilities;
    "group-controller.lifecycle", GroupController,
        "Create (idempotent), get and delete a group snapshot of two volumes" => group::lifecycle;
    "group-controller.get.missing", GroupController,
        "GetVolumeGroupSnapshot of a missing group snapshot is NOT_FOUND, with or without snapshot_ids" => group::get_missing;
    "group-controller.delete.missing", GroupController,
        "DeleteVolumeGroupSnapshot of a missing group snapshot is OK, with or without snapshot_ids" => group::delete_missing;

    "general.any_authority", General,
        "Probe is answered when :authority is the socket path, raw (grpc-java) or percent-encoded (gRPC C-core: Python, C++)" => general::any_authority;
    "general.secrets_not_in_errors", General,
        "No secret value appears in an error message, also for failing CreateVolume, ControllerPublish, NodeStage and NodePublish calls with a marker secret" => general::secrets_not_in_errors;
    "general.secrets_not_in_logs", General,
        "No configured secret value appears in the driver's log" => general::secrets_not_in_logs;
}
