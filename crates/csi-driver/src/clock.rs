//! Time as a seam: what retries, backoff and deadlines read and wait on.
//! Drivers use [`SystemClock`]; tests and fault-injecting simulations use
//! `FakeClock` (feature `testing`), whose sleeps return at once and move
//! its time forward, so no test waits for real time.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

/// A sleep in progress.
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Where "now" comes from and how to wait.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current instant.
    fn now(&self) -> Instant;
    /// Waits `duration`.
    fn sleep(&self, duration: Duration) -> Sleep;
}

/// The real clock: `Instant::now` and tokio's timer.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        Box::pin(tokio::time::sleep(duration))
    }
}

/// The duration of a `grpc-timeout` header value (at most 8 digits and a
/// unit: `H`, `M`, `S`, `m`, `u` or `n`), as gRPC's HTTP/2 protocol
/// defines it; `None` when malformed.
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let unit = value.chars().last()?;
    let digits = &value[..value.len() - unit.len_utf8()];
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        'H' => Duration::from_secs(n * 3600),
        'M' => Duration::from_secs(n * 60),
        'S' => Duration::from_secs(n),
        'm' => Duration::from_millis(n),
        'u' => Duration::from_micros(n),
        'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(feature = "testing")]
pub use fake::FakeClock;

#[cfg(feature = "testing")]
mod fake {
    use super::*;
    use std::sync::Mutex;

    /// A clock that never waits: a sleep moves its time forward and
    /// returns at once. Every sleep is recorded, so a test can assert the
    /// backoff it chose (e.g. that a Retry-After was honoured).
    #[derive(Debug)]
    pub struct FakeClock {
        start: Instant,
        state: Mutex<State>,
    }

    #[derive(Debug, Default)]
    struct State {
        elapsed: Duration,
        sleeps: Vec<Duration>,
    }

    impl Default for FakeClock {
        fn default() -> Self {
            Self::new()
        }
    }

    impl FakeClock {
        /// A clock whose time starts at the real now.
        pub fn new() -> Self {
            Self {
                start: Instant::now(),
                state: Mutex::default(),
            }
        }

        /// Moves time forward without a sleep.
        pub fn advance(&self, by: Duration) {
            self.lock().elapsed += by;
        }

        /// Time passed since the clock was made.
        pub fn elapsed(&self) -> Duration {
            self.lock().elapsed
        }

        /// Every sleep so far, in order.
        pub fn sleeps(&self) -> Vec<Duration> {
            self.lock().sleeps.clone()
        }

        fn lock(&self) -> std::sync::MutexGuard<'_, State> {
            self.state.lock().unwrap_or_else(|e| e.into_inner())
        }
    }

    impl Clock for FakeClock {
        fn now(&self) -> Instant {
            self.start + self.lock().elapsed
        }

        fn sleep(&self, duration: Duration) -> Sleep {
            let mut state = self.lock();
            state.elapsed += duration;
            state.sleeps.push(duration);
            Box::pin(std::future::ready(()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_every_unit_and_reject_the_malformed() {
        assert_eq!(parse_grpc_timeout("10S"), Some(Duration::from_secs(10)));
        assert_eq!(parse_grpc_timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse_grpc_timeout("7u"), Some(Duration::from_micros(7)));
        assert_eq!(parse_grpc_timeout("9n"), Some(Duration::from_nanos(9)));
        for bad in ["", "S", "10", "123456789S", "1.5S", "-1S", "10s", "10é"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }
}
