//! The unary server against the `h2` crate's client (and against this
//! crate's client): answers of every shape, concurrency, both directions'
//! flow control, the body limit, resets, the stream limit and shutdown.

use std::time::Duration;

use bytes::Bytes;
use h2_unary::server::{self, Limits, Request, Response};
use http::HeaderMap;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};

fn field(name: &str, value: &[u8]) -> (Vec<u8>, Vec<u8>) {
    (name.as_bytes().to_vec(), value.to_vec())
}

/// Echoes the body, says how large it was; "/big/N" answers N bytes,
/// "/slow" waits first, "/hold" never answers (and reports when its task
/// is dropped).
async fn handler(request: Request, dropped: mpsc::UnboundedSender<()>) -> Response {
    let path = String::from_utf8(request.head.get(b":path").unwrap().to_vec()).unwrap();
    match path.as_str() {
        "/hold" => {
            struct Report(mpsc::UnboundedSender<()>);
            impl Drop for Report {
                fn drop(&mut self) {
                    let _ = self.0.send(());
                }
            }
            let _report = Report(dropped);
            std::future::pending::<()>().await;
            unreachable!()
        }
        "/slow" => tokio::time::sleep(Duration::from_millis(50)).await,
        _ => {}
    }
    let body = match path.strip_prefix("/big/") {
        Some(n) => vec![0x42; n.parse().unwrap()],
        None => request.body,
    };
    Response {
        head: vec![
            field(":status", b"200"),
            field("content-type", b"application/grpc"),
            field("x-received", body.len().to_string().as_bytes()),
        ],
        body,
        trailers: vec![field("grpc-status", b"0")],
    }
}

