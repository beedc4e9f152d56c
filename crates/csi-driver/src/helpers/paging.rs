//! ListVolumes/ListSnapshots paging: a sorted list plus `max_entries` and
//! `starting_token` in, one page and `next_token` out.

use crate::error::CsiError;

/// One page of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    /// The entries of this page.
    pub entries: Vec<T>,
    /// Where the next page starts; empty when this is the last page.
    pub next_token: String,
}

/// Pages `items` (already sorted in a stable order). The token is the index
/// of the next entry; a token that is not a number within the list is
/// ABORTED (the spec's code for an invalid `starting_token`), a negative
/// `max_entries` INVALID_ARGUMENT. `max_entries == 0` means no limit.
pub fn paginate<T>(
    items: Vec<T>,
    max_entries: i32,
    starting_token: &str,
) -> Result<Page<T>, CsiError> {
    if max_entries < 0 {
        return Err(CsiError::invalid("max_entries", "must not be negative"));
    }
    let start = if starting_token.is_empty() {
        0
    } else {
        match starting_token.parse::<usize>() {
            Ok(i) if i <= items.len() && starting_token == i.to_string() => i,
            _ => {
                return Err(CsiError::Aborted(format!(
                    "starting_token {starting_token:?} is not valid"
                )));
            }
        }
    };
    let end = match max_entries {
        0 => items.len(),
        n => items.len().min(start.saturating_add(n as usize)),
    };
    let next_token = if end < items.len() {
        end.to_string()
    } else {
        String::new()
    };
    let entries = items.into_iter().skip(start).take(end - start).collect();
    Ok(Page {
        entries,
        next_token,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn pages_walk_the_whole_list_exactly_once() {
        let items: Vec<u32> = (0..7).collect();
        let mut seen = Vec::new();
        let mut token = String::new();
        loop {
            let page = paginate(items.clone(), 3, &token).unwrap();
            assert!(page.entries.len() <= 3);
            seen.extend(page.entries);
            if page.next_token.is_empty() {
                break;
            }
            token = page.next_token;
        }
        assert_eq!(seen, items);
    }

    #[test]
    fn table() {
        let items = || vec!['a', 'b', 'c'];
        let ok = |max, token: &str| paginate(items(), max, token).unwrap();
        assert_eq!(
            ok(0, ""),
            Page {
                entries: vec!['a', 'b', 'c'],
                next_token: String::new()
            }
        );
        assert_eq!(
            ok(2, ""),
            Page {
                entries: vec!['a', 'b'],
                next_token: "2".into()
            }
        );
        assert_eq!(
            ok(2, "2"),
            Page {
                entries: vec!['c'],
                next_token: String::new()
            }
        );
        assert_eq!(
            ok(5, "3"),
            Page {
                entries: vec![],
                next_token: String::new()
            }
        );
        assert_eq!(ok(i32::MAX, "1").entries, vec!['b', 'c']);
        for bad in ["4", "x", "-1", "01", " 1"] {
            assert_eq!(
                paginate(items(), 1, bad).unwrap_err().code(),
                Code::Aborted,
                "{bad}"
            );
        }
        assert_eq!(
            paginate(items(), -1, "").unwrap_err().code(),
            Code::InvalidArgument
        );
    }
}
