//! [`NodeHost`]: what a node plugin whose volumes are devices runs on, and
//! the [`NodeService`] set up on it; plus opening its record on a chosen
//! file system (crash-points' counted one in a driver's test builds, a
//! simulated one in csi-sim).

use std::path::Path;
use std::sync::Arc;

use csi_store::{FileStore, FileSystem};
use mount_utils::{BlockDevices, Exec, Mounter, ResizeFs, SafeFormatAndMount};

use crate::error::NodeError;
use crate::service::{NodeBackend, NodeInfo, NodeService, NodeServiceBuilder};

/// The host seams of a node plugin whose volumes are devices: its mounts,
/// the programs it runs (blkid, mkfs, fsck, resize2fs), where attached
/// devices appear and how filesystems are grown. The host's own for a
/// driver's `main`; fakes or a simulation's in tests.
pub struct NodeHost {
    /// Mounts.
    pub mounter: Arc<dyn Mounter>,
    /// blkid, mkfs, fsck and the resize tools.
    pub exec: Arc<dyn Exec>,
    /// Attached devices (`None`: mount-utils' `LinuxBlockDevices`).
    pub devices: Option<Arc<dyn BlockDevices>>,
    /// Grows filesystems.
    pub resize: ResizeFs,
}

impl NodeHost {
    /// On `mounter` and `exec`, with the host's block devices and
    /// filesystems grown by `exec`'s tools; a fake or a simulation sets the
    /// other fields with struct update syntax.
    pub fn new(mounter: Arc<dyn Mounter>, exec: Arc<dyn Exec>) -> Self {
        NodeHost {
            resize: ResizeFs::new(exec.clone()),
            mounter,
            exec,
            devices: None,
        }
    }
}

impl<D: NodeBackend> NodeService<D> {
    /// A builder for `driver`'s node service on `host`: filesystems are put
    /// on devices with `SafeFormatAndMount` over the host's mounter and
    /// programs (formatted only when they hold no filesystem, never
    /// again), attached devices are waited for through the host's
    /// `BlockDevices`, and NodeExpandVolume grows filesystems with its
    /// resizer.
    pub fn builder_on(driver: Arc<D>, info: NodeInfo, host: NodeHost) -> NodeServiceBuilder<D> {
        let formatter = SafeFormatAndMount::new(host.mounter.clone(), host.exec);
        let devices = host.devices;
        NodeService::builder(driver, info, host.mounter)
            .volumes(|v| {
                let v = v.filesystem_mount(Arc::new(formatter));
                match devices {
                    Some(devices) => v.block_devices(devices),
                    None => v,
                }
            })
            .resize_filesystems(host.resize)
    }
}

impl<D: NodeBackend> NodeServiceBuilder<D> {
    /// [`open_in`](Self::open_in) with the store's file operations made
    /// through `fs` (crash-points' counted real ones in a driver's test
    /// builds). The error names `dir`.
    pub fn open_on(self, fs: Arc<dyn FileSystem>, dir: &Path) -> Result<NodeService<D>, NodeError> {
        let builder = self.volumes(|v| match v.has_private_mounts() {
            true => v,
            false => v.private_mounts(dir.join("mounts")),
        });
        let store = FileStore::open_on(fs, dir).map_err(|e| NodeError::Store {
            full: e.is_no_space(),
            reason: format!("{}: {e}", dir.display()),
        })?;
        builder.open(Arc::new(store))
    }
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use std::time::Duration;

    use csi_driver::{CallContext, Method, Node};
    use csi_proto::v1::volume_capability::access_mode::Mode;
    use mount_utils::{DeviceNumber, ExecOutput, FakeExec};

    use super::*;
    use crate::AttachedDevices;
    use crate::testing::FakeHost;
    use crate::testing::requests::{cap, stage_req};

    /// The node of a remote-disk driver set up from its host alone: the
    /// device is waited for, probed, formatted and mounted, and the record
    /// is in files under the state directory, opened through `fs`.
    #[tokio::test]
    async fn a_node_on_a_host_formats_and_mounts_an_attached_device() {
        let (fake, exec) = (FakeHost::new(), Arc::new(FakeExec::new()));
        let by_id = Path::new("/dev/disk/by-id");
        fake.attach_device(
            &by_id.join("d1"),
            DeviceNumber::new(8, 16),
            1 << 20,
            Duration::ZERO,
        );
        let host = NodeHost {
            devices: Some(fake.block_devices()),
            ..NodeHost::new(fake.mounter(), exec.clone())
        };
        let devices = Arc::new(AttachedDevices::new(by_id, "name"));
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let node = NodeService::builder_on(devices, NodeInfo::new("n1"), host)
            .open_on(Arc::new(csi_store::RealFs), &state)
            .unwrap();
        exec.expect("blkid", ExecOutput::exit(2, ""));
        exec.expect("mkfs.ext4", ExecOutput::ok(""));
        let staging = dir.path().join("staging");
        let mut req = stage_req("v1", &staging, cap(false, Mode::SingleNodeWriter, &[]));
        req.publish_context.insert("name".into(), "d1".into());
        let ctx = CallContext::detached(0, Method::NodeStageVolume);
        node.node_stage_volume(&ctx, req).await.unwrap();
        assert_eq!(exec.pending(), 0, "blkid found nothing, mkfs ran");
        assert_eq!(fake.mounts_at(&staging).len(), 1);
        assert!(
            state.join(csi_store::LOCK_FILE).exists(),
            "the record is under the state dir"
        );
        // A second service on the same directory is refused, naming it.
        let again = NodeService::builder_on(
            Arc::new(AttachedDevices::new(by_id, "name")),
            NodeInfo::new("n1"),
            NodeHost::new(fake.mounter(), exec.clone()),
        );
        let e = again
            .open_on(Arc::new(csi_store::RealFs), &state)
            .err()
            .unwrap();
        assert!(e.to_string().contains(&state.display().to_string()), "{e}");
    }
}
