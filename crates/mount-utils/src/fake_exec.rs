//! [`FakeExec`]: a scripted [`Exec`] for tests.

use std::collections::VecDeque;
use std::sync::Mutex;

use crate::exec::{Exec, ExecError, ExecOutput};

/// A call recorded by [`FakeExec`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecCall {
    /// Program name as passed.
    pub program: String,
    /// Arguments.
    pub args: Vec<String>,
}

#[derive(Debug)]
struct Script {
    program: String,
    args: Option<Vec<String>>,
    result: Result<ExecOutput, ExecError>,
}

#[derive(Debug, Default)]
struct FakeExecState {
    calls: Vec<ExecCall>,
    scripts: VecDeque<Script>,
}

/// Scripted [`Exec`] for tests: records every call and answers from a
/// queue of expectations. Each call consumes the first queued response whose
/// program (and arguments, if given) match; a call with none is an
/// [`ExecError::Unexpected`].
///
/// ```
/// use mount_utils::{Exec, ExecOutput, FakeExec};
/// let exec = FakeExec::new();
/// exec.expect("blkid", ExecOutput::exit(2, ""));
/// exec.expect_args("mkfs.ext4", &["-F", "-m0", "/dev/sdb"], ExecOutput::ok(""));
/// assert_eq!(exec.run("blkid", &["-p", "/dev/sdb"]).unwrap().code, Some(2));
/// assert!(exec.run("mkfs.ext4", &["-F", "-m0", "/dev/sdb"]).unwrap().success());
/// assert_eq!(exec.calls().len(), 2);
/// assert_eq!(exec.pending(), 0);
/// ```
#[derive(Debug, Default)]
pub struct FakeExec {
    state: Mutex<FakeExecState>,
}

impl FakeExec {
    /// No scripted responses yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn push(&self, program: &str, args: Option<&[&str]>, result: Result<ExecOutput, ExecError>) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.scripts.push_back(Script {
            program: program.into(),
            args: args.map(|a| a.iter().map(|s| s.to_string()).collect()),
            result,
        });
    }

    /// Answers the next call of `program` (any arguments) with `output`.
    pub fn expect(&self, program: &str, output: ExecOutput) {
        self.push(program, None, Ok(output));
    }

    /// Answers the next call of `program` with exactly `args` with `output`.
    pub fn expect_args(&self, program: &str, args: &[&str], output: ExecOutput) {
        self.push(program, Some(args), Ok(output));
    }

    /// Fails the next call of `program` with `error`.
    pub fn expect_error(&self, program: &str, error: ExecError) {
        self.push(program, None, Err(error));
    }

    /// All calls so far, oldest first.
    pub fn calls(&self) -> Vec<ExecCall> {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .calls
            .clone()
    }

    /// Scripted responses not consumed yet.
    pub fn pending(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .scripts
            .len()
    }
}

impl Exec for FakeExec {
    fn run(&self, program: &str, args: &[&str]) -> Result<ExecOutput, ExecError> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        st.calls.push(ExecCall {
            program: program.into(),
            args: args.clone(),
        });
        let pos = st
            .scripts
            .iter()
            .position(|s| s.program == program && s.args.as_ref().is_none_or(|a| *a == args));
        match pos.and_then(|i| st.scripts.remove(i)) {
            Some(script) => script.result,
            None => Err(ExecError::Unexpected {
                program: program.into(),
                args,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_exec_matches_in_order_and_by_args() {
        let f = FakeExec::new();
        f.expect_args("tool", &["b"], ExecOutput::ok("B"));
        f.expect("tool", ExecOutput::ok("any"));
        assert_eq!(f.run("tool", &["a"]).unwrap().stdout, "any");
        assert_eq!(f.run("tool", &["b"]).unwrap().stdout, "B");
        assert!(matches!(
            f.run("tool", &[]),
            Err(ExecError::Unexpected { .. })
        ));
        f.expect_error(
            "gone",
            ExecError::NotFound {
                program: "gone".into(),
            },
        );
        assert!(matches!(
            f.run("gone", &[]),
            Err(ExecError::NotFound { .. })
        ));
        assert_eq!(f.calls().len(), 4);
        assert_eq!(f.calls()[1].args, vec!["b".to_string()]);
    }
}
