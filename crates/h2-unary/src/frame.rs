//! HTTP/2 frames (RFC 7540 §4, §6): reading one from its 9-byte head and
//! payload, and writing the ones a unary call sends.

use std::ops::Range;

/// The client's connection preface (§3.5).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Every frame's head.
pub const HEAD_LEN: usize = 9;
/// The largest frame payload a peer may send before SETTINGS say more (§4.2).
pub const DEFAULT_MAX_FRAME: usize = 16_384;
/// Both windows' size before SETTINGS or WINDOW_UPDATE change it (§6.9.2).
pub const DEFAULT_WINDOW: u32 = 65_535;
/// The largest window (§6.9.1).
pub const MAX_WINDOW: u32 = (1 << 31) - 1;

/// Frame types (§6).
pub mod kind {
    #![allow(missing_docs)]
    pub const DATA: u8 = 0x0;
    pub const HEADERS: u8 = 0x1;
    pub const PRIORITY: u8 = 0x2;
    pub const RST_STREAM: u8 = 0x3;
    pub const SETTINGS: u8 = 0x4;
    pub const PUSH_PROMISE: u8 = 0x5;
    pub const PING: u8 = 0x6;
    pub const GOAWAY: u8 = 0x7;
    pub const WINDOW_UPDATE: u8 = 0x8;
    pub const CONTINUATION: u8 = 0x9;
}

/// Frame flags (§6).
pub mod flag {
    #![allow(missing_docs)]
    pub const END_STREAM: u8 = 0x1;
    pub const ACK: u8 = 0x1;
    pub const END_HEADERS: u8 = 0x4;
    pub const PADDED: u8 = 0x8;
    pub const PRIORITY: u8 = 0x20;
}

/// SETTINGS parameters (§6.5.2).
pub mod setting {
    #![allow(missing_docs)]
    pub const HEADER_TABLE_SIZE: u16 = 0x1;
    pub const ENABLE_PUSH: u16 = 0x2;
    pub const MAX_CONCURRENT_STREAMS: u16 = 0x3;
    pub const INITIAL_WINDOW_SIZE: u16 = 0x4;
    pub const MAX_FRAME_SIZE: u16 = 0x5;
    pub const MAX_HEADER_LIST_SIZE: u16 = 0x6;
}

/// Error codes of RST_STREAM and GOAWAY (§7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Reason(pub u32);

#[allow(missing_docs)]
impl Reason {
    pub const NO_ERROR: Reason = Reason(0x0);
    pub const PROTOCOL_ERROR: Reason = Reason(0x1);
    pub const INTERNAL_ERROR: Reason = Reason(0x2);
    pub const FLOW_CONTROL_ERROR: Reason = Reason(0x3);
    pub const SETTINGS_TIMEOUT: Reason = Reason(0x4);
    pub const STREAM_CLOSED: Reason = Reason(0x5);
    pub const FRAME_SIZE_ERROR: Reason = Reason(0x6);
    pub const REFUSED_STREAM: Reason = Reason(0x7);
    pub const CANCEL: Reason = Reason(0x8);
    pub const COMPRESSION_ERROR: Reason = Reason(0x9);
    pub const CONNECT_ERROR: Reason = Reason(0xa);
    pub const ENHANCE_YOUR_CALM: Reason = Reason(0xb);
    pub const INADEQUATE_SECURITY: Reason = Reason(0xc);
    pub const HTTP_1_1_REQUIRED: Reason = Reason(0xd);
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const NAMES: [&str; 14] = [
            "NO_ERROR",
            "PROTOCOL_ERROR",
            "INTERNAL_ERROR",
            "FLOW_CONTROL_ERROR",
            "SETTINGS_TIMEOUT",
            "STREAM_CLOSED",
            "FRAME_SIZE_ERROR",
            "REFUSED_STREAM",
            "CANCEL",
            "COMPRESSION_ERROR",
            "CONNECT_ERROR",
            "ENHANCE_YOUR_CALM",
            "INADEQUATE_SECURITY",
            "HTTP_1_1_REQUIRED",
        ];
        match NAMES.get(self.0 as usize) {
            Some(name) => f.write_str(name),
            None => write!(f, "error code {:#x}", self.0),
        }
    }
}

/// A frame that breaks the protocol: a connection error (§5.4.1) with
/// this reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {what}")]
pub struct FrameError {
    /// The GOAWAY code it calls for.
    pub reason: Reason,
    /// What was wrong.
    pub what: &'static str,
}

