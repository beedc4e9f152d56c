//! The `csi` command-line client against the hostpath example (as root, real
//! socket and mounts): every command group, `csi sanity` (passing on
//! hostpath, failing on a deliberately broken driver), and `csi bench`
//! leaving no volume, mount or loop device after a normal end and after SIGINT.

// The end-to-end harness: these tests run the root package's hostpath example.
use e2e_support as support;

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use csi_kit::conformance::fake::{FakeDriver, Fault};
use csi_kit::mount::require_root;
use csi_kit::mount::testing::ScratchFilesystem;
use serde_json::Value;
use support::{Driver, calls, mounts_under, run_isolated};

const MARKER: &str = "SECRET-MARKER-cli-4b7e";

async fn csi(endpoint: &str, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_csi"))
        .arg("--endpoint")
        .arg(endpoint)
        .args(args)
        .output()
        .await
        .expect("run csi")
}

/// Runs `csi` and returns stdout, failing the test on a non-zero exit.
async fn ok(endpoint: &str, args: &[&str]) -> String {
    let out = csi(endpoint, args).await;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "csi {args:?} failed: {stderr}\n{stdout}"
    );
    assert!(
        !stdout.contains(MARKER) && !stderr.contains(MARKER),
        "csi echoed a secret"
    );
    stdout
}

async fn json(endpoint: &str, args: &[&str]) -> Value {
    let mut all = vec!["-o", "json"];
    all.extend_from_slice(args);
    let text = ok(endpoint, &all).await;
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("csi {args:?}: not JSON ({e}): {text}"))
}

fn s(v: &Value) -> String {
    v.as_str()
        .unwrap_or_else(|| panic!("not a string: {v}"))
        .to_owned()
}

