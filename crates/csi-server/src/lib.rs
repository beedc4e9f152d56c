//! Trait-based scaffolding for CSI plugins: serving, validation, capability
//! gating, locking, tracing and shutdown around a driver's storage logic.
