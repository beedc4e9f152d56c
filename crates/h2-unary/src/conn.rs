//! What both ends of a connection share: the write queue, frames split off
//! the read buffer, header blocks across CONTINUATION frames, the peer's
//! settings and the windows.

use std::io;

use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::frame::{self, Frame, FrameError, Head, Reason, flag, kind, setting};
use crate::hpack::{Decoder, HeaderList, HpackError};

/// The largest header list this end accepts in one block.
pub(crate) const LIST_LIMIT: usize = 1 << 20;
/// Received bytes after which the connection window is topped up.
const REFILL_AT: u32 = 1 << 30;

/// The write half and the frames queued for it, in order.
pub(crate) struct Outbox {
    pub(crate) writer: Box<dyn AsyncWrite + Send + Unpin>,
    pub(crate) queued: Vec<u8>,
}

impl Outbox {
    pub(crate) fn new(writer: impl AsyncWrite + Send + Unpin + 'static) -> Self {
        Self {
            writer: Box::new(writer),
            queued: Vec::new(),
        }
    }

    /// Writes the queue out. Cancel-safe: bytes leave the queue only once
    /// written, so a dropped caller never cuts a frame; the next flush
    /// writes the rest.
    pub(crate) async fn flush(&mut self) -> io::Result<()> {
        while !self.queued.is_empty() {
            let n = self.writer.write(&self.queued).await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            self.queued.drain(..n);
        }
        self.writer.flush().await
    }
}

/// This end's SETTINGS with `params`, and the connection window opened to
/// its largest (§6.9.2), so the peer never waits to send.
pub(crate) fn write_opening(out: &mut Vec<u8>, params: &[(u16, u32)]) {
    frame::write_settings(out, params);
    let grow = frame::MAX_WINDOW - frame::DEFAULT_WINDOW;
    frame::write_frame(out, kind::WINDOW_UPDATE, 0, 0, &grow.to_be_bytes());
}

/// Appends RST_STREAM.
pub(crate) fn write_reset(out: &mut Vec<u8>, stream: u32, reason: Reason) {
    frame::write_frame(out, kind::RST_STREAM, 0, stream, &reason.0.to_be_bytes());
}

/// Appends GOAWAY.
pub(crate) fn write_goaway(out: &mut Vec<u8>, last_stream: u32, reason: Reason) {
    let mut payload = [0u8; 8];
    payload[..4].copy_from_slice(&last_stream.to_be_bytes());
    payload[4..].copy_from_slice(&reason.0.to_be_bytes());
    frame::write_frame(out, kind::GOAWAY, 0, 0, &payload);
}

/// Calls `on_frame` for each complete frame at the front of `buf`; returns
/// how many bytes they took, and the first error. A frame larger than this
/// end allows (it never raises SETTINGS_MAX_FRAME_SIZE) is an error.
pub(crate) fn each_frame(
    buf: &[u8],
    mut on_frame: impl FnMut(Head, &[u8]) -> Result<(), FrameError>,
) -> (usize, Result<(), FrameError>) {
    let mut at = 0;
    while let Some(head) = buf.get(at..at + frame::HEAD_LEN) {
        let head = Head::parse(head.try_into().unwrap_or(&[0; frame::HEAD_LEN]));
        if head.len > frame::DEFAULT_MAX_FRAME {
            let e = FrameError {
                reason: Reason::FRAME_SIZE_ERROR,
                what: "a frame larger than SETTINGS_MAX_FRAME_SIZE",
            };
            return (at, Err(e));
        }
        let end = at + frame::HEAD_LEN + head.len;
        let Some(payload) = buf.get(at + frame::HEAD_LEN..end) else {
            break;
        };
        at = end;
        if let Err(e) = on_frame(head, payload) {
            return (at, Err(e));
        }
    }
    (at, Ok(()))
}

/// A complete header block.
pub(crate) enum Block {
    /// Its fields.
    Fields(HeaderList),
    /// Its fields exceeded the list limit (the table still follows the
    /// peer's encoder): a stream error, not a connection error.
    TooLarge(usize),
}

