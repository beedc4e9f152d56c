//! HPACK's static table (RFC 7541 Appendix A) and the decoder's dynamic
//! table (§2.3.2, §4).

use std::collections::VecDeque;

/// The static table: index 1 is the first entry.
pub(crate) const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// The static index of `name` (its first entry), if it has one.
pub(crate) fn static_name(name: &str) -> Option<usize> {
    STATIC.iter().position(|(n, _)| *n == name).map(|i| i + 1)
}

/// The static index of `name` with `value`, if the table has the pair:
/// `static_index(":method", "POST")` is `Some(3)`.
pub fn static_index(name: &str, value: &str) -> Option<usize> {
    STATIC
        .iter()
        .position(|&(n, v)| n == name && v == value)
        .map(|i| i + 1)
}

/// An entry's size: its name and value plus 32 (§4.1).
fn entry_size(name: &[u8], value: &[u8]) -> usize {
    name.len() + value.len() + 32
}

/// The entries a peer's encoder added, newest first.
#[derive(Debug)]
pub(crate) struct DynamicTable {
    entries: VecDeque<(Vec<u8>, Vec<u8>)>,
    size: usize,
    /// The size the encoder last set (at most `limit`).
    max: usize,
    /// What this end allows (SETTINGS_HEADER_TABLE_SIZE).
    limit: usize,
}

impl DynamicTable {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            entries: VecDeque::new(),
            size: 0,
            max: limit,
            limit,
        }
    }

    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// A size update from the encoder; `false` when it exceeds the limit.
    pub(crate) fn resize(&mut self, max: usize) -> bool {
        if max > self.limit {
            return false;
        }
        self.max = max;
        self.evict(0);
        true
    }

    /// Evicts the oldest entries until `room` more bytes fit.
    fn evict(&mut self, room: usize) {
        while self.size + room > self.max {
            match self.entries.pop_back() {
                Some((n, v)) => self.size -= entry_size(&n, &v),
                None => break,
            }
        }
    }

    /// Adds an entry; one larger than the table empties it (§4.4).
    pub(crate) fn insert(&mut self, name: Vec<u8>, value: Vec<u8>) {
        let size = entry_size(&name, &value);
        self.evict(size);
        if size <= self.max {
            self.size += size;
            self.entries.push_front((name, value));
        }
    }

    /// The entry at `index` (1-based over both tables).
    pub(crate) fn get(&self, index: usize) -> Option<(&[u8], &[u8])> {
        match index {
            0 => None,
            1..=61 => {
                let (n, v) = STATIC[index - 1];
                Some((n.as_bytes(), v.as_bytes()))
            }
            _ => self
                .entries
                .get(index - 62)
                .map(|(n, v)| (n.as_slice(), v.as_slice())),
        }
    }

    pub(crate) fn size(&self) -> usize {
        self.size
    }
}
