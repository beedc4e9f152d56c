//! The world a simulated driver runs in: one step counter over every
//! effect (mounts, loop devices, execs, file operations, provider calls,
//! sleeps) and the fault planned for one step.

use std::any::{Any, TypeId};
use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard};

use csi_store::testing::{CrashKeep, FsEffect, FsHook, SimFs};
use mount_utils::{Errno, FakeBlockDevices, FakeLoopDevices, FakeMounter};

/// What happens at the planned step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimFault {
    /// The process dies there; the kernel keeps its page cache (every
    /// written byte survives, synced or not). Mounts and devices stay.
    Crash,
    /// The machine loses power there: only what was synced survives
    /// (the worst case of [`SimFs`]). Mounts and devices stay (they are
    /// the host's state, which the CO's node keeps in this model).
    PowerLoss,
    /// The effect fails with this errno and is not made (every step but
    /// a provider call, which fails in its own ways).
    Fail(Errno),
    /// A provider call fails this way (provider calls only).
    Provider(ProviderFault),
    /// The machine loses power there and the filesystem keeps the `i`th
    /// reordered state (`SimFs::reordered_states`: later changes kept
    /// without earlier ones, as ext4 may). Not in [`FAULTS`]: the runner
    /// tries each state a crash at that step finds.
    CrashState(usize),
}

/// How a call to a storage provider's API fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderFault {
    /// A 5xx answer: the provider did nothing.
    ServerError,
    /// 429 with a Retry-After: the provider did nothing.
    Throttled,
    /// No answer in time, and the request never reached the provider.
    TimeoutBefore,
    /// No answer in time, but the provider made the change: only the
    /// answer was lost.
    TimeoutAfter,
}

impl ProviderFault {
    /// Whether the provider made the change although the call failed.
    pub fn applied(self) -> bool {
        self == ProviderFault::TimeoutAfter
    }
}

/// Every fault the runner tries, each at every step it applies to
/// ([`SimFault::applies_to`]).
pub const FAULTS: [SimFault; 10] = [
    SimFault::Crash,
    SimFault::PowerLoss,
    SimFault::Fail(Errno::EIO),
    SimFault::Fail(Errno::ENOSPC),
    SimFault::Fail(Errno::EBUSY),
    SimFault::Fail(Errno::ENOENT),
    SimFault::Provider(ProviderFault::ServerError),
    SimFault::Provider(ProviderFault::Throttled),
    SimFault::Provider(ProviderFault::TimeoutBefore),
    SimFault::Provider(ProviderFault::TimeoutAfter),
];

impl SimFault {
    /// Whether this fault can happen at a step of `effect`: a crash
    /// anywhere, an errno at every step but a provider call, a provider
    /// fault at a provider call only.
    pub fn applies_to(self, effect: Effect) -> bool {
        match self {
            SimFault::Crash | SimFault::PowerLoss | SimFault::CrashState(_) => true,
            SimFault::Fail(_) => effect != Effect::Provider,
            SimFault::Provider(_) => effect == Effect::Provider,
        }
    }
}

impl fmt::Display for SimFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimFault::Crash => f.write_str("crash"),
            SimFault::PowerLoss => f.write_str("power-loss"),
            SimFault::Fail(e) => write!(f, "{}", format!("{e:?}").to_lowercase()),
            SimFault::Provider(ProviderFault::ServerError) => f.write_str("provider-5xx"),
            SimFault::Provider(ProviderFault::Throttled) => f.write_str("provider-429"),
            SimFault::Provider(ProviderFault::TimeoutBefore) => f.write_str("timeout-before"),
            SimFault::Provider(ProviderFault::TimeoutAfter) => f.write_str("timeout-after"),
            SimFault::CrashState(i) => write!(f, "{CRASH_STATE}-{i}"),
        }
    }
}

const CRASH_STATE: &str = "crash-state";

impl SimFault {
    /// The fault's kind: its name, without the index of a crash state.
    pub fn kind(&self) -> String {
        match self {
            SimFault::CrashState(_) => CRASH_STATE.to_owned(),
            f => f.to_string(),
        }
    }
}

