//! [`FakeLoopDevices`]: an in-memory [`LoopDevices`] for unit tests.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use nix::errno::Errno;

use crate::block::DeviceNumber;
use crate::loopdev::{AttachedLoop, LoopDeviceInfo, LoopDevices, LoopError, LoopOptions};
use crate::nofollow::absolute;

/// Major number of loop devices; [`FakeMounter`](crate::FakeMounter) gives
/// a filesystem mounted from `/dev/loopN` the device number `7:N` too.
pub(crate) const LOOP_MAJOR: u32 = 7;

/// An operation of [`FakeLoopDevices`] that can be made to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FakeLoopOp {
    /// [`LoopDevices::attach`].
    Attach,
    /// [`LoopDevices::find_by_backing_file`].
    Find,
    /// [`LoopDevices::info`].
    Info,
    /// [`LoopDevices::set_capacity`].
    SetCapacity,
    /// [`LoopDevices::detach`] (and dropping an [`AttachedLoop`]).
    Detach,
}

/// A state change recorded by [`FakeLoopDevices`], in call order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FakeLoopAction {
    /// A device was attached.
    Attach {
        /// The device.
        device: PathBuf,
        /// Its backing file, made absolute.
        backing_file: PathBuf,
        /// The options given.
        options: LoopOptions,
    },
    /// The size was re-read.
    SetCapacity {
        /// The device.
        device: PathBuf,
        /// The new size.
        size: u64,
    },
    /// A device was detached.
    Detach {
        /// The device.
        device: PathBuf,
    },
}

#[derive(Debug, Clone)]
struct Attached {
    backing: PathBuf,
    options: LoopOptions,
    size: u64,
}

#[derive(Debug, Default)]
struct State {
    devices: BTreeMap<u32, Attached>,
    files: HashMap<PathBuf, u64>,
    log: Vec<FakeLoopAction>,
    errors: HashMap<FakeLoopOp, Errno>,
}

/// In-memory [`LoopDevices`] for unit tests of node code.
///
/// - Like the kernel, attach takes the lowest free `/dev/loopN`, so a number
///   freed by a detach is handed to the next file: the hazard behind
///   detaching a device that is still published.
/// - Device numbers are `7:N`, the same [`FakeMounter`](crate::FakeMounter)
///   gives a filesystem mounted from `/dev/loopN`, so
///   [`MountSource::Device`](crate::MountSource::Device) checks work across
///   the two fakes.
/// - Backing files are those registered with
///   [`set_backing_file`](Self::set_backing_file) or real files on disk;
///   others fail with `ENOENT` as the real attach would.
/// - Autoclear is recorded but not simulated: devices stay until detached
///   (or their un-kept handle is dropped).
/// - An action log ([`actions`](Self::actions)) and injectable errors.
///
/// Clones share state.
#[derive(Debug, Default, Clone)]
pub struct FakeLoopDevices {
    state: Arc<Mutex<State>>,
}

impl FakeLoopDevices {
    /// No devices, no files.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Declares a backing file of `size` bytes (or resizes it; the device
    /// sees it after [`set_capacity`](LoopDevices::set_capacity)).
    pub fn set_backing_file(&self, path: impl AsRef<Path>, size: u64) {
        let path = norm(path.as_ref());
        self.lock().files.insert(path, size);
    }

    /// Attaches `backing_file` as if a previous run had (not logged), at
    /// the lowest free number; returns the device path.
    pub fn attach_existing(
        &self,
        backing_file: impl AsRef<Path>,
        options: &LoopOptions,
    ) -> PathBuf {
        let mut st = self.lock();
        let backing = norm(backing_file.as_ref());
        let size = st.files.get(&backing).copied().unwrap_or(0);
        let n = free_number(&st);
        st.devices.insert(
            n,
            Attached {
                backing,
                options: options.clone(),
                size,
            },
        );
        device_path(n)
    }

    /// Makes `op` fail with `errno` until [`clear_errors`](Self::clear_errors).
    pub fn inject_error(&self, op: FakeLoopOp, errno: Errno) {
        self.lock().errors.insert(op, errno);
    }

    /// Removes all injected errors.
    pub fn clear_errors(&self) {
        self.lock().errors.clear();
    }

    /// The action log, oldest first.
    pub fn actions(&self) -> Vec<FakeLoopAction> {
        self.lock().log.clone()
    }

    /// Clears the action log (not the devices).
    pub fn clear_actions(&self) {
        self.lock().log.clear();
    }

    /// Every attached device, by number.
    pub fn attached(&self) -> Vec<LoopDeviceInfo> {
        let st = self.lock();
        st.devices.iter().map(|(n, a)| info_of(*n, a)).collect()
    }

