//! HPACK's Huffman code (RFC 7541 §5.2, Appendix B).
//!
//! The code is canonical: codes of one length are consecutive and follow
//! the symbols' order, and each length's first code follows the previous
//! length's last. So the table below holds only each symbol's code length,
//! and the codes are derived from it at compile time. Decoding walks the
//! input bit by bit against the first code of each length, which keeps the
//! code small (it runs once per header value, on cold caches).

use super::HpackError;

/// End of string: symbol 256, never valid inside a string.
const EOS: usize = 256;
const SYMBOLS: usize = 257;
const MAX_LEN: usize = 30;

/// The code length of each symbol, 0–255 then EOS (Appendix B).
#[rustfmt::skip]
const LENGTHS: [u8; SYMBOLS] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28,
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28,
    6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6,
    5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10,
    13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6,
    15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5,
    6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28,
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23,
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24,
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23,
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23,
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25,
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27,
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23,
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26,
    30,
];

/// The canonical code, derived from [`LENGTHS`].
struct Code {
    /// Each symbol's code, right-aligned.
    codes: [u32; SYMBOLS],
    /// The first code of each length.
    first: [u32; MAX_LEN + 1],
    /// How many symbols have each length.
    count: [u16; MAX_LEN + 1],
    /// Where each length's symbols start in `symbols`.
    start: [u16; MAX_LEN + 1],
    /// The symbols sorted by code length, then by value.
    symbols: [u16; SYMBOLS],
}

const CODE: Code = canonical();

const fn canonical() -> Code {
    let mut count = [0u16; MAX_LEN + 1];
    let mut i = 0;
    while i < SYMBOLS {
        count[LENGTHS[i] as usize] += 1;
        i += 1;
    }
    let mut first = [0u32; MAX_LEN + 1];
    let mut start = [0u16; MAX_LEN + 1];
    let mut code = 0u32;
    let mut placed = 0u16;
    let mut len = 1;
    while len <= MAX_LEN {
        code <<= 1;
        first[len] = code;
        start[len] = placed;
        code += count[len] as u32;
        placed += count[len];
        len += 1;
    }
    let mut codes = [0u32; SYMBOLS];
    let mut symbols = [0u16; SYMBOLS];
    let mut next = first;
    let mut filled = start;
    let mut s = 0;
    while s < SYMBOLS {
        let len = LENGTHS[s] as usize;
        codes[s] = next[len];
        next[len] += 1;
        symbols[filled[len] as usize] = s as u16;
        filled[len] += 1;
        s += 1;
    }
    Code {
        codes,
        first,
        count,
        start,
        symbols,
    }
}

/// The length in bytes of `input` Huffman-coded.
pub(crate) fn encoded_len(input: &[u8]) -> usize {
    let bits: usize = input.iter().map(|&b| LENGTHS[b as usize] as usize).sum();
    bits.div_ceil(8)
}

/// Appends `input` Huffman-coded, padded with the EOS code's leading ones.
pub(crate) fn encode(input: &[u8], out: &mut Vec<u8>) {
    let mut acc: u64 = 0;
    let mut bits = 0u32;
    for &b in input {
        let len = u32::from(LENGTHS[b as usize]);
        acc = (acc << len) | u64::from(CODE.codes[b as usize]);
        bits += len;
        while bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    if bits > 0 {
        let pad = 8 - bits;
        out.push(((acc << pad) as u8) | ((1u8 << pad) - 1));
    }
}

/// Decodes a Huffman-coded string. Padding longer than 7 bits, padding that
/// is not all ones, and an EOS symbol are errors (RFC 7541 §5.2).
pub(crate) fn decode(input: &[u8], out: &mut Vec<u8>) -> Result<(), HpackError> {
    let mut code = 0u32;
    let mut len = 0usize;
    for &byte in input {
        for shift in (0..8).rev() {
            code = (code << 1) | u32::from((byte >> shift) & 1);
            len += 1;
            let offset = code.wrapping_sub(CODE.first[len]);
            if offset < u32::from(CODE.count[len]) {
                let symbol = CODE.symbols[(CODE.start[len] as u32 + offset) as usize] as usize;
                if symbol == EOS {
                    return Err(HpackError::Huffman);
                }
                out.push(symbol as u8);
                code = 0;
                len = 0;
            } else if len == MAX_LEN {
                return Err(HpackError::Huffman);
            }
        }
    }
    // What is left must be a prefix of EOS: fewer than 8 bits, all ones.
    if len > 7 || code != (1 << len) - 1 {
        return Err(HpackError::Huffman);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_code_is_the_rfcs() {
        // A few codes as Appendix B prints them.
        assert_eq!(
            (CODE.codes[b'0' as usize], LENGTHS[b'0' as usize]),
            (0x0, 5)
        );
        assert_eq!(
            (CODE.codes[b'a' as usize], LENGTHS[b'a' as usize]),
            (0x3, 5)
        );
        assert_eq!(
            (CODE.codes[b' ' as usize], LENGTHS[b' ' as usize]),
            (0x14, 6)
        );
        assert_eq!((CODE.codes[0], LENGTHS[0]), (0x1ff8, 13));
        assert_eq!((CODE.codes[255], LENGTHS[255]), (0x3ffffee, 26));
        assert_eq!((CODE.codes[EOS], LENGTHS[EOS]), (0x3fffffff, 30));
        // A complete prefix code: the last code of the longest length is all ones.
        assert_eq!(
            CODE.first[MAX_LEN] + u32::from(CODE.count[MAX_LEN]) - 1,
            (1 << 30) - 1
        );
    }

    #[test]
    fn strings_of_the_rfcs_examples_decode() {
        // RFC 7541 C.4.1: "www.example.com".
        let coded = [
            0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff,
        ];
        let mut out = Vec::new();
        decode(&coded, &mut out).unwrap();
        assert_eq!(out, b"www.example.com");
        let mut again = Vec::new();
        encode(b"www.example.com", &mut again);
        assert_eq!(again, coded);
        assert_eq!(encoded_len(b"www.example.com"), coded.len());
    }

    #[test]
    fn every_byte_round_trips() {
        let all: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
        let mut coded = Vec::new();
        encode(&all, &mut coded);
        assert_eq!(coded.len(), encoded_len(&all));
        let mut out = Vec::new();
        decode(&coded, &mut out).unwrap();
        assert_eq!(out, all);
    }

    #[test]
    fn bad_padding_and_eos_are_refused() {
        // 'a' is 00011 (5 bits); three zero bits of padding are not EOS's ones.
        assert_eq!(
            decode(&[0b0001_1000], &mut Vec::new()),
            Err(HpackError::Huffman)
        );
        // A whole byte of ones is padding longer than 7 bits.
        assert_eq!(
            decode(&[0b0001_1111, 0xff], &mut Vec::new()),
            Err(HpackError::Huffman)
        );
        // EOS itself (30 ones) inside the string.
        assert_eq!(
            decode(&[0xff, 0xff, 0xff, 0xff], &mut Vec::new()),
            Err(HpackError::Huffman)
        );
        // Correct padding.
        let mut out = Vec::new();
        decode(&[0b0001_1111], &mut out).unwrap();
        assert_eq!(out, b"a");
    }
}
