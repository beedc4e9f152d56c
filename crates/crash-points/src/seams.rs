//! The seams' real implementations, each effect a numbered step; queries
//! (mountinfo, stat, reads, loop device lookups) pass through uncounted.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use csi_store::{DirEntry, FileMeta, FileSystem, FsFile, OpenMode};
use mount_utils::{
    AttachedLoop, DeviceNumber, Exec, ExecError, ExecOutput, FsUsage, LoopDeviceInfo, LoopDevices,
    LoopError, LoopOptions, MountArgs, MountError, MountInfo, MountSource, Mounter,
};

use crate::hook::{armed, effect};

/// `inner`, each mount, unmount and mount point removal a step when the
/// hook is [`armed`]; otherwise `inner` itself.
pub fn mounter(inner: Arc<dyn Mounter>) -> Arc<dyn Mounter> {
    match armed() {
        true => Arc::new(CountedMounter(inner)),
        false => inner,
    }
}

/// `inner`, each attach, detach (a dropped handle's included) and
/// capacity refresh a step when the hook is [`armed`]; otherwise `inner`.
pub fn loop_devices(inner: Arc<dyn LoopDevices>) -> Arc<dyn LoopDevices> {
    match armed() {
        true => Arc::new(CountedLoops(inner)),
        false => inner,
    }
}

/// `inner`, each command run a step (traced with the program's name) when
/// the hook is [`armed`]; otherwise `inner`.
pub fn exec(inner: Arc<dyn Exec>) -> Arc<dyn Exec> {
    match armed() {
        true => Arc::new(CountedExec(inner)),
        false => inner,
    }
}

/// `inner`, each file created, written, truncated or synced, directory
/// made, rename and unlink a step when the hook is [`armed`]; otherwise
/// `inner`. Give it to csi-store's `FileStore::open_on`.
pub fn file_system(inner: Arc<dyn FileSystem>) -> Arc<dyn FileSystem> {
    match armed() {
        true => Arc::new(CountedFs(inner)),
        false => inner,
    }
}

struct CountedMounter(Arc<dyn Mounter>);

impl Mounter for CountedMounter {
    fn mount_with(&self, args: &MountArgs<'_>) -> Result<(), MountError> {
        effect("mount", || self.0.mount_with(args))
    }

    fn bind_mount(&self, source: &Path, target: &Path, read_only: bool) -> Result<(), MountError> {
        effect("bind-mount", || {
            self.0.bind_mount(source, target, read_only)
        })
    }

    fn remount(&self, target: &Path, options: &[&str]) -> Result<(), MountError> {
        effect("remount", || self.0.remount(target, options))
    }

    fn unmount(&self, target: &Path, lazy: bool) -> Result<(), MountError> {
        effect("unmount", || self.0.unmount(target, lazy))
    }

    fn move_mount(&self, from: &Path, to: &Path) -> Result<(), MountError> {
        effect("move-mount", || self.0.move_mount(from, to))
    }

    fn cleanup_mount_point(&self, path: &Path) -> Result<(), MountError> {
        effect("cleanup-mount-point", || self.0.cleanup_mount_point(path))
    }

    fn remove_mount_point(&self, path: &Path) -> Result<(), MountError> {
        effect("remove-mount-point", || self.0.remove_mount_point(path))
    }

    fn mount_points(&self) -> Result<Vec<MountInfo>, MountError> {
        self.0.mount_points()
    }

    fn mount_points_where(
        &self,
        keep: &dyn Fn(u32, DeviceNumber) -> bool,
    ) -> Result<Vec<MountInfo>, MountError> {
        self.0.mount_points_where(keep)
    }

    fn path_queries_read_whole_table(&self) -> bool {
        self.0.path_queries_read_whole_table()
    }

    fn mounts_at(&self, path: &Path) -> Result<Vec<MountInfo>, MountError> {
        self.0.mounts_at(path)
    }

    fn containing_mount(&self, path: &Path) -> Result<Option<MountInfo>, MountError> {
        self.0.containing_mount(path)
    }

    fn mounted_at(&self, path: &Path) -> Result<Option<MountInfo>, MountError> {
        self.0.mounted_at(path)
    }

    fn block_device_at(&self, path: &Path) -> Result<Option<DeviceNumber>, MountError> {
        self.0.block_device_at(path)
    }

    fn bind_source(&self, source: &Path) -> Result<MountSource, MountError> {
        self.0.bind_source(source)
    }

    fn is_mount_point(&self, path: &Path) -> Result<bool, MountError> {
        self.0.is_mount_point(path)
    }

