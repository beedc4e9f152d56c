//! Mount option parsing: `mount(8)`-style option strings into `MS_*` flags
//! plus the filesystem-specific data string.

use std::fmt;

use nix::mount::MsFlags;

/// A mount option that must not be logged, such as a password or a key.
///
/// The value reaches the kernel, but `Debug` prints `<redacted>` and there is
/// deliberately no `Display`, so it cannot end up in a log line or an error
/// message by accident. Use [`Sensitive::expose`] where the value is really
/// needed.
///
/// ```
/// use mount_utils::Sensitive;
/// let s = Sensitive::new("password=hunter2");
/// assert_eq!(format!("{s:?}"), "<redacted>");
/// assert_eq!(s.expose(), "password=hunter2");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Sensitive(String);

impl Sensitive {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Sensitive(value.into())
    }

    /// The secret value. Do not log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Sensitive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl From<String> for Sensitive {
    fn from(value: String) -> Self {
        Sensitive(value)
    }
}

impl From<&str> for Sensitive {
    fn from(value: &str) -> Self {
        Sensitive(value.to_owned())
    }
}

/// Options split into what `mount(2)` takes as flags and what it takes as data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountOptions {
    /// `MS_*` flags (including `MS_BIND`/`MS_REC` for `bind`/`rbind`).
    pub flags: MsFlags,
    /// Propagation flags (`MS_SHARED`, `MS_PRIVATE`, ...); the kernel wants
    /// them in a separate `mount(2)` call.
    pub propagation: MsFlags,
    /// Filesystem-specific options, passed as the comma-separated data string.
    pub data: Vec<String>,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            flags: MsFlags::empty(),
            propagation: MsFlags::empty(),
            data: Vec::new(),
        }
    }
}

impl MountOptions {
    /// Parses options. Each element may itself be a comma-separated list;
    /// commas inside double quotes (SELinux `context="a,b"`) do not split.
    ///
    /// Userspace-only options understood by `mount(8)` and fstab (`defaults`,
    /// `auto`, `nofail`, `_netdev`, `x-*`, ...) are dropped because the kernel
    /// would reject them.
    ///
    /// ```
    /// use mount_utils::MountOptions;
    /// use nix::mount::MsFlags;
    /// let o = MountOptions::parse(&["ro,nosuid", "size=1m", "defaults"]);
    /// assert_eq!(o.flags, MsFlags::MS_RDONLY | MsFlags::MS_NOSUID);
    /// assert_eq!(o.data, vec!["size=1m".to_string()]);
    /// ```
    pub fn parse<S: AsRef<str>>(options: &[S]) -> MountOptions {
        let mut out = MountOptions::default();
        for opt in options.iter().flat_map(|o| split_options(o.as_ref())) {
            out.apply(opt);
        }
        out
    }

    fn apply(&mut self, opt: &str) {
        if opt.is_empty() || is_userspace_only(opt) {
            return;
        }
        if let Some((flag, set)) = flag_for(opt) {
            if set {
                self.flags.insert(flag);
            } else {
                self.flags.remove(flag);
            }
            return;
        }
        if let Some(p) = propagation_for(opt) {
            self.propagation = p;
            return;
        }
        self.data.push(opt.to_owned());
    }

    /// Whether `bind` or `rbind` was given.
    pub fn is_bind(&self) -> bool {
        self.flags.contains(MsFlags::MS_BIND)
    }

    /// Whether `ro` was given.
    pub fn is_read_only(&self) -> bool {
        self.flags.contains(MsFlags::MS_RDONLY)
    }

    /// The data string handed to the kernel.
    pub fn data_string(&self) -> String {
        self.data.join(",")
    }
}

