//! Controller and node on separate endpoints (the fake driver served twice
//! over one state, as a controller process and a node process), and secrets
//! that must never come back in a log or an error.

use std::collections::HashMap;

use csi_conformance::fake::{FakeDriver, FakeSplitServer, Fault, PUBLISH_CONTEXT_KEY};
use csi_conformance::{Report, SecretKind, Secrets, Status, Suite, SuiteConfig, run_and_assert};

fn config(server: &FakeSplitServer, dirs: &tempfile::TempDir) -> SuiteConfig {
    let mut c = SuiteConfig::new(server.node_endpoint())
        .controller_endpoint(server.controller_endpoint())
        .driver_log(server.log_path());
    c.staging_dir = dirs.path().join("staging");
    c.target_dir = dirs.path().join("target");
    // A VolumeAttributesClass the fake accepts, as a vendor configures one.
    c.mutable_parameters = [("iops".to_owned(), "3000".to_owned())].into();
    c
}

#[tokio::test]
async fn split_endpoints_pass_everything_in_both_access_types() {
    let server = FakeDriver::new().serve_split().await.expect("serves");
    let dirs = tempfile::tempdir().unwrap();
    for cfg in [config(&server, &dirs), config(&server, &dirs).block()] {
        let report = run_and_assert(cfg).await;
        assert!(report.skipped_ids().is_empty(), "{report}");
        assert_eq!(report.passed(), Suite::checks().len(), "{report}");
    }
    // Controller calls reached only the controller process: the node
    // server has no controller service to answer them.
    let node = csi_client::CsiClient::connect(server.node_endpoint())
        .await
        .unwrap();
    let err = node
        .controller()
        .controller_get_capabilities(csi_proto::v1::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unimplemented);
    server.shutdown().await;
}

/// The split run passes only because the suite hands the node what
/// ControllerPublishVolume returned: the fake node refuses a volume whose
/// publish_context is missing.
#[tokio::test]
async fn the_fake_node_requires_the_publish_context() {
    use csi_proto::v1::*;
    let server = FakeDriver::new().serve_split().await.expect("serves");
    let dirs = tempfile::tempdir().unwrap();
    let ctrl = csi_client::CsiClient::connect(server.controller_endpoint())
        .await
        .unwrap();
    let node = csi_client::CsiClient::connect(server.node_endpoint())
        .await
        .unwrap();
    let cap = VolumeCapability::mount("")
        .with_access_mode(volume_capability::access_mode::Mode::SingleNodeWriter);
    let vol = ctrl
        .call(CreateVolumeRequest {
            name: "split-publish-context".into(),
            volume_capabilities: vec![cap.clone()],
            ..Default::default()
        })
        .await
        .unwrap()
        .volume
        .unwrap();
    let context = ctrl
        .call(ControllerPublishVolumeRequest {
            volume_id: vol.volume_id.clone(),
            node_id: "fake-node".into(),
            volume_capability: Some(cap.clone()),
            ..Default::default()
        })
        .await
        .unwrap()
        .publish_context;
    let mut stage = NodeStageVolumeRequest {
        volume_id: vol.volume_id.clone(),
        staging_target_path: dirs.path().to_string_lossy().into_owned(),
        volume_capability: Some(cap),
        ..Default::default()
    };
    let err = node.call(stage.clone()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains(PUBLISH_CONTEXT_KEY),
        "{}",
        err.message()
    );
    stage.publish_context = context;
    node.call(stage.clone()).await.unwrap();
    node.call(NodeUnstageVolumeRequest {
        volume_id: vol.volume_id.clone(),
        staging_target_path: stage.staging_target_path,
    })
    .await
    .unwrap();
    server.shutdown().await;
}

#[tokio::test]
async fn a_controller_endpoint_with_another_plugin_name_is_caught() {
    let server = FakeDriver::new().serve_split().await.expect("serves");
    let dirs = tempfile::tempdir().unwrap();
    let other = FakeDriver::new()
        .with_name("other.csi.example.com")
        .serve()
        .await
        .expect("serves");
    let mut cfg = config(&server, &dirs).focus("identity.split_endpoints");
    cfg.controller_endpoint = Some(other.endpoint().to_string());
    let report = Suite::new(cfg).run().await.expect("suite runs");
    let result = report.get("identity.split_endpoints").unwrap();
    match &result.status {
        Status::Failed(f) => {
            let text = f.to_string();
            assert!(text.contains("other.csi.example.com"), "{text}");
            assert!(text.contains("pairs them by name"), "{text}");
        }
        other => panic!("expected a failure, got {other:?}\n{report}"),
    }
    other.shutdown().await;
    server.shutdown().await;
}

