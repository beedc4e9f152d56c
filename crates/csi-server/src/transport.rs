//! Serving the routes over h2-unary's HTTP/2 server connections.
//!
//! Every CSI method is unary (or a stream the driver produces whole), so a
//! connection needs only what h2-unary holds: each request is gathered
//! whole, its method found from `:path` in the method table and its
//! message handed to the generated dispatch (decoded, sent through the
//! tower stack), and the answer written back in one write. A call to an
//! idle plugin runs on cold caches and pays for each line of code on its
//! path; h2, hyper, tonic's transport and its routing were most of those
//! lines (docs/benchmarks.md, "Session 19", "Session 20"). Any `:authority`
//! is accepted, as gRPC C-core and grpc-java name the socket's path there.

use std::future::Future;
use std::io;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use csi_proto::methods::Method;
use h2_unary::server::{self as h2s, Limits};
use tokio::io::{AsyncRead, AsyncWrite};
use tonic::Status;
use tonic::codegen::http;

use crate::dispatch::Dispatch;

/// How a connection's calls reach the drivers.
#[derive(Clone)]
pub(crate) struct Calls {
    /// The dispatch; calls to services without a driver are UNIMPLEMENTED.
    pub(crate) dispatch: Arc<Dispatch>,
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

/// One call: its method from `:path`, its message from gRPC's framing,
/// its answer from the dispatch.
async fn call(calls: Calls, request: h2s::Request) -> h2s::Response {
    let head = &request.head;
    if calls.strict_authority {
        let authority = head.get(b":authority").unwrap_or(b"");
        if http::uri::Authority::try_from(authority).is_err() {
            return failed(Status::internal("the :authority is not a valid authority"));
        }
    }
    let path = head.get(b":path").unwrap_or(b"/");
    let method = std::str::from_utf8(path).ok().and_then(Method::from_path);
    let Some(method) = method.filter(|m| calls.dispatch.serves(*m)) else {
        return failed(not_served(path));
    };
    let timeout = head
        .get(b"grpc-timeout")
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(csi_driver::clock::parse_grpc_timeout);
    let message = match message(&request.body) {
        Ok(message) => message,
        Err(status) => return failed(status),
    };
    let answer = calls.dispatch.answer(method, message, timeout);
    let answer = match timeout {
        // As tonic's server does: past the caller's deadline the call is
        // dropped and answered CANCELLED.
        Some(limit) => match tokio::time::timeout(limit, answer).await {
            Ok(answer) => answer,
            Err(_) => return failed(Status::cancelled("Timeout expired")),
        },
        None => answer.await,
    };
    match answer.status {
        None => h2s::Response {
            head: grpc_head(),
            body: answer.messages,
            trailers: vec![(b"grpc-status".to_vec(), b"0".to_vec())],
        },
        Some(status) if answer.messages.is_empty() => failed(status),
        Some(status) => h2s::Response {
            head: grpc_head(),
            body: answer.messages,
            trailers: status_fields(&status),
        },
    }
}

/// The one message of a unary request's body: uncompressed (no
/// `grpc-encoding` is accepted), its length as its prefix says.
fn message(body: &[u8]) -> Result<&[u8], Status> {
    let Some((prefix, message)) = body.split_first_chunk::<5>() else {
        return Err(Status::internal("the request has no message"));
    };
    if prefix[0] != 0 {
        return Err(Status::unimplemented(
            "the request message is compressed; this server takes none",
        ));
    }
    let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]);
    if usize::try_from(len).ok() != Some(message.len()) {
        return Err(Status::internal(
            "the request body is not one message of the length its prefix gives",
        ));
    }
    Ok(message)
}

/// UNIMPLEMENTED with a message naming the method: a service outside the
/// server's mode or not provided, or no CSI method at all.
fn not_served(path: &[u8]) -> Status {
    let path = String::from_utf8_lossy(path);
    let method = path.trim_start_matches('/');
    if method.starts_with("csi.v1.") {
        Status::unimplemented(format!(
            "{method} is not served by this plugin (not in its mode, or not provided)"
        ))
    } else {
        Status::unimplemented(format!("{method} is not a CSI method"))
    }
}

/// `:status` and the content type of every gRPC answer.
fn grpc_head() -> Vec<(Vec<u8>, Vec<u8>)> {
    vec![
        (b":status".to_vec(), b"200".to_vec()),
        (b"content-type".to_vec(), b"application/grpc".to_vec()),
    ]
}

/// `grpc-status`, `grpc-message` (percent-encoded) and any details, as
/// tonic writes them.
fn status_fields(status: &Status) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut fields = http::HeaderMap::new();
    // `grpc-status` goes in first; the message is percent-encoded and the
    // details base64, so neither can be a bad header value.
    let _ = status.add_header(&mut fields);
    fields
        .iter()
        .map(|(name, value)| (name.as_str().as_bytes().to_vec(), value.as_bytes().to_vec()))
        .collect()
}

/// A trailers-only answer with `status`.
fn failed(status: Status) -> h2s::Response {
    let mut head = grpc_head();
    head.extend(status_fields(&status));
    h2s::Response {
        head,
        ..h2s::Response::default()
    }
}
