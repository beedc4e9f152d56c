//! Small conveniences on the generated types: capability constructors,
//! access-mode predicates, a `VolumeCapability` builder and capacity ranges.

use crate::v1::volume_capability::access_mode::Mode;
use crate::v1::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use crate::v1::{
    CapacityRange, ControllerServiceCapability, GroupControllerServiceCapability,
    NodeServiceCapability, PluginCapability, VolumeCapability, controller_service_capability,
    group_controller_service_capability, node_service_capability, plugin_capability,
};

impl From<controller_service_capability::rpc::Type> for ControllerServiceCapability {
    fn from(rpc: controller_service_capability::rpc::Type) -> Self {
        use controller_service_capability::{Rpc, Type};
        Self {
            r#type: Some(Type::Rpc(Rpc { r#type: rpc as i32 })),
        }
    }
}

impl ControllerServiceCapability {
    /// The RPC capability this value declares, if it is a known RPC type.
    pub fn rpc_type(&self) -> Option<controller_service_capability::rpc::Type> {
        match &self.r#type {
            Some(controller_service_capability::Type::Rpc(rpc)) => rpc.r#type.try_into().ok(),
            None => None,
        }
    }
}

impl From<node_service_capability::rpc::Type> for NodeServiceCapability {
    fn from(rpc: node_service_capability::rpc::Type) -> Self {
        use node_service_capability::{Rpc, Type};
        Self {
            r#type: Some(Type::Rpc(Rpc { r#type: rpc as i32 })),
        }
    }
}

impl NodeServiceCapability {
    /// The RPC capability this value declares, if it is a known RPC type.
    pub fn rpc_type(&self) -> Option<node_service_capability::rpc::Type> {
        match &self.r#type {
            Some(node_service_capability::Type::Rpc(rpc)) => rpc.r#type.try_into().ok(),
            None => None,
        }
    }
}

impl From<group_controller_service_capability::rpc::Type> for GroupControllerServiceCapability {
    fn from(rpc: group_controller_service_capability::rpc::Type) -> Self {
        use group_controller_service_capability::{Rpc, Type};
        Self {
            r#type: Some(Type::Rpc(Rpc { r#type: rpc as i32 })),
        }
    }
}

impl GroupControllerServiceCapability {
    /// The RPC capability this value declares, if it is a known RPC type.
    pub fn rpc_type(&self) -> Option<group_controller_service_capability::rpc::Type> {
        match &self.r#type {
            Some(group_controller_service_capability::Type::Rpc(rpc)) => rpc.r#type.try_into().ok(),
            None => None,
        }
    }
}

impl From<plugin_capability::service::Type> for PluginCapability {
    fn from(service: plugin_capability::service::Type) -> Self {
        use plugin_capability::{Service, Type};
        Self {
            r#type: Some(Type::Service(Service {
                r#type: service as i32,
            })),
        }
    }
}

impl From<plugin_capability::volume_expansion::Type> for PluginCapability {
    fn from(expansion: plugin_capability::volume_expansion::Type) -> Self {
        use plugin_capability::{Type, VolumeExpansion};
        Self {
            r#type: Some(Type::VolumeExpansion(VolumeExpansion {
                r#type: expansion as i32,
            })),
        }
    }
}

impl PluginCapability {
    /// The service this capability declares, if it is a known service type.
    pub fn service_type(&self) -> Option<plugin_capability::service::Type> {
        match &self.r#type {
            Some(plugin_capability::Type::Service(s)) => s.r#type.try_into().ok(),
            _ => None,
        }
    }

    /// The volume expansion mode this capability declares, if any.
    pub fn volume_expansion_type(&self) -> Option<plugin_capability::volume_expansion::Type> {
        match &self.r#type {
            Some(plugin_capability::Type::VolumeExpansion(e)) => e.r#type.try_into().ok(),
            _ => None,
        }
    }
}

impl Mode {
    /// Every access mode but `Unknown`.
    pub const KNOWN: [Mode; 7] = [
        Mode::SingleNodeWriter,
        Mode::SingleNodeReaderOnly,
        Mode::MultiNodeReaderOnly,
        Mode::MultiNodeSingleWriter,
        Mode::MultiNodeMultiWriter,
        Mode::SingleNodeSingleWriter,
        Mode::SingleNodeMultiWriter,
    ];

    /// The volume may be published on one node at a time.
    pub fn is_single_node(self) -> bool {
        matches!(
            self,
            Mode::SingleNodeWriter
                | Mode::SingleNodeReaderOnly
                | Mode::SingleNodeSingleWriter
                | Mode::SingleNodeMultiWriter
        )
    }

    /// The volume may be published on several nodes at once.
    pub fn is_multi_node(self) -> bool {
        matches!(
            self,
            Mode::MultiNodeReaderOnly | Mode::MultiNodeSingleWriter | Mode::MultiNodeMultiWriter
        )
    }

