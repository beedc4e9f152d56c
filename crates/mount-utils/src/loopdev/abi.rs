//! The kernel's loop structures and ioctls (`<linux/loop.h>`), by hand.

pub(super) const LO_NAME_SIZE: usize = 64;
pub(super) const LO_KEY_SIZE: usize = 32;

pub(super) const LO_FLAGS_READ_ONLY: u32 = 1;
pub(super) const LO_FLAGS_AUTOCLEAR: u32 = 4;
pub(super) const LO_FLAGS_PARTSCAN: u32 = 8;
pub(super) const LO_FLAGS_DIRECT_IO: u32 = 16;

/// How often to retry when another process grabs the free device first.
pub(super) const MAX_ATTACH_ATTEMPTS: u32 = 64;

/// `struct loop_info64`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct LoopInfo64 {
    pub(super) lo_device: u64,
    pub(super) lo_inode: u64,
    pub(super) lo_rdevice: u64,
    pub(super) lo_offset: u64,
    pub(super) lo_sizelimit: u64,
    pub(super) lo_number: u32,
    pub(super) lo_encrypt_type: u32,
    pub(super) lo_encrypt_key_size: u32,
    pub(super) lo_flags: u32,
    pub(super) lo_file_name: [u8; LO_NAME_SIZE],
    pub(super) lo_crypt_name: [u8; LO_NAME_SIZE],
    pub(super) lo_encrypt_key: [u8; LO_KEY_SIZE],
    pub(super) lo_init: [u64; 2],
}

/// `struct loop_config` (Linux 5.8+).
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct LoopConfig {
    pub(super) fd: u32,
    pub(super) block_size: u32,
    pub(super) info: LoopInfo64,
    pub(super) reserved: [u64; 8],
}

const _: () = assert!(std::mem::size_of::<LoopInfo64>() == 232);
const _: () = assert!(std::mem::size_of::<LoopConfig>() == 304);

impl LoopInfo64 {
    pub(super) fn zeroed() -> Self {
        LoopInfo64 {
            lo_device: 0,
            lo_inode: 0,
            lo_rdevice: 0,
            lo_offset: 0,
            lo_sizelimit: 0,
            lo_number: 0,
            lo_encrypt_type: 0,
            lo_encrypt_key_size: 0,
            lo_flags: 0,
            lo_file_name: [0; LO_NAME_SIZE],
            lo_crypt_name: [0; LO_NAME_SIZE],
            lo_encrypt_key: [0; LO_KEY_SIZE],
            lo_init: [0; 2],
        }
    }
}

pub(super) mod ioctls {
    use super::{LoopConfig, LoopInfo64};
    nix::ioctl_write_int_bad!(loop_set_fd, 0x4C00);
    nix::ioctl_none_bad!(loop_clr_fd, 0x4C01);
    nix::ioctl_write_ptr_bad!(loop_set_status64, 0x4C04, LoopInfo64);
    nix::ioctl_read_bad!(loop_get_status64, 0x4C05, LoopInfo64);
    nix::ioctl_none_bad!(loop_set_capacity, 0x4C07);
    nix::ioctl_write_int_bad!(loop_set_direct_io, 0x4C08);
    nix::ioctl_write_ptr_bad!(loop_configure, 0x4C0A, LoopConfig);
    nix::ioctl_none_bad!(loop_ctl_get_free, 0x4C82);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_layout_matches_kernel_abi() {
        assert_eq!(std::mem::offset_of!(LoopInfo64, lo_flags), 52);
        assert_eq!(std::mem::offset_of!(LoopInfo64, lo_file_name), 56);
        assert_eq!(std::mem::offset_of!(LoopInfo64, lo_init), 216);
        assert_eq!(std::mem::offset_of!(LoopConfig, info), 8);
    }
}
