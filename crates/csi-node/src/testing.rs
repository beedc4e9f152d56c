//! A fake node for drivers' unit tests, runnable without root:
//! [`FakeHost`], mount-utils' `FakeMounter` with `/` mounted (so a bind of
//! any directory shows in mountinfo as it would on Linux: the root
//! filesystem's device and the directory as root) and its
//! `FakeLoopDevices` (devices `7:N`, which `FakeMounter` shows for a
//! filesystem mounted from `/dev/loopN`).
//!
//! ```
//! use csi_node::testing::FakeHost;
//! use mount_utils::{LoopDevices, LoopOptions, Mounter};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let image = dir.path().join("disk.img");
//! std::fs::write(&image, b"").unwrap();
//! let host = FakeHost::new();
//! let dev = host.loops().attach(&image, &LoopOptions::default()).unwrap().keep();
//! host.mount(&dev.path.to_string_lossy(), &dir.path().join("mnt"), "ext4", &[]).unwrap();
//! let entry = host.mount_points().unwrap().pop().unwrap();
//! assert_eq!((entry.major, entry.minor), (dev.device.major, dev.device.minor));
//! ```

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use std::time::Duration;

use mount_utils::{
    DeviceNumber, FakeBlockDevices, FakeLoopAction, FakeLoopDevices, FakeMounter, FsUsage,
    MountArgs, MountError, MountInfo, MountSource, Mounter,
};

use crate::observe::normalize;

/// A fake node: a [`FakeMounter`] with `/` mounted and [`FakeLoopDevices`].
/// Derefs to the mounter; [`mounter`](Self::mounter) and
/// [`loops`](Self::loops) hand them to the code under test.
#[derive(Debug, Clone)]
pub struct FakeHost {
    mounter: Arc<FakeMounter>,
    loops: Arc<FakeLoopDevices>,
    devices: Arc<FakeBlockDevices>,
}

impl Default for FakeHost {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeHost {
    /// A host with only `/` mounted and no loop devices.
    pub fn new() -> Self {
        let mounter = FakeMounter::new();
        mounter.add_mount("/dev/root", "/", "ext4");
        Self {
            mounter: Arc::new(mounter),
            loops: Arc::new(FakeLoopDevices::new()),
            devices: Arc::new(FakeBlockDevices::new()),
        }
    }

    /// The attached block devices (none until [`attach_device`](Self::attach_device)).
    pub fn block_devices(&self) -> Arc<FakeBlockDevices> {
        self.devices.clone()
    }

    /// A device the controller attached: `path` (e.g. a by-id name) shows
    /// `device` of `size` bytes once `delay` of the fake's virtual time has
    /// passed, and a filesystem mounted from it shows that number.
    pub fn attach_device(&self, path: &Path, device: DeviceNumber, size: u64, delay: Duration) {
        self.mounter.add_block_device(path, device);
        self.devices.add_after(path, device, size, delay);
    }

    /// The mounter, for the code under test.
    pub fn mounter(&self) -> Arc<dyn Mounter> {
        self.mounter.clone()
    }

    /// The underlying fake, for its action log and error injection.
    pub fn fake(&self) -> &FakeMounter {
        &self.mounter
    }

    /// The loop devices.
    pub fn loops(&self) -> Arc<FakeLoopDevices> {
        self.loops.clone()
    }

    /// How many loop devices are attached.
    pub fn attached(&self) -> usize {
        self.loops.attached().len()
    }

    /// The loop devices detached so far, oldest first.
    pub fn detached(&self) -> Vec<PathBuf> {
        self.loops
            .actions()
            .into_iter()
            .filter_map(|a| match a {
                FakeLoopAction::Detach { device } => Some(device),
                _ => None,
            })
            .collect()
    }

    /// Mount points other than `/`.
    pub fn mounted(&self) -> Vec<PathBuf> {
        self.mount_points()
            .unwrap_or_default()
            .into_iter()
            .map(|m| m.mount_point)
            .filter(|p| p != Path::new("/"))
            .collect()
    }

