//! HPACK, HTTP/2's header compression (RFC 7541).
//!
//! [`Decoder`] reads every representation a peer may send: indexed fields,
//! literals with or without indexing or never indexed, dynamic table size
//! updates, and Huffman-coded or plain strings. The encoder functions write
//! what this crate sends: static indexes and literals that are never added
//! to the peer's dynamic table, so the encoder keeps no state and never has
//! to follow a peer's SETTINGS_HEADER_TABLE_SIZE.

mod huffman;
mod table;

use table::DynamicTable;
pub use table::static_index;
use table::static_name;

/// Why a header block could not be decoded. Each is a connection error of
/// type COMPRESSION_ERROR (RFC 7540 §4.3), except [`HpackError::ListTooLarge`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HpackError {
    /// The block ends inside a representation.
    #[error("a header block ends inside a field")]
    Truncated,
    /// An integer is larger than any index or length this decoder accepts.
    #[error("an integer in a header block is too large")]
    IntegerOverflow,
    /// An index names no entry of either table.
    #[error("header index {0} names no entry")]
    BadIndex(usize),
    /// A Huffman-coded string is malformed (bad padding or an EOS symbol).
    #[error("a Huffman-coded string is malformed")]
    Huffman,
    /// A dynamic table size update above the limit this end announced, or
    /// one after the block's first field.
    #[error("a dynamic table size update of {0} is not allowed here")]
    BadSizeUpdate(usize),
    /// The decoded fields exceed the header list size limit.
    #[error("the header list is larger than {0} bytes")]
    ListTooLarge(usize),
}

/// One decoded header field, as bytes: the caller checks what a name or
/// value may hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// The name (lower case on the wire in HTTP/2).
    pub name: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
}

/// The largest integer accepted: far above any index, length or table size
/// a unary call needs, and small enough that sums of them cannot overflow.
const MAX_INTEGER: usize = 1 << 24;

/// Appends `value` with an `n`-bit prefix; `flags` fills the first byte's
/// other bits (§5.1).
pub(crate) fn encode_integer(value: usize, n: u32, flags: u8, out: &mut Vec<u8>) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | max as u8);
    let mut rest = value - max;
    while rest >= 128 {
        out.push((rest % 128) as u8 | 0x80);
        rest /= 128;
    }
    out.push(rest as u8);
}

/// Reads an integer with an `n`-bit prefix at `*at`, moving `*at` past it.
fn decode_integer(block: &[u8], at: &mut usize, n: u32) -> Result<usize, HpackError> {
    let max = (1usize << n) - 1;
    let first = *block.get(*at).ok_or(HpackError::Truncated)?;
    *at += 1;
    let mut value = usize::from(first) & max;
    if value < max {
        return Ok(value);
    }
    let mut shift = 0;
    loop {
        let byte = *block.get(*at).ok_or(HpackError::Truncated)?;
        *at += 1;
        value += usize::from(byte & 0x7f) << shift;
        if value > MAX_INTEGER {
            return Err(HpackError::IntegerOverflow);
        }
        if byte & 0x80 == 0 {
            return Ok(value);
        }
        shift += 7;
    }
}

/// Appends a string literal, Huffman-coded when that is shorter (§5.2).
pub(crate) fn encode_string(value: &[u8], out: &mut Vec<u8>) {
    let coded = huffman::encoded_len(value);
    if coded < value.len() {
        encode_integer(coded, 7, 0x80, out);
        huffman::encode(value, out);
    } else {
        encode_integer(value.len(), 7, 0, out);
        out.extend_from_slice(value);
    }
}

fn decode_string(block: &[u8], at: &mut usize) -> Result<Vec<u8>, HpackError> {
    let huffman = block.get(*at).ok_or(HpackError::Truncated)? & 0x80 != 0;
    let len = decode_integer(block, at, 7)?;
    let end = at.checked_add(len).ok_or(HpackError::Truncated)?;
    let raw = block.get(*at..end).ok_or(HpackError::Truncated)?;
    *at = end;
    if huffman {
        let mut out = Vec::with_capacity(len + len / 2);
        huffman::decode(raw, &mut out)?;
        Ok(out)
    } else {
        Ok(raw.to_vec())
    }
}

