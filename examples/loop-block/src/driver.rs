//! The driver value shared by every service, and startup reconciliation.

use std::sync::Arc;

use csi_controller::{ControllerService, open_state_on};
use csi_proto::v1::node_service_capability::rpc::Type as NodeRpc;
use csi_server::v1::{GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse};
use csi_server::{CallContext, Capabilities, CsiResult, PluginService, VolumeExpansion};
use csi_store::FileStore;
use mount_utils::{Exec, LinuxLoopDevices, LoopDevices, Mounter, ResizeFs, SystemExec};

use crate::backend::Backend;
use crate::config::Config;
use crate::node::{NodeSide, open_node};

/// The loop-block driver: cheap to clone (everything shared is behind `Arc`).
#[derive(Clone)]
pub struct LoopBlock {
    /// This node's id (`--nodeid`, else the hostname).
    pub node_id: String,
    /// The Controller and GroupController, and the records (`--mode
    /// controller` or `both`).
    pub controller: Option<ControllerService<Backend>>,
    /// The backing files under `--datadir`.
    pub backend: Backend,
    /// The node's mounts.
    pub mounter: Arc<dyn Mounter>,
    /// The node service, csi-node's, over what this node staged and
    /// published (`--mode node` or `both`).
    pub node: Option<Arc<csi_node::NodeService<NodeSide>>>,
    /// Whether the backing files' filesystem takes O_DIRECT.
    pub direct_io_supported: bool,
}

/// The controller service's configuration from the flags: disks are whole MiB (loop
/// devices want whole sectors, filesystems whole blocks), never more than
/// the free space (sparse files could overcommit), attached to this node.
pub fn controller_config(config: &Config) -> csi_controller::Config {
    csi_controller::Config {
        refuse_beyond_free_space: true,
        min_size: 1 << 20,
        max_size: config.max_volume_size,
        mount_unit: 1 << 20,
        attach_limit: config.attach_limit,
        ..csi_controller::Config::new(config.common.node_id())
    }
}

impl LoopBlock {
    /// Opens (or creates) the state directory and locks it for the life of
    /// the process: a second instance on it gets an error naming the first.
    /// The disks live in the data dir (the state dir unless `--datadir`).
    /// Its effects are crash points in test builds (crash-points, armed).
    pub fn open(config: Config, mounter: Arc<dyn Mounter>) -> Result<Self, String> {
        let exec = crash_points::exec(Arc::new(SystemExec::new()));
        let loops = crash_points::loop_devices(Arc::new(LinuxLoopDevices::new()));
        Self::open_with(config, crash_points::mounter(mounter), loops, exec)
    }

    /// [`open`](Self::open) with the loop devices and the program runner
    /// to use (fakes in tests).
    pub fn open_with(
        config: Config,
        mounter: Arc<dyn Mounter>,
        loops: Arc<dyn LoopDevices>,
        exec: Arc<dyn Exec>,
    ) -> Result<Self, String> {
        let fs = crash_points::file_system(Arc::new(csi_store::RealFs));
        let files = open_state_on(fs, &config.statedir, || {})?;
        let resize = ResizeFs::new(exec.clone());
        Self::open_on(config, files, mounter, loops, exec, resize)
    }

    /// [`open_with`](Self::open_with) with its records in `files`, a store
    /// already open (csi-sim's simulated filesystem in the simulation
    /// test), and `resize` to grow filesystems with (which reads device
    /// sizes: from the simulated devices there).
    pub fn open_on(
        config: Config,
        files: FileStore,
        mounter: Arc<dyn Mounter>,
        loops: Arc<dyn LoopDevices>,
        exec: Arc<dyn Exec>,
        resize: ResizeFs,
    ) -> Result<Self, String> {
        let data = config.data_dir();
        let backend = Backend::new(&data, loops.clone())
            .map_err(|e| format!("preparing {}: {e}", data.display()))?;
        let controller = match config.serves_controller() {
            true => Some(ControllerService::open(
                files.clone(),
                controller_config(&config),
                backend.clone(),
            )?),
            false => None,
        };
        let node = match config.serves_node() {
            true => {
                let side = NodeSide {
                    engine: controller.as_ref().map(ControllerService::downgrade),
                    backend: backend.for_node_side(),
                    records: Arc::downgrade(&backend.node),
                };
                let seams = (mounter.clone(), loops, exec, resize);
                let node = open_node(&config, side, seams, &files)?;
                let _ = backend.node.set(node.volumes().clone());
                Some(node)
            }
            false => None,
        };
        Ok(Self {
            direct_io_supported: backend.direct_io_supported,
            node_id: config.common.node_id(),
            controller,
            backend,
            mounter,
            node,
        })
    }

