//! The unary client against the `h2` crate's server: answers of every
//! shape, concurrent calls, both directions' flow control, resets,
//! cancellation, GOAWAY and a server that goes away.

use std::time::Duration;

use bytes::Bytes;
use h2_unary::client::{self, CallError, Connection, Request, Response};
use h2_unary::frame::Reason;
use http::{HeaderMap, HeaderValue};
use tokio::net::UnixStream;
use tokio::sync::mpsc;

/// What the server saw of a request it was told to hold.
type Held = mpsc::UnboundedSender<h2::Reason>;

async fn answer(
    request: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    held: Held,
) {
    let path = request.uri().path().to_owned();
    let mut body = request.into_body();
    let mut got = Vec::new();
    if path == "/hold" {
        // Never answered: report how the client ended the stream.
        let reason = match body.data().await {
            Some(Err(e)) => e.reason(),
            _ => std::future::poll_fn(|cx| respond.poll_reset(cx)).await.ok(),
        };
        let _ = held.send(reason.unwrap_or(h2::Reason::NO_ERROR));
        return;
    }
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        got.extend_from_slice(&chunk);
    }
    let ok = || {
        http::Response::builder()
            .status(200)
            .header("content-type", "application/grpc")
    };
    match path.as_str() {
        "/refuse" => respond.send_reset(h2::Reason::REFUSED_STREAM),
        "/trailers-only" => {
            let head = ok().header("grpc-status", "5").body(()).unwrap();
            respond.send_response(head, true).unwrap();
        }
        _ => {
            let size: usize = path.strip_prefix("/big/").map_or(0, |n| n.parse().unwrap());
            let data = if size > 0 { vec![0x5a; size] } else { got };
            if path == "/slow" {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let head = ok()
                .header("x-received", data.len().to_string())
                .body(())
                .unwrap();
            let mut send = respond.send_response(head, false).unwrap();
            send.reserve_capacity(data.len());
            let mut data = Bytes::from(data);
            while !data.is_empty() {
                let room = std::future::poll_fn(|cx| send.poll_capacity(cx))
                    .await
                    .unwrap()
                    .unwrap();
                send.send_data(data.split_to(room.min(data.len())), false)
                    .unwrap();
            }
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", HeaderValue::from_static("0"));
            send.send_trailers(trailers).unwrap();
        }
    }
}

/// An h2 server on one end of a socket pair; the client on the other.
async fn pair(
    builder: h2::server::Builder,
) -> (
    Connection,
    mpsc::UnboundedReceiver<h2::Reason>,
    tokio::task::JoinHandle<()>,
) {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let (held, reports) = mpsc::unbounded_channel();
    let server = tokio::spawn(async move {
        let mut connection = builder.handshake::<_, Bytes>(theirs).await.unwrap();
        while let Some(accepted) = connection.accept().await {
            let Ok((request, respond)) = accepted else {
                return;
            };
            tokio::spawn(answer(request, respond, held.clone()));
        }
    });
    (client::handshake(ours).await.unwrap(), reports, server)
}

fn request<'a>(path: &'a str, body: &'a [u8]) -> Request<'a> {
    Request {
        path,
        authority: "localhost",
        headers: &[("content-type", b"application/grpc"), ("te", b"trailers")],
        body,
        max_response: 4 << 20,
    }
}

fn field<'a>(fields: &'a h2_unary::hpack::HeaderList, name: &str) -> Option<&'a [u8]> {
    fields.get(name.as_bytes())
}

fn check_echo(answer: &Response, body: &[u8]) {
    assert_eq!(field(&answer.head, ":status"), Some(&b"200"[..]));
    assert_eq!(
        field(&answer.head, "x-received"),
        Some(body.len().to_string().as_bytes())
    );
    assert_eq!(answer.data, body);
    assert_eq!(field(&answer.trailers, "grpc-status"), Some(&b"0"[..]));
}

