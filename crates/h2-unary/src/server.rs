//! A server connection for unary calls: each stream's request is gathered
//! whole (headers and body), handed to the handler on a task of its own,
//! and its answer written as HEADERS, DATA and trailers, in one write when
//! the client's windows allow.
//!
//! This end announces the largest windows, so a client never waits to send
//! a request; the client's windows, frame size and settings are honoured
//! for answers. A request over the body limit is answered
//! RESOURCE_EXHAUSTED without reaching the handler; streams beyond the
//! concurrency limit are refused (REFUSED_STREAM, which clients retry). A
//! stream the client resets drops its handler's task. On shutdown the
//! server sends GOAWAY naming the last stream it took, answers those, and
//! returns.

use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::io;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadHalf};
use tokio::task::AbortHandle;

use crate::conn::{self, Block, Incoming, Outbox, Peer, Reader};
use crate::frame::{self, Frame, FrameError, Head, Reason, setting};
use crate::hpack::{self, HeaderList};

/// What the server takes from each connection.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Streams one client may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS).
    pub concurrent_streams: u32,
    /// The largest request body accepted, gRPC's 5-byte prefix included.
    pub request_body: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            concurrent_streams: 1024,
            request_body: (4 << 20) + 5,
        }
    }
}

/// A request, whole.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    /// Its header block, pseudo-headers (`:method`, `:path`, ...) first.
    pub head: HeaderList,
    /// Its body.
    pub body: Vec<u8>,
}

/// An answer: header fields as (lower-case name, value) pairs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Response {
    /// The header block; `:status` first.
    pub head: Vec<(Vec<u8>, Vec<u8>)>,
    /// The body.
    pub body: Vec<u8>,
    /// The trailers. With no body and no trailers the answer is the head
    /// alone, ending the stream (gRPC's trailers-only answer).
    pub trailers: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Response {
    /// A gRPC trailers-only answer: HTTP 200 with `grpc-status` and
    /// `grpc-message` (which the caller percent-encodes).
    pub fn grpc_status(code: u32, message: &str) -> Self {
        Self {
            head: vec![
                (b":status".to_vec(), b"200".to_vec()),
                (b"content-type".to_vec(), b"application/grpc".to_vec()),
                (b"grpc-status".to_vec(), code.to_string().into_bytes()),
                (b"grpc-message".to_vec(), message.as_bytes().to_vec()),
            ],
            ..Self::default()
        }
    }
}

/// gRPC's RESOURCE_EXHAUSTED.
const RESOURCE_EXHAUSTED: u32 = 8;

struct Shared {
    state: Mutex<State>,
    outbox: tokio::sync::Mutex<Outbox>,
}

struct State {
    streams: HashMap<u32, Stream>,
    peer: Peer,
    /// The connection's send window.
    window: i64,
    /// The highest stream id the client opened.
    last_stream: u32,
    /// GOAWAY was sent: no new streams.
    closing: bool,
    /// The connection ended: answers are no longer written.
    ended: bool,
    /// Answers waiting for window, and the shutdown waiting for streams.
    waiting: Vec<Waker>,
}

struct Stream {
    /// The request's header block, until the request is whole and handed
    /// to the handler.
    head: Option<HeaderList>,
    body: Vec<u8>,
    window: i64,
    task: Option<AbortHandle>,
}

