//! The floor of cloud-block's overhead figure: a driver on csi-server that
//! does only the work of the bench's direct path, with none of the
//! library's guarantees (no node record, no intent saved before a mount, no
//! ownership checks, no verification, no repeat rules, no retries). It
//! takes cloud-block's flags, so `scripts/bench-cloud-block.sh` runs it in
//! the driver's place (`BENCH_BIN`, docs/benchmarks.md "Session 26"): the
//! driver / direct ratio it gets is what serving four calls to two
//! processes costs before anything the crash and safety rules ask
//! for. Not a driver to use: nothing it does survives a crash or a retry.
//!
//! With `FLOOR_SAVES=1` its node also saves a record of a node record's
//! size in csi-store where cloud-block's node saves one: the stage's
//! intent (while `blkid` runs) and outcome, the publication's outcome,
//! and deletes them on unpublish and unstage. That is the floor plus the
//! durable saves the crash rules need, and still no checks.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
#[path = "support/as_the_driver.rs"]
mod as_the_driver;

use cloud_block::api::{self, device_link_name};
use cloud_block::client::{HttpProvider, ProviderClient, ProviderError};
use cloud_block::driver::{DEVICE_KEY, DRIVER_NAME, Flags, controller_config};
use cloud_block::token::{TOKEN_ENV, Token};
use csi_controller::RetryPolicy;
use csi_driver::v1::*;
use csi_driver::{
    CallContext, Capabilities, Controller, ControllerRpc, CsiError, CsiResult, Node, NodeRpc,
    PluginService, blocking,
};
use csi_server::ServeMode;
use csi_server::flags::{Allocator, driver_runtime, move_code_to_huge_pages, run_to_exit};
use csi_store::{CodecId, FileStore, RecordStore};
use mount_utils::{DiskFormat, LinuxMounter, SafeFormatAndMount, SystemExec};
use nix::mount::{MntFlags, MsFlags};

#[global_allocator]
static ALLOCATOR: Allocator = Allocator;

fn provider_error(e: ProviderError) -> CsiError {
    CsiError::Internal(e.to_string())
}

fn failed(what: &str, e: impl std::fmt::Display) -> CsiError {
    CsiError::Internal(format!("{what}: {e}"))
}

struct FloorController {
    provider: HttpProvider,
    region: String,
    /// The driver's poll schedule.
    retry: RetryPolicy,
}

#[csi_driver::async_trait]
impl Controller for FloorController {
    async fn create_volume(
        &self,
        _: &CallContext,
        req: CreateVolumeRequest,
    ) -> CsiResult<CreateVolumeResponse> {
        let create = api::CreateVolumeRequest {
            name: req.name,
            size_gigabytes: 1,
            region: Some(self.region.clone()),
            ..Default::default()
        };
        let volume = as_the_driver::create(&self.provider, &create).await;
        let volume = volume.map_err(provider_error)?;
        Ok(CreateVolumeResponse {
            volume: Some(Volume {
                volume_id: volume.id,
                capacity_bytes: (volume.size_gigabytes * api::GIB) as i64,
                ..Default::default()
            }),
        })
    }

    async fn delete_volume(
        &self,
        _: &CallContext,
        req: DeleteVolumeRequest,
    ) -> CsiResult<DeleteVolumeResponse> {
        let deleted = self.provider.delete_volume(&req.volume_id).await;
        deleted.map_err(provider_error)?;
        Ok(DeleteVolumeResponse {})
    }

    async fn controller_publish_volume(
        &self,
        _: &CallContext,
        req: ControllerPublishVolumeRequest,
    ) -> CsiResult<ControllerPublishVolumeResponse> {
        let (volume, node) = (req.volume_id.as_str(), req.node_id.as_str());
        let schedule = (self.retry.initial, self.retry.max);
        let attached = as_the_driver::attach(&self.provider, volume, node, schedule).await;
        attached.map_err(provider_error)?;
        let context = HashMap::from([(DEVICE_KEY.to_owned(), device_link_name(volume))]);
        Ok(ControllerPublishVolumeResponse {
            publish_context: context,
        })
    }

    async fn controller_unpublish_volume(
        &self,
        _: &CallContext,
        req: ControllerUnpublishVolumeRequest,
    ) -> CsiResult<ControllerUnpublishVolumeResponse> {
        let started = self.provider.detach(&req.volume_id, &req.node_id).await;
        let id = started.map_err(provider_error)?.id;
        let ended = as_the_driver::until_done(&self.provider, id).await;
        ended.map_err(provider_error)?;
        Ok(ControllerUnpublishVolumeResponse {})
    }
}

struct FloorNode {
    node_id: String,
    device_dir: PathBuf,
    storage: Arc<SafeFormatAndMount>,
    saves: Option<Arc<FileStore>>,
}

/// About the size of cloud-block's node record of a staged volume.
const RECORD: [u8; 600] = [b'r'; 600];
const TABLE: &str = "floor";

fn save(store: &Option<Arc<FileStore>>, key: &str) -> CsiResult<()> {
    let Some(store) = store else { return Ok(()) };
    let saved = store.put(TABLE, key, CodecId::JSON, &RECORD);
    saved.map_err(|e| failed("saving", e))
}

fn forget(store: &Option<Arc<FileStore>>, key: &str) -> CsiResult<()> {
    let Some(store) = store else { return Ok(()) };
    store
        .delete(TABLE, key)
        .map_err(|e| failed("deleting", e))?;
    Ok(())
}

