//! Unary calls written straight onto one HTTP/2 connection ([`h2`]).
//!
//! tonic's client passes each call through a buffer task and pipes the
//! request's body after its headers, so a request usually leaves in two
//! writes and the server wakes for each. Here a call's HEADERS and DATA
//! frames are queued together and leave in one write. The connection is
//! dialled when the client connects (or on the first call, if lazy) and
//! again on the first call after it breaks.

use std::io;
use std::sync::Mutex;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use csi_proto::methods::RpcRequest;
use h2::client::SendRequest;
use http::{HeaderMap, HeaderValue, Request, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite};
use tonic::{Code, Status};

use crate::client::ClientOptions;
use crate::endpoint::Endpoint;

/// The largest response message accepted (tonic's default limit).
const MAX_RESPONSE: usize = 4 << 20;

/// One endpoint's HTTP/2 connection for unary calls.
#[derive(Debug)]
pub(crate) struct UnaryChannel {
    endpoint: Endpoint,
    /// `http://` and the `:authority` every request carries.
    origin: String,
    options: ClientOptions,
    /// The connection's handle; `None` until dialled.
    sender: Mutex<Option<SendRequest<Bytes>>>,
}

impl UnaryChannel {
    /// A channel that dials on its first call.
    pub(crate) fn lazy(endpoint: Endpoint, options: ClientOptions) -> Self {
        let origin = match &endpoint {
            Endpoint::Unix(_) => "http://localhost".to_owned(),
            Endpoint::Tcp(addr) => format!("http://{addr}"),
        };
        Self {
            endpoint,
            origin,
            options,
            sender: Mutex::new(None),
        }
    }

    /// A channel connected now.
    pub(crate) async fn connect(endpoint: Endpoint, options: ClientOptions) -> io::Result<Self> {
        let channel = Self::lazy(endpoint, options);
        let sender = channel.dial().await?;
        *channel.lock() = Some(sender);
        Ok(channel)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<SendRequest<Bytes>>> {
        self.sender.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens the connection (within the connect timeout) and drives it on
    /// a task of its own, which ends when the connection closes or every
    /// handle to it is dropped.
    async fn dial(&self) -> io::Result<SendRequest<Bytes>> {
        let connect = async {
            match &self.endpoint {
                Endpoint::Unix(path) => {
                    handshake(tokio::net::UnixStream::connect(path).await?).await
                }
                Endpoint::Tcp(addr) => {
                    let stream = tokio::net::TcpStream::connect(addr).await?;
                    stream.set_nodelay(true)?;
                    handshake(stream).await
                }
            }
        };
        tokio::time::timeout(self.options.connect_timeout, connect)
            .await
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no connection within {:?}", self.options.connect_timeout),
                )
            })?
    }

    /// A handle ready for a new stream: the open connection's, or a new
    /// connection's when there is none or it broke.
    async fn ready(&self) -> Result<SendRequest<Bytes>, Status> {
        let open = self.lock().clone();
        if let Some(sender) = open
            && let Ok(ready) = sender.ready().await
        {
            return Ok(ready);
        }
        let fresh = self.dial().await.map_err(|e| {
            Status::unavailable(format!("cannot connect to {}: {e}", self.endpoint))
        })?;
        *self.lock() = Some(fresh.clone());
        fresh.ready().await.map_err(|e| status_of(&e))
    }

    /// Sends `request` and waits for its answer, within the call timeout.
    pub(crate) async fn call<Req: RpcRequest>(
        &self,
        request: Req,
    ) -> Result<Req::Response, Status> {
        let message = frame(&request)?;
        let path = Req::METHOD.path();
        let body = match self.options.call_timeout {
            Some(limit) => tokio::time::timeout(limit, self.exchange(path, message))
                .await
                .map_err(|_| {
                    Status::deadline_exceeded(format!("{path}: no answer within {limit:?}"))
                })??,
            None => self.exchange(path, message).await?,
        };
        <Req::Response as prost::Message>::decode(body)
            .map_err(|e| Status::internal(format!("{path}: decoding the answer: {e}")))
    }

    /// One stream: the request's frames, then the answer's message.
    async fn exchange(&self, path: &str, message: Bytes) -> Result<Bytes, Status> {
        let mut request = Request::post(format!("{}{path}", self.origin))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header(
                "user-agent",
                concat!("csi-client/", env!("CARGO_PKG_VERSION")),
            );
        if let Some(limit) = self.options.call_timeout {
            request = request.header("grpc-timeout", grpc_timeout(limit));
        }
        let request = request
            .body(())
            .map_err(|e| Status::internal(format!("{path}: building the request: {e}")))?;
        let mut sender = self.ready().await?;
        let (answer, mut stream) = sender
            .send_request(request, false)
            .map_err(|e| status_of(&e))?;
        // Queued with the HEADERS frame; the connection task writes both.
        stream.send_data(message, true).map_err(|e| status_of(&e))?;
        let (head, mut body) = answer.await.map_err(|e| status_of(&e))?.into_parts();
        if head.status != StatusCode::OK {
            return Err(status_of_http(head.status));
        }
        // A trailers-only answer carries its status in the headers.
        if let Some(status) = status_in(&head.headers) {
            return Err(match status.code() {
                Code::Ok => Status::internal(format!("{path}: the answer has no message")),
                _ => status,
            });
        }
        let mut data = BytesMut::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(|e| status_of(&e))?;
            let _ = body.flow_control().release_capacity(chunk.len());
            if data.len() + chunk.len() > MAX_RESPONSE + 5 {
                return Err(Status::resource_exhausted(format!(
                    "{path}: the answer is larger than {MAX_RESPONSE} bytes"
                )));
            }
            data.extend_from_slice(&chunk);
        }
        let trailers = body.trailers().await.map_err(|e| status_of(&e))?;
        match trailers.as_ref().and_then(status_in) {
            Some(status) if status.code() != Code::Ok => return Err(status),
            Some(_) => {}
            None => {
                return Err(Status::internal(format!(
                    "{path}: the answer ended without grpc-status"
                )));
            }
        }
        unframe(data.freeze())
            .ok_or_else(|| Status::internal(format!("{path}: the answer is not one gRPC message")))
    }
}

