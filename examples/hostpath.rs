//! `cargo run --example hostpath`: the hostpath driver (package
//! `examples/hostpath`, binary `hostpath`) run from the workspace root.

#[global_allocator]
static ALLOCATOR: hostpath::Allocator = hostpath::Allocator;

fn main() -> std::process::ExitCode {
    hostpath::main()
}