fn mount(source: &Path, target: &str, fs: Option<&str>, flags: MsFlags) -> CsiResult<()> {
    let mounted = nix::mount::mount(Some(source), target, fs, flags, None::<&str>);
    mounted.map_err(|e| failed("mount(2)", e))
}

fn unmount(target: &str) -> CsiResult<()> {
    nix::mount::umount2(target, MntFlags::empty()).map_err(|e| failed("umount(2)", e))
}

#[csi_driver::async_trait]
impl Node for FloorNode {
    async fn node_get_info(
        &self,
        _: &CallContext,
        _: NodeGetInfoRequest,
    ) -> CsiResult<NodeGetInfoResponse> {
        Ok(NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            ..Default::default()
        })
    }

    async fn node_stage_volume(
        &self,
        _: &CallContext,
        req: NodeStageVolumeRequest,
    ) -> CsiResult<NodeStageVolumeResponse> {
        let name =
            (req.publish_context.get(DEVICE_KEY)).ok_or_else(|| CsiError::required(DEVICE_KEY))?;
        let link = self.device_dir.join(name);
        let (storage, saves) = (self.storage.clone(), self.saves.clone());
        blocking(move || {
            while !link.exists() {
                std::thread::sleep(Duration::from_millis(1));
            }
            let device = std::fs::canonicalize(&link)?;
            let device_name = device.to_string_lossy();
            let probe = storage.start_probe(&device_name);
            let staging = req.staging_target_path.as_str();
            save(&saves, staging)?;
            let found = probe.finish().map_err(|e| failed("blkid", e))?;
            if found == DiskFormat::Unformatted {
                let formatted = storage.format(&device_name, "ext4", &[]);
                formatted.map_err(|e| failed("mkfs", e))?;
            }
            mount(
                &device,
                &req.staging_target_path,
                Some("ext4"),
                MsFlags::empty(),
            )?;
            save(&saves, staging)?;
            Ok(NodeStageVolumeResponse {})
        })
        .await
    }

    async fn node_unstage_volume(
        &self,
        _: &CallContext,
        req: NodeUnstageVolumeRequest,
    ) -> CsiResult<NodeUnstageVolumeResponse> {
        let saves = self.saves.clone();
        blocking(move || {
            unmount(&req.staging_target_path)?;
            forget(&saves, &req.staging_target_path)?;
            Ok(NodeUnstageVolumeResponse {})
        })
        .await
    }

    async fn node_publish_volume(
        &self,
        _: &CallContext,
        req: NodePublishVolumeRequest,
    ) -> CsiResult<NodePublishVolumeResponse> {
        let saves = self.saves.clone();
        blocking(move || {
            std::fs::create_dir(&req.target_path)?;
            let staging = Path::new(&req.staging_target_path);
            mount(staging, &req.target_path, None, MsFlags::MS_BIND)?;
            save(&saves, &req.target_path)?;
            Ok(NodePublishVolumeResponse {})
        })
        .await
    }

    async fn node_unpublish_volume(
        &self,
        _: &CallContext,
        req: NodeUnpublishVolumeRequest,
    ) -> CsiResult<NodeUnpublishVolumeResponse> {
        let saves = self.saves.clone();
        blocking(move || {
            unmount(&req.target_path)?;
            std::fs::remove_dir(&req.target_path)?;
            forget(&saves, &req.target_path)?;
            Ok(NodeUnpublishVolumeResponse {})
        })
        .await
    }
}

async fn run(flags: Flags) -> Result<(), String> {
    let socket = flags.statedir.join("csi.sock");
    let server = (flags.common).server(DRIVER_NAME, env!("CARGO_PKG_VERSION"), &socket)?;
    let mut caps = Capabilities::new().plugin(PluginService::ControllerService);
    let mut server = server.mode(flags.mode).services_elsewhere(true);
    if flags.mode != ServeMode::Node {
        let url = flags.provider_url.as_deref().ok_or("--provider-url")?;
        let token = std::env::var(TOKEN_ENV).map_err(|_| TOKEN_ENV)?;
        let token = Token::new(&token, TOKEN_ENV).map_err(|e| e.to_string())?;
        let provider = HttpProvider::new(url, token).map_err(|e| e.to_string())?;
        let controller = FloorController {
            provider,
            region: flags.region.clone(),
            retry: controller_config(&flags.region).retry,
        };
        use ControllerRpc::*;
        caps = caps.controller([CreateDeleteVolume, PublishUnpublishVolume]);
        server = server.controller(Arc::new(controller));
    }
    if flags.mode != ServeMode::Controller {
        caps = caps.node([NodeRpc::StageUnstageVolume]);
        let storage = SafeFormatAndMount::new(Arc::new(LinuxMounter::new()), Arc::new(SystemExec));
        let saves = match std::env::var_os("FLOOR_SAVES").is_some_and(|v| v == "1") {
            true => Some(Arc::new(
                FileStore::open(&flags.statedir).map_err(|e| e.to_string())?,
            )),
            false => None,
        };
        server = server.node(Arc::new(FloorNode {
            node_id: flags.common.node_id(),
            device_dir: flags.device_dir.clone(),
            storage: Arc::new(storage),
            saves,
        }));
    }
    let server = server.capabilities(caps).build();
    server
        .map_err(|e| e.to_string())?
        .serve()
        .await
        .map_err(|e| e.to_string())
}

fn main() -> std::process::ExitCode {
    let flags = Flags::parse();
    csi_server::init_tracing(&flags.common.log);
    // As cloud-block does: the same process set-up, so only the work differs.
    let _ = move_code_to_huge_pages();
    run_to_exit("cloud-block-floor", driver_runtime(), run(flags))
}
