//! `cargo run --example hostpath`: the hostpath driver (package
//! `examples/hostpath`, binary `hostpath`) run from the workspace root.

#[global_allocator]
static ALLOCATOR: csi_server::flags::Allocator = csi_server::flags::Allocator;

fn main() -> std::process::ExitCode {
    hostpath::main()
}