/// Appends the field at static `index` (§6.1); see [`static_index`].
pub fn encode_indexed(index: usize, out: &mut Vec<u8>) {
    encode_integer(index, 7, 0x80, out);
}

/// Appends a literal field the peer must not add to its dynamic table:
/// "without indexing" (§6.2.2), or "never indexed" (§6.2.3) when
/// `sensitive`, which also asks intermediaries not to index it. The name is
/// a static index when the table has it.
pub fn encode_literal(name: &str, value: &[u8], sensitive: bool, out: &mut Vec<u8>) {
    let flags = if sensitive { 0x10 } else { 0x00 };
    match static_name(name) {
        Some(index) => encode_integer(index, 4, flags, out),
        None => {
            out.push(flags);
            encode_string(name.as_bytes(), out);
        }
    }
    encode_string(value, out);
}

/// Decodes header blocks of one connection (its dynamic table persists
/// from block to block).
#[derive(Debug)]
pub struct Decoder {
    table: DynamicTable,
}

impl Decoder {
    /// A decoder whose dynamic table may grow to `table_limit` bytes: the
    /// SETTINGS_HEADER_TABLE_SIZE this end announces (4,096 by default).
    pub fn new(table_limit: usize) -> Self {
        Self {
            table: DynamicTable::new(table_limit),
        }
    }

    /// The fields of one complete header block (HEADERS plus any
    /// CONTINUATION payloads), in order. Fails when their size (names and
    /// values plus 32 each, RFC 7540 §6.5.2) exceeds `list_limit`; the
    /// dynamic table is still updated then, so the connection stays usable.
    pub fn decode(&mut self, block: &[u8], list_limit: usize) -> Result<Vec<Field>, HpackError> {
        let mut fields = Vec::new();
        let mut list_size = 0usize;
        let mut too_large = false;
        let mut any_field = false;
        let mut at = 0;
        while at < block.len() {
            let first = block[at];
            let field = if first & 0x80 != 0 {
                let index = decode_integer(block, &mut at, 7)?;
                let (n, v) = self.table.get(index).ok_or(HpackError::BadIndex(index))?;
                (n.to_vec(), v.to_vec())
            } else if first & 0xe0 == 0x20 {
                let size = decode_integer(block, &mut at, 5)?;
                if any_field || !self.table.resize(size) {
                    return Err(HpackError::BadSizeUpdate(size));
                }
                continue;
            } else {
                // 01: with incremental indexing; 0000 and 0001: not indexed.
                let indexing = first & 0x40 != 0;
                let prefix = if indexing { 6 } else { 4 };
                let index = decode_integer(block, &mut at, prefix)?;
                let name = if index == 0 {
                    decode_string(block, &mut at)?
                } else {
                    let (n, _) = self.table.get(index).ok_or(HpackError::BadIndex(index))?;
                    n.to_vec()
                };
                let value = decode_string(block, &mut at)?;
                if indexing {
                    self.table.insert(name.clone(), value.clone());
                }
                (name, value)
            };
            any_field = true;
            list_size += field.0.len() + field.1.len() + 32;
            if list_size > list_limit {
                too_large = true;
            }
            if !too_large {
                fields.push(Field {
                    name: field.0,
                    value: field.1,
                });
            }
        }
        if too_large {
            return Err(HpackError::ListTooLarge(list_limit));
        }
        Ok(fields)
    }

    /// The bytes the dynamic table holds now (entries plus 32 each).
    pub fn table_size(&self) -> usize {
        self.table.size()
    }

    /// The table size limit this decoder was made with.
    pub fn table_limit(&self) -> usize {
        self.table.limit()
    }
}

#[cfg(test)]
mod tests;
