//! The loop-block driver in csi-sim's world: its controller and node over
//! their own backend, with the records on the world's simulated filesystem,
//! its mounts and loop devices the world's, mkfs, fsck and resize2fs run
//! as steps over the world's disks (`SimFsTools`), and the backing files in
//! a directory of the world's host. A crash or a fault at every step of
//! every standard workload it supports (it clones, attaches and cuts group
//! snapshots).

use std::sync::Arc;

use clap::Parser;
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_sim::targets::{BackendData, Declared, NODE_ID, all_restored, assert_serves};
use csi_sim::{Services, SimExec, SimFsTools, SimLoops, SimMounter, SimRunner, Started, World};
use csi_store::FileStore;
use loop_block::{Config, LoopBlock};
use mount_utils::{Exec, ResizeFs};

/// The driver as its main starts it: state opened, the startup
/// reconciliation, then the node's restore.
async fn loop_block(world: &World) -> Result<Services, String> {
    let statedir = world.host_dir().join("loop-block");
    // The backing files are as a crash left them, whatever the dead
    // process still does to them.
    world.keep_on_crash(&statedir).map_err(|e| e.to_string())?;
    let statedir = statedir.display().to_string();
    let config = Config::parse_from(["loop-block", "--nodeid", NODE_ID, "--statedir", &statedir]);
    let files = FileStore::open_on(world.fs().handle(), "/state/loop-block");
    let files = files.map_err(|e| e.to_string())?;
    let tools = Arc::new(SimFsTools::new(world));
    let exec: Arc<dyn Exec> = Arc::new(SimExec::new(world, tools.clone()));
    let resize = ResizeFs::new(exec.clone()).with_device_size_fn(move |d| tools.device_size(d));
    let (mounter, loops) = (
        Arc::new(SimMounter::new(world)),
        Arc::new(SimLoops::new(world)),
    );
    let driver = LoopBlock::open_on(config, files, mounter, loops, exec, resize)?;
    driver
        .reconcile_on_start()
        .await
        .map_err(|e| e.to_string())?;
    let (Some(controller), Some(node)) = (driver.controller.clone(), driver.node.clone()) else {
        return Err("loop-block started without its controller or node".into());
    };
    all_restored(node.restore())?;
    Ok(Services {
        controller: Arc::new(controller.clone()),
        group: Some(Arc::new(controller)),
        node,
        data: Arc::new(BackendData::new(driver.backend.clone(), world)),
    })
}

fn start(world: &World) -> Started {
    let world = world.clone();
    Box::pin(async move { loop_block(&world).await })
}

#[test]
fn every_step_of_every_workload_survives_every_fault() {
    let declared = Declared {
        clones: true,
        group_snapshots: true,
        attaches: true,
    };
    // It declares SINGLE_NODE_MULTI_WRITER: what Kubernetes then asks for.
    let runner = SimRunner::new(&start).access_mode(Mode::SingleNodeMultiWriter);
    assert_serves(&runner, declared);
}
