//! The bytes of one record file.
//!
//! ```text
//! 0   4  magic "CSIR"
//! 4   1  format version (1)
//! 5   1  codec id
//! 6   2  key length (little endian)
//! 8   4  payload length (little endian)
//! 12  4  CRC-32C of every other byte of the file
//! 16     key (UTF-8), then payload
//! ```
//!
//! The file must be exactly as long as the header says, so a truncated or
//! extended file, or one whose bytes changed, never decodes.

use crate::codec::CodecId;

const MAGIC: &[u8; 4] = b"CSIR";
const VERSION: u8 = 1;
const HEADER: usize = 16;

/// Encodes a record file.
pub(crate) fn encode(key: &str, codec: CodecId, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + key.len() + payload.len());
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    out.push(codec.0);
    out.extend_from_slice(&(key.len() as u16).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(payload);
    let crc = crc32c(&[&out[..12], &out[HEADER..]]);
    out[12..16].copy_from_slice(&crc.to_le_bytes());
    out
}

/// A decoded record file: where its parts are.
#[derive(Debug)]
pub(crate) struct Decoded<'a> {
    pub key: &'a str,
    pub codec: CodecId,
    pub payload_start: usize,
}

/// Decodes a record file, or says (without its contents) why it is bad.
pub(crate) fn decode(bytes: &[u8]) -> Result<Decoded<'_>, String> {
    if bytes.len() < HEADER {
        return Err(format!(
            "truncated: {} bytes, shorter than the header",
            bytes.len()
        ));
    }
    if &bytes[..4] != MAGIC {
        return Err("not a record file (bad magic)".into());
    }
    if bytes[4] != VERSION {
        return Err(format!("unknown format version {}", bytes[4]));
    }
    let key_len = u16::from_le_bytes([bytes[6], bytes[7]]) as usize;
    let payload_len = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize;
    let want = HEADER + key_len + payload_len;
    if bytes.len() != want {
        return Err(format!(
            "length {} does not match the header's {want}",
            bytes.len()
        ));
    }
    let stored = u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]);
    if crc32c(&[&bytes[..12], &bytes[HEADER..]]) != stored {
        return Err("checksum mismatch".into());
    }
    let key = std::str::from_utf8(&bytes[HEADER..HEADER + key_len])
        .map_err(|_| "key is not UTF-8".to_owned())?;
    Ok(Decoded {
        key,
        codec: CodecId(bytes[5]),
        payload_start: HEADER + key_len,
    })
}

const fn crc_table() -> [u32; 256] {
    // Castagnoli polynomial, reflected.
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0x82F6_3B78 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
}

static CRC_TABLE: [u32; 256] = crc_table();

/// CRC-32C over the concatenation of `parts`.
pub(crate) fn crc32c(parts: &[&[u8]]) -> u32 {
    // Every record read at open and every journal entry replayed is
    // checked: the CPU's instruction does in one step what the table does
    // a byte at a time.
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("sse4.2") {
        // SAFETY: the CPU has SSE4.2, checked just above.
        return unsafe { crc32c_sse42(parts) };
    }
    crc32c_table(parts)
}

fn crc32c_table(parts: &[&[u8]]) -> u32 {
    let mut c = !0u32;
    for part in parts {
        c = crc32c_bytes(c, part);
    }
    !c
}

fn crc32c_bytes(mut c: u32, bytes: &[u8]) -> u32 {
    for &b in bytes {
        c = CRC_TABLE[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8);
    }
    c
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn crc32c_sse42(parts: &[&[u8]]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u8, _mm_crc32_u64};
    let mut c = !0u32;
    for part in parts {
        let mut words = part.chunks_exact(8);
        let mut c64 = u64::from(c);
        for w in &mut words {
            c64 = _mm_crc32_u64(c64, u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
        c = c64 as u32;
        for &b in words.remainder() {
            c = _mm_crc32_u8(c, b);
        }
    }
    !c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_check_value() {
        assert_eq!(crc32c(&[b"123456789"]), 0xE306_9283);
        assert_eq!(crc32c(&[b"1234", b"56789"]), 0xE306_9283);
        assert_eq!(crc32c_table(&[b"123456789"]), 0xE306_9283);
    }

    #[test]
    fn crc32c_gives_the_table_s_value_however_the_bytes_are_split() {
        let bytes: Vec<u8> = (0..300u32).map(|i| (i * 7 + i / 5) as u8).collect();
        for split in [0, 1, 7, 8, 9, 63, 64, 299, 300] {
            let parts: [&[u8]; 2] = [&bytes[..split], &bytes[split..]];
            assert_eq!(crc32c(&parts), crc32c_table(&parts), "split at {split}");
            assert_eq!(crc32c(&parts), crc32c_table(&[&bytes]), "split at {split}");
        }
        assert_eq!(crc32c(&[]), crc32c_table(&[b""]));
    }

    #[test]
    fn round_trips() {
        let bytes = encode("vol-1", CodecId::JSON, br#"{"a":1}"#);
        let d = decode(&bytes).unwrap();
        assert_eq!(d.key, "vol-1");
        assert_eq!(d.codec, CodecId::JSON);
        assert_eq!(&bytes[d.payload_start..], br#"{"a":1}"#);
        let empty = encode("k", CodecId::PROST, b"");
        assert_eq!(decode(&empty).unwrap().payload_start, empty.len());
    }

    #[test]
    fn every_truncation_and_every_bit_flip_is_caught() {
        let bytes = encode("vol-1", CodecId::JSON, br#"{"capacity":1073741824}"#);
        for len in 0..bytes.len() {
            assert!(decode(&bytes[..len]).is_err(), "truncated to {len}");
        }
        let mut longer = bytes.clone();
        longer.push(b'\n');
        assert!(decode(&longer).is_err());
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[i] ^= 1 << bit;
                assert!(decode(&b).is_err(), "flip byte {i} bit {bit}");
            }
        }
    }

    #[test]
    fn reasons_name_the_problem_without_contents() {
        assert!(
            decode(b"garbage garbage garbage")
                .unwrap_err()
                .contains("magic")
        );
        assert!(decode(b"CSI").unwrap_err().contains("truncated"));
        let mut b = encode("k", CodecId::JSON, b"secret-value");
        b[20] ^= 1;
        let reason = decode(&b).unwrap_err();
        assert_eq!(reason, "checksum mismatch");
    }
}
