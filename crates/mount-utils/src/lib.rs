//! Node-side mount toolbox for Kubernetes CSI plugins.
//!
//! Everything a node plugin does to the host's mount table and block
//! devices, done with syscalls where the kernel has an interface and with
//! external tools only where it has none (`mkfs`, `fsck`, `blkid`,
//! `resize2fs`, `xfs_growfs`):
//!
//! - [`Mounter`]: mount (with [`Sensitive`] options), bind, remount,
//!   unmount, cleanup, and queries ([`Mounter::mounted_at`],
//!   [`Mounter::mounts_at`], [`Mounter::is_mount_point`],
//!   [`Mounter::fs_usage`], ...). [`LinuxMounter`] does it for real
//!   (`mounts_at` from `statmount(2)` where the kernel has it, so its cost
//!   does not grow with the mount table), `FakeMounter` in memory.
//! - [`LoopDevices`]: attach, find by backing file, info, set capacity,
//!   detach; [`LinuxLoopDevices`] and `FakeLoopDevices`.
//! - [`parse_mountinfo`]: the full `/proc/<pid>/mountinfo` format.
//! - [`SafeFormatAndMount`]: format only provably empty devices, fsck before
//!   mounting, typed refusals.
//! - [`ResizeFs`], [`freeze`], [`quota`], [`block`] queries
//!   ([`same_device`], [`DeviceNumber`]), and `testing` helpers for
//!   real-mount tests.
//! - With the `testing` feature, for tests: the fakes (`FakeMounter`,
//!   `FakeLoopDevices`, `FakeExec`), which keep the rules below, and the
//!   `testing` module.
//!
//! # Safety rules
//!
//! A node plugin acts on paths the CO gives it, as root. Every [`Mounter`]
//! keeps these rules, the fake as well as the real one, so a driver's unit
//! tests see what production would do:
//!
//! - **No symlinks followed.** Targets, bind sources and paths to unmount,
//!   inspect or remove are resolved with `openat2(RESOLVE_NO_SYMLINKS)` (or
//!   an `O_NOFOLLOW` walk); a link anywhere is [`MountError::Symlink`].
//!   Mounts go onto the resolved descriptor, so the path cannot be swapped
//!   meanwhile ([`nofollow`]).
//! - **Read-only means read-only.** `ro` is sticky: put the driver's `ro`
//!   first and the CO's mount flags after it, and no `rw` among them makes
//!   the mount writable. Read-only binds are read-only from the moment they
//!   appear (`open_tree` + `mount_setattr` + `move_mount`, or bind then
//!   remount on older kernels), and every read-only mount is checked
//!   afterwards ([`MountError::NotReadOnly`]).
//! - **Option values are never shown.** Mount flags are sensitive in CSI:
//!   errors and logs (at every level) carry [`RedactedOptions`], a count and
//!   the names of well-known flags only.
//! - **Only ours.** A [`MountSource`] says what a plugin mounted at a path
//!   (a device's filesystem, a bind of a directory, a device node).
//!   [`Mounter::check_mounted`] compares it with mountinfo;
//!   [`Mounter::unmount_if_source`] and
//!   [`Mounter::cleanup_mount_point_owned`] never unmount or remove
//!   someone else's mount ([`MountError::NotOurs`]).
//!
//! # A node record on top
//!
//! A plugin that records what it staged and published (volume, path,
//! expected [`MountSource`]) gets the CSI repeat and ownership rules from
//! these calls:
//!
//! 1. Before the mount syscall, compute the expected source and persist
//!    it with the intent: [`MountSource::Device`] from the device's number
//!    ([`LoopDeviceInfo::device`], [`DeviceNumber::of_block_device`]),
//!    [`Mounter::bind_source`] for a bind (a staging directory, a device
//!    node). A crash after the mount then still leaves a record to clean up
//!    with. (Feature `serde` makes [`MountSource`] serializable.)
//! 2. [`Mounter::check_mounted`]: [`MountCheck::NotMounted`] → mount;
//!    [`MountCheck::Ours`] → the repeat is a success; [`MountCheck::Foreign`]
//!    → another volume is there (`ALREADY_EXISTS`).
//! 3. Teardown with [`Mounter::cleanup_mount_point_owned`]; a path no record
//!    names is touched only if what is mounted there is verifiably the
//!    volume ([`MountCheck::Ours`]). For loop devices whose record was lost,
//!    [`LoopDevices::find_by_backing_file`] finds them; check
//!    [`LoopDevices::info`] before trusting a recorded `/dev/loopN`, numbers
//!    are reused.
//!
//! ```
//! use std::{path::Path, sync::Arc};
//! use mount_utils::{FakeMounter, MountCheck, MountError, Mounter, Sensitive};
//!
//! // Drivers hold an Arc<dyn Mounter>: LinuxMounter in production,
//! // FakeMounter in tests.
//! let mounter: Arc<dyn Mounter> = Arc::new(FakeMounter::new());
//! let staging = Path::new("/var/lib/kubelet/plugins/x/globalmount");
//! mounter
//!     .mount_sensitive("//srv/share", staging, "cifs", &["vers=3.0"], &[Sensitive::new("password=pw")])
//!     .unwrap();
//!
//! // NodePublish, readonly=true, mount flags from the CO after the driver's ro.
//! let target = Path::new("/pods/a/volume");
//! let expected = mounter.bind_source(staging).unwrap(); // record this first
//! assert_eq!(mounter.check_mounted(target, &expected).unwrap(), MountCheck::NotMounted);
//! mounter.mount(&staging.to_string_lossy(), target, "", &["bind", "ro", "rw"]).unwrap();
//! let published = mounter.mounted_at(target).unwrap().unwrap();
//! assert!(published.is_read_only());
//! assert!(mounter.check_mounted(target, &expected).unwrap().is_ours()); // a repeat is OK
//! assert_eq!(mounter.mount_refs(staging).unwrap(), vec![target]);
//!
//! // NodeUnpublish of a path where someone else mounted: refused.
//! let foreign = Path::new("/pods/b/volume");
//! mounter.mount("tmpfs", foreign, "tmpfs", &[]).unwrap();
//! let err = mounter.cleanup_mount_point_owned(foreign, &expected).unwrap_err();
//! assert!(matches!(err, MountError::NotOurs { .. }));
//!
//! // Idempotent teardown of ours, as CSI retries demand.
//! mounter.cleanup_mount_point_owned(target, &expected).unwrap();
//! mounter.cleanup_mount_point_owned(target, &expected).unwrap();
//! assert!(mounter.mount_refs(staging).unwrap().is_empty());
//! ```
pub mod block;
mod block_devices;
#[cfg(feature = "csi")]
mod csi;
mod error;
mod exec;
#[cfg(feature = "testing")]
mod fake;
#[cfg(feature = "testing")]
mod fake_block_devices;
#[cfg(feature = "testing")]
mod fake_exec;
#[cfg(feature = "testing")]
mod fake_loop;
#[cfg(feature = "testing")]
mod fake_resolver;
mod format;
pub mod freeze;
mod fuse;
mod linux;
pub mod loopdev;
mod mount_attr;
mod mounter;
mod mountinfo;
pub mod nofollow;
mod options;
pub mod quota;
mod resize;
mod servers;
mod source;
mod statmount;
#[cfg(feature = "testing")]
pub mod testing;

