//! The provider process: [`Cloud`]'s rules served over HTTP, with real
//! effects (sparse files, loop devices, by-id links) and a crash-safe state
//! file.
//!
//! Every change is made on a copy of the state, its effects are carried out,
//! and the copy is saved (write, fsync, rename) before it replaces the state
//! the API answers from. Effects come before the save when they create
//! (a crash leaves a file no record names, swept at the next start) and after
//! it when they destroy, so a restart never finds a record without its data.
//! Actions are saved `in-progress` and resumed after a restart; attachments
//! are re-made (loop devices are bound without autoclear, so they normally
//! survive the provider; after a reboot they are bound again).

mod disks;
mod faults;
mod http;

use std::collections::HashSet;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use csi_store::{FileStore, Table};
use hyper_util::rt::TokioIo;

pub use disks::{Disks, Source};
pub use faults::{FaultState, Faults, Verdict};

use crate::api::{Action, ActionKind, rfc3339};
use crate::cloud::{ApiError, Cloud, Limits};
use crate::token::Token;

/// How a provider starts.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where the state file, volumes and snapshots live.
    pub data_dir: PathBuf,
    /// Where the by-id links of attached volumes go.
    pub device_dir: PathBuf,
    /// The bearer token every API call must carry.
    pub token: Token,
    /// Regions and limits.
    pub limits: Limits,
    /// The fault mode at start.
    pub faults: Faults,
    /// Seed of the fault mode's randomness.
    pub fault_seed: u64,
}

/// Why the provider could not start or clean up.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Another provider holds the data directory.
    #[error("data directory {0} is in use by another provider")]
    Locked(PathBuf),
    /// The state file could not be read.
    #[error(transparent)]
    State(#[from] csi_store::StoreError),
    /// Files, devices or links could not be set up.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A setting is out of range.
    #[error("{0}")]
    Config(String),
}

pub(crate) struct Shared {
    cloud: Mutex<Cloud>,
    state: StateFile,
    disks: Disks,
    limits: Limits,
    token: Token,
    faults: Mutex<FaultState>,
    _lock: nix::fcntl::Flock<std::fs::File>,
}

fn now() -> String {
    rfc3339(SystemTime::now())
}

