//! A deterministic simulation that crashes or fails a CSI driver at every
//! step of a CO's workload and checks that nothing is lost or leaked.
//!
//! - [`World`]: the fakes a driver runs on (mount table, loop devices,
//!   csi-store's simulated filesystem, a storage provider) and one step
//!   counter over every effect they see. A [`SimFault`] planned at step k
//!   crashes the driver there (its process state is dropped; mounts, loop
//!   devices and the page cache, or with [`SimFault::PowerLoss`] only synced
//!   data, stay) or fails that effect with an errno (a provider call with
//!   a [`ProviderFault`]: a 5xx, a 429, a timeout before or after the
//!   provider made the change).
//! - [`SimMounter`], [`SimLoops`], [`SimExec`]: mount-utils' seams over the
//!   world, and [`SimClock`], volume-state's clock, whose sleeps are
//!   steps; csi-store's `FileStore::open_on(world.fs().handle(), dir)`
//!   puts a driver's records on the simulated filesystem.
//! - [`SimRunner`]: runs a [`SimWorkload`] once to count its steps, then once per
//!   step and fault, restarting the driver after a crash and retrying calls
//!   as Kubernetes does, and checks the invariants after every answered
//!   call. A violation prints `workload:step:fault`;
//!   `CSI_SIM_REPLAY=workload:step:fault` replays that run with its trace.
//!   The runs of a workload are spread over the machine's cores
//!   ([`THREADS_ENV`] sets how many), each on its own world, whose host
//!   directory is on tmpfs where there is one ([`TMPDIR_ENV`]).
//!
//! A vendor points it at their driver with a start function:
//!
//! ```no_run
//! use csi_sim::{SimReport, SimRunner, Started, World, workloads};
//!
//! fn start(world: &World) -> Started {
//!     // Open the driver's state with FileStore::open_on(world.fs().handle(), ..),
//!     // give it SimMounter::new(world), run its startup recovery, return its services.
//!     let world = world.clone();
//!     Box::pin(async move { csi_sim::targets::library(&world).await })
//! }
//!
//! let runner = SimRunner::new(&start);
//! let mut report = SimReport::default();
//! for w in workloads() {
//!     runner.explore(&w, &mut report);
//! }
//! println!("{report}");
//! assert!(report.violations.is_empty());
//! ```

mod check;
mod co;
#[cfg(feature = "kernel")]
pub mod kernel;
pub mod kubelet;
mod runner;
pub mod targets;
mod workload;
mod world;
mod wrap;

pub use kubelet::{Change, KubeletWorkload, Pod, kubelet_workloads};
pub use runner::{
    DataView, FaultTally, MAX_ATTEMPTS, Services, SimReport, SimRunner, Start, Started,
    THREADS_ENV, Violation,
};
pub use workload::{Call, Content, SimWorkload, workloads};
pub use world::{
    Effect, FAULTS, ProviderFault, SimFault, TMPDIR_ENV, UnknownFault, Unobserved, World,
};
pub use wrap::{SimClock, SimExec, SimFsTools, SimLoops, SimMounter};
