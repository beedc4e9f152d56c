//! Shared harness of the end-to-end tests: start a driver as a child
//! process inside the test's private mount namespace, talk to it over its
//! real unix socket, and leave nothing behind.
//!
//! A driver package's own tests name its binary by path
//! (`env!("CARGO_BIN_EXE_hostpath")`); the root tests, which check both
//! drivers alike, name the root examples (`"hostpath"`, built by
//! `cargo test` in the root package).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use csi_client::{ClientOptions, CsiClient, Endpoint};

pub mod calls;

/// The executable `program` names: an absolute path as it is, else the
/// root example of that name.
pub fn program_path(program: &str) -> PathBuf {
    let path = Path::new(program);
    if path.is_absolute() {
        path.to_owned()
    } else {
        example_path(program)
    }
}

/// The path of a built root example (`cargo test` builds examples first).
pub fn example_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> → target/<profile>/examples/<name>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>");
    profile_dir.join("examples").join(name)
}

/// A running driver. Dropping it kills the process and detaches any
/// loop device backed by a file in its state directory.
pub struct Driver {
    child: Option<Child>,
    name: String,
    args: Vec<String>,
    /// The driver's `--statedir`.
    pub statedir: PathBuf,
    /// The driver's `--endpoint`: the unix socket in its state directory.
    pub endpoint: String,
    /// Where its stdout and stderr go.
    pub log: PathBuf,
    /// The driver's `RUST_LOG`.
    pub log_filter: String,
}

impl Driver {
    /// Starts `program` (see [`program_path`]) with `--statedir DIR
    /// --endpoint unix://DIR/csi.sock` plus `args`; its stdout and stderr go
    /// to `DIR.log`.
    pub fn start(example: &str, statedir: &Path, args: &[&str]) -> Driver {
        Self::start_logging(
            example,
            statedir,
            args,
            "debug,h2=info,hyper=info,tower=info",
        )
    }

    /// [`start`](Self::start) with `RUST_LOG=filter` (e.g. `trace`).
    pub fn start_logging(example: &str, statedir: &Path, args: &[&str], filter: &str) -> Driver {
        std::fs::create_dir_all(statedir).expect("state dir");
        let endpoint = format!("unix://{}", statedir.join("csi.sock").display());
        let log = statedir.with_extension("log");
        let mut driver = Driver {
            child: None,
            name: example.to_owned(),
            args: args.iter().map(|s| s.to_string()).collect(),
            statedir: statedir.to_owned(),
            endpoint,
            log,
            log_filter: filter.to_owned(),
        };
        driver.spawn();
        driver
    }

    fn spawn(&mut self) {
        let program = program_path(&self.name);
        assert!(
            program.exists(),
            "{} is not built: run `cargo build --workspace --examples --bins` first (scripts/test.sh does)",
            program.display()
        );
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("driver log");
        let child = Command::new(&program)
            .arg("--statedir")
            .arg(&self.statedir)
            .arg("--endpoint")
            .arg(&self.endpoint)
            .args(&self.args)
            .env("RUST_LOG", &self.log_filter)
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e} (is it built?)", self.name));
        self.child = Some(child);
    }

    /// Connects, waiting up to 20 s for the socket to appear and for
    /// Probe to answer ready (the node's volumes are restored by then).
    pub async fn client(&self) -> CsiClient {
        let endpoint: Endpoint = self.endpoint.parse().expect("endpoint");
        let wait = Duration::from_secs(20);
        let deadline = tokio::time::Instant::now() + wait;
        let client = CsiClient::connect_when_ready(endpoint, ClientOptions::default(), wait)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "{}: {e}\n--- driver log ---\n{}",
                    self.name,
                    self.log_text()
                )
            });
        loop {
            let probe = client.probe(csi_proto::v1::ProbeRequest {}).await;
            match probe {
                Ok(p) if p.ready != Some(false) => return client,
                _ if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                other => panic!(
                    "{}: not ready after {wait:?}: {other:?}\n--- driver log ---\n{}",
                    self.name,
                    self.log_text()
                ),
            }
        }
    }

    /// Kills the driver with SIGKILL (a crash) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the driver with SIGTERM and returns its exit status.
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        child.wait().ok()
    }

    /// Starts the driver again with the same arguments and state.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// A conformance suite configuration for this driver, its staging and
    /// target directories made under `dir`.
    pub fn suite_config(&self, dir: &Path) -> csi_conformance::SuiteConfig {
        let staging = dir.join("staging");
        let targets = dir.join("targets");
        std::fs::create_dir_all(&staging).expect("staging dir");
        std::fs::create_dir_all(&targets).expect("targets dir");
        let mut config =
            csi_conformance::SuiteConfig::new(self.endpoint.clone()).driver_log(&self.log);
        config.staging_dir = staging;
        config.target_dir = targets;
        config
    }

    /// Runs the conformance suite with `config` against this driver; panics
    /// with the report and the end of the driver's log on a failure.
    pub async fn run_suite(&self, config: csi_conformance::SuiteConfig) -> csi_conformance::Report {
        let report = csi_conformance::Suite::new(config)
            .run()
            .await
            .expect("suite runs");
        println!("{report}");
        assert!(
            report.is_success(),
            "conformance failures:\n{report}\n--- driver log tail ---\n{}",
            self.log_tail(80)
        );
        report
    }

    /// The last `lines` lines the driver logged.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = self.log_text();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Everything the driver logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.kill();
        mount_utils::testing::detach_loop_devices_under(&self.statedir);
    }
}