    /// Every publication is read-only.
    pub fn is_read_only(self) -> bool {
        matches!(self, Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly)
    }

    /// Several workloads may write at once.
    pub fn is_multi_writer(self) -> bool {
        matches!(
            self,
            Mode::SingleNodeMultiWriter | Mode::MultiNodeMultiWriter
        )
    }
}

impl VolumeCapability {
    /// A filesystem capability with the given `fs_type` (empty = driver
    /// default), access mode unset until [`with_access_mode`](Self::with_access_mode).
    pub fn mount(fs_type: impl Into<String>) -> Self {
        Self {
            access_type: Some(AccessType::Mount(MountVolume {
                fs_type: fs_type.into(),
                ..Default::default()
            })),
            access_mode: None,
        }
    }

    /// A raw block capability.
    pub fn block() -> Self {
        Self {
            access_type: Some(AccessType::Block(BlockVolume {})),
            access_mode: None,
        }
    }

    /// Sets the access mode.
    pub fn with_access_mode(mut self, mode: Mode) -> Self {
        self.access_mode = Some(AccessMode { mode: mode as i32 });
        self
    }

    /// Sets mount flags (ignored for block capabilities).
    pub fn with_mount_flags<I, S>(mut self, flags: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        if let Some(AccessType::Mount(m)) = &mut self.access_type {
            m.mount_flags = flags.into_iter().map(Into::into).collect();
        }
        self
    }

    /// Sets the volume mount group (ignored for block capabilities).
    pub fn with_volume_mount_group(mut self, group: impl Into<String>) -> Self {
        if let Some(AccessType::Mount(m)) = &mut self.access_type {
            m.volume_mount_group = group.into();
        }
        self
    }

    /// The access mode, `Unknown` when unset or not a known value.
    pub fn access_mode(&self) -> Mode {
        self.access_mode
            .as_ref()
            .and_then(|m| Mode::try_from(m.mode).ok())
            .unwrap_or(Mode::Unknown)
    }

    /// Whether this is a raw block capability.
    pub fn is_block(&self) -> bool {
        matches!(self.access_type, Some(AccessType::Block(_)))
    }

    /// The filesystem part of a mount capability.
    pub fn mount_volume(&self) -> Option<&MountVolume> {
        match &self.access_type {
            Some(AccessType::Mount(m)) => Some(m),
            _ => None,
        }
    }
}

impl CapacityRange {
    /// At least `bytes`, no upper bound.
    pub fn at_least(bytes: i64) -> Self {
        Self {
            required_bytes: bytes,
            limit_bytes: 0,
        }
    }

    /// At most `bytes`, no lower bound.
    pub fn at_most(bytes: i64) -> Self {
        Self {
            required_bytes: 0,
            limit_bytes: bytes,
        }
    }

    /// Between `required` and `limit` bytes, inclusive.
    pub fn between(required: i64, limit: i64) -> Self {
        Self {
            required_bytes: required,
            limit_bytes: limit,
        }
    }

    /// Exactly `bytes`.
    pub fn exactly(bytes: i64) -> Self {
        Self::between(bytes, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::controller_service_capability::rpc::Type as Rpc;

    #[test]
    fn access_mode_predicates_partition_the_modes() {
        for mode in Mode::KNOWN {
            assert_ne!(mode.is_single_node(), mode.is_multi_node(), "{mode:?}");
        }
        assert!(!Mode::Unknown.is_single_node() && !Mode::Unknown.is_multi_node());
        assert!(Mode::MultiNodeReaderOnly.is_read_only());
        assert!(Mode::SingleNodeMultiWriter.is_multi_writer());
        assert!(!Mode::MultiNodeSingleWriter.is_multi_writer());
    }

    #[test]
    fn builders_round_trip_through_accessors() {
        let cap = VolumeCapability::mount("xfs")
            .with_mount_flags(["noatime"])
            .with_volume_mount_group("1000")
            .with_access_mode(Mode::MultiNodeMultiWriter);
        assert_eq!(cap.access_mode(), Mode::MultiNodeMultiWriter);
        let m = cap.mount_volume().unwrap();
        assert_eq!(
            (m.fs_type.as_str(), m.volume_mount_group.as_str()),
            ("xfs", "1000")
        );
        assert_eq!(m.mount_flags, vec!["noatime".to_string()]);
        let block = VolumeCapability::block().with_mount_flags(["ro"]);
        assert!(block.is_block() && block.mount_volume().is_none());
        assert_eq!(block.access_mode(), Mode::Unknown);

        assert_eq!(
            ControllerServiceCapability::from(Rpc::GetVolume).rpc_type(),
            Some(Rpc::GetVolume)
        );
        let svc = plugin_capability::service::Type::ControllerService;
        assert_eq!(PluginCapability::from(svc).service_type(), Some(svc));
        assert_eq!(PluginCapability::from(svc).volume_expansion_type(), None);
        assert_eq!(CapacityRange::exactly(5), CapacityRange::between(5, 5));
    }
}
