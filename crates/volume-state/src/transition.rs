//! Pure state transitions after an operation, decided by the error kind.
//!
//! Every state the reconciler tracks (attachment, device mount, pod mount) is
//! a [`Progress`]: absent, uncertain or done. Set-up operations (attach,
//! stage, publish) and tear-down operations (detach, unstage, unpublish) each
//! have one transition function, tested exhaustively below.

use crate::error::ErrorKind;

/// How far a set-up step got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Progress {
    /// Not done (not attached / not mounted).
    Absent,
    /// Might be done; must be redone before use and undone before forgetting.
    Uncertain,
    /// Done.
    Done,
}

/// The result of an operation, as far as state is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StepOutcome {
    /// The call succeeded.
    Succeeded,
    /// The call failed with this kind.
    Failed(ErrorKind),
}

impl StepOutcome {
    /// All outcomes, for exhaustive tests.
    pub const ALL: [StepOutcome; 4] = [
        StepOutcome::Succeeded,
        StepOutcome::Failed(ErrorKind::Final),
        StepOutcome::Failed(ErrorKind::Uncertain),
        StepOutcome::Failed(ErrorKind::Transient),
    ];

    /// The outcome of a plugin result.
    pub fn of<T>(result: &Result<T, crate::PluginError>) -> Self {
        match result {
            Ok(_) => StepOutcome::Succeeded,
            Err(e) => StepOutcome::Failed(e.kind),
        }
    }
}

/// State after a set-up operation (attach, verify-attached, stage, publish).
///
/// - success → done;
/// - once done, failures (e.g. a remount) never downgrade;
/// - a final error means the driver finished without doing it, so an
///   uncertain state becomes absent;
/// - an uncertain error turns absent into uncertain;
/// - a transient error changes nothing.
pub fn after_setup(previous: Progress, outcome: StepOutcome) -> Progress {
    match (previous, outcome) {
        (_, StepOutcome::Succeeded) => Progress::Done,
        (Progress::Done, StepOutcome::Failed(_)) => Progress::Done,
        (state, StepOutcome::Failed(ErrorKind::Transient)) => state,
        (_, StepOutcome::Failed(ErrorKind::Final)) => Progress::Absent,
        (_, StepOutcome::Failed(ErrorKind::Uncertain)) => Progress::Uncertain,
    }
}

/// State after a tear-down operation (detach, unstage, unpublish).
///
/// - success → absent;
/// - a transient error changes nothing (the call did not start);
/// - any other failure → uncertain: the tear-down may be half done, so a new
///   user must run the set-up again (kubelet does the same).
pub fn after_teardown(previous: Progress, outcome: StepOutcome) -> Progress {
    match (previous, outcome) {
        (_, StepOutcome::Succeeded) => Progress::Absent,
        (state, StepOutcome::Failed(ErrorKind::Transient)) => state,
        (_, StepOutcome::Failed(ErrorKind::Final | ErrorKind::Uncertain)) => Progress::Uncertain,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ErrorKind::{Final, Transient};
    use Progress::{Absent, Done};

    const STATES: [Progress; 3] = [Absent, Progress::Uncertain, Done];

    #[test]
    fn setup_transitions_exhaustive() {
        let expected = |p: Progress, o: StepOutcome| match (p, o) {
            (Absent, StepOutcome::Succeeded) => Done,
            (Absent, StepOutcome::Failed(Final)) => Absent,
            (Absent, StepOutcome::Failed(ErrorKind::Uncertain)) => Progress::Uncertain,
            (Absent, StepOutcome::Failed(Transient)) => Absent,
            (Progress::Uncertain, StepOutcome::Succeeded) => Done,
            (Progress::Uncertain, StepOutcome::Failed(Final)) => Absent,
            (Progress::Uncertain, StepOutcome::Failed(ErrorKind::Uncertain)) => Progress::Uncertain,
            (Progress::Uncertain, StepOutcome::Failed(Transient)) => Progress::Uncertain,
            (Done, _) => Done,
        };
        let mut cases = 0;
        for p in STATES {
            for o in StepOutcome::ALL {
                assert_eq!(after_setup(p, o), expected(p, o), "{p:?} {o:?}");
                cases += 1;
            }
        }
        assert_eq!(cases, 12);
    }

    #[test]
    fn teardown_transitions_exhaustive() {
        let expected = |p: Progress, o: StepOutcome| match (p, o) {
            (_, StepOutcome::Succeeded) => Absent,
            (p, StepOutcome::Failed(Transient)) => p,
            (_, StepOutcome::Failed(_)) => Progress::Uncertain,
        };
        for p in STATES {
            for o in StepOutcome::ALL {
                assert_eq!(after_teardown(p, o), expected(p, o), "{p:?} {o:?}");
            }
        }
        assert_eq!(
            after_teardown(Done, StepOutcome::Failed(Final)),
            Progress::Uncertain
        );
        assert_eq!(after_teardown(Done, StepOutcome::Failed(Transient)), Done);
    }

    #[test]
    fn remount_failure_never_downgrades() {
        for kind in [Final, ErrorKind::Uncertain, Transient] {
            assert_eq!(after_setup(Done, StepOutcome::Failed(kind)), Done);
        }
    }
}
