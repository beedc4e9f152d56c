//! The smallest csi-kit driver: a node plugin that answers NodeGetInfo and
//! nothing else, with an Identity made of defaults. It passes the
//! conformance suite's identity checks and node info check.

use std::sync::Arc;

use csi_kit::conformance::{Status, Suite, SuiteConfig};
use csi_kit::proto::v1::{NodeGetInfoRequest, NodeGetInfoResponse};
use csi_kit::server::{
    CallContext, Capabilities, CsiResult, DefaultIdentity, Endpoint, Node, PluginInfo, ServeMode,
    Server, async_trait,
};

struct Minimal;

#[async_trait]
impl Node for Minimal {
    async fn node_get_info(
        &self,
        _: &CallContext,
        _: NodeGetInfoRequest,
    ) -> CsiResult<NodeGetInfoResponse> {
        Ok(NodeGetInfoResponse {
            node_id: "node-1".into(),
            ..Default::default()
        })
    }
}

#[tokio::test]
async fn a_minimal_driver_passes_the_identity_checks() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = Endpoint::unix(dir.path().join("csi.sock")).unwrap();
    let server = Server::builder(PluginInfo::new("minimal.csi-kit.dev", "0.1.0").unwrap())
        .capabilities(Capabilities::new())
        .endpoint(endpoint.clone())
        .mode(ServeMode::Node)
        .identity(Arc::new(DefaultIdentity))
        .node(Arc::new(Minimal))
        .build()
        .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.serve_with_shutdown(async {
        let _ = stopped.await;
    }));

    let report = Suite::new(SuiteConfig::new(endpoint.to_string()).focus("identity"))
        .run()
        .await
        .unwrap();
    println!("{report}");
    assert!(report.is_success(), "{report}");
    let identity: Vec<_> = report
        .results
        .iter()
        .filter(|r| r.id.starts_with("identity."))
        .collect();
    assert_eq!(identity.len(), 4);
    // Served on one endpoint, the split-endpoint check is skipped; every
    // other identity check passes.
    assert!(
        identity.iter().all(|r| match r.id.as_str() {
            "identity.split_endpoints" => matches!(r.status, Status::Skipped(_)),
            _ => matches!(r.status, Status::Passed),
        }),
        "{report}"
    );

    stop.send(()).unwrap();
    serving.await.unwrap().unwrap();
    assert!(
        !dir.path().join("csi.sock").exists(),
        "socket removed at shutdown"
    );
}
