//! Table names, record keys and the file names they become.
//!
//! A key is any non-empty UTF-8 string up to [`MAX_KEY_LEN`] bytes. Its file
//! name is one of three forms, chosen by the key alone so each key has
//! exactly one name:
//!
//! - the key itself, when it is short and made of `[A-Za-z0-9_.-]` without a
//!   leading `.` or `-` (volume ids stay readable with `ls`);
//! - `~` and the key in unpadded base64url, when it is short enough;
//! - `#` and the SHA-256 of the key in hex otherwise (the record file holds
//!   the full key, which is checked on every read).
//!
//! None of the forms can contain `/` or NUL, be `.` or `..`, or start with
//! `.` (temporary files do), so no key can name a path outside its table.

use crate::error::StoreError;

/// The longest key, in bytes.
pub const MAX_KEY_LEN: usize = 4096;
/// The longest table name, in bytes.
pub const MAX_TABLE_LEN: usize = 64;

/// Keys up to this long can be their own file name.
const MAX_PLAIN: usize = 200;
/// Keys up to this long are base64url-encoded (240 characters); longer
/// ones are hashed, so every name fits in NAME_MAX (255).
const MAX_ENCODED: usize = 180;

/// Checks a table name: 1 to 64 of `[a-z0-9_-]`, starting with a letter or
/// digit.
pub fn check_table(name: &str) -> Result<(), StoreError> {
    let invalid = |reason: &'static str| {
        Err(StoreError::InvalidTable {
            name: shorten(name),
            reason,
        })
    };
    if name.is_empty() {
        return invalid("empty");
    }
    if name.len() > MAX_TABLE_LEN {
        return invalid("longer than 64 bytes");
    }
    if !name.as_bytes()[0].is_ascii_alphanumeric() {
        return invalid("must start with a lowercase letter or digit");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
    {
        return invalid("only a-z, 0-9, '_' and '-' are allowed");
    }
    Ok(())
}

/// Checks a record key: non-empty and at most [`MAX_KEY_LEN`] bytes.
pub fn check_key(key: &str) -> Result<(), StoreError> {
    let invalid = |reason: &'static str| {
        Err(StoreError::InvalidKey {
            key: shorten(key),
            reason,
        })
    };
    if key.is_empty() {
        return invalid("empty");
    }
    if key.len() > MAX_KEY_LEN {
        return invalid("longer than 4096 bytes");
    }
    Ok(())
}

