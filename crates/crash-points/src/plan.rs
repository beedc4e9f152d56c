//! What the environment asks for, and what the trace says.

use std::fmt;
use std::io;
use std::path::Path;
use std::str::FromStr;

/// The variable naming the effect to crash at: a [`CrashPlan`].
pub const CRASH_AT_ENV: &str = "CSI_KIT_CRASH_AT";

/// The variable naming the file each effect's number and kind are appended to.
pub const CRASH_TRACE_ENV: &str = "CSI_KIT_CRASH_TRACE";

/// Whether the process dies before its effect or just after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum When {
    /// The effect is not made.
    Before,
    /// The effect is made, its caller never learns it was.
    After,
}

/// Where a process crashes: `<n>` or `<n>:before` (before effect n, the
/// first being 1) or `<n>:after`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CrashPlan {
    /// The effect's number, from 1.
    pub step: u64,
    /// Before or after it.
    pub when: When,
}

/// A [`CrashPlan`] that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The step is not a number from 1.
    #[error("{CRASH_AT_ENV}: step {0:?} is not a number from 1")]
    Step(String),
    /// The suffix is neither `before` nor `after`.
    #[error("{CRASH_AT_ENV}: {0:?} is neither before nor after")]
    When(String),
}

impl FromStr for CrashPlan {
    type Err = PlanError;

    fn from_str(s: &str) -> Result<Self, PlanError> {
        let (step, when) = s.split_once(':').unwrap_or((s, "before"));
        let when = match when {
            "before" => When::Before,
            "after" => When::After,
            other => return Err(PlanError::When(other.to_owned())),
        };
        match step.parse::<u64>() {
            Ok(step) if step > 0 => Ok(CrashPlan { step, when }),
            _ => Err(PlanError::Step(step.to_owned())),
        }
    }
}

impl fmt::Display for CrashPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let when = match self.when {
            When::Before => "before",
            When::After => "after",
        };
        write!(f, "{}:{when}", self.step)
    }
}

/// One line of a trace, `<step> <kind>`: an effect's number and kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEntry {
    /// Its number, from 1.
    pub step: u64,
    /// What it was: `mount`, `unmount`, `loop-attach`, `exec mkfs.ext4`,
    /// `write`, `fsync`, `rename`, ...
    pub kind: String,
}

impl fmt::Display for TraceEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.step, self.kind)
    }
}

/// The effects a process traced to `path`, in order (an absent file: none).
/// Lines that do not parse (a line cut short) are skipped.
pub fn read_trace(path: &Path) -> io::Result<Vec<TraceEntry>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    Ok(text
        .lines()
        .filter_map(|l| {
            let (n, kind) = l.split_once(' ')?;
            Some(TraceEntry {
                step: n.parse().ok()?,
                kind: kind.to_owned(),
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_read_back_from_their_text_and_bad_ones_name_the_part() {
        for text in ["7:before", "7:after"] {
            assert_eq!(text.parse::<CrashPlan>().unwrap().to_string(), text);
        }
        assert_eq!(
            "12".parse::<CrashPlan>().unwrap(),
            CrashPlan {
                step: 12,
                when: When::Before
            }
        );
        assert_eq!("0".parse::<CrashPlan>(), Err(PlanError::Step("0".into())));
        assert_eq!(
            "x:after".parse::<CrashPlan>(),
            Err(PlanError::Step("x".into()))
        );
        assert_eq!(
            "3:during".parse::<CrashPlan>(),
            Err(PlanError::When("during".into()))
        );
    }

    #[test]
    fn a_trace_reads_back_skipping_a_cut_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trace");
        assert!(read_trace(&path).unwrap().is_empty());
        let text = "1 mount\n2 exec mkfs.ext4\n3";
        std::fs::write(&path, text).unwrap();
        let entries = read_trace(&path).unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[1].to_string(), "2 exec mkfs.ext4");
    }
}
