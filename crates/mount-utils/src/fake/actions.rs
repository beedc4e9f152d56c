//! What [`FakeMounter`](super::FakeMounter) records, and the operations a
//! test can make fail.

use std::fmt;
use std::path::PathBuf;

use crate::options::{RedactedOptions, Sensitive};

/// An operation of [`FakeMounter`](super::FakeMounter) that can be made to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FakeOp {
    /// [`Mounter::mount`](crate::Mounter::mount), [`Mounter::mount_sensitive`](crate::Mounter::mount_sensitive) and
    /// [`Mounter::remount`](crate::Mounter::remount) (keyed by target).
    Mount,
    /// [`Mounter::bind_mount`](crate::Mounter::bind_mount) (keyed by target).
    BindMount,
    /// [`Mounter::unmount`](crate::Mounter::unmount).
    Unmount,
    /// Inspecting a path: [`Mounter::is_mount_point`](crate::Mounter::is_mount_point),
    /// [`Mounter::is_likely_not_mount_point`](crate::Mounter::is_likely_not_mount_point), [`Mounter::mounted_at`](crate::Mounter::mounted_at),
    /// [`Mounter::fs_usage`](crate::Mounter::fs_usage) and the first step of
    /// [`Mounter::cleanup_mount_point`](crate::Mounter::cleanup_mount_point).
    Stat,
    /// [`Mounter::mount_points`](crate::Mounter::mount_points) and [`Mounter::mount_refs`](crate::Mounter::mount_refs) (use
    /// [`FakeMounter::inject_error_any_path`](super::FakeMounter::inject_error_any_path)).
    MountPoints,
    /// Removing the path in [`Mounter::cleanup_mount_point`](crate::Mounter::cleanup_mount_point) and
    /// [`Mounter::remove_mount_point`](crate::Mounter::remove_mount_point).
    Remove,
}

/// A state change recorded by [`FakeMounter`](super::FakeMounter), in call order. Only
/// successful changes are logged; no-ops (unmounting something not
/// mounted) and refusals are not, so "never touched" is "not in the log".
///
/// `Debug` shows options as [`RedactedOptions`], never their values.
#[derive(Clone, PartialEq, Eq)]
pub enum FakeAction {
    /// A mount moved from one path to another ([`Mounter::move_mount`](crate::Mounter::move_mount)).
    Move {
        /// Where it was.
        from: PathBuf,
        /// Where it is now.
        to: PathBuf,
    },
    /// A mount (including `bind` given as an option).
    Mount {
        /// Source as given.
        source: String,
        /// Target, lexically normalised.
        target: PathBuf,
        /// Filesystem type as given.
        fstype: String,
        /// Non-sensitive options as given.
        options: Vec<String>,
        /// Sensitive options; their `Debug` is redacted.
        sensitive_options: Vec<Sensitive>,
    },
    /// A [`Mounter::bind_mount`](crate::Mounter::bind_mount).
    BindMount {
        /// Source, lexically normalised.
        source: PathBuf,
        /// Target, lexically normalised.
        target: PathBuf,
        /// Whether it was read-only.
        read_only: bool,
    },
    /// A [`Mounter::remount`](crate::Mounter::remount).
    Remount {
        /// Target, lexically normalised.
        target: PathBuf,
        /// Options as given.
        options: Vec<String>,
    },
    /// An unmount of a mounted path.
    Unmount {
        /// Target, lexically normalised.
        target: PathBuf,
        /// Whether it was lazy.
        lazy: bool,
    },
    /// A mount point was removed from disk.
    Remove {
        /// The path.
        path: PathBuf,
    },
}

impl fmt::Debug for FakeAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FakeAction::Mount {
                source,
                target,
                fstype,
                options,
                sensitive_options,
            } => f
                .debug_struct("Mount")
                .field("source", source)
                .field("target", target)
                .field("fstype", fstype)
                .field("options", &RedactedOptions::new(options, sensitive_options))
                .finish(),
            FakeAction::BindMount {
                source,
                target,
                read_only,
            } => f
                .debug_struct("BindMount")
                .field("source", source)
                .field("target", target)
                .field("read_only", read_only)
                .finish(),
            FakeAction::Remount { target, options } => f
                .debug_struct("Remount")
                .field("target", target)
                .field("options", &RedactedOptions::new(options, &[]))
                .finish(),
            FakeAction::Unmount { target, lazy } => f
                .debug_struct("Unmount")
                .field("target", target)
                .field("lazy", lazy)
                .finish(),
            FakeAction::Remove { path } => f.debug_struct("Remove").field("path", path).finish(),
            FakeAction::Move { from, to } => f
                .debug_struct("Move")
                .field("from", from)
                .field("to", to)
                .finish(),
        }
    }
}
