//! One unary gRPC call with a chosen `:authority`, as gRPC C-core and
//! grpc-java clients send it on unix sockets. tonic's client cannot send
//! such a value (its URI type refuses it); h2-unary's client sends it
//! verbatim, so tests and the conformance suite use this to check that a
//! server answers anyway.

use std::io;

use h2_unary::client::{self, CallError};
use h2_unary::hpack::HeaderList;
use tokio::io::{AsyncRead, AsyncWrite};

/// The largest answer read.
const MAX_ANSWER: usize = 4 << 20;

/// What the server answered on the call's stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawReply {
    /// `:status` of the response headers.
    pub http_status: Option<u16>,
    /// `grpc-status` (from the trailers, or a trailers-only response).
    pub grpc_status: Option<i32>,
    /// `grpc-message`, as sent (percent-encoded).
    pub grpc_message: Option<String>,
    /// The first response message, without its 5-byte gRPC prefix.
    pub message: Option<Vec<u8>>,
    /// The RST_STREAM error code, when the server reset the stream
    /// (1 is PROTOCOL_ERROR).
    pub reset: Option<u32>,
}

/// Why the call got no answer on its stream.
#[derive(Debug, thiserror::Error)]
pub enum RawCallError {
    /// The connection could not be set up.
    #[error("connection i/o: {0}")]
    Io(#[from] io::Error),
    /// The connection broke or was ended before the answer, or the server
    /// broke HTTP/2.
    #[error(transparent)]
    Call(#[from] CallError),
}

/// Calls `path` (e.g. `/csi.v1.Identity/Probe`) with the encoded protobuf
/// `request` on a fresh connection `io`, sending `authority` verbatim as
/// `:authority`. Apply a timeout around it; the server's answer is
/// returned whatever its status, a reset of the stream included.
pub async fn unary_with_authority<S>(
    io: S,
    authority: &str,
    path: &str,
    request: &[u8],
) -> Result<RawReply, RawCallError>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let connection = client::handshake(io).await?;
    let mut body = Vec::with_capacity(5 + request.len());
    body.push(0);
    body.extend_from_slice(&(request.len() as u32).to_be_bytes());
    body.extend_from_slice(request);
    let call = client::Request {
        path,
        authority,
        headers: &[("content-type", b"application/grpc"), ("te", b"trailers")],
        body: &body,
        max_response: MAX_ANSWER,
    };
    let answer = match connection.call(&call).await {
        Ok(answer) => answer,
        Err(CallError::Reset(reason)) => {
            return Ok(RawReply {
                reset: Some(reason.0),
                ..RawReply::default()
            });
        }
        Err(e) => return Err(e.into()),
    };
    let mut reply = RawReply::default();
    read_fields(&answer.head, &mut reply);
    read_fields(&answer.trailers, &mut reply);
    if let Some((prefix, rest)) = answer.data.split_first_chunk::<5>() {
        let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
        reply.message = Some(rest.get(..len).unwrap_or(rest).to_vec());
    }
    Ok(reply)
}

fn read_fields(list: &HeaderList, reply: &mut RawReply) {
    let text = |v: &[u8]| String::from_utf8_lossy(v).into_owned();
    for (name, value, _) in list.iter() {
        match name {
            b":status" => reply.http_status = text(value).parse().ok(),
            b"grpc-status" => reply.grpc_status = text(value).parse().ok(),
            b"grpc-message" => reply.grpc_message = Some(text(value)),
            _ => {}
        }
    }
}
