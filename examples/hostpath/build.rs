//! Link options of the shipped (release-based) binaries.

include!("link_options.rs");
