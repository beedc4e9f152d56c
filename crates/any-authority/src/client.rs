//! One unary gRPC call over raw HTTP/2 frames with a chosen `:authority`,
//! as gRPC C-core and grpc-java clients send it on unix sockets. tonic's
//! client cannot send such a value (its URI type refuses it), so tests and
//! the conformance suite use this to check that a server answers anyway.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::hpack::{self, Decoder, HeaderList, HpackError};
use h2_unary::frame::flag::{ACK, END_HEADERS, END_STREAM, PADDED, PRIORITY};
use h2_unary::frame::kind::{CONTINUATION, DATA, GOAWAY, HEADERS, PING, RST_STREAM, SETTINGS};
use h2_unary::frame::{DEFAULT_MAX_FRAME, Head, PREFACE, write_frame as frame};

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
    /// Reading or writing the connection failed.
    #[error("connection i/o: {0}")]
    Io(#[from] io::Error),
    /// The server closed the connection before answering.
    #[error("server closed the connection before answering")]
    Closed,
    /// The server ended the connection with an error.
    #[error("server sent GOAWAY with error code {0}")]
    GoAway(u32),
    /// The server's response headers do not decode.
    #[error("server sent an undecodable header block: {0}")]
    Hpack(#[from] HpackError),
    /// The server broke HTTP/2 framing.
    #[error("server broke HTTP/2 framing: {0}")]
    Framing(&'static str),
}

/// Calls `path` (e.g. `/csi.v1.Identity/Probe`) with the encoded protobuf
/// `request` on a fresh connection `io`, sending `authority` verbatim as
/// `:authority`, and reads until the stream ends. Apply a timeout around
/// it; the server's answer is returned whatever its status.
pub async fn unary_with_authority<S>(
    io: &mut S,
    authority: &[u8],
    path: &str,
    request: &[u8],
) -> Result<RawReply, RawCallError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut w = Vec::with_capacity(256 + request.len());
    w.extend_from_slice(PREFACE);
    frame(&mut w, SETTINGS, 0, 0, &[]);
    let mut block = Vec::new();
    for (name, value) in [
        (&b":method"[..], &b"POST"[..]),
        (b":scheme", b"http"),
        (b":path", path.as_bytes()),
        (b":authority", authority),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ] {
        hpack::encode_literal(name, value, false, &mut block);
    }
    if block.len() > DEFAULT_MAX_FRAME {
        return Err(RawCallError::Framing("request headers over 16 KiB"));
    }
    frame(&mut w, HEADERS, END_HEADERS, 1, &block);
    let mut body = Vec::with_capacity(5 + request.len());
    body.push(0);
    body.extend_from_slice(&(request.len() as u32).to_be_bytes());
    body.extend_from_slice(request);
    let mut chunks = body.chunks(DEFAULT_MAX_FRAME).peekable();
    while let Some(chunk) = chunks.next() {
        let flags = if chunks.peek().is_none() {
            END_STREAM
        } else {
            0
        };
        frame(&mut w, DATA, flags, 1, chunk);
    }
    io.write_all(&w).await?;
    io.flush().await?;

    let mut decoder = Decoder::default();
    let mut list = HeaderList::new();
    let mut reply = RawReply::default();
    let mut data = Vec::new();
    let mut block = Vec::new();
    let mut block_flags = 0;
    loop {
        let mut raw = [0u8; 9];
        io.read_exact(&mut raw).await.map_err(eof_is_closed)?;
        let f = Head::parse(&raw);
        if f.len > DEFAULT_MAX_FRAME {
            // We announced the default SETTINGS_MAX_FRAME_SIZE.
            return Err(RawCallError::Framing("frame over 16 KiB"));
        }
        let mut payload = vec![0; f.len];
        io.read_exact(&mut payload).await.map_err(eof_is_closed)?;
        let ours = f.stream == 1;
        match f.kind {
            DATA if ours => {
                data.extend_from_slice(unpad(f.flags, &payload)?);
                if f.flags & END_STREAM != 0 {
                    break;
                }
            }
            HEADERS | CONTINUATION => {
                let fragment = if f.kind == HEADERS {
                    block_flags = f.flags;
                    let p = unpad(f.flags, &payload)?;
                    if f.flags & PRIORITY != 0 {
                        p.get(5..).ok_or(RawCallError::Framing("short PRIORITY"))?
                    } else {
                        p
                    }
                } else {
                    &payload[..]
                };
                block.extend_from_slice(fragment);
                if f.flags & END_HEADERS != 0 {
                    // Every block goes through the decoder to keep its table.
                    decoder.decode(&block, &mut list)?;
                    block.clear();
                    if ours {
                        read_fields(&list, &mut reply);
                        if block_flags & END_STREAM != 0 {
                            break;
                        }
                    }
                }
            }
            RST_STREAM if ours => {
                let code = payload
                    .first_chunk::<4>()
                    .ok_or(RawCallError::Framing("short RST_STREAM"))?;
                reply.reset = Some(u32::from_be_bytes(*code));
                break;
            }
            SETTINGS if f.flags & ACK == 0 => {
                let mut ack = Vec::new();
                frame(&mut ack, SETTINGS, ACK, 0, &[]);
                io.write_all(&ack).await?;
            }
            PING if f.flags & ACK == 0 => {
                let mut pong = Vec::new();
                frame(&mut pong, PING, ACK, 0, &payload);
                io.write_all(&pong).await?;
            }
            GOAWAY => {
                let (Some(last), Some(code)) = (payload.first_chunk::<4>(), payload.get(4..8))
                else {
                    return Err(RawCallError::Framing("short GOAWAY"));
                };
                let last = u32::from_be_bytes(*last) & 0x7fff_ffff;
                let code = u32::from_be_bytes(code.try_into().expect("4 bytes"));
                if code != 0 || last < 1 {
                    return Err(RawCallError::GoAway(code));
                }
            }
            _ => {}
        }
    }
    if let Some((prefix, rest)) = data.split_first_chunk::<5>() {
        let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
        reply.message = Some(rest.get(..len).unwrap_or(rest).to_vec());
    }
    Ok(reply)
}

fn eof_is_closed(e: io::Error) -> RawCallError {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        RawCallError::Closed
    } else {
        RawCallError::Io(e)
    }
}

fn unpad(flags: u8, payload: &[u8]) -> Result<&[u8], RawCallError> {
    if flags & PADDED == 0 {
        return Ok(payload);
    }
    let (&pad, rest) = payload
        .split_first()
        .ok_or(RawCallError::Framing("PADDED frame without pad length"))?;
    rest.get(..rest.len().wrapping_sub(usize::from(pad)))
        .ok_or(RawCallError::Framing("padding longer than the frame"))
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
