//! The adapter against real h2: random client streams (dynamic table,
//! Huffman, padding, priority, CONTINUATION, size updates) cut at random
//! read boundaries must reach an h2 server as the same requests, with only
//! the rejected authorities replaced.

use std::collections::VecDeque;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::hpack::huffman_encode;
use super::hpack::{self, STATIC_TABLE, encode_integer};
use super::*;
use h2_unary::frame::write_frame as frame;

/// xorshift64*: deterministic per seed, no dependency.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

/// A client-side HPACK encoder that picks representations at random, to
/// produce what any real encoder might. Its dynamic table is kept apart from
/// the decoder's on purpose: the tests check the two agree.
#[derive(Default)]
struct TestEncoder {
    table: VecDeque<(Vec<u8>, Vec<u8>)>,
    size: usize,
    max: usize,
}

impl TestEncoder {
    fn new() -> Self {
        Self {
            max: hpack::DEFAULT_TABLE_SIZE,
            ..Self::default()
        }
    }

    fn find(&self, name: &[u8], value: Option<&[u8]>) -> Option<usize> {
        let hit = |n: &[u8], v: &[u8]| n == name && value.is_none_or(|value| v == value);
        STATIC_TABLE
            .iter()
            .position(|(n, v)| hit(n, v))
            .map(|i| i + 1)
            .or_else(|| {
                self.table
                    .iter()
                    .position(|(n, v)| hit(n, v))
                    .map(|i| i + 62)
            })
    }

    fn evict_to(&mut self, size: usize) {
        while self.size > size {
            let (n, v) = self.table.pop_back().expect("size accounts for entries");
            self.size -= n.len() + v.len() + 32;
        }
    }

    fn insert(&mut self, name: &[u8], value: &[u8]) {
        let size = name.len() + value.len() + 32;
        if size > self.max {
            self.evict_to(0);
            return;
        }
        self.evict_to(self.max - size);
        self.table.push_front((name.to_vec(), value.to_vec()));
        self.size += size;
    }

    fn string(rng: &mut Rng, s: &[u8], out: &mut Vec<u8>) {
        if rng.chance(50) {
            let mut h = Vec::new();
            huffman_encode(s, &mut h);
            encode_integer(h.len(), 7, 0x80, out);
            out.extend_from_slice(&h);
        } else {
            encode_integer(s.len(), 7, 0, out);
            out.extend_from_slice(s);
        }
    }

    /// Encodes `fields`; returns which went out as "never indexed".
    fn encode(
        &mut self,
        rng: &mut Rng,
        fields: &[(Vec<u8>, Vec<u8>)],
        out: &mut Vec<u8>,
    ) -> Vec<bool> {
        if rng.chance(15) {
            let size = rng.below(hpack::DEFAULT_TABLE_SIZE + 1);
            self.max = size;
            self.evict_to(size);
            hpack::encode_size_update(size, out);
        }
        let mut never = Vec::new();
        for (name, value) in fields {
            if rng.chance(60)
                && let Some(i) = self.find(name, Some(value))
            {
                encode_integer(i, 7, 0x80, out);
                never.push(false);
                continue;
            }
            let (flags, prefix) = match rng.below(3) {
                0 => (0x40, 6),
                1 => (0x00, 4),
                _ => (0x10, 4),
            };
            match self.find(name, None).filter(|_| rng.chance(70)) {
                Some(i) => encode_integer(i, prefix, flags, out),
                None => {
                    encode_integer(0, prefix, flags, out);
                    Self::string(rng, name, out);
                }
            }
            Self::string(rng, value, out);
            if flags == 0x40 {
                self.insert(name, value);
            }
            never.push(flags == 0x10);
        }
        never
    }
}

/// One request as the server must see it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    path: String,
    authority: Option<String>,
    end_stream: bool,
    headers: Vec<(String, Vec<u8>)>,
}

/// A header block as h2's decoder must rebuild it: (name, value, never
/// indexed). h2 does not report "never indexed", so that is checked by
/// decoding the output with a fresh decoder.
type Block = Vec<(Vec<u8>, Vec<u8>, bool)>;

