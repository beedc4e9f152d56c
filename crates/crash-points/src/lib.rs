//! Deterministic crash points for CSI drivers: the real-kernel companion of
//! csi-sim's fake world.
//!
//! Every effect a driver makes through a seam gets a number, in the order
//! the process makes them: a mount, an unmount, a loop device attached or
//! detached, a command run (mkfs, resize2fs), a file created, written,
//! truncated or synced, a rename, an unlink, a directory made. The seams
//! are mount-utils' [`Mounter`](mount_utils::Mounter),
//! [`LoopDevices`](mount_utils::LoopDevices) and [`Exec`](mount_utils::Exec)
//! and csi-store's [`FileSystem`](csi_store::FileSystem), wrapped by
//! [`mounter`], [`loop_devices`], [`exec`] and [`file_system`]; a driver
//! marks any other effect of its own with [`effect`] (a call it awaits, to
//! a cloud provider, with [`effect_async`]).
//!
//! A process started with `CSI_KIT_CRASH_AT=<n>` ([`CRASH_AT_ENV`], a
//! [`CrashPlan`]: `<n>`, `<n>:before` or `<n>:after`) kills itself with
//! SIGKILL right before (or right after) effect n, so a test can crash a
//! driver at every step of a workload, each run the same. With
//! `CSI_KIT_CRASH_TRACE=<file>` ([`CRASH_TRACE_ENV`]) it appends each
//! effect's number and kind to that file ([`read_trace`]), never its
//! arguments: no paths, mount flags or secrets.
//!
//! Only a build with the `armed` feature reads those variables: without it
//! [`armed`] is false and the wrapping functions return what they were
//! given, so a shipped driver has no hook and pays nothing. Drivers turn
//! `armed` on from their dev-dependencies (their test builds only).
//!
//! ```
//! use std::sync::Arc;
//! use mount_utils::{LinuxMounter, Mounter};
//!
//! // In the driver's main: the real mounter, counted when the hook is armed.
//! let mounter: Arc<dyn Mounter> = crash_points::mounter(Arc::new(LinuxMounter::new()));
//! # drop(mounter);
//! ```

mod hook;
mod plan;
mod seams;

pub use hook::{armed, effect, effect_async};
pub use plan::{CRASH_AT_ENV, CRASH_TRACE_ENV, CrashPlan, PlanError, TraceEntry, When, read_trace};
pub use seams::{exec, file_system, loop_devices, mounter};
