//! A client connection for unary calls: each call is one stream, a HEADERS
//! frame and the request's DATA written together, then the answer's
//! headers, data and trailers gathered for the caller.
//!
//! A task reads the connection and hands each stream its frames; callers
//! write their own frames, so a call costs one write and one wake-up on
//! each side when the server answers in one write. The windows this end
//! announces are the largest there are, so the server never waits for a
//! WINDOW_UPDATE; the server's windows, frame size and stream limit are
//! honoured.

use std::collections::HashMap;
use std::future::poll_fn;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf};

use crate::frame::{self, Frame, FrameError, Head, Reason, flag, kind, setting};
use crate::hpack::{self, Decoder, HeaderList, HpackError};

/// The largest header list this end accepts in one block.
const LIST_LIMIT: usize = 1 << 20;
/// Consumed bytes after which the connection window is topped up.
const REFILL_AT: u32 = 1 << 30;
/// The largest client stream id.
const LAST_STREAM_ID: u32 = (1 << 31) - 1;

/// Why a call got no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The connection broke, or the server is ending it (GOAWAY) and did
    /// not take this call: nothing of it ran, and a new connection may
    /// retry it.
    #[error("the connection is unavailable: {0}")]
    Unavailable(String),
    /// The server reset the stream.
    #[error("the server reset the stream: {0}")]
    Reset(Reason),
    /// The server broke the protocol; the connection is closed.
    #[error("the server broke HTTP/2: {0}")]
    Protocol(String),
    /// The answer's data exceeded the call's limit; the stream was reset.
    #[error("the answer is larger than {0} bytes")]
    TooLarge(usize),
}

/// One call's request. The pseudo-headers are `POST`, `http`, `path` and
/// `authority`; `headers` follow them, with names in lower case.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// `:path`, e.g. `/csi.v1.Identity/Probe`.
    pub path: &'a str,
    /// `:authority`.
    pub authority: &'a str,
    /// Further header fields.
    pub headers: &'a [(&'a str, &'a [u8])],
    /// The DATA to send: a gRPC message with its 5-byte prefix.
    pub body: &'a [u8],
    /// The most DATA the answer may carry.
    pub max_response: usize,
}

/// One call's answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Response {
    /// The first header block (`:status` and the rest).
    pub head: HeaderList,
    /// The DATA, padding removed.
    pub data: Vec<u8>,
    /// The trailers; empty for a trailers-only answer, whose status is in
    /// `head`.
    pub trailers: HeaderList,
}

/// A connection to one server; clones share it.
#[derive(Clone)]
pub struct Connection {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("open", &self.is_open())
            .finish()
    }
}

type Writer = Box<dyn AsyncWrite + Send + Unpin>;

struct Shared {
    state: Mutex<State>,
    writer: tokio::sync::Mutex<Writer>,
}

struct State {
    next_stream: u32,
    streams: HashMap<u32, Slot>,
    /// The server's SETTINGS.
    max_frame: usize,
    initial_window: i64,
    max_streams: usize,
    /// The connection's send window.
    window: i64,
    /// Why new calls fail: the connection ended or is ending.
    ended: Option<String>,
    /// Calls waiting for window or for a stream.
    waiting: Vec<Waker>,
}

struct Slot {
    answer: Response,
    /// The first header block arrived.
    headed: bool,
    /// The server's last frame arrived.
    done: bool,
    failed: Option<CallError>,
    window: i64,
    waker: Option<Waker>,
    max_response: usize,
}

impl State {
    fn wake_waiting(&mut self) {
        for waker in self.waiting.drain(..) {
            waker.wake();
        }
    }

    fn wake(slot: &mut Slot) {
        if let Some(waker) = slot.waker.take() {
            waker.wake();
        }
    }

    /// Ends the connection: every unanswered call fails with `why`.
    fn end(&mut self, why: CallError) {
        if self.ended.is_none() {
            self.ended = Some(why.to_string());
        }
        for slot in self.streams.values_mut() {
            if !slot.done && slot.failed.is_none() {
                slot.failed = Some(why.clone());
            }
            Self::wake(slot);
        }
        self.wake_waiting();
    }
}

