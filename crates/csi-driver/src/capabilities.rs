//! What the driver declares once: its name and version, and the plugin,
//! controller, node and group-controller capabilities the server answers
//! the `*GetCapabilities` RPCs with and gates RPCs by.

use std::collections::BTreeSet;

use csi_proto::v1::controller_service_capability::rpc::Type as ControllerRpc;
use csi_proto::v1::group_controller_service_capability::rpc::Type as GroupRpc;
use csi_proto::v1::node_service_capability::rpc::Type as NodeRpc;
use csi_proto::v1::plugin_capability::service::Type as PluginService;
use csi_proto::v1::plugin_capability::volume_expansion::Type as VolumeExpansion;
use csi_proto::v1::{
    ControllerGetCapabilitiesResponse, ControllerServiceCapability, GetPluginCapabilitiesResponse,
    GetPluginInfoResponse, GroupControllerGetCapabilitiesResponse,
    GroupControllerServiceCapability, NodeGetCapabilitiesResponse, NodeServiceCapability,
    PluginCapability,
};

use crate::error::CsiError;
use csi_proto::methods::Requirement;

/// The plugin's name and version, as GetPluginInfo reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginInfo {
    name: String,
    vendor_version: String,
    manifest: Vec<(String, String)>,
}

impl PluginInfo {
    /// Validates `name` (≤ 63 characters, DNS-1123 style: alphanumeric at
    /// both ends, `-`, `.` and alphanumerics between) and `vendor_version`
    /// (required).
    pub fn new(
        name: impl Into<String>,
        vendor_version: impl Into<String>,
    ) -> Result<Self, CsiError> {
        let name = name.into();
        let vendor_version = vendor_version.into();
        validate_plugin_name(&name)?;
        if vendor_version.is_empty() {
            return Err(CsiError::required("vendor_version"));
        }
        Ok(Self {
            name,
            vendor_version,
            manifest: Vec::new(),
        })
    }

    /// Adds an opaque manifest entry.
    pub fn with_manifest(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.manifest.push((key.into(), value.into()));
        self
    }

    /// The plugin name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The vendor version.
    pub fn vendor_version(&self) -> &str {
        &self.vendor_version
    }

    /// The GetPluginInfo answer.
    pub fn response(&self) -> GetPluginInfoResponse {
        GetPluginInfoResponse {
            name: self.name.clone(),
            vendor_version: self.vendor_version.clone(),
            manifest: self.manifest.iter().cloned().collect(),
        }
    }
}

/// Checks a plugin name against the spec's rule (≤ 63 chars, DNS-1123 style).
pub fn validate_plugin_name(name: &str) -> Result<(), CsiError> {
    let field = "name";
    if name.is_empty() {
        return Err(CsiError::required(field));
    }
    if name.len() > 63 {
        return Err(CsiError::invalid(field, "longer than 63 characters"));
    }
    let alnum = |c: char| c.is_ascii_alphanumeric();
    let first_last_ok = name.starts_with(alnum) && name.ends_with(alnum);
    let middle_ok = name.chars().all(|c| alnum(c) || c == '-' || c == '.');
    if !first_last_ok || !middle_ok {
        return Err(CsiError::invalid(
            field,
            "must start and end with an alphanumeric and contain only alphanumerics, '-' and '.'",
        ));
    }
    Ok(())
}

/// The driver's declared capabilities.
///
/// The plugin service capabilities for the controller, group-controller
/// and snapshot-metadata services are derived from what the server
/// actually serves in its mode, so a node-mode instance never advertises
/// CONTROLLER_SERVICE.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capabilities {
    plugin: BTreeSet<PluginService>,
    volume_expansion: Option<VolumeExpansion>,
    controller: BTreeSet<ControllerRpc>,
    node: BTreeSet<NodeRpc>,
    group_controller: BTreeSet<GroupRpc>,
    mutable_parameters: Option<BTreeSet<String>>,
}

impl Capabilities {
    /// No capabilities.
    pub fn new() -> Self {
        Self::default()
    }

    /// Declares a plugin service capability (e.g.
    /// VOLUME_ACCESSIBILITY_CONSTRAINTS).
    pub fn plugin(mut self, service: PluginService) -> Self {
        if service != PluginService::Unknown {
            self.plugin.insert(service);
        }
        self
    }

