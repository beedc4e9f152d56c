//! csi-sanity (the community's conformance tool, v5.5.0, which every
//! driver's CI runs) and this suite side by side against the fake driver:
//! correct, then with each [`Fault`] in turn. Whatever csi-sanity catches,
//! this suite catches too. Both run as vendors run them: csi-sanity with its
//! attach-limit test, a secrets file and mutable parameters, this suite with
//! the same secrets and parameters. Each run gets a fresh driver, served on
//! one endpoint and, for the correct driver and the faults whose checks span
//! both services, as a controller and a node apart (csi-sanity's
//! `--csi.controllerendpoint`).
//!
//! The binary is `$CSI_SANITY`, else `../shared/tools/csi-sanity` beside
//! the workspace. Without it each trial is reported as ignored, saying why,
//! never as passed: this binary has its own harness (`harness = false`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use csi_conformance::fake::{FakeDriver, Fault};
use csi_conformance::{Report, Secrets, Suite, SuiteConfig};

/// A secrets file in csi-sanity's format, read by both tools.
const SECRETS: &str = "\
CreateVolumeSecret:
  token: create-secret-5d1e
DeleteVolumeSecret:
  token: delete-secret-5d1e
ControllerPublishVolumeSecret:
  token: publish-secret-5d1e
NodeStageVolumeSecret:
  token: stage-secret-5d1e
";

/// A mutable parameter the fake driver accepts.
const MUTABLE: (&str, &str) = ("iops", "3000");

/// How long one csi-sanity run may take (a correct run takes seconds).
const SANITY_TIMEOUT: Duration = Duration::from_secs(300);

fn sanity_binary() -> PathBuf {
    match std::env::var_os("CSI_SANITY") {
        Some(path) => PathBuf::from(path),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/tools/csi-sanity"),
    }
}

fn sanity_missing() -> Option<String> {
    let bin = sanity_binary();
    (!bin.is_file()).then(|| format!("no csi-sanity at {} (set CSI_SANITY)", bin.display()))
}

/// What csi-sanity said of one driver.
struct SanityVerdict {
    failed: usize,
    /// Its summary line and the specs that failed, for the messages.
    summary: String,
}

/// Where a driver serves: one endpoint, or a controller and a node apart.
struct Endpoints {
    node: String,
    controller: Option<String>,
    log: PathBuf,
}

/// Runs csi-sanity against `at` with its paths and files under `dir`.
async fn csi_sanity(at: &Endpoints, dir: &Path) -> SanityVerdict {
    let secrets = dir.join("secrets.yaml");
    std::fs::write(&secrets, SECRETS).expect("secrets file");
    let mutable = dir.join("mutable.yaml");
    std::fs::write(&mutable, format!("{}: \"{}\"\n", MUTABLE.0, MUTABLE.1)).expect("params file");
    let mut command = tokio::process::Command::new(sanity_binary());
    if let Some(controller) = &at.controller {
        command.arg(format!("--csi.controllerendpoint={controller}"));
    }
    command
        .arg(format!("--csi.endpoint={}", at.node))
        .arg(format!("--csi.mountdir={}", dir.join("target").display()))
        .arg(format!(
            "--csi.stagingdir={}",
            dir.join("staging").display()
        ))
        .arg(format!("--csi.secrets={}", secrets.display()))
        .arg(format!(
            "--csi.testvolumemutableparameters={}",
            mutable.display()
        ))
        .args(["--csi.testnodevolumeattachlimit", "--ginkgo.no-color"])
        .kill_on_drop(true);
    let output = tokio::time::timeout(SANITY_TIMEOUT, command.output())
        .await
        .expect("csi-sanity finished in time")
        .expect("csi-sanity runs");
    let text = String::from_utf8_lossy(&output.stdout);
    // Ginkgo's last lines: "FAIL! -- 60 Passed | 7 Failed | 0 Pending | 28 Skipped"
    // (or "SUCCESS! -- ..."), after a "[FAIL] ..." line per failed spec.
    let totals = text
        .lines()
        .rfind(|l| l.contains(" Passed | ") && l.contains(" Failed | "))
        .unwrap_or_else(|| panic!("no csi-sanity summary in:\n{text}"));
    let failed = totals
        .split(" | ")
        .find_map(|part| part.trim().strip_suffix(" Failed"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no failure count in {totals:?}"));
    assert_eq!(
        failed > 0,
        !output.status.success(),
        "csi-sanity's exit status disagrees with {totals:?}"
    );
    let failures = text
        .lines()
        .filter(|l| l.trim_start().starts_with("[FAIL]"));
    let summary = std::iter::once(totals).chain(failures).collect::<Vec<_>>();
    SanityVerdict {
        failed,
        summary: summary.join("\n"),
    }
}

/// Runs this suite against `at`, configured as csi-sanity is.
async fn this_suite(at: &Endpoints, dir: &Path) -> Report {
    let mut config = SuiteConfig::new(at.node.as_str()).driver_log(&at.log);
    if let Some(controller) = &at.controller {
        config = config.controller_endpoint(controller.as_str());
    }
    config.staging_dir = dir.join("staging");
    config.target_dir = dir.join("target");
    config.secrets = Secrets::from_sanity_yaml(SECRETS).expect("secrets file");
    config.mutable_parameters = HashMap::from([(MUTABLE.0.into(), MUTABLE.1.into())]);
    Suite::new(config).run().await.expect("the suite runs")
}

fn driver(fault: Option<Fault>) -> FakeDriver {
    match fault {
        Some(fault) => FakeDriver::new().with_fault(fault),
        None => FakeDriver::new(),
    }
}

/// Runs `with` against a fresh driver with `fault`, served on one endpoint
/// or (`split`) as a controller and a node apart.
async fn against<T>(
    fault: Option<Fault>,
    split: bool,
    with: impl AsyncFnOnce(&Endpoints) -> T,
) -> T {
    if split {
        let server = driver(fault)
            .serve_split()
            .await
            .expect("the fake driver serves");
        let at = Endpoints {
            node: server.node_endpoint().to_owned(),
            controller: Some(server.controller_endpoint().to_owned()),
            log: server.log_path().to_owned(),
        };
        let out = with(&at).await;
        server.shutdown().await;
        out
    } else {
        let server = driver(fault).serve().await.expect("the fake driver serves");
        let at = Endpoints {
            node: server.endpoint().to_owned(),
            controller: None,
            log: server.log_path().to_owned(),
        };
        let out = with(&at).await;
        server.shutdown().await;
        out
    }
}

/// Both tools against fresh drivers with `fault`; returns csi-sanity's
/// verdict and this suite's report.
fn side_by_side(fault: Option<Fault>, split: bool) -> (SanityVerdict, Report) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let (sanity_dir, suite_dir) = (dir.path().join("sanity"), dir.path().join("suite"));
        // csi-sanity makes its own staging and target paths; this suite
        // makes its paths below existing parents.
        std::fs::create_dir_all(&sanity_dir).expect("sanity dir");
        for sub in ["staging", "target"] {
            std::fs::create_dir_all(suite_dir.join(sub)).expect("suite dirs");
        }
        let sanity = against(fault, split, async |at| csi_sanity(at, &sanity_dir).await).await;
        let report = against(fault, split, async |at| this_suite(at, &suite_dir).await).await;
        (sanity, report)
    })
}

