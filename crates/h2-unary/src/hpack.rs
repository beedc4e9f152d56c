//! HPACK (RFC 7541): a decoder that keeps the peer encoder's dynamic
//! table, and an encoder of static indexes and literals that never adds to
//! the receiver's table, so it keeps no state of its own.
//!
//! One file over 700 lines: the decoder, the encoder and the Huffman code
//! of RFC 7541 Appendix B share private tables and helpers.

use std::collections::VecDeque;
use std::ops::Range;

/// The dynamic table size an HTTP/2 peer starts with and that h2's decoder
/// keeps unless SETTINGS_HEADER_TABLE_SIZE is configured (csi-server never
/// configures it).
pub const DEFAULT_TABLE_SIZE: usize = 4096;

/// Why a header block could not be decoded (a COMPRESSION_ERROR in HTTP/2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HpackError {
    /// The block ends inside a representation.
    #[error("header block ends inside a field")]
    Truncated,
    /// An integer does not fit the limits HPACK decoders apply.
    #[error("integer too large in header block")]
    IntegerOverflow,
    /// An index outside the static and dynamic tables.
    #[error("index {0} is not in the header table")]
    BadIndex(usize),
    /// A Huffman string with an EOS symbol, or padding that is not 1-bits
    /// or longer than 7 bits.
    #[error("invalid Huffman-coded string")]
    Huffman,
    /// A dynamic table size update above the size the decoder allows.
    #[error("dynamic table size update to {size} above the limit {limit}")]
    TableSizeTooLarge {
        /// The requested size.
        size: usize,
        /// The decoder's limit.
        limit: usize,
    },
    /// A dynamic table size update after the first header field.
    #[error("dynamic table size update after a header field")]
    LateSizeUpdate,
    /// The decoded list exceeds the decoder's bound.
    #[error("decoded header list larger than {0} bytes")]
    ListTooLarge(usize),
}

/// The static table (RFC 7541 Appendix A), index 1 first.
pub const STATIC_TABLE: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// A decoded header field: ranges into [`HeaderList::bytes`].
#[derive(Debug, Clone, PartialEq, Eq)]
struct Field {
    name: Range<usize>,
    value: Range<usize>,
    never_indexed: bool,
}

/// A decoded header block, reused across blocks so decoding does not
/// allocate once its buffers have grown.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct HeaderList {
    bytes: Vec<u8>,
    fields: Vec<Field>,
}

impl HeaderList {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    /// `(name, value, never_indexed)` in block order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8], bool)> + '_ {
        self.fields.iter().map(|f| {
            (
                &self.bytes[f.name.clone()],
                &self.bytes[f.value.clone()],
                f.never_indexed,
            )
        })
    }

    /// The value of the first field called `name`.
    pub fn get(&self, name: &[u8]) -> Option<&[u8]> {
        self.iter().find(|(n, _, _)| *n == name).map(|(_, v, _)| v)
    }

    /// The number of fields.
    pub fn len(&self) -> usize {
        self.fields.len()
    }

    /// Whether the block had no field.
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.fields.clear();
    }
}

/// One dynamic table entry, name and value in one allocation.
#[derive(Debug)]
struct Entry {
    data: Box<[u8]>,
    name_len: usize,
}

impl Entry {
    fn name(&self) -> &[u8] {
        &self.data[..self.name_len]
    }
    fn value(&self) -> &[u8] {
        &self.data[self.name_len..]
    }
    /// The size RFC 7541 §4.1 charges for an entry.
    fn size(&self) -> usize {
        self.data.len() + 32
    }
}

/// Decodes the header blocks of one direction of one connection, keeping
/// the dynamic table the peer's encoder built.
#[derive(Debug)]
pub struct Decoder {
    table: VecDeque<Entry>,
    size: usize,
    max_size: usize,
    limit: usize,
    max_list: usize,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new(DEFAULT_TABLE_SIZE, 1 << 20)
    }
}

impl Decoder {
    /// A decoder whose peer may grow the table up to `limit` bytes (the
    /// receiver's SETTINGS_HEADER_TABLE_SIZE) and whose decoded lists are
    /// bounded by `max_list` bytes (RFC 7541 sizes: name + value + 32 per
    /// field), so a small block cannot expand without bound.
    pub fn new(limit: usize, max_list: usize) -> Self {
        Self {
            table: VecDeque::new(),
            size: 0,
            max_size: limit.min(DEFAULT_TABLE_SIZE),
            limit,
            max_list,
        }
    }

