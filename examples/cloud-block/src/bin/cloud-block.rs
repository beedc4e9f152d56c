//! The cloud-block CSI driver; see `cloud_block::driver` and the README.

use std::process::ExitCode;

use clap::Parser;
use cloud_block::driver::{Flags, run};

#[tokio::main]
async fn main() -> ExitCode {
    let flags = Flags::parse();
    csi_server::init_tracing(&flags.common.log);
    csi_server::flags::exit_code("cloud-block", run(flags).await)
}