/// Starts a connection on `io`: writes the preface and this end's
/// SETTINGS (push off, the largest stream window) and opens the connection
/// window as wide; spawns the task that reads. Calls may start at once.
pub async fn handshake<T>(io: T) -> io::Result<Connection>
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (reader, mut writer) = tokio::io::split(io);
    let mut out = frame::PREFACE.to_vec();
    frame::write_settings(
        &mut out,
        &[
            (setting::ENABLE_PUSH, 0),
            (setting::INITIAL_WINDOW_SIZE, frame::MAX_WINDOW),
        ],
    );
    let grow = frame::MAX_WINDOW - frame::DEFAULT_WINDOW;
    frame::write_frame(&mut out, kind::WINDOW_UPDATE, 0, 0, &grow.to_be_bytes());
    writer.write_all(&out).await?;
    writer.flush().await?;
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            next_stream: 1,
            streams: HashMap::new(),
            max_frame: frame::DEFAULT_MAX_FRAME,
            initial_window: i64::from(frame::DEFAULT_WINDOW),
            max_streams: usize::MAX,
            window: i64::from(frame::DEFAULT_WINDOW),
            ended: None,
            waiting: Vec::new(),
        }),
        writer: tokio::sync::Mutex::new(Box::new(writer) as Writer),
    });
    tokio::spawn(read_loop(shared.clone(), reader));
    Ok(Connection { shared })
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn write(&self, bytes: &[u8]) -> Result<(), CallError> {
        let mut writer = self.writer.lock().await;
        let written = async {
            writer.write_all(bytes).await?;
            writer.flush().await
        };
        written.await.map_err(|e| {
            let why = CallError::Unavailable(format!("writing: {e}"));
            self.lock().end(why.clone());
            why
        })
    }
}

/// Removes a call's stream when the call ends; a call dropped before its
/// answer resets the stream, so the server stops working on it.
struct StreamGuard {
    shared: Arc<Shared>,
    stream: u32,
    answered: bool,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        let unfinished = state
            .streams
            .remove(&self.stream)
            .is_some_and(|slot| !slot.done && slot.failed.is_none());
        state.wake_waiting();
        let open = state.ended.is_none();
        drop(state);
        if unfinished && !self.answered && open {
            let mut out = Vec::new();
            let code = Reason::CANCEL.0.to_be_bytes();
            frame::write_frame(&mut out, kind::RST_STREAM, 0, self.stream, &code);
            let shared = self.shared.clone();
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _ = shared.write(&out).await;
                });
            }
        }
    }
}

impl Connection {
    /// Whether new calls can start on this connection.
    pub fn is_open(&self) -> bool {
        self.shared.lock().ended.is_none()
    }

