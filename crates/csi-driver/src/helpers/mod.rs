//! Pure functions for the rules drivers most often get wrong.

pub mod capacity;
pub mod confirm;
pub mod idempotency;
pub mod mutable;
pub mod paging;
pub mod publish;
pub mod stage;
pub mod topology;