impl State {
    fn wake_waiting(&mut self) {
        for waker in self.waiting.drain(..) {
            waker.wake();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues what `queue` appends (under the state lock), then writes the
    /// queue out.
    async fn send<R>(&self, queue: impl FnOnce(&mut State, &mut Vec<u8>) -> R) -> io::Result<R> {
        let mut outbox = self.outbox.lock().await;
        let queued = queue(&mut self.lock(), &mut outbox.queued);
        if let Err(e) = outbox.flush().await {
            let mut state = self.lock();
            state.ended = true;
            state.wake_waiting();
            return Err(e);
        }
        Ok(queued)
    }

    /// Writes `response` on `stream`, as the client's windows allow: in
    /// one write when they take the whole body, so that the client reads
    /// the answer, trailers included, in one wake-up.
    async fn respond(&self, stream: u32, response: Response) -> io::Result<()> {
        let mut block = Vec::with_capacity(128);
        for (name, value) in &response.head {
            encode_field(name, value, &mut block);
        }
        let alone = response.body.is_empty() && response.trailers.is_empty();
        let mut trailers = Vec::with_capacity(64);
        for (name, value) in &response.trailers {
            encode_field(name, value, &mut trailers);
        }
        let body = &response.body;
        let mut sent = 0;
        // Queues what the windows take of the body and, once it is all
        // queued, the trailers; says whether the answer is complete.
        let mut rest = |state: &mut State, out: &mut Vec<u8>| {
            queue_body(state, out, stream, body, &mut sent);
            let complete = sent == body.len();
            if complete {
                frame::write_headers(out, stream, &trailers, true, state.peer.max_frame);
            }
            complete
        };
        let mut complete = self
            .send(|state, out| {
                frame::write_headers(out, stream, &block, alone, state.peer.max_frame);
                alone || rest(state, out)
            })
            .await?;
        while !complete {
            let room = poll_fn(|cx| {
                let mut state = self.lock();
                let state = &mut *state;
                let Some(s) = state.streams.get(&stream) else {
                    return Poll::Ready(false);
                };
                if state.ended {
                    return Poll::Ready(false);
                }
                if state.window > 0 && s.window > 0 {
                    return Poll::Ready(true);
                }
                state.waiting.push(cx.waker().clone());
                Poll::Pending
            })
            .await;
            if !room {
                return Ok(());
            }
            complete = self.send(&mut rest).await?;
        }
        Ok(())
    }
}

fn encode_field(name: &[u8], value: &[u8], block: &mut Vec<u8>) {
    if (name, value) == (&b":status"[..], &b"200"[..]) {
        hpack::encode_indexed(hpack::STATUS_200, block);
    } else {
        hpack::encode_literal(name, value, false, block);
    }
}

/// Queues as much of `body` after `*sent` as both windows allow.
fn queue_body(state: &mut State, out: &mut Vec<u8>, stream: u32, body: &[u8], sent: &mut usize) {
    let Some(s) = state.streams.get_mut(&stream) else {
        return;
    };
    let n = conn::take_window(&mut state.window, &mut s.window, body.len() - *sent);
    if n > 0 {
        frame::write_data(
            out,
            stream,
            &body[*sent..*sent + n],
            false,
            state.peer.max_frame,
        );
        *sent += n;
    }
}

/// Serves unary calls on `io` until the client closes it, a protocol error
/// ends it, or `shutdown` completes (then the streams already taken are
/// answered first). `handler` answers each request on a task of its own.
pub async fn serve<T, H, F>(
    io: T,
    limits: Limits,
    handler: H,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()>
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    H: Fn(Request) -> F + Send + Sync + 'static,
    F: Future<Output = Response> + Send + 'static,
{
    let (mut reader, writer) = tokio::io::split(io);
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            streams: HashMap::new(),
            peer: Peer::default(),
            window: i64::from(frame::DEFAULT_WINDOW),
            last_stream: 0,
            closing: false,
            ended: false,
            waiting: Vec::new(),
        }),
        outbox: tokio::sync::Mutex::new(Outbox::new(writer)),
    });
    let handler = Arc::new(handler);
    let mut shutdown = pin!(shutdown);
    let mut preface = [0u8; 24];
    // A client that connects and sends nothing must not hold up shutdown.
    tokio::select! {
        read = reader.read_exact(&mut preface) => {
            read?;
        }
        () = &mut shutdown => return Ok(()),
    }
    if &preface != frame::PREFACE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not an HTTP/2 connection preface",
        ));
    }
    shared
        .send(|_, out| {
            conn::write_opening(
                out,
                &[
                    (setting::MAX_CONCURRENT_STREAMS, limits.concurrent_streams),
                    (setting::INITIAL_WINDOW_SIZE, frame::MAX_WINDOW),
                ],
            );
        })
        .await?;
    let result = read_loop(&shared, &mut reader, limits, &handler, &mut shutdown).await;
    let mut state = shared.lock();
    state.ended = true;
    for stream in state.streams.values_mut() {
        if let Some(task) = stream.task.take() {
            task.abort();
        }
    }
    state.wake_waiting();
    result
}

