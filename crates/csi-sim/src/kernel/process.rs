//! The driver (or an auxiliary process) as a process: started with or
//! without a crash plan, waited on until it serves, found dead, stopped.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use crash_points::{CRASH_AT_ENV, CRASH_TRACE_ENV, CrashPlan};
use csi_client::{ClientOptions, CsiClient, Endpoint};
use csi_proto::v1::ProbeRequest;

/// How long a start may take before the run counts it as never serving.
pub(crate) const START_WAIT: Duration = Duration::from_secs(20);

/// A started process: the driver, or an auxiliary one.
pub(crate) struct Process {
    child: Child,
}

/// Why a driver did not come to serve.
#[derive(Debug)]
pub(crate) enum NotServing {
    /// It died (the planned crash, or a failure).
    Died(ExitStatus),
    /// Something else: it could not be started, or it never got ready.
    Failed(String),
}

impl Process {
    /// Starts `program args` with `env`, its output appended to `log`,
    /// crashing at `plan` and tracing its effects to `trace` when given.
    pub(crate) fn spawn(
        program: &Path,
        args: &[String],
        env: &[(&str, &str)],
        log: &Path,
        plan: Option<CrashPlan>,
        trace: Option<&Path>,
    ) -> Result<Self, String> {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .envs(env.iter().copied())
            .env_remove(CRASH_AT_ENV)
            .env_remove(CRASH_TRACE_ENV)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        if let Some(plan) = plan {
            cmd.env(CRASH_AT_ENV, plan.to_string());
        }
        if let Some(trace) = trace {
            cmd.env(CRASH_TRACE_ENV, trace);
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("starting {}: {e}", program.display()))?;
        Ok(Process { child })
    }

    /// A child started otherwise, stopped and reaped as the driver is.
    pub(crate) fn from_child(child: Child) -> Self {
        Process { child }
    }

    /// A client once the driver serves and Probe says ready.
    pub(crate) async fn ready(&mut self, socket: &Path) -> Result<CsiClient, NotServing> {
        let endpoint = Endpoint::unix(socket).map_err(|e| NotServing::Failed(e.to_string()))?;
        let deadline = tokio::time::Instant::now() + START_WAIT;
        let options = ClientOptions {
            connect_timeout: Duration::from_secs(1),
            ..ClientOptions::default()
        };
        loop {
            if let Some(status) = self.exited() {
                return Err(NotServing::Died(status));
            }
            if tokio::time::Instant::now() > deadline {
                return Err(NotServing::Failed(format!(
                    "not ready after {START_WAIT:?}"
                )));
            }
            if let Ok(client) = CsiClient::connect_with(endpoint.clone(), options.clone()).await
                && let Ok(p) = client.probe(ProbeRequest {}).await
                && p.ready != Some(false)
            {
                return Ok(client);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Its exit status if it has ended.
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Whether it has died, waiting up to `wait` for a dying process to
    /// be reaped (a broken connection can be seen before the exit).
    pub(crate) async fn died_within(&mut self, wait: Duration) -> Option<ExitStatus> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(s) = self.exited() {
                return Some(s);
            }
            if tokio::time::Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Stops it with SIGTERM (a graceful stop), SIGKILL after 10 s.
    pub(crate) async fn stop(mut self) {
        if self.exited().is_some() {
            return;
        }
        // SAFETY: kill(2) of our own child's pid.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        if self.died_within(Duration::from_secs(10)).await.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.exited().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A run's directories: everything under `base`, removed after the run.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The run's directory.
    pub base: PathBuf,
    /// The driver's state directory (`base/state`).
    pub state: PathBuf,
    /// Its socket (`base/csi.sock`).
    pub socket: PathBuf,
    /// The kubelet's directory: staging and pod paths (`base/kubelet`).
    pub kubelet: PathBuf,
    /// The auxiliary processes' addresses, by name.
    pub(crate) addresses: BTreeMap<&'static str, String>,
}

impl Layout {
    pub(crate) fn new(base: &Path) -> Self {
        Layout {
            base: base.to_owned(),
            state: base.join("state"),
            socket: base.join("csi.sock"),
            kubelet: base.join("kubelet"),
            addresses: BTreeMap::new(),
        }
    }

    /// The flags csi-kit's drivers share (csi-server's `DriverFlags` and
    /// `--statedir`) for this layout: state dir, endpoint, node id, and
    /// logging of warnings only.
    pub fn driver_flags(&self, node_id: &str) -> Vec<String> {
        let endpoint = format!("unix://{}", self.socket.display());
        let state = self.state.to_string_lossy().into_owned();
        [
            "--statedir",
            &state,
            "--endpoint",
            &endpoint,
            "--nodeid",
            node_id,
            "--log",
            "warn",
        ]
        .map(String::from)
        .into()
    }

    /// The driver's log.
    pub(crate) fn log(&self) -> PathBuf {
        self.base.join("driver.log")
    }

    /// The directory of the [`Auxiliary`](super::Auxiliary) process named
    /// `name` (`base/aux/<name>`).
    pub fn auxiliary_dir(&self, name: &str) -> PathBuf {
        self.base.join("aux").join(name)
    }

    /// Its log.
    pub(crate) fn auxiliary_log(&self, name: &str) -> PathBuf {
        self.base.join("aux").join(format!("{name}.log"))
    }

    /// The address the auxiliary process `name` printed once it served
    /// (empty before it started).
    pub fn address(&self, name: &str) -> &str {
        self.addresses.get(name).map_or("", String::as_str)
    }
}