async fn handshake<T>(io: T) -> io::Result<SendRequest<Bytes>>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = h2::client::handshake(io).await.map_err(io::Error::other)?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// A message with gRPC's prefix: not compressed, then its length.
fn frame(message: &impl prost::Message) -> Result<Bytes, Status> {
    let len = message.encoded_len();
    let prefix = u32::try_from(len)
        .map_err(|_| Status::invalid_argument(format!("a request of {len} bytes is too large")))?;
    let mut buf = BytesMut::with_capacity(5 + len);
    buf.put_u8(0);
    buf.put_u32(prefix);
    message
        .encode(&mut buf)
        .map_err(|e| Status::internal(format!("encoding the request: {e}")))?;
    Ok(buf.freeze())
}

/// The one uncompressed message in `data`, without its prefix.
fn unframe(mut data: Bytes) -> Option<Bytes> {
    if data.len() < 5 || data[0] != 0 {
        return None;
    }
    data.advance(1);
    let len = data.get_u32() as usize;
    (data.len() == len).then_some(data)
}

/// A `grpc-timeout` value: the finest unit that fits gRPC's 8 digits.
fn grpc_timeout(limit: Duration) -> String {
    const MAX: u128 = 99_999_999;
    let units: [(u128, &str); 4] = [
        (limit.as_millis(), "m"),
        (limit.as_millis() / 1_000, "S"),
        (limit.as_millis() / 60_000, "M"),
        (limit.as_millis() / 3_600_000, "H"),
    ];
    let (value, unit) = units
        .into_iter()
        .find(|(v, _)| *v <= MAX)
        .unwrap_or((MAX, "H"));
    format!("{value}{unit}")
}

/// The status in `grpc-status`, `grpc-message` (percent-decoded) and
/// `grpc-status-details-bin` (base64; dropped when it is not).
fn status_in(headers: &HeaderMap) -> Option<Status> {
    let code = Code::from_bytes(headers.get("grpc-status")?.as_bytes());
    let message = headers
        .get("grpc-message")
        .map(|m| percent_decode(m.as_bytes()))
        .unwrap_or_default();
    let details = headers
        .get("grpc-status-details-bin")
        .and_then(base64_decode)
        .unwrap_or_default();
    Some(Status::with_details(code, message, details.into()))
}

