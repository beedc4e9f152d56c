//! RFC 7541's examples (Appendix C) and the edge cases around them.

use super::*;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn pairs(fields: &[Field]) -> Vec<(String, String)> {
    fields
        .iter()
        .map(|f| {
            (
                String::from_utf8(f.name.clone()).unwrap(),
                String::from_utf8(f.value.clone()).unwrap(),
            )
        })
        .collect()
}

fn owned(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

#[test]
fn integers_follow_c1() {
    let mut out = Vec::new();
    encode_integer(10, 5, 0, &mut out);
    assert_eq!(out, [0x0a]);
    out.clear();
    encode_integer(1337, 5, 0, &mut out);
    assert_eq!(out, [0x1f, 0x9a, 0x0a]);
    out.clear();
    encode_integer(42, 8, 0, &mut out);
    assert_eq!(out, [0x2a]);
    let mut at = 0;
    assert_eq!(decode_integer(&[0x1f, 0x9a, 0x0a], &mut at, 5), Ok(1337));
    assert_eq!(at, 3);
    let mut at = 0;
    assert_eq!(
        decode_integer(&[0x1f, 0x9a], &mut at, 5),
        Err(HpackError::Truncated)
    );
    let mut at = 0;
    let huge = [0x1f, 0xff, 0xff, 0xff, 0xff, 0x7f];
    assert_eq!(
        decode_integer(&huge, &mut at, 5),
        Err(HpackError::IntegerOverflow)
    );
}

#[test]
fn single_fields_follow_c2() {
    let mut d = Decoder::new(4096);
    let block = hex("400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572");
    let fields = d.decode(&block, 1 << 16).unwrap();
    assert_eq!(pairs(&fields), owned(&[("custom-key", "custom-header")]));
    assert_eq!(d.table.size(), 55);

    let mut d = Decoder::new(4096);
    let block = hex("040c 2f73 616d 706c 652f 7061 7468");
    let fields = d.decode(&block, 1 << 16).unwrap();
    assert_eq!(pairs(&fields), owned(&[(":path", "/sample/path")]));
    assert_eq!(d.table.size(), 0);

    let block = hex("1008 7061 7373 776f 7264 0673 6563 7265 74");
    let fields = d.decode(&block, 1 << 16).unwrap();
    assert_eq!(pairs(&fields), owned(&[("password", "secret")]));
    assert_eq!(d.table.size(), 0);

    let fields = d.decode(&[0x82], 1 << 16).unwrap();
    assert_eq!(pairs(&fields), owned(&[(":method", "GET")]));
}

/// C.3 (plain strings) and C.4 (Huffman): three requests on one connection.
#[test]
fn requests_follow_c3_and_c4() {
    let plain = [
        "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
        "8286 84be 5808 6e6f 2d63 6163 6865",
        "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
    ];
    let huffman = [
        "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
        "8286 84be 5886 a8eb 1064 9cbf",
        "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
    ];
    let expected = [
        owned(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
        ]),
        owned(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
            ("cache-control", "no-cache"),
        ]),
        owned(&[
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            (":authority", "www.example.com"),
            ("custom-key", "custom-value"),
        ]),
    ];
    for blocks in [plain, huffman] {
        let mut d = Decoder::new(4096);
        for ((block, want), size) in blocks.iter().zip(&expected).zip([57, 110, 164]) {
            let fields = d.decode(&hex(block), 1 << 16).unwrap();
            assert_eq!(&pairs(&fields), want);
            assert_eq!(d.table.size(), size);
        }
        assert_eq!(
            d.table.get(62),
            Some((&b"custom-key"[..], &b"custom-value"[..]))
        );
    }
}

