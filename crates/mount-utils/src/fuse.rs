//! FUSE mounts made with mount(2) itself, as libfuse's `/dev/fd/N` mount
//! point and `fusermount3` make them: the mounter opens the FUSE device,
//! passes its descriptor to the kernel (`fd=`) with the options the kernel
//! requires, and hands the descriptor to the filesystem's daemon, which
//! serves the mount through it. Until a daemon serves it, a look at the
//! mount (a `stat` of its root) waits; once every copy of the descriptor is
//! closed, the mount answers `ENOTCONN` until it is unmounted.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::nofollow::statx_at;
use crate::options::has_option;

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
        let (uid, gid) = (nix::unistd::geteuid(), nix::unistd::getegid());
        let mut options = vec![format!("fd={}", self.fd.as_raw_fd())];
        let defaults = [
            ("rootmode", format!("{:o}", libc::S_IFDIR)),
            ("user_id", uid.to_string()),
            ("group_id", gid.to_string()),
        ];
        for (name, value) in defaults {
            if !has_option(given, &[name]) {
                options.push(format!("{name}={value}"));
            }
        }
        options
    }

    /// The descriptor, for the daemon that serves the mount.
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }

    /// Makes `daemon` inherit this connection as its descriptor
    /// [`DAEMON_FD`] and returns what a libfuse daemon takes as its mount
    /// point for it, `/dev/fd/3`. Spawn the command, then drop the
    /// connection: the daemon holds its own copy, and the mount lives as
    /// long as the daemon does.
    ///
    /// ```
    /// use mount_utils::FuseConnection;
    /// let connection = FuseConnection::open("/dev/null".as_ref()).unwrap();
    /// let mut daemon = std::process::Command::new("readlink");
    /// let mount_point = connection.hand_to(&mut daemon);
    /// let out = daemon.arg(&mount_point).output().unwrap();
    /// assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "/dev/null");
    /// ```
    pub fn hand_to(&self, daemon: &mut Command) -> String {
        let fd = self.fd.as_raw_fd();
        // SAFETY: the closure runs in the child between fork and exec and
        // calls only dup2 and fcntl, which are async-signal-safe.
        unsafe {
            daemon.pre_exec(move || {
                if fd == DAEMON_FD {
                    // dup2 onto itself keeps close-on-exec: clear it.
                    let flags = libc::fcntl(fd, libc::F_GETFD);
                    if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                        return Err(io::Error::last_os_error());
                    }
                } else if libc::dup2(fd, DAEMON_FD) < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        format!("/dev/fd/{DAEMON_FD}")
    }
}

/// Whether the FUSE mount at `path` has lost its daemon: a fresh `statx`
/// of it (a request the daemon must answer) fails with `ENOTCONN`. Asked
/// on a thread given `wait`: a daemon that is alive but slow or hung is not
/// disconnected (that thread then waits on until the daemon answers, or
/// its mount goes away).
pub fn is_disconnected(path: &Path, wait: Duration) -> bool {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    let (answer, answered) = std::sync::mpsc::channel();
    let asked = std::thread::Builder::new()
        .name("fuse-probe".into())
        .spawn(move || {
            let flags = libc::AT_SYMLINK_NOFOLLOW | libc::AT_STATX_FORCE_SYNC;
            let asked = statx_at(libc::AT_FDCWD, &c, flags, libc::STATX_TYPE);
            let _ = answer.send(asked.err());
        });
    asked.is_ok() && answered.recv_timeout(wait) == Ok(Some(nix::errno::Errno::ENOTCONN))
}

/// The descriptor a FUSE daemon given the connection by
/// [`FuseConnection::hand_to`] finds it at: the first after standard
/// input, output and error.
pub const DAEMON_FD: RawFd = 3;

impl AsFd for FuseConnection {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for FuseConnection {
    fn as_raw_fd(&self) -> RawFd {
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
    fn a_daemon_finds_the_connection_at_its_descriptor_3_and_nothing_else_leaks() {
        let c = FuseConnection::open(Path::new("/dev/null")).unwrap();
        let mut daemon = Command::new("sh");
        let mount_point = c.hand_to(&mut daemon);
        assert_eq!(mount_point, "/dev/fd/3");
        // The connection at 3, and at its own number only when that is 3.
        let fd = c.as_raw_fd();
        let script = format!("readlink {mount_point}; readlink /proc/$$/fd/{fd} || echo none");
        let out = daemon.args(["-c", &script]).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines.first(), Some(&"/dev/null"), "{stdout}");
        let own_number_inherited = lines.get(1) == Some(&"/dev/null");
        assert_eq!(own_number_inherited, fd == DAEMON_FD, "{stdout}");
    }

    #[test]
    fn a_missing_device_is_an_error() {
        let e = FuseConnection::open(Path::new("/nonexistent/fuse")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }
}