    /// Declares the volume expansion mode.
    pub fn volume_expansion(mut self, expansion: VolumeExpansion) -> Self {
        self.volume_expansion = (expansion != VolumeExpansion::Unknown).then_some(expansion);
        self
    }

    /// Declares controller RPC capabilities.
    pub fn controller(mut self, rpcs: impl IntoIterator<Item = ControllerRpc>) -> Self {
        self.controller
            .extend(rpcs.into_iter().filter(|r| *r != ControllerRpc::Unknown));
        self
    }

    /// Declares node RPC capabilities.
    pub fn node(mut self, rpcs: impl IntoIterator<Item = NodeRpc>) -> Self {
        self.node
            .extend(rpcs.into_iter().filter(|r| *r != NodeRpc::Unknown));
        self
    }

    /// Declares group controller RPC capabilities.
    pub fn group_controller(mut self, rpcs: impl IntoIterator<Item = GroupRpc>) -> Self {
        self.group_controller
            .extend(rpcs.into_iter().filter(|r| *r != GroupRpc::Unknown));
        self
    }

    /// Declares the mutable parameter keys the driver accepts (with
    /// MODIFY_VOLUME). CreateVolume and ControllerModifyVolume with any other
    /// key are then INVALID_ARGUMENT naming the key, before the driver sees
    /// them, so nothing is applied. Without this declaration the driver
    /// checks keys itself ([`helpers::mutable`](crate::helpers::mutable)).
    pub fn mutable_parameters<K: Into<String>>(
        mut self,
        keys: impl IntoIterator<Item = K>,
    ) -> Self {
        self.mutable_parameters
            .get_or_insert_with(BTreeSet::new)
            .extend(keys.into_iter().map(Into::into));
        self
    }

    /// The declared mutable parameter keys, if the driver declared them.
    pub fn accepted_mutable_parameters(&self) -> Option<&BTreeSet<String>> {
        self.mutable_parameters.as_ref()
    }

    /// Whether a plugin service capability is declared.
    pub fn has_plugin(&self, service: PluginService) -> bool {
        self.plugin.contains(&service)
    }

    /// The declared volume expansion mode.
    pub fn expansion(&self) -> Option<VolumeExpansion> {
        self.volume_expansion
    }

    /// Whether a controller RPC capability is declared.
    pub fn has_controller(&self, rpc: ControllerRpc) -> bool {
        self.controller.contains(&rpc)
    }

    /// Whether a node RPC capability is declared.
    pub fn has_node(&self, rpc: NodeRpc) -> bool {
        self.node.contains(&rpc)
    }

    /// Whether a group controller RPC capability is declared.
    pub fn has_group_controller(&self, rpc: GroupRpc) -> bool {
        self.group_controller.contains(&rpc)
    }

    /// Whether a requirement is met.
    pub fn satisfies(&self, requirement: Requirement) -> bool {
        match requirement {
            Requirement::Controller(r) => self.has_controller(r),
            Requirement::Node(r) => self.has_node(r),
            Requirement::GroupController(r) => self.has_group_controller(r),
            Requirement::Plugin(s) => self.has_plugin(s),
        }
    }

    /// Rejects combinations the spec forbids, so a misconfigured driver
    /// fails at startup.
    pub fn check(&self) -> Result<(), CsiError> {
        let c = |r| self.has_controller(r);
        if c(ControllerRpc::ListVolumesPublishedNodes) && !c(ControllerRpc::PublishUnpublishVolume)
        {
            return Err(CsiError::FailedPrecondition(
                "LIST_VOLUMES_PUBLISHED_NODES requires PUBLISH_UNPUBLISH_VOLUME".into(),
            ));
        }
        if c(ControllerRpc::PublishReadonly) && !c(ControllerRpc::PublishUnpublishVolume) {
            return Err(CsiError::FailedPrecondition(
                "PUBLISH_READONLY requires PUBLISH_UNPUBLISH_VOLUME".into(),
            ));
        }
        if self.mutable_parameters.is_some() && !c(ControllerRpc::ModifyVolume) {
            return Err(CsiError::FailedPrecondition(
                "accepted mutable parameters are declared without MODIFY_VOLUME".into(),
            ));
        }
        Ok(())
    }

