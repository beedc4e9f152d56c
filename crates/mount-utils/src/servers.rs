//! Server addresses for network filesystems mounted with mount(2) itself.
//!
//! A mount helper (`mount.nfs`, `mount.cifs`, `mount.ceph`) looks the
//! server's host name up before it calls mount(2): the kernel takes only
//! addresses. NFS needs `addr=`, and `mountaddr=` for a `mounthost=`; SMB
//! needs `ip=` unless the share's host is an address; the Ceph kernel
//! client takes monitors as addresses. [`resolve_servers`] does that
//! look-up, through a [`Resolver`], so a driver that mounts without a
//! helper (no secret on a command line, no helper on the node) gives the
//! source as a user would write it. NFSv4's `clientaddr=` is left out: the
//! kernel finds its callback address itself when it is absent.

use std::collections::HashSet;
use std::io;
use std::net::{IpAddr, ToSocketAddrs};

use crate::options::has_option;

/// Looks a host name up. The seam of [`resolve_servers`]: [`SystemResolver`]
/// on a node, `FakeResolver` (the `testing` feature) in tests.
pub trait Resolver: Send + Sync {
    /// The addresses of `host`, best first; never called with an address.
    fn lookup(&self, host: &str) -> io::Result<Vec<IpAddr>>;
}

/// The C library's resolver (`getaddrinfo(3)`: `/etc/hosts`, DNS, in the
/// order `/etc/gai.conf` and RFC 6724 give), as the mount helpers use.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolver for SystemResolver {
    fn lookup(&self, host: &str) -> io::Result<Vec<IpAddr>> {
        let mut seen = HashSet::new();
        let found = (host, 0).to_socket_addrs()?.map(|a| a.ip());
        Ok(found.filter(|ip| seen.insert(*ip)).collect())
    }
}

/// A network filesystem's mount as the kernel takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerMount {
    /// The source to pass to mount(2): as given, or for Ceph with each
    /// monitor's host replaced by its addresses.
    pub source: String,
    /// Options to add to the caller's (`addr=…`, `ip=…`, `mountaddr=…`,
    /// `mon_addr=…`); empty when nothing was looked up.
    pub options: Vec<String>,
}

/// Why [`resolve_servers`] could not name a server by address. Messages hold
/// the filesystem type, the source (which names no secret: secrets are
/// options) and the host, never an option.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServerError {
    /// The source does not have the form its filesystem type needs.
    #[error("the {fs_type} source {source_text:?} names no server (expected {expected})")]
    Malformed {
        /// The filesystem type.
        fs_type: String,
        /// The source as given.
        source_text: String,
        /// The form the type needs, e.g. `server:/path`.
        expected: &'static str,
    },
    /// A host name did not resolve, or resolved to nothing.
    #[error("looking up the {fs_type} server {host:?}: {reason}")]
    Lookup {
        /// The filesystem type.
        fs_type: String,
        /// The host that was looked up.
        host: String,
        /// The resolver's answer.
        reason: String,
    },
}