/// A fault name that is not one of [`FAULTS`].
#[derive(Debug, thiserror::Error)]
#[error(
    "unknown fault {0:?} (crash, power-loss, eio, enospc, ebusy, enoent, provider-5xx, \
     provider-429, timeout-before, timeout-after, crash-state-N)"
)]
pub struct UnknownFault(String);

impl FromStr for SimFault {
    type Err = UnknownFault;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let state = s
            .strip_prefix(CRASH_STATE)
            .and_then(|i| i.strip_prefix('-'))
            .and_then(|i| i.parse().ok());
        FAULTS
            .iter()
            .copied()
            .find(|f| f.to_string() == s)
            .or(state.map(SimFault::CrashState))
            .ok_or_else(|| UnknownFault(s.to_owned()))
    }
}

/// A kind of effect, for the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// A mount, bind mount or remount.
    Mount,
    /// An unmount.
    Unmount,
    /// A loop device attached, resized or detached.
    Loop,
    /// A command run.
    Exec,
    /// A file operation of the store.
    File(FsEffect),
    /// A call to the storage provider (where volumes' data lives).
    Provider,
    /// A sleep of the clock.
    Sleep,
}

#[derive(Debug, Default)]
struct State {
    step: u64,
    plan: Option<(u64, SimFault)>,
    fired: Option<SimFault>,
    generation: u64,
    crashed: bool,
    trace: Option<Vec<String>>,
    /// The kind of every step so far.
    effects: Vec<Effect>,
    /// Open [`Unobserved`] guards.
    unobserved: usize,
    /// Host directories put back as they were at the crash on restart.
    kept_dirs: Vec<PathBuf>,
    /// Reordered crash states the filesystem had at the planned crash.
    crash_states: usize,
}

/// The shared world: the fakes (mount table, loop devices, filesystem) and
/// the step counter. Cheap to clone. Everything stays across a crash
/// except the driver's process: handles made before it fail with `EIO`.
#[derive(Clone)]
pub struct World {
    state: Arc<Mutex<State>>,
    fs: SimFs,
    mounter: Arc<FakeMounter>,
    loops: Arc<FakeLoopDevices>,
    devices: Arc<FakeBlockDevices>,
    kept: Arc<Mutex<BTreeMap<TypeId, Arc<dyn Any + Send + Sync>>>>,
    dir: Arc<tempfile::TempDir>,
}

impl fmt::Debug for World {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.lock();
        f.debug_struct("World")
            .field("step", &st.step)
            .field("plan", &st.plan)
            .field("generation", &st.generation)
            .finish_non_exhaustive()
    }
}

/// The filesystem's hook: stale handles never reach it (the filesystem
/// refuses them itself), so it counts for the current process. It holds
/// the state only, not the world, so the world is freed with its last clone.
struct Hook(Arc<Mutex<State>>);

impl FsHook for Hook {
    fn before(&self, effect: FsEffect, path: &Path) -> io::Result<()> {
        let mut st = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let generation = st.generation;
        step_in(
            &mut st,
            generation,
            Effect::File(effect),
            &path.display().to_string(),
        )
        .map(drop)
        .map_err(|e| io::Error::from_raw_os_error(e as i32))
    }
}

/// Counts a step; `Ok(Some(_))` is a provider fault planned here (only a
/// provider call meets one), `Err` an errno or the dead process's `EIO`.
fn step_in(
    st: &mut State,
    generation: u64,
    effect: Effect,
    what: &str,
) -> Result<Option<ProviderFault>, Errno> {
    if st.crashed || generation != st.generation {
        return Err(Errno::EIO);
    }
    if st.unobserved > 0 {
        return Ok(None);
    }
    let n = st.step;
    st.step += 1;
    st.effects.push(effect);
    let fault = match st.plan {
        Some((k, fault)) if k == n && fault.applies_to(effect) => {
            st.fired = Some(fault);
            Some(fault)
        }
        _ => None,
    };
    if let Some(trace) = &mut st.trace {
        let note = fault.map_or(String::new(), |f| format!("  {FIRED_MARK} {f}"));
        trace.push(format!("step {n}: {effect:?} {what}{note}"));
    }
    match fault {
        None => Ok(None),
        Some(SimFault::Provider(p)) => Ok(Some(p)),
        Some(SimFault::Fail(errno)) => Err(errno),
        Some(SimFault::Crash | SimFault::PowerLoss | SimFault::CrashState(_)) => {
            st.crashed = true;
            for dir in &st.kept_dirs {
                // A failed image shows as a violation after the restart.
                let _ = image_dir(dir, &crash_image(dir));
            }
            Err(Errno::EIO)
        }
    }
}