fn internal(what: &str, e: impl std::fmt::Display) -> ApiError {
    tracing::error!(error = %e, "{what}");
    ApiError::new(
        500,
        crate::api::error_id::SERVER_ERROR,
        format!("{what}: {e}"),
    )
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every change is committed whole or not at all, so a panic elsewhere
    // cannot have left the data half-changed.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn lock_dir(data_dir: &Path) -> Result<nix::fcntl::Flock<std::fs::File>, StartError> {
    let path = data_dir.join("lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
        .map_err(|_| StartError::Locked(data_dir.to_owned()))
}

impl Shared {
    /// Runs `change` on a copy of the state and saves the copy before it
    /// becomes the state; `undo` reverses the change's effects if the save fails.
    fn commit<T>(
        &self,
        change: impl FnOnce(&mut Cloud) -> Result<T, ApiError>,
        undo: impl FnOnce(&T),
    ) -> Result<T, ApiError> {
        let mut cloud = lock(&self.cloud);
        let mut next = cloud.clone();
        let out = change(&mut next)?;
        if let Err(e) = self.state.save(&next) {
            undo(&out);
            return Err(internal("saving the state", e));
        }
        *cloud = next;
        Ok(out)
    }

    /// Does an action's work (after any stuck time) and records how it ended.
    fn run_action(&self, action: &Action) {
        let fails = lock(&self.faults).action_fails();
        let id = &action.resource_id;
        let outcome = if fails {
            Err("injected action failure".to_owned())
        } else {
            let done = match action.kind {
                ActionKind::Attach => self.disks.attach(id).map(drop).inspect_err(|_| {
                    let _ = self.disks.detach(id);
                }),
                ActionKind::Detach => self.disks.detach(id),
                ActionKind::Resize => self.disks.grow(id, action.size_gigabytes.unwrap_or(0)),
            };
            done.map_err(|e| {
                tracing::error!(action = action.id, error = %e, "action failed");
                e.to_string()
            })
        };
        let ended = self.commit(
            |cloud| Ok(cloud.finish_action(action.id, outcome, &now())),
            |_| {},
        );
        match ended {
            Ok(Some(a)) => {
                tracing::info!(action = a.id, kind = ?a.kind, volume = %a.resource_id, status = ?a.status, "action ended")
            }
            Ok(None) => {}
            // Still in progress on disk: the next start resumes it.
            Err(e) => {
                tracing::error!(action = action.id, error = %e.body.message, "recording the end of an action")
            }
        }
    }
}

/// Waits `d`, and not at all when it is zero: a zero tokio sleep still
/// waits for the timer's next millisecond tick, and a provider with no
/// injected latency or stuck actions must add none.
pub(crate) async fn delay(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

/// Starts an action's work in the background.
pub(crate) fn spawn_action(shared: Arc<Shared>, action: Action) {
    let stuck = lock(&shared.faults).faults().stuck_action_secs;
    tokio::spawn(async move {
        delay(Duration::from_secs(stuck)).await;
        let _ = tokio::task::spawn_blocking(move || shared.run_action(&action)).await;
    });
}

/// A provider ready to serve.
pub struct Provider {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provider")
            .field("disks", &self.shared.disks)
            .finish_non_exhaustive()
    }
}

impl Provider {
    /// Locks the data directory, loads the state, removes what no record
    /// names and re-makes every attachment the state holds.
    pub fn open(config: Config) -> Result<Provider, StartError> {
        config.faults.validate().map_err(StartError::Config)?;
        if config.limits.regions.is_empty() {
            return Err(StartError::Config("at least one region is needed".into()));
        }
        std::fs::create_dir_all(&config.data_dir)?;
        let dir_lock = lock_dir(&config.data_dir)?;
        let state = StateFile::open(&config.data_dir)?;
        let cloud = state.load()?;
        let disks = Disks::open(&config.data_dir, &config.device_dir)?;
        let volumes: HashSet<String> = cloud.volumes().map(|v| v.id.clone()).collect();
        let snapshots: HashSet<String> = cloud.snapshots().map(|s| s.id.clone()).collect();
        let swept = disks.sweep(&volumes, &snapshots)?;
        if swept > 0 {
            tracing::info!(swept, "removed data no record names");
        }
        for volume in cloud.volumes() {
            if !disks.volume_file(&volume.id).exists() {
                tracing::warn!(volume = %volume.id, "volume file missing: made an empty one");
                disks.create_volume(&volume.id, volume.size_gigabytes, None)?;
            }
            if !volume.node_ids.is_empty() {
                let device = disks.attach(&volume.id)?;
                tracing::info!(volume = %volume.id, device = %device.display(), "attachment restored");
            } else if !cloud.running().iter().any(|a| a.resource_id == volume.id) {
                // A crash in the middle of a detach can leave a device.
                disks.detach(&volume.id)?;
            }
        }
        Ok(Provider {
            shared: Arc::new(Shared {
                cloud: Mutex::new(cloud),
                state,
                disks,
                limits: config.limits,
                token: config.token,
                faults: Mutex::new(FaultState::new(config.faults, config.fault_seed)),
                _lock: dir_lock,
            }),
        })
    }

    /// Serves the API on `listener` until `shutdown` completes. Actions
    /// that were in progress at the last stop are resumed first. Stopping
    /// detaches nothing: attachments stay, as a cloud's do.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> std::io::Result<()> {
        for action in lock(&self.shared.cloud).running() {
            tracing::info!(action = action.id, kind = ?action.kind, "resuming action");
            spawn_action(self.shared.clone(), action);
        }
        tokio::pin!(shutdown);
        loop {
            let (stream, peer) = tokio::select! {
                () = &mut shutdown => return Ok(()),
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        continue;
                    }
                },
            };
            let shared = self.shared.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req| http::handle(shared.clone(), req));
                if let Err(e) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    tracing::debug!(%peer, error = %e, "connection ended");
                }
            });
        }
    }
}

/// What [`cleanup`] removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Cleanup {
    /// Volumes whose device and link were removed.
    pub detached: usize,
}

/// Detaches every volume of the provider whose data is in `data_dir` (loop
/// devices and by-id links in `device_dir`) and records them as detached, so
/// nothing of it remains on the machine but files. For tests and for
/// decommissioning; the provider must not be running.
pub fn cleanup(data_dir: &Path, device_dir: &Path) -> Result<Cleanup, StartError> {
    let _dir_lock = lock_dir(data_dir)?;
    let state = StateFile::open(data_dir)?;
    let mut cloud = state.load()?;
    let disks = Disks::open(data_dir, device_dir)?;
    let mut ids: HashSet<String> = cloud.volumes().map(|v| v.id.clone()).collect();
    ids.extend(disks.volume_ids()?);
    for id in &ids {
        disks.detach(id)?;
    }
    cloud.clear_attachments(&now());
    state.save(&cloud)?;
    Ok(Cleanup {
        detached: ids.len(),
    })
}

/// The whole cloud as one crash-safe record in csi-store (`<data>/state`):
/// a save replaces it atomically, so a crash keeps the last saved cloud.
struct StateFile {
    table: Table<Cloud>,
    _store: FileStore,
}

impl StateFile {
    const KEY: &'static str = "cloud";

    fn open(data_dir: &Path) -> Result<StateFile, StartError> {
        let store = FileStore::open(data_dir.join("state"))?;
        let table = Table::new(&store, "cloud")?;
        Ok(StateFile {
            table,
            _store: store,
        })
    }

    fn load(&self) -> Result<Cloud, csi_store::StoreError> {
        Ok(self.table.get(Self::KEY)?.unwrap_or_default())
    }

    fn save(&self, cloud: &Cloud) -> Result<(), csi_store::StoreError> {
        self.table.put(Self::KEY, cloud)
    }
}
