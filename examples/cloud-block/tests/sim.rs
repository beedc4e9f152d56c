//! The cloud-block driver in csi-sim's world: its controller (no store:
//! the provider is the source of truth) over `SimProvider`, whose cloud
//! outlives every crash, and its node over the world's mounts, devices and
//! filesystem tools, with a crash or a fault (an errno; a 5xx, a 429 or a
//! timeout before or after the change at a provider call) at every step
//! of every standard workload the driver supports. It clones (the provider
//! copies a volume) but declares no group snapshots, so the group workload
//! is left out; it attaches, so staging is preceded by ControllerPublish.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use clap::Parser;
use cloud_block::api::{ActionStatus, CreateVolumeRequest};
use cloud_block::client::{ProviderClient, SIM_ACTION_CALLS, SimProvider};
use cloud_block::driver::{CloudController, Flags, controller_config, node_on};
use csi_controller::ControllerService;
use csi_driver::clock::FakeClock;
use csi_node::NodeHost;
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_sim::targets::{Declared, NODE_ID, assert_serves, declared_by, workloads_for};
use csi_sim::{DataView, Services, SimExec, SimFsTools, SimMounter, SimRunner, Started, World};
use csi_store::FileStore;
use mount_utils::{BlockDevices, Exec, Mounter, ResizeFs};

const REGION: &str = "dev-1";

/// The driver as its main starts it (controller, then node with the
/// restore of what it staged and published), on `world`.
fn cloud(world: &World) -> Result<Services, String> {
    let provider = Arc::new(SimProvider::new(world, world.host_dir().join("by-id")));
    let mut config = controller_config(REGION);
    // Backoff and polling cost no real time.
    config.clock = Arc::new(FakeClock::default());
    let client = provider.clone();
    let backend = CloudController {
        client,
        region: REGION.into(),
    };
    let controller = ControllerService::without_store(config, backend)?;
    let mounter: Arc<dyn Mounter> = Arc::new(SimMounter::new(world));
    let tools = Arc::new(SimFsTools::new(world));
    let exec: Arc<dyn Exec> = Arc::new(SimExec::new(world, tools.clone()));
    let resize = ResizeFs::new(exec.clone()).with_device_size_fn(move |d| tools.device_size(d));
    let devices: Arc<dyn BlockDevices> = world.block_devices().clone();
    let host = NodeHost {
        devices: Some(devices),
        resize,
        ..NodeHost::new(mounter, exec)
    };
    let device_dir = provider.device_dir().display().to_string();
    let flags = Flags::parse_from([
        "cloud-block",
        "--nodeid",
        NODE_ID,
        "--device-dir",
        &device_dir,
    ]);
    let store =
        FileStore::open_on(world.fs().handle(), "/state/node").map_err(|e| e.to_string())?;
    let node = node_on(&flags, host)
        .open(Arc::new(store))
        .map_err(|e| e.to_string())?;
    let report = node.restore();
    if !report.abnormal.is_empty() {
        return Err(format!("abnormal after restore: {:?}", report.abnormal));
    }
    Ok(Services {
        controller: Arc::new(controller),
        group: None,
        node: Arc::new(node),
        data: provider,
    })
}

fn start(world: &World) -> Started {
    let world = world.clone();
    Box::pin(async move { cloud(&world) })
}

#[test]
fn every_step_of_every_workload_survives_every_fault() {
    let declared = Declared {
        clones: true,
        group_snapshots: false,
        attaches: true,
    };
    // What the controller's backend declares (the clone was left out while
    // this said `clones: false` after the driver gained CLONE_VOLUME).
    let world = World::new(None).unwrap();
    let backend = CloudController {
        client: Arc::new(SimProvider::new(&world, world.host_dir().join("by-id"))),
        region: REGION.into(),
    };
    assert_eq!(declared_by(&backend), declared);
    // It declares SINGLE_NODE_MULTI_WRITER: what Kubernetes then asks for.
    let runner = SimRunner::new(&start).access_mode(Mode::SingleNodeMultiWriter);
    let report = assert_serves(&runner, declared);
    if std::env::var_os("CSI_SIM_REPLAY").is_none() {
        let provider_faults = [
            "provider-5xx",
            "provider-429",
            "timeout-before",
            "timeout-after",
        ];
        for fault in provider_faults {
            assert!(
                report.by_fault.get(fault).is_some_and(|t| t.runs > 0),
                "{report}"
            );
        }
    }
}

/// An attach stays in progress for some provider calls (the driver's wait
/// runs in every workload that attaches, and a crash meets it), and the
/// runner sees the attachment once the cloud made it.
#[test]
fn an_attach_stays_in_progress_until_the_cloud_ends_it() {
    let world = World::new(None).unwrap();
    let provider = SimProvider::new(&world, world.host_dir().join("by-id"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let req = CreateVolumeRequest {
            name: "pv-1".into(),
            size_gigabytes: 1,
            ..Default::default()
        };
        let volume = provider.create_volume(&req).await.unwrap();
        let action = provider.attach(&volume.id, NODE_ID).await.unwrap();
        assert_eq!(action.status, ActionStatus::InProgress);
        for _ in 1..SIM_ACTION_CALLS {
            let polled = provider.get_action(action.id).await.unwrap();
            assert_eq!(polled.status, ActionStatus::InProgress);
            assert_eq!(provider.attached_volumes(), Some(BTreeSet::new()));
        }
        let polled = provider.get_action(action.id).await.unwrap();
        assert_eq!(polled.status, ActionStatus::Completed);
        let attached = provider.attached_volumes();
        assert_eq!(attached, Some(BTreeSet::from([volume.id.clone()])));
    });
}

/// Its data as the provider says, with one attachment more than the CO
/// asked for: what a driver that leaks an attach looks like to the runner.
struct LeakedAttach(Arc<dyn DataView>);

impl DataView for LeakedAttach {
    fn volumes(&self) -> BTreeMap<String, String> {
        self.0.volumes()
    }
    fn snapshots(&self) -> BTreeMap<String, String> {
        self.0.snapshots()
    }
    fn volume_at(&self, mount: &mount_utils::MountInfo) -> Option<String> {
        self.0.volume_at(mount)
    }
    fn attached_volumes(&self) -> Option<BTreeSet<String>> {
        let mut attached = self.0.attached_volumes()?;
        attached.insert("vol-leaked".into());
        Some(attached)
    }
}

fn start_leaking(world: &World) -> Started {
    let world = world.clone();
    Box::pin(async move {
        let mut services = cloud(&world)?;
        services.data = Arc::new(LeakedAttach(services.data));
        Ok(services)
    })
}

#[test]
fn an_attachment_the_co_does_not_hold_is_a_violation() {
    let declared = Declared {
        clones: false,
        group_snapshots: false,
        attaches: true,
    };
    let lifecycle = workloads_for(declared).remove(0);
    let runner = SimRunner::new(&start_leaking).access_mode(Mode::SingleNodeMultiWriter);
    // A crash planned past the last step: the run without a fault.
    let spec = format!("{}:{}:crash", lifecycle.name, u32::MAX);
    let (_, violations) = runner.replay(&lifecycle, &spec).unwrap();
    let first = violations.first().map(|v| v.what.as_str()).unwrap_or("");
    assert!(first.contains("provider attachments"), "{violations:?}");
    assert!(first.contains("vol-leaked"), "{violations:?}");
}
