//! Issue 20's size proofs, so a change that breaks them fails the test command:
//! - cloud-block's driver, not counting the provider (its process and its HTTP client library,
//!   as godo is DigitalOcean's: `src/provider`, `src/client`, `src/cloud`, `src/api.rs`), is at
//!   most 500 lines, flags and main included, counted as
//!   `wc -l src/driver/*.rs src/bin/cloud-block.rs`;
//! - the workspace README's network-filesystem walkthrough is Rust that `cargo test` compiles
//!   (the README is the root crate's documentation), not text.

use std::path::{Path, PathBuf};

const BUDGET: usize = 500;

/// Newlines, as `wc -l` counts them.
fn lines(file: &Path) -> usize {
    let text = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    text.iter().filter(|b| **b == b'\n').count()
}

#[test]
fn the_driver_without_the_provider_is_at_most_500_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("src/driver"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .collect();
    files.push(root.join("src/bin/cloud-block.rs"));
    let counted: Vec<(String, usize)> = (files.iter())
        .map(|f| (f.display().to_string(), lines(f)))
        .collect();
    let total: usize = counted.iter().map(|(_, n)| n).sum();
    assert!(total <= BUDGET, "{total} lines > {BUDGET}: {counted:?}");
}

#[test]
fn the_network_filesystem_walkthrough_is_compiled() {
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    let text = std::fs::read_to_string(&readme).unwrap();
    let start = (text.find("### Walkthrough: a network filesystem"))
        .expect("the README has the network-filesystem walkthrough");
    // To the next heading of its level or above.
    let section = (text[start..].lines().enumerate())
        .take_while(|(i, l)| *i == 0 || !(l.starts_with("## ") || l.starts_with("### ")))
        .map(|(_, l)| l);
    let fences: Vec<&str> = section
        .filter(|l| l.starts_with("```") && l.len() > 3)
        .collect();
    assert!(!fences.is_empty(), "no code in the walkthrough");
    for fence in fences {
        let ok = fence.starts_with("```rust") && !fence.contains("ignore");
        assert!(
            ok,
            "{fence}: the walkthrough's code must compile as a doc test"
        );
    }
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../src/lib.rs");
    let lib = std::fs::read_to_string(lib).unwrap();
    assert!(
        lib.contains("include_str!(\"../README.md\")"),
        "the README is the root crate's docs"
    );
}
