//! Parser for `/proc/<pid>/mountinfo` (see `proc_pid_mountinfo(5)`).
//!
//! Each line is
//! `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`:
//! mount id, parent id, `major:minor`, root, mount point, mount options, zero
//! or more optional fields ended by `-`, filesystem type, source and super
//! options. Paths are octal-escaped by the kernel (`\040` for a space).

use std::ffi::OsString;
use std::fmt;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use crate::block::DeviceNumber;
use crate::options::split_options;

/// One mount: a parsed line of `/proc/<pid>/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfo {
    /// Unique id of the mount (may be reused after unmount).
    pub mount_id: u32,
    /// Id of the parent mount (itself for the namespace root).
    pub parent_id: u32,
    /// Major number of the filesystem's device (`st_dev`).
    pub major: u32,
    /// Minor number of the filesystem's device.
    pub minor: u32,
    /// Directory of the filesystem that is the root of this mount; not `/`
    /// for bind mounts of a subdirectory.
    pub root: PathBuf,
    /// Where it is mounted, relative to the reader's root.
    pub mount_point: PathBuf,
    /// Per-mount options (`rw`, `nosuid`, `relatime`, ...).
    pub mount_options: Vec<String>,
    /// Optional fields such as `shared:1` or `master:2`.
    pub optional_fields: Vec<OptionalField>,
    /// Filesystem type, for example `ext4` or `fuse.sshfs`.
    pub fs_type: String,
    /// Mount source (device, server path, or a pseudo name such as `tmpfs`).
    pub source: String,
    /// Per-superblock options; commas inside double quotes (SELinux
    /// `context="..."`) do not split.
    pub super_options: Vec<String>,
}

/// A propagation tag from the optional fields of a mountinfo line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OptionalField {
    /// `shared:N`: member of peer group N.
    Shared(u32),
    /// `master:N`: receives propagation from peer group N.
    Master(u32),
    /// `propagate_from:N`: nearest dominant peer group visible here.
    PropagateFrom(u32),
    /// `unbindable`.
    Unbindable,
    /// A tag this parser does not know, kept verbatim.
    Other(String),
}

impl MountInfo {
    /// Parses one line (without the trailing newline).
    pub fn parse_line(line: &[u8]) -> Result<MountInfo, ParseErrorKind> {
        let mut fields = line.split(|&b| b == b' ');
        let mut next = |name: &'static str| fields.next().ok_or(ParseErrorKind::MissingField(name));

        let mount_id = parse_u32(next("mount id")?, "mount id")?;
        let parent_id = parse_u32(next("parent id")?, "parent id")?;
        let (major, minor) = split_device(next("major:minor")?)?;
        let root = decode_path(next("root")?);
        let mount_point = decode_path(next("mount point")?);
        let mount_options = decode_list(next("mount options")?);

        let mut optional_fields = Vec::new();
        loop {
            let f = next("separator")?;
            if f == b"-" {
                break;
            }
            if f.is_empty() {
                continue;
            }
            optional_fields.push(parse_optional(f));
        }
        let fs_type = decode_string(next("fs type")?);
        let source = decode_string(next("source")?);
        let super_options = decode_list(next("super options")?);
        if fields.next().is_some() {
            return Err(ParseErrorKind::TrailingFields);
        }
        Ok(MountInfo {
            mount_id,
            parent_id,
            major,
            minor,
            root,
            mount_point,
            mount_options,
            optional_fields,
            fs_type,
            source,
            super_options,
        })
    }

    /// The filesystem's device number (`major:minor`).
    pub fn device(&self) -> crate::block::DeviceNumber {
        crate::block::DeviceNumber::new(self.major, self.minor)
    }

    /// Whether the per-mount options contain `opt` (for example `ro`).
    pub fn has_mount_option(&self, opt: &str) -> bool {
        self.mount_options.iter().any(|o| o == opt)
    }