/// Splits a comma-separated option list, keeping double-quoted commas.
pub(crate) fn split_options(s: &str) -> impl Iterator<Item = &str> {
    let mut start = 0;
    let mut in_quotes = false;
    let mut parts = Vec::new();
    for (i, b) in s.bytes().enumerate() {
        match b {
            b'"' => in_quotes = !in_quotes,
            b',' if !in_quotes => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts.into_iter().filter(|p| !p.is_empty())
}

fn is_userspace_only(opt: &str) -> bool {
    matches!(
        opt,
        "defaults"
            | "auto"
            | "noauto"
            | "user"
            | "nouser"
            | "users"
            | "owner"
            | "group"
            | "nofail"
            | "_netdev"
    ) || opt.starts_with("x-")
        || opt.starts_with("comment=")
}

/// `(flag, true)` sets the flag, `(flag, false)` clears it.
fn flag_for(opt: &str) -> Option<(MsFlags, bool)> {
    use MsFlags as F;
    Some(match opt {
        "ro" => (F::MS_RDONLY, true),
        "rw" => (F::MS_RDONLY, false),
        "nosuid" => (F::MS_NOSUID, true),
        "suid" => (F::MS_NOSUID, false),
        "nodev" => (F::MS_NODEV, true),
        "dev" => (F::MS_NODEV, false),
        "noexec" => (F::MS_NOEXEC, true),
        "exec" => (F::MS_NOEXEC, false),
        "sync" => (F::MS_SYNCHRONOUS, true),
        "async" => (F::MS_SYNCHRONOUS, false),
        "dirsync" => (F::MS_DIRSYNC, true),
        "mand" => (F::MS_MANDLOCK, true),
        "nomand" => (F::MS_MANDLOCK, false),
        "noatime" => (F::MS_NOATIME, true),
        "atime" => (F::MS_NOATIME, false),
        "nodiratime" => (F::MS_NODIRATIME, true),
        "diratime" => (F::MS_NODIRATIME, false),
        "relatime" => (F::MS_RELATIME, true),
        "norelatime" => (F::MS_RELATIME, false),
        "strictatime" => (F::MS_STRICTATIME, true),
        "nostrictatime" => (F::MS_STRICTATIME, false),
        "lazytime" => (F::MS_LAZYTIME, true),
        "nolazytime" => (F::MS_LAZYTIME, false),
        "silent" => (F::MS_SILENT, true),
        "loud" => (F::MS_SILENT, false),
        "remount" => (F::MS_REMOUNT, true),
        "bind" => (F::MS_BIND, true),
        "rbind" => (F::MS_BIND | F::MS_REC, true),
        _ => return None,
    })
}

fn propagation_for(opt: &str) -> Option<MsFlags> {
    use MsFlags as F;
    Some(match opt {
        "shared" => F::MS_SHARED,
        "rshared" => F::MS_SHARED | F::MS_REC,
        "private" => F::MS_PRIVATE,
        "rprivate" => F::MS_PRIVATE | F::MS_REC,
        "slave" => F::MS_SLAVE,
        "rslave" => F::MS_SLAVE | F::MS_REC,
        "unbindable" => F::MS_UNBINDABLE,
        "runbindable" => F::MS_UNBINDABLE | F::MS_REC,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_data_are_separated() {
        let o = MountOptions::parse(&[
            "rw,noexec,nodev",
            "uid=1000",
            "x-systemd.automount",
            "nofail",
        ]);
        assert_eq!(o.flags, MsFlags::MS_NOEXEC | MsFlags::MS_NODEV);
        assert_eq!(o.data_string(), "uid=1000");
        assert!(!o.is_read_only());
    }

    #[test]
    fn later_option_wins() {
        let o = MountOptions::parse(&["ro", "rw"]);
        assert!(!o.is_read_only());
        let o = MountOptions::parse(&["rw", "ro"]);
        assert!(o.is_read_only());
    }

    #[test]
    fn quoted_commas_do_not_split() {
        let o =
            MountOptions::parse(&[r#"context="system_u:object_r:container_file_t:s0:c1,c2",ro"#]);
        assert_eq!(
            o.data,
            vec![r#"context="system_u:object_r:container_file_t:s0:c1,c2""#.to_string()]
        );
        assert!(o.is_read_only());
    }

    #[test]
    fn bind_and_propagation() {
        let o = MountOptions::parse(&["rbind", "rslave"]);
        assert!(o.is_bind());
        assert!(o.flags.contains(MsFlags::MS_REC));
        assert_eq!(o.propagation, MsFlags::MS_SLAVE | MsFlags::MS_REC);
        assert!(o.data.is_empty());
    }

    #[test]
    fn sensitive_debug_is_redacted() {
        let s = Sensitive::new("secret=abc");
        assert_eq!(format!("{s:?}"), "<redacted>");
        assert_eq!(format!("{:?}", vec![s.clone()]), "[<redacted>]");
        assert_eq!(s.expose(), "secret=abc");
    }
}
