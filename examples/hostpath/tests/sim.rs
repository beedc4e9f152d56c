//! The hostpath driver in csi-sim's world: its controller and node over
//! their own backend, with the records on the world's simulated filesystem
//! (a crash keeps what the page cache holds, a power loss only what was
//! synced), its mounts and loop devices the world's, and the volumes' data
//! in a directory of the world's host. A crash or a fault at every step of
//! every standard workload it supports: it clones and attaches
//! (`--enable-attach`); group snapshots need a dedicated filesystem that
//! the world's host directory is not, so that workload is left out.

use std::sync::Arc;

use clap::Parser;
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_sim::targets::{
    BackendData, Declared, NODE_ID, all_restored, assert_survives_in, left_out, workloads_for,
};
use csi_sim::{Services, SimLoops, SimMounter, SimReport, SimRunner, Started, World};
use csi_store::FileStore;
use hostpath::{Config, HostPath};

/// The driver as its main starts it: state opened, the controller's
/// startup reconciliation, then the node's restore.
async fn hostpath(world: &World) -> Result<Services, String> {
    let statedir = world.host_dir().join("hostpath");
    // The volumes' data is as a crash left it, whatever the dead process
    // still does to it.
    world.keep_on_crash(&statedir).map_err(|e| e.to_string())?;
    let statedir = statedir.display().to_string();
    let flags = ["hostpath", "--nodeid", NODE_ID, "--statedir", &statedir];
    let config = Config::parse_from(flags.into_iter().chain(["--enable-attach"]));
    let files = FileStore::open_on(world.fs().handle(), "/state/hostpath");
    let files = files.map_err(|e| e.to_string())?;
    let mounter = Arc::new(SimMounter::new(world));
    let driver = HostPath::open_on(config, files, mounter, Arc::new(SimLoops::new(world)))?;
    driver
        .reconcile_on_start()
        .await
        .map_err(|e| e.to_string())?;
    all_restored(driver.node.restore())?;
    Ok(Services {
        controller: Arc::new(driver.controller.clone()),
        group: None,
        node: driver.node.clone(),
        data: Arc::new(BackendData::new(driver.backend.clone(), world)),
    })
}

fn start(world: &World) -> Started {
    let world = world.clone();
    Box::pin(async move { hostpath(&world).await })
}

#[test]
fn every_step_of_every_workload_survives_every_fault() {
    let declared = Declared {
        clones: true,
        group_snapshots: false,
        attaches: true,
    };
    // What its backend declares on the world's host directory.
    let runner = SimRunner::new(&start).access_mode(Mode::SingleNodeMultiWriter);
    assert_eq!(runner.declared(), Some(declared));
    // What workloads_for leaves out is the group snapshot alone, and why:
    let left: Vec<&str> = left_out(declared).iter().map(|(w, _)| *w).collect();
    assert_eq!(left, ["group-snapshot"]);
    let mut report = SimReport::default();
    report.skip(
        "group-snapshot",
        "not run: hostpath offers group snapshots only with --statedir on a filesystem of its own, \
         which it freezes (FIFREEZE) while it copies; the world's host directory is none, \
         and a freeze is no step of the fakes. tests/crash_every_step.rs runs it on a real one",
    );
    let workloads = workloads_for(declared);
    // It declares SINGLE_NODE_MULTI_WRITER: what Kubernetes then asks for.
    assert_survives_in(&runner, &workloads, report);
}
