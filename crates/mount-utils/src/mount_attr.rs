//! The `MOUNT_ATTR_*` bits of include/uapi/linux/mount.h, which libc does
//! not export: what `mount_setattr(2)` sets on a bind and `statmount(2)`
//! reports back, so both read the same table.

pub(crate) const RDONLY: u64 = 0x01;
pub(crate) const NOSUID: u64 = 0x02;
pub(crate) const NODEV: u64 = 0x04;
pub(crate) const NOEXEC: u64 = 0x08;
/// The atime mode field; `RELATIME` is its zero value.
pub(crate) const ATIME_MASK: u64 = 0x70;
pub(crate) const RELATIME: u64 = 0x00;
pub(crate) const NOATIME: u64 = 0x10;
pub(crate) const STRICTATIME: u64 = 0x20;
pub(crate) const NODIRATIME: u64 = 0x80;
pub(crate) const IDMAP: u64 = 0x10_0000;
pub(crate) const NOSYMFOLLOW: u64 = 0x20_0000;
