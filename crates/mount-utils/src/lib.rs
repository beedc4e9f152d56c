//! Node-side mount toolbox for Kubernetes CSI plugins.
//!
//! Everything a node plugin does to the host's mount table and block
//! devices, done with syscalls where the kernel has an interface and with
//! external tools only where it has none (`mkfs`, `fsck`, `blkid`,
//! `resize2fs`, `xfs_growfs`):
//!
//! - [`Mounter`]: mount (with [`Sensitive`] options that never reach a log),
//!   really-read-only bind mounts, idempotent unmount and cleanup, accurate
//!   mount point detection ([`LinuxMounter`] uses `statx`), mount references.
//! - [`parse_mountinfo`]: the full `/proc/<pid>/mountinfo` format.
//! - [`SafeFormatAndMount`]: format only provably empty devices, fsck before
//!   mounting, typed refusals.
//! - [`ResizeFs`]: grow ext3/ext4, xfs and btrfs when the device grew.
//! - [`LoopDevice`]: loop devices over raw ioctls.
//! - [`FakeMounter`] and [`FakeExec`]: fakes for drivers' unit tests.
//!
//! ```
//! use std::{path::Path, sync::Arc};
//! use mount_utils::{FakeMounter, Mounter, Sensitive};
//!
//! // Drivers hold an Arc<dyn Mounter>: LinuxMounter in production,
//! // FakeMounter in tests.
//! let mounter: Arc<dyn Mounter> = Arc::new(FakeMounter::new());
//! let staging = Path::new("/var/lib/kubelet/plugins/x/globalmount");
//! mounter
//!     .mount_sensitive("//srv/share", staging, "cifs", &["vers=3.0"], &[Sensitive::new("password=pw")])
//!     .unwrap();
//! mounter.bind_mount(staging, Path::new("/pods/a/volume"), true).unwrap();
//!
//! assert!(mounter.is_mount_point(staging).unwrap());
//! assert_eq!(mounter.mount_refs(staging).unwrap(), vec![Path::new("/pods/a/volume")]);
//!
//! // Idempotent teardown, as CSI retries demand.
//! mounter.cleanup_mount_point(Path::new("/pods/a/volume")).unwrap();
//! mounter.cleanup_mount_point(Path::new("/pods/a/volume")).unwrap();
//! assert!(mounter.mount_refs(staging).unwrap().is_empty());
//! ```
#![warn(missing_docs)]

pub mod block;
mod error;
mod exec;
mod fake;
mod fake_loop;
mod format;
pub mod freeze;
mod linux;
pub mod loopdev;
mod mounter;
mod mountinfo;
pub mod nofollow;
mod options;
pub mod quota;
mod resize;
mod source;
pub mod testing;

pub use block::{DeviceNumber, same_device};
pub use error::{MountError, is_corrupted_mount_errno};
pub use exec::{Exec, ExecCall, ExecError, ExecOutput, FakeExec, SystemExec};
pub use fake::{FakeAction, FakeMounter, FakeOp};
pub use fake_loop::{FakeLoopAction, FakeLoopDevices, FakeLoopOp};
pub use format::{DEFAULT_FS_TYPE, DiskFormat, FormatError, SafeFormatAndMount};
pub use linux::LinuxMounter;
pub use loopdev::{
    AttachedLoop, LinuxLoopDevices, LoopDevice, LoopDeviceInfo, LoopDevices, LoopError, LoopOptions,
};
pub use mounter::Mounter;
pub use mountinfo::{
    MountInfo, OptionalField, ParseError, ParseErrorKind, decode_octal_escapes, parse_mountinfo,
};
pub use nix::errno::Errno;
pub use options::{MountOptions, RedactedOptions, Sensitive};
pub use resize::{ResizeError, ResizeFs};
pub use source::{FsUsage, MountCheck, MountSource};
