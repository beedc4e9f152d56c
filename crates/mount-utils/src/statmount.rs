//! One mount's entry without reading the whole table: given the unique id
//! `statx(2)` reports with `STATX_MNT_ID_UNIQUE`, `statmount(2)` (Linux
//! 6.8; source, options and subtype 6.11) describes that mount.
//! Reading `/proc/thread-self/mountinfo` formats every mount in the
//! namespace; this costs the same however many there are.
//!
//! The entries are built to equal the table's. Before the first use in a
//! process, the entry of the mount `/` is on is compared with its line in
//! the table; if they differ (an older kernel, a field read differently)
//! this path is never used and callers read the table as before.

use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::sync::OnceLock;

use nix::errno::Errno;

use crate::mount_attr;
use crate::mountinfo::{MountInfo, OptionalField, decode_octal_escapes};
use crate::options::split_options;

/// `statmount`'s number: the same on every architecture Rust targets but
/// MIPS (where the fast path is left out).
#[cfg(not(any(
    target_arch = "mips",
    target_arch = "mips32r6",
    target_arch = "mips64",
    target_arch = "mips64r6"
)))]
const SYS_STATMOUNT: Option<libc::c_long> = Some(457);
#[cfg(any(
    target_arch = "mips",
    target_arch = "mips32r6",
    target_arch = "mips64",
    target_arch = "mips64r6"
))]
const SYS_STATMOUNT: Option<libc::c_long> = None;

// What to ask for (include/uapi/linux/mount.h).
const SB_BASIC: u64 = 0x1;
const MNT_BASIC: u64 = 0x2;
const PROPAGATE_FROM: u64 = 0x4;
const MNT_ROOT: u64 = 0x8;
const MNT_POINT: u64 = 0x10;
const FS_TYPE: u64 = 0x20;
const MNT_OPTS: u64 = 0x80;
const FS_SUBTYPE: u64 = 0x100;
const SB_SOURCE: u64 = 0x200;
const ASKED: u64 = SB_BASIC
    | MNT_BASIC
    | PROPAGATE_FROM
    | MNT_ROOT
    | MNT_POINT
    | FS_TYPE
    | MNT_OPTS
    | FS_SUBTYPE
    | SB_SOURCE;
/// Always answered when the kernel has `statmount`; the string fields
/// above are left out of the answer when empty.
const REQUIRED: u64 = SB_BASIC | MNT_BASIC | MNT_ROOT | MNT_POINT | FS_TYPE;

// sb_flags bits (mnt_attr bits are in `mount_attr`).
const SB_RDONLY: u32 = 0x1;
const SB_SYNCHRONOUS: u32 = 0x10;
const SB_DIRSYNC: u32 = 0x80;
const SB_LAZYTIME: u32 = 1 << 25;
// mnt_propagation bits.
const MS_UNBINDABLE: u64 = 1 << 17;
const MS_SLAVE: u64 = 1 << 19;
const MS_SHARED: u64 = 1 << 20;

/// The fixed part of `struct statmount`; strings follow it.
const HEADER: usize = 512;

/// A mount's entry and the unique id of its parent.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub info: MountInfo,
    pub parent: u64,
}

/// The entry of mount `id`, or `Ok(None)` when this kernel cannot say
/// everything the table says.
pub(crate) fn entry(id: u64) -> Result<Option<Entry>, Errno> {
    let Some(nr) = SYS_STATMOUNT else {
        return Ok(None);
    };
    // struct mnt_id_req, version 0: size, spare, mnt_id, param.
    let req: [u64; 3] = [24, id, ASKED];
    let mut len = 4096;
    loop {
        // Read field by field with from_ne_bytes, so bytes need no alignment.
        let mut buf = vec![0u8; len];
        // SAFETY: the request and a writable buffer of `len` bytes.
        let r = unsafe { libc::syscall(nr, req.as_ptr(), buf.as_mut_ptr(), len, 0u32) };
        match Errno::result(r) {
            Ok(_) => return Ok(decode(&buf)),
            Err(Errno::EOVERFLOW) if len < 1 << 20 => len *= 4,
            Err(Errno::ENOSYS | Errno::EINVAL | Errno::EPERM) => return Ok(None),
            Err(e) => return Err(e),
        }
    }
}

