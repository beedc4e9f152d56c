//! The [`offer_abilities!`](crate::offer_abilities) macro.

/// Inside `impl ControllerBackend for X`, hands out the listed optional
/// abilities as `Some(self)`, for a backend that implements their traits
/// itself and always offers them. An ability offered only sometimes keeps
/// its own method.
///
/// The names are [`ControllerBackend`](crate::ControllerBackend)'s:
/// `catalog`, `snapshots`, `expansion`, `modification`, `group_snapshots`,
/// `attacher`.
///
/// ```
/// use csi_controller::{
///     BackendResult, ControllerBackend, ExpandBackend, SnapshotBackend, SnapshotRecord,
///     VolumeRecord,
/// };
///
/// struct Disks;
///
/// #[csi_driver::async_trait]
/// impl ControllerBackend for Disks {
///     async fn create_volume(&self, _: &mut VolumeRecord) -> BackendResult<()> {
///         Ok(())
///     }
///     async fn delete_volume(&self, _: &str) -> BackendResult<bool> {
///         Ok(true)
///     }
///     csi_controller::offer_abilities!(snapshots, expansion);
/// }
///
/// #[csi_driver::async_trait]
/// impl SnapshotBackend for Disks {
///     async fn create_snapshot(&self, _: &mut SnapshotRecord) -> BackendResult<()> {
///         Ok(())
///     }
///     async fn delete_snapshot(&self, _: &str) -> BackendResult<bool> {
///         Ok(true)
///     }
/// }
///
/// #[csi_driver::async_trait]
/// impl ExpandBackend for Disks {
///     async fn expand_volume(&self, _: &VolumeRecord, _: i64) -> BackendResult<()> {
///         Ok(())
///     }
/// }
///
/// assert!(Disks.snapshots().is_some() && Disks.attacher().is_none());
/// ```
#[macro_export]
macro_rules! offer_abilities {
    ($($ability:ident),+ $(,)?) => {
        $($crate::offer_abilities!(@one $ability);)+
    };
    (@one catalog) => {
        fn catalog(&self) -> Option<&dyn $crate::VolumeCatalog> {
            Some(self)
        }
    };
    (@one snapshots) => {
        fn snapshots(&self) -> Option<&dyn $crate::SnapshotBackend> {
            Some(self)
        }
    };
    (@one expansion) => {
        fn expansion(&self) -> Option<&dyn $crate::ExpandBackend> {
            Some(self)
        }
    };
    (@one modification) => {
        fn modification(&self) -> Option<&dyn $crate::ModifyBackend> {
            Some(self)
        }
    };
    (@one group_snapshots) => {
        fn group_snapshots(&self) -> Option<&dyn $crate::GroupSnapshotBackend> {
            Some(self)
        }
    };
    (@one attacher) => {
        fn attacher(&self) -> Option<&dyn $crate::AttachBackend> {
            Some(self)
        }
    };
}