#[tokio::test]
async fn calls_in_turn_and_at_once() {
    let (connection, _, _) = pair(h2::server::Builder::new()).await;
    for i in 0..100u32 {
        let body = i.to_be_bytes().repeat(i as usize);
        check_echo(
            &connection.call(&request("/echo", &body)).await.unwrap(),
            &body,
        );
    }
    let calls = (0..64u32).map(|i| {
        let connection = connection.clone();
        tokio::spawn(async move {
            let body = vec![i as u8; 100 * i as usize];
            let path = if i % 3 == 0 { "/slow" } else { "/echo" };
            let answer = connection.call(&request(path, &body)).await.unwrap();
            check_echo(&answer, &body);
        })
    });
    for call in calls.collect::<Vec<_>>() {
        call.await.unwrap();
    }
    assert!(connection.is_open());
}

#[tokio::test]
async fn bodies_larger_than_windows_and_frames() {
    // The server's stream and connection windows start at 65,535 bytes: a
    // 3 MiB request waits for its WINDOW_UPDATEs.
    let (connection, _, _) = pair(h2::server::Builder::new()).await;
    let body: Vec<u8> = (0..3 << 20).map(|i| (i % 251) as u8).collect();
    check_echo(
        &connection.call(&request("/echo", &body)).await.unwrap(),
        &body,
    );
    // Several at once share the connection window.
    let calls = (0..4).map(|_| {
        let connection = connection.clone();
        let body = body[..1 << 20].to_vec();
        tokio::spawn(async move {
            check_echo(
                &connection.call(&request("/echo", &body)).await.unwrap(),
                &body,
            );
        })
    });
    for call in calls.collect::<Vec<_>>() {
        call.await.unwrap();
    }
    // A 2 MiB answer arrives in many DATA frames.
    let answer = connection
        .call(&request("/big/2097152", b""))
        .await
        .unwrap();
    assert_eq!(answer.data.len(), 2 << 20);
    // Over the call's limit: refused, and the connection stays usable.
    let mut small = request("/big/70000", b"");
    small.max_response = 65_536;
    assert_eq!(
        connection.call(&small).await,
        Err(CallError::TooLarge(65_536))
    );
    check_echo(
        &connection.call(&request("/echo", b"after")).await.unwrap(),
        b"after",
    );
}

#[tokio::test]
async fn resets_and_trailers_only_answers() {
    let (connection, _, _) = pair(h2::server::Builder::new()).await;
    assert_eq!(
        connection.call(&request("/refuse", b"x")).await,
        Err(CallError::Reset(Reason::REFUSED_STREAM))
    );
    let answer = connection
        .call(&request("/trailers-only", b"x"))
        .await
        .unwrap();
    assert_eq!(field(&answer.head, "grpc-status"), Some(&b"5"[..]));
    assert!(answer.data.is_empty() && answer.trailers.is_empty());
    check_echo(
        &connection.call(&request("/echo", b"still")).await.unwrap(),
        b"still",
    );
}

#[tokio::test]
async fn a_dropped_call_resets_its_stream() {
    let (connection, mut reports, _) = pair(h2::server::Builder::new()).await;
    let hold = request("/hold", b"x");
    let call = connection.call(&hold);
    assert!(
        tokio::time::timeout(Duration::from_millis(50), call)
            .await
            .is_err()
    );
    let reason = tokio::time::timeout(Duration::from_secs(5), reports.recv())
        .await
        .unwrap();
    assert_eq!(reason, Some(h2::Reason::CANCEL));
    check_echo(
        &connection.call(&request("/echo", b"next")).await.unwrap(),
        b"next",
    );
}

#[tokio::test]
async fn the_servers_stream_limit_queues_calls() {
    let mut builder = h2::server::Builder::new();
    builder.max_concurrent_streams(2);
    let (connection, _, _) = pair(builder).await;
    // Let the server's SETTINGS arrive first.
    check_echo(&connection.call(&request("/echo", b"")).await.unwrap(), b"");
    let calls = (0..12u8).map(|i| {
        let connection = connection.clone();
        tokio::spawn(async move {
            let body = [i; 10];
            check_echo(
                &connection.call(&request("/slow", &body)).await.unwrap(),
                &body,
            );
        })
    });
    for call in calls.collect::<Vec<_>>() {
        call.await.unwrap();
    }
}

