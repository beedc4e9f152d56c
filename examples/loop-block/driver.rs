//! The driver value shared by every service, and startup reconciliation.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use csi_server::{CsiError, CsiResult};
use mount_utils::{
    Exec, LoopDevice, LoopOptions, Mounter, ResizeFs, SafeFormatAndMount, Sensitive, SystemExec,
};

use crate::backend::Backend;
use crate::common::state::{InFlight, open_state, remove_path};
use crate::common::{IdKind, bind_publish, internal};
use crate::config::Config;
use crate::store::{StagedRecord, Store, VolumeRecord};
use crate::tuning::Tuning;

/// The loop-block driver: cheap to clone (everything shared is behind `Arc`).
#[derive(Clone)]
pub struct LoopBlock {
    pub config: Arc<Config>,
    pub node_id: String,
    pub store: Arc<Store>,
    pub backend: Backend,
    pub mounter: Arc<dyn Mounter>,
    pub formatter: SafeFormatAndMount,
    pub resizer: ResizeFs,
    /// Whether the backing files' filesystem takes O_DIRECT (the
    /// `directIO` mutable parameter needs it).
    pub direct_io_supported: bool,
    /// Held shared by NodeStage/NodeUnstage and exclusively while a group
    /// snapshot is cut or a modification is applied, so neither sees a disk
    /// half attached.
    pub attachments: Arc<tokio::sync::RwLock<()>>,
    /// Disks, snapshots and names with work running on them.
    pub in_flight: Arc<InFlight>,
}

impl LoopBlock {
    /// Opens (or creates) the state directory and locks it for the life of
    /// the process: a second instance on it gets an error naming the first.
    pub fn open(config: Config, mounter: Arc<dyn Mounter>) -> Result<Self, String> {
        let files = open_state(&config.statedir, || {})?;
        let backend = Backend::new(&config.statedir)
            .map_err(|e| format!("preparing {}: {e}", config.statedir.display()))?;
        let store = crate::store::open(&files)?;
        let exec: Arc<dyn Exec> = Arc::new(SystemExec::new());
        let direct_io_supported = crate::tuning::direct_io_supported(&backend.volumes_dir());
        Ok(Self {
            direct_io_supported,
            attachments: Arc::new(tokio::sync::RwLock::new(())),
            in_flight: InFlight::new(),
            node_id: config.node_id(),
            config: Arc::new(config),
            store: Arc::new(store),
            backend,
            // mkfs is I/O heavy: a burst of first-time stages formats two at a time.
            formatter: SafeFormatAndMount::new(mounter.clone(), exec.clone())
                .with_max_concurrent_formats(2),
            resizer: ResizeFs::new(exec),
            mounter,
        })
    }

    /// The record of a volume, or NOT_FOUND (ids this driver could not have
    /// generated never reach the filesystem).
    pub fn known_volume(&self, id: &str) -> CsiResult<VolumeRecord> {
        if !IdKind::Volume.is_valid(id) {
            return Err(CsiError::NotFound(format!("volume {id:?} does not exist")));
        }
        self.store
            .volumes
            .get(id)
            .ok_or_else(|| CsiError::NotFound(format!("volume {id} does not exist")))
    }

    /// The loop device of `image`: the one already attached (a retry after a
    /// crash, or a restart) or a new one, with the disk's `tuning` applied.
    /// With a filesystem on top autoclear is safe (the mount holds the
    /// device); a raw block device is only bind-mounted, which does not hold
    /// it, so it is attached without autoclear and detached by NodeUnstage.
    pub fn attach(
        &self,
        image: &Path,
        autoclear: bool,
        tuning: Tuning,
    ) -> CsiResult<(LoopDevice, bool)> {
        let existing = mount_utils::loopdev::find_by_backing_file(image)
            .map_err(|e| CsiError::Internal(format!("looking up loop devices: {e}")))?;
        if let Some(dev) = existing.into_iter().next() {
            let dev = LoopDevice::open(&dev).map_err(|e| internal("opening", &dev, e))?;
            tuning.apply(dev.path())?;
            return Ok((dev, false));
        }
        let opts = LoopOptions {
            autoclear,
            ..LoopOptions::default()
        };
        let dev = LoopDevice::attach(image, &opts).map_err(|e| internal("attaching", image, e))?;
        // On error the new handle drops and detaches the device.
        tuning.apply(dev.path())?;
        Ok((dev, true))
    }

    /// The mutable parameters of volume `id` (the defaults if it is gone).
    pub fn tuning_of(&self, id: &str) -> Tuning {
        self.store
            .volumes
            .get(id)
            .map(|v| v.tuning)
            .unwrap_or_default()
    }

    /// Mounts the filesystem of a staged volume's device at its staging path.
    pub fn mount_staged(
        &self,
        device: &Path,
        staging: &Path,
        fs_type: &str,
        readonly: bool,
        flags: &[&str],
    ) -> CsiResult<()> {
        let mut options: Vec<&str> = flags.to_vec();
        if readonly {
            options.push("ro");
        }
        let no_secrets: &[Sensitive] = &[];
        self.formatter
            .format_and_mount_sensitive(
                &device.to_string_lossy(),
                staging,
                fs_type,
                &options,
                no_secrets,
                &[],
            )
            .map_err(|e| crate::node::format_error(device, e))
    }

