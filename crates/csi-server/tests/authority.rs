//! A csi-server answers requests whose `:authority` is the socket path, as
//! gRPC C-core (Python, C++) and grpc-java clients send it, instead of h2
//! resetting the stream with PROTOCOL_ERROR. Driven with raw HTTP/2 frames,
//! since tonic's client cannot send such an authority.

mod common;

use std::time::Duration;

use common::start_test_driver;
use csi_proto::v1::{GetPluginInfoResponse, ProbeResponse};
use csi_server::authority::hpack::{self, Decoder, HeaderList};
use csi_server::authority::unary_with_authority;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

#[tokio::test]
async fn socket_path_authorities_get_real_answers() {
    let (_dir, _driver, s) = start_test_driver().await;
    for authority in [
        "/var/lib/x.sock",
        "%2Fvar%2Flib%2Fx.sock",
        "var%2Flib%2Fx.sock",
        "",
        "localhost",
    ] {
        let shown = authority;
        let conn = UnixStream::connect(&s.path).await.unwrap();
        let call = unary_with_authority(conn, authority, "/csi.v1.Identity/Probe", &[]);
        let reply = tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .expect("answered in time")
            .unwrap_or_else(|e| panic!("{shown}: {e}"));
        assert_eq!(reply.reset, None, "{shown}: stream reset");
        assert_eq!(reply.http_status, Some(200), "{shown}");
        assert_eq!(reply.grpc_status, Some(0), "{shown}: {reply:?}");
        let probe = ProbeResponse::decode(&reply.message.expect("a message")[..]).unwrap();
        assert_eq!(probe.ready, Some(true));

        let conn = UnixStream::connect(&s.path).await.unwrap();
        let reply = unary_with_authority(conn, authority, "/csi.v1.Identity/GetPluginInfo", &[])
            .await
            .unwrap();
        let info = GetPluginInfoResponse::decode(&reply.message.unwrap()[..]).unwrap();
        assert_eq!(info.name, "test.csi.example.com", "{shown}");
    }
    s.stop().await.unwrap();
}

/// HTTP/2 frame header + payload.
fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// The way C-core encodes requests: the first adds `:authority` (a socket
/// path) to the dynamic table, the next ones refer to that entry by index.
#[tokio::test]
async fn an_indexed_socket_path_authority_is_served_on_every_stream() {
    let (_dir, _driver, s) = start_test_driver().await;
    let mut conn = UnixStream::connect(&s.path).await.unwrap();

    let mut out = PREFACE.to_vec();
    frame(&mut out, 0x4, 0, 0, &[]);
    let streams = [1u32, 3, 5];
    for (i, stream) in streams.into_iter().enumerate() {
        let mut block = vec![0x83, 0x86]; // :method POST, :scheme http
        hpack::encode_literal(b":path", b"/csi.v1.Identity/Probe", false, &mut block);
        if i == 0 {
            // Literal with incremental indexing, name :authority (index 1).
            hpack::encode_integer(1, 6, 0x40, &mut block);
            hpack::encode_integer(15, 7, 0, &mut block);
            block.extend_from_slice(b"/var/lib/x.sock");
        } else {
            // Indexed: the first dynamic table entry.
            block.push(0x80 | 62);
        }
        hpack::encode_literal(b"content-type", b"application/grpc", false, &mut block);
        hpack::encode_literal(b"te", b"trailers", false, &mut block);
        frame(&mut out, 0x1, 0x4, stream, &block); // END_HEADERS
        frame(&mut out, 0x0, 0x1, stream, &[0, 0, 0, 0, 0]); // empty message, END_STREAM
    }
    conn.write_all(&out).await.unwrap();

    // Read until every stream ended; collect grpc-status and messages.
    let mut decoder = Decoder::default();
    let mut list = HeaderList::new();
    let mut status = std::collections::HashMap::new();
    let mut messages = std::collections::HashMap::new();
    let read = async {
        while status.len() < streams.len() {
            let mut head = [0u8; 9];
            conn.read_exact(&mut head)
                .await
                .expect("server keeps the connection");
            let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            let (kind, flags) = (head[3], head[4]);
            let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]);
            let mut payload = vec![0; len];
            conn.read_exact(&mut payload).await.unwrap();
            match kind {
                0x0 => {
                    messages.insert(stream, payload);
                }
                0x1 => {
                    assert_ne!(flags & 0x4, 0, "small blocks fit one frame");
                    decoder.decode(&payload, &mut list).unwrap();
                    if let Some(code) = list.get(b"grpc-status") {
                        status.insert(stream, String::from_utf8_lossy(code).into_owned());
                    }
                }
                0x3 => panic!("stream {stream} reset with code {:?}", &payload[..]),
                0x7 => panic!("GOAWAY {:?}", &payload[..]),
                _ => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("all streams answered in time");
    for stream in streams {
        assert_eq!(status[&stream], "0", "stream {stream}");
        let probe = ProbeResponse::decode(&messages[&stream][5..]).unwrap();
        assert_eq!(probe.ready, Some(true), "stream {stream}");
    }
    drop(conn);
    s.stop().await.unwrap();
}
