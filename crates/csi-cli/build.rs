//! Sets `cfg(not_root)` when built without root, so root-only tests
//! (`#[cfg_attr(not_root, ignore = "needs root (euid != 0)")]`) are
//! reported as ignored instead of passing without running.

use std::os::unix::fs::MetadataExt;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rustc-check-cfg=cfg(not_root)");
    // /proc/self belongs to the process's effective uid.
    if std::fs::metadata("/proc/self").map_or(true, |m| m.uid() != 0) {
        println!("cargo::rustc-cfg=not_root");
    }
}