fn percent_decode(bytes: &[u8]) -> String {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    let hex = |b: &u8| (*b as char).to_digit(16);
    while i < bytes.len() {
        let digits = (
            bytes.get(i + 1).and_then(hex),
            bytes.get(i + 2).and_then(hex),
        );
        match (bytes[i], digits) {
            (b'%', (Some(h), Some(l))) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Standard base64, padded or not (gRPC senders differ).
fn base64_decode(value: &HeaderValue) -> Option<Vec<u8>> {
    let digit = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let text = value.as_bytes();
    let text = text
        .strip_suffix(b"==")
        .or(text.strip_suffix(b"="))
        .unwrap_or(text);
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for &c in text {
        acc = (acc << 6) | u32::from(digit(c)?);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}

/// gRPC's code for an answer that is not HTTP 200 (its HTTP/2 mapping).
fn status_of_http(status: StatusCode) -> Status {
    let code = match status.as_u16() {
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        429 | 502 | 503 | 504 => Code::Unavailable,
        _ => Code::Unknown,
    };
    Status::new(code, format!("the server answered HTTP {status}"))
}

/// gRPC's code for an HTTP/2 error (its HTTP/2 mapping); a broken
/// connection is UNAVAILABLE, as a CO retries it.
fn status_of(e: &h2::Error) -> Status {
    let code = match e.reason() {
        Some(h2::Reason::REFUSED_STREAM) => Code::Unavailable,
        Some(h2::Reason::CANCEL) => Code::Cancelled,
        Some(h2::Reason::ENHANCE_YOUR_CALM) => Code::ResourceExhausted,
        Some(h2::Reason::INADEQUATE_SECURITY) => Code::PermissionDenied,
        Some(_) if !e.is_go_away() => Code::Internal,
        _ => Code::Unavailable,
    };
    Status::new(code, format!("HTTP/2: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_round_trips_through_its_frame() {
        let request = csi_proto::v1::NodeGetVolumeStatsRequest {
            volume_id: "v1".into(),
            volume_path: "/a/b".into(),
            staging_target_path: String::new(),
        };
        let framed = frame(&request).unwrap();
        assert_eq!(framed[0], 0);
        assert_eq!(&framed[1..5], &(framed.len() as u32 - 5).to_be_bytes());
        let decoded: csi_proto::v1::NodeGetVolumeStatsRequest =
            prost::Message::decode(unframe(framed.clone()).unwrap()).unwrap();
        assert_eq!(decoded, request);
        // A compressed flag, a short or a trailing message: not one message.
        let mut compressed = framed.to_vec();
        compressed[0] = 1;
        assert!(unframe(compressed.into()).is_none());
        assert!(unframe(framed.slice(..framed.len() - 1)).is_none());
        let mut two = framed.to_vec();
        two.extend_from_slice(&framed);
        assert!(unframe(two.into()).is_none());
        assert!(unframe(Bytes::from_static(&[0, 0])).is_none());
    }

    #[test]
    fn timeouts_use_the_finest_unit_that_fits_eight_digits() {
        assert_eq!(grpc_timeout(Duration::from_secs(60)), "60000m");
        assert_eq!(grpc_timeout(Duration::from_millis(1)), "1m");
        assert_eq!(grpc_timeout(Duration::from_secs(200_000)), "200000S");
        assert_eq!(grpc_timeout(Duration::MAX), "99999999H");
    }

    #[test]
    fn a_status_is_read_from_grpc_headers() {
        let mut headers = HeaderMap::new();
        headers.insert("grpc-status", HeaderValue::from_static("5"));
        headers.insert(
            "grpc-message",
            HeaderValue::from_static("volume %22v1%22 not found %E2%9C%93 100%"),
        );
        headers.insert(
            "grpc-status-details-bin",
            HeaderValue::from_static("AAEC/w"),
        );
        let status = status_in(&headers).unwrap();
        assert_eq!(status.code(), Code::NotFound);
        assert_eq!(status.message(), "volume \"v1\" not found ✓ 100%");
        assert_eq!(status.details(), &[0, 1, 2, 255]);
        // Details that are not base64 are dropped, not a panic.
        headers.insert("grpc-status-details-bin", HeaderValue::from_static("!!"));
        assert!(status_in(&headers).unwrap().details().is_empty());
        assert!(status_in(&HeaderMap::new()).is_none());
    }

    #[test]
    fn http_and_http2_failures_map_to_grpc_codes() {
        assert_eq!(
            status_of_http(StatusCode::NOT_FOUND).code(),
            Code::Unimplemented
        );
        assert_eq!(
            status_of_http(StatusCode::SERVICE_UNAVAILABLE).code(),
            Code::Unavailable
        );
        assert_eq!(
            status_of_http(StatusCode::IM_A_TEAPOT).code(),
            Code::Unknown
        );
        let refused = h2::Error::from(h2::Reason::REFUSED_STREAM);
        assert_eq!(status_of(&refused).code(), Code::Unavailable);
        assert_eq!(
            status_of(&h2::Error::from(h2::Reason::CANCEL)).code(),
            Code::Cancelled
        );
        let protocol = h2::Error::from(h2::Reason::PROTOCOL_ERROR);
        assert_eq!(status_of(&protocol).code(), Code::Internal);
    }
}