fn protocol(what: &'static str) -> FrameError {
    FrameError {
        reason: Reason::PROTOCOL_ERROR,
        what,
    }
}

fn size(what: &'static str) -> FrameError {
    FrameError {
        reason: Reason::FRAME_SIZE_ERROR,
        what,
    }
}

/// A frame's head (§4.1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Head {
    /// The payload's length.
    pub len: usize,
    /// The frame type.
    pub kind: u8,
    /// The flags.
    pub flags: u8,
    /// The stream, reserved bit cleared.
    pub stream: u32,
}

impl Head {
    /// Reads a head.
    pub fn parse(b: &[u8; HEAD_LEN]) -> Head {
        Head {
            len: (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]),
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
        }
    }
}

/// A frame read, its payload's parts as ranges of the payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// DATA: `data` without padding.
    Data {
        /// The stream.
        stream: u32,
        /// The message bytes.
        data: Range<usize>,
        /// The sender's last frame on the stream.
        end_stream: bool,
    },
    /// HEADERS: the start of a header block.
    Headers {
        /// The stream.
        stream: u32,
        /// The header block fragment, without padding and priority.
        block: Range<usize>,
        /// No CONTINUATION follows.
        end_headers: bool,
        /// The sender's last frame on the stream.
        end_stream: bool,
    },
    /// CONTINUATION: more of a header block.
    Continuation {
        /// The stream.
        stream: u32,
        /// The fragment.
        block: Range<usize>,
        /// No CONTINUATION follows.
        end_headers: bool,
    },
    /// RST_STREAM.
    Reset {
        /// The stream.
        stream: u32,
        /// Why.
        reason: Reason,
    },
    /// SETTINGS; an ACK carries none.
    Settings {
        /// An acknowledgement of this end's SETTINGS.
        ack: bool,
        /// The parameters, in order.
        params: Vec<(u16, u32)>,
    },
    /// PING.
    Ping {
        /// An answer to this end's PING.
        ack: bool,
        /// The opaque data to echo.
        data: [u8; 8],
    },
    /// GOAWAY.
    GoAway {
        /// The last stream the sender processes.
        last_stream: u32,
        /// Why.
        reason: Reason,
    },
    /// WINDOW_UPDATE.
    WindowUpdate {
        /// The stream, or 0 for the connection.
        stream: u32,
        /// What the window grows by (1 to 2^31 - 1).
        increment: u32,
    },
    /// PRIORITY and frame types this end does not know: ignored (§4.1, §5.5).
    Ignored,
}

/// Reads one frame. `PUSH_PROMISE` is an error: this end never enables push.
pub fn parse(head: Head, payload: &[u8]) -> Result<Frame, FrameError> {
    let stream = head.stream;
    let needs_stream = |f: Frame| {
        if stream == 0 {
            Err(protocol("a stream frame on stream 0"))
        } else {
            Ok(f)
        }
    };
    let on_connection = |f: Frame| {
        if stream != 0 {
            Err(protocol("a connection frame on a stream"))
        } else {
            Ok(f)
        }
    };
    match head.kind {
        kind::DATA => {
            let data = unpadded(head.flags, payload, 0)?;
            needs_stream(Frame::Data {
                stream,
                data,
                end_stream: head.flags & flag::END_STREAM != 0,
            })
        }
        kind::HEADERS => {
            let priority = if head.flags & flag::PRIORITY != 0 {
                5
            } else {
                0
            };
            let block = unpadded(head.flags, payload, priority)?;
            needs_stream(Frame::Headers {
                stream,
                block,
                end_headers: head.flags & flag::END_HEADERS != 0,
                end_stream: head.flags & flag::END_STREAM != 0,
            })
        }
        kind::CONTINUATION => needs_stream(Frame::Continuation {
            stream,
            block: 0..payload.len(),
            end_headers: head.flags & flag::END_HEADERS != 0,
        }),
        kind::RST_STREAM => {
            let code = four(payload).ok_or_else(|| size("RST_STREAM is not 4 bytes"))?;
            needs_stream(Frame::Reset {
                stream,
                reason: Reason(code),
            })
        }
        kind::SETTINGS => {
            let ack = head.flags & flag::ACK != 0;
            if !payload.len().is_multiple_of(6) || (ack && !payload.is_empty()) {
                return Err(size("a SETTINGS payload of a wrong size"));
            }
            let params = payload
                .chunks_exact(6)
                .map(|p| {
                    (
                        u16::from_be_bytes([p[0], p[1]]),
                        u32::from_be_bytes([p[2], p[3], p[4], p[5]]),
                    )
                })
                .collect();
            on_connection(Frame::Settings { ack, params })
        }
        kind::PING => {
            let data: [u8; 8] = payload
                .try_into()
                .map_err(|_| size("PING is not 8 bytes"))?;
            on_connection(Frame::Ping {
                ack: head.flags & flag::ACK != 0,
                data,
            })
        }
        kind::GOAWAY => {
            if payload.len() < 8 {
                return Err(size("GOAWAY is shorter than 8 bytes"));
            }
            on_connection(Frame::GoAway {
                last_stream: four(&payload[..4]).unwrap_or(0) & 0x7fff_ffff,
                reason: Reason(four(&payload[4..8]).unwrap_or(0)),
            })
        }
        kind::WINDOW_UPDATE => {
            let increment =
                four(payload).ok_or_else(|| size("WINDOW_UPDATE is not 4 bytes"))? & 0x7fff_ffff;
            if increment == 0 {
                return Err(protocol("a WINDOW_UPDATE of 0"));
            }
            Ok(Frame::WindowUpdate { stream, increment })
        }
        kind::PUSH_PROMISE => Err(protocol("PUSH_PROMISE although push is disabled")),
        _ => Ok(Frame::Ignored),
    }
}