    /// Sets a plugin service capability on or off (the server derives the
    /// service capabilities from what it serves).
    pub fn set_plugin(&mut self, service: PluginService, on: bool) {
        if on {
            self.plugin.insert(service);
        } else {
            self.plugin.remove(&service);
        }
    }

    /// The GetPluginCapabilities answer.
    pub fn plugin_response(&self) -> GetPluginCapabilitiesResponse {
        let mut capabilities: Vec<PluginCapability> = self
            .plugin
            .iter()
            .map(|s| PluginCapability::from(*s))
            .collect();
        if let Some(e) = self.volume_expansion {
            capabilities.push(PluginCapability::from(e));
        }
        GetPluginCapabilitiesResponse { capabilities }
    }

    /// The ControllerGetCapabilities answer.
    pub fn controller_response(&self) -> ControllerGetCapabilitiesResponse {
        ControllerGetCapabilitiesResponse {
            capabilities: self
                .controller
                .iter()
                .map(|r| ControllerServiceCapability::from(*r))
                .collect(),
        }
    }

    /// The NodeGetCapabilities answer.
    pub fn node_response(&self) -> NodeGetCapabilitiesResponse {
        NodeGetCapabilitiesResponse {
            capabilities: self
                .node
                .iter()
                .map(|r| NodeServiceCapability::from(*r))
                .collect(),
        }
    }

    /// The GroupControllerGetCapabilities answer.
    pub fn group_controller_response(&self) -> GroupControllerGetCapabilitiesResponse {
        GroupControllerGetCapabilitiesResponse {
            capabilities: self
                .group_controller
                .iter()
                .map(|r| GroupControllerServiceCapability::from(*r))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_names_follow_dns_1123() {
        let table: &[(&str, bool)] = &[
            ("csi.example.com", true),
            ("a", true),
            ("a-b.c9", true),
            ("", false),
            ("-a", false),
            ("a.", false),
            ("a_b", false),
            ("a b", false),
            (&"a".repeat(63), true),
            (&"a".repeat(64), false),
        ];
        for (name, ok) in table {
            assert_eq!(PluginInfo::new(*name, "1.0").is_ok(), *ok, "{name:?}");
        }
        assert!(PluginInfo::new("x", "").is_err());
    }

    #[test]
    fn responses_reflect_the_declaration() {
        let caps = Capabilities::new()
            .plugin(PluginService::VolumeAccessibilityConstraints)
            .volume_expansion(VolumeExpansion::Online)
            .controller([ControllerRpc::CreateDeleteVolume, ControllerRpc::Unknown])
            .node([NodeRpc::StageUnstageVolume])
            .group_controller([GroupRpc::CreateDeleteGetVolumeGroupSnapshot]);
        assert_eq!(caps.plugin_response().capabilities.len(), 2);
        assert_eq!(
            caps.controller_response().capabilities[0].rpc_type(),
            Some(ControllerRpc::CreateDeleteVolume)
        );
        assert_eq!(caps.controller_response().capabilities.len(), 1);
        assert_eq!(caps.node_response().capabilities.len(), 1);
        assert_eq!(caps.group_controller_response().capabilities.len(), 1);
        assert!(caps.satisfies(Requirement::Node(NodeRpc::StageUnstageVolume)));
        assert!(!caps.satisfies(Requirement::Node(NodeRpc::GetVolumeStats)));
        assert!(caps.check().is_ok());
        let bad = Capabilities::new().controller([ControllerRpc::ListVolumesPublishedNodes]);
        assert!(bad.check().is_err());
    }

    #[test]
    fn mutable_parameters_need_modify_volume() {
        let none = Capabilities::new().controller([ControllerRpc::ModifyVolume]);
        assert_eq!(none.accepted_mutable_parameters(), None);
        let empty = none.clone().mutable_parameters(Vec::<String>::new());
        assert!(empty.accepted_mutable_parameters().unwrap().is_empty());
        let caps = none
            .mutable_parameters(["iops"])
            .mutable_parameters(["throughput"]);
        let keys: Vec<&str> = caps
            .accepted_mutable_parameters()
            .unwrap()
            .iter()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, ["iops", "throughput"]);
        assert!(caps.check().is_ok());
        let bad = Capabilities::new().mutable_parameters(["iops"]);
        let err = bad.check().unwrap_err();
        assert!(err.to_string().contains("MODIFY_VOLUME"), "{err}");
    }
}
