//! `cargo run --example loop-block`: the loop-block driver (package
//! `examples/loop-block`, binary `loop-block`) run from the workspace root.

#[global_allocator]
static ALLOCATOR: csi_server::flags::Allocator = csi_server::flags::Allocator;

fn main() -> std::process::ExitCode {
    loop_block::main()
}