    /// Startup reconciliation, before serving: staged volumes get their loop
    /// device back (lost on reboot) and their staging and target mounts
    /// remounted when gone; group snapshots a crash left half saved or half
    /// removed are finished; backing files and snapshot copies no record
    /// owns (unacknowledged creates, half-done deletes) are removed, each
    /// logged, except those of records set aside as unreadable.
    pub fn reconcile_on_start(&self) -> CsiResult<()> {
        let staged = self.store.staged.read(|all| all.clone());
        self.thaw_after_crash(&staged);
        for (id, record) in staged {
            let device = self.restore_staged(&id, &record)?;
            if device != record.loop_device {
                tracing::info!(volume = %id, device = %device.display(), "re-attached loop device of a staged volume");
                self.store.staged.update(&id, |r| {
                    if let Some(r) = r {
                        r.loop_device = device.clone();
                    }
                    Ok::<_, CsiError>(())
                })?;
            }
        }
        self.restore_published()?;
        let cut = crate::common::settle_groups(
            &self.store.groups,
            &self.store.snapshots,
            |s| s.group_snapshot_id.as_deref(),
            &self.store.quarantined_snapshots,
        )?;
        for snap in cut {
            self.backend.delete_snapshot(&snap.id)?;
        }
        self.sweep()
    }

    /// Removes data with no record (see [`Self::reconcile_on_start`]).
    fn sweep(&self) -> CsiResult<()> {
        let (disks, snapshots, foreign) = self.backend.data();
        let unowned = disks
            .into_iter()
            .filter(|(id, _)| {
                !self.store.volumes.contains(id) && !self.store.quarantined_volumes.contains(id)
            })
            .chain(snapshots.into_iter().filter(|(id, _)| {
                !self.store.snapshots.contains(id) && !self.store.quarantined_snapshots.contains(id)
            }));
        for (_, path) in unowned {
            tracing::warn!(path = %path.display(), "data with no record (left by a crash); removing it");
            remove_path(&path).map_err(|e| internal("removing", &path, e))?;
        }
        for path in foreign {
            tracing::warn!(path = %path.display(), "not this driver's data; not touched");
        }
        Ok(())
    }

    /// A crash during a group snapshot can leave members frozen, and every
    /// writer in their pods blocked: thaw them before anything else.
    fn thaw_after_crash(&self, staged: &std::collections::BTreeMap<String, StagedRecord>) {
        for (id, record) in staged.iter().filter(|(_, r)| r.fs_type.is_some()) {
            if !self
                .mounter
                .is_mount_point(&record.staging_path)
                .unwrap_or(false)
            {
                continue;
            }
            match mount_utils::freeze::thaw(&record.staging_path) {
                Ok(true) => {
                    tracing::warn!(volume = %id, "thawed a filesystem left frozen by a crash")
                }
                Ok(false) => {}
                Err(e) => tracing::error!(volume = %id, error = %e, "thawing after a crash"),
            }
        }
    }

    fn restore_staged(&self, id: &str, record: &StagedRecord) -> CsiResult<PathBuf> {
        let image = self.backend.volume_path(id);
        let tuning = self.tuning_of(id);
        let Some(fs_type) = &record.fs_type else {
            return Ok(self.attach(&image, false, tuning)?.0.keep());
        };
        let mounted = self
            .mounter
            .is_mount_point(&record.staging_path)
            .map_err(|e| internal("inspecting", &record.staging_path, e))?;
        if mounted {
            let (dev, _) = self.attach(&image, true, tuning)?;
            return Ok(dev.keep());
        }
        std::fs::create_dir_all(&record.staging_path)
            .map_err(|e| internal("creating", &record.staging_path, e))?;
        let (dev, _) = self.attach(&image, true, tuning)?;
        let cap = crate::node::decode_capability(&record.capability)?;
        let flags = crate::node::mount_flags(&cap);
        self.mount_staged(
            dev.path(),
            &record.staging_path,
            fs_type,
            record.readonly,
            &flags,
        )?;
        tracing::info!(volume = %id, "remounted the staging path of a staged volume");
        Ok(dev.keep())
    }

    /// Re-binds publications whose mount is gone (after a reboot the CO
    /// sees them as published and would not call NodePublish again).
    fn restore_published(&self) -> CsiResult<()> {
        let published = self.store.published.read(|all| all.clone());
        for (target, record) in published {
            let target = PathBuf::from(target);
            let still = self.mounter.is_mount_point(&target).unwrap_or(false);
            let staged = self.store.staged.get(&record.volume_id);
            let Some(staged) = staged.filter(|_| !still) else {
                continue;
            };
            let req = crate::node::decode_publish(&record.request)?;
            let cap = req.volume_capability.clone().unwrap_or_default();
            let block = staged.fs_type.is_none();
            let source = if block {
                staged.loop_device
            } else {
                staged.staging_path
            };
            let flags = crate::node::mount_flags(&cap);
            bind_publish(
                &self.mounter,
                &source,
                &target,
                block,
                record.readonly,
                &flags,
            )?;
            tracing::info!(volume = %record.volume_id, target = %target.display(), "re-published after restart");
        }
        Ok(())
    }
}

impl csi_server::Identity for LoopBlock {}
