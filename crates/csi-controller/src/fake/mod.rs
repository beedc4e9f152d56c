//! Fakes for tests of the service and of drivers built on it (feature
//! `testing`): [`FakeControllerBackend`], local data in memory, and
//! [`FakeProvider`], a provider that is the source of truth, with
//! injectable errors and actions that take (fake) time.

mod local;
mod provider;

pub use local::{FakeControllerBackend, FakeData, Offers};
pub use provider::FakeProvider;