const AUTHORITIES: [&[u8]; 7] = [
    b"localhost",
    b"/var/lib/kubelet/plugins/csi.example.com/csi.sock",
    b"%2Fvar%2Flib%2Fx.sock",
    b"csi.sock",
    b"",
    b"[::1]:80",
    b"unix:/tmp/a b.sock",
];

fn random_value(rng: &mut Rng, max: usize) -> Vec<u8> {
    let len = rng.below(max + 1);
    (0..len)
        .map(|_| {
            // Printable ASCII and obs-text: what HTTP header values may hold.
            let b = rng.below(0x5f + 0x80) as u8;
            if b < 0x5f { b + 0x20 } else { b - 0x5f + 0x80 }
        })
        .collect()
}

/// A random client connection: its bytes, the requests the server must see
/// and whether any authority needs the rewrite.
fn random_connection(rng: &mut Rng, requests: usize) -> (Vec<u8>, Vec<Seen>, Vec<Block>, bool) {
    let mut out = Vec::new();
    out.extend_from_slice(PREFACE);
    frame(&mut out, 0x4, 0, 0, &[0, 0x4, 0, 0, 0xff, 0xff]);
    let mut enc = TestEncoder::new();
    let mut expected = Vec::new();
    let mut blocks = Vec::new();
    let mut rewrite = false;
    let names: [&[u8]; 6] = [
        b"user-agent",
        b"grpc-timeout",
        b"x-csi-trace",
        b"authorization",
        b"grpc-accept-encoding",
        b"cookie",
    ];
    for i in 0..requests {
        let stream = 1 + 2 * i as u32;
        let authority = (rng.chance(85)).then(|| AUTHORITIES[rng.below(AUTHORITIES.len())]);
        let path = format!("/csi.v1.Identity/Probe{}", rng.below(3));
        let mut fields: Vec<(Vec<u8>, Vec<u8>)> = vec![
            (b":method".to_vec(), b"POST".to_vec()),
            (b":scheme".to_vec(), b"http".to_vec()),
            (b":path".to_vec(), path.clone().into_bytes()),
        ];
        if let Some(a) = authority {
            fields.push((b":authority".to_vec(), a.to_vec()));
            rewrite |= !authority_ok(a);
        }
        fields.push((b"content-type".to_vec(), b"application/grpc".to_vec()));
        fields.push((b"te".to_vec(), b"trailers".to_vec()));
        for _ in 0..rng.below(6) {
            let name = names[rng.below(names.len())].to_vec();
            let value = if rng.chance(50) {
                b"repeated-value".to_vec()
            } else {
                let max = if rng.chance(5) { 20_000 } else { 40 };
                random_value(rng, max)
            };
            fields.push((name, value));
        }
        let mut block = Vec::new();
        let never = enc.encode(rng, &fields, &mut block);
        let body = rng.chance(50).then(|| random_value(rng, 100));
        expected.push(Seen {
            path,
            authority: authority.map(|a| {
                String::from_utf8_lossy(if authority_ok(a) { a } else { REPLACEMENT }).into_owned()
            }),
            end_stream: body.is_none(),
            headers: fields
                .iter()
                .filter(|(n, _)| !n.starts_with(b":"))
                .map(|(n, v)| (String::from_utf8(n.clone()).unwrap(), v.clone()))
                .collect(),
        });
        blocks.push(
            fields
                .iter()
                .zip(&never)
                .map(|((n, v), never)| {
                    let v = if n == b":authority" && !authority_ok(v) {
                        REPLACEMENT.to_vec()
                    } else {
                        v.clone()
                    };
                    (n.clone(), v, *never)
                })
                .collect(),
        );

        // HEADERS (maybe padded, maybe with priority) + CONTINUATIONs.
        let pieces = 1 + rng.below(4);
        let mut cuts: Vec<usize> = (1..pieces).map(|_| rng.below(block.len() + 1)).collect();
        // No frame over h2's SETTINGS_MAX_FRAME_SIZE.
        cuts.extend((1..=block.len() / 16_000).map(|k| k * 16_000));
        cuts.sort_unstable();
        cuts.insert(0, 0);
        cuts.push(block.len());
        for (k, w) in cuts.windows(2).enumerate() {
            let piece = &block[w[0]..w[1]];
            let last = k + 2 == cuts.len();
            let mut flags = if last { END_HEADERS } else { 0 };
            let mut payload = Vec::new();
            if k == 0 {
                if body.is_none() {
                    flags |= END_STREAM;
                }
                let pad = rng.chance(30).then(|| rng.below(40));
                if let Some(pad) = pad {
                    flags |= PADDED;
                    payload.push(pad as u8);
                }
                if rng.chance(30) {
                    flags |= PRIORITY;
                    let exclusive = if rng.chance(50) { 0x80 } else { 0 };
                    payload.extend_from_slice(&[exclusive, 0, 0, 0, rng.below(256) as u8]);
                }
                payload.extend_from_slice(piece);
                payload.extend(std::iter::repeat_n(0, pad.unwrap_or(0)));
                frame(&mut out, HEADERS, flags, stream, &payload);
            } else {
                frame(&mut out, CONTINUATION, flags, stream, piece);
            }
        }
        if let Some(body) = body {
            let mut grpc = vec![0];
            grpc.extend_from_slice(&(body.len() as u32).to_be_bytes());
            grpc.extend_from_slice(&body);
            let cut = rng.below(grpc.len() + 1);
            frame(&mut out, 0x0, 0, stream, &grpc[..cut]);
            frame(&mut out, 0x0, END_STREAM, stream, &grpc[cut..]);
        }
        if rng.chance(20) {
            frame(&mut out, 0x6, 0, 0, &rng.next().to_be_bytes());
        }
        if rng.chance(20) {
            frame(&mut out, 0x8, 0, 0, &1000u32.to_be_bytes());
        }
    }
    (out, expected, blocks, rewrite)
}