#[tokio::test]
async fn a_server_that_goes_away_fails_calls_as_unavailable() {
    let (connection, _, server) = pair(h2::server::Builder::new()).await;
    check_echo(
        &connection.call(&request("/echo", b"one")).await.unwrap(),
        b"one",
    );
    let pending = {
        let connection = connection.clone();
        tokio::spawn(async move { connection.call(&request("/hold", b"x")).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    server.abort();
    let _ = server.await;
    let failed = tokio::time::timeout(Duration::from_secs(5), pending)
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(failed, Err(CallError::Unavailable(_))),
        "{failed:?}"
    );
    assert!(!connection.is_open());
    assert!(matches!(
        connection.call(&request("/echo", b"two")).await,
        Err(CallError::Unavailable(_))
    ));
}

#[tokio::test]
async fn goaway_stops_new_calls() {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let server = tokio::spawn(async move {
        let mut connection = h2::server::handshake(theirs).await.unwrap();
        let (held, _reports) = mpsc::unbounded_channel();
        let (request, respond) = connection.accept().await.unwrap().unwrap();
        connection.graceful_shutdown();
        tokio::spawn(answer(request, respond, held));
        while let Some(Ok(_)) = connection.accept().await {}
    });
    let connection = client::handshake(ours).await.unwrap();
    // The stream the server took is still answered.
    check_echo(
        &connection.call(&request("/echo", b"taken")).await.unwrap(),
        b"taken",
    );
    server.await.unwrap();
    assert!(!connection.is_open());
    assert!(matches!(
        connection.call(&request("/echo", b"later")).await,
        Err(CallError::Unavailable(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stream_ids_reach_the_server_in_order_from_many_threads() {
    // A stream id lower than one already opened is a connection error
    // (RFC 7540 §5.1.1): h2 would end the connection and fail every call.
    let (connection, _, _) = pair(h2::server::Builder::new()).await;
    let calls = (0..400u32).map(|i| {
        let connection = connection.clone();
        tokio::spawn(async move {
            let body = i.to_be_bytes();
            check_echo(
                &connection.call(&request("/echo", &body)).await.unwrap(),
                &body,
            );
        })
    });
    for call in calls.collect::<Vec<_>>() {
        call.await.unwrap();
    }
    assert!(connection.is_open());
}

#[tokio::test]
async fn a_call_dropped_in_the_middle_of_a_write_cuts_no_frame() {
    // Large windows, so a 4 MiB request is written at once, and a server
    // that stops reading for a while when it accepts "/pause": the big
    // request's write blocks on the full socket and is dropped there.
    let (ours, theirs) = UnixStream::pair().unwrap();
    let (held, mut reports) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut builder = h2::server::Builder::new();
        builder
            .initial_window_size(8 << 20)
            .initial_connection_window_size(8 << 20);
        let mut connection = builder.handshake::<_, Bytes>(theirs).await.unwrap();
        while let Some(Ok((request, respond))) = connection.accept().await {
            let pause = request.uri().path() == "/pause";
            tokio::spawn(answer(request, respond, held.clone()));
            if pause {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    });
    let connection = client::handshake(ours).await.unwrap();
    check_echo(
        &connection.call(&request("/echo", b"warm")).await.unwrap(),
        b"warm",
    );
    let paused = {
        let connection = connection.clone();
        tokio::spawn(async move { connection.call(&request("/pause", b"p")).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let big = vec![7u8; 4 << 20];
    let hold = request("/hold", &big);
    assert!(
        tokio::time::timeout(Duration::from_millis(100), connection.call(&hold))
            .await
            .is_err()
    );
    // The rest of the dropped call's frames were written for it, then a
    // reset: the server reads whole frames and sees the stream cancelled.
    let reason = tokio::time::timeout(Duration::from_secs(5), reports.recv())
        .await
        .unwrap();
    assert_eq!(reason, Some(h2::Reason::CANCEL));
    check_echo(&paused.await.unwrap().unwrap(), b"p");
    check_echo(
        &connection.call(&request("/echo", b"after")).await.unwrap(),
        b"after",
    );
    assert!(connection.is_open());
}

#[tokio::test]
async fn dropping_the_last_handle_closes_the_connection() {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let server = tokio::spawn(async move {
        let mut connection = h2::server::handshake(theirs).await.unwrap();
        // Ends when the client closes its end.
        while let Some(Ok(_)) = connection.accept().await {}
    });
    let connection = client::handshake(ours).await.unwrap();
    let clone = connection.clone();
    drop(connection);
    assert!(clone.is_open());
    drop(clone);
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("the server sees the connection close")
        .unwrap();
}
