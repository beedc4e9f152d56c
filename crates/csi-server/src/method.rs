//! Every CSI RPC as a value, with its service and the capability that
//! enables it.

use std::fmt;

use csi_proto::v1::controller_service_capability::rpc::Type as ControllerRpc;
use csi_proto::v1::group_controller_service_capability::rpc::Type as GroupRpc;
use csi_proto::v1::node_service_capability::rpc::Type as NodeRpc;
use csi_proto::v1::plugin_capability::service::Type as PluginService;

/// A CSI gRPC service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Service {
    /// `csi.v1.Identity`.
    Identity,
    /// `csi.v1.Controller`.
    Controller,
    /// `csi.v1.Node`.
    Node,
    /// `csi.v1.GroupController`.
    GroupController,
    /// `csi.v1.SnapshotMetadata`.
    SnapshotMetadata,
}

impl Service {
    /// The short service name, e.g. `Controller`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Identity => "Identity",
            Self::Controller => "Controller",
            Self::Node => "Node",
            Self::GroupController => "GroupController",
            Self::SnapshotMetadata => "SnapshotMetadata",
        }
    }
}

/// The capability a driver must declare before an RPC is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requirement {
    /// A controller RPC capability.
    Controller(ControllerRpc),
    /// A node RPC capability.
    Node(NodeRpc),
    /// A group controller RPC capability.
    GroupController(GroupRpc),
    /// A plugin service capability.
    Plugin(PluginService),
}

macro_rules! methods {
    ($($variant:ident => $service:ident, $req:expr;)*) => {
        /// One CSI RPC.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[allow(missing_docs)]
        pub enum Method {
            $($variant,)*
        }

        impl Method {
            /// Every RPC, in proto order.
            pub const ALL: &'static [Method] = &[$(Method::$variant,)*];

            /// The RPC name, e.g. `CreateVolume`.
            pub fn name(self) -> &'static str {
                match self {
                    $(Self::$variant => stringify!($variant),)*
                }
            }

            /// The service the RPC belongs to.
            pub fn service(self) -> Service {
                match self {
                    $(Self::$variant => Service::$service,)*
                }
            }

            /// The capability that must be declared for this RPC to be
            /// served (`None`: always served when its service is).
            pub fn requirement(self) -> Option<Requirement> {
                match self {
                    $(Self::$variant => $req,)*
                }
            }
        }
    };
}

use Requirement as R;

methods! {
    GetPluginInfo => Identity, None;
    GetPluginCapabilities => Identity, None;
    Probe => Identity, None;
    CreateVolume => Controller, Some(R::Controller(ControllerRpc::CreateDeleteVolume));
    DeleteVolume => Controller, Some(R::Controller(ControllerRpc::CreateDeleteVolume));
    ControllerPublishVolume => Controller, Some(R::Controller(ControllerRpc::PublishUnpublishVolume));
    ControllerUnpublishVolume => Controller, Some(R::Controller(ControllerRpc::PublishUnpublishVolume));
    ValidateVolumeCapabilities => Controller, None;
    ListVolumes => Controller, Some(R::Controller(ControllerRpc::ListVolumes));
    GetCapacity => Controller, Some(R::Controller(ControllerRpc::GetCapacity));
    ControllerGetCapabilities => Controller, None;
    CreateSnapshot => Controller, Some(R::Controller(ControllerRpc::CreateDeleteSnapshot));
    DeleteSnapshot => Controller, Some(R::Controller(ControllerRpc::CreateDeleteSnapshot));
    ListSnapshots => Controller, Some(R::Controller(ControllerRpc::ListSnapshots));
    GetSnapshot => Controller, Some(R::Controller(ControllerRpc::GetSnapshot));
    ControllerExpandVolume => Controller, Some(R::Controller(ControllerRpc::ExpandVolume));
    ControllerGetVolume => Controller, Some(R::Controller(ControllerRpc::GetVolume));
    ControllerModifyVolume => Controller, Some(R::Controller(ControllerRpc::ModifyVolume));
    GroupControllerGetCapabilities => GroupController, None;
    CreateVolumeGroupSnapshot => GroupController, Some(R::GroupController(GroupRpc::CreateDeleteGetVolumeGroupSnapshot));
    DeleteVolumeGroupSnapshot => GroupController, Some(R::GroupController(GroupRpc::CreateDeleteGetVolumeGroupSnapshot));
    GetVolumeGroupSnapshot => GroupController, Some(R::GroupController(GroupRpc::CreateDeleteGetVolumeGroupSnapshot));
    GetMetadataAllocated => SnapshotMetadata, Some(R::Plugin(PluginService::SnapshotMetadataService));
    GetMetadataDelta => SnapshotMetadata, Some(R::Plugin(PluginService::SnapshotMetadataService));
    NodeStageVolume => Node, Some(R::Node(NodeRpc::StageUnstageVolume));
    NodeUnstageVolume => Node, Some(R::Node(NodeRpc::StageUnstageVolume));
    NodePublishVolume => Node, None;
    NodeUnpublishVolume => Node, None;
    NodeGetVolumeStats => Node, Some(R::Node(NodeRpc::GetVolumeStats));
    NodeExpandVolume => Node, Some(R::Node(NodeRpc::ExpandVolume));
    NodeGetCapabilities => Node, None;
    NodeGetInfo => Node, None;
}

impl Method {
    /// The gRPC path, e.g. `/csi.v1.Controller/CreateVolume`.
    pub fn path(self) -> String {
        format!("/csi.v1.{}/{}", self.service().name(), self.name())
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rpc_of_the_spec_is_listed_once() {
        assert_eq!(Method::ALL.len(), 32);
        let names: std::collections::HashSet<_> = Method::ALL.iter().map(|m| m.name()).collect();
        assert_eq!(names.len(), 32);
        assert_eq!(
            Method::CreateVolume.path(),
            "/csi.v1.Controller/CreateVolume"
        );
        assert_eq!(Method::Probe.requirement(), None);
        assert_eq!(
            Method::NodeStageVolume.requirement(),
            Some(Requirement::Node(NodeRpc::StageUnstageVolume))
        );
    }
}
