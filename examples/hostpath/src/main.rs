//! The `hostpath` CSI driver; see the library's documentation and `--help`.

use std::process::ExitCode;

// The driver's allocator (hostpath's lib.rs says why); only a program can
// choose it.
#[global_allocator]
static ALLOCATOR: hostpath::Allocator = hostpath::Allocator;

fn main() -> ExitCode {
    hostpath::main()
}