fn correct_driver_passes_both(split: bool) {
    let (sanity, report) = side_by_side(None, split);
    assert_eq!(
        sanity.failed, 0,
        "csi-sanity failed the correct fake:\n{}",
        sanity.summary
    );
    assert!(report.is_success(), "{report}");
}

fn caught_here_when_caught_by_csi_sanity(fault: Fault, split: bool) {
    let (sanity, report) = side_by_side(Some(fault), split);
    let ours: Vec<&str> = report.failures().map(|(r, _)| r.id.as_str()).collect();
    if sanity.failed > 0 {
        assert!(
            !ours.is_empty(),
            "{fault:?}: csi-sanity caught it and this suite did not:\n{}\n{report}",
            sanity.summary
        );
    }
    // What each caught, for the record (`--nocapture`).
    println!(
        "{fault:?}: csi-sanity {} failed; this suite {}",
        sanity.failed,
        ours.join(", ")
    );
}

/// Every fault of the fake driver.
const FAULTS: &[Fault] = &[
    Fault::WrongCodeForMissingVolume,
    Fault::NoPaging,
    Fault::NotIdempotentCreate,
    Fault::LeaksSecretsToLog,
    Fault::LeaksSecretsInErrors,
    Fault::NoTargetCleanup,
    Fault::NoRepeatTable,
    Fault::StagingCheckedFirst,
    Fault::RelativeVolumePathInvalid,
    Fault::AcceptsAnyMutableParameter,
    Fault::RequiresMutableParameters,
    Fault::RequiresSnapshotIds,
    Fault::NoAttachLimit,
    Fault::StrictAuthority,
    Fault::ShortNameLimit,
    Fault::RepublishIgnoresArguments,
    Fault::ListsDeleted,
    Fault::UnknownSourceNotFound,
    Fault::MutableParametersOnlyOnModify,
    Fault::CapacityBelowRequired,
    Fault::StatsAtAnyPath,
    Fault::NoNodeTopology,
    Fault::ListedSnapshotsWithoutTime,
];

/// Faults a check sees through both the controller's and the node's
/// answers (an attach limit the node reports and the controller enforces,
/// topology, a publish_context handed from one to the other).
const SPANNING: &[Fault] = &[
    Fault::NoAttachLimit,
    Fault::NoNodeTopology,
    Fault::WrongCodeForMissingVolume,
    Fault::NoTargetCleanup,
];

fn main() -> std::process::ExitCode {
    let args = libtest_mimic::Arguments::from_args();
    let why = if args.list { None } else { sanity_missing() };
    // The test script's root pass runs ignored tests; root does not bring
    // a missing binary, so that pass leaves these out.
    if why.is_some() && std::env::var_os("CSI_KIT_ROOT_PASS").is_some() {
        return libtest_mimic::run(&args, Vec::new()).exit_code();
    }
    if let Some(why) = &why {
        eprintln!("beside_csi_sanity: reported as ignored: {why}");
    }
    let mut trials = Vec::new();
    for split in [false, true] {
        let apart = if split {
            "_controller_and_node_apart"
        } else {
            ""
        };
        trials.push(libtest_mimic::Trial::test(
            format!("correct_driver_passes_both{apart}"),
            move || {
                correct_driver_passes_both(split);
                Ok(())
            },
        ));
        // Apart, the faults whose calls span both services.
        let faults = FAULTS.iter().filter(|f| !split || SPANNING.contains(f));
        for &fault in faults {
            let name = format!("{fault:?}_caught_here_when_caught_by_csi_sanity{apart}");
            trials.push(libtest_mimic::Trial::test(name, move || {
                caught_here_when_caught_by_csi_sanity(fault, split);
                Ok(())
            }));
        }
    }
    let trials = trials
        .into_iter()
        .map(|t| t.with_ignored_flag(why.is_some()))
        .collect();
    libtest_mimic::run(&args, trials).exit_code()
}