    /// Whether the per-superblock options contain `opt`.
    pub fn has_super_option(&self, opt: &str) -> bool {
        self.super_options.iter().any(|o| o == opt)
    }

    /// Whether the mount is read-only.
    pub fn is_read_only(&self) -> bool {
        self.has_mount_option("ro")
    }

    /// Peer group id if the mount is shared.
    pub fn shared_peer_group(&self) -> Option<u32> {
        self.optional_fields.iter().find_map(|f| match f {
            OptionalField::Shared(n) => Some(*n),
            _ => None,
        })
    }

    /// Master peer group id if the mount is a slave.
    pub fn master_peer_group(&self) -> Option<u32> {
        self.optional_fields.iter().find_map(|f| match f {
            OptionalField::Master(n) => Some(*n),
            _ => None,
        })
    }

    /// Whether the mount's root was deleted: the kernel appends `//deleted`
    /// to the root of an unlinked dentry (a bind mount of a removed file).
    pub fn root_is_deleted(&self) -> bool {
        has_deleted_suffix(&self.root)
    }

    /// Whether the mount point carries the ` (deleted)` suffix that `d_path`
    /// appends for unlinked directories.
    pub fn mount_point_is_deleted(&self) -> bool {
        has_deleted_suffix(&self.mount_point)
    }

    /// `(major, minor)` of the filesystem.
    pub fn device_number(&self) -> (u32, u32) {
        (self.major, self.minor)
    }
}

fn has_deleted_suffix(p: &Path) -> bool {
    let b = p.as_os_str().as_encoded_bytes();
    b.ends_with(b"//deleted") || b.ends_with(b" (deleted)")
}

/// Where and why a mountinfo line failed to parse.
///
/// The line's content is deliberately not included: mount sources and
/// options can hold credentials.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("mountinfo line {line}: {kind}")]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    /// What was wrong.
    pub kind: ParseErrorKind,
}

/// What was wrong with a mountinfo line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseErrorKind {
    /// The line ended before this field.
    MissingField(&'static str),
    /// This numeric field is not a valid number.
    InvalidNumber(&'static str),
    /// More than three fields after the `-` separator.
    TrailingFields,
}

impl fmt::Display for ParseErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseErrorKind::MissingField(name) => write!(f, "missing field: {name}"),
            ParseErrorKind::InvalidNumber(name) => write!(f, "invalid number in field: {name}"),
            ParseErrorKind::TrailingFields => f.write_str("unexpected fields after super options"),
        }
    }
}

/// Parses a whole mountinfo file. Empty lines are skipped.
///
/// ```
/// let text = b"22 1 0:21 / /proc rw,relatime shared:12 - proc proc rw\n";
/// let mounts = mount_utils::parse_mountinfo(text).unwrap();
/// assert_eq!(mounts[0].mount_point, std::path::Path::new("/proc"));
/// assert_eq!(mounts[0].shared_peer_group(), Some(12));
/// ```
pub fn parse_mountinfo(data: &[u8]) -> Result<Vec<MountInfo>, ParseError> {
    parse_kept(data, |_| true)
}

/// The non-empty lines `keep` accepts, parsed; an error names its line.
fn parse_kept(
    data: &[u8],
    mut keep: impl FnMut(&[u8]) -> bool,
) -> Result<Vec<MountInfo>, ParseError> {
    let mut out = Vec::new();
    for (i, line) in data.split(|&b| b == b'\n').enumerate() {
        if line.is_empty() || !keep(line) {
            continue;
        }
        out.push(MountInfo::parse_line(line).map_err(|kind| ParseError { line: i + 1, kind })?);
    }
    Ok(out)
}