    fn check(st: &State, op: FakeLoopOp, path: &Path) -> Result<(), LoopError> {
        let Some(&errno) = st.errors.get(&op) else {
            return Ok(());
        };
        let path = path.to_path_buf();
        Err(match op {
            FakeLoopOp::Attach => LoopError::Ioctl {
                op: "LOOP_CONFIGURE",
                path,
                errno,
            },
            FakeLoopOp::Find => LoopError::Sysfs { path, errno },
            FakeLoopOp::Info => LoopError::Ioctl {
                op: "LOOP_GET_STATUS64",
                path,
                errno,
            },
            FakeLoopOp::SetCapacity => LoopError::Ioctl {
                op: "LOOP_SET_CAPACITY",
                path,
                errno,
            },
            FakeLoopOp::Detach => LoopError::Ioctl {
                op: "LOOP_CLR_FD",
                path,
                errno,
            },
        })
    }
}

impl LoopDevices for FakeLoopDevices {
    fn attach(
        &self,
        backing_file: &Path,
        options: &LoopOptions,
    ) -> Result<AttachedLoop, LoopError> {
        let mut st = self.lock();
        Self::check(&st, FakeLoopOp::Attach, Path::new("/dev/loop-control"))?;
        let backing = norm(backing_file);
        let size = match st.files.get(&backing) {
            Some(&size) => size,
            None => std::fs::metadata(&backing).map(|m| m.len()).map_err(|e| {
                LoopError::BackingFile {
                    path: backing_file.to_path_buf(),
                    errno: crate::error::io_errno(&e),
                }
            })?,
        };
        let n = free_number(&st);
        let attached = Attached {
            backing: backing.clone(),
            options: options.clone(),
            size,
        };
        let info = info_of(n, &attached);
        st.devices.insert(n, attached);
        st.log.push(FakeLoopAction::Attach {
            device: info.path.clone(),
            backing_file: backing.clone(),
            options: options.clone(),
        });
        let state = Arc::clone(&self.state);
        Ok(AttachedLoop::new(info, move |detach| {
            if !detach {
                return Ok(());
            }
            let mut st = lock(&state);
            Self::check(&st, FakeLoopOp::Detach, &device_path(n))?;
            // Only if it is still ours: the number may have been reused.
            if st.devices.get(&n).is_some_and(|a| a.backing == backing) {
                st.devices.remove(&n);
                st.log.push(FakeLoopAction::Detach {
                    device: device_path(n),
                });
            }
            Ok(())
        }))
    }

    fn find_by_backing_file(&self, backing_file: &Path) -> Result<Vec<PathBuf>, LoopError> {
        let st = self.lock();
        Self::check(&st, FakeLoopOp::Find, Path::new("/sys/block"))?;
        let wanted = norm(backing_file);
        Ok(st
            .devices
            .iter()
            .filter(|(_, a)| a.backing == wanted)
            .map(|(n, _)| device_path(*n))
            .collect())
    }

    fn attached(&self) -> Result<Vec<LoopDeviceInfo>, LoopError> {
        let st = self.lock();
        Self::check(&st, FakeLoopOp::Find, Path::new("/sys/block"))?;
        Ok(st.devices.iter().map(|(n, a)| info_of(*n, a)).collect())
    }

    fn info(&self, device: &Path) -> Result<Option<LoopDeviceInfo>, LoopError> {
        let st = self.lock();
        Self::check(&st, FakeLoopOp::Info, device)?;
        Ok(number_of(device).and_then(|n| st.devices.get(&n).map(|a| info_of(n, a))))
    }

    fn set_capacity(&self, device: &Path) -> Result<u64, LoopError> {
        let mut st = self.lock();
        Self::check(&st, FakeLoopOp::SetCapacity, device)?;
        let not_bound = || LoopError::Ioctl {
            op: "LOOP_SET_CAPACITY",
            path: device.to_path_buf(),
            errno: Errno::ENXIO,
        };
        let n = number_of(device).ok_or_else(not_bound)?;
        let backing = st.devices.get(&n).ok_or_else(not_bound)?.backing.clone();
        let size = match st.files.get(&backing) {
            Some(&size) => size,
            None => std::fs::metadata(&backing).map_or(0, |m| m.len()),
        };
        if let Some(a) = st.devices.get_mut(&n) {
            a.size = size;
        }
        st.log.push(FakeLoopAction::SetCapacity {
            device: device_path(n),
            size,
        });
        Ok(size)
    }