/// A key (or name) cut to 64 characters for error messages.
pub(crate) fn shorten(s: &str) -> String {
    match s.char_indices().nth(64) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

fn is_plain(key: &str) -> bool {
    let b = key.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_PLAIN
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

/// The file name of a checked key.
pub(crate) fn file_name(key: &str) -> String {
    if is_plain(key) {
        key.to_owned()
    } else if key.len() <= MAX_ENCODED {
        let mut name = String::with_capacity(1 + key.len().div_ceil(3) * 4);
        name.push('~');
        base64url_encode(key.as_bytes(), &mut name);
        name
    } else {
        let mut name = String::with_capacity(65);
        name.push('#');
        for b in sha256(key.as_bytes()) {
            name.push_str(&format!("{b:02x}"));
        }
        name
    }
}

/// What a file name in a table directory says about its key.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum NameKind {
    /// The key the name encodes (still to be checked against the header).
    Key(String),
    /// A hashed name: only the record's header knows the key.
    Hashed,
    /// A temporary file of an unfinished write.
    Temporary,
    /// Not a name this store writes.
    Foreign,
}

/// Prefix of temporary files.
pub(crate) const TMP_PREFIX: &str = ".tmp-";

/// Classifies a file name found in a table directory. A decoded key is
/// returned only when encoding it again gives the same name, so a key has
/// exactly one valid file.
pub(crate) fn classify(name: &str) -> NameKind {
    if name.starts_with(TMP_PREFIX) {
        return NameKind::Temporary;
    }
    let decoded = if let Some(enc) = name.strip_prefix('~') {
        base64url_decode(enc).and_then(|b| String::from_utf8(b).ok())
    } else if let Some(hex) = name.strip_prefix('#') {
        let ok = hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        return if ok {
            NameKind::Hashed
        } else {
            NameKind::Foreign
        };
    } else {
        Some(name.to_owned())
    };
    match decoded {
        Some(key) if check_key(&key).is_ok() && file_name(&key) == name => NameKind::Key(key),
        _ => NameKind::Foreign,
    }
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn base64url_encode(data: &[u8], out: &mut String) {
    for chunk in data.chunks(3) {
        let n =
            chunk.iter().fold(0u32, |acc, &b| (acc << 8) | u32::from(b)) << (8 * (3 - chunk.len()));
        for i in 0..=chunk.len() {
            out.push(B64[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
}

fn base64url_decode(s: &str) -> Option<Vec<u8>> {
    let value = |c: u8| B64.iter().position(|&x| x == c).map(|v| v as u32);
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    for chunk in s.as_bytes().chunks(4) {
        if chunk.len() == 1 {
            return None;
        }
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= value(c)? << (18 - 6 * i);
        }
        let bytes = chunk.len() - 1;
        // Bits below the last byte must be zero, or two names would decode
        // to the same key.
        if n & ((1 << (8 * (3 - bytes))) - 1) != 0 {
            return None;
        }
        out.extend_from_slice(&n.to_be_bytes()[1..=bytes]);
    }
    Some(out)
}

/// SHA-256 (FIPS 180-4), used only to name files of long keys.
pub(crate) fn sha256(data: &[u8]) -> [u8; 32] {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];
    let mut msg = data.to_vec();
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&((data.len() as u64) * 8).to_be_bytes());
    for block in msg.chunks_exact(64) {
        let mut w = [0u32; 64];
        for (i, word) in block.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16]
                .wrapping_add(s0)
                .wrapping_add(w[i - 7])
                .wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[i])
                .wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            hh = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b;
            b = a;
            a = t1.wrapping_add(t2);
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 32];
    for (i, word) in h.iter().enumerate() {
        out[4 * i..4 * i + 4].copy_from_slice(&word.to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn sha256_matches_the_standard_vectors() {
        assert_eq!(
            hex(&sha256(b"")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            hex(&sha256(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            hex(&sha256(
                b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"
            )),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
    }

    #[test]
    fn base64url_round_trips_and_rejects_non_canonical_text() {
        for data in [&b""[..], b"f", b"fo", b"foo", b"foob", b"fooba", b"foobar"] {
            let mut s = String::new();
            base64url_encode(data, &mut s);
            assert_eq!(base64url_decode(&s).as_deref(), Some(data), "{s}");
        }
        let mut s = String::new();
        base64url_encode(b"foobar", &mut s);
        assert_eq!(s, "Zm9vYmFy");
        // "Zm9" is "fo"; "Zm9=" style padding and stray low bits are refused.
        assert_eq!(base64url_decode("Zm8").as_deref(), Some(&b"fo"[..]));
        assert_eq!(base64url_decode("Zm9"), None);
        assert_eq!(base64url_decode("Z"), None);
        assert_eq!(base64url_decode("Zm8="), None);
        assert_eq!(base64url_decode("a/b+"), None);
    }

    #[test]
    fn plain_keys_keep_their_name() {
        for key in ["vol-0123abcd", "snap_1", "a", "A.b-c_d", "0"] {
            assert_eq!(file_name(key), key);
            assert_eq!(classify(key), NameKind::Key(key.to_owned()));
        }
    }

    #[test]
    fn no_key_becomes_a_path_outside_its_table() {
        let long = "x/".repeat(1000);
        let keys = [
            "..",
            ".",
            "../../etc/passwd",
            "/etc/passwd",
            "a/b",
            "a\0b",
            ".tmp-1-2",
            ".hidden",
            "-rf",
            "~x",
            "#abc",
            "with space",
            "ünïcödé",
            "/var/lib/kubelet/pods/3f1c/volumes/kubernetes.io~csi/pvc-1/mount",
            &long,
        ];
        for key in keys {
            check_key(key).unwrap();
            let name = file_name(key);
            assert!(
                !name.contains('/') && !name.contains('\0'),
                "{key:?} -> {name}"
            );
            assert!(
                name != "." && name != ".." && !name.starts_with('.'),
                "{key:?}"
            );
            assert!(name.len() <= 255, "{key:?} -> {} bytes", name.len());
            match classify(&name) {
                NameKind::Key(k) => assert_eq!(k, key),
                NameKind::Hashed => assert!(key.len() > MAX_ENCODED, "{key:?}"),
                other => panic!("{key:?} -> {name} classified as {other:?}"),
            }
        }
    }

    #[test]
    fn every_length_and_byte_round_trips() {
        let mut s = String::new();
        for i in 0..400u32 {
            s.push(char::from_u32(0x20 + (i * 7919) % 0x2000).unwrap_or('x'));
            let key = &s;
            if key.len() > MAX_KEY_LEN {
                break;
            }
            let name = file_name(key);
            assert!(name.len() <= 255);
            match classify(&name) {
                NameKind::Key(k) => assert_eq!(&k, key),
                NameKind::Hashed => assert!(key.len() > MAX_ENCODED),
                other => panic!("{name}: {other:?}"),
            }
        }
    }

    #[test]
    fn non_canonical_and_foreign_names_are_not_keys() {
        // "abc" is plain, so its encoded form is not a valid name for it.
        let mut enc = String::from("~");
        base64url_encode(b"abc", &mut enc);
        assert_eq!(classify(&enc), NameKind::Foreign);
        assert_eq!(classify(".tmp-12-3"), NameKind::Temporary);
        assert_eq!(classify("-x"), NameKind::Foreign);
        assert_eq!(classify("a b"), NameKind::Foreign);
        assert_eq!(classify("#zz"), NameKind::Foreign);
        assert_eq!(classify(&format!("#{}", "a".repeat(64))), NameKind::Hashed);
        assert_eq!(classify("~"), NameKind::Foreign, "empty key");
    }

    #[test]
    fn bad_keys_and_tables_are_refused_with_a_reason() {
        assert!(matches!(
            check_key(""),
            Err(StoreError::InvalidKey {
                reason: "empty",
                ..
            })
        ));
        let err = check_key(&"k".repeat(MAX_KEY_LEN + 1)).unwrap_err();
        assert!(err.to_string().contains("longer than 4096"), "{err}");
        assert!(
            err.to_string().len() < 200,
            "long keys are shortened: {err}"
        );
        for bad in ["", "Volumes", "a/b", "..", "-x", "_x", &"t".repeat(65)] {
            assert!(check_table(bad).is_err(), "{bad:?}");
        }
        for good in ["volumes", "node-staged", "v2", "a_b"] {
            check_table(good).unwrap();
        }
    }
}