/// The mount(2) source and the extra options that name `fs_type`'s servers
/// by address, as its mount helper would pass them; `options` are the
/// mount's options that are not secret (an address given there is kept,
/// and nothing is looked up for it). Types other than `nfs`, `nfs4`,
/// `cifs`, `smb3` and `ceph` come back unchanged.
///
/// ```
/// use mount_utils::{FakeResolver, resolve_servers};
///
/// let dns = FakeResolver::new();
/// dns.add("files.example", &["10.0.0.7"]);
/// let nfs = resolve_servers("nfs", "files.example:/export/v1", &["vers=4.2"], &dns).unwrap();
/// assert_eq!(nfs.source, "files.example:/export/v1");
/// assert_eq!(nfs.options, ["addr=10.0.0.7"]);
///
/// let smb = resolve_servers("cifs", "//files.example/share", &[], &dns).unwrap();
/// assert_eq!(smb.options, ["ip=10.0.0.7"]);
///
/// // Given by address already: nothing to look up.
/// let given = resolve_servers("nfs", "files.example:/export", &["addr=10.0.0.9"], &dns).unwrap();
/// assert!(given.options.is_empty());
/// ```
pub fn resolve_servers(
    fs_type: &str,
    source: &str,
    options: &[&str],
    resolver: &dyn Resolver,
) -> Result<ServerMount, ServerError> {
    let lookup = Lookup { fs_type, resolver };
    let unchanged = |options| ServerMount {
        source: source.to_owned(),
        options,
    };
    match fs_type {
        "nfs" | "nfs4" => {
            let mut added = Vec::new();
            if !has_option(options, &["addr"]) {
                let host = nfs_host(source).ok_or_else(|| lookup.malformed(source, NFS_FORM))?;
                added.push(format!("addr={}", lookup.first(host)?));
            }
            let mounthost = option_value(options, "mounthost");
            if let Some(host) = mounthost.filter(|_| !has_option(options, &["mountaddr"])) {
                added.push(format!("mountaddr={}", lookup.first(host)?));
            }
            Ok(unchanged(added))
        }
        "cifs" | "smb3" => {
            if has_option(options, &["ip", "addr"]) {
                return Ok(unchanged(Vec::new()));
            }
            let host = unc_host(source).ok_or_else(|| lookup.malformed(source, UNC_FORM))?;
            Ok(unchanged(vec![format!("ip={}", lookup.first(host)?)]))
        }
        "ceph" => ceph(source, options, &lookup),
        _ => Ok(unchanged(Vec::new())),
    }
}

const NFS_FORM: &str = "server:/path";
const UNC_FORM: &str = "//server/share";
const CEPH_FORM: &str = "monitor[:port][,monitor…]:/path, or name@fsid.fs=/path with mon_addr=";

struct Lookup<'a> {
    fs_type: &'a str,
    resolver: &'a dyn Resolver,
}

impl Lookup<'_> {
    /// Every address of `host` (itself when it is one).
    fn all(&self, host: &str) -> Result<Vec<IpAddr>, ServerError> {
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(vec![ip]);
        }
        let failed = |reason: String| ServerError::Lookup {
            fs_type: self.fs_type.to_owned(),
            host: host.to_owned(),
            reason,
        };
        let found = self
            .resolver
            .lookup(host)
            .map_err(|e| failed(e.to_string()))?;
        match found.is_empty() {
            true => Err(failed("no address".to_owned())),
            false => Ok(found),
        }
    }

    /// The best address of `host`, as text the kernel parses.
    fn first(&self, host: &str) -> Result<IpAddr, ServerError> {
        Ok(self.all(host)?[0])
    }

    fn malformed(&self, source: &str, expected: &'static str) -> ServerError {
        ServerError::Malformed {
            fs_type: self.fs_type.to_owned(),
            source_text: source.to_owned(),
            expected,
        }
    }
}

/// The value of the last `name=` in `options`.
fn option_value<'a>(options: &[&'a str], name: &str) -> Option<&'a str> {
    options
        .iter()
        .rev()
        .find_map(|o| o.split_once('=').filter(|(n, _)| *n == name))
        .map(|(_, v)| v)
}

/// The host of an NFS source `host:/path`, `[v6]:/path` unbracketed.
fn nfs_host(source: &str) -> Option<&str> {
    let (host, path) = match source.strip_prefix('[') {
        Some(rest) => {
            let (host, after) = rest.split_once(']')?;
            (host, after.strip_prefix(':')?)
        }
        None => source.split_once(':')?,
    };
    (!host.is_empty() && path.starts_with('/')).then_some(host)
}

/// The host of a UNC `//host/share…` (or with backslashes).
fn unc_host(source: &str) -> Option<&str> {
    let rest = source
        .strip_prefix("//")
        .or_else(|| source.strip_prefix("\\\\"))?;
    let (host, share) = rest.split_once(['/', '\\'])?;
    (!host.is_empty() && !share.is_empty()).then_some(host)
}