    /// The mounts at `path`, bottom first.
    pub fn mounts_at(&self, path: &Path) -> Vec<MountInfo> {
        let path = normalize(path);
        self.mount_points()
            .unwrap_or_default()
            .into_iter()
            .filter(|m| m.mount_point == path)
            .collect()
    }
}

impl Deref for FakeHost {
    type Target = FakeMounter;

    fn deref(&self) -> &FakeMounter {
        &self.mounter
    }
}

/// A mounter that counts the whole-table reads made through it
/// ([`Mounter::mount_points`] and [`Mounter::mount_refs`]) and passes
/// every call on to the one it wraps. The questions about one path
/// (`mounts_at`, `containing_mount`) go to the wrapped mounter uncounted,
/// as Linux answers them with `statmount(2)` without reading the table,
/// unless it is made [`without_statmount`](Self::without_statmount): a
/// test asserts how often code under test reads the whole table.
#[derive(Debug)]
pub struct FakeCountingMounter<M: ?Sized = dyn Mounter> {
    table_reads: AtomicUsize,
    statmount: bool,
    inner: Arc<M>,
}

impl<M: Mounter + ?Sized> FakeCountingMounter<M> {
    /// Counts the whole-table reads made through it of `inner`.
    pub fn new(inner: Arc<M>) -> Self {
        Self {
            table_reads: AtomicUsize::new(0),
            statmount: true,
            inner,
        }
    }

    /// As Linux before 6.8, without `statmount(2)`: each question about
    /// one path reads the whole table, and counts as such a read.
    pub fn without_statmount(inner: Arc<M>) -> Self {
        Self {
            statmount: false,
            ..Self::new(inner)
        }
    }

    /// The whole-table reads made through it so far.
    pub fn table_reads(&self) -> usize {
        self.table_reads.load(Ordering::SeqCst)
    }

    fn counted(&self) {
        self.table_reads.fetch_add(1, Ordering::SeqCst);
    }
}

impl<M: Mounter + ?Sized> Mounter for FakeCountingMounter<M> {
    fn mount_with(&self, args: &MountArgs<'_>) -> Result<(), MountError> {
        self.inner.mount_with(args)
    }
    fn bind_mount(&self, source: &Path, target: &Path, read_only: bool) -> Result<(), MountError> {
        self.inner.bind_mount(source, target, read_only)
    }
    fn remount(&self, target: &Path, options: &[&str]) -> Result<(), MountError> {
        self.inner.remount(target, options)
    }
    fn unmount(&self, target: &Path, lazy: bool) -> Result<(), MountError> {
        self.inner.unmount(target, lazy)
    }
    fn move_mount(&self, from: &Path, to: &Path) -> Result<(), MountError> {
        self.inner.move_mount(from, to)
    }
    fn mount_points(&self) -> Result<Vec<MountInfo>, MountError> {
        self.counted();
        self.inner.mount_points()
    }
    fn mount_points_where(
        &self,
        keep: &dyn Fn(u32, DeviceNumber) -> bool,
    ) -> Result<Vec<MountInfo>, MountError> {
        self.counted();
        self.inner.mount_points_where(keep)
    }
    fn path_queries_read_whole_table(&self) -> bool {
        !self.statmount
    }
    fn mounts_at(&self, path: &Path) -> Result<Vec<MountInfo>, MountError> {
        if !self.statmount {
            self.counted();
        }
        self.inner.mounts_at(path)
    }
    fn containing_mount(&self, path: &Path) -> Result<Option<MountInfo>, MountError> {
        if !self.statmount {
            self.counted();
        }
        self.inner.containing_mount(path)
    }
    fn mounted_at(&self, path: &Path) -> Result<Option<MountInfo>, MountError> {
        self.inner.mounted_at(path)
    }
    fn block_device_at(&self, path: &Path) -> Result<Option<DeviceNumber>, MountError> {
        self.inner.block_device_at(path)
    }
    fn bind_source(&self, source: &Path) -> Result<MountSource, MountError> {
        self.inner.bind_source(source)
    }
    fn is_mount_point(&self, path: &Path) -> Result<bool, MountError> {
        self.inner.is_mount_point(path)
    }
    fn is_likely_not_mount_point(&self, path: &Path) -> Result<bool, MountError> {
        self.inner.is_likely_not_mount_point(path)
    }
    fn mount_refs(&self, path: &Path) -> Result<Vec<PathBuf>, MountError> {
        self.counted();
        self.inner.mount_refs(path)
    }
    fn cleanup_mount_point(&self, path: &Path) -> Result<(), MountError> {
        self.inner.cleanup_mount_point(path)
    }
    fn remove_mount_point(&self, path: &Path) -> Result<(), MountError> {
        self.inner.remove_mount_point(path)
    }
    fn fs_usage(&self, path: &Path) -> Result<FsUsage, MountError> {
        self.inner.fs_usage(path)
    }
}

/// Node requests for unit tests, filled as the CO would.
pub mod requests {
    use std::path::Path;
    use std::sync::{Arc, Mutex};

