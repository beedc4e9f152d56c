//! Probe round trip over a unix socket: a bare tonic Identity handler vs
//! the full csi-server stack (tracing, panic catching, gating, validation,
//! readiness, locking).

use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use csi_client::{ClientOptions, CsiClient};
use csi_proto::v1::identity_server::{Identity as TonicIdentity, IdentityServer};
use csi_proto::v1::*;
use csi_server::{Endpoint, Node, PluginInfo, ServeMode, Server};
use tokio::runtime::Runtime;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

struct Bare;

#[tonic::async_trait]
impl TonicIdentity for Bare {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse::default()))
    }
    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(GetPluginCapabilitiesResponse::default()))
    }
    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}

struct NodeDriver;
impl Node for NodeDriver {}

async fn client(endpoint: Endpoint) -> CsiClient {
    CsiClient::connect_when_ready(endpoint, ClientOptions::default(), Duration::from_secs(30))
        .await
        .expect("server reachable")
}

fn probe(c: &mut Criterion) {
    let rt = Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();

    let bare_path = dir.path().join("bare.sock");
    let listener = {
        let _guard = rt.enter();
        tokio::net::UnixListener::bind(&bare_path).unwrap()
    };
    rt.spawn(
        tonic::transport::Server::builder()
            .add_service(IdentityServer::new(Bare))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );

    let full_endpoint = Endpoint::unix(dir.path().join("full.sock")).unwrap();
    let server = Server::builder(PluginInfo::new("bench.csi.example.com", "1").unwrap())
        .mode(ServeMode::Node)
        .endpoint(full_endpoint.clone())
        .node(Arc::new(NodeDriver))
        .build()
        .unwrap();
    rt.spawn(server.serve_with_shutdown(std::future::pending()));

    let bare = rt.block_on(client(Endpoint::unix(&bare_path).unwrap()));
    let full = rt.block_on(client(full_endpoint));

    let mut group = c.benchmark_group("probe_round_trip");
    for (name, client) in [("bare_tonic", bare), ("csi_server_full_stack", full)] {
        let mut identity = client.identity();
        group.bench_function(name, |b| {
            b.iter(|| {
                rt.block_on(identity.probe(ProbeRequest {}))
                    .expect("probe succeeds")
            })
        });
    }
    group.finish();
}

/// The in-process cost of the layers alone (no socket, no HTTP/2): the
/// same Probe handler called directly and through the server's default
/// stack (each layer boxed, as the server builds it).
fn stack_overhead(c: &mut Criterion) {
    use csi_server::layer::{
        BoxCsiService, CatchPanicLayer, CsiCall, GatingLayer, LockingLayer, Readiness,
        ReadinessLayer, TracingLayer, ValidationLayer,
    };
    use csi_server::{Capabilities, DriverService, Drivers};
    use tower::Layer;
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut stack = BoxCsiService::new(DriverService::new(Drivers {
        identity: Some(Arc::new(csi_server::DefaultIdentity)),
        ..Default::default()
    }));
    stack = BoxCsiService::new(LockingLayer::new().layer(stack));
    stack = BoxCsiService::new(ReadinessLayer::new(Readiness::ready()).layer(stack));
    stack = BoxCsiService::new(ValidationLayer.layer(stack));
    stack = BoxCsiService::new(GatingLayer::new(Capabilities::new()).layer(stack));
    stack = BoxCsiService::new(CatchPanicLayer.layer(stack));
    stack = BoxCsiService::new(TracingLayer.layer(stack));
    let handler = |_: ProbeRequest| async { Ok::<_, Status>(ProbeResponse { ready: Some(true) }) };
    let mut group = c.benchmark_group("probe_in_process");
    group.bench_function("handler_only", |b| {
        b.iter(|| rt.block_on(handler(ProbeRequest {})).unwrap())
    });
    group.bench_function("full_stack", |b| {
        b.iter(|| {
            rt.block_on(stack.call_one(CsiCall::new(1, ProbeRequest {})))
                .unwrap()
        })
    });
    group.finish();
}

criterion_group!(benches, probe, stack_overhead);
criterion_main!(benches);
