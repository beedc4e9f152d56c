// The shipped binaries are linked as hostpath's are: one script for both
// (a manifest's `build` must name a file inside its own package).
include!("../hostpath/build.rs");
