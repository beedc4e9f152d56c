//! Runs `cloud-provider` as its own process for a test, and removes every
//! trace of it afterwards (process, loop devices, links, files).

#![allow(dead_code)] // each test binary uses part of this

pub mod driver;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cloud_block::api::{Action, ActionStatus, CreateVolumeRequest, PageRequest, VolumeFilter};
use cloud_block::client::{HttpProvider, ProviderClient};
use cloud_block::token::Token;

pub const TOKEN: &str = "test-token-7f3a";

/// A provider's directories. Dropped after its process: detaches whatever
/// the provider left attached, then removes the files.
pub struct Dirs {
    root: tempfile::TempDir,
}

impl Dirs {
    pub fn new() -> Self {
        let root = tempfile::Builder::new()
            .prefix("cloud-provider-test.")
            .tempdir()
            .unwrap();
        Dirs { root }
    }

    pub fn data(&self) -> PathBuf {
        self.root.path().join("data")
    }

    pub fn devices(&self) -> PathBuf {
        self.root.path().join("by-id")
    }

    pub fn volume_file(&self, id: &str) -> PathBuf {
        std::fs::canonicalize(self.data())
            .unwrap()
            .join("volumes")
            .join(format!("{id}.img"))
    }

    pub fn link(&self, id: &str) -> PathBuf {
        self.devices().join(cloud_block::api::device_link_name(id))
    }

    /// Loop devices bound to a volume's file.
    pub fn loops_of(&self, id: &str) -> Vec<PathBuf> {
        mount_utils::loopdev::find_by_backing_file(self.volume_file(id)).unwrap()
    }
}

impl Drop for Dirs {
    fn drop(&mut self) {
        // Not a panic: this also runs while a failed test unwinds.
        if self.data().join("state").exists()
            && let Err(e) = cloud_block::provider::cleanup(&self.data(), &self.devices())
        {
            eprintln!("cleaning up {}: {e}", self.data().display());
        }
    }
}

/// A running `cloud-provider`; killed on drop if still running.
pub struct Running {
    child: Child,
    pub endpoint: String,
}

pub fn start(dirs: &Dirs, extra: &[&str]) -> Running {
    let log = std::fs::File::create(dirs.root.path().join("provider.log")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_cloud-provider"))
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dirs.data())
        .arg("--device-dir")
        .arg(dirs.devices())
        .args(extra)
        .env("CLOUD_PROVIDER_TOKEN", TOKEN)
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let Some(endpoint) = line.trim().strip_prefix("listening on ") else {
        let _ = child.kill();
        let _ = child.wait();
        let log = std::fs::read_to_string(dirs.root.path().join("provider.log")).unwrap();
        panic!("provider did not start: {line:?}\n{log}");
    };
    Running {
        endpoint: endpoint.to_owned(),
        child,
    }
}

impl Running {
    pub fn client(&self) -> HttpProvider {
        HttpProvider::new(&self.endpoint, Token::new(TOKEN, "test").unwrap()).unwrap()
    }

    /// SIGTERM, and the exit must be clean.
    pub fn stop(mut self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "provider exited with {status}");
    }

    /// SIGKILL: a crash.
    pub fn crash(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// The names of every volume the provider holds, sorted.
    pub async fn volume_names(&self) -> Vec<String> {
        let page = PageRequest {
            page: 1,
            per_page: 200,
        };
        let (client, all) = (self.client(), VolumeFilter::default());
        let found = client.list_volumes(&all, page).await.unwrap();
        let mut names: Vec<_> = found.items.into_iter().map(|v| v.name).collect();
        names.sort();
        names
    }

    /// Replaces the fault mode through the admin endpoint.
    pub fn set_faults(&self, json: &str) {
        let (status, body) = raw(&self.endpoint, "PUT", "/admin/faults", Some(TOKEN), json);
        assert_eq!(status, 200, "{body}");
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One HTTP/1.1 request by hand: (status, body).
pub fn raw(
    endpoint: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (u16, String) {
    let addr = endpoint.strip_prefix("http://").unwrap();
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    let auth = token.map_or_else(String::new, |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer[9..12].parse().unwrap();
    let body = answer
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

pub fn volume_request(name: &str, gib: u64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.to_owned(),
        size_gigabytes: gib,
        tags: vec!["k8s:test".to_owned()],
        ..Default::default()
    }
}

/// Polls an action until it ends (10 s at most).
pub async fn wait(client: &dyn ProviderClient, action: &Action) -> Action {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = client.get_action(action.id).await.unwrap();
        if now.status != ActionStatus::InProgress {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "action {} still in progress",
            action.id
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether `path` is a symlink (not following it).
pub fn is_link(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}
