//! Running external tools (`mkfs`, `fsck`, `blkid`, `resize2fs`, ...)
//! behind the [`Exec`] trait, so code using them can be tested with
//! `FakeExec` (feature `testing`).

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};

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

    /// Starts `program` with `args` and returns while it runs, for a caller
    /// with something else to do meanwhile: [`Started::wait`] gives what
    /// [`run`](Self::run) would have. Default: it runs to its end here (a
    /// wrapper that fakes or counts commands sees one `run`, in order).
    fn start(&self, program: &str, args: &[&str]) -> Started {
        Started(Some(Run::Done(self.run(program, args))))
    }
}

/// A command [`Exec::start`] started. Dropped without
/// [`wait`](Started::wait), its process is killed and reaped.
#[derive(Debug)]
pub struct Started(Option<Run>);

#[derive(Debug)]
enum Run {
    Done(Result<ExecOutput, ExecError>),
    Child(String, std::process::Child),
}

impl Started {
    /// Waits for the command to end; its output, or why it could not run.
    pub fn wait(mut self) -> Result<ExecOutput, ExecError> {
        match self.0.take() {
            Some(Run::Done(result)) => result,
            Some(Run::Child(program, child)) => captured(&program, child.wait_with_output()),
            None => unreachable!("a started command is waited for once"),
        }
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        if let Some(Run::Child(_, mut child)) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn captured(
    program: &str,
    out: std::io::Result<std::process::Output>,
) -> Result<ExecOutput, ExecError> {
    let out = out.map_err(|e| ExecError::Io {
        program: program.into(),
        message: e.to_string(),
    })?;
    Ok(ExecOutput {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// [`Exec`] with `std::process::Command`.
///
/// Bare program names are looked up in `PATH` and then in `/usr/sbin` and
/// `/sbin`, where the filesystem tools live but which are often not in a
/// container's `PATH`. Where a name was found is remembered for as long as
/// `PATH` stays the same and the program is still there. Commands run with
/// `LC_ALL=C` (their output is parsed) and standard input closed.
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

/// Where a bare program name was found, for the `PATH` it was looked up in:
/// a lookup is a stat of every directory before the one that holds it, and a
/// node plugin runs `blkid` and `mkfs` on every first stage.
type Found = HashMap<(OsString, String), PathBuf>;

fn found() -> std::sync::MutexGuard<'static, Found> {
    static FOUND: OnceLock<Mutex<Found>> = OnceLock::new();
    let found = FOUND.get_or_init(Mutex::default);
    found
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The cache's key for a bare program name under the current `PATH`.
fn found_key(program: &str) -> (OsString, String) {
    (
        std::env::var_os("PATH").unwrap_or_default(),
        program.to_owned(),
    )
}

impl SystemExec {
    /// The program's path, from the cache when it was found before.
    fn locate(program: &str) -> Result<PathBuf, ExecError> {
        let bare = !program.contains('/');
        if bare && let Some(path) = found().get(&found_key(program)) {
            return Ok(path.clone());
        }
        let path = Self::find_program(program).ok_or_else(|| ExecError::NotFound {
            program: program.into(),
        })?;
        if bare {
            found().insert(found_key(program), path.clone());
        }
        Ok(path)
    }

    fn command(program: &str, args: &[&str]) -> Result<Command, ExecError> {
        let exe = Self::locate(program)?;
        // Arguments can carry anything a caller passes (labels, keys, option
        // strings): count them, never log them.
        tracing::debug!(program, args = args.len(), "exec");
        let mut command = Command::new(exe);
        command.args(args).env("LC_ALL", "C").stdin(Stdio::null());
        Ok(command)
    }

    /// Runs `spawn` on the command; when the program is no longer where it
    /// was found (moved or removed), forgets that place and looks again.
    fn spawned<T>(
        program: &str,
        args: &[&str],
        spawn: impl Fn(&mut Command) -> std::io::Result<T>,
    ) -> Result<std::io::Result<T>, ExecError> {
        match spawn(&mut Self::command(program, args)?) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                found().remove(&found_key(program));
                Ok(spawn(&mut Self::command(program, args)?))
            }
            result => Ok(result),
        }
    }
}

impl Exec for SystemExec {
    fn run(&self, program: &str, args: &[&str]) -> Result<ExecOutput, ExecError> {
        captured(program, Self::spawned(program, args, Command::output)?)
    }

    fn start(&self, program: &str, args: &[&str]) -> Started {
        let spawned = Self::spawned(program, args, |command| {
            command
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
        })
        .and_then(|spawned| {
            spawned.map_err(|e| ExecError::Io {
                program: program.into(),
                message: e.to_string(),
            })
        });
        Started(Some(match spawned {
            Ok(child) => Run::Child(program.to_owned(), child),
            Err(e) => Run::Done(Err(e)),
        }))
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
    fn a_program_no_longer_where_it_was_found_is_looked_up_again() {
        let key = || found_key("sh");
        let gone = PathBuf::from("/nonexistent/csi-kit-moved/sh");
        for start in [false, true] {
            found().insert(key(), gone.clone());
            let out = if start {
                SystemExec.start("sh", &["-c", "echo moved"]).wait()
            } else {
                SystemExec.run("sh", &["-c", "echo moved"])
            };
            assert_eq!(out.unwrap().stdout, "moved\n");
            let now = found().get(&key()).cloned().unwrap();
            assert_ne!(now, gone);
            assert!(now.is_file(), "{}", now.display());
        }
        // Found once, not searched for again: a name no directory holds
        // runs what the cache says.
        let alias = found_key("csi-kit-no-such-tool");
        found().insert(alias.clone(), SystemExec::find_program("sh").unwrap());
        let out = SystemExec.run("csi-kit-no-such-tool", &["-c", "echo cached"]);
        found().remove(&alias);
        assert_eq!(out.unwrap().stdout, "cached\n");
    }

    #[test]
    fn a_started_command_runs_while_its_caller_goes_on() {
        let e = SystemExec::new();
        let t = std::time::Instant::now();
        let started = e.start("sh", &["-c", "sleep 0.3; echo hi; exit 3"]);
        assert!(
            t.elapsed() < std::time::Duration::from_millis(250),
            "not waited for"
        );
        let out = started.wait().unwrap();
        assert!(t.elapsed() >= std::time::Duration::from_millis(300));
        assert_eq!((out.code, out.stdout.as_str()), (Some(3), "hi\n"));
        let missing = e.start("definitely-not-a-program-xyz", &[]);
        assert!(matches!(missing.wait(), Err(ExecError::NotFound { .. })));
        // Dropped unwaited: killed and reaped, not waited for.
        let t = std::time::Instant::now();
        drop(e.start("sleep", &["5"]));
        assert!(t.elapsed() < std::time::Duration::from_secs(4));
    }
}
