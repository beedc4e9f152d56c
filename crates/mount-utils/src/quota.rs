//! Project quotas: a byte limit for one directory tree, the way a
//! directory-backed volume gets a real capacity. A project id is set on the
//! directory with `PROJINHERIT` (so everything created inside inherits it)
//! and the limit is set with `quotactl_fd` (Linux 5.14+), which needs no
//! block device path.
//!
//! The filesystem must have project quotas enabled: xfs mounted with
//! `prjquota`, or ext4 made with `-O quota,project` and mounted with
//! `prjquota`. [`supported`] tells. `statfs` on a directory of a limited
//! project reports the project's limit and usage, so `df` and
//! NodeGetVolumeStats show the volume's size.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use nix::errno::Errno;

mod ioctl {
    // linux/fs.h: struct fsxattr and FS_IOC_FSGETXATTR/FS_IOC_FSSETXATTR.
    #[repr(C)]
    #[derive(Debug, Default, Clone, Copy)]
    pub struct FsXattr {
        pub xflags: u32,
        pub extsize: u32,
        pub nextents: u32,
        pub projid: u32,
        pub cowextsize: u32,
        pub pad: [u8; 8],
    }
    nix::ioctl_read!(fs_get_xattr, b'X', 31, FsXattr);
    nix::ioctl_write_ptr!(fs_set_xattr, b'X', 32, FsXattr);
}

/// FS_XFLAG_PROJINHERIT: new files and directories take the project id.
const PROJINHERIT: u32 = 0x0000_0200;
/// linux/quota.h.
const Q_GETQUOTA: i32 = 0x800007;
const Q_SETQUOTA: i32 = 0x800008;
const PRJQUOTA: i32 = 2;
const QIF_BLIMITS: u32 = 1;
const QIF_ILIMITS: u32 = 4;
/// Quota block limits are in 1 KiB units (QIF_DQBLKSIZE).
const QUOTA_BLOCK: u64 = 1024;

/// linux/quota.h `struct if_dqblk`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct IfDqblk {
    bhardlimit: u64,
    bsoftlimit: u64,
    curspace: u64,
    ihardlimit: u64,
    isoftlimit: u64,
    curinodes: u64,
    btime: u64,
    itime: u64,
    valid: u32,
}

/// Why a quota operation failed.
#[derive(Debug, thiserror::Error)]
pub enum QuotaError {
    /// The path could not be opened.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The kernel refused (`ESRCH`/`ENOSYS`/`EOPNOTSUPP`: project quotas are
    /// not enabled on this filesystem; `EPERM`: needs CAP_SYS_ADMIN).
    #[error("{op} on {path}: {errno}")]
    Kernel {
        /// What was attempted.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// What the kernel said.
        errno: Errno,
    },
}

/// Usage and limit of one project.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProjectQuota {
    /// Byte limit (0: none).
    pub limit_bytes: u64,
    /// Bytes in use.
    pub used_bytes: u64,
    /// Inodes in use.
    pub used_inodes: u64,
}

fn open(path: &Path) -> Result<File, QuotaError> {
    File::open(path).map_err(|source| QuotaError::Io {
        path: path.to_owned(),
        source,
    })
}

fn quotactl(
    dir: &File,
    path: &Path,
    op: &'static str,
    cmd: i32,
    id: u32,
    data: &mut IfDqblk,
) -> Result<(), QuotaError> {
    let cmd = (cmd << 8) | (PRJQUOTA & 0xff);
    // SAFETY: quotactl_fd(fd, cmd, id, addr) with a valid fd and a pointer to
    // a properly sized if_dqblk that lives for the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_quotactl_fd,
            dir.as_raw_fd(),
            cmd as libc::c_uint,
            id as libc::c_int,
            data as *mut IfDqblk,
        )
    };
    if rc < 0 {
        return Err(QuotaError::Kernel {
            op,
            path: path.to_owned(),
            errno: Errno::last(),
        });
    }
    Ok(())
}

/// Whether the filesystem holding `path` enforces project quotas.
pub fn supported(path: &Path) -> bool {
    let Ok(dir) = open(path) else { return false };
    let mut q = IfDqblk::default();
    quotactl(&dir, path, "Q_GETQUOTA", Q_GETQUOTA, 0, &mut q).is_ok()
}

/// Puts the directory `dir` (and everything later created in it) in project `id`.
pub fn set_project(dir: &Path, id: u32) -> Result<(), QuotaError> {
    let file = open(dir)?;
    let mut attr = ioctl::FsXattr::default();
    // SAFETY: the fd is valid and `attr` is a properly sized fsxattr.
    unsafe { ioctl::fs_get_xattr(file.as_raw_fd(), &mut attr) }.map_err(|errno| {
        QuotaError::Kernel {
            op: "FS_IOC_FSGETXATTR",
            path: dir.to_owned(),
            errno,
        }
    })?;
    attr.projid = id;
    attr.xflags |= PROJINHERIT;
    // SAFETY: as above.
    unsafe { ioctl::fs_set_xattr(file.as_raw_fd(), &attr) }.map_err(|errno| {
        QuotaError::Kernel {
            op: "FS_IOC_FSSETXATTR",
            path: dir.to_owned(),
            errno,
        }
    })?;
    Ok(())
}

/// Sets the byte limit of project `id` on the filesystem holding `path`
/// (rounded up to whole KiB; 0 removes the limit).
pub fn set_limit(path: &Path, id: u32, limit_bytes: u64) -> Result<(), QuotaError> {
    let dir = open(path)?;
    let blocks = limit_bytes.div_ceil(QUOTA_BLOCK);
    let mut q = IfDqblk {
        bhardlimit: blocks,
        bsoftlimit: blocks,
        valid: QIF_BLIMITS,
        ..IfDqblk::default()
    };
    quotactl(&dir, path, "Q_SETQUOTA", Q_SETQUOTA, id, &mut q)
}

/// The limit and usage of project `id` on the filesystem holding `path`.
pub fn get(path: &Path, id: u32) -> Result<ProjectQuota, QuotaError> {
    let dir = open(path)?;
    let mut q = IfDqblk::default();
    quotactl(&dir, path, "Q_GETQUOTA", Q_GETQUOTA, id, &mut q)?;
    Ok(ProjectQuota {
        limit_bytes: q.bhardlimit * QUOTA_BLOCK,
        used_bytes: q.curspace,
        used_inodes: q.curinodes,
    })
}

/// Removes the limits of project `id` (for a deleted volume).
pub fn clear(path: &Path, id: u32) -> Result<(), QuotaError> {
    let dir = open(path)?;
    let mut q = IfDqblk {
        valid: QIF_BLIMITS | QIF_ILIMITS,
        ..IfDqblk::default()
    };
    quotactl(&dir, path, "Q_SETQUOTA", Q_SETQUOTA, id, &mut q)
}

#[cfg(test)]
mod tests {
    #[test]
    fn struct_layouts_match_the_kernel_abi() {
        assert_eq!(std::mem::size_of::<super::ioctl::FsXattr>(), 28);
        assert_eq!(std::mem::size_of::<super::IfDqblk>(), 72);
    }
}