    /// Startup reconciliation, before serving: thaws filesystems a crash
    /// left frozen; finishes group snapshots a crash left half saved or half
    /// removed; removes backing files and snapshot copies no record owns
    /// (unacknowledged creates, half-done deletes), each logged, except
    /// those of records set aside as unreadable. What the node record says
    /// is staged and published is put back while serving
    /// (`NodeService::restore_in_background`; a volume that cannot be
    /// restored, e.g. its image is gone or its first blocks are damaged, is
    /// reported abnormal, never formatted).
    pub async fn reconcile_on_start(&self) -> CsiResult<()> {
        if let Some(node) = &self.node {
            thaw_after_crash(node, self.mounter.as_ref());
        }
        match &self.controller {
            Some(controller) => controller.reconcile().await,
            None => Ok(()),
        }
    }
}

/// A crash during a group snapshot can leave members frozen, and every
/// writer in their pods blocked: thaw them before anything else.
fn thaw_after_crash(node: &csi_node::NodeService<NodeSide>, mounter: &dyn Mounter) {
    for (id, record) in node.volumes().records() {
        let Some(stage) = record.stage.filter(|s| !s.capability.is_block()) else {
            continue;
        };
        if !mounter.is_mount_point(&stage.path).unwrap_or(false) {
            continue;
        }
        match mount_utils::freeze::thaw(&stage.path) {
            Ok(true) => {
                tracing::warn!(volume = %id, "thawed a filesystem left frozen by a crash")
            }
            Ok(false) => {}
            Err(e) => tracing::error!(volume = %id, error = %e, "thawing after a crash"),
        }
    }
}

impl LoopBlock {
    /// What this instance declares: the node's capabilities when it serves
    /// the node, and the controller's from what its backend offers.
    pub fn capabilities(&self) -> Capabilities {
        let node = match &self.node {
            Some(_) => Capabilities::new().node([
                NodeRpc::StageUnstageVolume,
                NodeRpc::GetVolumeStats,
                NodeRpc::ExpandVolume,
                NodeRpc::SingleNodeMultiWriter,
            ]),
            None => Capabilities::new(),
        };
        match &self.controller {
            Some(controller) => controller.capabilities(node),
            None => node,
        }
    }
}

/// The plugin as a whole: GetPluginCapabilities is "the grand sum of all
/// capabilities of all instances" and the same whichever RPCs an instance
/// serves (spec: GetPluginCapabilities), so a `--mode node` instance also
/// reports the services its controller serves (which a CO and csi-sanity
/// read from the node's endpoint).
pub fn whole_plugin(instance: &Capabilities) -> Capabilities {
    instance
        .clone()
        .plugin(PluginService::ControllerService)
        .plugin(PluginService::GroupControllerService)
        .volume_expansion(VolumeExpansion::Online)
}

#[csi_server::async_trait]
impl csi_server::Identity for LoopBlock {
    async fn get_plugin_capabilities(
        &self,
        ctx: &CallContext,
        _req: GetPluginCapabilitiesRequest,
    ) -> CsiResult<GetPluginCapabilitiesResponse> {
        Ok(whole_plugin(ctx.capabilities()).plugin_response())
    }
}

