// The build script of hostpath and loop-block (each includes it: a
// manifest's build script must be a file inside its own package).
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=../hostpath/link_options.rs");
    let gnu = std::env::var("CARGO_CFG_TARGET_ENV").is_ok_and(|env| env == "gnu");
    let release = std::env::var("PROFILE").is_ok_and(|profile| profile == "release");
    if gnu && release {
        // Relative relocations as a bitmap (DT_RELR, glibc 2.36 and later)
        // instead of 24 bytes each: the loader reads every one of them at
        // start, so as RELA they stayed resident for the process's life.
        // The shipped build (scripts/build-dist.sh) is a static-pie, which
        // relocates itself at start from the same table (glibc's
        // _dl_relocate_static_pie reads DT_RELR too).
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}