    /// Makes one unary call and waits for its whole answer.
    pub async fn call(&self, request: &Request<'_>) -> Result<Response, CallError> {
        let stream = poll_fn(|cx| {
            let mut state = self.shared.lock();
            if let Some(why) = &state.ended {
                return Poll::Ready(Err(CallError::Unavailable(why.clone())));
            }
            if state.streams.len() >= state.max_streams {
                state.waiting.push(cx.waker().clone());
                return Poll::Pending;
            }
            let stream = state.next_stream;
            if stream > LAST_STREAM_ID {
                let why = CallError::Unavailable("stream ids are used up".into());
                state.end(why.clone());
                return Poll::Ready(Err(why));
            }
            state.next_stream += 2;
            let window = state.initial_window;
            state.streams.insert(
                stream,
                Slot {
                    answer: Response::default(),
                    headed: false,
                    done: false,
                    failed: None,
                    window,
                    waker: None,
                    max_response: request.max_response,
                },
            );
            Poll::Ready(Ok(stream))
        })
        .await?;
        let mut guard = StreamGuard {
            shared: self.shared.clone(),
            stream,
            answered: false,
        };

        let mut block = Vec::with_capacity(128);
        hpack::encode_indexed(hpack::METHOD_POST, &mut block);
        hpack::encode_indexed(hpack::SCHEME_HTTP, &mut block);
        hpack::encode_literal(b":path", request.path.as_bytes(), false, &mut block);
        hpack::encode_literal(
            b":authority",
            request.authority.as_bytes(),
            false,
            &mut block,
        );
        for (name, value) in request.headers {
            hpack::encode_literal(name.as_bytes(), value, false, &mut block);
        }
        let max_frame = self.shared.lock().max_frame;
        let mut out = Vec::with_capacity(block.len() + request.body.len() + 32);
        frame::write_headers(&mut out, stream, &block, false, max_frame);

        // The body, as far as the server's windows allow at a time.
        let body = request.body;
        let mut sent = 0;
        loop {
            let (n, max_frame) = poll_fn(|cx| {
                let mut state = self.shared.lock();
                let state = &mut *state;
                let Some(slot) = state.streams.get_mut(&stream) else {
                    return Poll::Ready(Err(CallError::Unavailable("the stream is gone".into())));
                };
                if let Some(why) = &slot.failed {
                    return Poll::Ready(Err(why.clone()));
                }
                let left = (body.len() - sent) as i64;
                let n = left.min(state.window).min(slot.window).max(0);
                if left > 0 && n == 0 {
                    state.waiting.push(cx.waker().clone());
                    return Poll::Pending;
                }
                state.window -= n;
                slot.window -= n;
                Poll::Ready(Ok((n as usize, state.max_frame)))
            })
            .await?;
            let end = sent + n == body.len();
            frame::write_data(&mut out, stream, &body[sent..sent + n], end, max_frame);
            sent += n;
            self.shared.write(&out).await?;
            out.clear();
            if end {
                break;
            }
        }

        let answer = poll_fn(|cx| {
            let mut state = self.shared.lock();
            let Some(slot) = state.streams.get_mut(&stream) else {
                return Poll::Ready(Err(CallError::Unavailable("the stream is gone".into())));
            };
            if slot.done {
                return Poll::Ready(Ok(std::mem::take(&mut slot.answer)));
            }
            if let Some(why) = &slot.failed {
                return Poll::Ready(Err(why.clone()));
            }
            slot.waker = Some(cx.waker().clone());
            Poll::Pending
        })
        .await;
        guard.answered = true;
        answer
    }
}

/// Reads frames until the connection ends, then fails every unanswered call.
async fn read_loop<T: AsyncRead>(shared: Arc<Shared>, mut reader: ReadHalf<T>) {
    let mut connection = Reading {
        decoder: Decoder::new(hpack::DEFAULT_TABLE_SIZE, LIST_LIMIT),
        block: None,
        consumed: 0,
    };
    let mut buf: Vec<u8> = Vec::with_capacity(frame::DEFAULT_MAX_FRAME + frame::HEAD_LEN);
    let why = loop {
        let mut out = Vec::new();
        let mut at = 0;
        let mut broken = None;
        {
            let mut state = shared.lock();
            while buf.len() - at >= frame::HEAD_LEN {
                let head = Head::parse(buf[at..at + frame::HEAD_LEN].try_into().unwrap_or(&[0; 9]));
                if head.len > frame::DEFAULT_MAX_FRAME {
                    broken = Some(FrameError {
                        reason: Reason::FRAME_SIZE_ERROR,
                        what: "a frame larger than SETTINGS_MAX_FRAME_SIZE",
                    });
                    break;
                }
                let end = at + frame::HEAD_LEN + head.len;
                if buf.len() < end {
                    break;
                }
                let payload = &buf[at + frame::HEAD_LEN..end];
                at = end;
                if let Err(e) = connection.on_frame(&mut state, head, payload, &mut out) {
                    broken = Some(e);
                    break;
                }
            }
        }
        buf.drain(..at);
        if let Some(e) = broken {
            let mut goaway = Vec::new();
            let mut payload = [0u8; 8];
            payload[4..].copy_from_slice(&e.reason.0.to_be_bytes());
            frame::write_frame(&mut goaway, kind::GOAWAY, 0, 0, &payload);
            let _ = shared.write(&goaway).await;
            break CallError::Protocol(e.to_string());
        }
        if !out.is_empty() && shared.write(&out).await.is_err() {
            break CallError::Unavailable("writing to the server failed".into());
        }
        if buf.capacity() - buf.len() < frame::HEAD_LEN {
            buf.reserve(frame::DEFAULT_MAX_FRAME);
        }
        match reader.read_buf(&mut buf).await {
            Ok(0) => break CallError::Unavailable("the server closed the connection".into()),
            Ok(_) => {}
            Err(e) => break CallError::Unavailable(format!("reading: {e}")),
        }
    };
    shared.lock().end(why);
}

