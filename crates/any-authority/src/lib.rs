//! Serving gRPC clients that send the socket path as `:authority`.
//!
//! **A workaround, to be dropped once h2 accepts such authorities**: the
//! upstream issue is hyperium/h2#442 ("Support for h2 over UDS",
//! <https://github.com/hyperium/h2/issues/442>), and the fix proposed for
//! it, hyperium/h2#487 ("Do not require authority for UNIX domain sockets",
//! <https://github.com/hyperium/h2/pull/487>), is not merged. When an h2
//! release serves these clients, csi-server stops wrapping connections in
//! [`AnyAuthority`] and this crate goes.
//!
//! gRPC's C-core (Python's grpcio, C++, Ruby, PHP, ...) and grpc-java dial
//! `unix:///run/csi/csi.sock` and send the socket path as the HTTP/2
//! `:authority`, percent-encoded (`%2Frun%2Fcsi%2Fcsi.sock`) or raw. h2, under
//! hyper and tonic, parses `:authority` as a URI authority and resets such a
//! stream with PROTOCOL_ERROR before any service sees it. h2 0.4 has no
//! option to relax that, and patching h2 is not an option for a library.
//!
//! On a unix socket the authority names nothing: the socket already is the
//! peer. So [`AnyAuthority`] wraps each accepted connection and rewrites
//! what the client sends before h2 reads it:
//!
//! - frames other than HEADERS/CONTINUATION are passed through as they
//!   arrive (DATA is never buffered whole);
//! - each header block is joined from its HEADERS and CONTINUATION frames
//!   and decoded with a decoder that keeps the client encoder's dynamic
//!   table; a block whose `:authority` h2 accepts goes out byte for byte;
//! - from the first block with an authority h2 would reject, the
//!   connection's blocks are re-encoded as literals that never touch h2's
//!   dynamic table (after one size update to 0, so no stale entry can be
//!   referenced), with that authority replaced by `localhost`, the value
//!   grpc-go sends on unix sockets. Padding is dropped, priority kept, and
//!   blocks are split into frames of at most 16 KiB, the smallest
//!   SETTINGS_MAX_FRAME_SIZE a server may have.
//!
//! Anything the adapter cannot follow (no HTTP/2 preface, a malformed
//! block, a frame interleaved into a header block, a block over 1 MiB)
//! makes it step aside, when nothing was re-encoded yet: the held bytes go
//! to h2 unchanged and h2 answers as it would have without the adapter.
//! After re-encoding started, h2 could no longer make sense of the client's
//! own bytes, so the connection is closed instead.
//!
//! Only the client-to-server direction is touched; responses are written
//! straight through. The cost is one decode of each request's header
//! block (`cargo bench -p any-authority` measures it).

mod client;
pub use h2_unary::hpack;

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

pub use client::{RawCallError, RawReply, unary_with_authority};
use hpack::{Decoder, HeaderList, HpackError};

use h2_unary::frame::flag::{END_HEADERS, END_STREAM, PADDED, PRIORITY};
use h2_unary::frame::kind::{CONTINUATION, HEADERS, PUSH_PROMISE};
use h2_unary::frame::{DEFAULT_MAX_FRAME, Head, PREFACE, write_head};

/// The largest header block held before stepping aside (h2's own limit on
/// the decoded list is 16 KiB by default).
const MAX_BLOCK: usize = 1 << 20;
/// What replaces an authority h2 rejects.
const REPLACEMENT: &[u8] = b"localhost";

/// Whether h2 accepts `value` as `:authority` (it uses the same parser).
fn authority_ok(value: &[u8]) -> bool {
    tonic::codegen::http::uri::Authority::try_from(value).is_ok()
}

