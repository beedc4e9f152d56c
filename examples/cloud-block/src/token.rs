//! The bearer token shared by the provider and its clients.

use std::path::Path;

/// A bearer token. `Debug` and `Display` never show it; only
/// [`expose`](Token::expose) does, for the one header that carries it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

/// Where the provider and the driver's controller find the token in the
/// environment.
pub const TOKEN_ENV: &str = "CLOUD_PROVIDER_TOKEN";

/// Why no token could be had.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// No flag, environment variable or file gave one.
    #[error("no provider token: pass --token, set {env}, or pass --token-file")]
    Missing {
        /// The environment variable that was looked at.
        env: &'static str,
    },
    /// The token file could not be read.
    #[error("reading token file {path}: {source}")]
    File {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The token is empty or holds characters a header cannot carry.
    #[error("the provider token from {from} is empty or not printable ASCII")]
    Malformed {
        /// Where it came from (flag, environment, or the file's path).
        from: String,
    },
}

impl Token {
    /// A token from a string (surrounding whitespace, such as the newline at
    /// the end of a Secret's file, is dropped).
    pub fn new(token: &str, from: &str) -> Result<Self, TokenError> {
        let token = token.trim();
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(TokenError::Malformed { from: from.into() });
        }
        Ok(Token(token.to_owned()))
    }

    /// The token from the first source that has one: the flag's value (which
    /// clap may have filled from the environment), then a file such as a
    /// mounted Secret.
    pub fn resolve(
        value: Option<&str>,
        file: Option<&Path>,
        env: &'static str,
    ) -> Result<Self, TokenError> {
        if let Some(v) = value {
            return Token::new(v, "--token or the environment");
        }
        if let Some(path) = file {
            let text = std::fs::read_to_string(path).map_err(|source| TokenError::File {
                path: path.to_owned(),
                source,
            })?;
            return Token::new(&text, &path.display().to_string());
        }
        Err(TokenError::Missing { env })
    }

    /// The secret itself: only for the `Authorization` header.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Compares with a presented token in time independent of where they differ.
    pub fn matches(&self, presented: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), presented.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_the_token_and_files_are_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "s3cret\n").unwrap();
        let t = Token::resolve(None, Some(&file), "X").unwrap();
        assert_eq!(t.expose(), "s3cret");
        assert!(!format!("{t:?}").contains("s3cret"));
        assert!(t.matches("s3cret") && !t.matches("s3cre") && !t.matches("s3creT"));
        assert!(matches!(
            Token::resolve(None, None, "X"),
            Err(TokenError::Missing { .. })
        ));
        let e = Token::new("a b", "flag").unwrap_err().to_string();
        assert!(!e.contains("a b"), "{e}");
    }
}
