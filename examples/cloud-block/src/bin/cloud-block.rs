//! The cloud-block CSI driver; see `cloud_block::driver` and the README.

use std::process::ExitCode;

use clap::Parser;
use cloud_block::driver::{Flags, run};
use csi_server::flags::{Allocator, driver_runtime, move_code_to_huge_pages, run_to_exit};

// Only a program can choose its allocator (csi_server::flags::Allocator
// says why this one).
#[global_allocator]
static ALLOCATOR: Allocator = Allocator;

/// The runtime every csi-kit driver runs on: the async part (gRPC, the
/// provider's HTTP client) on one thread, blocking work on a small pool.
fn main() -> ExitCode {
    let flags = Flags::parse();
    csi_server::init_tracing(&flags.common.log);
    // Calls come after idle spells; on huge pages its code costs them a TLB
    // miss per 2 MiB instead of per 4 KiB (docs/benchmarks.md, session 21).
    let code = move_code_to_huge_pages();
    tracing::debug!(?code, "code pages");
    run_to_exit("cloud-block", driver_runtime(), run(flags))
}