async fn read_loop<T, H, F>(
    shared: &Arc<Shared>,
    reader: &mut ReadHalf<T>,
    limits: Limits,
    handler: &Arc<H>,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()>
where
    T: AsyncRead,
    H: Fn(Request) -> F + Send + Sync + 'static,
    F: Future<Output = Response> + Send + 'static,
{
    let mut shutdown = pin!(shutdown);
    let mut shutting_down = false;
    let mut reading = Reading {
        reader: Reader::new(),
        limits,
        ready: Vec::new(),
    };
    let mut buf: Vec<u8> = Vec::with_capacity(frame::DEFAULT_MAX_FRAME + frame::HEAD_LEN);
    loop {
        let mut out = Vec::new();
        let (used, parsed) = {
            let mut state = shared.lock();
            conn::each_frame(&buf, |head, payload| {
                reading.on_frame(&mut state, head, payload, &mut out)
            })
        };
        buf.drain(..used);
        if let Err(e) = parsed {
            let last = shared.lock().last_stream;
            let _ = shared
                .send(|_, queue| conn::write_goaway(queue, last, e.reason))
                .await;
            return Err(io::Error::new(io::ErrorKind::InvalidData, e));
        }
        for (stream, request) in reading.ready.drain(..) {
            let task = tokio::spawn({
                let (shared, handler) = (shared.clone(), handler.clone());
                async move {
                    let response = handler(request).await;
                    let _ = shared.respond(stream, response).await;
                    let mut state = shared.lock();
                    state.streams.remove(&stream);
                    state.wake_waiting();
                }
            });
            if let Some(s) = shared.lock().streams.get_mut(&stream) {
                s.task = Some(task.abort_handle());
            }
        }
        if !out.is_empty() {
            shared
                .send(|_, queue| queue.extend_from_slice(&out))
                .await?;
        }
        if shutting_down && shared.lock().streams.is_empty() {
            return Ok(());
        }
        if buf.capacity() - buf.len() < frame::HEAD_LEN {
            buf.reserve(frame::DEFAULT_MAX_FRAME);
        }
        let idle = poll_fn(|cx| {
            let mut state = shared.lock();
            if shutting_down && state.streams.is_empty() {
                return Poll::Ready(());
            }
            state.waiting.push(cx.waker().clone());
            Poll::Pending
        });
        tokio::select! {
            read = reader.read_buf(&mut buf) => {
                if read? == 0 {
                    return Ok(());
                }
            }
            () = &mut shutdown, if !shutting_down => {
                shutting_down = true;
                shared
                    .send(|state, queue| {
                        state.closing = true;
                        conn::write_goaway(queue, state.last_stream, Reason::NO_ERROR);
                    })
                    .await?;
            }
            () = idle, if shutting_down => return Ok(()),
        }
    }
}

/// The reading side's own state.
struct Reading {
    reader: Reader,
    limits: Limits,
    /// Requests made whole by the frames just read.
    ready: Vec<(u32, Request)>,
}

impl Reading {
    fn on_frame(
        &mut self,
        state: &mut State,
        head: Head,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), FrameError> {
        let windows = state.streams.values_mut().map(|s| &mut s.window);
        let parsed = match self
            .reader
            .read(head, payload, &mut state.peer, windows, out)?
        {
            Incoming::Block {
                stream,
                end_stream,
                block,
            } => return self.on_block(state, stream, end_stream, block, out),
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
                let Some(s) = state.streams.get_mut(&stream) else {
                    if stream > state.last_stream {
                        return Err(FrameError {
                            reason: Reason::PROTOCOL_ERROR,
                            what: "DATA on a stream never opened",
                        });
                    }
                    return Ok(());
                };
                if s.head.is_none() {
                    return Ok(());
                }
                if s.body.len() + data.len() > self.limits.request_body {
                    self.refuse_large(state, stream, out);
                    return Ok(());
                }
                s.body.extend_from_slice(&payload[data]);
                if end_stream {
                    self.dispatch(state, stream);
                }
            }
            Frame::Reset { stream, .. } => {
                if let Some(mut s) = state.streams.remove(&stream)
                    && let Some(task) = s.task.take()
                {
                    task.abort();
                }
                state.wake_waiting();
            }
            // A client's GOAWAY: it opens no more streams; those open are
            // still answered.
            Frame::Settings { .. } | Frame::Ping { .. } | Frame::GoAway { .. } | Frame::Ignored => {
            }
            Frame::WindowUpdate { stream, increment } => {
                if stream == 0 {
                    conn::grow(&mut state.window, increment)?;
                } else if let Some(s) = state.streams.get_mut(&stream) {
                    conn::grow(&mut s.window, increment)?;
                }
                state.wake_waiting();
            }
        }
        Ok(())
    }

    fn on_block(
        &mut self,
        state: &mut State,
        stream: u32,
        end_stream: bool,
        block: Block,
        out: &mut Vec<u8>,
    ) -> Result<(), FrameError> {
        if let Some(s) = state.streams.get_mut(&stream) {
            // Trailers of a request: they end it.
            if s.head.is_some() && end_stream {
                self.dispatch(state, stream);
            }
            return Ok(());
        }
        if stream.is_multiple_of(2) || stream <= state.last_stream {
            return Err(FrameError {
                reason: Reason::PROTOCOL_ERROR,
                what: "HEADERS opening a stream with a bad id",
            });
        }
        state.last_stream = stream;
        let refused =
            state.closing || state.streams.len() >= self.limits.concurrent_streams as usize;
        let head = match block {
            _ if refused => {
                conn::write_reset(out, stream, Reason::REFUSED_STREAM);
                return Ok(());
            }
            Block::TooLarge(_) => {
                conn::write_reset(out, stream, Reason::REFUSED_STREAM);
                return Ok(());
            }
            Block::Fields(head) => head,
        };
        state.streams.insert(
            stream,
            Stream {
                head: Some(head),
                body: Vec::new(),
                window: state.peer.initial_window,
                task: None,
            },
        );
        if end_stream {
            self.dispatch(state, stream);
        }
        Ok(())
    }

    fn dispatch(&mut self, state: &mut State, stream: u32) {
        let Some(s) = state.streams.get_mut(&stream) else {
            return;
        };
        let Some(head) = s.head.take() else {
            return;
        };
        let request = Request {
            head,
            body: std::mem::take(&mut s.body),
        };
        self.ready.push((stream, request));
    }

    /// Answers a request over the body limit without reaching the handler,
    /// and tells the client to stop sending it (RFC 7540 §8.1).
    fn refuse_large(&mut self, state: &mut State, stream: u32, out: &mut Vec<u8>) {
        state.streams.remove(&stream);
        let message = format!(
            "the request is larger than {} bytes",
            self.limits.request_body
        );
        let mut block = Vec::new();
        for (name, value) in &Response::grpc_status(RESOURCE_EXHAUSTED, &message).head {
            encode_field(name, value, &mut block);
        }
        frame::write_headers(out, stream, &block, true, state.peer.max_frame);
        conn::write_reset(out, stream, Reason::NO_ERROR);
        state.wake_waiting();
    }
}
