//! gRPC clients not written in Rust or Go call both example drivers with
//! their default channel settings: Python's grpcio (gRPC C-core), grpc-java
//! (both send the socket path as `:authority`) and Node's @grpc/grpc-js.
//! Each calls GetPluginInfo, Probe and NodeGetCapabilities over the driver's
//! real unix socket (clients in tests/grpc_clients/).
//!
//! The clients come from PyPI, npm and Debian; `scripts/test.sh` installs
//! them (grpcio with pip, grpc-js under target/grpc-clients/node, grpc-java
//! with apt and netty's epoll library built under target/grpc-clients/java
//! by tests/grpc_clients/java_client_setup.sh). Without them a test is
//! reported as ignored, saying why, never as passed: this binary has its own
//! harness (`harness = false`), which decides at run time.

use e2e_support as support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::Driver;

const DRIVERS: [&str; 2] = ["hostpath", "loop-block"];

fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/grpc_clients")
}

/// `target/` of this build (the test runs from target/<profile>/deps).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.ancestors().nth(3).expect("target dir").to_owned()
}

/// Why `program args` cannot run, if it cannot.
fn missing(program: &str, args: &[&str]) -> Option<String> {
    match Command::new(program).args(args).output() {
        Ok(out) if out.status.success() => None,
        Ok(out) => Some(format!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Some(format!("{program} not found: {e}")),
    }
}

/// Starts each example driver, waits until it answers, and runs `client`
/// against its endpoint; panics with the client's output and the driver's
/// log when the client fails.
fn run_against_both_drivers(test: &str, mut client: impl FnMut(&str) -> Command) {
    for name in DRIVERS {
        let dir = tempfile::tempdir().unwrap();
        let driver = Driver::start(name, &dir.path().join("state"), &[]);
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(driver.client());
        let out = client(&driver.endpoint).output().expect("client runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{test}: {name}: client failed ({})\n--- stdout ---\n{stdout}\n--- stderr ---\n{}\n--- driver log ---\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            driver.log_text()
        );
        for call in ["GetPluginInfo name=", "Probe ready=", "NodeGetCapabilities"] {
            assert!(
                stdout.contains(call),
                "{test}: {name}: no {call} in {stdout}"
            );
        }
        eprintln!("{test}: {name}:\n{stdout}");
    }
}

/// Why the Python client cannot run here, if it cannot.
fn python_missing() -> Option<String> {
    missing("python3", &["-c", "import grpc"])
        .map(|why| format!("{why} (pip install grpcio; scripts/test.sh does)"))
}

fn python_grpcio_with_default_settings_calls_both_drivers() {
    // grpcio sends the socket path as :authority; the server takes it.
    run_against_both_drivers("python_grpcio", |endpoint| {
        let mut c = Command::new("python3");
        c.arg(scripts().join("python_client.py")).arg(endpoint);
        c
    });
}

fn node_modules() -> PathBuf {
    target_dir().join("grpc-clients/node/node_modules")
}

/// Why the Node client cannot run here, if it cannot.
fn node_missing() -> Option<String> {
    let modules = node_modules();
    if !modules.join("@grpc/grpc-js").is_dir() || !modules.join("@grpc/proto-loader").is_dir() {
        return Some(format!(
            "@grpc/grpc-js and @grpc/proto-loader are not installed under {} (scripts/test.sh installs them with npm)",
            modules.display()
        ));
    }
    missing("node", &["--version"])
}

fn node_grpc_js_with_default_settings_calls_both_drivers() {
    let modules = node_modules();
    let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/csi-proto/proto/csi.proto");
    run_against_both_drivers("node_grpc_js", |endpoint| {
        let mut c = Command::new("node");
        c.env("NODE_PATH", &modules)
            .arg(scripts().join("node_client.js"))
            .arg(endpoint)
            .arg(&proto);
        c
    });
}

/// Keeps the JVM from creating `/tmp/hsperfdata_<user>`, which it leaves
/// behind (empty) after it exits.
const NO_PERF_DATA: &str = "-XX:-UsePerfData";

/// Debian's jars grpc-java runs from (`/usr/share/java`).
const JAVA_JARS: [&str; 18] = [
    "grpc-api",
    "grpc-context",
    "grpc-core",
    "grpc-netty",
    "grpc-stub",
    "guava",
    "perfmark-api",
    "protobuf",
    "netty-buffer",
    "netty-codec",
    "netty-codec-http",
    "netty-codec-http2",
    "netty-common",
    "netty-handler",
    "netty-resolver",
    "netty-transport",
    "netty-transport-native-epoll",
    "netty-transport-native-unix-common",
];

fn java_native() -> PathBuf {
    target_dir().join("grpc-clients/java/native")
}

fn java_jar(name: &str) -> String {
    format!("/usr/share/java/{name}.jar")
}

fn java_class_path() -> String {
    JAVA_JARS.map(java_jar).join(":")
}

/// Why the Java client cannot run here, if it cannot.
fn java_missing() -> Option<String> {
    let setup =
        "tests/grpc_clients/java_client_setup.sh sets it up; scripts/test.sh runs it as root";
    if let Some(jar) = JAVA_JARS
        .map(java_jar)
        .into_iter()
        .find(|j| !Path::new(j).is_file())
    {
        return Some(format!("{jar} is missing ({setup})"));
    }
    let native = java_native().join("libnetty_transport_native_epoll_x86_64.so");
    if !native.is_file() {
        return Some(format!("{} is missing ({setup})", native.display()));
    }
    missing("java", &[NO_PERF_DATA, "-version"])
}

fn grpc_java_with_default_settings_calls_both_drivers() {
    // grpc-java sends the socket path: the server must have rewritten it.
    run_against_both_drivers("grpc_java", |endpoint| {
        let socket = endpoint.strip_prefix("unix://").expect("a unix endpoint");
        let mut c = Command::new("java");
        c.arg(NO_PERF_DATA)
            .arg(format!("-Djava.library.path={}", java_native().display()))
            .arg("-cp")
            .arg(java_class_path())
            .arg(scripts().join("JavaClient.java"))
            .arg(socket);
        c
    });
}

/// A test: its name, why it cannot run here (if it cannot), its body.
type ClientTest = (&'static str, fn() -> Option<String>, fn());

fn main() -> std::process::ExitCode {
    let args = libtest_mimic::Arguments::from_args();
    let tests: [ClientTest; 3] = [
        (
            "python_grpcio_with_default_settings_calls_both_drivers",
            python_missing,
            python_grpcio_with_default_settings_calls_both_drivers,
        ),
        (
            "grpc_java_with_default_settings_calls_both_drivers",
            java_missing,
            grpc_java_with_default_settings_calls_both_drivers,
        ),
        (
            "node_grpc_js_with_default_settings_calls_both_drivers",
            node_missing,
            node_grpc_js_with_default_settings_calls_both_drivers,
        ),
    ];
    // The test script's root pass runs ignored tests; a client missing here
    // is not made available by root, so its test is left out of that pass.
    let root_pass = std::env::var_os("CSI_KIT_ROOT_PASS").is_some();
    let trials = tests
        .into_iter()
        .filter(|(_, unavailable, _)| !(root_pass && unavailable().is_some()))
        .map(|(name, unavailable, test)| {
            let why = if args.list { None } else { unavailable() };
            if let Some(why) = &why {
                eprintln!("{name}: reported as ignored: {why}");
            }
            libtest_mimic::Trial::test(name, move || {
                test();
                Ok(())
            })
            .with_ignored_flag(why.is_some())
        })
        .collect();
    libtest_mimic::run(&args, trials).exit_code()
}
