//! The `loop-block` CSI driver; see the library's documentation and `--help`.

// Only a program can choose its allocator (csi_server::flags::Allocator
// says why this one).
#[global_allocator]
static ALLOCATOR: csi_server::flags::Allocator = csi_server::flags::Allocator;

fn main() -> std::process::ExitCode {
    loop_block::main()
}