pub use block::{DeviceNumber, same_device};
pub use block_devices::{
    BlockDeviceError, BlockDeviceInfo, BlockDevices, DEVICE_POLL_INTERVAL, LinuxBlockDevices,
};
pub use error::{MountError, is_corrupted_mount_errno};
pub use exec::{Exec, ExecError, ExecOutput, Started, SystemExec};
#[cfg(feature = "testing")]
pub use fake::{FakeAction, FakeMounter, FakeOp};
#[cfg(feature = "testing")]
pub use fake_block_devices::FakeBlockDevices;
#[cfg(feature = "testing")]
pub use fake_exec::{ExecCall, FakeExec};
#[cfg(feature = "testing")]
pub use fake_loop::{FakeLoopAction, FakeLoopDevices, FakeLoopOp};
#[cfg(feature = "testing")]
pub use fake_resolver::FakeResolver;
pub use format::{DEFAULT_FS_TYPE, DiskFormat, FormatError, SafeFormatAndMount, StartedProbe};
pub use fuse::{DAEMON_FD, FUSE_DEVICE, FuseConnection, is_disconnected, is_fuse};
pub use linux::{LinuxMounter, STATMOUNT_ENV};
pub use loopdev::{
    AttachedLoop, LinuxLoopDevices, LoopDevice, LoopDeviceInfo, LoopDevices, LoopError, LoopOptions,
};
pub use mounter::{MountArgs, Mounter};
pub use mountinfo::{
    MountInfo, OptionalField, ParseError, ParseErrorKind, decode_octal_escapes, parse_mountinfo,
};
pub use nix::errno::Errno;
pub use options::{MountOptions, RedactedOptions, Sensitive};
pub use resize::{ResizeError, ResizeFs};
pub use servers::{Resolver, ServerError, ServerMount, SystemResolver, resolve_servers};
pub use source::{FsUsage, MountCheck, MountSource};
