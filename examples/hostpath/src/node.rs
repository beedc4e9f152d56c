//! The Node service: csi-node's `NodeService` (the record of what this
//! node staged and published, the spec's rules, stats, expansion) with what
//! is hostpath's own: which volumes exist and where their data is (mount
//! volumes are directories, bind-mounted; block volumes are image files,
//! attached as loop devices), and inline ephemeral volumes, all from the
//! controller service's records.

use std::sync::Arc;

use csi_controller::{Access, VolumeRecord, WeakControllerService};
use csi_node::{NodeBackend, NodeInfo, NodeService, VolumeInfo, VolumeLocator, VolumeSource};
use csi_proto::v1::NodePublishVolumeRequest;
use csi_server::{CsiError, CsiResult};
use csi_store::FileStore;
use mount_utils::{LoopDevices, Mounter};

use crate::backend::Backend;
use crate::config::{Config, TOPOLOGY_KEY};

/// hostpath's half of the node service. Weak: the engine's backend holds
/// the node side.
pub struct NodeSide(pub WeakControllerService<Backend>);

/// The node service, its record in the driver's state store (under
/// `statedir/node` for a state dir from before they shared one).
pub fn open_node(
    config: &Config,
    side: NodeSide,
    mounter: Arc<dyn Mounter>,
    loops: Arc<dyn LoopDevices>,
    files: &FileStore,
) -> Result<Arc<NodeService<NodeSide>>, String> {
    let mut info =
        NodeInfo::new(config.common.node_id()).max_volumes(config.max_volumes_per_node());
    if config.enable_topology {
        info = info.topology(TOPOLOGY_KEY, config.common.node_id());
    }
    let service = NodeService::builder(Arc::new(side), info, mounter)
        .volumes(|v| v.loop_devices(loops).single_node_multi_writer(true))
        .open_shared(files, &config.statedir.join("node"))
        .map_err(|e| e.to_string())?;
    Ok(Arc::new(service))
}

impl NodeSide {
    /// A volume the controller recorded, or an inline ephemeral volume by
    /// the name the CO gave it.
    fn find(&self, id: &str) -> Option<VolumeRecord> {
        let engine = self.0.upgrade()?;
        let recorded = engine.known_volume(id).ok();
        recorded.or_else(|| engine.ephemeral_named(id))
    }
}

fn info(v: &VolumeRecord) -> VolumeInfo {
    VolumeInfo::new(v.access == Access::Block, v.capacity_bytes)
}

impl VolumeLocator for NodeSide {
    fn source(&self, volume_id: &str) -> Option<VolumeSource> {
        let volume = self.find(volume_id)?;
        let path = self
            .0
            .upgrade()?
            .backend()
            .volume_path(&volume.id, volume.access);
        Some(match volume.access {
            Access::Mount => VolumeSource::Directory(path),
            Access::Block => VolumeSource::Image(path),
        })
    }
}

impl NodeBackend for NodeSide {
    fn volume(&self, volume_id: &str) -> Option<VolumeInfo> {
        self.find(volume_id).as_ref().map(info)
    }

    fn ephemeral_volume(
        &self,
        name: &str,
        _: &NodePublishVolumeRequest,
    ) -> CsiResult<(VolumeInfo, bool)> {
        let engine = self.0.upgrade().ok_or_else(stopping)?;
        let (volume, created) = engine.create_ephemeral(name)?;
        Ok((info(&volume), created))
    }

    fn is_ephemeral(&self, name: &str) -> bool {
        (self.0.upgrade()).is_some_and(|e| e.ephemeral_named(name).is_some())
    }

    fn remove_ephemeral(&self, name: &str) -> CsiResult<()> {
        let engine = self.0.upgrade().ok_or_else(stopping)?;
        match engine.ephemeral_named(name) {
            Some(volume) => engine.remove_ephemeral(&volume),
            None => Ok(()),
        }
    }

    fn ephemeral_retired(&self, name: &str) -> bool {
        (self.0.upgrade()).is_some_and(|e| e.was_retired(name))
    }
}

fn stopping() -> CsiError {
    CsiError::Unavailable("the plugin is shutting down".into())
}

#[cfg(test)]
mod tests {
    //! hostpath's own node bits on a fake host; the record's rules are
    //! csi-node's and tested there.
    use std::path::Path;

    use clap::Parser;
    use csi_node::testing::{FakeHost, requests::*};
    use csi_proto::v1::volume_capability::access_mode::Mode;
    use csi_server::request::EPHEMERAL_CONTEXT_KEY;
    use csi_server::{CallContext, Method, Node};

    use super::*;
    use crate::driver::HostPath;

    #[tokio::test]
    async fn inline_ephemeral_volumes_are_created_removed_and_retired() {
        let (dir, host) = (tempfile::tempdir().unwrap(), FakeHost::new());
        let statedir = dir.path().join("state").to_string_lossy().into_owned();
        let config = Config::parse_from(["hostpath", "--statedir", &statedir, "--nodeid", "n1"]);
        let d = HostPath::open_with(config, host.mounter(), host.loops()).unwrap();
        let ctx = CallContext::detached(0, Method::NodePublishVolume);
        let publish = |target: &Path| NodePublishVolumeRequest {
            volume_context: [(EPHEMERAL_CONTEXT_KEY.into(), "true".into())].into(),
            ..publish_req(
                "inline-1",
                Path::new(""),
                target,
                cap(false, Mode::SingleNodeWriter, &[]),
            )
        };
        let counts = || {
            (
                d.controller.tables().unwrap().volumes.len(),
                d.backend.data().volumes.len(),
            )
        };
        let (target, file) = (dir.path().join("pod"), dir.path().join("user-file"));
        d.node
            .node_publish_volume(&ctx, publish(&target))
            .await
            .unwrap();
        assert_eq!(counts(), (1, 1));
        for _ in 0..2 {
            // The second time: a repeat after it was removed.
            let req = unpublish_req("inline-1", &target);
            d.node.node_unpublish_volume(&ctx, req).await.unwrap();
            assert_eq!(counts(), (0, 0));
        }
        // A publish refused (the target is a user's file) leaves nothing.
        std::fs::write(&file, b"not a directory").unwrap();
        let refused = d.node.node_publish_volume(&ctx, publish(&file)).await;
        assert!(refused.is_err() && d.node.volumes().records().is_empty());
        assert_eq!(counts(), (0, 0));
    }
}
