//! Time source used for backoff and detach timeouts, so tests can control it.

use std::fmt::Debug;
use std::time::Instant;

/// A monotonic time source.
pub trait Clock: Debug + Send + Sync {
    /// The current instant.
    fn now(&self) -> Instant;
}

/// The real monotonic clock ([`Instant::now`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// The tokio clock (`tokio::time::Instant`), which follows a paused test
/// runtime's virtual time. Must be read inside a tokio runtime.
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioClock;

impl Clock for TokioClock {
    fn now(&self) -> Instant {
        tokio::time::Instant::now().into_std()
    }
}

#[cfg(feature = "testing")]
pub use fake::FakeClock;

#[cfg(feature = "testing")]
mod fake {
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use super::Clock;

    /// A clock that only moves when [`FakeClock::advance`] is called.
    ///
    /// Clones share the same time.
    #[derive(Debug, Clone)]
    pub struct FakeClock {
        now: Arc<Mutex<Instant>>,
    }

    impl FakeClock {
        /// A fake clock frozen at the current real instant.
        pub fn new() -> Self {
            Self {
                now: Arc::new(Mutex::new(Instant::now())),
            }
        }

        /// Moves the clock forward by `by`.
        pub fn advance(&self, by: Duration) {
            let mut now = self.now.lock().unwrap_or_else(|e| e.into_inner());
            *now += by;
        }
    }

    impl Default for FakeClock {
        fn default() -> Self {
            Self::new()
        }
    }

    impl Clock for FakeClock {
        fn now(&self) -> Instant {
            *self.now.lock().unwrap_or_else(|e| e.into_inner())
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn fake_clock_moves_only_when_advanced_and_clones_share_time() {
            let clock = FakeClock::new();
            let other = clock.clone();
            let start = clock.now();
            assert_eq!(clock.now(), start);
            other.advance(Duration::from_secs(3));
            assert_eq!(clock.now() - start, Duration::from_secs(3));
        }
    }
}
