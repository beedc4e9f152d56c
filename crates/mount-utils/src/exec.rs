//! Running external tools (`mkfs`, `fsck`, `blkid`, `resize2fs`, ...)
//! behind the [`Exec`] trait, so code using them can be tested with
//! `FakeExec` (feature `testing`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

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
    /// `FakeExec` got a call nobody scripted.
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
}
