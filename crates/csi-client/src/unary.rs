//! Unary calls on one HTTP/2 connection ([`h2_unary::client`]).
//!
//! A call's HEADERS and DATA frames leave in one write, and the answer is
//! gathered by the connection's reading task. The client's code on a
//! call's path is small: a call to a plugin that has been idle runs on
//! cold caches, and each line of code it touches then costs a miss
//! (docs/benchmarks.md, "Session 19"). The connection is dialled when the
//! client connects (or on the first call, if lazy) and again on the first
//! call after it breaks.

use std::io;
use std::sync::Mutex;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use csi_proto::methods::RpcRequest;
use h2_unary::client::{self as h2c, CallError, Connection};
use h2_unary::frame::Reason;
use h2_unary::hpack::HeaderList;
use http::StatusCode;
use tonic::{Code, Status};

use crate::client::ClientOptions;
use crate::endpoint::Endpoint;

/// The largest response message accepted (tonic's default limit).
const MAX_RESPONSE: usize = 4 << 20;

const USER_AGENT: &str = concat!("csi-client/", env!("CARGO_PKG_VERSION"));

/// One endpoint's HTTP/2 connection for unary calls.
#[derive(Debug)]
pub(crate) struct UnaryChannel {
    endpoint: Endpoint,
    /// The `:authority` every request carries.
    authority: String,
    options: ClientOptions,
    /// The connection; `None` until dialled.
    connection: Mutex<Option<Connection>>,
}

impl UnaryChannel {
    /// A channel that dials on its first call.
    pub(crate) fn lazy(endpoint: Endpoint, options: ClientOptions) -> Self {
        let authority = match &endpoint {
            Endpoint::Unix(_) => "localhost".to_owned(),
            Endpoint::Tcp(addr) => addr.to_string(),
        };
        Self {
            endpoint,
            authority,
            options,
            connection: Mutex::new(None),
        }
    }