fn four(b: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(b.try_into().ok()?))
}

/// The payload's content without the pad length, `skip` bytes after it
/// (HEADERS' priority) and the padding (§6.1, §6.2).
fn unpadded(flags: u8, payload: &[u8], skip: usize) -> Result<Range<usize>, FrameError> {
    let (start, pad) = if flags & flag::PADDED != 0 {
        let pad = usize::from(*payload.first().ok_or_else(|| protocol("no pad length"))?);
        (1 + skip, pad)
    } else {
        (skip, 0)
    };
    let end = payload
        .len()
        .checked_sub(pad)
        .filter(|end| *end >= start)
        .ok_or_else(|| protocol("padding longer than the payload"))?;
    Ok(start..end)
}

/// Appends a frame head.
pub fn write_head(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    debug_assert!(len < 1 << 24);
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
}

/// Appends a whole frame.
pub fn write_frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    write_head(out, payload.len(), kind, flags, stream);
    out.extend_from_slice(payload);
}

/// Appends SETTINGS with `params`.
pub fn write_settings(out: &mut Vec<u8>, params: &[(u16, u32)]) {
    write_head(out, params.len() * 6, kind::SETTINGS, 0, 0);
    for (id, value) in params {
        out.extend_from_slice(&id.to_be_bytes());
        out.extend_from_slice(&value.to_be_bytes());
    }
}

/// Appends a header block as HEADERS and, past `max_frame`, CONTINUATIONs.
pub fn write_headers(
    out: &mut Vec<u8>,
    stream: u32,
    block: &[u8],
    end_stream: bool,
    max_frame: usize,
) {
    let mut chunks = block.chunks(max_frame.max(1)).peekable();
    let mut first = true;
    loop {
        let chunk = chunks.next().unwrap_or(&[]);
        let last = chunks.peek().is_none();
        let mut flags = if last { flag::END_HEADERS } else { 0 };
        let kind = if first {
            if end_stream {
                flags |= flag::END_STREAM;
            }
            kind::HEADERS
        } else {
            kind::CONTINUATION
        };
        write_frame(out, kind, flags, stream, chunk);
        first = false;
        if last {
            return;
        }
    }
}

