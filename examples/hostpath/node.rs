//! The Node service: csi-node's `NodeService` (the record of what this
//! node staged and published, the spec's rules, stats, expansion) with what
//! is hostpath's own: which volumes exist, where their data is (mount
//! volumes are directories, bind-mounted; block volumes are image files,
//! attached as loop devices), and inline ephemeral volumes.

use std::sync::Arc;

use csi_node::{NodeDriver, NodeInfo, NodeService, Source, VolumeInfo, VolumeLocator};
use csi_proto::v1::NodePublishVolumeRequest;
use csi_server::{CsiError, CsiResult};
use mount_utils::{LoopDevices, Mounter};

use crate::backend::Backend;
use crate::common::state::Ledger;
use crate::config::{Config, TOPOLOGY_KEY};
use crate::driver::HostPath;
use crate::store::{Access, IdKind, Store, VolumeRecord};

/// hostpath's half of the node service.
pub struct NodeSide {
    pub store: Arc<Store>,
    pub backend: Backend,
    pub ledger: Arc<Ledger>,
}

/// The node service, its record under `statedir/node`.
pub fn open_node(
    config: &Config,
    side: NodeSide,
    mounter: Arc<dyn Mounter>,
    loops: Arc<dyn LoopDevices>,
) -> Result<Arc<NodeService<NodeSide>>, String> {
    let mut info = NodeInfo::new(config.node_id()).max_volumes(config.max_volumes_per_node());
    if config.enable_topology {
        info = info.topology(TOPOLOGY_KEY, config.node_id());
    }
    let service = NodeService::builder(Arc::new(side), info, mounter)
        .volumes(|v| v.loop_devices(loops).single_node_multi_writer(true))
        .open_in(&config.statedir.join("node"))
        .map_err(|e| e.to_string())?;
    Ok(Arc::new(service))
}

impl NodeSide {
    /// A volume the controller recorded, or an inline ephemeral volume by
    /// the name the CO gave it.
    fn find(&self, id: &str) -> Option<VolumeRecord> {
        let recorded = IdKind::Volume
            .is_valid(id)
            .then(|| self.store.volumes.get(id));
        recorded.flatten().or_else(|| self.ephemeral_named(id))
    }

    fn ephemeral_named(&self, name: &str) -> Option<VolumeRecord> {
        self.store.volumes.read(|all| {
            all.values()
                .find(|v| v.ephemeral && v.name == name)
                .cloned()
        })
    }
}

impl VolumeLocator for NodeSide {
    fn source(&self, volume_id: &str) -> Option<Source> {
        let volume = self.find(volume_id)?;
        let path = self.backend.volume_path(&volume.id, volume.access);
        Some(match volume.access {
            Access::Mount => Source::Directory(path),
            Access::Block => Source::Image(path),
        })
    }
}

impl NodeDriver for NodeSide {
    fn volume(&self, volume_id: &str) -> Option<VolumeInfo> {
        let v = self.find(volume_id)?;
        Some(VolumeInfo::new(v.access == Access::Block, v.capacity_bytes))
    }

    fn ephemeral_volume(
        &self,
        name: &str,
        _: &NodePublishVolumeRequest,
    ) -> CsiResult<(VolumeInfo, bool)> {
        let volume = VolumeInfo::new(false, crate::controller::DEFAULT_VOLUME_SIZE);
        if self.ephemeral_named(name).is_some() {
            return Ok((volume, false));
        }
        let record = VolumeRecord {
            id: IdKind::Volume.generate(),
            name: name.to_owned(),
            capacity_bytes: volume.capacity_bytes,
            access: Access::Mount,
            source: None,
            parameters: Default::default(),
            mutable_parameters: Default::default(),
            topology: Default::default(),
            request: Vec::new(),
            ephemeral: true,
        };
        self.backend
            .create_volume(&record.id, Access::Mount, record.capacity_bytes)?;
        if let Err(e) = self.store.volumes.put(&record.id, record.clone()) {
            let _ = self.backend.delete_volume(&record.id, Access::Mount);
            return Err(e.into());
        }
        if let Some(r) = self.ledger.reserve(record.capacity_bytes, 0) {
            r.keep();
        }
        Ok((volume, true))
    }

    fn is_ephemeral(&self, name: &str) -> bool {
        self.ephemeral_named(name).is_some()
    }

    /// Its record, then its data.
    fn remove_ephemeral(&self, name: &str) -> CsiResult<()> {
        let Some(volume) = self.ephemeral_named(name) else {
            return Ok(());
        };
        self.store.volumes.remove(&volume.id)?;
        self.ledger.release(volume.capacity_bytes);
        self.backend.delete_volume(&volume.id, Access::Mount)?;
        // Best effort: on a full disk a repeated unpublish gets NOT_FOUND.
        if let Err(e) = self.store.retire_ephemeral(name) {
            tracing::warn!(volume = %volume.id, error = %e, "could not remember a removed ephemeral volume");
        }
        Ok(())
    }

    fn ephemeral_retired(&self, name: &str) -> bool {
        self.store.retired_ephemeral.contains_key(name)
    }
}

impl HostPath {
    /// The record of a volume the controller made, or NOT_FOUND.
    pub(crate) fn known_volume(&self, id: &str) -> CsiResult<VolumeRecord> {
        let volume = IdKind::Volume
            .is_valid(id)
            .then(|| self.store.volumes.get(id));
        volume
            .flatten()
            .ok_or_else(|| CsiError::NotFound(format!("volume {id:?} does not exist")))
    }

    /// Whether the node record holds anything of volume `id` (the
    /// controller refuses to delete it then).
    pub fn in_use_on_node(&self, id: &str) -> bool {
        self.node.volumes().record(id).is_some()
    }
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
        let (target, file) = (dir.path().join("pod"), dir.path().join("user-file"));
        d.node
            .node_publish_volume(&ctx, publish(&target))
            .await
            .unwrap();
        assert_eq!((d.store.volumes.len(), d.backend.data().0.len()), (1, 1));
        for _ in 0..2 {
            // The second time: a repeat after it was removed.
            let req = unpublish_req("inline-1", &target);
            d.node.node_unpublish_volume(&ctx, req).await.unwrap();
            assert_eq!((d.store.volumes.len(), d.backend.data().0.len()), (0, 0));
        }
        // A publish refused (the target is a user's file) leaves nothing.
        std::fs::write(&file, b"not a directory").unwrap();
        let refused = d.node.node_publish_volume(&ctx, publish(&file)).await;
        assert!(refused.is_err() && d.node.volumes().records().is_empty());
        assert_eq!((d.store.volumes.len(), d.backend.data().0.len()), (0, 0));
    }
}
