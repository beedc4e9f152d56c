//! Reading secrets per RPC from the YAML file csi-sanity's `--csi.secrets`
//! takes: a top-level key per request kind (`CreateVolumeSecret`,
//! `NodeStageVolumeSecret`, ... see [`secrets_file_key`]) holding a map of
//! string keys to string values. Only that two-level shape is read, which
//! is all the format has; no YAML library is needed for it.

use std::collections::HashMap;

use crate::config::{SecretKind, Secrets, from_secrets_file_key, secrets_file_key};

/// Why a secrets file could not be read. Values are never included: they
/// are the secrets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretsFileError {
    /// A top-level key that names no RPC with secrets.
    #[error(
        "line {line}: {key:?} is not a secrets key (expected one of {expected}, e.g. NodeStageVolumeSecret)"
    )]
    UnknownKind {
        /// 1-based line number.
        line: usize,
        /// The key as written.
        key: String,
        /// How many keys are known.
        expected: usize,
    },
    /// A line that is neither `Kind:` nor an indented `key: value`.
    #[error("line {line}: expected `Kind:` or an indented `key: value`")]
    Syntax {
        /// 1-based line number.
        line: usize,
    },
    /// An indented `key: value` before any `Kind:`.
    #[error("line {line}: `key: value` outside any `...Secret:` section")]
    Orphan {
        /// 1-based line number.
        line: usize,
    },
    /// A quoted key or value whose closing quote is missing.
    #[error("line {line}: unterminated quote")]
    Quote {
        /// 1-based line number.
        line: usize,
    },
}

impl Secrets {
    /// Parses a csi-sanity secrets file (see the module docs). Request kinds
    /// the file does not name get no secrets, as with csi-sanity.
    ///
    /// ```
    /// use csi_conformance::{SecretKind, Secrets};
    ///
    /// let s = Secrets::from_sanity_yaml(
    ///     "NodeStageVolumeSecret:\n  password: \"s3cret-value\"\nCreateVolumeSecret: {}\n",
    /// )
    /// .unwrap();
    /// assert_eq!(s.get(SecretKind::NodeStageVolume)["password"], "s3cret-value");
    /// assert!(s.get(SecretKind::CreateVolume).is_empty());
    /// assert!(s.get(SecretKind::DeleteVolume).is_empty());
    /// ```
    pub fn from_sanity_yaml(text: &str) -> Result<Self, SecretsFileError> {
        let mut entries: Vec<(SecretKind, HashMap<String, String>)> = Vec::new();
        for (n, raw) in text.lines().enumerate() {
            let line = n + 1;
            let body = raw.trim_end();
            let trimmed = body.trim_start();
            if trimmed.is_empty() || trimmed.starts_with('#') || trimmed == "---" {
                continue;
            }
            let indented = trimmed.len() != body.len();
            let (key, rest) = split_pair(trimmed, line)?;
            if indented {
                let Some((_, map)) = entries.last_mut() else {
                    return Err(SecretsFileError::Orphan { line });
                };
                map.insert(key, scalar(rest, line)?);
                continue;
            }
            let Some(kind) = from_secrets_file_key(&key) else {
                return Err(SecretsFileError::UnknownKind {
                    line,
                    expected: crate::config::secret_kinds().count(),
                    key,
                });
            };
            let rest = strip_comment(rest).trim();
            if !(rest.is_empty() || rest == "{}") {
                return Err(SecretsFileError::Syntax { line });
            }
            entries.push((kind, HashMap::new()));
        }
        let mut secrets = Secrets::none();
        for (kind, map) in entries {
            secrets.set(kind, map);
        }
        Ok(secrets)
    }

    /// Renders these secrets in the csi-sanity file format (values quoted),
    /// e.g. to hand the same secrets to csi-sanity.
    pub fn to_sanity_yaml(&self) -> String {
        let mut out = String::new();
        for kind in crate::config::secret_kinds() {
            let map = self.get(kind);
            if map.is_empty() {
                continue;
            }
            out.push_str(&secrets_file_key(kind));
            out.push_str(":\n");
            let mut pairs: Vec<_> = map.into_iter().collect();
            pairs.sort();
            for (k, v) in pairs {
                out.push_str(&format!("  {}: {}\n", quote(&k), quote(&v)));
            }
        }
        out
    }
}

