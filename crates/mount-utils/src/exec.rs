//! Running external tools (`mkfs`, `fsck`, `blkid`, `resize2fs`, ...)
//! behind the [`Exec`] trait, so code using them can be tested with
//! [`FakeExec`].

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

/// Result of a finished command.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOutput {
    /// Exit code; `None` if the process was killed by a signal.
    pub code: Option<i32>,
    /// Standard output (lossy UTF-8).
    pub stdout: String,
    /// Standard error (lossy UTF-8).
    pub stderr: String,
}

impl ExecOutput {
    /// Exit code 0 with the given standard output.
    pub fn ok(stdout: impl Into<String>) -> Self {
        ExecOutput {
            code: Some(0),
            stdout: stdout.into(),
            stderr: String::new(),
        }
    }

    /// The given exit code and standard error.
    pub fn exit(code: i32, stderr: impl Into<String>) -> Self {
        ExecOutput {
            code: Some(code),
            stdout: String::new(),
            stderr: stderr.into(),
        }
    }

    /// Whether the command exited with code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// A command could not be run at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExecError {
    /// The program is not installed.
    #[error("{program}: command not found")]
    NotFound {
        /// Program name.
        program: String,
    },
    /// Spawning or waiting failed.
    #[error("running {program}: {message}")]
    Io {
        /// Program name.
        program: String,
        /// The OS error.
        message: String,
    },
    /// [`FakeExec`] got a call nobody scripted.
    #[error("unexpected command {program} {args:?}: no scripted response")]
    Unexpected {
        /// Program name.
        program: String,
        /// Arguments.
        args: Vec<String>,
    },
}

/// Runs a program to completion and captures its output.
pub trait Exec: Send + Sync {
    /// Runs `program` with `args`; a non-zero exit is an `Ok` output, only
    /// failing to run is an error.
    fn run(&self, program: &str, args: &[&str]) -> Result<ExecOutput, ExecError>;
}

/// [`Exec`] with `std::process::Command`.
///
/// Bare program names are looked up in `PATH` and then in `/usr/sbin` and
/// `/sbin`, where the filesystem tools live but which are often not in a
/// container's `PATH`. Commands run with `LC_ALL=C` (their output is parsed)
/// and standard input closed.
#[derive(Debug, Clone, Default)]
pub struct SystemExec;

impl SystemExec {
    /// A new executor.
    pub fn new() -> Self {
        SystemExec
    }

    /// Where `program` would be run from, if it is installed.
    pub fn find_program(program: &str) -> Option<PathBuf> {
        if program.contains('/') {
            return Path::new(program).is_file().then(|| PathBuf::from(program));
        }
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    }
}

impl Exec for SystemExec {
    fn run(&self, program: &str, args: &[&str]) -> Result<ExecOutput, ExecError> {
        let exe = Self::find_program(program).ok_or_else(|| ExecError::NotFound {
            program: program.into(),
        })?;
        // Arguments can carry anything a caller passes (labels, keys, option
        // strings): count them, never log them.
        tracing::debug!(program, args = args.len(), "exec");
        let out = Command::new(exe)
            .args(args)
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| ExecError::Io {
                program: program.into(),
                message: e.to_string(),
            })?;
        Ok(ExecOutput {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

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
    fn system_exec_runs_and_reports_exit_codes() {
        let e = SystemExec::new();
        let out = e
            .run("sh", &["-c", "echo hi; echo err >&2; exit 3"])
            .unwrap();
        assert_eq!(out.code, Some(3));
        assert_eq!(out.stdout, "hi\n");
        assert_eq!(out.stderr, "err\n");
        assert!(!out.success());
        assert!(matches!(
            e.run("definitely-not-a-program-xyz", &[]),
            Err(ExecError::NotFound { .. })
        ));
    }

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