/// Header blocks as they arrive in HEADERS and CONTINUATION frames, and
/// the decoder that follows the peer's dynamic table.
struct Blocks {
    decoder: Decoder,
    /// A block awaiting CONTINUATION: its stream, whether its HEADERS ended
    /// the stream, and the fragments so far.
    open: Option<(u32, bool, Vec<u8>)>,
}

fn protocol(what: &'static str) -> FrameError {
    FrameError {
        reason: Reason::PROTOCOL_ERROR,
        what,
    }
}

impl Blocks {
    fn new() -> Self {
        Self {
            decoder: Decoder::new(crate::hpack::DEFAULT_TABLE_SIZE, LIST_LIMIT),
            open: None,
        }
    }

    /// Takes `frame` into its block when it is HEADERS or CONTINUATION:
    /// `Some` with the stream, whether it ended, and the block once the
    /// block is complete. Any other frame while a block is open is an
    /// error (§6.10).
    fn take(
        &mut self,
        frame: &Frame,
        payload: &[u8],
    ) -> Result<Option<(u32, bool, Block)>, FrameError> {
        let (stream, fragment, end_headers, end_stream) = match frame {
            Frame::Headers {
                stream,
                block,
                end_headers,
                end_stream,
            } => {
                if self.open.is_some() {
                    return Err(protocol("a frame between HEADERS and its CONTINUATION"));
                }
                (*stream, &payload[block.clone()], *end_headers, *end_stream)
            }
            Frame::Continuation {
                stream,
                block,
                end_headers,
            } => {
                let Some((open, end_stream, _)) = &self.open else {
                    return Err(protocol("CONTINUATION without HEADERS"));
                };
                if open != stream {
                    return Err(protocol("CONTINUATION on another stream"));
                }
                (*stream, &payload[block.clone()], *end_headers, *end_stream)
            }
            _ if self.open.is_some() => {
                return Err(protocol("a frame between HEADERS and its CONTINUATION"));
            }
            _ => return Ok(None),
        };
        let mut fragments = self.open.take().map(|(_, _, f)| f).unwrap_or_default();
        fragments.extend_from_slice(fragment);
        if !end_headers {
            if fragments.len() > LIST_LIMIT * 2 {
                return Err(FrameError {
                    reason: Reason::ENHANCE_YOUR_CALM,
                    what: "a header block without end",
                });
            }
            self.open = Some((stream, end_stream, fragments));
            return Ok(None);
        }
        let mut list = HeaderList::new();
        let block = match self.decoder.decode(&fragments, &mut list) {
            Ok(()) => Block::Fields(list),
            Err(HpackError::ListTooLarge(limit)) => Block::TooLarge(limit),
            Err(_) => {
                return Err(FrameError {
                    reason: Reason::COMPRESSION_ERROR,
                    what: "a header block that does not decode",
                });
            }
        };
        Ok(Some((stream, end_stream, block)))
    }
}

/// The peer's settings that bind what this end sends.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer {
    pub(crate) max_frame: usize,
    pub(crate) initial_window: i64,
    pub(crate) max_streams: usize,
}

impl Default for Peer {
    fn default() -> Self {
        Self {
            max_frame: frame::DEFAULT_MAX_FRAME,
            initial_window: i64::from(frame::DEFAULT_WINDOW),
            max_streams: usize::MAX,
        }
    }
}

impl Peer {
    /// Applies one setting; returns what every stream's send window
    /// changes by (§6.9.2).
    pub(crate) fn apply(&mut self, id: u16, value: u32) -> Result<i64, FrameError> {
        match id {
            setting::MAX_FRAME_SIZE => {
                if !(frame::DEFAULT_MAX_FRAME as u32..1 << 24).contains(&value) {
                    return Err(protocol("SETTINGS_MAX_FRAME_SIZE out of range"));
                }
                self.max_frame = value as usize;
            }
            setting::INITIAL_WINDOW_SIZE => {
                if value > frame::MAX_WINDOW {
                    return Err(FrameError {
                        reason: Reason::FLOW_CONTROL_ERROR,
                        what: "SETTINGS_INITIAL_WINDOW_SIZE above 2^31 - 1",
                    });
                }
                let delta = i64::from(value) - self.initial_window;
                self.initial_window = i64::from(value);
                return Ok(delta);
            }
            setting::MAX_CONCURRENT_STREAMS => self.max_streams = value as usize,
            // No dynamic table is used to encode, so its size does not
            // matter; the rest bind the peer, not this end.
            _ => {}
        }
        Ok(0)
    }
}