/// Splits `key: rest` (the key may be quoted).
fn split_pair(s: &str, line: usize) -> Result<(String, &str), SecretsFileError> {
    if s.starts_with('"') || s.starts_with('\'') {
        let (key, used) = quoted(s, line)?;
        let rest = s[used..]
            .strip_prefix(':')
            .ok_or(SecretsFileError::Syntax { line })?;
        return Ok((key, rest));
    }
    let Some(i) = s.find(':') else {
        return Err(SecretsFileError::Syntax { line });
    };
    let rest = &s[i + 1..];
    if !(rest.is_empty() || rest.starts_with(' ')) {
        return Err(SecretsFileError::Syntax { line });
    }
    Ok((s[..i].trim().to_string(), rest))
}

/// A value: quoted (with YAML's escapes for `"` and `''` for `'`) or plain.
fn scalar(rest: &str, line: usize) -> Result<String, SecretsFileError> {
    let rest = rest.trim();
    if rest.starts_with('"') || rest.starts_with('\'') {
        let (value, used) = quoted(rest, line)?;
        let tail = rest[used..].trim();
        if !(tail.is_empty() || tail.starts_with('#')) {
            return Err(SecretsFileError::Syntax { line });
        }
        return Ok(value);
    }
    Ok(strip_comment(rest).trim().to_string())
}

/// A plain scalar ends at ` #`.
fn strip_comment(s: &str) -> &str {
    match s.find(" #") {
        Some(i) => &s[..i],
        None => s,
    }
}

/// The quoted string at the start of `s` and how many bytes it used.
fn quoted(s: &str, line: usize) -> Result<(String, usize), SecretsFileError> {
    let q = s.chars().next().unwrap_or('"');
    let mut out = String::new();
    let mut chars = s.char_indices().skip(1).peekable();
    while let Some((i, c)) = chars.next() {
        match (q, c) {
            ('\'', '\'') => {
                if matches!(chars.peek(), Some((_, '\''))) {
                    chars.next();
                    out.push('\'');
                } else {
                    return Ok((out, i + 1));
                }
            }
            ('"', '"') => return Ok((out, i + 1)),
            ('"', '\\') => match chars.next() {
                Some((_, 'n')) => out.push('\n'),
                Some((_, 't')) => out.push('\t'),
                Some((_, e)) => out.push(e),
                None => break,
            },
            _ => out.push(c),
        }
    }
    Err(SecretsFileError::Quote { line })
}

fn quote(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_csi_sanity_format() {
        let text = "# secrets for the suite\n\
            CreateVolumeSecret:\n  secretKey: secretval1 # a comment\n\
            NodeStageVolumeSecret:\n  \"user name\": 'it''s'\n  password: \"p#ss: \\\"x\\\"\"\n\
            ControllerValidateVolumeCapabilitiesSecret:\n  k: v\n\
            DeleteVolumeSecret: {}\n";
        let s = Secrets::from_sanity_yaml(text).unwrap();
        assert_eq!(s.get(SecretKind::CreateVolume)["secretKey"], "secretval1");
        let stage = s.get(SecretKind::NodeStageVolume);
        assert_eq!(stage["user name"], "it's");
        assert_eq!(stage["password"], "p#ss: \"x\"");
        assert_eq!(s.get(SecretKind::ValidateVolumeCapabilities)["k"], "v");
        assert!(s.get(SecretKind::DeleteVolume).is_empty());
        assert!(s.get(SecretKind::NodePublishVolume).is_empty());
    }

    #[test]
    fn round_trips_through_its_own_rendering() {
        let s = Secrets::with_marker("marker-value-123");
        assert_eq!(Secrets::from_sanity_yaml(&s.to_sanity_yaml()).unwrap(), s);
    }

    #[test]
    fn errors_name_the_line_and_never_the_value() {
        let e = Secrets::from_sanity_yaml("NodeStageSecret:\n  a: hunter22\n").unwrap_err();
        assert!(
            matches!(e, SecretsFileError::UnknownKind { line: 1, .. }),
            "{e}"
        );
        let e = Secrets::from_sanity_yaml("  a: hunter22\n").unwrap_err();
        assert_eq!(e, SecretsFileError::Orphan { line: 1 });
        let e = Secrets::from_sanity_yaml("CreateVolumeSecret:\n  hunter22\n").unwrap_err();
        assert_eq!(e, SecretsFileError::Syntax { line: 2 });
        let e = Secrets::from_sanity_yaml("CreateVolumeSecret:\n  a: \"hunter22\n").unwrap_err();
        assert_eq!(e, SecretsFileError::Quote { line: 2 });
        for e in [
            Secrets::from_sanity_yaml("CreateVolumeSecret: hunter22\n").unwrap_err(),
            Secrets::from_sanity_yaml("CreateVolumeSecret:\n  a: 'hunter22\n").unwrap_err(),
        ] {
            assert!(!e.to_string().contains("hunter22"), "{e}");
        }
    }
}