/// `host`, `host:port`, `[v6]` or `[v6]:port` as (host, ":port" or "").
fn split_port(monitor: &str) -> Option<(&str, &str)> {
    match monitor.strip_prefix('[') {
        Some(rest) => {
            let (host, port) = rest.split_once(']')?;
            (port.is_empty() || port.starts_with(':')).then_some((host, port))
        }
        // A bare IPv6 address has no port.
        None if monitor.parse::<IpAddr>().is_ok() => Some((monitor, "")),
        None => {
            let host = monitor.split(':').next().unwrap_or_default();
            Some((host, &monitor[host.len()..]))
        }
    }
    .filter(|(host, _)| !host.is_empty())
}

/// `monitors` (joined by `separator`) with every host replaced by all its
/// addresses, each with the monitor's port.
fn monitors_by_address(
    monitors: &str,
    separator: char,
    lookup: &Lookup<'_>,
    source: &str,
) -> Result<String, ServerError> {
    let mut out: Vec<String> = Vec::new();
    for monitor in monitors.split(separator) {
        let (host, port) =
            split_port(monitor).ok_or_else(|| lookup.malformed(source, CEPH_FORM))?;
        for ip in lookup.all(host)? {
            let addr = match ip {
                IpAddr::V6(v6) if !port.is_empty() => format!("[{v6}]{port}"),
                ip => format!("{ip}{port}"),
            };
            if !out.contains(&addr) {
                out.push(addr);
            }
        }
    }
    Ok(out.join(&separator.to_string()))
}

