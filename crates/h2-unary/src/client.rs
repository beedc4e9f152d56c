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
//!
//! Frames are queued and written under one lock, and a stream's id is
//! taken when its HEADERS are queued, so ids reach the server in order
//! (RFC 7540 §5.1.1). Bytes leave the queue only once written: a call
//! dropped in the middle of a write leaves the rest queued, and a task
//! finishes the write and resets the stream, so no frame is ever cut.
//! The reading task ends when the last handle to the connection is dropped.

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

/// A connection to one server; clones share it, and dropping the last
/// one closes it.
#[derive(Clone)]
pub struct Connection {
    shared: Arc<Shared>,
    _alive: Arc<Alive>,
}

/// Tells the reading task to stop when the last [`Connection`] goes.
struct Alive(Arc<Shared>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.closed.notify_one();
    }
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
    outbox: tokio::sync::Mutex<Outbox>,
    /// Notified when the last [`Connection`] is dropped.
    closed: tokio::sync::Notify,
}

/// The write half and the frames queued for it, in order.
struct Outbox {
    writer: Writer,
    queued: Vec<u8>,
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
        outbox: tokio::sync::Mutex::new(Outbox {
            writer: Box::new(writer),
            queued: Vec::new(),
        }),
        closed: tokio::sync::Notify::new(),
    });
    tokio::spawn(read_loop(shared.clone(), reader));
    Ok(Connection {
        _alive: Arc::new(Alive(shared.clone())),
        shared,
    })
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues what `queue` appends (it runs under the state lock, after
    /// every frame queued before it), then writes the queue out.
    async fn send<R>(
        &self,
        queue: impl FnOnce(&mut State, &mut Vec<u8>) -> R,
    ) -> Result<R, CallError> {
        let mut outbox = self.outbox.lock().await;
        let queued = queue(&mut self.lock(), &mut outbox.queued);
        let outbox = &mut *outbox;
        let written = async {
            while !outbox.queued.is_empty() {
                // Cancel-safe: a write either happened and is drained here,
                // or did not happen.
                let n = outbox.writer.write(&outbox.queued).await?;
                if n == 0 {
                    return Err(io::ErrorKind::WriteZero.into());
                }
                outbox.queued.drain(..n);
            }
            outbox.writer.flush().await
        };
        written.await.map_err(|e: io::Error| {
            let why = CallError::Unavailable(format!("writing: {e}"));
            self.lock().end(why.clone());
            why
        })?;
        Ok(queued)
    }
}

/// Removes a call's stream when the call ends. A call dropped before its
/// answer leaves a task to write what it queued and reset the stream, so
/// the server stops working on it.
struct StreamGuard {
    shared: Arc<Shared>,
    stream: Option<u32>,
    answered: bool,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        let unfinished = self.stream.is_some_and(|stream| {
            state
                .streams
                .remove(&stream)
                .is_some_and(|slot| !slot.done && slot.failed.is_none())
        });
        state.wake_waiting();
        let open = state.ended.is_none();
        drop(state);
        if self.answered || !open {
            return;
        }
        let (shared, stream) = (self.shared.clone(), self.stream);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = shared
                    .send(|_, out| {
                        if let (Some(stream), true) = (stream, unfinished) {
                            reset(out, stream, Reason::CANCEL);
                        }
                    })
                    .await;
            });
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
        let mut guard = StreamGuard {
            shared: self.shared.clone(),
            stream: None,
            answered: false,
        };
        let body = request.body;
        let mut sent = 0;
        // The stream is opened with the first frames: HEADERS, and as much
        // of the body as the server's windows allow.
        let stream = loop {
            self.stream_room().await?;
            let opened = self
                .shared
                .send(|state, out| {
                    if let Some(why) = &state.ended {
                        return Err(CallError::Unavailable(why.clone()));
                    }
                    if state.streams.len() >= state.max_streams {
                        return Ok(None);
                    }
                    let stream = state.next_stream;
                    if stream > LAST_STREAM_ID {
                        let why = CallError::Unavailable("stream ids are used up".into());
                        state.end(why.clone());
                        return Err(why);
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
                    guard.stream = Some(stream);
                    frame::write_headers(out, stream, &block, false, state.max_frame);
                    queue_data(state, out, stream, body, &mut sent);
                    Ok(Some(stream))
                })
                .await??;
            if let Some(stream) = opened {
                break stream;
            }
        };
        // The rest of the body, as the windows open.
        while sent < body.len() {
            self.window_room(stream).await?;
            self.shared
                .send(|state, out| queue_data(state, out, stream, body, &mut sent))
                .await?;
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

impl Connection {
    /// Waits until the server's stream limit leaves room for one more.
    async fn stream_room(&self) -> Result<(), CallError> {
        poll_fn(|cx| {
            let mut state = self.shared.lock();
            if let Some(why) = &state.ended {
                return Poll::Ready(Err(CallError::Unavailable(why.clone())));
            }
            if state.streams.len() >= state.max_streams {
                state.waiting.push(cx.waker().clone());
                return Poll::Pending;
            }
            Poll::Ready(Ok(()))
        })
        .await
    }

    /// Waits until both windows let `stream` send, or its call fails.
    async fn window_room(&self, stream: u32) -> Result<(), CallError> {
        poll_fn(|cx| {
            let mut state = self.shared.lock();
            let state = &mut *state;
            let Some(slot) = state.streams.get(&stream) else {
                return Poll::Ready(Err(CallError::Unavailable("the stream is gone".into())));
            };
            if let Some(why) = &slot.failed {
                return Poll::Ready(Err(why.clone()));
            }
            if state.window > 0 && slot.window > 0 {
                return Poll::Ready(Ok(()));
            }
            state.waiting.push(cx.waker().clone());
            Poll::Pending
        })
        .await
    }
}

/// Queues as much of `body` after `*sent` as both windows allow, the last
/// frame ending the stream; an empty body is one empty DATA frame.
fn queue_data(state: &mut State, out: &mut Vec<u8>, stream: u32, body: &[u8], sent: &mut usize) {
    let Some(slot) = state.streams.get_mut(&stream) else {
        return;
    };
    let left = (body.len() - *sent) as i64;
    let n = left.min(state.window).min(slot.window).max(0) as usize;
    if n == 0 && left > 0 {
        return;
    }
    state.window -= n as i64;
    slot.window -= n as i64;
    let end = *sent + n == body.len();
    frame::write_data(out, stream, &body[*sent..*sent + n], end, state.max_frame);
    *sent += n;
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
            let _ = shared
                .send(|_, queue| queue.extend_from_slice(&goaway))
                .await;
            break CallError::Protocol(e.to_string());
        }
        if !out.is_empty()
            && shared
                .send(|_, queue| queue.extend_from_slice(&out))
                .await
                .is_err()
        {
            break CallError::Unavailable("writing to the server failed".into());
        }
        if buf.capacity() - buf.len() < frame::HEAD_LEN {
            buf.reserve(frame::DEFAULT_MAX_FRAME);
        }
        let read = tokio::select! {
            read = reader.read_buf(&mut buf) => read,
            () = shared.closed.notified() => {
                break CallError::Unavailable("the connection was closed".into());
            }
        };
        match read {
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
