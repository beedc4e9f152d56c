//! Desired/actual-state-of-world caches, an operation gate with per-key
//! exponential backoff, and a reconciler that drives volumes through
//! attach, stage and publish and back.
