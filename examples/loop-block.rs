//! `cargo run --example loop-block`: the loop-block driver (package
//! `examples/loop-block`, binary `loop-block`) run from the workspace root.

fn main() -> std::process::ExitCode {
    loop_block::main()
}