/// Runs `input` through a rewriter in random pieces.
fn rewrite_in_pieces(rng: &mut Rng, input: &[u8], max_piece: usize) -> (Vec<u8>, Rewriter) {
    let mut r = Rewriter::new();
    let mut out = Vec::new();
    let mut rest = input;
    while !rest.is_empty() {
        let n = (1 + rng.below(max_piece)).min(rest.len());
        r.feed(&rest[..n], &mut out).expect("well-formed input");
        rest = &rest[n..];
    }
    r.finish(&mut out);
    (out, r)
}

/// Frames of a byte stream after the preface (type, flags, stream, payload).
fn frames(mut bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
    assert!(bytes.starts_with(PREFACE));
    bytes = &bytes[PREFACE.len()..];
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let head: [u8; 9] = bytes[..9].try_into().unwrap();
        let f = Head::parse(&head);
        out.push((f.kind, f.flags, f.stream, bytes[9..9 + f.len].to_vec()));
        bytes = &bytes[9 + f.len..];
    }
    out
}

/// Every header block of a byte stream, decoded in order.
fn decode_blocks(bytes: &[u8]) -> Vec<Block> {
    let mut decoder = Decoder::default();
    let mut list = HeaderList::new();
    let mut joined = Vec::new();
    let mut blocks = Vec::new();
    for (kind, flags, _, payload) in frames(bytes) {
        let mut p = &payload[..];
        if kind == HEADERS {
            let pad = if flags & PADDED != 0 {
                let n = p[0] as usize;
                p = &p[1..];
                n
            } else {
                0
            };
            if flags & PRIORITY != 0 {
                p = &p[5..];
            }
            p = &p[..p.len() - pad];
        } else if kind != CONTINUATION {
            continue;
        }
        joined.extend_from_slice(p);
        if flags & END_HEADERS != 0 {
            decoder.decode(&joined, &mut list).unwrap();
            joined.clear();
            blocks.push(
                list.iter()
                    .map(|(n, v, never)| (n.to_vec(), v.to_vec(), never))
                    .collect(),
            );
        }
    }
    blocks
}