/// Why a connection was closed: the client's bytes stopped making sense
/// after its header blocks had been re-encoded.
#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    /// A header block that does not decode.
    #[error("client sent an undecodable header block: {0}")]
    Hpack(#[from] HpackError),
    /// Frames that break HTTP/2's framing rules.
    #[error("client broke HTTP/2 framing: {0}")]
    Framing(&'static str),
}

impl From<RewriteError> for io::Error {
    fn from(e: RewriteError) -> Self {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

#[derive(Debug, Clone, Copy)]
enum State {
    /// This many bytes of the preface seen.
    Preface(usize),
    /// Reading a frame header.
    Head,
    /// Copying this many more payload bytes of a frame left alone.
    Forward(usize),
    /// Collecting the payload of a HEADERS/CONTINUATION frame.
    Payload,
    /// Everything is copied unchanged from now on.
    Passthrough,
}

/// The HEADERS frame that opened the block being collected.
#[derive(Debug, Clone, Copy)]
struct OpenBlock {
    stream: u32,
    flags: u8,
    priority: Option<[u8; 5]>,
}

/// The client-to-server half of the adapter, without IO: bytes in, bytes
/// out, fed in pieces of any size.
#[derive(Debug)]
pub struct Rewriter {
    state: State,
    head: [u8; 9],
    head_len: usize,
    current: Head,
    /// Raw bytes of the block being collected, frame headers included: what
    /// goes out when the block needs no change.
    held: Vec<u8>,
    payload_start: usize,
    /// The block's HPACK fragments, joined.
    block: Vec<u8>,
    open: Option<OpenBlock>,
    decoder: Decoder,
    list: HeaderList,
    encoded: Vec<u8>,
    rewriting: bool,
}

impl Default for Rewriter {
    fn default() -> Self {
        Self::new()
    }
}

impl Rewriter {
    /// A rewriter for a new connection (expects the client preface).
    pub fn new() -> Self {
        Self {
            state: State::Preface(0),
            head: [0; 9],
            head_len: 0,
            current: Head::default(),
            held: Vec::new(),
            payload_start: 0,
            block: Vec::new(),
            open: None,
            decoder: Decoder::default(),
            list: HeaderList::new(),
            encoded: Vec::new(),
            rewriting: false,
        }
    }

    /// Whether everything is copied unchanged from now on.
    pub fn is_passthrough(&self) -> bool {
        matches!(self.state, State::Passthrough)
    }

    /// Whether header blocks are being re-encoded (some authority needed a
    /// change).
    pub fn is_rewriting(&self) -> bool {
        self.rewriting
    }

    /// Consumes all of `input`, appending what h2 should read to `out`.
    /// Bytes of an incomplete header block are held until it completes.
    pub fn feed(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), RewriteError> {
        while !input.is_empty() {
            match self.state {
                State::Passthrough => {
                    out.extend_from_slice(input);
                    return Ok(());
                }
                State::Preface(seen) => {
                    let take = (PREFACE.len() - seen).min(input.len());
                    if input[..take] != PREFACE[seen..seen + take] {
                        // Not HTTP/2 with prior knowledge: h2 will say so.
                        out.extend_from_slice(&PREFACE[..seen]);
                        self.state = State::Passthrough;
                        continue;
                    }
                    input = &input[take..];
                    if seen + take == PREFACE.len() {
                        out.extend_from_slice(PREFACE);
                        self.state = State::Head;
                    } else {
                        self.state = State::Preface(seen + take);
                    }
                }
                State::Head => {
                    let take = (9 - self.head_len).min(input.len());
                    self.head[self.head_len..self.head_len + take].copy_from_slice(&input[..take]);
                    self.head_len += take;
                    input = &input[take..];
                    if self.head_len == 9 {
                        self.head_len = 0;
                        self.on_head(out)?;
                    }
                }
                State::Forward(left) => {
                    let take = left.min(input.len());
                    out.extend_from_slice(&input[..take]);
                    input = &input[take..];
                    self.state = if take == left {
                        State::Head
                    } else {
                        State::Forward(left - take)
                    };
                }
                State::Payload => {
                    let have = self.held.len() - self.payload_start;
                    let take = (self.current.len - have).min(input.len());
                    self.held.extend_from_slice(&input[..take]);
                    input = &input[take..];
                    if have + take == self.current.len {
                        self.on_payload(out)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// The client closed its side: hands over whatever is held so h2 sees
    /// exactly what was sent, truncation included.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        match self.state {
            State::Preface(seen) => out.extend_from_slice(&PREFACE[..seen]),
            State::Head => {
                out.extend_from_slice(&self.held);
                out.extend_from_slice(&self.head[..self.head_len]);
            }
            State::Payload => out.extend_from_slice(&self.held),
            State::Forward(_) | State::Passthrough => {}
        }
        self.held.clear();
        self.head_len = 0;
        self.state = State::Passthrough;
    }

    fn on_head(&mut self, out: &mut Vec<u8>) -> Result<(), RewriteError> {
        let raw = self.head;
        let f = Head::parse(&raw);
        let collect = match (self.open, f.kind) {
            (Some(open), CONTINUATION) if f.stream == open.stream => true,
            (Some(_), _) => return self.step_aside(out, &raw, "frame inside a header block"),
            (None, HEADERS) => true,
            (None, CONTINUATION) => {
                return self.step_aside(out, &raw, "CONTINUATION without HEADERS");
            }
            (None, PUSH_PROMISE) => {
                return self.step_aside(out, &raw, "PUSH_PROMISE from a client");
            }
            (None, _) => false,
        };
        if !collect {
            out.extend_from_slice(&raw);
            self.state = if f.len == 0 {
                State::Head
            } else {
                State::Forward(f.len)
            };
            return Ok(());
        }
        if self.held.len() + raw.len() + f.len > MAX_BLOCK {
            return self.step_aside(out, &raw, "header block over 1 MiB");
        }
        self.current = f;
        self.held.extend_from_slice(&raw);
        self.payload_start = self.held.len();
        self.state = State::Payload;
        if f.len == 0 {
            self.on_payload(out)?;
        }
        Ok(())
    }

    /// A HEADERS or CONTINUATION frame is complete in `held`.
    fn on_payload(&mut self, out: &mut Vec<u8>) -> Result<(), RewriteError> {
        self.state = State::Head;
        let f = self.current;
        let payload = &self.held[self.payload_start..];
        if f.kind == HEADERS {
            if f.stream == 0 {
                return self.step_aside(out, &[], "HEADERS on stream 0");
            }
            let mut p = payload;
            let mut pad = 0;
            if f.flags & PADDED != 0 {
                let Some((&n, rest)) = p.split_first() else {
                    return self.step_aside(out, &[], "PADDED HEADERS without pad length");
                };
                pad = usize::from(n);
                p = rest;
            }
            let mut priority = None;
            if f.flags & PRIORITY != 0 {
                let Some((prio, rest)) = p.split_first_chunk::<5>() else {
                    return self.step_aside(out, &[], "PRIORITY HEADERS too short");
                };
                priority = Some(*prio);
                p = rest;
            }
            if pad > p.len() {
                return self.step_aside(out, &[], "padding longer than the frame");
            }
            self.block.extend_from_slice(&p[..p.len() - pad]);
            self.open = Some(OpenBlock {
                stream: f.stream,
                flags: f.flags,
                priority,
            });
        } else {
            self.block.extend_from_slice(payload);
        }
        if f.flags & END_HEADERS != 0 {
            self.on_block(out)?;
        }
        Ok(())
    }

    /// A whole header block is in `block` (and its frames in `held`).
    fn on_block(&mut self, out: &mut Vec<u8>) -> Result<(), RewriteError> {
        let Some(open) = self.open else {
            return Err(RewriteError::Framing("header block without HEADERS"));
        };
        if let Err(e) = self.decoder.decode(&self.block, &mut self.list) {
            if self.rewriting {
                return Err(e.into());
            }
            return self.step_aside(out, &[], "undecodable header block");
        }
        let bad_authority = self
            .list
            .iter()
            .any(|(name, value, _)| name == b":authority" && !authority_ok(value));
        if !self.rewriting && !bad_authority {
            out.extend_from_slice(&self.held);
        } else {
            if !self.rewriting {
                tracing::debug!(
                    "client sent an :authority h2 rejects (a socket path); re-encoding this connection's header blocks with authority localhost"
                );
                self.rewriting = true;
                // h2's table is never used again: empty it.
                hpack::encode_size_update(0, &mut self.encoded);
            }
            for (name, value, never_indexed) in self.list.iter() {
                let value = if name == b":authority" && !authority_ok(value) {
                    REPLACEMENT
                } else {
                    value
                };
                hpack::encode_literal(name, value, never_indexed, &mut self.encoded);
            }
            write_block(open, &self.encoded, out);
            self.encoded.clear();
        }
        self.held.clear();
        self.block.clear();
        self.open = None;
        Ok(())
    }

    /// Gives up on this connection: before any re-encoding, hands the held
    /// bytes (and `extra`, a frame header not yet held) to h2 unchanged;
    /// after, h2 could not follow the client's table, so fails.
    fn step_aside(
        &mut self,
        out: &mut Vec<u8>,
        extra: &[u8],
        why: &'static str,
    ) -> Result<(), RewriteError> {
        if self.rewriting {
            return Err(RewriteError::Framing(why));
        }
        tracing::debug!(
            reason = why,
            "authority adapter steps aside; h2 reads this connection unchanged"
        );
        out.extend_from_slice(&self.held);
        out.extend_from_slice(extra);
        self.held = Vec::new();
        self.block = Vec::new();
        self.open = None;
        self.state = State::Passthrough;
        Ok(())
    }
}

/// Writes a re-encoded block as HEADERS (+ CONTINUATION) frames.
fn write_block(open: OpenBlock, block: &[u8], out: &mut Vec<u8>) {
    let prio_len = if open.priority.is_some() { 5 } else { 0 };
    let first_len = block.len().min(DEFAULT_MAX_FRAME - prio_len);
    let (first, mut rest) = block.split_at(first_len);
    let mut flags = open.flags & (END_STREAM | PRIORITY);
    if rest.is_empty() {
        flags |= END_HEADERS;
    }
    write_head(out, prio_len + first.len(), HEADERS, flags, open.stream);
    if let Some(prio) = open.priority {
        out.extend_from_slice(&prio);
    }
    out.extend_from_slice(first);
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(rest.len().min(DEFAULT_MAX_FRAME));
        let flags = if tail.is_empty() { END_HEADERS } else { 0 };
        write_head(out, chunk.len(), CONTINUATION, flags, open.stream);
        out.extend_from_slice(chunk);
        rest = tail;
    }
}

/// How much is read from the socket at a time.
const READ_CHUNK: usize = 16 * 1024;

/// A server-side connection whose client may send any `:authority`; see
/// the [module docs](self). Writes go straight to the inner stream.
#[derive(Debug)]
pub struct AnyAuthority<T> {
    inner: T,
    rewriter: Rewriter,
    scratch: Box<[u8]>,
    out: Vec<u8>,
    out_pos: usize,
    eof: bool,
}

impl<T> AnyAuthority<T> {
    /// Wraps a freshly accepted connection.
    pub fn new(inner: T) -> Self {
        Self {
            inner,
            rewriter: Rewriter::new(),
            scratch: vec![0; READ_CHUNK].into_boxed_slice(),
            out: Vec::new(),
            out_pos: 0,
            eof: false,
        }
    }

    /// The wrapped connection.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for AnyAuthority<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.out_pos < this.out.len() {
                let n = buf.remaining().min(this.out.len() - this.out_pos);
                buf.put_slice(&this.out[this.out_pos..this.out_pos + n]);
                this.out_pos += n;
                if this.out_pos == this.out.len() {
                    this.out.clear();
                    this.out_pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            if this.rewriter.is_passthrough() {
                return Pin::new(&mut this.inner).poll_read(cx, buf);
            }
            let mut read = ReadBuf::new(&mut this.scratch);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            let n = read.filled().len();
            if n == 0 {
                this.eof = true;
                this.rewriter.finish(&mut this.out);
            } else {
                this.rewriter.feed(&this.scratch[..n], &mut this.out)?;
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for AnyAuthority<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<T: Connected> Connected for AnyAuthority<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests;
