//! CSI endpoint addresses: `unix:///path/to/csi.sock` (the spec's only
//! required form) and, when a caller asks for it explicitly, `tcp://host:port`.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The environment variable the CO uses to tell a plugin where to listen.
pub const CSI_ENDPOINT_ENV: &str = "CSI_ENDPOINT";

/// Why an endpoint string was rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EndpointError {
    /// Neither `unix://` nor `tcp://`.
    #[error("endpoint {0:?} must start with unix:// (or tcp:// where TCP is enabled)")]
    UnknownScheme(String),
    /// A unix endpoint whose path is not absolute.
    #[error("unix endpoint path {0:?} must be absolute")]
    RelativePath(String),
    /// The spec: "all UNIX endpoints SHALL end with .sock".
    #[error("unix endpoint path {0:?} must end with .sock")]
    NotDotSock(String),
    /// A `tcp://` address that does not parse as `host:port`.
    #[error("tcp endpoint {0:?} is not an ip:port address")]
    BadTcpAddress(String),
    /// `CSI_ENDPOINT` is unset and no endpoint was given.
    #[error("no endpoint given and {CSI_ENDPOINT_ENV} is not set")]
    Missing,
}

/// A parsed CSI endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A unix domain socket path.
    Unix(PathBuf),
    /// A TCP address; only served when the server is told to allow TCP.
    Tcp(SocketAddr),
}

impl Endpoint {
    /// Reads and parses `CSI_ENDPOINT`.
    pub fn from_env() -> Result<Self, EndpointError> {
        std::env::var(CSI_ENDPOINT_ENV)
            .map_err(|_| EndpointError::Missing)?
            .parse()
    }

    /// A unix endpoint for `path`, validated like a parsed one.
    pub fn unix(path: impl AsRef<Path>) -> Result<Self, EndpointError> {
        let path = path.as_ref();
        let text = path.to_string_lossy().into_owned();
        if !path.is_absolute() {
            return Err(EndpointError::RelativePath(text));
        }
        if path.extension().is_none_or(|e| e != "sock") {
            return Err(EndpointError::NotDotSock(text));
        }
        Ok(Self::Unix(path.to_owned()))
    }

    /// The socket path of a unix endpoint.
    pub fn unix_path(&self) -> Option<&Path> {
        match self {
            Self::Unix(p) => Some(p),
            Self::Tcp(_) => None,
        }
    }

    /// The URI tonic connects to (`unix:/path` or `http://ip:port`).
    pub fn connect_uri(&self) -> String {
        match self {
            Self::Unix(p) => format!("unix:{}", p.display()),
            Self::Tcp(a) => format!("http://{a}"),
        }
    }
}

impl FromStr for Endpoint {
    type Err = EndpointError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(rest) = s.strip_prefix("unix://") {
            // unix:///abs/path → "/abs/path"; unix://relative is not allowed.
            Self::unix(rest)
        } else if let Some(rest) = s.strip_prefix("unix:") {
            Self::unix(rest)
        } else if let Some(rest) = s.strip_prefix("tcp://") {
            rest.parse()
                .map(Self::Tcp)
                .map_err(|_| EndpointError::BadTcpAddress(s.to_owned()))
        } else {
            Err(EndpointError::UnknownScheme(s.to_owned()))
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unix(p) => write!(f, "unix://{}", p.display()),
            Self::Tcp(a) => write!(f, "tcp://{a}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_spec_forms() {
        assert_eq!(
            "unix:///run/csi/csi.sock".parse(),
            Ok(Endpoint::Unix("/run/csi/csi.sock".into()))
        );
        assert_eq!(
            "unix:/run/csi.sock".parse(),
            Ok(Endpoint::Unix("/run/csi.sock".into()))
        );
        assert_eq!(
            "tcp://127.0.0.1:10000".parse(),
            Ok(Endpoint::Tcp("127.0.0.1:10000".parse().unwrap()))
        );
        let e: Endpoint = "unix:///a/b.sock".parse().unwrap();
        assert_eq!(e.to_string(), "unix:///a/b.sock");
        assert_eq!(e.connect_uri(), "unix:/a/b.sock");
    }

    #[test]
    fn rejects_what_the_spec_forbids() {
        assert!(matches!(
            "unix://rel/csi.sock".parse::<Endpoint>(),
            Err(EndpointError::RelativePath(_))
        ));
        assert!(matches!(
            "unix:///run/csi".parse::<Endpoint>(),
            Err(EndpointError::NotDotSock(_))
        ));
        assert!(matches!(
            "http://x".parse::<Endpoint>(),
            Err(EndpointError::UnknownScheme(_))
        ));
        assert!(matches!(
            "tcp://nohost".parse::<Endpoint>(),
            Err(EndpointError::BadTcpAddress(_))
        ));
    }
}