/// Feeds `bytes` to a real h2 server and returns the first `n` requests.
async fn h2_server_sees(bytes: Vec<u8>, n: usize) -> Vec<Seen> {
    let (mut client, server) = tokio::io::duplex(4 << 20);
    client.write_all(&bytes).await.unwrap();
    let mut conn = h2::server::handshake(server).await.expect("h2 handshake");
    let mut seen = Vec::new();
    while seen.len() < n {
        let (req, mut respond) = conn
            .accept()
            .await
            .expect("h2 keeps the connection open")
            .unwrap_or_else(|e| panic!("h2 refused request {}: {e}", seen.len()));
        let headers = req
            .headers()
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
            .collect();
        seen.push(Seen {
            path: req.uri().path().to_owned(),
            authority: req.uri().authority().map(|a| a.as_str().to_owned()),
            end_stream: req.body().is_end_stream(),
            headers,
        });
        respond
            .send_response(http::Response::new(()), true)
            .unwrap();
    }
    drop(client);
    seen
}

/// h2's HeaderMap groups a name's values: compare per name, in order.
fn normalized(mut seen: Vec<Seen>) -> Vec<Seen> {
    for s in &mut seen {
        s.headers.sort_by(|a, b| a.0.cmp(&b.0));
    }
    seen
}

#[tokio::test]
async fn random_streams_reach_h2_with_only_rejected_authorities_replaced() {
    let mut rewrote = 0;
    for seed in 0..150u64 {
        let mut rng = Rng::new(seed);
        let requests = 1 + rng.below(12);
        let (input, expected, blocks, needs_rewrite) = random_connection(&mut rng, requests);
        let mut one_shot = Vec::new();
        let mut r = Rewriter::new();
        r.feed(&input, &mut one_shot).unwrap();
        assert!(!r.is_passthrough(), "seed {seed}: stepped aside");
        r.finish(&mut one_shot);
        assert_eq!(r.is_rewriting(), needs_rewrite, "seed {seed}");

        // Any cut into reads gives the same bytes.
        let max_piece = [1, 7, 64, 4096][seed as usize % 4];
        let (pieces, _) = rewrite_in_pieces(&mut rng, &input, max_piece);
        assert_eq!(
            pieces, one_shot,
            "seed {seed}: output depends on read sizes"
        );

        if needs_rewrite {
            rewrote += 1;
            // Frames other than header blocks are untouched and in order;
            // no frame exceeds 16 KiB.
            let keep = |f: &&(u8, u8, u32, Vec<u8>)| f.0 != HEADERS && f.0 != CONTINUATION;
            let (fin, fout) = (frames(&input), frames(&one_shot));
            assert!(
                fin.iter().filter(keep).eq(fout.iter().filter(keep)),
                "seed {seed}"
            );
            assert!(fout.iter().all(|f| f.3.len() <= DEFAULT_MAX_FRAME));
        } else {
            assert_eq!(
                one_shot, input,
                "seed {seed}: a block changed that needed no change"
            );
        }
        assert_eq!(decode_blocks(&one_shot), blocks, "seed {seed}");
        let seen = h2_server_sees(one_shot, expected.len()).await;
        assert_eq!(normalized(seen), normalized(expected), "seed {seed}");
    }
    assert!(
        rewrote > 50,
        "only {rewrote} connections exercised the rewrite"
    );
}