    /// Decodes one complete header block (all its CONTINUATION fragments
    /// joined) into `list`, replacing what it held.
    pub fn decode(&mut self, block: &[u8], list: &mut HeaderList) -> Result<(), HpackError> {
        list.clear();
        let mut pos = 0;
        let mut list_size = 0usize;
        while pos < block.len() {
            let rest = &block[pos..];
            let first = rest[0];
            if first & 0x80 != 0 {
                // Indexed field.
                let (index, n) = integer(rest, 7)?;
                pos += n;
                let (name, value) = self.entry(index)?;
                let start = list.bytes.len();
                list.bytes.extend_from_slice(name);
                let mid = list.bytes.len();
                list.bytes.extend_from_slice(value);
                list.fields.push(Field {
                    name: start..mid,
                    value: mid..list.bytes.len(),
                    never_indexed: false,
                });
            } else if first & 0xe0 == 0x20 {
                // Dynamic table size update: only before the first field.
                if !list.fields.is_empty() {
                    return Err(HpackError::LateSizeUpdate);
                }
                let (size, n) = integer(rest, 5)?;
                pos += n;
                if size > self.limit {
                    return Err(HpackError::TableSizeTooLarge {
                        size,
                        limit: self.limit,
                    });
                }
                self.max_size = size;
                self.evict_to(size);
                continue;
            } else {
                // Literal: with incremental indexing (01), never indexed
                // (0001) or without indexing (0000).
                let (indexing, prefix) = if first & 0x40 != 0 {
                    (true, 6)
                } else {
                    (false, 4)
                };
                let (index, mut n) = integer(rest, prefix)?;
                let start = list.bytes.len();
                if index == 0 {
                    n += string(&rest[n..], &mut list.bytes)?;
                } else {
                    let (name, _) = self.entry(index)?;
                    list.bytes.extend_from_slice(name);
                }
                let mid = list.bytes.len();
                n += string(&rest[n..], &mut list.bytes)?;
                pos += n;
                let end = list.bytes.len();
                if indexing {
                    self.insert(&list.bytes[start..mid], &list.bytes[mid..end]);
                }
                list.fields.push(Field {
                    name: start..mid,
                    value: mid..end,
                    never_indexed: !indexing && first & 0x10 != 0,
                });
            }
            let last = &list.fields[list.fields.len() - 1];
            list_size += last.name.len() + last.value.len() + 32;
            if list_size > self.max_list {
                return Err(HpackError::ListTooLarge(self.max_list));
            }
        }
        Ok(())
    }

    fn entry(&self, index: usize) -> Result<(&[u8], &[u8]), HpackError> {
        match index {
            1..=61 => Ok(STATIC_TABLE[index - 1]),
            _ if index > 61 => self
                .table
                .get(index - 62)
                .map(|e| (e.name(), e.value()))
                .ok_or(HpackError::BadIndex(index)),
            _ => Err(HpackError::BadIndex(index)),
        }
    }

    /// Adds an entry (RFC 7541 §4.4): evicts the oldest until it fits; one
    /// larger than the table empties it and is not added.
    fn insert(&mut self, name: &[u8], value: &[u8]) {
        let size = name.len() + value.len() + 32;
        if size > self.max_size {
            self.evict_to(0);
            return;
        }
        self.evict_to(self.max_size - size);
        let mut data = Vec::with_capacity(name.len() + value.len());
        data.extend_from_slice(name);
        data.extend_from_slice(value);
        self.table.push_front(Entry {
            data: data.into_boxed_slice(),
            name_len: name.len(),
        });
        self.size += size;
    }

    fn evict_to(&mut self, size: usize) {
        while self.size > size {
            let Some(e) = self.table.pop_back() else {
                break;
            };
            self.size -= e.size();
        }
    }
}

/// Decodes an integer with an N-bit prefix (RFC 7541 §5.1); returns it and
/// the bytes it took. Values above `u32::MAX` are refused.
fn integer(buf: &[u8], prefix: u8) -> Result<(usize, usize), HpackError> {
    let mask = (1u8 << prefix) - 1;
    let first = buf.first().ok_or(HpackError::Truncated)? & mask;
    if first < mask {
        return Ok((first as usize, 1));
    }
    let mut value = mask as u64;
    for (i, &b) in buf[1..].iter().enumerate() {
        if i == 5 {
            return Err(HpackError::IntegerOverflow);
        }
        value += u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            if value > u64::from(u32::MAX) {
                return Err(HpackError::IntegerOverflow);
            }
            return Ok((value as usize, i + 2));
        }
    }
    Err(HpackError::Truncated)
}