/// Appends `data` as DATA frames of at most `max_frame` bytes; the last
/// one ends the stream when `end_stream`.
pub fn write_data(out: &mut Vec<u8>, stream: u32, data: &[u8], end_stream: bool, max_frame: usize) {
    let mut chunks = data.chunks(max_frame.max(1)).peekable();
    if chunks.peek().is_none() {
        let flags = if end_stream { flag::END_STREAM } else { 0 };
        write_frame(out, kind::DATA, flags, stream, &[]);
        return;
    }
    while let Some(chunk) = chunks.next() {
        let flags = if end_stream && chunks.peek().is_none() {
            flag::END_STREAM
        } else {
            0
        };
        write_frame(out, kind::DATA, flags, stream, chunk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(bytes: &[u8]) -> Result<Frame, FrameError> {
        let head = Head::parse(bytes[..HEAD_LEN].try_into().unwrap());
        assert_eq!(head.len, bytes.len() - HEAD_LEN);
        parse(head, &bytes[HEAD_LEN..])
    }

    #[test]
    fn frames_written_read_back() {
        let mut out = Vec::new();
        write_data(&mut out, 3, b"hello", true, 16_384);
        assert_eq!(
            read(&out),
            Ok(Frame::Data {
                stream: 3,
                data: 0..5,
                end_stream: true
            })
        );
        out.clear();
        write_settings(&mut out, &[(setting::INITIAL_WINDOW_SIZE, MAX_WINDOW)]);
        assert_eq!(
            read(&out),
            Ok(Frame::Settings {
                ack: false,
                params: vec![(setting::INITIAL_WINDOW_SIZE, MAX_WINDOW)]
            })
        );
        out.clear();
        write_frame(&mut out, kind::WINDOW_UPDATE, 0, 0, &1000u32.to_be_bytes());
        assert_eq!(
            read(&out),
            Ok(Frame::WindowUpdate {
                stream: 0,
                increment: 1000
            })
        );
    }

    #[test]
    fn long_blocks_and_data_are_split() {
        let block = vec![7u8; 40];
        let mut out = Vec::new();
        write_headers(&mut out, 1, &block, true, 16);
        // HEADERS 16 (END_STREAM), CONTINUATION 16, CONTINUATION 8 (END_HEADERS).
        let heads: Vec<Head> = [0, 25, 50]
            .iter()
            .map(|&at| Head::parse(out[at..at + HEAD_LEN].try_into().unwrap()))
            .collect();
        assert_eq!(
            heads
                .iter()
                .map(|h| (h.kind, h.flags, h.len))
                .collect::<Vec<_>>(),
            [
                (kind::HEADERS, flag::END_STREAM, 16),
                (kind::CONTINUATION, 0, 16),
                (kind::CONTINUATION, flag::END_HEADERS, 8)
            ]
        );
        out.clear();
        write_data(&mut out, 1, &[1; 20], true, 16);
        let second = Head::parse(out[25..34].try_into().unwrap());
        assert_eq!((second.len, second.flags), (4, flag::END_STREAM));
        out.clear();
        write_data(&mut out, 1, &[], true, 16);
        assert_eq!(out.len(), HEAD_LEN);
    }

    #[test]
    fn padding_and_priority_are_removed() {
        // HEADERS, PADDED | PRIORITY: pad length 2, 5 bytes of priority, block "ab", 2 pad bytes.
        let mut out = Vec::new();
        let payload = [2, 0, 0, 0, 0, 16, b'a', b'b', 0, 0];
        write_frame(
            &mut out,
            kind::HEADERS,
            flag::PADDED | flag::PRIORITY | flag::END_HEADERS,
            1,
            &payload,
        );
        assert_eq!(
            read(&out),
            Ok(Frame::Headers {
                stream: 1,
                block: 6..8,
                end_headers: true,
                end_stream: false
            })
        );
    }

    #[test]
    fn malformed_frames_are_connection_errors() {
        let cases: [(u8, u8, u32, &[u8], Reason); 9] = [
            (
                kind::DATA,
                flag::PADDED,
                1,
                &[9, 1, 2],
                Reason::PROTOCOL_ERROR,
            ),
            (kind::DATA, 0, 0, b"x", Reason::PROTOCOL_ERROR),
            (kind::SETTINGS, 0, 0, &[0, 1, 0], Reason::FRAME_SIZE_ERROR),
            (
                kind::SETTINGS,
                flag::ACK,
                0,
                &[0, 1, 0, 0, 0, 0],
                Reason::FRAME_SIZE_ERROR,
            ),
            (kind::SETTINGS, 0, 1, &[], Reason::PROTOCOL_ERROR),
            (kind::PING, 0, 0, &[1, 2, 3], Reason::FRAME_SIZE_ERROR),
            (
                kind::WINDOW_UPDATE,
                0,
                0,
                &[0, 0, 0, 0],
                Reason::PROTOCOL_ERROR,
            ),
            (kind::RST_STREAM, 0, 1, &[0, 0, 8], Reason::FRAME_SIZE_ERROR),
            (
                kind::PUSH_PROMISE,
                0,
                1,
                &[0, 0, 0, 2],
                Reason::PROTOCOL_ERROR,
            ),
        ];
        for (k, flags, stream, payload, reason) in cases {
            let mut out = Vec::new();
            write_frame(&mut out, k, flags, stream, payload);
            assert_eq!(
                read(&out).map_err(|e| e.reason),
                Err(reason),
                "type {k} {payload:?}"
            );
        }
        let mut out = Vec::new();
        write_frame(&mut out, 0xfa, 0, 0, b"unknown");
        assert_eq!(read(&out), Ok(Frame::Ignored));
    }
}