/// The reading side's own state.
struct Reading {
    decoder: Decoder,
    /// A header block still awaiting CONTINUATION: its stream, whether its
    /// HEADERS ended the stream, and the fragments so far.
    block: Option<(u32, bool, Vec<u8>)>,
    /// DATA bytes received since the connection window was last topped up.
    consumed: u32,
}

impl Reading {
    fn on_frame(
        &mut self,
        state: &mut State,
        head: Head,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), FrameError> {
        let parsed = frame::parse(head, payload)?;
        if self.block.is_some() && !matches!(parsed, Frame::Continuation { .. }) {
            return Err(FrameError {
                reason: Reason::PROTOCOL_ERROR,
                what: "a frame between HEADERS and its CONTINUATION",
            });
        }
        match parsed {
            Frame::Headers {
                stream,
                block,
                end_headers,
                end_stream,
            } => {
                let fragment = payload[block].to_vec();
                if end_headers {
                    self.on_block(state, stream, end_stream, &fragment, out)?;
                } else {
                    self.block = Some((stream, end_stream, fragment));
                }
            }
            Frame::Continuation {
                stream,
                block,
                end_headers,
            } => {
                let Some((open, end_stream, mut fragments)) = self.block.take() else {
                    return Err(FrameError {
                        reason: Reason::PROTOCOL_ERROR,
                        what: "CONTINUATION without HEADERS",
                    });
                };
                if open != stream {
                    return Err(FrameError {
                        reason: Reason::PROTOCOL_ERROR,
                        what: "CONTINUATION on another stream",
                    });
                }
                fragments.extend_from_slice(&payload[block]);
                if fragments.len() > LIST_LIMIT * 2 {
                    return Err(FrameError {
                        reason: Reason::ENHANCE_YOUR_CALM,
                        what: "a header block without end",
                    });
                }
                if end_headers {
                    self.on_block(state, stream, end_stream, &fragments, out)?;
                } else {
                    self.block = Some((stream, end_stream, fragments));
                }
            }
            Frame::Data {
                stream,
                data,
                end_stream,
            } => {
                self.consumed += head.len as u32;
                if self.consumed >= REFILL_AT {
                    frame::write_frame(
                        out,
                        kind::WINDOW_UPDATE,
                        0,
                        0,
                        &self.consumed.to_be_bytes(),
                    );
                    self.consumed = 0;
                }
                if let Some(slot) = state.streams.get_mut(&stream)
                    && !slot.done
                    && slot.failed.is_none()
                {
                    if slot.answer.data.len() + data.len() > slot.max_response {
                        slot.failed = Some(CallError::TooLarge(slot.max_response));
                        reset(out, stream, Reason::CANCEL);
                    } else {
                        slot.answer.data.extend_from_slice(&payload[data]);
                        slot.done = end_stream;
                    }
                    if slot.done || slot.failed.is_some() {
                        State::wake(slot);
                    }
                }
            }
            Frame::Reset { stream, reason } => {
                if let Some(slot) = state.streams.get_mut(&stream)
                    && !slot.done
                {
                    slot.failed = Some(CallError::Reset(reason));
                    State::wake(slot);
                }
            }
            Frame::Settings { ack: true, .. } => {}
            Frame::Settings { ack: false, params } => {
                for (id, value) in params {
                    apply_setting(state, id, value)?;
                }
                frame::write_frame(out, kind::SETTINGS, flag::ACK, 0, &[]);
                state.wake_waiting();
            }
            Frame::Ping { ack: false, data } => {
                frame::write_frame(out, kind::PING, flag::ACK, 0, &data);
            }
            Frame::Ping { ack: true, .. } | Frame::Ignored => {}
            Frame::GoAway {
                last_stream,
                reason,
            } => {
                let why = format!("the server sent GOAWAY ({reason})");
                state.ended.get_or_insert(why.clone());
                for (&id, slot) in state.streams.iter_mut() {
                    if id > last_stream && !slot.done && slot.failed.is_none() {
                        slot.failed = Some(CallError::Unavailable(why.clone()));
                        State::wake(slot);
                    }
                }
                state.wake_waiting();
            }
            Frame::WindowUpdate { stream, increment } => {
                let window = if stream == 0 {
                    &mut state.window
                } else if let Some(slot) = state.streams.get_mut(&stream) {
                    &mut slot.window
                } else {
                    return Ok(());
                };
                *window += i64::from(increment);
                if *window > i64::from(frame::MAX_WINDOW) {
                    return Err(FrameError {
                        reason: Reason::FLOW_CONTROL_ERROR,
                        what: "a window above 2^31 - 1",
                    });
                }
                state.wake_waiting();
            }
        }
        Ok(())
    }

