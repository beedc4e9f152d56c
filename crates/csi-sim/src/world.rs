//! The world a simulated driver runs in: one step counter over every
//! effect (mounts, loop devices, execs, file operations, provider calls,
//! sleeps) and the fault planned for one step.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard};

use csi_store::testing::{CrashKeep, FsEffect, FsHook, SimFs};
use mount_utils::{Errno, FakeLoopDevices, FakeMounter};

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
    /// The effect fails with this errno and is not made.
    Fail(Errno),
    /// The machine loses power there and the filesystem keeps the `i`th
    /// reordered state (`SimFs::reordered_states`: later changes kept
    /// without earlier ones, as ext4 may). Not in [`FAULTS`]: the runner
    /// tries each state a crash at that step finds.
    CrashState(usize),
}

/// Every fault the runner tries at every step.
pub const FAULTS: [SimFault; 6] = [
    SimFault::Crash,
    SimFault::PowerLoss,
    SimFault::Fail(Errno::EIO),
    SimFault::Fail(Errno::ENOSPC),
    SimFault::Fail(Errno::EBUSY),
    SimFault::Fail(Errno::ENOENT),
];

impl fmt::Display for SimFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimFault::Crash => f.write_str("crash"),
            SimFault::PowerLoss => f.write_str("power-loss"),
            SimFault::Fail(e) => write!(f, "{}", format!("{e:?}").to_lowercase()),
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
#[error("unknown fault {0:?} (crash, power-loss, eio, enospc, ebusy, enoent, crash-state-N)")]
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
        .map_err(|e| io::Error::from_raw_os_error(e as i32))
    }
}

fn step_in(st: &mut State, generation: u64, effect: Effect, what: &str) -> Result<(), Errno> {
    if st.crashed || generation != st.generation {
        return Err(Errno::EIO);
    }
    let n = st.step;
    st.step += 1;
    let fault = match st.plan {
        Some((k, fault)) if k == n => {
            st.fired = Some(fault);
            Some(fault)
        }
        _ => None,
    };
    if let Some(trace) = &mut st.trace {
        let note = fault.map_or(String::new(), |f| format!("  <== {f}"));
        trace.push(format!("step {n}: {effect:?} {what}{note}"));
    }
    match fault {
        None => Ok(()),
        Some(SimFault::Fail(errno)) => Err(errno),
        Some(SimFault::Crash | SimFault::PowerLoss | SimFault::CrashState(_)) => {
            st.crashed = true;
            Err(Errno::EIO)
        }
    }
}

impl World {
    /// A fresh world with `plan` (none: count only); its host directories
    /// (volume data, kubelet paths) live in a temporary directory removed
    /// with the last clone.
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
            dir: Arc::new(tempfile::Builder::new().prefix("csi-sim-").tempdir()?),
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

    /// Counts one effect of the process `generation` and says whether it
    /// happens: `Err` means it fails with that errno and is not made (the
    /// planned failure, or any effect of a process that crashed).
    pub fn step(&self, generation: u64, effect: Effect, what: &str) -> Result<(), Errno> {
        step_in(&mut self.lock(), generation, effect, what)
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
        st.crashed = false;
        st.generation += 1;
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}