#[test]
fn the_oldest_entries_are_evicted() {
    // A 100-byte table holds one 32+34-byte entry at a time.
    let mut d = Decoder::new(100);
    let mut block = Vec::new();
    for value in [
        "first-value-of-thirty-bytes-long!",
        "second-value-of-thirty-bytes-long",
    ] {
        block.push(0x40);
        encode_string(b"k", &mut block);
        encode_string(value.as_bytes(), &mut block);
    }
    block.push(0x80 | 62);
    let fields = d.decode(&block, 1 << 16).unwrap();
    assert_eq!(fields[2].value, b"second-value-of-thirty-bytes-long");
    assert_eq!(
        d.decode(&[0x80 | 63], 1 << 16),
        Err(HpackError::BadIndex(63))
    );
    // An entry larger than the table empties it.
    let mut big = vec![0x40];
    encode_string(b"k", &mut big);
    encode_string(&[b'x'; 80], &mut big);
    d.decode(&big, 1 << 16).unwrap();
    assert_eq!(d.table.size(), 0);
}

#[test]
fn size_updates_are_checked() {
    let mut d = Decoder::new(4096);
    // Shrinking to 0 at the start of a block is allowed and empties the table.
    d.decode(
        &hex("400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572"),
        1 << 16,
    )
    .unwrap();
    assert!(d.decode(&[0x20, 0x82], 1 << 16).is_ok());
    assert_eq!(d.table.size(), 0);
    // Above the announced limit.
    let mut over = Vec::new();
    encode_integer(4097, 5, 0x20, &mut over);
    assert_eq!(
        d.decode(&over, 1 << 16),
        Err(HpackError::BadSizeUpdate(4097))
    );
    // After a field.
    assert_eq!(
        d.decode(&[0x82, 0x20], 1 << 16),
        Err(HpackError::BadSizeUpdate(0))
    );
}

#[test]
fn malformed_blocks_fail_without_panicking() {
    let mut d = Decoder::new(4096);
    for block in [
        &[0x80][..],                         // index 0
        &[0xff, 0x80][..],                   // truncated integer
        &[0x40, 0x05, b'a'][..],             // truncated name
        &[0x04, 0x85, 0xff][..],             // truncated Huffman value
        &[0x04, 0x81, 0xff][..],             // Huffman padding of 8 ones
        &[0xbf][..],                         // index 63, empty dynamic table
        &[0x7f, 0xff, 0xff, 0xff, 0x0f][..], // name index far out of range
    ] {
        assert!(d.decode(block, 1 << 16).is_err(), "{block:x?}");
    }
}

#[test]
fn the_list_limit_is_enforced_and_the_table_kept() {
    let mut d = Decoder::new(4096);
    let mut block = Vec::new();
    block.push(0x40);
    encode_string(b"big", &mut block);
    encode_string(&[b'v'; 200], &mut block);
    assert_eq!(d.decode(&block, 100), Err(HpackError::ListTooLarge(100)));
    // The entry was still added: the peer's encoder counts on it.
    assert_eq!(d.decode(&[0x80 | 62], 1 << 16).unwrap()[0].name, b"big");
}

#[test]
fn literals_encode_as_the_rfc_shows_and_decode_back() {
    let mut out = Vec::new();
    encode_literal(":path", b"/sample/path", false, &mut out);
    // C.2.2, except that the value is Huffman-coded when shorter.
    assert_eq!(out[0], 0x04);
    encode_literal("password", b"secret", true, &mut out);
    encode_literal("x-custom", &[0, 1, 0xff, b'a'], false, &mut out);
    encode_indexed(static_index(":method", "POST").unwrap(), &mut out);
    let fields = Decoder::new(4096).decode(&out, 1 << 16).unwrap();
    let got: Vec<(&[u8], &[u8])> = fields
        .iter()
        .map(|f| (f.name.as_slice(), f.value.as_slice()))
        .collect();
    assert_eq!(
        got,
        [
            (&b":path"[..], &b"/sample/path"[..]),
            (b"password", b"secret"),
            (b"x-custom", &[0, 1, 0xff, b'a']),
            (b":method", b"POST"),
        ]
    );
    // Never indexed: the 0001 pattern.
    let mut sensitive = Vec::new();
    encode_literal("password", b"secret", true, &mut sensitive);
    assert_eq!(sensitive[0] & 0xf0, 0x10);
}
