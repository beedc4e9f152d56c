//! The scenario tests' world: desired and actual state, the fake plugin and
//! a fake clock around one reconciler.

use std::sync::Arc;

use volume_state::{FakeClock, FakeVolumePlugin};

pub type Plugin = FakeVolumePlugin<String, String>;

pub struct Env<D, A, R> {
    pub desired: Arc<D>,
    pub actual: Arc<A>,
    pub plugin: Arc<Plugin>,
    pub clock: FakeClock,
    pub reconciler: Arc<R>,
}

impl<D, A, R> Env<D, A, R> {
    /// `reconciler` builds the reconciler over the shared states and plugin;
    /// the caller attaches `clock` to it.
    pub fn new(
        desired: D,
        actual: A,
        reconciler: impl FnOnce(Arc<D>, Arc<A>, Arc<Plugin>, FakeClock) -> R,
    ) -> Self {
        let desired = Arc::new(desired);
        let actual = Arc::new(actual);
        let plugin = Arc::new(Plugin::new());
        let clock = FakeClock::new();
        let reconciler = Arc::new(reconciler(
            desired.clone(),
            actual.clone(),
            plugin.clone(),
            clock.clone(),
        ));
        Env {
            desired,
            actual,
            plugin,
            clock,
            reconciler,
        }
    }
}