/// Decodes a string literal (RFC 7541 §5.2), appending it to `out`;
/// returns the bytes it took.
fn string(buf: &[u8], out: &mut Vec<u8>) -> Result<usize, HpackError> {
    let huffman = buf.first().ok_or(HpackError::Truncated)? & 0x80 != 0;
    let (len, n) = integer(buf, 7)?;
    let data = buf.get(n..n + len).ok_or(HpackError::Truncated)?;
    if huffman {
        huffman_decode(data, out)?;
    } else {
        out.extend_from_slice(data);
    }
    Ok(n + len)
}

/// Appends an integer with an N-bit prefix; `flags` are the high bits of
/// the first byte.
pub fn encode_integer(value: usize, prefix: u8, flags: u8, out: &mut Vec<u8>) {
    let mask = (1usize << prefix) - 1;
    if value < mask {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | mask as u8);
    let mut rest = value - mask;
    while rest >= 0x80 {
        out.push((rest as u8 & 0x7f) | 0x80);
        rest >>= 7;
    }
    out.push(rest as u8);
}

/// Appends a raw (not Huffman-coded) string literal.
fn encode_string(s: &[u8], out: &mut Vec<u8>) {
    encode_integer(s.len(), 7, 0, out);
    out.extend_from_slice(s);
}

/// Appends a literal field with a literal name that the receiver does not
/// add to its table: "never indexed" when the sender marked it so (RFC 7541
/// §6.2.3 asks intermediaries to keep that), "without indexing" otherwise.
pub fn encode_literal(name: &[u8], value: &[u8], never_indexed: bool, out: &mut Vec<u8>) {
    out.push(if never_indexed { 0x10 } else { 0x00 });
    encode_string(name, out);
    encode_string(value, out);
}

/// Appends the field at `index` of the static table (RFC 7541 §6.1), e.g.
/// [`METHOD_POST`].
pub fn encode_indexed(index: usize, out: &mut Vec<u8>) {
    encode_integer(index, 7, 0x80, out);
}

/// `:method: POST` in the static table.
pub const METHOD_POST: usize = 3;
/// `:scheme: http` in the static table.
pub const SCHEME_HTTP: usize = 6;
/// `:status: 200` in the static table.
pub const STATUS_200: usize = 8;

/// Appends `s` Huffman-coded (RFC 7541 §5.2) without its length prefix:
/// for encoders that want shorter strings, and for tests that need coded
/// input.
pub fn huffman_encode(s: &[u8], out: &mut Vec<u8>) {
    let mut code_of = [(0u32, 0u32); 257];
    for len in 1..=30usize {
        for k in 0..CANONICAL.count[len] {
            let sym = CANONICAL.symbols[(CANONICAL.offset[len] + k) as usize];
            code_of[sym as usize] = (CANONICAL.first[len] + k, len as u32);
        }
    }
    let mut acc = 0u64;
    let mut bits = 0u32;
    for &b in s {
        let (code, len) = code_of[b as usize];
        acc = (acc << len) | u64::from(code);
        bits += len;
        while bits >= 8 {
            out.push((acc >> (bits - 8)) as u8);
            bits -= 8;
        }
    }
    if bits > 0 {
        let pad = 8 - bits;
        out.push(((acc << pad) | ((1 << pad) - 1)) as u8);
    }
}

/// Appends a dynamic table size update.
pub fn encode_size_update(size: usize, out: &mut Vec<u8>) {
    encode_integer(size, 5, 0x20, out);
}