#[tokio::test]
async fn a_real_h2_client_goes_through_unchanged() {
    // h2's own encoder (Huffman, dynamic table, CONTINUATION for a 20 KiB
    // value), through the rewriter at random read sizes, into h2's server.
    let (client_io, pump_client) = tokio::io::duplex(1 << 16);
    let (pump_server, server_io) = tokio::io::duplex(1 << 16);
    let (mut from_client, mut to_client) = tokio::io::split(pump_client);
    let (mut from_server, mut to_server) = tokio::io::split(pump_server);
    let back = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
    });
    let pump = tokio::spawn(async move {
        let mut rng = Rng::new(7);
        let mut r = Rewriter::new();
        let (mut input, mut output) = (Vec::new(), Vec::new());
        let mut buf = [0u8; 300];
        loop {
            let want = 1 + rng.below(buf.len());
            let n = from_client.read(&mut buf[..want]).await.unwrap();
            if n == 0 {
                break;
            }
            input.extend_from_slice(&buf[..n]);
            let mut out = Vec::new();
            r.feed(&buf[..n], &mut out).unwrap();
            to_server.write_all(&out).await.unwrap();
            output.extend_from_slice(&out);
        }
        to_server.shutdown().await.unwrap();
        (r, input, output)
    });
    let server = tokio::spawn(async move {
        let mut conn = h2::server::handshake(server_io).await.unwrap();
        let mut seen = Vec::new();
        while let Some(Ok((req, mut respond))) = conn.accept().await {
            seen.push(req.headers().clone());
            respond
                .send_response(http::Response::new(()), true)
                .unwrap();
        }
        seen
    });
    let (mut h2c, conn) = h2::client::handshake(client_io).await.unwrap();
    let driver = tokio::spawn(conn);
    let mut sent = Vec::new();
    for i in 0..40 {
        let mut value = http::HeaderValue::from_str(&format!("secret-{}", i % 3)).unwrap();
        value.set_sensitive(true);
        let mut req = http::Request::builder()
            .method("POST")
            .uri(format!("http://localhost/csi.v1.Node/Call{}", i % 4))
            .header("content-type", "application/grpc")
            .header("user-agent", "grpc-go/1.70")
            .header("x-big", "v".repeat(if i == 5 { 20_000 } else { i }))
            .body(())
            .unwrap();
        req.headers_mut().insert("authorization", value);
        sent.push(req.headers().clone());
        h2c = h2c.ready().await.unwrap();
        let (response, _) = h2c.send_request(req, true).unwrap();
        assert_eq!(response.await.unwrap().status(), 200);
    }
    drop(h2c);
    driver.await.unwrap().unwrap();
    let (r, input, output) = pump.await.unwrap();
    let seen = server.await.unwrap();
    back.await.unwrap();
    assert!(!r.is_passthrough(), "the rewriter followed every block");
    assert!(!r.is_rewriting());
    assert_eq!(output, input);
    assert_eq!(seen.len(), sent.len());
    for (s, e) in seen.iter().zip(&sent) {
        for (name, value) in e {
            assert_eq!(s.get(name), Some(value), "{name}");
        }
    }
}

