//! HPACK against the `h2` crate: what h2's encoder writes (Huffman strings,
//! its dynamic table, evictions, never-indexed fields) decodes to the
//! fields it was given, and what this crate encodes h2's server reads back.

use h2_unary::frame::flag::{ACK, END_HEADERS, END_STREAM};
use h2_unary::frame::kind::{CONTINUATION, HEADERS, SETTINGS};
use h2_unary::frame::{HEAD_LEN, Head, PREFACE, write_frame};
use h2_unary::hpack::{self, Decoder, HeaderList};
use http::{HeaderName, HeaderValue, Request};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    write_frame(&mut out, kind, flags, stream, payload);
    out
}

async fn read_frame(io: &mut DuplexStream) -> (u8, u8, u32, Vec<u8>) {
    let mut head = [0u8; HEAD_LEN];
    io.read_exact(&mut head).await.unwrap();
    let head = Head::parse(&head);
    let mut payload = vec![0; head.len];
    io.read_exact(&mut payload).await.unwrap();
    (head.kind, head.flags, head.stream, payload)
}

/// A small deterministic generator, so a failure can be replayed.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A value h2 accepts: visible ASCII, space, tab and obs-text.
    fn value(&mut self) -> Vec<u8> {
        let len = self.below(300) as usize;
        self.bytes(len)
    }

    /// A short, mostly alphanumeric value, as most headers are.
    fn short(&mut self) -> Vec<u8> {
        let len = 4 + self.below(40) as usize;
        (0..len).map(|_| b'a' + self.below(26) as u8).collect()
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len)
            .map(|_| match self.below(10) {
                0 => 0x80 + self.below(128) as u8,
                1 => b'\t',
                _ => 0x20 + self.below(95) as u8,
            })
            .collect()
    }
}

const NAMES: [&str; 8] = [
    "x-csi-a",
    "content-type",
    "grpc-timeout",
    "user-agent",
    "x-long-name-to-make-entries-larger",
    "authorization",
    "x-csi-te",
    "x-csi-b",
];

/// Fields for one request: some repeated from a small pool (h2 indexes
/// them, so later requests refer to the dynamic table), some fresh and
/// large (they evict), some sensitive (never indexed).
fn fields(rng: &mut Lcg, pool: &[Vec<u8>]) -> Vec<(&'static str, Vec<u8>, bool)> {
    let count = 1 + rng.below(8) as usize;
    (0..count)
        .map(|_| {
            let name = NAMES[rng.below(NAMES.len() as u64) as usize];
            let value = if rng.below(4) != 0 {
                pool[rng.below(pool.len() as u64) as usize].clone()
            } else {
                rng.value()
            };
            (name, value, rng.below(5) == 0)
        })
        .collect()
}

fn sorted(mut v: Vec<(Vec<u8>, Vec<u8>)>) -> Vec<(Vec<u8>, Vec<u8>)> {
    v.sort();
    v
}