struct Served {
    client: h2::client::SendRequest<Bytes>,
    dropped: mpsc::UnboundedReceiver<()>,
    stop: Option<oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

async fn serve(limits: Limits) -> Served {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let (dropped_tx, dropped) = mpsc::unbounded_channel();
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(server::serve(
        ours,
        limits,
        move |request| handler(request, dropped_tx.clone()),
        async move {
            let _ = stopped.await;
        },
    ));
    let (client, connection) = h2::client::handshake(theirs).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Served {
        client,
        dropped,
        stop: Some(stop),
        server,
    }
}

/// One call through h2's client: status, x-received, body, grpc-status.
async fn call(
    client: &h2::client::SendRequest<Bytes>,
    path: &str,
    body: Vec<u8>,
) -> Result<(u16, HeaderMap, Vec<u8>, Option<HeaderMap>), h2::Error> {
    let mut client = client.clone().ready().await?;
    let request = http::Request::post(format!("http://localhost{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (answer, mut send) = client.send_request(request, false)?;
    let mut body = Bytes::from(body);
    if body.is_empty() {
        send.send_data(Bytes::new(), true)?;
    }
    while !body.is_empty() {
        send.reserve_capacity(body.len());
        let room = std::future::poll_fn(|cx| send.poll_capacity(cx))
            .await
            .unwrap()?;
        let chunk = body.split_to(room.min(body.len()));
        send.send_data(chunk, body.is_empty())?;
    }
    let (head, mut stream) = answer.await?.into_parts();
    let mut data = Vec::new();
    while let Some(chunk) = stream.data().await {
        let chunk = chunk?;
        let _ = stream.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = stream.trailers().await?;
    Ok((head.status.as_u16(), head.headers, data, trailers))
}

async fn echo(client: &h2::client::SendRequest<Bytes>, path: &str, body: Vec<u8>) {
    let (status, head, data, trailers) = call(client, path, body.clone()).await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(head["x-received"], body.len().to_string().as_str());
    assert_eq!(data, body);
    assert_eq!(trailers.unwrap()["grpc-status"], "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_in_turn_and_at_once() {
    let served = serve(Limits::default()).await;
    for i in 0..50u32 {
        echo(&served.client, "/echo", i.to_be_bytes().repeat(i as usize)).await;
    }
    let calls = (0..200u32).map(|i| {
        let client = served.client.clone();
        tokio::spawn(async move {
            let path = if i % 4 == 0 { "/slow" } else { "/echo" };
            echo(&client, path, vec![i as u8; 50 * (i as usize % 20)]).await;
        })
    });
    for call in calls.collect::<Vec<_>>() {
        call.await.unwrap();
    }
}

#[tokio::test]
async fn large_requests_and_answers_follow_the_windows() {
    let served = serve(Limits::default()).await;
    // h2's client starts with 65,535-byte windows: a 2 MiB answer waits
    // for its WINDOW_UPDATEs; a 3 MiB request needs none from this end.
    let (status, _, data, _) = call(&served.client, "/big/2097152", Vec::new())
        .await
        .unwrap();
    assert_eq!((status, data.len()), (200, 2 << 20));
    echo(&served.client, "/echo", vec![9u8; 3 << 20]).await;
}

#[tokio::test]
async fn a_request_over_the_limit_is_resource_exhausted() {
    let limits = Limits {
        request_body: 1000,
        ..Limits::default()
    };
    let served = serve(limits).await;
    let (status, head, data, trailers) = call(&served.client, "/echo", vec![1u8; 5000])
        .await
        .unwrap();
    assert_eq!((status, data.len()), (200, 0));
    assert_eq!(head["grpc-status"], "8");
    assert!(trailers.is_none());
    echo(&served.client, "/echo", vec![2u8; 1000]).await;
}

#[tokio::test]
async fn a_reset_stream_drops_its_handler() {
    let mut served = serve(Limits::default()).await;
    let client = served.client.clone();
    let held = tokio::spawn(async move { call(&client, "/hold", b"x".to_vec()).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Dropping the call's future resets the stream (CANCEL).
    held.abort();
    tokio::time::timeout(Duration::from_secs(5), served.dropped.recv())
        .await
        .expect("the handler's task is dropped");
    echo(&served.client, "/echo", b"after".to_vec()).await;
}

#[tokio::test]
async fn the_stream_limit_is_announced_and_kept() {
    let limits = Limits {
        concurrent_streams: 2,
        ..Limits::default()
    };
    let served = serve(limits).await;
    echo(&served.client, "/echo", Vec::new()).await;
    let calls = (0..12u8).map(|i| {
        let client = served.client.clone();
        tokio::spawn(async move { echo(&client, "/slow", vec![i; 8]).await })
    });
    for call in calls.collect::<Vec<_>>() {
        call.await.unwrap();
    }
}

#[tokio::test]
async fn shutdown_answers_what_it_took_and_returns() {
    let mut served = serve(Limits::default()).await;
    let client = served.client.clone();
    let slow = tokio::spawn(async move { call(&client, "/slow", b"taken".to_vec()).await });
    tokio::time::sleep(Duration::from_millis(10)).await;
    served.stop.take().unwrap().send(()).unwrap();
    let (status, _, data, _) = slow.await.unwrap().unwrap();
    assert_eq!((status, data.as_slice()), (200, &b"taken"[..]));
    tokio::time::timeout(Duration::from_secs(5), served.server)
        .await
        .expect("the server returns once the streams it took are answered")
        .unwrap()
        .unwrap();
    // After GOAWAY h2's client opens no new stream.
    assert!(call(&served.client, "/echo", Vec::new()).await.is_err());
}

/// This crate's server (the echoing handler) on `ours`, its client on `theirs`.
async fn both_ours<T>(ours: T, theirs: UnixStream) -> h2_unary::client::Connection
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    // Reports of dropped handlers are not read here: no path holds.
    let (dropped, _) = mpsc::unbounded_channel();
    tokio::spawn(server::serve(
        ours,
        Limits::default(),
        move |request| handler(request, dropped.clone()),
        std::future::pending(),
    ));
    h2_unary::client::handshake(theirs).await.unwrap()
}

/// `body` echoed through this crate's client.
async fn echo_ours(
    connection: &h2_unary::client::Connection,
    body: &[u8],
) -> h2_unary::client::Response {
    connection
        .call(&h2_unary::client::Request {
            path: "/echo",
            authority: "localhost",
            headers: &[("content-type", b"application/grpc")],
            body,
            max_response: 4 << 20,
        })
        .await
        .unwrap()
}

#[tokio::test]
async fn this_crates_client_and_server_together() {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let connection = both_ours(ours, theirs).await;
    for size in [0usize, 1, 70_000, 1 << 20] {
        let body = vec![3u8; size];
        let answer = echo_ours(&connection, &body).await;
        assert_eq!(answer.head.get(b":status"), Some(&b"200"[..]));
        assert_eq!(answer.data, body);
        assert_eq!(answer.trailers.get(b"grpc-status"), Some(&b"0"[..]));
    }
}

#[tokio::test]
async fn a_connection_without_the_preface_is_refused() {
    let (ours, mut theirs) = UnixStream::pair().unwrap();
    let server = tokio::spawn(server::serve(
        ours,
        Limits::default(),
        |_| async { Response::default() },
        std::future::pending(),
    ));
    use tokio::io::AsyncWriteExt;
    theirs
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let result = tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(result.unwrap_err().kind(), std::io::ErrorKind::InvalidData);
}

#[tokio::test]
async fn a_client_that_sends_nothing_does_not_hold_up_shutdown() {
    let (ours, _silent) = UnixStream::pair().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(server::serve(
        ours,
        Limits::default(),
        |_| async { Response::default() },
        async move {
            let _ = stopped.await;
        },
    ));
    tokio::time::sleep(Duration::from_millis(20)).await;
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("serve returns at shutdown")
        .unwrap()
        .unwrap();
}

/// Records what each write of the server carried.
struct Recorded {
    io: UnixStream,
    writes: std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
}

impl tokio::io::AsyncRead for Recorded {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Recorded {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.io).poll_write(cx, buf);
        if let std::task::Poll::Ready(Ok(n)) = polled {
            self.writes.lock().unwrap().push(buf[..n].to_vec());
        }
        polled
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The (type, stream) of each frame in `bytes`.
fn frames(mut bytes: &[u8]) -> Vec<(u8, u32)> {
    let mut found = Vec::new();
    while bytes.len() >= 9 {
        let len = u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]) as usize;
        let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & 0x7fff_ffff;
        found.push((bytes[3], stream));
        bytes = &bytes[(9 + len).min(bytes.len())..];
    }
    found
}

/// A client wakes once for an answer written whole: HEADERS, DATA and the
/// trailers leave in one write when the windows take the body.
#[tokio::test]
async fn a_small_answer_is_one_write_trailers_included() {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let writes = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let recorded = Recorded {
        io: ours,
        writes: writes.clone(),
    };
    let connection = both_ours(recorded, theirs).await;
    for body in [vec![], vec![7u8; 100]] {
        writes.lock().unwrap().clear();
        let answer = echo_ours(&connection, &body).await;
        assert_eq!(answer.data, body);
        let writes = writes.lock().unwrap();
        let answer_writes: Vec<Vec<(u8, u32)>> = writes
            .iter()
            .map(|w| {
                frames(w)
                    .into_iter()
                    .filter(|f| f.1 != 0)
                    .collect::<Vec<_>>()
            })
            .filter(|f| !f.is_empty())
            .collect();
        let (headers, data) = (1, 0);
        let stream = answer_writes[0][0].1;
        let want = match body.is_empty() {
            true => vec![(headers, stream), (headers, stream)],
            false => vec![(headers, stream), (data, stream), (headers, stream)],
        };
        assert_eq!(answer_writes, [want], "{body:?}");
    }
}
