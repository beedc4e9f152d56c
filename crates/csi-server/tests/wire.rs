//! What the server writes on the wire for bodies that are not one
//! well-formed message, for unknown paths, for a good call and for a
//! stream, read with a bare HTTP/2 client (h2-unary's) so that no gRPC
//! library smooths anything over.

mod common;

use std::sync::Arc;

use common::*;
use csi_proto::v1::*;
use csi_server::{CallContext, CsiError, CsiResult, CsiStream, SnapshotMetadata};
use h2_unary::client::{self, Connection, Response};
use prost::Message;
use tokio::net::UnixStream;

async fn connect(s: &Running) -> Connection {
    let io = UnixStream::connect(&s.path).await.unwrap();
    client::handshake(io).await.unwrap()
}

async fn call(conn: &Connection, path: &str, body: &[u8]) -> Response {
    let request = client::Request {
        path,
        authority: "localhost",
        headers: &[("content-type", b"application/grpc"), ("te", b"trailers")],
        body,
        max_response: 1 << 20,
    };
    conn.call(&request).await.unwrap()
}

fn framed(message: &impl Message) -> Vec<u8> {
    let mut body = vec![0];
    body.extend((message.encoded_len() as u32).to_be_bytes());
    message.encode(&mut body).unwrap();
    body
}

fn text(value: Option<&[u8]>) -> String {
    String::from_utf8(value.unwrap_or_default().to_vec()).unwrap()
}

/// The code and the (percent-decoded, as the messages here have no `%`)
/// message of an answer, from its trailers or, trailers-only, its head.
fn status(answer: &Response) -> (String, String) {
    let fields = match answer.trailers.is_empty() {
        true => &answer.head,
        false => &answer.trailers,
    };
    let message = text(fields.get(b"grpc-message")).replace("%20", " ");
    (text(fields.get(b"grpc-status")), message)
}

#[tokio::test]
async fn a_body_that_is_not_one_message_gets_a_status_saying_so() {
    let (_dir, driver, s) = start_test_driver().await;
    let conn = connect(&s).await;
    let probe = "/csi.v1.Identity/Probe";
    let cases: [(&[u8], &str, &str); 5] = [
        (b"", "13", "the request has no message"),
        (&[0, 0, 0], "13", "the request has no message"),
        (
            &[1, 0, 0, 0, 0],
            "12",
            "the request message is compressed; this server takes none",
        ),
        (
            &[0, 0, 0, 0, 3, 0],
            "13",
            "the request body is not one message of the length its prefix gives",
        ),
        (
            // Field 1 as a varint: ProbeRequest has no such field, but a
            // truncated varint is no message at all.
            &[0, 0, 0, 0, 2, 0x08, 0xff],
            "13",
            "the request is not a valid csi.v1.ProbeRequest message",
        ),
    ];
    for (body, code, message) in cases {
        let answer = call(&conn, probe, body).await;
        assert_eq!(text(answer.head.get(b":status")), "200", "{body:?}");
        assert!(answer.data.is_empty(), "{body:?}");
        let (got_code, got_message) = status(&answer);
        assert_eq!(got_code, code, "{body:?}");
        assert!(
            got_message.starts_with(message),
            "{body:?}: {got_message:?}"
        );
    }
    assert_eq!(
        driver.executions.load(std::sync::atomic::Ordering::SeqCst),
        0
    );
    s.stop().await.unwrap();
}

#[tokio::test]
async fn unknown_paths_are_unimplemented_and_named() {
    let (_dir, _driver, s) = start_test_driver().await;
    let conn = connect(&s).await;
    let body = framed(&ProbeRequest {});
    let answer = call(&conn, "/grpc.health.v1.Health/Check", &body).await;
    assert_eq!(
        status(&answer),
        (
            "12".to_owned(),
            "grpc.health.v1.Health/Check is not a CSI method".to_owned()
        )
    );
    s.stop().await.unwrap();
}

#[tokio::test]
async fn a_good_call_is_one_message_then_status_ok() {
    let (_dir, _driver, s) = start_test_driver().await;
    let conn = connect(&s).await;
    let answer = call(&conn, "/csi.v1.Identity/Probe", &framed(&ProbeRequest {})).await;
    assert_eq!(text(answer.head.get(b":status")), "200");
    assert_eq!(text(answer.head.get(b"content-type")), "application/grpc");
    let want = ProbeResponse { ready: Some(true) };
    assert_eq!(answer.data, framed(&want));
    assert_eq!(text(answer.trailers.get(b"grpc-status")), "0");
    assert_eq!(answer.trailers.get(b"grpc-message"), None);
    s.stop().await.unwrap();
}

/// Two items, then an error.
struct TwoThenGone;

#[csi_server::async_trait]
impl SnapshotMetadata for TwoThenGone {
    async fn get_metadata_allocated(
        &self,
        _: &CallContext,
        req: GetMetadataAllocatedRequest,
    ) -> CsiResult<CsiStream<GetMetadataAllocatedResponse>> {
        let item = |offset| {
            Ok(GetMetadataAllocatedResponse {
                volume_capacity_bytes: 1 << 30,
                block_metadata: vec![BlockMetadata {
                    byte_offset: offset,
                    size_bytes: 4096,
                }],
                ..Default::default()
            })
        };
        let gone = Err(CsiError::NotFound(format!(
            "snapshot {} went away",
            req.snapshot_id
        )));
        Ok(Box::pin(futures::stream::iter([item(0), item(4096), gone])))
    }
}

#[tokio::test]
async fn a_stream_is_its_messages_then_the_status_that_ended_it() {
    let (_dir, _driver, s) =
        start_test_driver_with(|b| b.snapshot_metadata(Arc::new(TwoThenGone))).await;
    let conn = connect(&s).await;
    let request = GetMetadataAllocatedRequest {
        snapshot_id: "snap-1".into(),
        ..Default::default()
    };
    let answer = call(
        &conn,
        "/csi.v1.SnapshotMetadata/GetMetadataAllocated",
        &framed(&request),
    )
    .await;
    let mut messages = Vec::new();
    let mut rest = answer.data.as_slice();
    while let Some((prefix, after)) = rest.split_first_chunk::<5>() {
        assert_eq!(prefix[0], 0);
        let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
        messages.push(GetMetadataAllocatedResponse::decode(&after[..len]).unwrap());
        rest = &after[len..];
    }
    assert!(rest.is_empty());
    let offsets: Vec<i64> = messages
        .iter()
        .map(|m| m.block_metadata[0].byte_offset)
        .collect();
    assert_eq!(offsets, [0, 4096]);
    assert_eq!(
        status(&answer),
        ("5".to_owned(), "snapshot snap-1 went away".to_owned())
    );
    s.stop().await.unwrap();
}