    /// A complete header block: the answer's head, or its trailers.
    fn on_block(
        &mut self,
        state: &mut State,
        stream: u32,
        end_stream: bool,
        block: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), FrameError> {
        // Decoded even for a stream no call waits for: the table must
        // follow the server's encoder.
        let mut list = HeaderList::new();
        let fields = match self.decoder.decode(block, &mut list) {
            Ok(()) => Ok(list),
            Err(HpackError::ListTooLarge(limit)) => Err(limit),
            Err(_) => {
                return Err(FrameError {
                    reason: Reason::COMPRESSION_ERROR,
                    what: "a header block that does not decode",
                });
            }
        };
        let Some(slot) = state.streams.get_mut(&stream) else {
            return Ok(());
        };
        if slot.done || slot.failed.is_some() {
            return Ok(());
        }
        match fields {
            Err(limit) => {
                slot.failed = Some(CallError::TooLarge(limit));
                reset(out, stream, Reason::CANCEL);
            }
            Ok(fields) if !slot.headed => {
                slot.headed = true;
                slot.answer.head = fields;
                slot.done = end_stream;
            }
            Ok(fields) => {
                slot.answer.trailers = fields;
                slot.done = true;
                if !end_stream {
                    slot.failed = Some(CallError::Protocol("trailers without END_STREAM".into()));
                }
            }
        }
        if slot.done || slot.failed.is_some() {
            State::wake(slot);
        }
        Ok(())
    }
}

fn reset(out: &mut Vec<u8>, stream: u32, reason: Reason) {
    frame::write_frame(out, kind::RST_STREAM, 0, stream, &reason.0.to_be_bytes());
}

fn apply_setting(state: &mut State, id: u16, value: u32) -> Result<(), FrameError> {
    match id {
        setting::MAX_FRAME_SIZE => {
            if !(frame::DEFAULT_MAX_FRAME as u32..1 << 24).contains(&value) {
                return Err(FrameError {
                    reason: Reason::PROTOCOL_ERROR,
                    what: "SETTINGS_MAX_FRAME_SIZE out of range",
                });
            }
            state.max_frame = value as usize;
        }
        setting::INITIAL_WINDOW_SIZE => {
            if value > frame::MAX_WINDOW {
                return Err(FrameError {
                    reason: Reason::FLOW_CONTROL_ERROR,
                    what: "SETTINGS_INITIAL_WINDOW_SIZE above 2^31 - 1",
                });
            }
            let delta = i64::from(value) - state.initial_window;
            state.initial_window = i64::from(value);
            for slot in state.streams.values_mut() {
                slot.window += delta;
            }
        }
        setting::MAX_CONCURRENT_STREAMS => state.max_streams = value as usize,
        // No dynamic table is used to encode, so its size does not matter;
        // the rest do not apply to a client.
        _ => {}
    }
    Ok(())
}