/// Ceph: monitors in the source (`mon1:6789,mon2:/path`), or in `mon_addr=`
/// (`a/b`) for the `name@fsid.fs=/path` form, by address.
fn ceph(source: &str, options: &[&str], lookup: &Lookup<'_>) -> Result<ServerMount, ServerError> {
    if source.contains('@') && source.contains("=/") {
        let mut added = Vec::new();
        if let Some(monitors) = option_value(options, "mon_addr") {
            let resolved = monitors_by_address(monitors, '/', lookup, source)?;
            if resolved != monitors {
                added.push(format!("mon_addr={resolved}"));
            }
        }
        return Ok(ServerMount {
            source: source.to_owned(),
            options: added,
        });
    }
    let (monitors, path) = source
        .split_once(":/")
        .filter(|(m, _)| !m.is_empty())
        .ok_or_else(|| lookup.malformed(source, CEPH_FORM))?;
    let monitors = monitors_by_address(monitors, ',', lookup, source)?;
    Ok(ServerMount {
        source: format!("{monitors}:/{path}"),
        options: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FakeResolver;

    fn dns() -> FakeResolver {
        let dns = FakeResolver::new();
        dns.add("files.example", &["10.0.0.7", "fd00::7"]);
        dns.add("mon-a", &["10.1.0.1"]);
        dns.add("mon-b", &["10.1.0.2", "fd00::2"]);
        dns
    }

    fn resolved(fs: &str, source: &str, options: &[&str]) -> ServerMount {
        resolve_servers(fs, source, options, &dns()).unwrap()
    }

    #[test]
    fn nfs_gets_the_servers_first_address_as_addr() {
        for fs in ["nfs", "nfs4"] {
            let m = resolved(fs, "files.example:/export/v1", &["vers=4.1"]);
            assert_eq!(m.source, "files.example:/export/v1");
            assert_eq!(m.options, ["addr=10.0.0.7"]);
        }
        let literal = resolved("nfs", "[fd00::9]:/export", &[]);
        assert_eq!(literal.options, ["addr=fd00::9"]);
        let v4 = resolved("nfs", "192.0.2.1:/export", &[]);
        assert_eq!(v4.options, ["addr=192.0.2.1"]);
    }

    #[test]
    fn nfs_mounthost_gets_a_mountaddr() {
        let m = resolved("nfs", "files.example:/e", &["vers=3", "mounthost=mon-a"]);
        assert_eq!(m.options, ["addr=10.0.0.7", "mountaddr=10.1.0.1"]);
        let given = resolved(
            "nfs",
            "files.example:/e",
            &["mounthost=mon-a", "mountaddr=1.2.3.4"],
        );
        assert_eq!(given.options, ["addr=10.0.0.7"]);
    }

    #[test]
    fn an_address_given_as_an_option_is_kept_and_nothing_is_looked_up() {
        let dns = dns();
        let m = resolve_servers("nfs", "nowhere:/e", &["addr=10.9.9.9"], &dns).unwrap();
        assert!(m.options.is_empty());
        let m = resolve_servers("cifs", "//nowhere/s", &["ip=10.9.9.9"], &dns).unwrap();
        assert!(m.options.is_empty());
        assert!(dns.lookups().is_empty());
    }

    #[test]
    fn smb_gets_ip_from_the_unc_host() {
        for source in ["//files.example/share/sub", "\\\\files.example\\share"] {
            for fs in ["cifs", "smb3"] {
                assert_eq!(resolved(fs, source, &[]).options, ["ip=10.0.0.7"]);
            }
        }
    }

    #[test]
    fn ceph_monitors_in_the_source_become_every_address_with_their_port() {
        let m = resolved("ceph", "mon-a:6789,mon-b:3300,192.0.2.5:/volumes/v1", &[]);
        assert_eq!(
            m.source,
            "10.1.0.1:6789,10.1.0.2:3300,[fd00::2]:3300,192.0.2.5:/volumes/v1"
        );
        assert!(m.options.is_empty());
        let bare = resolved("ceph", "mon-a,[fd00::5]:6789:/", &[]);
        assert_eq!(bare.source, "10.1.0.1,[fd00::5]:6789:/");
    }

    #[test]
    fn ceph_mon_addr_of_the_new_form_is_resolved() {
        let source = "admin@6b2c2ad8-fsid.cephfs=/volumes/v1";
        let m = resolved(
            "ceph",
            source,
            &["mon_addr=mon-a:3300/mon-b", "ms_mode=secure"],
        );
        assert_eq!(m.source, source);
        assert_eq!(m.options, ["mon_addr=10.1.0.1:3300/10.1.0.2/fd00::2"]);
        let by_address = resolved("ceph", source, &["mon_addr=10.1.0.1/10.1.0.2"]);
        assert!(by_address.options.is_empty());
    }

    #[test]
    fn other_types_are_unchanged() {
        for (fs, source) in [
            ("tmpfs", "none"),
            ("fuse.sshfs", "host:/x"),
            ("ext4", "/dev/sda"),
        ] {
            let m = resolved(fs, source, &["size=1g"]);
            assert_eq!((m.source.as_str(), m.options.len()), (source, 0));
        }
    }

    #[test]
    fn a_malformed_source_names_the_form_it_needs() {
        for (fs, source) in [
            ("nfs", "files.example"),
            ("nfs", ":/export"),
            ("nfs", "[fd00::1/export"),
            ("cifs", "files.example/share"),
            ("cifs", "//files.example"),
            ("ceph", "/volumes/v1"),
        ] {
            let e = resolve_servers(fs, source, &[], &dns()).unwrap_err();
            assert!(
                matches!(e, ServerError::Malformed { .. }),
                "{fs} {source}: {e}"
            );
            assert!(e.to_string().contains(source), "{e}");
        }
    }

    #[test]
    fn a_host_that_does_not_resolve_is_named() {
        let e = resolve_servers("nfs", "gone.example:/e", &[], &dns()).unwrap_err();
        assert!(matches!(&e, ServerError::Lookup { host, .. } if host == "gone.example"));
        assert!(e.to_string().contains("gone.example"), "{e}");
    }

    #[test]
    fn the_system_resolver_finds_localhost() {
        let found = SystemResolver.lookup("localhost").unwrap();
        assert!(found.iter().any(|ip| ip.is_loopback()), "{found:?}");
        let m = resolve_servers("nfs", "localhost:/export", &[], &SystemResolver).unwrap();
        let addr = m.options[0].strip_prefix("addr=").unwrap();
        assert!(addr.parse::<IpAddr>().unwrap().is_loopback(), "{addr}");
    }
}