/// The mount whose mount point is the longest prefix of `abs` (the last
/// such entry when mounts are stacked): the filesystem `abs` is on.
pub(crate) fn containing_mount<'a>(mounts: &'a [MountInfo], abs: &Path) -> Option<&'a MountInfo> {
    // `max_by_key` keeps the last of equal keys: in table order, the top.
    mounts
        .iter()
        .filter(|m| abs.starts_with(&m.mount_point))
        .max_by_key(|m| m.mount_point.components().count())
}

/// The mounts at `abs` in `mounts`, in table order (bottom first).
pub(crate) fn stacked_at(mounts: Vec<MountInfo>, abs: &Path) -> Vec<MountInfo> {
    mounts
        .into_iter()
        .filter(|m| m.mount_point == abs)
        .collect()
}

/// [`stacked_at`] from the table's text, building only the lines whose
/// mount point is `abs`: every line is read, as on a kernel without
/// statmount, but most are never parsed.
pub(crate) fn stacked_at_in(data: &[u8], abs: &Path) -> Result<Vec<MountInfo>, ParseError> {
    let want = abs.as_os_str().as_bytes();
    parse_kept(data, |line| {
        line.split(|&b| b == b' ')
            .nth(4)
            .is_some_and(|point| match point.contains(&b'\\') {
                true => decode_octal_escapes(point) == want,
                false => point == want,
            })
    })
}

/// [`parse_mountinfo`] of the lines whose mount id and device `keep`
/// accepts; the others are read only as far as their third field. A line
/// whose first fields do not parse is parsed whole, to report the error.
pub(crate) fn parse_mountinfo_where(
    data: &[u8],
    keep: &dyn Fn(u32, DeviceNumber) -> bool,
) -> Result<Vec<MountInfo>, ParseError> {
    parse_kept(data, |line| {
        id_and_device(line).is_none_or(|(id, dev)| keep(id, dev))
    })
}

/// A line's mount id and device, from its first three fields.
fn id_and_device(line: &[u8]) -> Option<(u32, DeviceNumber)> {
    let mut fields = line.split(|&b| b == b' ');
    let id = parse_u32(fields.next()?, "mount id").ok()?;
    let (major, minor) = split_device(fields.nth(1)?).ok()?;
    Some((id, DeviceNumber::new(major, minor)))
}

/// `major:minor`.
fn split_device(dev: &[u8]) -> Result<(u32, u32), ParseErrorKind> {
    let colon = dev
        .iter()
        .position(|&b| b == b':')
        .ok_or(ParseErrorKind::InvalidNumber("major:minor"))?;
    Ok((
        parse_u32(&dev[..colon], "major")?,
        parse_u32(&dev[colon + 1..], "minor")?,
    ))
}

/// The entry with mount id `id`, parsing only that line.
pub(crate) fn find_by_id(data: &[u8], id: u32) -> Result<Option<MountInfo>, ParseError> {
    let prefix = format!("{id} ");
    for (i, line) in data.split(|&b| b == b'\n').enumerate() {
        if line.starts_with(prefix.as_bytes()) {
            return MountInfo::parse_line(line)
                .map(Some)
                .map_err(|kind| ParseError { line: i + 1, kind });
        }
    }
    Ok(None)
}

/// [`find_by_id`] reading `reader` only as far as the line: a proc
/// mountinfo file formats each mount as it is read, so the lines after
/// it are never made. Lines cut between reads are put back together.
pub(crate) fn read_until_id(
    mut reader: impl std::io::Read,
    id: u32,
) -> std::io::Result<Option<MountInfo>> {
    let mut data = Vec::new();
    let mut chunk = vec![0u8; 4096];
    let mut from = 0;
    loop {
        let n = match reader.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        data.extend_from_slice(&chunk[..n]);
        // Whole lines only, unless the file has ended.
        let end = match (n, data.iter().rposition(|&b| b == b'\n')) {
            (0, _) => data.len(),
            (_, Some(last)) if last + 1 > from => last + 1,
            _ => continue,
        };
        let found = find_by_id(&data[from..end], id)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
        if found.is_some() || n == 0 {
            return Ok(found);
        }
        from = end;
    }
}

