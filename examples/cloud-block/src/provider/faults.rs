//! The fault mode: what goes wrong on purpose, set by flags at start and
//! replaced at run time with `PUT /admin/faults`.

use serde::{Deserialize, Serialize};

/// The fault knobs. Rates are fractions of API requests (0 to 1); the admin
/// endpoint and `/healthz` are never faulted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clap::Args)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// Added to every API answer, in milliseconds.
    #[arg(long = "fault-latency-ms", default_value_t = 0)]
    pub latency_ms: u64,
    /// Answered 503 before anything is done.
    #[arg(long = "fault-error-rate", default_value_t = 0.0)]
    pub error_rate: f64,
    /// Carried out, then answered 503 anyway (the answer is "lost").
    #[arg(long = "fault-lost-reply-rate", default_value_t = 0.0)]
    pub lost_reply_rate: f64,
    /// Answered 429 with `Retry-After`.
    #[arg(long = "fault-throttle-rate", default_value_t = 0.0)]
    pub throttle_rate: f64,
    /// The `Retry-After` of a 429, in seconds.
    #[arg(long = "fault-retry-after-secs", default_value_t = 1)]
    pub retry_after_secs: u64,
    /// Actions stay `in-progress` this long before they do anything.
    #[arg(long = "fault-stuck-action-secs", default_value_t = 0)]
    pub stuck_action_secs: u64,
    /// Actions that end `errored` (changing nothing).
    #[arg(long = "fault-action-error-rate", default_value_t = 0.0)]
    pub action_error_rate: f64,
    /// The next this many API answers are 200 with a body that is not JSON.
    #[arg(long = "fault-garbage-next", default_value_t = 0)]
    pub garbage_next: u32,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            latency_ms: 0,
            error_rate: 0.0,
            lost_reply_rate: 0.0,
            throttle_rate: 0.0,
            retry_after_secs: 1,
            stuck_action_secs: 0,
            action_error_rate: 0.0,
            garbage_next: 0,
        }
    }
}

impl Faults {
    /// Checks every rate is a fraction; the error names the knob.
    pub fn validate(&self) -> Result<(), String> {
        for (name, rate) in [
            ("error_rate", self.error_rate),
            ("lost_reply_rate", self.lost_reply_rate),
            ("throttle_rate", self.throttle_rate),
            ("action_error_rate", self.action_error_rate),
        ] {
            if !(0.0..=1.0).contains(&rate) {
                return Err(format!("{name}: must be between 0 and 1, not {rate}"));
            }
        }
        Ok(())
    }
}

/// What to do with one API request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Answer 200 with a body that is not JSON.
    Garbage,
    /// Answer 429 with this `Retry-After` (seconds).
    Throttle(u64),
    /// Answer 503 without doing anything.
    Fail,
    /// Do it; `lose_reply` answers 503 afterwards.
    Serve {
        /// Replace the answer with a 503.
        lose_reply: bool,
    },
}

/// The knobs and the seeded randomness that applies them.
#[derive(Debug)]
pub struct FaultState {
    faults: Faults,
    rng: fastrand::Rng,
}

impl FaultState {
    /// Faults drawn from a generator seeded with `seed` (reproducible runs).
    pub fn new(faults: Faults, seed: u64) -> Self {
        FaultState {
            faults,
            rng: fastrand::Rng::with_seed(seed),
        }
    }

    /// The knobs now.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// Replaces the knobs.
    pub fn set(&mut self, faults: Faults) {
        self.faults = faults;
    }

    fn hit(&mut self, rate: f64) -> bool {
        rate > 0.0 && self.rng.f64() < rate
    }

    /// Decides the fate of one API request.
    pub fn judge(&mut self) -> Verdict {
        if self.faults.garbage_next > 0 {
            self.faults.garbage_next -= 1;
            return Verdict::Garbage;
        }
        if self.hit(self.faults.throttle_rate) {
            return Verdict::Throttle(self.faults.retry_after_secs);
        }
        if self.hit(self.faults.error_rate) {
            return Verdict::Fail;
        }
        let lose_reply = self.hit(self.faults.lost_reply_rate);
        Verdict::Serve { lose_reply }
    }

    /// Whether an action that is about to do its work errs instead.
    pub fn action_fails(&mut self) -> bool {
        self.hit(self.faults.action_error_rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_counted_and_rates_are_checked() {
        let mut state = FaultState::new(
            Faults {
                garbage_next: 1,
                throttle_rate: 1.0,
                retry_after_secs: 3,
                ..Faults::default()
            },
            7,
        );
        assert_eq!(state.judge(), Verdict::Garbage);
        assert_eq!(state.judge(), Verdict::Throttle(3));
        state.set(Faults::default());
        assert_eq!(state.judge(), Verdict::Serve { lose_reply: false });
        let bad = Faults {
            error_rate: 1.5,
            ..Faults::default()
        };
        assert!(bad.validate().unwrap_err().starts_with("error_rate"));
    }

    #[test]
    fn a_partial_admin_body_keeps_the_defaults() {
        let f: Faults = serde_json::from_str(r#"{"latency_ms": 5}"#).unwrap();
        assert_eq!((f.latency_ms, f.retry_after_secs), (5, 1));
        assert!(serde_json::from_str::<Faults>(r#"{"latency": 5}"#).is_err());
    }
}