/// What a frame read means once the part both ends handle alike is done.
pub(crate) enum Incoming {
    /// A header block is complete.
    Block {
        stream: u32,
        end_stream: bool,
        block: Block,
    },
    /// SETTINGS or PING, handled; new settings may have opened windows.
    Settled,
    /// Any other frame; DATA is already counted against the connection
    /// window.
    Frame(Frame),
}

/// The reading side of a connection: frames parsed, header blocks joined
/// and decoded, SETTINGS and PING answered, received DATA counted.
pub(crate) struct Reader {
    blocks: Blocks,
    received: Received,
}

impl Reader {
    pub(crate) fn new() -> Self {
        Self {
            blocks: Blocks::new(),
            received: Received::default(),
        }
    }

    /// Reads one frame; `windows` are the streams' send windows, which a
    /// new initial window size moves.
    pub(crate) fn read<'a>(
        &mut self,
        head: Head,
        payload: &[u8],
        peer: &mut Peer,
        windows: impl Iterator<Item = &'a mut i64>,
        out: &mut Vec<u8>,
    ) -> Result<Incoming, FrameError> {
        let parsed = frame::parse(head, payload)?;
        if let Some((stream, end_stream, block)) = self.blocks.take(&parsed, payload)? {
            return Ok(Incoming::Block {
                stream,
                end_stream,
                block,
            });
        }
        if on_settings_or_ping(peer, windows, &parsed, out)? {
            return Ok(Incoming::Settled);
        }
        if let Frame::Data { .. } = parsed {
            self.received.on_data(head.len, out);
        }
        Ok(Incoming::Frame(parsed))
    }
}

/// SETTINGS and PING, which both ends handle alike: the peer's settings
/// applied (a new initial window size moves every stream's send window,
/// §6.9.2) and acknowledged, a PING answered. Returns whether `frame` was
/// one of them.
fn on_settings_or_ping<'a>(
    peer: &mut Peer,
    windows: impl Iterator<Item = &'a mut i64>,
    frame: &Frame,
    out: &mut Vec<u8>,
) -> Result<bool, FrameError> {
    match frame {
        Frame::Settings { ack: false, params } => {
            let mut delta = 0;
            for &(id, value) in params {
                delta += peer.apply(id, value)?;
            }
            if delta != 0 {
                for window in windows {
                    *window += delta;
                }
            }
            frame::write_frame(out, kind::SETTINGS, flag::ACK, 0, &[]);
        }
        Frame::Ping { ack: false, data } => {
            frame::write_frame(out, kind::PING, flag::ACK, 0, data);
        }
        Frame::Settings { ack: true, .. } | Frame::Ping { ack: true, .. } => {}
        _ => return Ok(false),
    }
    Ok(true)
}

/// A window grown by a WINDOW_UPDATE; above 2^31 - 1 is an error (§6.9.1).
pub(crate) fn grow(window: &mut i64, increment: u32) -> Result<(), FrameError> {
    *window += i64::from(increment);
    if *window > i64::from(frame::MAX_WINDOW) {
        return Err(FrameError {
            reason: Reason::FLOW_CONTROL_ERROR,
            what: "a window above 2^31 - 1",
        });
    }
    Ok(())
}

/// How much of `left` bytes both windows let through now, taken from them.
pub(crate) fn take_window(connection: &mut i64, stream: &mut i64, left: usize) -> usize {
    let n = (left as i64).min(*connection).min(*stream).max(0);
    *connection -= n;
    *stream -= n;
    n as usize
}

/// Counts the DATA received and tops the connection window up long before
/// it runs out.
#[derive(Default)]
struct Received(u32);

impl Received {
    fn on_data(&mut self, len: usize, out: &mut Vec<u8>) {
        self.0 += len as u32;
        if self.0 >= REFILL_AT {
            frame::write_frame(out, kind::WINDOW_UPDATE, 0, 0, &self.0.to_be_bytes());
            self.0 = 0;
        }
    }
}