#[tokio::test]
async fn what_h2_encodes_decodes_to_its_fields() {
    let (client_io, mut server_io) = tokio::io::duplex(1 << 20);
    let (mut client, connection) = h2::client::handshake(client_io).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut preface = [0u8; 24];
    server_io.read_exact(&mut preface).await.unwrap();
    assert_eq!(&preface, PREFACE);
    server_io
        .write_all(&frame(SETTINGS, 0, 0, &[]))
        .await
        .unwrap();

    let mut rng = Lcg(7);
    let pool: Vec<Vec<u8>> = (0..12).map(|_| rng.short()).collect();
    let mut decoder = Decoder::new(hpack::DEFAULT_TABLE_SIZE, 1 << 20);
    const REQUESTS: usize = 300;
    let mut sent = Vec::new();
    for i in 0..REQUESTS {
        let mut request = Request::post(format!("http://localhost/csi.v1.Node/Call{i}"));
        let mut expected = Vec::new();
        for (name, value, sensitive) in fields(&mut rng, &pool) {
            let mut v = HeaderValue::from_bytes(&value).unwrap();
            v.set_sensitive(sensitive);
            request = request.header(HeaderName::from_static(name), v);
            expected.push((name.as_bytes().to_vec(), value));
        }
        let mut ready = client.clone().ready().await.unwrap();
        // The stream stays open: nobody answers it.
        let _ = ready.send_request(request.body(()).unwrap(), true).unwrap();
        sent.push(expected);
        client = ready;
    }

    let mut got = Vec::new();
    let mut block = Vec::new();
    let mut huffman_strings = 0;
    while got.len() < REQUESTS {
        let (kind, flags, stream, payload) = read_frame(&mut server_io).await;
        match kind {
            SETTINGS if flags & ACK == 0 => server_io
                .write_all(&frame(SETTINGS, ACK, 0, &[]))
                .await
                .unwrap(),
            HEADERS | CONTINUATION => {
                assert_ne!(stream, 0);
                block.extend_from_slice(&payload);
                if flags & END_HEADERS != 0 {
                    // A literal with a new name whose value string is Huffman-coded.
                    huffman_strings += block
                        .windows(2)
                        .filter(|w| w[0] == 0x00 && w[1] & 0x80 != 0)
                        .count();
                    let mut fields = HeaderList::new();
                    decoder.decode(&block, &mut fields).unwrap();
                    block.clear();
                    got.push(fields);
                }
            }
            _ => {}
        }
    }
    // h2 used what is tested: Huffman strings (and its dynamic table: the
    // fields repeated from the pool are sent as indexes after their first time).
    assert!(huffman_strings > 0);
    for (i, (fields, expected)) in got.into_iter().zip(sent).enumerate() {
        let path = fields.get(b":path").unwrap();
        assert_eq!(path, format!("/csi.v1.Node/Call{i}").as_bytes());
        let regular: Vec<_> = fields
            .iter()
            .filter(|(name, _, _)| !name.starts_with(b":"))
            .map(|(name, value, _)| (name.to_vec(), value.to_vec()))
            .collect();
        assert_eq!(sorted(regular), sorted(expected), "request {i}");
    }
}

#[tokio::test]
async fn h2_reads_what_this_crate_encodes() {
    let (client_io, server_io) = tokio::io::duplex(1 << 20);
    let (mut reader, mut writer) = tokio::io::split(client_io);
    let server = tokio::spawn(async move {
        let mut connection = h2::server::handshake(server_io).await.unwrap();
        let mut requests = Vec::new();
        while let Some(accepted) = connection.accept().await {
            let (request, _respond) = accepted.unwrap();
            requests.push(request);
            if requests.len() == 50 {
                break;
            }
        }
        requests
    });
    // Drain what the server sends (its SETTINGS, acks) so it never blocks.
    tokio::spawn(async move {
        let mut sink = vec![0u8; 1 << 16];
        while matches!(reader.read(&mut sink).await, Ok(n) if n > 0) {}
    });

    let mut rng = Lcg(11);
    let pool: Vec<Vec<u8>> = (0..6).map(|_| rng.value()).collect();
    let mut out = PREFACE.to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));
    let mut sent = Vec::new();
    for i in 0..50u32 {
        let mut block = Vec::new();
        hpack::encode_indexed(hpack::METHOD_POST, &mut block);
        hpack::encode_indexed(hpack::SCHEME_HTTP, &mut block);
        let path = format!("/csi.v1.Controller/Call{i}");
        hpack::encode_literal(b":path", path.as_bytes(), false, &mut block);
        hpack::encode_literal(b":authority", b"localhost", false, &mut block);
        let mut expected = Vec::new();
        for (name, value, sensitive) in fields(&mut rng, &pool) {
            hpack::encode_literal(name.as_bytes(), &value, sensitive, &mut block);
            expected.push((name.as_bytes().to_vec(), value));
        }
        out.extend(frame(HEADERS, END_HEADERS | END_STREAM, 2 * i + 1, &block));
        sent.push((path, expected));
    }
    writer.write_all(&out).await.unwrap();

    let requests = tokio::time::timeout(std::time::Duration::from_secs(30), server)
        .await
        .expect("h2's server accepts every request")
        .unwrap();
    assert_eq!(requests.len(), sent.len());
    for (request, (path, expected)) in requests.iter().zip(sent) {
        assert_eq!(request.method(), http::Method::POST);
        assert_eq!(request.uri().path(), path);
        let got: Vec<_> = request
            .headers()
            .iter()
            .map(|(n, v)| (n.as_str().as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect();
        assert_eq!(sorted(got), sorted(expected), "{path}");
    }
}