    fn is_likely_not_mount_point(&self, path: &Path) -> Result<bool, MountError> {
        self.0.is_likely_not_mount_point(path)
    }

    fn mount_refs(&self, path: &Path) -> Result<Vec<PathBuf>, MountError> {
        self.0.mount_refs(path)
    }

    fn fs_usage(&self, path: &Path) -> Result<FsUsage, MountError> {
        self.0.fs_usage(path)
    }
}

struct CountedLoops(Arc<dyn LoopDevices>);

impl LoopDevices for CountedLoops {
    fn attach(
        &self,
        backing_file: &Path,
        options: &LoopOptions,
    ) -> Result<AttachedLoop, LoopError> {
        let attached = effect("loop-attach", || self.0.attach(backing_file, options))?;
        // The inner handle keeps the device open until it is kept or
        // detached; only its detach is an effect.
        let info: LoopDeviceInfo = attached.info().clone();
        Ok(AttachedLoop::new(info, move |detach| match detach {
            true => effect("loop-detach", || attached.detach()),
            false => {
                attached.keep();
                Ok(())
            }
        }))
    }

    fn find_by_backing_file(&self, backing_file: &Path) -> Result<Vec<PathBuf>, LoopError> {
        self.0.find_by_backing_file(backing_file)
    }

    fn attached(&self) -> Result<Vec<LoopDeviceInfo>, LoopError> {
        self.0.attached()
    }

    fn info(&self, device: &Path) -> Result<Option<LoopDeviceInfo>, LoopError> {
        self.0.info(device)
    }

    fn set_capacity(&self, device: &Path) -> Result<u64, LoopError> {
        effect("loop-set-capacity", || self.0.set_capacity(device))
    }

    fn detach(&self, device: &Path) -> Result<(), LoopError> {
        effect("loop-detach", || self.0.detach(device))
    }
}

struct CountedExec(Arc<dyn Exec>);

impl Exec for CountedExec {
    fn run(&self, program: &str, args: &[&str]) -> Result<ExecOutput, ExecError> {
        // The program's name only: its arguments may carry anything.
        let name = Path::new(program).file_name().unwrap_or_default();
        let kind = format!("exec {}", name.to_string_lossy());
        effect(&kind, || self.0.run(program, args))
    }
}

struct CountedFs(Arc<dyn FileSystem>);

impl fmt::Debug for CountedFs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("CountedFs").field(&self.0).finish()
    }
}

impl FileSystem for CountedFs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn FsFile>> {
        let kind = match mode {
            OpenMode::CreateNew | OpenMode::CreateKeep => Some("create"),
            OpenMode::CreateTruncate => Some("create-truncate"),
            OpenMode::Read | OpenMode::Write | OpenMode::ReadWrite | OpenMode::Directory => None,
        };
        let file = match kind {
            Some(kind) => effect(kind, || self.0.open(path, mode))?,
            None => self.0.open(path, mode)?,
        };
        Ok(Box::new(CountedFile(file)))
    }

    fn create_dir(&self, path: &Path) -> io::Result<()> {
        effect("mkdir", || self.0.create_dir(path))
    }

    fn is_dir(&self, path: &Path) -> bool {
        self.0.is_dir(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        effect("rename", || self.0.rename(from, to))
    }

    fn exchange(&self, from: &Path, to: &Path) -> io::Result<()> {
        effect("exchange", || self.0.exchange(from, to))
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        effect("unlink", || self.0.remove_file(path))
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<DirEntry>> {
        self.0.read_dir(path)
    }

    fn in_memory(&self, dir: &Path) -> bool {
        self.0.in_memory(dir)
    }
}

#[derive(Debug)]
struct CountedFile(Box<dyn FsFile>);

impl FsFile for CountedFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.read_exact_at(buf, offset)
    }

    fn read_to_end(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        self.0.read_to_end(buf)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        effect("write", || self.0.write_all_at(buf, offset))
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        effect("set-len", || self.0.set_len(len))
    }

    fn sync_data(&self) -> io::Result<()> {
        effect("fdatasync", || self.0.sync_data())
    }

    fn sync_all(&self) -> io::Result<()> {
        effect("fsync", || self.0.sync_all())
    }

    fn metadata(&self) -> io::Result<FileMeta> {
        self.0.metadata()
    }

    fn try_lock_exclusive(&self) -> io::Result<bool> {
        self.0.try_lock_exclusive()
    }

    fn sync_filesystem(&self) -> io::Result<()> {
        effect("syncfs", || self.0.sync_filesystem())
    }
}
