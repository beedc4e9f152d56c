//! Link options of the shipped (release-based) binaries, as hostpath's.

include!("../hostpath/link_options.rs");
