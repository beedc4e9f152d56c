//! `mount(2)` with wiped option buffers, and the errors of building C strings.

use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use nix::mount::MsFlags;

use crate::error::MountError;
use crate::options::Sensitive;

pub(super) fn nul_error(what: &'static str) -> MountError {
    MountError::InvalidArgument {
        what,
        reason: "contains a NUL byte",
    }
}

pub(super) fn stat_error(path: &Path, errno: Errno) -> MountError {
    MountError::Stat {
        path: path.to_path_buf(),
        errno,
    }
}

pub(super) fn cpath(path: &Path) -> Result<CString, MountError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| nul_error("path"))
}

/// `mount(2)` with caller-owned C strings, so the data buffer holding
/// secrets is one we can wipe afterwards.
pub(super) fn sys_mount(
    source: Option<&CStr>,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: MsFlags,
    data: Option<&CStr>,
) -> Result<(), Errno> {
    let p = |s: Option<&CStr>| s.map_or(std::ptr::null(), CStr::as_ptr);
    // SAFETY: all pointers are NUL-terminated strings or null, as mount(2)
    // accepts, and outlive the call.
    let r = unsafe {
        libc::mount(
            p(source),
            target.as_ptr(),
            p(fstype),
            flags.bits(),
            data.map_or(std::ptr::null(), |d| d.as_ptr().cast()),
        )
    };
    Errno::result(r).map(drop)
}

/// The mount data string; zeroed on drop because it may hold secrets.
pub(super) struct SecretBuf(Vec<u8>);

impl SecretBuf {
    pub(super) fn build(
        plain: &[String],
        sensitive: &[Sensitive],
    ) -> Result<SecretBuf, MountError> {
        let mut buf = Vec::new();
        for opt in plain
            .iter()
            .map(String::as_str)
            .chain(sensitive.iter().map(Sensitive::expose))
        {
            if opt.is_empty() {
                continue;
            }
            if opt.as_bytes().contains(&0) {
                return Err(nul_error("mount option"));
            }
            if !buf.is_empty() {
                buf.push(b',');
            }
            buf.extend_from_slice(opt.as_bytes());
        }
        if !buf.is_empty() {
            buf.push(0);
        }
        Ok(SecretBuf(buf))
    }

    pub(super) fn as_cstr(&self) -> Option<&CStr> {
        if self.0.is_empty() {
            None
        } else {
            CStr::from_bytes_with_nul(&self.0).ok()
        }
    }
}

impl Drop for SecretBuf {
    fn drop(&mut self) {
        for b in self.0.iter_mut() {
            // SAFETY: writing a valid u8 through a valid &mut; volatile so the
            // wipe is not optimised away.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
    }
}
