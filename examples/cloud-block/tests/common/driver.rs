//! The `cloud-block` driver's processes (`--mode controller`, `--mode
//! node`) for a test, spoken to over their sockets.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crash_points::{CRASH_AT_ENV, CRASH_TRACE_ENV};
use csi_client::CsiClient;

use super::{Dirs, Running, TOKEN};

/// The node id the driver's node serves as.
pub const NODE: &str = "node-a";

/// A driver process on its own socket in its own directory.
pub struct Driver {
    child: Child,
    dir: PathBuf,
    pub endpoint: String,
    pub client: CsiClient,
}

impl Driver {
    /// Starts `cloud-block --mode <mode>` with `args` (the node's state in
    /// `dir/node`), in `dir` as its working directory.
    pub async fn start(dir: &Path, mode: &str, args: &[&str], env: &[(&str, &str)]) -> Driver {
        std::fs::create_dir_all(dir).unwrap();
        let sock = dir.join(format!("{mode}.sock"));
        let _ = std::fs::remove_file(&sock);
        let log = std::fs::File::create(dir.join(format!("{mode}.log"))).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_cloud-block"));
        cmd.args(["--mode", mode, "--nodeid", NODE, "--log", "info"])
            .arg(format!("--endpoint=unix://{}", sock.display()))
            .arg("--statedir")
            .arg(dir.join("node"))
            .args(args)
            .current_dir(dir)
            .env_remove("CLOUD_PROVIDER_TOKEN")
            .env_remove(CRASH_AT_ENV)
            .env_remove(CRASH_TRACE_ENV)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log);
        let mut child = cmd.spawn().unwrap();
        // A start that fails kills the process, so none is left running.
        let deadline = Instant::now() + Duration::from_secs(20);
        while !sock.exists() {
            if let Some(status) = child.try_wait().unwrap() {
                let log = std::fs::read_to_string(dir.join(format!("{mode}.log"))).unwrap();
                panic!("cloud-block --mode {mode} exited with {status}:\n{log}");
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                panic!("no socket from --mode {mode}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let endpoint = format!("unix://{}", sock.display());
        // Under load the socket can show a moment before it accepts.
        let client = loop {
            match CsiClient::connect(&endpoint).await {
                Ok(client) => break client,
                Err(e) if Instant::now() >= deadline => {
                    let _ = child.kill();
                    panic!("--mode {mode}: {e}");
                }
                Err(_) => {}
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        Driver {
            child,
            dir: dir.to_owned(),
            endpoint,
            client,
        }
    }

    /// A controller on `provider`, with the token in the environment.
    pub async fn controller(dir: &Path, provider: &Running) -> Driver {
        let url = format!("--provider-url={}", provider.endpoint);
        Driver::start(
            dir,
            "controller",
            &[&url],
            &[("CLOUD_PROVIDER_TOKEN", TOKEN)],
        )
        .await
    }

    /// A node whose devices appear in `dirs`' device directory.
    pub async fn node(dir: &Path, dirs: &Dirs, env: &[(&str, &str)]) -> Driver {
        let devices = format!("--device-dir={}", dirs.devices().display());
        Driver::start(dir, "node", &[&devices, "--device-timeout-secs=2"], env).await
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the process to end by itself.
    pub fn wait(&mut self) -> ExitStatus {
        self.child.wait().unwrap()
    }

    pub fn log(&self, mode: &str) -> String {
        std::fs::read_to_string(self.log_path(mode)).unwrap_or_default()
    }

    /// Where the `--mode <mode>` process writes its log.
    pub fn log_path(&self, mode: &str) -> PathBuf {
        self.dir.join(format!("{mode}.log"))
    }
}

impl Drop for Driver {
    /// Killed outright: a SIGTERM would wait out the server's grace period
    /// for this test's open connection, and the driver keeps nothing that
    /// a kill could lose.
    fn drop(&mut self) {
        self.kill();
    }
}

/// A scratch directory for the driver processes.
pub fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("cloud-block-test.")
        .tempdir()
        .unwrap()
}
