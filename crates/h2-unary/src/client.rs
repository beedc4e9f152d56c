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

use crate::conn::{self, Block, Incoming, Outbox, Peer, Reader};
use crate::frame::{self, Frame, FrameError, Head, Reason, setting};
use crate::hpack::{self, HeaderList};

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

struct Shared {
    state: Mutex<State>,
    outbox: tokio::sync::Mutex<Outbox>,
    /// Notified when the last [`Connection`] is dropped.
    closed: tokio::sync::Notify,
}

struct State {
    next_stream: u32,
    streams: HashMap<u32, Slot>,
    peer: Peer,
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

    /// Ends the connection: every unanswered call fails with `why`.
    fn end(&mut self, why: CallError) {
        if self.ended.is_none() {
            self.ended = Some(why.to_string());
        }
        for slot in self.streams.values_mut() {
            slot.fail(why.clone());
        }
        self.wake_waiting();
    }
}

impl Slot {
    fn wake(&mut self) {
        if let Some(waker) = self.waker.take() {
            waker.wake();
        }
    }

    fn open(&self) -> bool {
        !self.done && self.failed.is_none()
    }

    fn fail(&mut self, why: CallError) {
        if self.open() {
            self.failed = Some(why);
        }
        self.wake();
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
    conn::write_opening(
        &mut out,
        &[
            (setting::ENABLE_PUSH, 0),
            (setting::INITIAL_WINDOW_SIZE, frame::MAX_WINDOW),
        ],
    );
    writer.write_all(&out).await?;
    writer.flush().await?;
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            next_stream: 1,
            streams: HashMap::new(),
            peer: Peer::default(),
            window: i64::from(frame::DEFAULT_WINDOW),
            ended: None,
            waiting: Vec::new(),
        }),
        outbox: tokio::sync::Mutex::new(Outbox::new(writer)),
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
        outbox.flush().await.map_err(|e| {
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
                .is_some_and(|slot| slot.open())
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
                            conn::write_reset(out, stream, Reason::CANCEL);
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
                    if state.streams.len() >= state.peer.max_streams {
                        return Ok(None);
                    }
                    let stream = state.next_stream;
                    if stream > LAST_STREAM_ID {
                        let why = CallError::Unavailable("stream ids are used up".into());
                        state.end(why.clone());
                        return Err(why);
                    }
                    state.next_stream += 2;
                    let window = state.peer.initial_window;
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
                    frame::write_headers(out, stream, &block, false, state.peer.max_frame);
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

    /// Waits until the server's stream limit leaves room for one more.
    async fn stream_room(&self) -> Result<(), CallError> {
        poll_fn(|cx| {
            let mut state = self.shared.lock();
            if let Some(why) = &state.ended {
                return Poll::Ready(Err(CallError::Unavailable(why.clone())));
            }
            if state.streams.len() >= state.peer.max_streams {
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
    let left = body.len() - *sent;
    let n = conn::take_window(&mut state.window, &mut slot.window, left);
    if n == 0 && left > 0 {
        return;
    }
    let end = *sent + n == body.len();
    frame::write_data(
        out,
        stream,
        &body[*sent..*sent + n],
        end,
        state.peer.max_frame,
    );
    *sent += n;
}

/// Reads frames until the connection ends, then fails every unanswered call.
async fn read_loop<T: AsyncRead>(shared: Arc<Shared>, mut reader: ReadHalf<T>) {
    let mut reading = Reader::new();
    let mut buf: Vec<u8> = Vec::with_capacity(frame::DEFAULT_MAX_FRAME + frame::HEAD_LEN);
    let why = loop {
        let mut out = Vec::new();
        let (used, parsed) = {
            let mut state = shared.lock();
            conn::each_frame(&buf, |head, payload| {
                on_frame(&mut reading, &mut state, head, payload, &mut out)
            })
        };
        buf.drain(..used);
        if let Err(e) = parsed {
            let _ = shared
                .send(|_, queue| conn::write_goaway(queue, 0, e.reason))
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

/// Applies one frame to the calls it concerns.
fn on_frame(
    reader: &mut Reader,
    state: &mut State,
    head: Head,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), FrameError> {
    let windows = state.streams.values_mut().map(|slot| &mut slot.window);
    let parsed = match reader.read(head, payload, &mut state.peer, windows, out)? {
        Incoming::Block {
            stream,
            end_stream,
            block,
        } => {
            on_block(state, stream, end_stream, block, out);
            return Ok(());
        }
        Incoming::Settled => {
            state.wake_waiting();
            return Ok(());
        }
        Incoming::Frame(parsed) => parsed,
    };
    match parsed {
        Frame::Headers { .. } | Frame::Continuation { .. } => {}
        Frame::Data {
            stream,
            data,
            end_stream,
        } => {
            if let Some(slot) = state.streams.get_mut(&stream)
                && slot.open()
            {
                if slot.answer.data.len() + data.len() > slot.max_response {
                    slot.fail(CallError::TooLarge(slot.max_response));
                    conn::write_reset(out, stream, Reason::CANCEL);
                } else {
                    slot.answer.data.extend_from_slice(&payload[data]);
                    slot.done = end_stream;
                    if end_stream {
                        slot.wake();
                    }
                }
            }
        }
        Frame::Reset { stream, reason } => {
            if let Some(slot) = state.streams.get_mut(&stream) {
                slot.fail(CallError::Reset(reason));
            }
        }
        Frame::Settings { .. } | Frame::Ping { .. } | Frame::Ignored => {}
        Frame::GoAway {
            last_stream,
            reason,
        } => {
            let why = format!("the server sent GOAWAY ({reason})");
            state.ended.get_or_insert(why.clone());
            for (&id, slot) in state.streams.iter_mut() {
                if id > last_stream {
                    slot.fail(CallError::Unavailable(why.clone()));
                }
            }
            state.wake_waiting();
        }
        Frame::WindowUpdate { stream, increment } => {
            if stream == 0 {
                conn::grow(&mut state.window, increment)?;
            } else if let Some(slot) = state.streams.get_mut(&stream) {
                conn::grow(&mut slot.window, increment)?;
            }
            state.wake_waiting();
        }
    }
    Ok(())
}

/// A complete header block: the answer's head, or its trailers.
fn on_block(state: &mut State, stream: u32, end_stream: bool, block: Block, out: &mut Vec<u8>) {
    let Some(slot) = state.streams.get_mut(&stream) else {
        return;
    };
    if !slot.open() {
        return;
    }
    match block {
        Block::TooLarge(limit) => {
            slot.fail(CallError::TooLarge(limit));
            conn::write_reset(out, stream, Reason::CANCEL);
            return;
        }
        Block::Fields(fields) if !slot.headed => {
            slot.headed = true;
            slot.answer.head = fields;
            slot.done = end_stream;
        }
        Block::Fields(fields) => {
            slot.answer.trailers = fields;
            if !end_stream {
                slot.fail(CallError::Protocol("trailers without END_STREAM".into()));
                return;
            }
            slot.done = true;
        }
    }
    if slot.done {
        slot.wake();
    }
}