/// The HPACK Huffman code (RFC 7541 Appendix B) is canonical: codes are
/// handed out in order of length, and by symbol within a length. So the
/// symbols of each length are all it takes to rebuild it.
const HUFFMAN_LENGTHS: [(u8, &[u16]); 21] = [
    (5, &[48, 49, 50, 97, 99, 101, 105, 111, 115, 116]),
    (
        6,
        &[
            32, 37, 45, 46, 47, 51, 52, 53, 54, 55, 56, 57, 61, 65, 95, 98, 100, 102, 103, 104,
            108, 109, 110, 112, 114, 117,
        ],
    ),
    (
        7,
        &[
            58, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86,
            87, 89, 106, 107, 113, 118, 119, 120, 121, 122,
        ],
    ),
    (8, &[38, 42, 44, 59, 88, 90]),
    (10, &[33, 34, 40, 41, 63]),
    (11, &[39, 43, 124]),
    (12, &[35, 62]),
    (13, &[0, 36, 64, 91, 93, 126]),
    (14, &[94, 125]),
    (15, &[60, 96, 123]),
    (19, &[92, 195, 208]),
    (20, &[128, 130, 131, 162, 184, 194, 224, 226]),
    (
        21,
        &[
            153, 161, 167, 172, 176, 177, 179, 209, 216, 217, 227, 229, 230,
        ],
    ),
    (
        22,
        &[
            129, 132, 133, 134, 136, 146, 154, 156, 160, 163, 164, 169, 170, 173, 178, 181, 185,
            186, 187, 189, 190, 196, 198, 228, 232, 233,
        ],
    ),
    (
        23,
        &[
            1, 135, 137, 138, 139, 140, 141, 143, 147, 149, 150, 151, 152, 155, 157, 158, 165, 166,
            168, 174, 175, 180, 182, 183, 188, 191, 197, 231, 239,
        ],
    ),
    (
        24,
        &[9, 142, 144, 145, 148, 159, 171, 206, 215, 225, 236, 237],
    ),
    (25, &[199, 207, 234, 235]),
    (
        26,
        &[
            192, 193, 200, 201, 202, 205, 210, 213, 218, 219, 238, 240, 242, 243, 255,
        ],
    ),
    (
        27,
        &[
            203, 204, 211, 212, 214, 221, 222, 223, 241, 244, 245, 246, 247, 248, 250, 251, 252,
            253, 254,
        ],
    ),
    (
        28,
        &[
            2, 3, 4, 5, 6, 7, 8, 11, 12, 14, 15, 16, 17, 18, 19, 20, 21, 23, 24, 25, 26, 27, 28,
            29, 30, 31, 127, 220, 249,
        ],
    ),
    (30, &[10, 13, 22, 256]),
];

const EOS: u16 = 256;

/// The canonical code in the form a decoder walks: per length, the first
/// code, how many codes and where their symbols start in `symbols`.
struct Canonical {
    first: [u32; 31],
    count: [u32; 31],
    offset: [u32; 31],
    symbols: [u16; 257],
}

const CANONICAL: Canonical = {
    let mut c = Canonical {
        first: [0; 31],
        count: [0; 31],
        offset: [0; 31],
        symbols: [0; 257],
    };
    let mut code = 0u32;
    let mut len = 1;
    let mut group = 0;
    let mut next = 0;
    while len <= 30 {
        c.first[len] = code;
        c.offset[len] = next as u32;
        if group < HUFFMAN_LENGTHS.len() && HUFFMAN_LENGTHS[group].0 as usize == len {
            let syms = HUFFMAN_LENGTHS[group].1;
            let mut i = 0;
            while i < syms.len() {
                c.symbols[next] = syms[i];
                next += 1;
                i += 1;
            }
            c.count[len] = syms.len() as u32;
            group += 1;
        }
        code = (code + c.count[len]) << 1;
        len += 1;
    }
    c
};

