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
///
/// `ro` is sticky: a later `rw` does not undo it. A driver that puts its own
/// `ro` (from `readonly` or a reader-only access mode) before the caller's
/// mount flags therefore gets a read-only mount whatever those flags say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountOptions {
    /// `MS_*` flags (including `MS_BIND`/`MS_REC` for `bind`/`rbind`).
    pub flags: MsFlags,
    /// Flags explicitly turned off (`rw`, `suid`, `exec`, ...), so a remount
    /// can tell "turn off" from "not mentioned, keep as is".
    pub cleared: MsFlags,
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
            cleared: MsFlags::empty(),
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
                self.cleared.remove(flag);
            } else if flag == MsFlags::MS_RDONLY && self.flags.contains(flag) {
                // Sticky ro: user-supplied flags after the driver's own `ro`
                // must not make the mount writable.
            } else {
                self.flags.remove(flag);
                self.cleared.insert(flag);
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

    /// Whether `remount` was given.
    pub fn is_remount(&self) -> bool {
        self.flags.contains(MsFlags::MS_REMOUNT)
    }

    /// Whether `ro` was given (anywhere: see the type's docs).
    pub fn is_read_only(&self) -> bool {
        self.flags.contains(MsFlags::MS_RDONLY)
    }

    /// The data string handed to the kernel.
    pub fn data_string(&self) -> String {
        self.data.join(",")
    }
}

/// Splits a comma-separated option list, keeping double-quoted commas.
/// Whether `options` set any of `names` (as `name` or `name=…`).
pub(crate) fn has_option(options: &[&str], names: &[&str]) -> bool {
    options.iter().any(|o| {
        let name = o.split_once('=').map_or(*o, |(n, _)| n);
        names.contains(&name)
    })
}

pub(crate) fn split_options(s: &str) -> impl Iterator<Item = &str> {
    // Lazily, without a Vec: the mount table is parsed on every node call.
    // A comma inside quotes never splits, so each part starts unquoted.
    let mut rest = Some(s);
    std::iter::from_fn(move || {
        loop {
            let r = rest?;
            let mut in_quotes = false;
            let end = r.bytes().position(|b| {
                if b == b'"' {
                    in_quotes = !in_quotes;
                }
                b == b',' && !in_quotes
            });
            let part = match end {
                Some(i) => {
                    rest = Some(&r[i + 1..]);
                    &r[..i]
                }
                None => {
                    rest = None;
                    r
                }
            };
            if !part.is_empty() {
                return Some(part);
            }
        }
    })
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

/// Option names that may be shown in errors and logs: the flags this
/// module understands. Anything else (values, unknown words) is only counted.
const SHOWABLE: &[&str] = &[
    "ro",
    "rw",
    "nosuid",
    "suid",
    "nodev",
    "dev",
    "noexec",
    "exec",
    "sync",
    "async",
    "dirsync",
    "mand",
    "nomand",
    "noatime",
    "atime",
    "nodiratime",
    "diratime",
    "relatime",
    "norelatime",
    "strictatime",
    "nostrictatime",
    "lazytime",
    "nolazytime",
    "silent",
    "loud",
    "remount",
    "bind",
    "rbind",
    "shared",
    "rshared",
    "private",
    "rprivate",
    "slave",
    "rslave",
    "unbindable",
    "runbindable",
    "defaults",
    "auto",
    "noauto",
    "user",
    "nouser",
    "users",
    "owner",
    "group",
    "nofail",
    "_netdev",
];

/// What may be shown of a mount option list: how many options there are
/// and the names of the well-known flags among them (`ro`, `bind`,
/// `nosuid`, ...). Values and unknown words are never kept, so neither
/// `Display` nor `Debug` can leak them: mount flags are sensitive in CSI.
///
/// ```
/// use mount_utils::{RedactedOptions, Sensitive};
/// let r = RedactedOptions::new(&["rw,password=hunter2", "bind"], &[Sensitive::new("k=v")]);
/// assert_eq!(r.to_string(), "4 options (flags: rw, bind; 2 others)");
/// assert_eq!(r.count(), 4);
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RedactedOptions {
    flags: Vec<&'static str>,
    count: usize,
}

impl RedactedOptions {
    /// Summarises `options` (each may be a comma-separated list) and
    /// `sensitive` ones, which are only counted.
    pub fn new<S: AsRef<str>>(options: &[S], sensitive: &[Sensitive]) -> Self {
        let mut out = RedactedOptions::default();
        for opt in options.iter().flat_map(|o| split_options(o.as_ref())) {
            out.count += 1;
            if let Some(name) = SHOWABLE.iter().find(|n| **n == opt) {
                out.flags.push(name);
            }
        }
        out.count += sensitive.len();
        out
    }

    /// A summary naming only `flags` (for messages built from `MS_*` flags).
    pub(crate) fn from_flag_names(flags: Vec<&'static str>) -> Self {
        RedactedOptions {
            count: flags.len(),
            flags,
        }
    }

    /// Number of options, sensitive ones included.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The well-known flags among them, in order.
    pub fn flag_names(&self) -> &[&'static str] {
        &self.flags
    }
}

impl fmt::Display for RedactedOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let others = self.count - self.flags.len();
        match (self.count, self.flags.is_empty()) {
            (0, _) => return f.write_str("no options"),
            (1, _) => f.write_str("1 option")?,
            (n, _) => write!(f, "{n} options")?,
        }
        if self.flags.is_empty() {
            return Ok(());
        }
        write!(f, " (flags: {}", self.flags.join(", "))?;
        match others {
            0 => f.write_str(")"),
            1 => f.write_str("; 1 other)"),
            n => write!(f, "; {n} others)"),
        }
    }
}

impl fmt::Debug for RedactedOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RedactedOptions({self})")
    }
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
    fn later_option_wins_except_that_ro_is_sticky() {
        let o = MountOptions::parse(&["noexec", "exec"]);
        assert!(!o.flags.contains(MsFlags::MS_NOEXEC));
        assert!(o.cleared.contains(MsFlags::MS_NOEXEC));
        let o = MountOptions::parse(&["rw", "ro"]);
        assert!(o.is_read_only());
        assert!(!o.cleared.contains(MsFlags::MS_RDONLY));
        // A caller's `rw` after the driver's `ro` does not make it writable.
        let o = MountOptions::parse(&["bind", "ro", "rw,remount"]);
        assert!(o.is_read_only() && o.is_remount());
        let o = MountOptions::parse(&["rw"]);
        assert!(!o.is_read_only() && o.cleared.contains(MsFlags::MS_RDONLY));
    }

    #[test]
    fn redacted_options_show_only_flag_names_and_a_count() {
        let r = RedactedOptions::new(
            &["password=SECRET", "rw", "SECRETWORD,bind"],
            &[Sensitive::new("SECRET2")],
        );
        for shown in [r.to_string(), format!("{r:?}")] {
            assert!(!shown.contains("SECRET"), "{shown}");
            assert!(
                shown.contains("5 options (flags: rw, bind; 3 others)"),
                "{shown}"
            );
        }
        assert_eq!(r.flag_names(), ["rw", "bind"]);
        assert_eq!(
            RedactedOptions::new::<&str>(&[], &[]).to_string(),
            "no options"
        );
        assert_eq!(
            RedactedOptions::new(&["ro"], &[]).to_string(),
            "1 option (flags: ro)"
        );
        assert_eq!(
            RedactedOptions::new(&["size=1m"], &[]).to_string(),
            "1 option"
        );
        assert_eq!(
            RedactedOptions::new(&["ro", "x=1"], &[]).to_string(),
            "2 options (flags: ro; 1 other)"
        );
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
