//! FUSE mounts made with mount(2) itself, as libfuse's `/dev/fd/N` mount
//! point and `fusermount3` make them: the mounter opens the FUSE device,
//! passes its descriptor to the kernel (`fd=`) with the options the kernel
//! requires, and hands the descriptor to the filesystem's daemon, which
//! serves the mount through it. Until a daemon serves it, a look at the
//! mount (a `stat` of its root) waits; once every copy of the descriptor is
//! closed, the mount answers `ENOTCONN` until it is unmounted.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Where the kernel's FUSE device is.
pub const FUSE_DEVICE: &str = "/dev/fuse";

/// Whether `fs_type` is mounted through a FUSE connection: `fuse` or
/// `fuse.<subtype>` (`fuse.sshfs`, `fuse.s3fs`).
pub fn is_fuse(fs_type: &str) -> bool {
    fs_type == "fuse" || fs_type.starts_with("fuse.")
}

/// An open FUSE device: what a FUSE mount is made with, and then what its
/// daemon serves. Closed on drop (and not inherited by programs this
/// process runs, unless handed to one on purpose).
#[derive(Debug)]
pub struct FuseConnection {
    fd: OwnedFd,
}

impl FuseConnection {
    /// Opens the FUSE device at `device` ([`FUSE_DEVICE`] on a node).
    pub fn open(device: &Path) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(device)?;
        Ok(FuseConnection { fd: file.into() })
    }

    /// The options mount(2) needs for this connection besides `given`:
    /// `fd=` always; `rootmode=` (a directory), `user_id=` and `group_id=`
    /// (this process's effective ids) unless `given` has them.
    ///
    /// ```
    /// use mount_utils::FuseConnection;
    /// let c = FuseConnection::open("/dev/null".as_ref()).unwrap();
    /// let options = c.mount_options(&["user_id=1000", "allow_other"]);
    /// assert_eq!(options[0], format!("fd={}", std::os::fd::AsRawFd::as_raw_fd(&c)));
    /// assert!(options.contains(&"rootmode=40000".to_string()));
    /// assert!(!options.iter().any(|o| o.starts_with("user_id=")));
    /// ```
    pub fn mount_options(&self, given: &[&str]) -> Vec<String> {
        let has = |name: &str| {
            given
                .iter()
                .any(|o| o.split_once('=').is_some_and(|(n, _)| n == name))
        };
        let (uid, gid) = (nix::unistd::geteuid(), nix::unistd::getegid());
        let mut options = vec![format!("fd={}", self.fd.as_raw_fd())];
        let defaults = [
            ("rootmode", format!("{:o}", libc::S_IFDIR)),
            ("user_id", uid.to_string()),
            ("group_id", gid.to_string()),
        ];
        for (name, value) in defaults {
            if !has(name) {
                options.push(format!("{name}={value}"));
            }
        }
        options
    }

    /// The descriptor, for the daemon that serves the mount.
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }
}

impl AsFd for FuseConnection {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for FuseConnection {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fuse_types_are_fuse_and_its_subtypes() {
        for fs in ["fuse", "fuse.sshfs", "fuse.s3fs"] {
            assert!(is_fuse(fs), "{fs}");
        }
        for fs in ["fuseblk", "ext4", "nfs", "fusectl"] {
            assert!(!is_fuse(fs), "{fs}");
        }
    }

    #[test]
    fn the_kernels_required_options_come_with_the_descriptor() {
        let c = FuseConnection::open(Path::new("/dev/null")).unwrap();
        let fd = c.as_raw_fd();
        let all = c.mount_options(&["allow_other"]);
        let (uid, gid) = (nix::unistd::geteuid(), nix::unistd::getegid());
        assert_eq!(
            all,
            [
                format!("fd={fd}"),
                "rootmode=40000".into(),
                format!("user_id={uid}"),
                format!("group_id={gid}"),
            ]
        );
        let given = c.mount_options(&["rootmode=40755", "user_id=7", "group_id=8"]);
        assert_eq!(given, [format!("fd={fd}")]);
        let owned = c.into_fd();
        assert_eq!(owned.as_raw_fd(), fd);
    }

    #[test]
    fn a_missing_device_is_an_error() {
        let e = FuseConnection::open(Path::new("/nonexistent/fuse")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }
}