/// Runs the suite split against a faulty driver with secrets from a
/// csi-sanity secrets file and returns the report and the secret values.
async fn run_with_secrets_file(fault: Fault) -> (Report, Vec<String>) {
    let server = FakeDriver::new()
        .with_fault(fault)
        .serve_split()
        .await
        .expect("serves");
    let dirs = tempfile::tempdir().unwrap();
    let file = "NodeStageVolumeSecret:\n  password: \"stage-secret-4a1f\"\n\
        CreateVolumeSecret:\n  token: create-secret-9c2e\n";
    let mut cfg = config(&server, &dirs);
    cfg.secrets = Secrets::from_sanity_yaml(file).expect("valid file");
    let values = cfg.secrets.log_markers();
    let report = Suite::new(cfg).run().await.expect("suite runs");
    server.shutdown().await;
    (report, values)
}

fn failures(report: &Report) -> Vec<&str> {
    report.failures().map(|(r, _)| r.id.as_str()).collect()
}

fn assert_never_repeated(report: &Report, values: &[String]) {
    let text = report.to_string();
    let xml = report.to_junit_xml();
    for v in values {
        assert!(!text.contains(v.as_str()), "the report repeats a secret");
        assert!(!xml.contains(v.as_str()), "the JUnit XML repeats a secret");
    }
}

#[tokio::test]
async fn node_stage_secrets_leaked_to_the_log_are_caught() {
    let (report, values) = run_with_secrets_file(Fault::LeaksSecretsToLog).await;
    assert_eq!(values.len(), 2);
    assert_eq!(
        failures(&report),
        ["general.secrets_not_in_logs"],
        "{report}"
    );
    let text = report.to_string();
    assert!(
        text.contains("NodeStageVolumeSecret") || text.contains("CreateVolumeSecret"),
        "{text}"
    );
    assert_never_repeated(&report, &values);
}

#[tokio::test]
async fn secrets_echoed_in_an_error_are_caught() {
    let (report, values) = run_with_secrets_file(Fault::LeaksSecretsInErrors).await;
    assert_eq!(
        failures(&report),
        ["general.secrets_not_in_errors"],
        "{report}"
    );
    let text = report.to_string();
    assert!(text.contains("NodeStageVolume (NOT_FOUND)"), "{text}");
    assert!(text.contains("<SECRET>"), "{text}");
    assert_never_repeated(&report, &values);
}

#[tokio::test]
async fn configured_secrets_reach_the_driver() {
    // With the log fault the driver writes what it received: the file's
    // NodeStage secret arrived with NodeStageVolume, and only there.
    let server = FakeDriver::new()
        .with_fault(Fault::LeaksSecretsToLog)
        .serve_split()
        .await
        .expect("serves");
    let dirs = tempfile::tempdir().unwrap();
    let mut cfg = config(&server, &dirs).focus("node.stage.idempotent");
    let mut secrets = Secrets::none();
    secrets.set(
        SecretKind::NodeStageVolume,
        HashMap::from([("password".to_string(), "stage-secret-77d0".to_string())]),
    );
    cfg.secrets = secrets;
    let report = Suite::new(cfg).run().await.expect("suite runs");
    assert!(report.get("node.stage.idempotent").unwrap().status == Status::Passed);
    let log = std::fs::read_to_string(server.log_path()).unwrap();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("stage-secret-77d0"))
        .collect();
    assert!(!lines.is_empty(), "{log}");
    assert!(
        lines.iter().all(|l| l.starts_with("NodeStageVolume ")),
        "{log}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn the_controller_log_is_scanned_too() {
    let server = FakeDriver::new().serve_split().await.expect("serves");
    let dirs = tempfile::tempdir().unwrap();
    let controller_log = dirs.path().join("controller.log");
    std::fs::write(
        &controller_log,
        "ok\nCreateVolume token=create-secret-9c2e\n",
    )
    .unwrap();
    let mut cfg = config(&server, &dirs).focus("general.secrets_not_in_logs");
    cfg.secrets = Secrets::from_sanity_yaml("CreateVolumeSecret:\n  token: create-secret-9c2e\n")
        .expect("valid file");
    cfg.controller_log = Some(controller_log.clone());
    let values = cfg.secrets.log_markers();
    let report = Suite::new(cfg).run().await.expect("suite runs");
    match &report.get("general.secrets_not_in_logs").unwrap().status {
        Status::Failed(f) => {
            let text = f.to_string();
            assert!(text.contains("controller.log at line 2"), "{text}");
            assert!(text.contains("CreateVolumeSecret"), "{text}");
        }
        other => panic!("expected a failure, got {other:?}\n{report}"),
    }
    assert_never_repeated(&report, &values);
    server.shutdown().await;
}
