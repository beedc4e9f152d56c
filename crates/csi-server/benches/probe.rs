//! Probe round trip over a unix socket: a bare tonic Identity handler vs
//! the full csi-server stack (tracing, panic catching, gating, validation,
//! readiness, locking).

use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use csi_client::{ClientOptions, CsiClient};
use csi_proto::testing::FakeIdentity;
use csi_proto::v1::identity_server::IdentityServer;
use csi_proto::v1::*;
use csi_server::{Endpoint, Node, PluginInfo, ServeMode, Server};
use tokio::runtime::Runtime;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::Status;

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
            .add_service(IdentityServer::new(FakeIdentity))
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
/// stack.
fn stack_overhead(c: &mut Criterion) {
    use csi_server::layer::{
        BoxCsiService, CatchPanicLayer, CsiCall, GatingLayer, LockingLayer, Readiness,
        ReadinessLayer, TracingLayer, ValidationLayer,
    };
    use csi_server::{Capabilities, DriverService, Drivers};
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    // As the server builds it: the built-in layers composed statically over
    // the boxed driver, and boxed once.
    let driver = BoxCsiService::new(DriverService::new(Drivers {
        identity: Some(Arc::new(csi_server::DefaultIdentity)),
        ..Default::default()
    }));
    let stack = BoxCsiService::new(
        tower::ServiceBuilder::new()
            .layer(TracingLayer)
            .layer(CatchPanicLayer)
            .layer(GatingLayer::new(Capabilities::new()))
            .layer(ValidationLayer)
            .layer(ReadinessLayer::new(Readiness::ready()))
            .layer(LockingLayer::new())
            .service(driver),
    );
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

/// The authority adapter alone, per request: one gRPC request's HEADERS
/// and DATA frames fed through a connection's rewriter, with an authority
/// h2 accepts (decoded, passed on unchanged) and with a socket path as
/// gRPC C-core sends it (decoded and re-encoded).
fn authority_adapter(c: &mut Criterion) {
    use csi_server::authority::{Rewriter, hpack};
    fn request(authority: &[u8]) -> Vec<u8> {
        let mut block = Vec::new();
        for (name, value) in [
            (&b":method"[..], &b"POST"[..]),
            (b":scheme", b"http"),
            (b":path", b"/csi.v1.Identity/Probe"),
            (b":authority", authority),
            (b"te", b"trailers"),
            (b"content-type", b"application/grpc"),
            (
                b"user-agent",
                b"grpc-python/1.85.1 grpc-c/52.0.0 (linux; chttp2)",
            ),
            (b"grpc-accept-encoding", b"identity, deflate, gzip"),
            (b"grpc-timeout", b"10S"),
        ] {
            hpack::encode_literal(name, value, false, &mut block);
        }
        let mut out = Vec::new();
        out.extend_from_slice(&(block.len() as u32).to_be_bytes()[1..]);
        out.extend_from_slice(&[0x1, 0x4, 0, 0, 0, 1]);
        out.extend_from_slice(&block);
        out.extend_from_slice(&[0, 0, 5, 0x0, 0x1, 0, 0, 0, 1, 0, 0, 0, 0, 0]);
        out
    }
    let mut group = c.benchmark_group("authority_adapter_per_request");
    for (name, authority) in [
        ("valid_authority_passed_on", &b"localhost"[..]),
        (
            "socket_path_re_encoded",
            b"%2Fvar%2Flib%2Fkubelet%2Fplugins%2Fcsi.sock",
        ),
    ] {
        let req = request(authority);
        let mut rewriter = Rewriter::new();
        let mut out = Vec::new();
        rewriter
            .feed(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", &mut out)
            .unwrap();
        group.bench_function(name, |b| {
            b.iter(|| {
                out.clear();
                rewriter.feed(&req, &mut out).unwrap();
                assert!(!out.is_empty());
            })
        });
    }
    group.finish();
}

criterion_group!(benches, probe, stack_overhead, authority_adapter);
criterion_main!(benches);