/// Runs an async test body in a private mount namespace (so every mount
/// the driver makes vanishes with it) on a current-thread runtime, whose
/// children inherit the namespace.
pub fn run_isolated<F, Fut>(name: &str, f: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    mount_utils::testing::in_private_mount_ns(name, move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime")
            .block_on(f())
    })
}

/// Mount points below `dir` in this thread's namespace.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let text = std::fs::read("/proc/thread-self/mountinfo").expect("mountinfo");
    mount_utils::parse_mountinfo(&text)
        .expect("parse mountinfo")
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(dir))
        .collect()
}

/// [`run_isolated`] with a fresh temporary directory, removed after the
/// namespace is gone: even when the body panics with mounts in place, no
/// mount can keep the directory from being removed.
pub fn run_isolated_in_tempdir<F, Fut>(name: &str, f: F)
where
    F: FnOnce(PathBuf) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().to_owned();
    run_isolated(name, move || f(path));
    drop(dir);
}

/// CreateVolume of `req`, then ControllerPublish of its first capability
/// to the driver's own node: the volume, the node id and the publish
/// context NodeStage needs.
pub async fn create_and_attach(
    client: &CsiClient,
    req: csi_proto::v1::CreateVolumeRequest,
) -> (
    csi_proto::v1::Volume,
    String,
    std::collections::HashMap<String, String>,
) {
    use csi_proto::v1::ControllerPublishVolumeRequest;
    let cap = req.volume_capabilities.first().cloned();
    let volume = calls::create_volume(client, req).await;
    let node = calls::node_id(client).await;
    let publish_context = client
        .controller()
        .controller_publish_volume(ControllerPublishVolumeRequest {
            volume_id: volume.volume_id.clone(),
            node_id: node.clone(),
            volume_capability: cap,
            ..Default::default()
        })
        .await
        .expect("ControllerPublishVolume")
        .into_inner()
        .publish_context;
    (volume, node, publish_context)
}

/// A pod's writer for group snapshot tests: appends `i` to file `a`, then
/// `i` to file `b`, for i = 0, 1, ... until `stop` (or `limit` lines), never
/// syncing. In any point-in-time copy of both, B <= A <= B + 1. Returns
/// how many lines it wrote.
pub fn spawn_ordered_writer(
    a: PathBuf,
    b: PathBuf,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    limit: u64,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        use std::io::Write;
        let open = |p: &Path| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .unwrap()
        };
        let (mut fa, mut fb) = (open(&a), open(&b));
        let mut i = 0u64;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) && i < limit {
            fa.write_all(format!("{i}\n").as_bytes()).unwrap();
            fb.write_all(format!("{i}\n").as_bytes()).unwrap();
            i += 1;
        }
        i
    })
}

/// The check of a group snapshot of [`spawn_ordered_writer`]'s files: `a`
/// and `b` lines in the copies of A and B are one point in time, and the
/// cut saw the writes made before it (at least `min`).
pub fn assert_one_point_in_time(round: usize, a: usize, b: usize, min: usize) {
    assert!(
        b <= a && a <= b + 1,
        "round {round}: the cut is not write-order consistent: A has {a} lines, B has {b}"
    );
    assert!(b >= min, "round {round}: the cut missed the writes ({b})");
}

/// Whether this process may grow a mounted ext4 (EXT4_IOC_RESIZE_FS needs
/// CAP_SYS_RESOURCE, bit 24 of CapEff, which some sandboxes drop for root).
pub fn has_cap_sys_resource() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 24) != 0)
}

/// A crash companion's workloads with its online expansion where this
/// machine can grow a mounted filesystem: as listed (ext4) with
/// CAP_SYS_RESOURCE; else on xfs (`expand-online+xfs`, whose grow needs
/// only CAP_SYS_ADMIN) when mkfs.xfs is installed; else without it,
/// saying so.
pub fn with_online_expansion(workloads: &[&'static str]) -> &'static [&'static str] {
    const EXPAND: &str = "expand-online";
    if has_cap_sys_resource() || !workloads.contains(&EXPAND) {
        return Vec::leak(workloads.to_vec());
    }
    let others = workloads.iter().copied().filter(|w| *w != EXPAND);
    let xfs = std::process::Command::new("mkfs.xfs")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if xfs {
        eprintln!(
            "expand-online runs on xfs: growing a mounted ext4 needs CAP_SYS_RESOURCE, which \
             this process lacks (CapEff bit 24)"
        );
        return Vec::leak(others.chain(["expand-online+xfs"]).collect());
    }
    eprintln!(
        "skipped: expand-online: growing a mounted ext4 needs CAP_SYS_RESOURCE, which this \
         process lacks (CapEff bit 24), and mkfs.xfs is not installed"
    );
    Vec::leak(others.collect())
}