/// What marks the step where the planned fault fired in a traced run.
pub(crate) const FIRED_MARK: &str = "<==";

/// While it lives, the world's effects are neither counted nor faulted:
/// what the runner's checks make the driver do is not part of the run.
#[derive(Debug)]
pub struct Unobserved(Arc<Mutex<State>>);

impl Drop for Unobserved {
    fn drop(&mut self) {
        let mut st = self.0.lock().unwrap_or_else(|e| e.into_inner());
        st.unobserved -= 1;
    }
}

/// Where `dir`'s image at the crash is kept.
fn crash_image(dir: &Path) -> PathBuf {
    let mut name = dir.as_os_str().to_owned();
    name.push(".at-crash");
    PathBuf::from(name)
}

/// Copies the tree at `from` to `to` as it is now: directories and
/// symbolic links anew, files as hard links (cheap for large sparse
/// images; what a dead process could still do is create, remove or rename
/// entries, which the copy undoes).
fn image_dir(from: &Path, to: &Path) -> io::Result<()> {
    std::fs::create_dir(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type()?;
        if kind.is_dir() {
            image_dir(&src, &dst)?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src)?, &dst)?;
        } else {
            std::fs::hard_link(&src, &dst)?;
        }
    }
    Ok(())
}

/// Names the directory the worlds' host directories are made in.
pub const TMPDIR_ENV: &str = "CSI_SIM_TMPDIR";

/// A world's host directory: in `CSI_SIM_TMPDIR`, else in `/dev/shm` where
/// the machine has one, else in the temporary directory. Every run makes
/// and removes dozens of directories, and on ext4 finding a free inode
/// slows down with thousands removed a second (`mkdir` then cost more
/// than the run itself); tmpfs has no such search.
fn host_dir() -> io::Result<tempfile::TempDir> {
    let builder = || {
        let mut b = tempfile::Builder::new();
        b.prefix("csi-sim-");
        b
    };
    if let Some(dir) = std::env::var_os(TMPDIR_ENV) {
        return builder().tempdir_in(dir);
    }
    builder()
        .tempdir_in("/dev/shm")
        .or_else(|_| builder().tempdir())
}

impl World {
    /// Data the driver keeps on the host, outside the simulated filesystem
    /// (a directory of volumes): at a crash its tree is imaged, and the
    /// restart puts the image back, so nothing the dead process still runs
    /// changes it (its effects through the world fail; plain file
    /// operations would not). `dir` is made if missing.
    pub fn keep_on_crash(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let mut st = self.lock();
        if !st.kept_dirs.iter().any(|d| d == dir) {
            st.kept_dirs.push(dir.to_owned());
        }
        Ok(())
    }

    /// Effects go uncounted and unfaulted until the guard is dropped.
    pub fn unobserved(&self) -> Unobserved {
        self.lock().unobserved += 1;
        Unobserved(self.state.clone())
    }

    /// A fresh world with `plan` (none: count only); its host directories
    /// (volume data, kubelet paths) live in a temporary directory removed
    /// with the last clone (see [`TMPDIR_ENV`]).
    pub fn new(plan: Option<(u64, SimFault)>) -> io::Result<World> {
        let mounter = FakeMounter::new();
        mounter.add_mount("/dev/root", "/", "ext4");
        let world = World {
            state: Arc::new(Mutex::new(State {
                plan,
                ..State::default()
            })),
            fs: SimFs::new(),
            mounter: Arc::new(mounter),
            loops: Arc::new(FakeLoopDevices::new()),
            devices: Arc::new(FakeBlockDevices::new()),
            kept: Arc::default(),
            dir: Arc::new(host_dir()?),
        };
        world.fs.set_hook(Some(Arc::new(Hook(world.state.clone()))));
        Ok(world)
    }