/// Decodes a Huffman-coded string, appending it to `out`.
fn huffman_decode(data: &[u8], out: &mut Vec<u8>) -> Result<(), HpackError> {
    let c = &CANONICAL;
    // Bits not consumed yet, left-aligned in `acc`.
    let mut acc = 0u64;
    let mut bits = 0u32;
    let mut input = data.iter();
    loop {
        while bits <= 56 {
            match input.next() {
                Some(&b) => {
                    acc |= u64::from(b) << (56 - bits);
                    bits += 8;
                }
                None => break,
            }
        }
        if bits == 0 {
            return Ok(());
        }
        let mut decoded = false;
        let mut len = 5;
        while len <= 30 && len <= bits {
            let code = (acc >> (64 - len)) as u32;
            // Codes of this length are first..first+count; the prefix of a
            // longer code is past them.
            let k = code.wrapping_sub(c.first[len as usize]);
            if k < c.count[len as usize] {
                let sym = c.symbols[(c.offset[len as usize] + k) as usize];
                if sym == EOS {
                    return Err(HpackError::Huffman);
                }
                out.push(sym as u8);
                acc <<= len;
                bits -= len;
                decoded = true;
                break;
            }
            len += 1;
        }
        if !decoded {
            // What is left is shorter than any code it starts: it must be
            // padding, the high (all-1) bits of EOS, under a byte.
            let ones = (1u64 << bits) - 1;
            if bits > 7 || (acc >> (64 - bits)) != ones {
                return Err(HpackError::Huffman);
            }
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_named_static_entries_are_the_tables() {
        assert_eq!(
            STATIC_TABLE[METHOD_POST - 1],
            (&b":method"[..], &b"POST"[..])
        );
        assert_eq!(
            STATIC_TABLE[SCHEME_HTTP - 1],
            (&b":scheme"[..], &b"http"[..])
        );
    }

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn huff(data: &[u8]) -> Result<Vec<u8>, HpackError> {
        let mut out = Vec::new();
        huffman_decode(data, &mut out).map(|()| out)
    }

    #[test]
    fn the_code_is_complete_and_ordered() {
        // Kraft sum of a complete prefix code is exactly 1.
        let kraft: u64 = HUFFMAN_LENGTHS
            .iter()
            .map(|(len, syms)| syms.len() as u64 * (1u64 << (30 - len)))
            .sum();
        assert_eq!(kraft, 1 << 30);
        let mut seen = [false; 257];
        for (_, syms) in HUFFMAN_LENGTHS {
            assert!(
                syms.windows(2).all(|w| w[0] < w[1]),
                "sorted within a length"
            );
            for &s in syms {
                assert!(!seen[s as usize], "symbol {s} twice");
                seen[s as usize] = true;
            }
        }
        assert!(seen.iter().all(|s| *s));
        // RFC 7541 Appendix B: a few codes as printed there.
        let mut out = Vec::new();
        huffman_encode(b"0", &mut out);
        assert_eq!(out, [0x07]); // '0' = 00000, padded with 111
        assert_eq!(CANONICAL.first[30] + 3, 0x3fff_ffff); // EOS is the last code
    }

    #[test]
    fn rfc_7541_huffman_examples() {
        // Appendix C.4 and C.6.
        let cases: [(&str, &[u8]); 8] = [
            ("f1e3 c2e5 f23a 6ba0 ab90 f4ff", b"www.example.com"),
            ("a8eb 1064 9cbf", b"no-cache"),
            ("25a8 49e9 5ba9 7d7f", b"custom-key"),
            ("25a8 49e9 5bb8 e8b4 bf", b"custom-value"),
            ("6402", b"302"),
            ("aec3 771a 4b", b"private"),
            (
                "d07a be94 1054 d444 a820 0595 040b 8166 e082 a62d 1bff",
                b"Mon, 21 Oct 2013 20:13:21 GMT",
            ),
            (
                "9d29 ad17 1863 c78f 0b97 c8e9 ae82 ae43 d3",
                b"https://www.example.com",
            ),
        ];
        for (code, text) in cases {
            assert_eq!(huff(&hex(code)).unwrap(), text);
            let mut enc = Vec::new();
            huffman_encode(text, &mut enc);
            assert_eq!(enc, hex(code));
        }
    }

    #[test]
    fn every_byte_round_trips_and_bad_padding_is_refused() {
        let all: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
        let mut enc = Vec::new();
        huffman_encode(&all, &mut enc);
        assert_eq!(huff(&enc).unwrap(), all);
        assert_eq!(huff(&[]).unwrap(), b"");
        // 8 bits of padding, padding of zeros, and a whole EOS.
        assert_eq!(huff(&[0x07, 0xff]), Err(HpackError::Huffman));
        assert_eq!(huff(&[0x00]), Err(HpackError::Huffman));
        assert_eq!(huff(&[0xff, 0xff, 0xff, 0xff]), Err(HpackError::Huffman));
    }

    #[test]
    fn integers_follow_rfc_7541_c1() {
        assert_eq!(integer(&[0x0a], 5), Ok((10, 1)));
        assert_eq!(integer(&[0x1f, 0x9a, 0x0a], 5), Ok((1337, 3)));
        assert_eq!(integer(&[42], 8 - 1), Ok((42, 1)));
        assert_eq!(integer(&[0x1f, 0x9a], 5), Err(HpackError::Truncated));
        assert_eq!(
            integer(&[0x1f, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01], 5),
            Err(HpackError::IntegerOverflow)
        );
        for v in [
            0,
            1,
            14,
            15,
            16,
            126,
            127,
            128,
            1337,
            16_384,
            u32::MAX as usize,
        ] {
            for prefix in [4, 5, 6, 7] {
                let mut out = Vec::new();
                encode_integer(v, prefix, 0, &mut out);
                assert_eq!(integer(&out, prefix), Ok((v, out.len())), "{v} /{prefix}");
            }
        }
    }

    /// RFC 7541 C.3: three requests without Huffman coding, sharing the
    /// dynamic table.
    #[test]
    fn rfc_7541_c3_request_sequence() {
        let mut d = Decoder::default();
        let mut list = HeaderList::new();
        let blocks = [
            "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
            "8286 84be 5808 6e6f 2d63 6163 6865",
            "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
        ];
        let expected: [&[(&str, &str)]; 3] = [
            &[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
            ],
            &[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
                ("cache-control", "no-cache"),
            ],
            &[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/index.html"),
                (":authority", "www.example.com"),
                ("custom-key", "custom-value"),
            ],
        ];
        for (block, want) in blocks.iter().zip(expected) {
            d.decode(&hex(block), &mut list).unwrap();
            let got: Vec<(String, String)> = list
                .iter()
                .map(|(n, v, _)| {
                    (
                        String::from_utf8(n.to_vec()).unwrap(),
                        String::from_utf8(v.to_vec()).unwrap(),
                    )
                })
                .collect();
            let want: Vec<(String, String)> = want
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect();
            assert_eq!(got, want);
        }
        assert_eq!(d.size, 164);
    }

    #[test]
    fn eviction_size_updates_and_limits() {
        let mut d = Decoder::new(4096, 1 << 20);
        let mut list = HeaderList::new();
        // Size update to 100, then two 60-byte entries: the first is evicted.
        let mut block = Vec::new();
        encode_size_update(100, &mut block);
        for v in [b"aaaaaaaaaaaaaaaaa", b"bbbbbbbbbbbbbbbbb"] {
            block.push(0x40);
            encode_string(b"x-name-1", &mut block);
            encode_string(v, &mut block);
        }
        d.decode(&block, &mut list).unwrap();
        assert_eq!(d.table.len(), 1);
        assert_eq!(d.size, 8 + 17 + 32);
        d.decode(&[0x80 | 62], &mut list).unwrap();
        assert_eq!(list.get(b"x-name-1"), Some(&b"bbbbbbbbbbbbbbbbb"[..]));
        assert_eq!(
            d.decode(&[0x80 | 63], &mut list),
            Err(HpackError::BadIndex(63))
        );
        assert_eq!(d.decode(&[0x80], &mut list), Err(HpackError::BadIndex(0)));
        // An entry larger than the table empties it.
        let mut big = vec![0x40];
        encode_string(b"n", &mut big);
        encode_string(&[b'v'; 80], &mut big);
        d.decode(&big, &mut list).unwrap();
        assert!(d.table.is_empty());
        assert_eq!(d.size, 0);
        // Size updates: only first, never above the limit.
        assert_eq!(
            d.decode(&[0x82, 0x20], &mut list),
            Err(HpackError::LateSizeUpdate)
        );
        let mut over = Vec::new();
        encode_size_update(4097, &mut over);
        assert!(matches!(
            d.decode(&over, &mut list),
            Err(HpackError::TableSizeTooLarge { .. })
        ));
        // Truncated literal, and a list over the bound.
        assert_eq!(
            d.decode(&[0x00, 0x03, b'a'], &mut list),
            Err(HpackError::Truncated)
        );
        let mut small = Decoder::new(4096, 100);
        assert_eq!(
            small.decode(&[0x82; 3], &mut list),
            Err(HpackError::ListTooLarge(100))
        );
    }

    #[test]
    fn literals_keep_never_indexed() {
        let mut block = Vec::new();
        encode_literal(b"authorization", b"secret", true, &mut block);
        encode_literal(b"x", b"", false, &mut block);
        let mut list = HeaderList::new();
        Decoder::default().decode(&block, &mut list).unwrap();
        let fields: Vec<_> = list.iter().collect();
        assert_eq!(
            fields,
            [
                (&b"authorization"[..], &b"secret"[..], true),
                (b"x", b"", false)
            ]
        );
    }
}
