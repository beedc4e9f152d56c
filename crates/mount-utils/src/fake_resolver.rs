//! [`FakeResolver`]: host names from a table, for tests.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::Mutex;

use crate::servers::Resolver;

/// A [`Resolver`] answering from a table; an unknown host is "not found".
/// Records every look-up.
///
/// ```
/// use mount_utils::{FakeResolver, Resolver};
/// let dns = FakeResolver::new();
/// dns.add("files.example", &["10.0.0.7"]);
/// assert_eq!(dns.lookup("files.example").unwrap()[0].to_string(), "10.0.0.7");
/// assert!(dns.lookup("gone.example").is_err());
/// assert_eq!(dns.lookups(), ["files.example", "gone.example"]);
/// ```
#[derive(Debug, Default)]
pub struct FakeResolver {
    hosts: Mutex<HashMap<String, Vec<IpAddr>>>,
    lookups: Mutex<Vec<String>>,
}

impl FakeResolver {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// `host` resolves to `addresses`, best first.
    ///
    /// # Panics
    /// If an address does not parse: a test's typo.
    pub fn add(&self, host: &str, addresses: &[&str]) {
        let parsed = addresses.iter().map(|a| a.parse().expect("an IP address"));
        let mut hosts = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
        hosts.insert(host.to_owned(), parsed.collect());
    }

    /// The hosts looked up so far, in order.
    pub fn lookups(&self) -> Vec<String> {
        self.lookups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Resolver for FakeResolver {
    fn lookup(&self, host: &str) -> io::Result<Vec<IpAddr>> {
        let mut lookups = self.lookups.lock().unwrap_or_else(|e| e.into_inner());
        lookups.push(host.to_owned());
        let hosts = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
        hosts.get(host).cloned().ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, "no such host in the fake's table")
        })
    }
}