    /// Records every step with what it touched (for a replay).
    pub fn trace(&self) {
        self.lock().trace = Some(Vec::new());
    }

    /// The steps recorded since [`trace`](Self::trace).
    pub fn traced(&self) -> Vec<String> {
        self.lock().trace.clone().unwrap_or_default()
    }

    /// The simulated filesystem (the driver's state directories).
    pub fn fs(&self) -> &SimFs {
        &self.fs
    }

    /// The mount table.
    pub fn mounter(&self) -> &Arc<FakeMounter> {
        &self.mounter
    }

    /// The loop devices.
    pub fn loops(&self) -> &Arc<FakeLoopDevices> {
        &self.loops
    }

    /// The block devices a provider attached (by their stable names);
    /// they stay across a crash of the driver.
    pub fn block_devices(&self) -> &Arc<FakeBlockDevices> {
        &self.devices
    }

    /// State that lives outside the driver, one value per type (a
    /// storage provider's volumes and attachments, the filesystems on
    /// disks): made with `T::default()` on first use, it stays across
    /// every crash.
    pub fn kept<T: Any + Send + Sync + Default>(&self) -> Arc<T> {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let state = kept
            .entry(TypeId::of::<T>())
            .or_insert_with(|| Arc::new(T::default()));
        state.clone().downcast().expect("kept by its own type id")
    }

    /// A host directory for data and kubelet paths.
    pub fn host_dir(&self) -> PathBuf {
        self.dir.path().to_owned()
    }

    /// The current driver process.
    pub fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// Steps made so far.
    pub fn steps(&self) -> u64 {
        self.lock().step
    }

    /// Whether the planned crash happened and the driver has not been
    /// restarted since.
    pub fn crashed(&self) -> bool {
        self.lock().crashed
    }

    /// How many reordered crash states the filesystem had when the
    /// planned [`SimFault::Crash`] fired (0 before).
    pub fn crash_states_seen(&self) -> usize {
        self.lock().crash_states
    }

    /// The fault that fired, if any.
    pub fn fired(&self) -> Option<SimFault> {
        self.lock().fired
    }

    /// The kind of every step made so far, in order.
    pub fn effects(&self) -> Vec<Effect> {
        self.lock().effects.clone()
    }

    /// Counts one effect of the process `generation` and says whether it
    /// happens: `Err` means it fails with that errno and is not made (the
    /// planned failure, or any effect of a process that crashed). A
    /// provider call counted here fails its provider fault with `EIO`
    /// and is not made ([`provider_call`](Self::provider_call) tells the
    /// faults apart).
    pub fn step(&self, generation: u64, effect: Effect, what: &str) -> Result<(), Errno> {
        match step_in(&mut self.lock(), generation, effect, what)? {
            None => Ok(()),
            Some(_) => Err(Errno::EIO),
        }
    }

    /// Counts one provider call of the process `generation`: `Ok(None)`,
    /// it happens and answers; `Ok(Some(fault))`, it fails that way
    /// (after the change was made for [`ProviderFault::TimeoutAfter`]);
    /// `Err`, the process is dead (a crash planned here, or earlier) and
    /// the call is never sent.
    pub fn provider_call(
        &self,
        generation: u64,
        what: &str,
    ) -> Result<Option<ProviderFault>, Errno> {
        step_in(&mut self.lock(), generation, Effect::Provider, what)
    }

    /// After a crash: the filesystem keeps what the fault keeps, and the
    /// next process starts (earlier handles fail with `EIO`).
    pub fn restart(&self) {
        let keep = match self.fired() {
            Some(SimFault::PowerLoss) => CrashKeep::Prefix(0),
            Some(SimFault::CrashState(i)) => CrashKeep::Reordered(i),
            Some(SimFault::Crash) => {
                let states = self.fs.reordered_states();
                self.lock().crash_states = states;
                CrashKeep::All
            }
            _ => CrashKeep::All,
        };
        self.fs.crash(keep);
        let mut st = self.lock();
        for dir in &st.kept_dirs {
            let image = crash_image(dir);
            if image.exists() {
                let _ = std::fs::remove_dir_all(dir);
                let _ = std::fs::rename(&image, dir);
            }
        }
        st.crashed = false;
        st.generation += 1;
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}
