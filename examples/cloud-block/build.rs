//! Link options. The driver's segments are 2 MiB apart in release-based
//! builds, so its code can move onto huge pages at start
//! (`csi_server::flags::move_code_to_huge_pages`, called by its `main`);
//! the tests' always, so `tests/huge_code.rs` moves its own code.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let linux = std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux");
    let release = std::env::var("PROFILE").is_ok_and(|profile| profile == "release");
    let apart = "-Wl,-z,max-page-size=0x200000";
    if linux {
        println!("cargo:rustc-link-arg-tests={apart}");
        if release {
            println!("cargo:rustc-link-arg-bins={apart}");
            // The floor driver of the bench (examples/cloud-block-floor.rs)
            // moves its code as the driver does.
            println!("cargo:rustc-link-arg-examples={apart}");
        }
    }
}