    fn detach(&self, device: &Path) -> Result<(), LoopError> {
        let mut st = self.lock();
        Self::check(&st, FakeLoopOp::Detach, device)?;
        if let Some(n) = number_of(device)
            && st.devices.remove(&n).is_some()
        {
            st.log.push(FakeLoopAction::Detach {
                device: device_path(n),
            });
        }
        Ok(())
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panicking test must not poison the fake for the others.
    state.lock().unwrap_or_else(|e| e.into_inner())
}

fn norm(path: &Path) -> PathBuf {
    absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

fn free_number(st: &State) -> u32 {
    (0..).find(|n| !st.devices.contains_key(n)).unwrap_or(0)
}

fn device_path(n: u32) -> PathBuf {
    PathBuf::from(format!("/dev/loop{n}"))
}

/// N of `/dev/loopN`.
pub(crate) fn number_of(device: &Path) -> Option<u32> {
    device.to_str()?.strip_prefix("/dev/loop")?.parse().ok()
}

fn info_of(n: u32, a: &Attached) -> LoopDeviceInfo {
    LoopDeviceInfo {
        path: device_path(n),
        number: n,
        device: DeviceNumber::new(LOOP_MAJOR, n),
        backing_file: a.backing.clone(),
        size: a.size,
        read_only: a.options.read_only,
        autoclear: a.options.autoclear,
        direct_io: a.options.direct_io,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> &Path {
        Path::new(s)
    }

    #[test]
    fn attach_reuses_the_lowest_free_number() {
        let f = FakeLoopDevices::new();
        f.set_backing_file("/img/a", 100);
        f.set_backing_file("/img/b", 200);
        let a = f
            .attach(p("/img/a"), &LoopOptions::default())
            .unwrap()
            .keep();
        let b = f
            .attach(p("/img/b"), &LoopOptions::default())
            .unwrap()
            .keep();
        assert_eq!((a.number, b.number), (0, 1));
        assert_eq!(b.device, DeviceNumber::new(7, 1));
        assert_eq!(b.size, 200);
        f.detach(&a.path).unwrap();
        f.detach(&a.path).unwrap(); // idempotent
        // loop0 now serves another file: a stale record must check info.
        let b2 = f
            .attach(p("/img/b"), &LoopOptions::default())
            .unwrap()
            .keep();
        assert_eq!(b2.path, a.path);
        assert_eq!(f.info(&a.path).unwrap().unwrap().backing_file, p("/img/b"));
        assert_eq!(
            f.find_by_backing_file(p("/img/b")).unwrap(),
            vec![PathBuf::from("/dev/loop0"), PathBuf::from("/dev/loop1")]
        );
        assert!(f.find_by_backing_file(p("/img/a")).unwrap().is_empty());
        assert_eq!(
            f.actions()
                .iter()
                .filter(|a| matches!(a, FakeLoopAction::Detach { .. }))
                .count(),
            1
        );
    }

    #[test]
    fn dropped_handles_detach_and_kept_ones_stay() {
        let f = FakeLoopDevices::new();
        f.set_backing_file("/img/a", 1);
        let dev = f.attach(p("/img/a"), &LoopOptions::default()).unwrap();
        let path = dev.path().to_path_buf();
        drop(dev);
        assert!(f.info(&path).unwrap().is_none());
        let dev = f.attach(p("/img/a"), &LoopOptions::default()).unwrap();
        dev.detach().unwrap();
        assert!(f.attached().is_empty());
        // A handle whose device was detached and reused leaves the new one alone.
        let dev = f.attach(p("/img/a"), &LoopOptions::default()).unwrap();
        f.detach(dev.path()).unwrap();
        f.set_backing_file("/img/b", 1);
        let other = f
            .attach(p("/img/b"), &LoopOptions::default())
            .unwrap()
            .keep();
        drop(dev);
        assert_eq!(
            f.info(&other.path).unwrap().unwrap().backing_file,
            p("/img/b")
        );
    }

    #[test]
    fn capacity_errors_and_real_files() {
        let f = FakeLoopDevices::new();
        let err = f
            .attach(p("/img/none"), &LoopOptions::default())
            .unwrap_err();
        assert_eq!(err.errno(), Some(Errno::ENOENT));
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("disk.img");
        std::fs::File::create(&img).unwrap().set_len(4096).unwrap();
        let info = f.attach(&img, &LoopOptions::default()).unwrap().keep();
        assert_eq!(info.size, 4096);
        std::fs::File::options()
            .write(true)
            .open(&img)
            .unwrap()
            .set_len(8192)
            .unwrap();
        assert_eq!(f.info(&info.path).unwrap().unwrap().size, 4096);
        assert_eq!(f.set_capacity(&info.path).unwrap(), 8192);
        assert_eq!(
            f.set_capacity(p("/dev/loop9")).unwrap_err().errno(),
            Some(Errno::ENXIO)
        );
        f.inject_error(FakeLoopOp::Detach, Errno::EBUSY);
        assert_eq!(
            f.detach(&info.path).unwrap_err().errno(),
            Some(Errno::EBUSY)
        );
        f.inject_error(FakeLoopOp::Find, Errno::EIO);
        assert!(f.find_by_backing_file(&img).is_err());
        f.clear_errors();
        let existing = f.attach_existing("/img/x", &LoopOptions::default());
        assert_eq!(existing, p("/dev/loop1"));
        f.detach(&info.path).unwrap();
        assert_eq!(f.attached().len(), 1);
    }
}