fn parse_u32(field: &[u8], name: &'static str) -> Result<u32, ParseErrorKind> {
    std::str::from_utf8(field)
        .ok()
        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse().ok())
        .ok_or(ParseErrorKind::InvalidNumber(name))
}

fn parse_optional(f: &[u8]) -> OptionalField {
    let s = String::from_utf8_lossy(f);
    let (tag, num) = match s.split_once(':') {
        Some((t, n)) => (t, n.parse::<u32>().ok()),
        None => (s.as_ref(), None),
    };
    match (tag, num) {
        ("shared", Some(n)) => OptionalField::Shared(n),
        ("master", Some(n)) => OptionalField::Master(n),
        ("propagate_from", Some(n)) => OptionalField::PropagateFrom(n),
        ("unbindable", None) => OptionalField::Unbindable,
        _ => OptionalField::Other(s.into_owned()),
    }
}

/// Decodes the kernel's `\NNN` octal escapes (`\040` space, `\011` tab,
/// `\012` newline, `\134` backslash). A backslash not followed by three octal
/// digits is kept as is.
pub fn decode_octal_escapes(field: &[u8]) -> Vec<u8> {
    if !field.contains(&b'\\') {
        return field.to_vec();
    }
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        if field[i] == b'\\' && i + 4 <= field.len() && is_octal_triplet(&field[i + 1..i + 4]) {
            let v = field[i + 1..i + 4]
                .iter()
                .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
            // Three octal digits reach 0o777; only byte values are escapes.
            if let Ok(byte) = u8::try_from(v) {
                out.push(byte);
                i += 4;
                continue;
            }
        }
        out.push(field[i]);
        i += 1;
    }
    out
}

fn is_octal_triplet(b: &[u8]) -> bool {
    b.len() == 3 && b.iter().all(|d| (b'0'..=b'7').contains(d))
}

fn decode_path(field: &[u8]) -> PathBuf {
    PathBuf::from(OsString::from_vec(decode_octal_escapes(field)))
}

