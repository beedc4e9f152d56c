//! The provider's data on this machine: a sparse file per volume and per
//! snapshot, and for each attached volume a loop device plus a stable by-id
//! link to it in the device directory.
//!
//! Every effect can be repeated: attaching finds a device already bound to
//! the volume's file before binding a new one, detaching removes whatever it
//! finds. That is what lets a restart finish work a crash interrupted, and
//! lets `--cleanup` find everything again from the files alone.

use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mount_utils::{LinuxLoopDevices, LoopDevices, LoopOptions};

use crate::api::{GIB, device_link_name};
use crate::cloud::is_provider_id;

/// What a new volume's data is copied from.
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    /// A snapshot's file.
    Snapshot(&'a str),
    /// Another volume's file (a clone).
    Volume(&'a str),
}

/// Files, loop devices and links of one provider.
#[derive(Clone)]
pub struct Disks {
    data_dir: PathBuf,
    device_dir: PathBuf,
    loops: Arc<dyn LoopDevices>,
}

impl std::fmt::Debug for Disks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Disks")
            .field("data_dir", &self.data_dir)
            .field("device_dir", &self.device_dir)
            .finish_non_exhaustive()
    }
}

fn context(what: &str, path: &Path) -> impl FnOnce(io::Error) -> io::Error {
    let what = format!("{what} {}", path.display());
    move |e| io::Error::new(e.kind(), format!("{what}: {e}"))
}

impl Disks {
    /// Disks under `data_dir` (volumes/ and snapshots/ are made if missing)
    /// with links in `device_dir`, on the kernel's loop devices.
    pub fn open(data_dir: &Path, device_dir: &Path) -> io::Result<Self> {
        for sub in ["volumes", "snapshots"] {
            let dir = data_dir.join(sub);
            std::fs::create_dir_all(&dir).map_err(context("creating", &dir))?;
        }
        std::fs::create_dir_all(device_dir).map_err(context("creating", device_dir))?;
        Ok(Disks {
            // Absolute, so the loop devices' backing files compare equal later.
            data_dir: std::fs::canonicalize(data_dir).map_err(context("resolving", data_dir))?,
            device_dir: device_dir.to_owned(),
            loops: Arc::new(LinuxLoopDevices::new()),
        })
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// A volume's file. `id` must be a provider id (checked by the caller's lookup).
    pub fn volume_file(&self, id: &str) -> PathBuf {
        debug_assert!(is_provider_id(id));
        self.data_dir.join("volumes").join(format!("{id}.img"))
    }

    fn snapshot_file(&self, id: &str) -> PathBuf {
        debug_assert!(is_provider_id(id));
        self.data_dir.join("snapshots").join(format!("{id}.img"))
    }

    /// The by-id link of an attached volume.
    pub fn link(&self, volume_id: &str) -> PathBuf {
        self.device_dir.join(device_link_name(volume_id))
    }

    /// Makes a volume's file: sparse, or a copy of a snapshot's or another
    /// volume's file grown to size.
    pub fn create_volume(&self, id: &str, gib: u64, from: Option<Source<'_>>) -> io::Result<()> {
        let file = self.volume_file(id);
        if let Some(from) = from {
            let from = match from {
                Source::Snapshot(snap) => self.snapshot_file(snap),
                Source::Volume(volume) => self.volume_file(volume),
            };
            tree_copy::copy_file(&from, &file).map_err(io::Error::other)?;
            let f = std::fs::OpenOptions::new().write(true).open(&file)?;
            return f.set_len(gib * GIB).map_err(context("sizing", &file));
        }
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&file)
            .map_err(context("creating", &file))?;
        f.set_len(gib * GIB).map_err(context("sizing", &file))
    }

    /// Removes a volume's file (absent is fine).
    pub fn remove_volume(&self, id: &str) -> io::Result<()> {
        remove_file(&self.volume_file(id))
    }

    /// Copies a volume's file to a snapshot's (holes stay holes).
    pub fn create_snapshot(&self, volume_id: &str, id: &str) -> io::Result<()> {
        tree_copy::copy_file(&self.volume_file(volume_id), &self.snapshot_file(id))
            .map(drop)
            .map_err(io::Error::other)
    }