fn p(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn every_command_group_works_against_hostpath() {
    require_root!("every_command_group_works_against_hostpath");
    run_isolated("cli-commands", || async {
        let dir = tempfile::tempdir().unwrap();
        // State on its own filesystem, snapshots elsewhere: group snapshots on.
        let state = ScratchFilesystem::new(dir.path(), "state", 256 << 20, "ext4").unwrap();
        let snapdir = format!("--snapshotdir={}", dir.path().join("snapshots").display());
        let driver = Driver::start("hostpath", state.path(), &["--enable-attach", &snapdir]);
        driver.client().await;
        let e = driver.endpoint.as_str();
        let secrets = dir.path().join("secrets");
        std::fs::write(&secrets, format!("password={MARKER}\n")).unwrap();
        let sf = p(&secrets);

        assert!(
            ok(e, &["identity", "info"])
                .await
                .contains("name: hostpath.csi.csi-kit.dev")
        );
        assert!(
            ok(e, &["identity", "capabilities"])
                .await
                .contains("CONTROLLER_SERVICE")
        );
        assert_eq!(json(e, &["identity", "probe"]).await["ready"], true);
        assert!(
            ok(e, &["controller", "capabilities"])
                .await
                .contains("CREATE_DELETE_VOLUME")
        );
        assert!(
            ok(e, &["node", "capabilities"])
                .await
                .contains("STAGE_UNSTAGE_VOLUME")
        );
        let node_id = s(&json(e, &["node", "info"]).await["node_id"]);
        assert!(
            json(e, &["controller", "capacity"]).await["available_capacity"]
                .as_i64()
                .unwrap()
                > 0
        );

        let vol = json(
            e,
            &[
                "--secrets-file",
                &sf,
                "controller",
                "create-volume",
                "pvc-cli",
                "--size",
                "8Mi",
            ],
        )
        .await;
        let id = s(&vol["volume"]["volume_id"]);
        assert_eq!(vol["volume"]["capacity_bytes"], 8 << 20);
        assert!(ok(e, &["controller", "list-volumes"]).await.contains(&id));
        let page = json(e, &["controller", "list-volumes", "--max-entries", "1"]).await;
        assert_eq!(page["entries"].as_array().unwrap().len(), 1);
        assert_eq!(
            s(&json(e, &["controller", "get-volume", &id]).await["volume"]["volume_id"]),
            id
        );
        let grown = json(e, &["controller", "expand-volume", &id, "--size", "16Mi"]).await;
        assert_eq!(grown["capacity_bytes"], 16 << 20);
        assert!(
            ok(e, &["controller", "validate-capabilities", &id])
                .await
                .contains("confirmed")
        );

        let snap = json(
            e,
            &["controller", "create-snapshot", "snap-cli", "--source", &id],
        )
        .await;
        let snap_id = s(&snap["snapshot"]["snapshot_id"]);
        assert!(
            ok(
                e,
                &["controller", "list-snapshots", "--source-volume-id", &id]
            )
            .await
            .contains(&snap_id)
        );
        assert_eq!(
            json(e, &["controller", "get-snapshot", &snap_id]).await["snapshot"]["ready_to_use"],
            true
        );
        ok(e, &["controller", "delete-snapshot", &snap_id]).await;

        let group = json(e, &["group", "create", "group-cli", "--source", &id]).await;
        let gid = s(&group["group_snapshot"]["group_snapshot_id"]);
        let member = s(&group["group_snapshot"]["snapshots"][0]["snapshot_id"]);
        assert!(
            ok(e, &["group", "capabilities"])
                .await
                .contains("CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT")
        );
        assert_eq!(
            s(
                &json(e, &["group", "get", &gid, "--snapshot-id", &member]).await["group_snapshot"]
                    ["group_snapshot_id"]
            ),
            gid
        );
        ok(e, &["group", "delete", &gid, "--snapshot-id", &member]).await;

        let (staging, target) = (dir.path().join("staging"), dir.path().join("pod/vol"));
        std::fs::create_dir_all(&staging).unwrap();
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        let published = json(
            e,
            &["controller", "publish-volume", &id, "--node", &node_id],
        )
        .await;
        assert!(published["publish_context"].is_object());
        ok(
            e,
            &[
                "--secrets-file",
                &sf,
                "node",
                "stage",
                &id,
                "--staging-path",
                &p(&staging),
            ],
        )
        .await;
        ok(
            e,
            &[
                "node",
                "publish",
                &id,
                "--staging-path",
                &p(&staging),
                "--target-path",
                &p(&target),
            ],
        )
        .await;
        assert_eq!(
            mounts_under(dir.path()).len(),
            3,
            "state filesystem, staging and target"
        );
        assert!(
            ok(e, &["node", "stats", &id, "--volume-path", &p(&target)])
                .await
                .contains("INODES")
        );
        ok(
            e,
            &[
                "node",
                "expand",
                &id,
                "--volume-path",
                &p(&target),
                "--size",
                "16Mi",
            ],
        )
        .await;
        ok(e, &["node", "unpublish", &id, "--target-path", &p(&target)]).await;
        ok(e, &["node", "unstage", &id, "--staging-path", &p(&staging)]).await;
        ok(
            e,
            &["controller", "unpublish-volume", &id, "--node", &node_id],
        )
        .await;
        ok(e, &["controller", "delete-volume", &id]).await;
        assert_eq!(
            mounts_under(dir.path()),
            vec![state.path().to_owned()],
            "only the state filesystem"
        );

        // Errors: non-zero exit with the gRPC code on stderr.
        let out = csi(
            e,
            &[
                "controller",
                "get-volume",
                "vol-00000000000000000000000000000000",
            ],
        )
        .await;
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("NotFound"));
        assert!(
            !driver.log_text().contains(MARKER),
            "the driver logged a secret"
        );
    });
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn sanity_passes_on_hostpath_and_fails_on_a_broken_driver() {
    require_root!("sanity_passes_on_hostpath_and_fails_on_a_broken_driver");
    run_isolated("cli-sanity", || async {
        let dir = tempfile::tempdir().unwrap();
        let driver = Driver::start("hostpath", &dir.path().join("state"), &[]);
        driver.client().await;
        let junit = dir.path().join("report.xml");
        let out = ok(
            &driver.endpoint,
            &[
                "sanity",
                "--staging-dir",
                &p(dir.path()),
                "--target-dir",
                &p(dir.path()),
                "--driver-log",
                &p(&driver.log),
                "--junit",
                &p(&junit),
            ],
        )
        .await;
        assert!(out.contains("0 failed"), "{out}");
        let xml = std::fs::read_to_string(&junit).unwrap();
        assert!(
            xml.starts_with("<?xml")
                && xml.contains("<testsuite")
                && xml.contains("failures=\"0\""),
            "{xml}"
        );

        let broken = FakeDriver::new()
            .with_fault(Fault::NoPaging)
            .serve()
            .await
            .unwrap();
        let out = csi(
            broken.endpoint(),
            &[
                "sanity",
                "--staging-dir",
                &p(dir.path()),
                "--target-dir",
                &p(dir.path()),
            ],
        )
        .await;
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            !out.status.success(),
            "sanity passed a broken driver:\n{stdout}"
        );
        assert!(
            stdout.contains("controller.list_volumes.paging") && stdout.contains("FAIL"),
            "{stdout}"
        );
        broken.shutdown().await;
    });
}