fn decode_string(field: &[u8]) -> String {
    String::from_utf8(decode_octal_escapes(field))
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

fn decode_list(field: &[u8]) -> Vec<String> {
    let split = |s: &str| split_options(s).map(str::to_owned).collect();
    match std::str::from_utf8(field) {
        // Nothing escaped: split the line's own bytes, with no copy first.
        Ok(s) if !s.contains('\\') => split(s),
        _ => split(&decode_string(field)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> MountInfo {
        MountInfo::parse_line(line.as_bytes()).unwrap()
    }

    #[test]
    fn proc_man_page_example() {
        let m =
            parse("36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue");
        assert_eq!(m.mount_id, 36);
        assert_eq!(m.parent_id, 35);
        assert_eq!((m.major, m.minor), (98, 0));
        assert_eq!(m.root, Path::new("/mnt1"));
        assert_eq!(m.mount_point, Path::new("/mnt2"));
        assert_eq!(m.mount_options, vec!["rw", "noatime"]);
        assert_eq!(m.optional_fields, vec![OptionalField::Master(1)]);
        assert_eq!(m.fs_type, "ext3");
        assert_eq!(m.source, "/dev/root");
        assert_eq!(m.super_options, vec!["rw", "errors=continue"]);
    }

    #[test]
    fn the_mounts_at_a_path_from_the_text_are_the_parsed_tables() {
        let text = b"1 0 8:1 / / rw - ext4 /dev/sda1 rw\n\
            2 1 0:40 / /data rw - tmpfs bottom rw\n\
            3 2 0:41 / /data rw - tmpfs top rw\n\
            4 1 0:42 / /with\\040space\\011tab rw - tmpfs odd rw\n\
            5 1 0:43 / /data/sub rw - tmpfs sub rw\n";
        let table = parse_mountinfo(text).unwrap();
        for path in [
            "/",
            "/data",
            "/data/sub",
            "/with space\ttab",
            "/with",
            "/absent",
            "/dat",
        ] {
            let path = Path::new(path);
            let ids = |v: Vec<MountInfo>| v.iter().map(|m| m.mount_id).collect::<Vec<_>>();
            assert_eq!(
                ids(stacked_at_in(text, path).unwrap()),
                ids(stacked_at(table.clone(), path)),
                "{}",
                path.display()
            );
        }
        assert_eq!(stacked_at_in(text, Path::new("/data")).unwrap().len(), 2);
    }

    #[test]
    fn a_filtered_parse_builds_the_kept_lines_only() {
        let text = b"1 0 8:1 / / rw - ext4 /dev/sda1 rw\n\
            7 1 7:3 / /stage rw - ext4 /dev/loop3 rw\n\
            8 1 7:3 /sub /pub rw shared:4 - ext4 /dev/loop3 rw\n\
            9 1 0:40 / /t rw - tmpfs t rw\n";
        let table = parse_mountinfo(text).unwrap();
        let loop3 = DeviceNumber::new(7, 3);
        let cases: [&dyn Fn(u32, DeviceNumber) -> bool; 4] = [
            &|_, dev| dev == loop3,
            &|id, _| id == 9,
            &|_, _| true,
            &|_, _| false,
        ];
        for keep in cases {
            let want: Vec<_> = (table.iter())
                .filter(|m| keep(m.mount_id, m.device()))
                .cloned()
                .collect();
            assert_eq!(parse_mountinfo_where(text, keep).unwrap(), want);
        }
        // A line left out is not parsed past its device; one whose first
        // fields do not parse is parsed whole, and fails with its number.
        let torn = b"1 0 8:1 / / rw - ext4\n2 1 7:3 / /s rw - ext4 /dev/loop3 rw\n";
        let kept = parse_mountinfo_where(torn, &|_, dev| dev == loop3).unwrap();
        assert_eq!(kept.iter().map(|m| m.mount_id).collect::<Vec<_>>(), [2]);
        assert!(parse_mountinfo_where(torn, &|_, _| true).is_err());
        let e = parse_mountinfo_where(b"1 0 8:1 / / rw - ext4 a rw\nx 1 7:3 /\n", &|_, _| false);
        assert_eq!(e.unwrap_err().line, 2);
    }

    #[test]
    fn the_containing_mount_is_the_top_of_the_deepest_stack() {
        let table = [
            parse("1 0 8:1 / / rw - ext4 /dev/sda1 rw"),
            parse("2 1 0:40 / /data rw - tmpfs bottom rw"),
            parse("3 2 0:41 / /data rw - tmpfs top rw"),
            parse("4 1 0:42 / /other rw - tmpfs other rw"),
        ];
        let id = |path: &str| containing_mount(&table, Path::new(path)).map(|m| m.mount_id);
        assert_eq!(id("/data/file"), Some(3));
        assert_eq!(id("/data"), Some(3));
        assert_eq!(id("/elsewhere"), Some(1));
        assert_eq!(containing_mount(&table[1..], Path::new("/")), None);
    }

    /// Real-world lines and what must come out of them.
    #[test]
    fn real_world_table() {
        struct Case {
            line: &'static str,
            root: &'static str,
            mount_point: &'static str,
            optional: Vec<OptionalField>,
            fs_type: &'static str,
            source: &'static str,
            super_options: Vec<&'static str>,
        }
        let cases = vec![
            // No optional fields (private mount, as in a container).
            Case {
                line: "22 27 0:21 / /proc rw,relatime - proc proc rw",
                root: "/",
                mount_point: "/proc",
                optional: vec![],
                fs_type: "proc",
                source: "proc",
                super_options: vec!["rw"],
            },
            // Escaped space, tab, newline and backslash in the mount point.
            Case {
                line: r"80 25 0:50 / /mnt/my\040dir\011tab\012nl\134bs rw,relatime shared:40 - tmpfs tmpfs rw,size=1024k",
                root: "/",
                mount_point: "/mnt/my dir\ttab\nnl\\bs",
                optional: vec![OptionalField::Shared(40)],
                fs_type: "tmpfs",
                source: "tmpfs",
                super_options: vec!["rw", "size=1024k"],
            },
            // Several optional fields.
            Case {
                line: "401 30 0:62 / /var/lib/kubelet/pods/x rw,nosuid shared:210 master:7 propagate_from:3 unbindable - overlay overlay rw,lowerdir=/a:/b,upperdir=/u,workdir=/w",
                root: "/",
                mount_point: "/var/lib/kubelet/pods/x",
                optional: vec![
                    OptionalField::Shared(210),
                    OptionalField::Master(7),
                    OptionalField::PropagateFrom(3),
                    OptionalField::Unbindable,
                ],
                fs_type: "overlay",
                source: "overlay",
                super_options: vec!["rw", "lowerdir=/a:/b", "upperdir=/u", "workdir=/w"],
            },
            // SELinux context with commas inside quotes.
            Case {
                line: r#"512 30 253:3 / /var/lib/kubelet/plugins/kubernetes.io/csi/pv/globalmount rw,relatime shared:300 - xfs /dev/mapper/vg-lv rw,seclabel,context="system_u:object_r:container_file_t:s0:c1,c2",attr2,inode64,noquota"#,
                root: "/",
                mount_point: "/var/lib/kubelet/plugins/kubernetes.io/csi/pv/globalmount",
                optional: vec![OptionalField::Shared(300)],
                fs_type: "xfs",
                source: "/dev/mapper/vg-lv",
                super_options: vec![
                    "rw",
                    "seclabel",
                    r#"context="system_u:object_r:container_file_t:s0:c1,c2""#,
                    "attr2",
                    "inode64",
                    "noquota",
                ],
            },
            // Bind mount of a deleted file: root carries //deleted.
            Case {
                line: "620 30 8:1 /var/lib/docker/tmp/f//deleted /etc/hosts rw,relatime - ext4 /dev/sda1 rw",
                root: "/var/lib/docker/tmp/f//deleted",
                mount_point: "/etc/hosts",
                optional: vec![],
                fs_type: "ext4",
                source: "/dev/sda1",
                super_options: vec!["rw"],
            },
            // Escaped " (deleted)" suffix on the mount point.
            Case {
                line: r"621 30 8:1 /data /mnt/gone\040(deleted) rw - ext4 /dev/sda1 rw",
                root: "/data",
                mount_point: "/mnt/gone (deleted)",
                optional: vec![],
                fs_type: "ext4",
                source: "/dev/sda1",
                super_options: vec!["rw"],
            },
            // FUSE with a subtype and a source containing an escaped space.
            Case {
                line: r"700 30 0:90 / /home/u/remote rw,nosuid,nodev - fuse.sshfs u@host:/my\040files rw,user_id=0,group_id=0",
                root: "/",
                mount_point: "/home/u/remote",
                optional: vec![],
                fs_type: "fuse.sshfs",
                source: "u@host:/my files",
                super_options: vec!["rw", "user_id=0", "group_id=0"],
            },
            // Empty source field (two spaces in a row) is kept as "".
            Case {
                line: "701 30 0:91 / /x rw - debugfs  rw",
                root: "/",
                mount_point: "/x",
                optional: vec![],
                fs_type: "debugfs",
                source: "",
                super_options: vec!["rw"],
            },
        ];
        for c in cases {
            let m = parse(c.line);
            assert_eq!(m.root, Path::new(c.root), "{}", c.line);
            assert_eq!(m.mount_point, Path::new(c.mount_point), "{}", c.line);
            assert_eq!(m.optional_fields, c.optional, "{}", c.line);
            assert_eq!(m.fs_type, c.fs_type, "{}", c.line);
            assert_eq!(m.source, c.source, "{}", c.line);
            assert_eq!(m.super_options, c.super_options, "{}", c.line);
        }
    }

    #[test]
    fn deleted_helpers() {
        let m = parse("620 30 8:1 /tmp/f//deleted /etc/hosts rw - ext4 /dev/sda1 rw");
        assert!(m.root_is_deleted());
        assert!(!m.mount_point_is_deleted());
        let m = parse(r"621 30 8:1 / /mnt/gone\040(deleted) rw - ext4 /dev/sda1 rw");
        assert!(m.mount_point_is_deleted());
        assert!(!m.root_is_deleted());
    }

    #[test]
    fn accessors() {
        let m = parse("1 2 3:4 / /a ro,nosuid shared:5 master:6 - ext4 /dev/x rw,seclabel");
        assert!(m.is_read_only());
        assert!(m.has_mount_option("nosuid"));
        assert!(m.has_super_option("seclabel"));
        assert_eq!(m.shared_peer_group(), Some(5));
        assert_eq!(m.master_peer_group(), Some(6));
        assert_eq!(m.device_number(), (3, 4));
    }

    #[test]
    fn octal_escape_edge_cases() {
        assert_eq!(decode_octal_escapes(br"a\040b"), b"a b");
        assert_eq!(decode_octal_escapes(br"\101\102"), b"AB");
        // Not an escape: too short, non-octal, or above 0o377.
        assert_eq!(decode_octal_escapes(br"a\04"), br"a\04");
        assert_eq!(decode_octal_escapes(br"a\089"), br"a\089");
        assert_eq!(decode_octal_escapes(br"\777"), br"\777");
        assert_eq!(decode_octal_escapes(br"\\134"), br"\\");
        assert_eq!(decode_octal_escapes(b"\\"), b"\\");
    }

    #[test]
    fn find_by_id_parses_one_line() {
        let text = b"1 0 0:1 / / rw - rootfs rootfs rw\n12 1 7:3 / /s rw - ext4 /dev/loop3 rw\n";
        let m = find_by_id(text, 12).unwrap().unwrap();
        assert_eq!(m.device(), crate::block::DeviceNumber::new(7, 3));
        assert!(find_by_id(text, 2).unwrap().is_none());
        assert!(find_by_id(b"5 x", 5).is_err());
    }

    #[test]
    fn read_until_id_stops_at_the_line_and_joins_cut_lines() {
        /// Hands out `text` a few bytes per read, counting the reads.
        struct Trickle<'a> {
            text: &'a [u8],
            step: usize,
            reads: usize,
        }
        impl std::io::Read for Trickle<'_> {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                self.reads += 1;
                let n = self.step.min(buf.len()).min(self.text.len());
                buf[..n].copy_from_slice(&self.text[..n]);
                self.text = &self.text[n..];
                Ok(n)
            }
        }
        let mut text = b"1 0 0:1 / / rw - rootfs rootfs rw\n".to_vec();
        for i in 2..200 {
            text.extend_from_slice(
                format!("{i} 1 7:{i} / /m/{i} rw - ext4 /dev/x rw\n").as_bytes(),
            );
        }
        let expected = parse_mountinfo(&text).unwrap();
        for step in [1, 5, 40, 4096] {
            for id in [1, 2, 57, 199] {
                let mut r = Trickle {
                    text: &text,
                    step,
                    reads: 0,
                };
                let found = read_until_id(&mut r, id).unwrap();
                assert_eq!(found.as_ref(), expected.iter().find(|m| m.mount_id == id));
                let upto: usize = expected.iter().take_while(|m| m.mount_id != id).count();
                let needed = text
                    .split(|&b| b == b'\n')
                    .take(upto + 1)
                    .map(|l| l.len() + 1)
                    .sum::<usize>();
                assert!(
                    r.reads <= needed.div_ceil(step) + 1,
                    "step {step}, id {id}: {} reads",
                    r.reads
                );
            }
            let mut r = Trickle {
                text: &text,
                step,
                reads: 0,
            };
            assert_eq!(read_until_id(&mut r, 500).unwrap(), None, "absent");
        }
        let cut = b"1 0 0:1 / / rw - rootfs rootfs rw";
        assert!(
            read_until_id(&cut[..], 1).unwrap().is_some(),
            "a last line without its newline"
        );
        assert!(read_until_id(&b"1 x\n"[..], 1).is_err());
    }

    #[test]
    fn whole_file_skips_blank_lines() {
        let text = b"1 0 0:1 / / rw - rootfs rootfs rw\n\n2 1 0:2 / /proc rw - proc proc rw\n";
        let v = parse_mountinfo(text).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(v[1].parent_id, 1);
    }

    #[test]
    fn malformed_lines_report_line_number_not_content() {
        let secret = "password=hunter2";
        let cases: Vec<(String, ParseErrorKind)> = vec![
            (
                format!("x 1 0:1 / / rw - cifs //srv/{secret} rw"),
                ParseErrorKind::InvalidNumber("mount id"),
            ),
            (
                format!("1 1 01 / / rw - cifs //srv/{secret} rw"),
                ParseErrorKind::InvalidNumber("major:minor"),
            ),
            (
                format!("1 1 0:1 / / rw cifs //srv/{secret} rw"),
                ParseErrorKind::MissingField("separator"),
            ),
            (
                format!("1 1 0:1 / / rw - cifs //srv/{secret}"),
                ParseErrorKind::MissingField("super options"),
            ),
            (
                format!("1 1 0:1 / / rw - cifs //srv {secret} extra"),
                ParseErrorKind::TrailingFields,
            ),
            (
                "1 1 0:-1 / / rw - a b c".to_string(),
                ParseErrorKind::InvalidNumber("minor"),
            ),
            ("1".to_string(), ParseErrorKind::MissingField("parent id")),
        ];
        for (line, kind) in cases {
            let text = format!("1 0 0:1 / / rw - rootfs rootfs rw\n{line}\n");
            let err = parse_mountinfo(text.as_bytes()).unwrap_err();
            assert_eq!(err, ParseError { line: 2, kind });
            let msg = err.to_string();
            assert!(msg.starts_with("mountinfo line 2: "), "{msg}");
            assert!(!msg.contains(secret), "{msg}");
            assert!(!format!("{err:?}").contains(secret));
        }
    }

    /// Deterministic garbage in, no panic out (the fuzz target does more).
    #[test]
    fn garbage_never_panics() {
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let alphabet = b" -:\\0123456789/abc\n\t,\"shared:master";
        let mut parsed_ok = 0;
        for _ in 0..20_000 {
            let len = (next() % 120) as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    let r = next();
                    // Mostly structured characters, sometimes any byte.
                    if r % 4 == 0 {
                        (r >> 8) as u8
                    } else {
                        alphabet[(r >> 8) as usize % alphabet.len()]
                    }
                })
                .collect();
            if parse_mountinfo(&bytes).is_ok() {
                parsed_ok += 1;
            }
            let _ = decode_octal_escapes(&bytes);
        }
        // Valid-looking prefixes with random tails must also not panic.
        for _ in 0..5_000 {
            let mut line = b"1 2 3:4 /r /m rw ".to_vec();
            let n = (next() % 40) as usize;
            line.extend((0..n).map(|_| alphabet[next() as usize % alphabet.len()]));
            if MountInfo::parse_line(&line).is_ok() {
                parsed_ok += 1;
            }
        }
        // Empty inputs parse to an empty table, so some inputs do succeed.
        assert!(parsed_ok > 0);
    }
}
