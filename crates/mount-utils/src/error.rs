//! Error type shared by every [`Mounter`](crate::Mounter) implementation.

use std::path::{Path, PathBuf};

use nix::errno::Errno;

use crate::mountinfo::ParseError;
use crate::options::RedactedOptions;
use crate::source::MountSource;

/// Failure of a mount-table operation.
///
/// Variants from a syscall carry the `errno` the kernel returned so callers
/// can branch on it (see [`MountError::errno`]). Neither `Display` nor
/// `Debug` ever shows an option value: options appear as
/// [`RedactedOptions`] (a count and the names of well-known flags).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MountError {
    /// `mount(2)` failed.
    #[error("mount {device:?} on {target:?} (type {fstype:?}, {options}): {errno}")]
    Mount {
        /// Mount source (device, path or pseudo name).
        device: String,
        /// Mount target.
        target: PathBuf,
        /// Filesystem type; empty for bind mounts.
        fstype: String,
        /// How many options, and which well-known flags; never values.
        options: RedactedOptions,
        /// Kernel error.
        errno: Errno,
    },
    /// Remounting failed: [`Mounter::remount`](crate::Mounter::remount), or
    /// the second step of a read-only bind, which has then been undone.
    #[error("remount {target:?} ({options}): {errno}")]
    Remount {
        /// Mount target.
        target: PathBuf,
        /// How many options, and which well-known flags; never values.
        options: RedactedOptions,
        /// Kernel error.
        errno: Errno,
    },
    /// Changing the propagation type (shared, private, ...) failed.
    #[error("set propagation {propagation} on {target:?}: {errno}")]
    Propagation {
        /// Mount target.
        target: PathBuf,
        /// Requested propagation option.
        propagation: String,
        /// Kernel error.
        errno: Errno,
    },
    /// `umount2(2)` failed for a reason other than "not mounted".
    #[error("unmount {target:?}: {errno}")]
    Unmount {
        /// Mount target.
        target: PathBuf,
        /// Kernel error.
        errno: Errno,
    },
    /// `stat`/`statx` of a path failed.
    #[error("stat {path:?}: {errno}")]
    Stat {
        /// The path.
        path: PathBuf,
        /// Kernel error.
        errno: Errno,
    },
    /// Reading the mount table failed.
    #[error("read {path:?}: {errno}")]
    ReadMountInfo {
        /// Usually `/proc/thread-self/mountinfo`.
        path: PathBuf,
        /// Kernel error.
        errno: Errno,
    },
    /// The mount table could not be parsed.
    #[error(transparent)]
    Parse(#[from] ParseError),
    /// Removing a mount point directory failed (`ENOTEMPTY` when it still
    /// has content).
    #[error("remove {path:?}: {errno}")]
    Remove {
        /// The path.
        path: PathBuf,
        /// Kernel error.
        errno: Errno,
    },
    /// The path is still a mount point after unmounting it repeatedly.
    #[error("{path:?} is still mounted after {attempts} unmounts")]
    StillMounted {
        /// The path.
        path: PathBuf,
        /// How many unmounts were done.
        attempts: u32,
    },
    /// An argument cannot be used: a NUL byte in a path or option, `/` as
    /// a mount point, filesystem options in a bind remount.
    #[error("invalid argument {what}: {reason}")]
    InvalidArgument {
        /// Which argument (never its value, which may be secret).
        what: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The path, or a directory on the way to it, is a symbolic link. It
    /// was refused, not followed (see [`nofollow`](crate::nofollow)).
    /// Nothing of ours can be mounted there, since we never mount through
    /// a symlink.
    #[error("refusing {path:?}: it or a directory on the way is a symbolic link")]
    Symlink {
        /// The path as given.
        path: PathBuf,
    },
    /// What is mounted at the path is not what the caller expected; it was
    /// neither unmounted nor removed.
    #[error("{path:?} has a mount that is not ours ({found}; expected {expected}); left alone")]
    NotOurs {
        /// The path.
        path: PathBuf,
        /// The mount found there (its device and root).
        found: MountSource,
        /// What the caller expected.
        expected: MountSource,
    },
    /// A mount that had to be read-only came out writable (a filesystem
    /// ignoring the flag); it has been unmounted again.
    #[error("mount on {target:?} is writable although read-only was requested; undone")]
    NotReadOnly {
        /// Mount target.
        target: PathBuf,
    },
}

impl MountError {
    /// The kernel error behind this failure, if there is one.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            MountError::Mount { errno, .. }
            | MountError::Remount { errno, .. }
            | MountError::Propagation { errno, .. }
            | MountError::Unmount { errno, .. }
            | MountError::Stat { errno, .. }
            | MountError::ReadMountInfo { errno, .. }
            | MountError::Remove { errno, .. } => Some(*errno),
            MountError::Symlink { .. } => Some(Errno::ELOOP),
            MountError::InvalidArgument { .. } => Some(Errno::EINVAL),
            MountError::Parse(_)
            | MountError::StillMounted { .. }
            | MountError::NotOurs { .. }
            | MountError::NotReadOnly { .. } => None,
        }
    }

    /// Whether this error means the path is a broken mount (see
    /// [`is_corrupted_mount_errno`]).
    pub fn is_corrupted_mount(&self) -> bool {
        self.errno().is_some_and(is_corrupted_mount_errno)
    }

    /// A failed [`Mounter::move_mount`](crate::Mounter::move_mount) of
    /// `from` to `to`; the fake reports it as the kernel path does.
    pub(crate) fn moving(from: &Path, to: &Path, errno: Errno) -> Self {
        MountError::Mount {
            device: from.display().to_string(),
            target: to.to_path_buf(),
            fstype: String::new(),
            options: RedactedOptions::from_flag_names(vec!["move"]),
            errno,
        }
    }
}