async fn assert_nothing_left(driver: &Driver, dir: &Path) {
    let client = driver.client().await;
    let volumes = calls::list_volumes(&client).await;
    assert!(
        volumes.entries.is_empty(),
        "bench left volumes: {:?}",
        volumes.entries
    );
    let snaps = calls::list_snapshots(&client).await;
    assert!(snaps.entries.is_empty());
    assert!(
        mounts_under(dir).is_empty(),
        "bench left mounts: {:?}",
        mounts_under(dir)
    );
    let images = driver.statedir.join("volumes");
    for entry in std::fs::read_dir(&images).unwrap().flatten() {
        csi_kit::mount::testing::assert_no_loop_device_for(&entry.path());
    }
    assert_eq!(
        std::fs::read_dir(&images).unwrap().count(),
        0,
        "volume data left behind"
    );
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn bench_reports_percentiles_and_cleans_up_after_a_normal_end() {
    require_root!("bench_reports_percentiles_and_cleans_up_after_a_normal_end");
    run_isolated("cli-bench", || async {
        let dir = tempfile::tempdir().unwrap();
        let driver = Driver::start("hostpath", &dir.path().join("state"), &["--enable-attach"]);
        driver.client().await;
        let e = driver.endpoint.as_str();
        let probe = json(
            e,
            &[
                "bench",
                "--workload",
                "probe",
                "--count",
                "200",
                "--workers",
                "4",
            ],
        )
        .await;
        assert_eq!(probe["iterations"], 200);
        assert!(probe["rpcs"]["Probe"]["p99_ms"].as_f64().unwrap() > 0.0);
        // One worker, 10 calls, a pause between each two.
        let paused = json(
            e,
            &[
                "bench",
                "--workload",
                "probe",
                "--count",
                "10",
                "--pause",
                "50ms",
            ],
        )
        .await;
        assert_eq!(paused["iterations"], 10, "{paused}");
        assert_eq!(paused["pause_ms"], 50.0, "{paused}");
        let secs = paused["elapsed_seconds"].as_f64().unwrap();
        assert!(secs >= 0.45, "9 pauses of 50 ms: {paused}");
        let work = p(&dir.path().join("work"));
        let life = json(
            e,
            &[
                "bench",
                "--workload",
                "lifecycle",
                "--count",
                "12",
                "--workers",
                "3",
                "--work-dir",
                &work,
            ],
        )
        .await;
        assert_eq!(life["iterations"], 12, "{life}");
        for rpc in [
            "CreateVolume",
            "ControllerPublishVolume",
            "NodeStageVolume",
            "NodePublishVolume",
            "NodeUnpublishVolume",
            "NodeUnstageVolume",
            "ControllerUnpublishVolume",
            "DeleteVolume",
        ] {
            assert_eq!(life["rpcs"][rpc]["count"], 12, "{rpc}: {life}");
        }
        assert_eq!(life["leftover_volumes"].as_array().unwrap().len(), 0);
        let human = ok(
            e,
            &[
                "bench",
                "--workload",
                "create-delete",
                "--count",
                "5",
                "--no-progress",
            ],
        )
        .await;
        assert!(
            human.contains("p99 ms") && human.contains("CreateVolume"),
            "{human}"
        );
        assert_nothing_left(&driver, dir.path()).await;
    });
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn bench_cleans_up_after_sigint() {
    require_root!("bench_cleans_up_after_sigint");
    run_isolated("cli-bench-sigint", || async {
        let dir = tempfile::tempdir().unwrap();
        let driver = Driver::start("hostpath", &dir.path().join("state"), &[]);
        driver.client().await;
        let work = p(&dir.path().join("work"));
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_csi"))
            .args([
                "--endpoint",
                &driver.endpoint,
                "-o",
                "json",
                "bench",
                "--workload",
                "lifecycle",
                "--block",
            ])
            .args(["--duration", "60s", "--workers", "3", "--work-dir", &work])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
        let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .expect("bench stops after SIGINT")
            .unwrap();
        let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(out.status.success(), "{summary}");
        assert_eq!(summary["interrupted"], true);
        assert!(summary["iterations"].as_u64().unwrap() > 0, "{summary}");
        assert_eq!(summary["leftover_volumes"].as_array().unwrap().len(), 0);
        assert_nothing_left(&driver, dir.path()).await;
    });
}
