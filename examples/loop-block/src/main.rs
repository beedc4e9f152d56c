//! The `loop-block` CSI driver; see the library's documentation and `--help`.

fn main() -> std::process::ExitCode {
    loop_block::main()
}