    /// A channel connected now.
    pub(crate) async fn connect(endpoint: Endpoint, options: ClientOptions) -> io::Result<Self> {
        let channel = Self::lazy(endpoint, options);
        let connection = channel.dial().await?;
        *channel.lock() = Some(connection);
        Ok(channel)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Connection>> {
        self.connection.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens the connection (within the connect timeout); its reading task
    /// ends when the connection closes.
    async fn dial(&self) -> io::Result<Connection> {
        let connect = async {
            match &self.endpoint {
                Endpoint::Unix(path) => {
                    h2c::handshake(tokio::net::UnixStream::connect(path).await?).await
                }
                Endpoint::Tcp(addr) => {
                    let stream = tokio::net::TcpStream::connect(addr).await?;
                    stream.set_nodelay(true)?;
                    h2c::handshake(stream).await
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

    /// The open connection, or a new one when there is none or it broke.
    async fn ready(&self) -> Result<Connection, Status> {
        let open = self.lock().clone();
        if let Some(connection) = open
            && connection.is_open()
        {
            return Ok(connection);
        }
        let fresh = self.dial().await.map_err(|e| {
            Status::unavailable(format!("cannot connect to {}: {e}", self.endpoint))
        })?;
        *self.lock() = Some(fresh.clone());
        Ok(fresh)
    }

    /// Sends `request` and waits for its answer, within the call timeout.
    pub(crate) async fn call<Req: RpcRequest>(
        &self,
        request: Req,
    ) -> Result<Req::Response, Status> {
        let message = frame(&request)?;
        let path = Req::METHOD.path();
        let body = match self.options.call_timeout {
            Some(limit) => tokio::time::timeout(limit, self.exchange(path, &message))
                .await
                .map_err(|_| {
                    Status::deadline_exceeded(format!("{path}: no answer within {limit:?}"))
                })??,
            None => self.exchange(path, &message).await?,
        };
        <Req::Response as prost::Message>::decode(body)
            .map_err(|e| Status::internal(format!("{path}: decoding the answer: {e}")))
    }

    /// One stream: the request's frames, then the answer's message.
    async fn exchange(&self, path: &str, message: &[u8]) -> Result<Bytes, Status> {
        let timeout = self.options.call_timeout.map(grpc_timeout);
        let mut headers: Vec<(&str, &[u8])> = vec![
            ("content-type", b"application/grpc"),
            ("te", b"trailers"),
            ("user-agent", USER_AGENT.as_bytes()),
        ];
        if let Some(timeout) = &timeout {
            headers.push(("grpc-timeout", timeout.as_bytes()));
        }
        let connection = self.ready().await?;
        let answer = connection
            .call(&h2c::Request {
                path,
                authority: &self.authority,
                headers: &headers,
                body: message,
                max_response: MAX_RESPONSE + 5,
            })
            .await
            .map_err(|e| status_of(&e))?;
        let status = value(&answer.head, ":status")
            .and_then(|s| StatusCode::from_bytes(s).ok())
            .ok_or_else(|| Status::internal(format!("{path}: the answer has no :status")))?;
        if status != StatusCode::OK {
            return Err(status_of_http(status));
        }
        // A trailers-only answer carries its status in the headers.
        if let Some(status) = status_in(&answer.head) {
            return Err(match status.code() {
                Code::Ok => Status::internal(format!("{path}: the answer has no message")),
                _ => status,
            });
        }
        match status_in(&answer.trailers) {
            Some(status) if status.code() != Code::Ok => return Err(status),
            Some(_) => {}
            None => {
                return Err(Status::internal(format!(
                    "{path}: the answer ended without grpc-status"
                )));
            }
        }
        unframe(Bytes::from(answer.data))
            .ok_or_else(|| Status::internal(format!("{path}: the answer is not one gRPC message")))
    }
}

/// The value of the first field named `name`.
fn value<'a>(fields: &'a HeaderList, name: &str) -> Option<&'a [u8]> {
    fields.get(name.as_bytes())
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
fn status_in(fields: &HeaderList) -> Option<Status> {
    let code = Code::from_bytes(value(fields, "grpc-status")?);
    let message = value(fields, "grpc-message")
        .map(percent_decode)
        .unwrap_or_default();
    let details = value(fields, "grpc-status-details-bin")
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
fn base64_decode(text: &[u8]) -> Option<Vec<u8>> {
    let digit = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
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

/// gRPC's code for an HTTP/2 failure (its HTTP/2 mapping); a broken
/// connection is UNAVAILABLE, as a CO retries it.
fn status_of(e: &CallError) -> Status {
    let code = match e {
        CallError::Unavailable(_) => Code::Unavailable,
        CallError::Reset(Reason::REFUSED_STREAM) => Code::Unavailable,
        CallError::Reset(Reason::CANCEL) => Code::Cancelled,
        CallError::Reset(Reason::ENHANCE_YOUR_CALM) => Code::ResourceExhausted,
        CallError::Reset(Reason::INADEQUATE_SECURITY) => Code::PermissionDenied,
        CallError::Reset(_) | CallError::Protocol(_) => Code::Internal,
        CallError::TooLarge(_) => Code::ResourceExhausted,
    };
    Status::new(code, format!("HTTP/2: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use h2_unary::hpack;

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
        // Fields as a server's header block carries them.
        let fields = |list: &[(&str, &str)]| {
            let mut block = Vec::new();
            for (name, value) in list {
                hpack::encode_literal(name.as_bytes(), value.as_bytes(), false, &mut block);
            }
            let mut fields = HeaderList::new();
            hpack::Decoder::default()
                .decode(&block, &mut fields)
                .unwrap();
            fields
        };
        let mut headers = vec![
            ("grpc-status", "5"),
            ("grpc-message", "volume %22v1%22 not found %E2%9C%93 100%"),
            ("grpc-status-details-bin", "AAEC/w"),
        ];
        let status = status_in(&fields(&headers)).unwrap();
        assert_eq!(status.code(), Code::NotFound);
        assert_eq!(status.message(), "volume \"v1\" not found ✓ 100%");
        assert_eq!(status.details(), &[0, 1, 2, 255]);
        // Details that are not base64 are dropped, not a panic.
        headers[2] = ("grpc-status-details-bin", "!!");
        assert!(status_in(&fields(&headers)).unwrap().details().is_empty());
        assert!(status_in(&HeaderList::new()).is_none());
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
        let refused = CallError::Reset(Reason::REFUSED_STREAM);
        assert_eq!(status_of(&refused).code(), Code::Unavailable);
        assert_eq!(
            status_of(&CallError::Reset(Reason::CANCEL)).code(),
            Code::Cancelled
        );
        let protocol = CallError::Protocol("bad frame".into());
        assert_eq!(status_of(&protocol).code(), Code::Internal);
        let gone = CallError::Unavailable("closed".into());
        assert_eq!(status_of(&gone).code(), Code::Unavailable);
    }
}