#[test]
fn not_http2_and_malformed_blocks_reach_h2_unchanged() {
    let mut out = Vec::new();
    let mut r = Rewriter::new();
    r.feed(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", &mut out)
        .unwrap();
    assert!(r.is_passthrough());
    assert_eq!(out, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");

    // A block that does not decode (index 70 of an empty table).
    let mut input = PREFACE.to_vec();
    frame(
        &mut input,
        HEADERS,
        END_HEADERS | END_STREAM,
        1,
        &[0x80 | 70],
    );
    frame(&mut input, 0x6, 0, 0, &[0; 8]);
    let mut r = Rewriter::new();
    let mut out = Vec::new();
    r.feed(&input, &mut out).unwrap();
    assert!(r.is_passthrough());
    assert_eq!(out, input);

    // A DATA frame inside a header block, and a CONTINUATION out of place.
    for bad in [0x0u8, CONTINUATION] {
        let mut input = PREFACE.to_vec();
        if bad == 0x0 {
            frame(&mut input, HEADERS, 0, 1, &[0x82]);
        }
        frame(&mut input, bad, 0, if bad == 0x0 { 1 } else { 3 }, &[0x84]);
        let mut r = Rewriter::new();
        let mut out = Vec::new();
        r.feed(&input, &mut out).unwrap();
        assert!(r.is_passthrough());
        assert_eq!(out, input);
    }
}

fn request_block(authority: &[u8]) -> Vec<u8> {
    let mut block = Vec::new();
    for (n, v) in [
        (&b":method"[..], &b"POST"[..]),
        (b":scheme", b"http"),
        (b":path", b"/csi.v1.Identity/Probe"),
        (b":authority", authority),
    ] {
        hpack::encode_literal(n, v, false, &mut block);
    }
    block
}

#[test]
fn after_rewriting_malformed_input_closes_the_connection() {
    let mut input = PREFACE.to_vec();
    frame(
        &mut input,
        HEADERS,
        END_HEADERS | END_STREAM,
        1,
        &request_block(b"/x.sock"),
    );
    frame(
        &mut input,
        HEADERS,
        END_HEADERS | END_STREAM,
        3,
        &[0x80 | 70],
    );
    let mut r = Rewriter::new();
    let err = r.feed(&input, &mut Vec::new()).unwrap_err();
    assert!(matches!(err, RewriteError::Hpack(HpackError::BadIndex(70))));
    assert_eq!(io::Error::from(err).kind(), io::ErrorKind::InvalidData);
}

#[test]
fn truncated_input_is_handed_over_at_eof() {
    let mut input = PREFACE.to_vec();
    frame(
        &mut input,
        HEADERS,
        END_HEADERS,
        1,
        &request_block(b"/x.sock"),
    );
    let cut = &input[..input.len() - 3];
    let mut r = Rewriter::new();
    let mut out = Vec::new();
    r.feed(cut, &mut out).unwrap();
    assert_eq!(out, PREFACE, "the incomplete frame is held");
    r.finish(&mut out);
    assert_eq!(out, cut);
    // A partial preface too.
    let mut r = Rewriter::new();
    let mut out = Vec::new();
    r.feed(b"PRI * HT", &mut out).unwrap();
    r.finish(&mut out);
    assert_eq!(out, b"PRI * HT");
}

#[test]
fn rewritten_blocks_keep_priority_and_end_stream_and_split_at_16k() {
    let mut block = request_block(b"%2Fvar%2Flib%2Fx.sock");
    hpack::encode_literal(b"x-big", &[b'v'; 40_000], false, &mut block);
    let mut payload = vec![3]; // pad length
    payload.extend_from_slice(&[0x80, 0, 0, 0, 42]);
    payload.extend_from_slice(&block);
    payload.extend_from_slice(&[0; 3]);
    let mut input = PREFACE.to_vec();
    frame(
        &mut input,
        HEADERS,
        PADDED | PRIORITY | END_STREAM,
        1,
        &payload[..10_000],
    );
    frame(&mut input, CONTINUATION, END_HEADERS, 1, &payload[10_000..]);
    let mut r = Rewriter::new();
    let mut out = Vec::new();
    r.feed(&input, &mut out).unwrap();
    let f = frames(&out);
    assert_eq!(f.len(), 3, "40 KiB block in 16 KiB frames");
    assert_eq!(f[0].0, HEADERS);
    assert_eq!(f[0].1, PRIORITY | END_STREAM);
    assert_eq!(&f[0].3[..5], &[0x80, 0, 0, 0, 42]);
    assert_eq!(
        f[0].3[5], 0x20,
        "size update to 0 opens the first rewritten block"
    );
    assert!(f[1..].iter().all(|f| f.0 == CONTINUATION));
    assert_eq!(f[2].1, END_HEADERS);
    assert_eq!(f[1].1, 0);
    let mut joined = f[0].3[5..].to_vec();
    joined.extend(f[1..].iter().flat_map(|f| f.3.clone()));
    let mut list = HeaderList::new();
    Decoder::default().decode(&joined, &mut list).unwrap();
    assert_eq!(list.get(b":authority"), Some(REPLACEMENT));
    assert_eq!(list.get(b"x-big").map(<[u8]>::len), Some(40_000));
}
