//! [`FakeBlockDevices`]: attached block devices in memory, on a virtual
//! clock, for unit tests.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::block::DeviceNumber;
use crate::block_devices::{BlockDeviceError, BlockDeviceInfo, BlockDevices};

/// Block devices in memory for unit tests: devices appear when a test says
/// so (now, or after some virtual time), and waiting advances a virtual
/// clock instead of sleeping. Never reads the host's `/dev`.
#[derive(Debug, Default)]
pub struct FakeBlockDevices {
    state: Mutex<FakeState>,
}

#[derive(Debug, Default)]
struct FakeState {
    now: Duration,
    /// Path → (device, appears at).
    devices: BTreeMap<PathBuf, (BlockDeviceInfo, Duration)>,
    looks: usize,
}

impl FakeBlockDevices {
    /// No devices, the clock at zero.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A device of `size` bytes numbered `device` at `path`, present now.
    pub fn add(&self, path: impl Into<PathBuf>, device: DeviceNumber, size: u64) {
        self.add_after(path, device, size, Duration::ZERO);
    }

    /// Like [`add`](Self::add), appearing once `delay` of virtual time passed.
    pub fn add_after(
        &self,
        path: impl Into<PathBuf>,
        device: DeviceNumber,
        size: u64,
        delay: Duration,
    ) {
        let path = path.into();
        let mut st = self.lock();
        let at = st.now + delay;
        let info = BlockDeviceInfo {
            path: path.clone(),
            node: path.clone(),
            device,
            size,
        };
        st.devices.insert(path, (info, at));
    }

    /// Grows (or shrinks) the device at `path`, as a provider's resize does.
    pub fn resize(&self, path: &Path, size: u64) {
        if let Some((info, _)) = self.lock().devices.get_mut(path) {
            info.size = size;
        }
    }

    /// Removes the device at `path`, as a detach does.
    pub fn remove(&self, path: &Path) {
        self.lock().devices.remove(path);
    }

    /// The virtual time waited so far.
    pub fn waited(&self) -> Duration {
        self.lock().now
    }

    /// How many times a device was looked for.
    pub fn looks(&self) -> usize {
        self.lock().looks
    }
}

impl BlockDevices for FakeBlockDevices {
    fn find(&self, path: &Path) -> Result<Option<BlockDeviceInfo>, BlockDeviceError> {
        let mut st = self.lock();
        st.looks += 1;
        let now = st.now;
        Ok(st
            .devices
            .get(path)
            .filter(|(_, at)| *at <= now)
            .map(|(info, _)| info.clone()))
    }

    fn pause(&self, interval: Duration) {
        self.lock().now += interval;
    }

    /// From memory: a device here is its own node (the fake has no links),
    /// and a path it does not hold is nothing. Never reads the host.
    fn link_target(
        &self,
        path: &Path,
    ) -> Result<Option<(PathBuf, DeviceNumber)>, BlockDeviceError> {
        let st = self.lock();
        let now = st.now;
        Ok(st
            .devices
            .get(path)
            .filter(|(info, at)| *at <= now && info.node != info.path)
            .map(|(info, _)| (info.node.clone(), info.device)))
    }
}
