//! Serving the routes over h2-unary's HTTP/2 server connections.
//!
//! Every CSI method is unary, so a connection needs only what h2-unary
//! holds: each request is gathered whole, handed to the routes (the tower
//! stack and the generated dispatch) as an `http::Request`, and the answer
//! collected and written back in one write. A call to an idle plugin runs
//! on cold caches and pays for each line of code on its path; h2, hyper
//! and tonic's transport were most of those lines (docs/benchmarks.md,
//! "Session 19"). Any `:authority` is accepted, as gRPC C-core and
//! grpc-java name the socket's path there.

use std::future::Future;
use std::io;
use std::pin::pin;
use std::time::Duration;

use bytes::Bytes;
use h2_unary::server::{self as h2s, Limits};
use http_body_util::{BodyExt, Full};
use tokio::io::{AsyncRead, AsyncWrite};
use tonic::codegen::http;
use tonic::service::Routes;
use tower::ServiceExt;

/// How a connection's calls reach the routes.
#[derive(Clone)]
pub(crate) struct Calls {
    pub(crate) routes: Routes,
    /// Answer a `:authority` that is not a valid URI authority (a socket
    /// path) with an error, as a strict HTTP/2 server does; only to test
    /// that a client or suite notices such a server.
    pub(crate) strict_authority: bool,
}

/// Accepts connections from `accept` until `stop` completes, serving each
/// on a task of its own; then asks every connection to finish (GOAWAY,
/// then the calls it took) and returns once they have.
pub(crate) async fn serve<S, A, F>(mut accept: A, calls: Calls, stop: impl Future<Output = ()>)
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    A: FnMut() -> F,
    F: Future<Output = io::Result<S>>,
{
    let (closing, closed) = tokio::sync::watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    let mut stop = pin!(stop);
    loop {
        tokio::select! {
            accepted = accept() => match accepted {
                Ok(io) => {
                    let calls = calls.clone();
                    let mut closed = closed.clone();
                    connections.spawn(async move {
                        let shutdown = async move {
                            let _ = closed.wait_for(|closing| *closing).await;
                        };
                        let handler = move |request| call(calls.clone(), request);
                        if let Err(e) = h2s::serve(io, Limits::default(), handler, shutdown).await {
                            tracing::debug!(error = %e, "connection ended");
                        }
                    });
                }
                Err(e) => {
                    // Out of descriptors, most likely: wait, as a busy
                    // loop would not free any.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            () = &mut stop => break,
        }
    }
    let _ = closing.send(true);
    while connections.join_next().await.is_some() {}
}

/// One call: the request as tonic's routes take it, their answer as
/// h2-unary writes it.
async fn call(calls: Calls, request: h2s::Request) -> h2s::Response {
    let head = &request.head;
    let path = head.get(b":path").unwrap_or(b"/");
    let authority = head.get(b":authority").unwrap_or(b"");
    if calls.strict_authority && http::uri::Authority::try_from(authority).is_err() {
        return status(
            tonic::Code::Internal,
            "the :authority is not a valid authority",
        );
    }
    let Ok(uri) = http::Uri::try_from(path) else {
        return status(tonic::Code::Internal, "the :path is not a valid path");
    };
    let mut builder = http::Request::builder()
        .method(http::Method::POST)
        .uri(uri)
        .version(http::Version::HTTP_2);
    let mut timeout = None;
    for (name, value, _) in head.iter() {
        if name.starts_with(b":") {
            continue;
        }
        let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(name),
            http::HeaderValue::from_bytes(value),
        ) else {
            return status(tonic::Code::Internal, "a malformed header field");
        };
        if name == "grpc-timeout" {
            timeout = value
                .to_str()
                .ok()
                .and_then(csi_driver::clock::parse_grpc_timeout);
        }
        builder = builder.header(name, value);
    }
    let body = tonic::body::Body::new(Full::new(Bytes::from(request.body)));
    let Ok(request) = builder.body(body) else {
        return status(tonic::Code::Internal, "a malformed request");
    };
    let answer = calls.routes.oneshot(request);
    let answer = match timeout {
        // As tonic's server does: past the caller's deadline the call is
        // dropped and answered CANCELLED.
        Some(limit) => match tokio::time::timeout(limit, answer).await {
            Ok(answer) => answer,
            Err(_) => return status(tonic::Code::Cancelled, "Timeout expired"),
        },
        None => answer.await,
    };
    let Ok(answer) = answer;
    let (parts, body) = answer.into_parts();
    let Ok(collected) = body.collect().await else {
        return status(tonic::Code::Internal, "the answer's body failed");
    };
    let trailers = collected.trailers().map(fields).unwrap_or_default();
    h2s::Response {
        head: answer_head(&parts),
        body: collected.to_bytes().to_vec(),
        trailers,
    }
}

/// `:status`, then the answer's header fields.
fn answer_head(parts: &http::response::Parts) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut head = vec![(
        b":status".to_vec(),
        parts.status.as_str().as_bytes().to_vec(),
    )];
    head.extend(fields(&parts.headers));
    head
}

fn fields(headers: &http::HeaderMap) -> Vec<(Vec<u8>, Vec<u8>)> {
    headers
        .iter()
        .map(|(name, value)| (name.as_str().as_bytes().to_vec(), value.as_bytes().to_vec()))
        .collect()
}

/// A trailers-only answer with `code` and `message`.
fn status(code: tonic::Code, message: &str) -> h2s::Response {
    let (parts, ()) = tonic::Status::new(code, message)
        .into_http::<()>()
        .into_parts();
    h2s::Response {
        head: answer_head(&parts),
        ..h2s::Response::default()
    }
}
