//! Processes a target needs beside its driver (a cloud provider, the
//! storage itself): started before the driver, never killed at its crash,
//! stopped after the run.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};

use crash_points::{CRASH_AT_ENV, CRASH_TRACE_ENV};

use super::process::{Layout, Process, START_WAIT};

/// A process started beside the driver for each run, in its own directory
/// ([`Layout::auxiliary_dir`]). It is the storage the driver talks to: it
/// outlives every crash of the driver, and is stopped (SIGTERM) once the
/// run is checked.
#[derive(Debug, Clone)]
pub struct Auxiliary {
    /// Its name: its directory, its log and its address are found by it.
    pub name: &'static str,
    /// The program (not armed: only the driver crashes).
    pub program: PathBuf,
    /// Its flags for a run's layout (its directory is
    /// [`Layout::auxiliary_dir`]).
    pub args: fn(&Layout) -> Vec<String>,
    /// Variables it is started with (a test's token, never a real secret).
    pub env: &'static [(&'static str, &'static str)],
    /// How the first line it prints on stdout begins once it serves; the
    /// rest of that line is its address ([`Layout::address`]).
    pub ready_prefix: &'static str,
}

/// A started auxiliary process.
pub(crate) struct AuxiliaryProcess {
    pub(crate) name: &'static str,
    process: Process,
}

impl AuxiliaryProcess {
    /// Starts `aux` for `layout` and waits for its ready line: the process
    /// and its address.
    pub(crate) async fn start(aux: &Auxiliary, layout: &Layout) -> Result<(Self, String), String> {
        let dir = layout.auxiliary_dir(aux.name);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let log = layout.auxiliary_log(aux.name);
        let log = File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let mut child = Command::new(&aux.program)
            .args((aux.args)(layout))
            .envs(aux.env.iter().copied())
            .env_remove(CRASH_AT_ENV)
            .env_remove(CRASH_TRACE_ENV)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", aux.program.display()))?;
        let stdout = child.stdout.take();
        let mut started = AuxiliaryProcess {
            name: aux.name,
            process: Process::from_child(child),
        };
        let stdout = stdout.ok_or("no stdout")?;
        // A blocking read on the runtime's blocking pool; a process that
        // never prints is killed by the drop, which ends the read.
        let line = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            BufReader::new(stdout).read_line(&mut line).map(|_| line)
        });
        let line = match tokio::time::timeout(START_WAIT, line).await {
            Ok(Ok(Ok(line))) => line,
            Ok(Ok(Err(e))) => return Err(format!("{}: reading its stdout: {e}", aux.name)),
            Ok(Err(e)) => return Err(format!("{}: {e}", aux.name)),
            Err(_) => return Err(format!("{}: not ready after {START_WAIT:?}", aux.name)),
        };
        match line.trim_end().strip_prefix(aux.ready_prefix) {
            Some(address) => Ok((started, address.to_owned())),
            None => {
                let status = started.exited();
                Err(format!(
                    "{} printed {line:?}, not {:?} (exit: {status:?})",
                    aux.name, aux.ready_prefix
                ))
            }
        }
    }

    /// Its exit status if it has ended.
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        self.process.exited()
    }

    /// Stops it with SIGTERM, SIGKILL after 10 s.
    pub(crate) async fn stop(self) {
        self.process.stop().await;
    }
}