    use csi_proto::v1::volume_capability::access_mode::Mode;
    use csi_proto::v1::*;

    /// A block or mount capability with `mode` (and mount `flags`).
    pub fn cap(block: bool, mode: Mode, flags: &[&str]) -> VolumeCapability {
        let cap = if block {
            VolumeCapability::block()
        } else {
            VolumeCapability::mount("").with_mount_flags(flags.iter().copied())
        };
        cap.with_access_mode(mode)
    }

    /// NodeStageVolume of `id` at `staging`.
    pub fn stage_req(id: &str, staging: &Path, cap: VolumeCapability) -> NodeStageVolumeRequest {
        NodeStageVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.to_string_lossy().into(),
            volume_capability: Some(cap),
            ..Default::default()
        }
    }

    /// NodePublishVolume of `id` from `staging` (empty: none) at `target`.
    pub fn publish_req(
        id: &str,
        staging: &Path,
        target: &Path,
        cap: VolumeCapability,
    ) -> NodePublishVolumeRequest {
        NodePublishVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.to_string_lossy().into(),
            target_path: target.to_string_lossy().into(),
            volume_capability: Some(cap),
            ..Default::default()
        }
    }

    /// NodeUnpublishVolume of `id` at `target`.
    pub fn unpublish_req(id: &str, target: &Path) -> NodeUnpublishVolumeRequest {
        NodeUnpublishVolumeRequest {
            volume_id: id.into(),
            target_path: target.to_string_lossy().into(),
        }
    }

    /// NodeUnstageVolume of `id` at `staging`.
    pub fn unstage_req(id: &str, staging: &Path) -> NodeUnstageVolumeRequest {
        NodeUnstageVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.to_string_lossy().into(),
        }
    }

    /// NodeGetVolumeStats of `id` at `path`.
    pub fn stats_req(id: &str, path: &Path) -> NodeGetVolumeStatsRequest {
        NodeGetVolumeStatsRequest {
            volume_id: id.into(),
            volume_path: path.to_string_lossy().into(),
            ..Default::default()
        }
    }

    /// A subscriber that writes every event at every level, without
    /// colours, to the returned buffer (for `tracing::subscriber::with_default`).
    pub fn log_capture() -> (Arc<Mutex<Vec<u8>>>, impl tracing::Subscriber + Send + Sync) {
        #[derive(Clone)]
        struct Buffer(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buffer {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                let mut b = self.0.lock().unwrap_or_else(|e| e.into_inner());
                b.extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer(Arc::new(Mutex::new(Vec::new())));
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        (buffer.0, subscriber)
    }

    /// Sends every event of this process, at every level, to the returned
    /// buffer. Once per test binary: it is the global subscriber, so the
    /// blocking pool's threads are captured too.
    pub fn capture_all_logs() -> Arc<Mutex<Vec<u8>>> {
        let (buffer, subscriber) = log_capture();
        tracing::subscriber::set_global_default(subscriber).expect("one capture per binary");
        buffer
    }
}