fn decode(b: &[u8]) -> Option<Entry> {
    let u32_at = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_ne_bytes(b[o..o + 8].try_into().expect("8 bytes"));
    let size = (u32_at(0) as usize).min(b.len());
    let mask = u64_at(8);
    if mask & REQUIRED != REQUIRED || size < HEADER {
        return None;
    }
    let text = |bit: u64, off: usize| -> Option<Vec<u8>> {
        if mask & bit == 0 {
            return Some(Vec::new());
        }
        let start = HEADER + u32_at(off) as usize;
        let rest = b.get(start..size)?;
        Some(rest[..rest.iter().position(|&c| c == 0)?].to_vec())
    };
    let (sb_flags, attr, propagation) = (u32_at(32), u64_at(64), u64_at(72));
    let mut fs_type = String::from_utf8(text(FS_TYPE, 36)?).ok()?;
    let subtype = text(FS_SUBTYPE, 120)?;
    if !subtype.is_empty() {
        fs_type.push('.');
        fs_type.push_str(std::str::from_utf8(&subtype).ok()?);
    }
    let source = match text(SB_SOURCE, 124)? {
        s if s.is_empty() => "none".to_owned(),
        s => String::from_utf8(s).ok()?,
    };

    let mut mount_options = vec![if attr & mount_attr::RDONLY != 0 {
        "ro"
    } else {
        "rw"
    }];
    for (bit, name) in [
        (mount_attr::NOSUID, "nosuid"),
        (mount_attr::NODEV, "nodev"),
        (mount_attr::NOEXEC, "noexec"),
    ] {
        if attr & bit != 0 {
            mount_options.push(name);
        }
    }
    // The table's order; RELATIME is 0 within the atime field.
    if attr & mount_attr::ATIME_MASK == mount_attr::NOATIME {
        mount_options.push("noatime");
    }
    if attr & mount_attr::NODIRATIME != 0 {
        mount_options.push("nodiratime");
    }
    if attr & mount_attr::ATIME_MASK == mount_attr::RELATIME {
        mount_options.push("relatime");
    }
    if attr & mount_attr::NOSYMFOLLOW != 0 {
        mount_options.push("nosymfollow");
    }
    if attr & mount_attr::IDMAP != 0 {
        mount_options.push("idmapped");
    }

    let mut optional_fields = Vec::new();
    if propagation & MS_SHARED != 0 {
        optional_fields.push(OptionalField::Shared(u64_at(80) as u32));
    }
    if propagation & MS_SLAVE != 0 {
        let master = u64_at(88) as u32;
        optional_fields.push(OptionalField::Master(master));
        let from = u64_at(96) as u32;
        if mask & PROPAGATE_FROM != 0 && from != 0 && from != master {
            optional_fields.push(OptionalField::PropagateFrom(from));
        }
    }
    if propagation & MS_UNBINDABLE != 0 {
        optional_fields.push(OptionalField::Unbindable);
    }

    let mut super_options = vec![
        if sb_flags & SB_RDONLY != 0 {
            "ro"
        } else {
            "rw"
        }
        .to_owned(),
    ];
    for (bit, name) in [
        (SB_SYNCHRONOUS, "sync"),
        (SB_DIRSYNC, "dirsync"),
        (SB_LAZYTIME, "lazytime"),
    ] {
        if sb_flags & bit != 0 {
            super_options.push(name.to_owned());
        }
    }
    let opts = String::from_utf8(text(MNT_OPTS, 4)?).ok()?;
    super_options.extend(
        split_options(&opts)
            .map(|o| String::from_utf8_lossy(&decode_octal_escapes(o.as_bytes())).into_owned()),
    );

    let info = MountInfo {
        mount_id: u32_at(56),
        parent_id: u32_at(60),
        major: u32_at(16),
        minor: u32_at(20),
        root: PathBuf::from(std::ffi::OsString::from_vec(text(MNT_ROOT, 104)?)),
        mount_point: PathBuf::from(std::ffi::OsString::from_vec(text(MNT_POINT, 108)?)),
        mount_options: mount_options.into_iter().map(str::to_owned).collect(),
        optional_fields,
        fs_type,
        source,
        super_options,
    };
    Some(Entry {
        info,
        parent: u64_at(48),
    })
}

/// Whether this kernel's entries equal the table's, checked once per
/// process on the mount `/` is on (`root_mount`, its unique id) against
/// its line in the table (`line`, by mount id).
pub(crate) fn agrees_with_table(
    root_mount: impl FnOnce() -> Option<u64>,
    line: impl FnOnce(u32) -> Option<MountInfo>,
) -> bool {
    static AGREES: OnceLock<bool> = OnceLock::new();
    *AGREES.get_or_init(|| {
        let Some(Ok(Some(e))) = root_mount().map(entry) else {
            return false;
        };
        let agrees = line(e.info.mount_id).is_some_and(|l| l == e.info);
        if !agrees {
            tracing::debug!(entry = ?e.info, "statmount's entry differs from mountinfo's; reading the table instead");
        }
        agrees
    })
}