/// Errors that `stat` returns on a mount point whose filesystem is gone or
/// unreachable (a dead FUSE daemon, a stale NFS handle, a removed device).
///
/// Such a path is still mounted and must be unmounted before it can be
/// removed, so [`Mounter::cleanup_mount_point`](crate::Mounter::cleanup_mount_point)
/// unmounts it instead of failing.
pub fn is_corrupted_mount_errno(errno: Errno) -> bool {
    matches!(
        errno,
        Errno::ENOTCONN
            | Errno::ESTALE
            | Errno::EIO
            | Errno::EACCES
            | Errno::EHOSTDOWN
            | Errno::ENODEV
    )
}

/// Errno of an I/O error, `EIO` when it has none (synthetic errors).
pub(crate) fn io_errno(err: &std::io::Error) -> Errno {
    err.raw_os_error()
        .map(Errno::from_raw)
        .unwrap_or(Errno::EIO)
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::path::{Path, PathBuf};
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::block::DeviceNumber;
    use crate::mountinfo::ParseErrorKind;
    use crate::options::Sensitive;
    use crate::{
        ExecOutput, FakeExec, FakeMounter, FakeOp, LinuxMounter, Mounter, SafeFormatAndMount,
    };

    const SECRET: &str = "SECRET";

    /// Every variant, built with options holding a secret. The match has no
    /// wildcard, so a new variant does not compile until it is added here.
    fn every_variant() -> Vec<MountError> {
        let options = RedactedOptions::new(
            &[format!("password={SECRET}").as_str(), "rw"],
            &[Sensitive::new(SECRET)],
        );
        let path = PathBuf::from("/t");
        let source = MountSource::Device(DeviceNumber::new(7, 3));
        let all = vec![
            MountError::Mount {
                device: "/dev/loop3".into(),
                target: path.clone(),
                fstype: "ext4".into(),
                options: options.clone(),
                errno: Errno::EINVAL,
            },
            MountError::Remount {
                target: path.clone(),
                options,
                errno: Errno::EINVAL,
            },
            MountError::Propagation {
                target: path.clone(),
                propagation: "MS_SHARED".into(),
                errno: Errno::EINVAL,
            },
            MountError::Unmount {
                target: path.clone(),
                errno: Errno::EBUSY,
            },
            MountError::Stat {
                path: path.clone(),
                errno: Errno::ENOENT,
            },
            MountError::ReadMountInfo {
                path: path.clone(),
                errno: Errno::EIO,
            },
            MountError::Parse(ParseError {
                line: 1,
                kind: ParseErrorKind::TrailingFields,
            }),
            MountError::Remove {
                path: path.clone(),
                errno: Errno::ENOTEMPTY,
            },
            MountError::StillMounted {
                path: path.clone(),
                attempts: 32,
            },
            MountError::InvalidArgument {
                what: "mount option",
                reason: "contains a NUL byte",
            },
            MountError::Symlink { path: path.clone() },
            MountError::NotOurs {
                path: path.clone(),
                found: MountSource::DeviceNode(DeviceNumber::new(7, 4)),
                expected: source,
            },
            MountError::NotReadOnly { target: path },
        ];
        for e in &all {
            match e {
                MountError::Mount { .. }
                | MountError::Remount { .. }
                | MountError::Propagation { .. }
                | MountError::Unmount { .. }
                | MountError::Stat { .. }
                | MountError::ReadMountInfo { .. }
                | MountError::Parse(_)
                | MountError::Remove { .. }
                | MountError::StillMounted { .. }
                | MountError::InvalidArgument { .. }
                | MountError::Symlink { .. }
                | MountError::NotOurs { .. }
                | MountError::NotReadOnly { .. } => {}
            }
        }
        all
    }

    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<u8>>>);

    impl Write for Capture {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Mounts, binds and remounts with `password=SECRET` and `rw` through
    /// the real and the fake mounter, with every log level captured;
    /// returns the errors they produced.
    fn exercise(dir: &Path) -> Vec<String> {
        let secret = format!("password={SECRET}");
        let (target, src) = (dir.join("t"), dir.join("src"));
        std::fs::create_dir_all(&target).unwrap();
        std::fs::create_dir_all(&src).unwrap();
        let mut shown = Vec::new();
        let mut show = |r: Result<(), MountError>| {
            if let Err(e) = r {
                shown.push(format!("{e} | {e:?}"));
            }
        };
        let linux = LinuxMounter::new();
        show(linux.mount("tmpfs", &target, "tmpfs", &[&secret, "rw"]));
        show(linux.mount_sensitive(
            "tmpfs",
            &target,
            "tmpfs",
            &["rw"],
            &[Sensitive::new(secret.clone())],
        ));
        show(linux.mount("tmpfs", &target, "tmpfs", &["remount", &secret, "rw"]));
        show(linux.remount(&target, &[&secret, "rw"]));
        let src_str = src.to_str().unwrap();
        let bound = linux.mount(src_str, &target, "", &["bind", &secret, "rw"]);
        if bound.is_ok() {
            show(linux.remount(&target, &["bind", &secret]));
            show(linux.unmount(&target, false));
        }
        show(bound);

        let fake = FakeMounter::new();
        fake.inject_error(FakeOp::Mount, &target, Errno::EPERM);
        show(fake.mount("tmpfs", &target, "tmpfs", &[&secret, "rw"]));
        fake.clear_errors();
        show(fake.mount("tmpfs", &target, "tmpfs", &[&secret, "rw"]));
        show(fake.remount(&target, &[&secret]));
        shown.push(format!("{:?}", fake.actions()));

        let fake = Arc::new(FakeMounter::new());
        fake.inject_error_any_path(FakeOp::Mount, Errno::EINVAL);
        let exec = Arc::new(FakeExec::new());
        exec.expect("blkid", ExecOutput::ok("TYPE=ext4\n"));
        exec.expect("e2fsck", ExecOutput::ok(""));
        let sfm = SafeFormatAndMount::new(fake, exec);
        let err = sfm
            .format_and_mount("/dev/sdb", &target, "ext4", &[&secret, "rw"], &[])
            .unwrap_err();
        shown.push(format!("{err} | {err:?}"));
        shown
    }

    #[test]
    fn no_error_or_log_line_shows_an_option_value() {
        for e in every_variant() {
            for text in [e.to_string(), format!("{e:?}")] {
                assert!(!text.contains(SECRET), "{text}");
            }
        }

        let run = || {
            let capture = Capture::default();
            let writer = capture.clone();
            let subscriber = tracing_subscriber::fmt()
                .with_max_level(tracing::Level::TRACE)
                .with_ansi(false)
                .with_writer(move || writer.clone())
                .finish();
            let dir = tempfile::tempdir().unwrap();
            let errors = tracing::subscriber::with_default(subscriber, || exercise(dir.path()));
            let log = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
            (errors, log)
        };
        // As root the mounts really happen: keep them in a private namespace.
        let (errors, log) = if crate::testing::is_root() {
            crate::testing::in_private_mount_ns("redaction", run)
        } else {
            run()
        };
        assert!(errors.len() >= 6, "{errors:#?}");
        for text in &errors {
            assert!(!text.contains(SECRET), "{text}");
        }
        assert!(!log.contains(SECRET), "{log}");
        // The log still says what happened, with the options counted.
        assert!(log.contains("2 options (flags: rw; 1 other)"), "{log}");
        assert!(errors.iter().any(|e| e.contains("options")), "{errors:#?}");
    }
}