    /// Removes a snapshot's file (absent is fine).
    pub fn remove_snapshot(&self, id: &str) -> io::Result<()> {
        remove_file(&self.snapshot_file(id))
    }

    /// Grows a volume's file and tells its loop devices.
    pub fn grow(&self, id: &str, gib: u64) -> io::Result<()> {
        let file = self.volume_file(id);
        let f = std::fs::OpenOptions::new().write(true).open(&file)?;
        if f.metadata()?.len() < gib * GIB {
            f.set_len(gib * GIB).map_err(context("growing", &file))?;
        }
        for device in self.devices_of(id)? {
            self.loops
                .set_capacity(&device)
                .map_err(|e| io::Error::other(e.to_string()))?;
        }
        Ok(())
    }

    fn devices_of(&self, id: &str) -> io::Result<Vec<PathBuf>> {
        self.loops
            .find_by_backing_file(&self.volume_file(id))
            .map_err(|e| io::Error::other(e.to_string()))
    }

    /// Binds the volume's file to a loop device (unless one already is) and
    /// points its by-id link at it. Returns the device.
    pub fn attach(&self, id: &str) -> io::Result<PathBuf> {
        let file = self.volume_file(id);
        let device = match self.devices_of(id)?.into_iter().next() {
            Some(device) => device,
            None => {
                // No autoclear: the attachment outlives this process, like a
                // cloud disk outlives its API server.
                let options = LoopOptions {
                    autoclear: false,
                    ..LoopOptions::default()
                };
                self.loops
                    .attach(&file, &options)
                    .map_err(|e| io::Error::other(e.to_string()))?
                    .keep()
                    .path
            }
        };
        let link = self.link(id);
        let tmp = self
            .device_dir
            .join(format!(".{}.tmp", device_link_name(id)));
        remove_file(&tmp)?;
        std::os::unix::fs::symlink(&device, &tmp).map_err(context("linking", &tmp))?;
        std::fs::rename(&tmp, &link).map_err(context("renaming to", &link))?;
        Ok(device)
    }

    /// Removes the by-id link, then detaches every loop device bound to the
    /// volume's file (deferred by the kernel while one is still in use).
    pub fn detach(&self, id: &str) -> io::Result<()> {
        remove_file(&self.link(id))?;
        for device in self.devices_of(id)? {
            self.loops
                .detach(&device)
                .map_err(|e| io::Error::other(e.to_string()))?;
        }
        Ok(())
    }

    /// Volume ids with a file on disk.
    pub fn volume_ids(&self) -> io::Result<Vec<String>> {
        ids_in(&self.data_dir.join("volumes"))
    }

    /// Snapshot ids with a file on disk.
    pub fn snapshot_ids(&self) -> io::Result<Vec<String>> {
        ids_in(&self.data_dir.join("snapshots"))
    }

    /// Removes files, devices and links of volumes and snapshots not in
    /// `volumes` / `snapshots` (left by a crash between an effect and the
    /// state file). Returns how many things were removed.
    pub fn sweep(
        &self,
        volumes: &HashSet<String>,
        snapshots: &HashSet<String>,
    ) -> io::Result<usize> {
        let mut removed = 0;
        // Links are only looked for by the ids of files: the device
        // directory may be shared (`/dev/disk/by-id`).
        for id in self
            .volume_ids()?
            .iter()
            .filter(|id| !volumes.contains(*id))
        {
            self.detach(id)?;
            self.remove_volume(id)?;
            removed += 1;
        }
        for id in self
            .snapshot_ids()?
            .iter()
            .filter(|id| !snapshots.contains(*id))
        {
            self.remove_snapshot(id)?;
            removed += 1;
        }
        Ok(removed)
    }
}

fn ids_in(dir: &Path) -> io::Result<Vec<String>> {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(context("reading", dir))? {
        let name = entry?.file_name();
        if let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".img"))
            && is_provider_id(id)
        {
            ids.push(id.to_owned());
        }
    }
    Ok(ids)
}

fn remove_file(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(context("removing", path)(e)),
        _ => Ok(()),
    }
}
