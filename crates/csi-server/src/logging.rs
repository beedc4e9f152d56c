//! Logging setup for a driver's `main`.

use std::io::IsTerminal;

/// Logs to stderr with `RUST_LOG` as the filter, or `default_filter`
/// (e.g. `"info"`, `"my_driver=debug,info"`) when it is unset; colours only
/// on a terminal. Secrets never reach the log: requests are logged through
/// csi-proto's redacting `Debug`. Does nothing if a subscriber is already
/// installed.
pub fn init_tracing(default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}