#[cfg(test)]
mod tests {
    //! The controller service with this backend, on a FakeMounter: what the tuning
    //! keys do to CreateVolume and ControllerModifyVolume.
    use std::collections::HashMap;

    use clap::Parser;
    use csi_server::v1::*;
    use csi_server::{CallContext, Controller, CsiError, Method};

    use super::*;
    use crate::tuning::{DIRECT_IO_KEY, READ_AHEAD_KEY};

    fn params(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn create(name: &str, kv: &[(&str, &str)]) -> CreateVolumeRequest {
        CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(CapacityRange::at_least(1 << 20)),
            volume_capabilities: vec![VolumeCapability::block()],
            mutable_parameters: params(kv),
            ..Default::default()
        }
    }

    /// Every mode reports the same plugin capabilities: those of both.
    #[test]
    fn every_mode_reports_the_whole_plugin() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data").to_string_lossy().into_owned();
        let declared = |mode: &str| {
            let state = dir.path().join(mode).to_string_lossy().into_owned();
            let config = Config::for_test(mode, &state, &data);
            let d = LoopBlock::open(config, Arc::new(mount_utils::FakeMounter::new())).unwrap();
            d.capabilities()
        };
        let both = declared("both");
        let whole = both.plugin_response();
        assert_eq!(whole_plugin(&both).plugin_response(), whole);
        for mode in ["controller", "node"] {
            let answer = whole_plugin(&declared(mode)).plugin_response();
            assert_eq!(answer, whole, "--mode {mode}");
        }
    }

    #[tokio::test]
    async fn mutable_parameters_are_checked_kept_and_merged() {
        let dir = tempfile::tempdir().unwrap();
        let statedir = dir.path().to_string_lossy().into_owned();
        let config = Config::parse_from(["loop-block", "--statedir", &statedir, "--nodeid", "n1"]);
        // Fakes for every seam: the host's loop devices (/sys/block) are
        // never read (issue 22).
        let d = LoopBlock::open_with(
            config,
            Arc::new(mount_utils::FakeMounter::new()),
            Arc::new(mount_utils::FakeLoopDevices::new()),
            Arc::new(mount_utils::FakeExec::new()),
        )
        .unwrap();
        let controller = d.controller.as_ref().unwrap();
        let ctx = CallContext::detached(0, Method::CreateVolume);
        let created = controller.create_volume(&ctx, create("pvc-1", &[(READ_AHEAD_KEY, "512")]));
        let id = created.await.unwrap().volume.unwrap().volume_id;
        let tuning = || {
            let params = controller.known_volume(&id).unwrap().mutable_parameters;
            d.backend.tuning(&params).unwrap()
        };
        assert_eq!(tuning().read_ahead_kib, Some(512));
        let modify = |kv: &[(&str, &str)]| ControllerModifyVolumeRequest {
            volume_id: id.clone(),
            mutable_parameters: params(kv),
            ..Default::default()
        };
        // An unknown key next to a good one: INVALID_ARGUMENT naming it, nothing applied.
        let bad = modify(&[(READ_AHEAD_KEY, "8"), ("XXX_FakeKey", "x")]);
        let err = controller
            .controller_modify_volume(&ctx, bad)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, CsiError::InvalidArgument { field, .. } if field == "mutable_parameters[XXX_FakeKey]"),
            "{err:?}"
        );
        assert_eq!(tuning().read_ahead_kib, Some(512));
        // Keys not sent keep their values.
        let good = modify(&[(DIRECT_IO_KEY, "false")]);
        controller
            .controller_modify_volume(&ctx, good)
            .await
            .unwrap();
        assert_eq!(
            (tuning().read_ahead_kib, tuning().direct_io),
            (Some(512), Some(false))
        );
        // CreateVolume with an unknown key creates nothing.
        let refused = controller.create_volume(&ctx, create("pvc-2", &[("XXX_FakeKey", "x")]));
        assert!(refused.await.is_err());
        assert_eq!(
            std::fs::read_dir(d.backend.volumes_dir()).unwrap().count(),
            1
        );
    }
}
