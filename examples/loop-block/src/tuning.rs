//! The disk's mutable parameters: what a VolumeAttributesClass changes
//! (ControllerModifyVolume, or CreateVolume's `mutable_parameters`), the
//! way a cloud disk's IOPS or throughput change.
//!
//! | key | values | what the kernel does |
//! |---|---|---|
//! | `readAheadKiB` | 0 to 65536 | read-ahead of the loop device (`BLKRASET`; `/sys/block/loopN/queue/read_ahead_kb`) |
//! | `directIO` | `true`, `false` | the loop device reads and writes its backing file with O_DIRECT, bypassing the host's page cache (`LOOP_SET_DIRECT_IO`; `/sys/block/loopN/loop/dio`) |
//!
//! The values belong to the disk (its record): the node applies them to
//! the loop device whenever it attaches the disk (NodeStage, restart), and
//! ControllerModifyVolume applies a change at once to a disk attached on
//! this host. A key that is never given leaves the kernel's default.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use csi_server::{CsiError, CsiResult};
use serde::{Deserialize, Serialize};

/// Read-ahead of the loop device in KiB.
pub const READ_AHEAD_KEY: &str = "readAheadKiB";
/// Direct I/O to the backing file.
pub const DIRECT_IO_KEY: &str = "directIO";
/// Largest read-ahead accepted (64 MiB: larger only wastes memory).
pub const MAX_READ_AHEAD_KIB: u32 = 64 << 10;

mod ioctl {
    // linux/fs.h: BLKRASET _IO(0x12, 98) takes the value in 512-byte sectors;
    // BLKRAGET _IO(0x12, 99) writes it to a long.
    nix::ioctl_write_int_bad!(blkraset, nix::request_code_none!(0x12, 98));
    #[cfg(test)]
    nix::ioctl_read_bad!(blkraget, nix::request_code_none!(0x12, 99), libc::c_long);
    // linux/loop.h: LOOP_SET_DIRECT_IO 0x4C08 takes 0 or 1.
    nix::ioctl_write_int_bad!(loop_set_direct_io, 0x4C08);
}

/// Why settings could not be applied to a loop device.
#[derive(Debug, thiserror::Error)]
pub enum TuneError {
    /// The loop device could not be opened.
    #[error("opening {0}: {1}")]
    Open(PathBuf, std::io::Error),
    /// The kernel refused direct I/O (the backing file cannot do it).
    #[error("the kernel refused direct I/O on {0}: {1}")]
    DirectIo(PathBuf, nix::errno::Errno),
    /// The kernel refused the read-ahead.
    #[error("setting the read-ahead of {0}: {1}")]
    ReadAhead(PathBuf, nix::errno::Errno),
}

impl TuneError {
    /// ControllerModifyVolume's code: a setting the disk cannot take is
    /// the caller's (INVALID_ARGUMENT, nothing applied); the rest is ours.
    pub fn for_modify(self) -> CsiError {
        match self {
            TuneError::DirectIo(..) => CsiError::invalid(
                format!("mutable_parameters[{DIRECT_IO_KEY}]"),
                self.to_string(),
            ),
            e => CsiError::from(e),
        }
    }
}

/// At attach time every failure is ours: the values were checked when set.
impl From<TuneError> for CsiError {
    fn from(e: TuneError) -> Self {
        CsiError::Internal(format!("applying the mutable parameters: {e}"))
    }
}

/// The disk's settings; `None` leaves the kernel's default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tuning {
    /// Read-ahead in KiB.
    pub read_ahead_kib: Option<u32>,
    /// Direct I/O on the backing file (no double caching).
    pub direct_io: Option<bool>,
}

impl Tuning {
    /// `self` changed by `params`. Every key and value is checked before
    /// anything changes: an error (INVALID_ARGUMENT naming the key) leaves
    /// nothing applied, and absent keys keep their values.
    pub fn with(
        &self,
        params: &HashMap<String, String>,
        direct_io_supported: bool,
    ) -> CsiResult<Tuning> {
        let mut next = *self;
        // Sorted, so the error names the same key every time.
        for (key, value) in params.iter().collect::<BTreeMap<_, _>>() {
            let field = format!("mutable_parameters[{key}]");
            match key.as_str() {
                READ_AHEAD_KEY => {
                    let kib = value
                        .parse::<u32>()
                        .ok()
                        .filter(|k| *k <= MAX_READ_AHEAD_KIB)
                        .ok_or_else(|| {
                            CsiError::invalid(
                                &field,
                                format!("{value:?} is not a read-ahead in KiB from 0 to {MAX_READ_AHEAD_KIB}"),
                            )
                        })?;
                    next.read_ahead_kib = Some(kib);
                }
                DIRECT_IO_KEY => {
                    let on = match value.as_str() {
                        "true" => true,
                        "false" => false,
                        _ => {
                            return Err(CsiError::invalid(
                                &field,
                                format!("{value:?} is not true or false"),
                            ));
                        }
                    };
                    if on && !direct_io_supported {
                        return Err(CsiError::invalid(
                            &field,
                            "the filesystem holding the disks does not support direct I/O",
                        ));
                    }
                    next.direct_io = Some(on);
                }
                _ => {
                    return Err(CsiError::invalid(
                        field,
                        format!(
                            "not a mutable parameter of this driver (known: {READ_AHEAD_KEY}, {DIRECT_IO_KEY})"
                        ),
                    ));
                }
            }
        }
        Ok(next)
    }

    /// The settings as mutable parameters.
    pub fn to_map(self) -> BTreeMap<String, String> {
        let mut map = BTreeMap::new();
        if let Some(kib) = self.read_ahead_kib {
            map.insert(READ_AHEAD_KEY.to_owned(), kib.to_string());
        }
        if let Some(on) = self.direct_io {
            map.insert(DIRECT_IO_KEY.to_owned(), on.to_string());
        }
        map
    }

    /// Applies the settings to an attached loop device. Direct I/O goes
    /// first: it is the one the kernel may refuse (then nothing changed).
    pub fn apply(self, device: &Path) -> Result<(), TuneError> {
        if self == Tuning::default() {
            return Ok(());
        }
        let dev = File::open(device).map_err(|e| TuneError::Open(device.to_owned(), e))?;
        let fd = dev.as_raw_fd();
        if let Some(on) = self.direct_io {
            // SAFETY: LOOP_SET_DIRECT_IO takes an integer; the fd is valid.
            unsafe { ioctl::loop_set_direct_io(fd, on as libc::c_int) }
                .map_err(|errno| TuneError::DirectIo(device.to_owned(), errno))?;
        }
        if let Some(kib) = self.read_ahead_kib {
            // SAFETY: BLKRASET takes the value itself (sectors); the fd is valid.
            unsafe { ioctl::blkraset(fd, (kib * 2) as libc::c_int) }
                .map_err(|errno| TuneError::ReadAhead(device.to_owned(), errno))?;
        }
        Ok(())
    }
}

/// What a loop device has now: its read-ahead in KiB and whether it does
/// direct I/O.
#[cfg(test)]
pub fn current(device: &Path) -> std::io::Result<(u32, bool)> {
    let dev = File::open(device)?;
    let mut sectors: libc::c_long = 0;
    // SAFETY: BLKRAGET writes one long; the fd is valid.
    unsafe { ioctl::blkraget(dev.as_raw_fd(), &mut sectors) }?;
    let direct = mount_utils::LoopDevice::open(device)
        .and_then(|d| d.is_direct_io())
        .map_err(std::io::Error::other)?;
    Ok(((sectors / 2) as u32, direct))
}

/// The name of the probe file where O_TMPFILE is missing.
const PROBE_NAME: &str = ".direct-io-probe";

/// The probe's file operations: a seam, so a test can make them fail.
pub trait ProbeFiles {
    /// Opens an unnamed file in `dir` (O_TMPFILE) with O_DIRECT.
    fn open_unnamed(&self, dir: &Path) -> std::io::Result<File>;
    /// Creates `path` with O_DIRECT.
    fn create(&self, path: &Path) -> std::io::Result<File>;
    /// Removes `path`.
    fn remove(&self, path: &Path) -> std::io::Result<()>;
}

/// The host's files.
pub struct HostFiles;

impl ProbeFiles for HostFiles {
    fn open_unnamed(&self, dir: &Path) -> std::io::Result<File> {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_TMPFILE | libc::O_DIRECT)
            .open(dir)
    }

    fn create(&self, path: &Path) -> std::io::Result<File> {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
    }

    fn remove(&self, path: &Path) -> std::io::Result<()> {
        std::fs::remove_file(path)
    }
}

/// Whether files in `dir` can be opened with O_DIRECT (which direct I/O of
/// a loop device needs).
pub fn direct_io_supported(dir: &Path) -> bool {
    probe_direct_io(&HostFiles, dir)
}

/// The probe is an unnamed (O_TMPFILE) file, which nothing can leave
/// behind. Where the filesystem has no O_TMPFILE it is a named file that a
/// failed removal leaves until the next start's probe removes it.
pub fn probe_direct_io(files: &dyn ProbeFiles, dir: &Path) -> bool {
    let named = dir.join(PROBE_NAME);
    let remove_named = || match files.remove(&named) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(
            file = %named.display(),
            error = %e,
            "cannot remove the direct I/O probe; the next start removes it"
        ),
    };
    // One an earlier start could not remove.
    remove_named();
    match files.open_unnamed(dir) {
        Ok(_) => return true,
        // No O_TMPFILE here (EISDIR: a kernel that predates it).
        Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR)) => {}
        // O_TMPFILE works and O_DIRECT does not (EINVAL), or the directory
        // is unusable: nothing was created either way.
        Err(_) => return false,
    }
    // Open can create the file and then refuse O_DIRECT: removed either way.
    let ok = files.create(&named).is_ok();
    remove_named();
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::cell::Cell;

    /// The host's files, optionally without O_TMPFILE, and with removals
    /// failing with EIO while `fail_removes` is set.
    struct FakeProbeFiles {
        no_tmpfile: bool,
        fail_removes: Cell<bool>,
    }

    impl ProbeFiles for FakeProbeFiles {
        fn open_unnamed(&self, dir: &Path) -> std::io::Result<File> {
            if self.no_tmpfile {
                return Err(std::io::Error::from_raw_os_error(libc::EOPNOTSUPP));
            }
            HostFiles.open_unnamed(dir)
        }
        fn create(&self, path: &Path) -> std::io::Result<File> {
            HostFiles.create(path)
        }
        fn remove(&self, path: &Path) -> std::io::Result<()> {
            if self.fail_removes.get() {
                return Err(std::io::Error::from_raw_os_error(libc::EIO));
            }
            HostFiles.remove(path)
        }
    }

    fn entries(dir: &Path) -> Vec<std::ffi::OsString> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect()
    }

    #[test]
    fn the_direct_io_probe_leaves_nothing_when_unlink_fails() {
        let dir = tempfile::tempdir().unwrap();
        let unnamed = FakeProbeFiles {
            no_tmpfile: false,
            fail_removes: Cell::new(true),
        };
        let supported = probe_direct_io(&unnamed, dir.path());
        assert!(
            entries(dir.path()).is_empty(),
            "O_TMPFILE: nothing to unlink"
        );
        // Without O_TMPFILE, a failed unlink leaves the named probe until
        // the next start's probe, which removes it.
        let named = FakeProbeFiles {
            no_tmpfile: true,
            fail_removes: Cell::new(true),
        };
        assert_eq!(probe_direct_io(&named, dir.path()), supported);
        assert_eq!(entries(dir.path()), [PROBE_NAME]);
        named.fail_removes.set(false);
        assert_eq!(probe_direct_io(&named, dir.path()), supported);
        assert!(entries(dir.path()).is_empty(), "{:?}", entries(dir.path()));
        assert_eq!(direct_io_supported(dir.path()), supported);
        assert!(entries(dir.path()).is_empty());
    }

    fn params(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn keys_and_values_are_checked_before_anything_changes() {
        let base = Tuning {
            read_ahead_kib: Some(128),
            direct_io: None,
        };
        let next = base
            .with(&params(&[(DIRECT_IO_KEY, "true")]), true)
            .unwrap();
        assert_eq!(
            next,
            Tuning {
                read_ahead_kib: Some(128),
                direct_io: Some(true)
            },
            "absent keys keep their values"
        );
        assert_eq!(base.with(&HashMap::new(), true).unwrap(), base);
        for (bad, field) in [
            (
                params(&[(READ_AHEAD_KEY, "1024"), ("iops", "3000")]),
                "mutable_parameters[iops]",
            ),
            (
                params(&[(READ_AHEAD_KEY, "-1")]),
                "mutable_parameters[readAheadKiB]",
            ),
            (
                params(&[(READ_AHEAD_KEY, "65537")]),
                "mutable_parameters[readAheadKiB]",
            ),
            (
                params(&[(DIRECT_IO_KEY, "yes")]),
                "mutable_parameters[directIO]",
            ),
        ] {
            match base.with(&bad, true) {
                Err(CsiError::InvalidArgument { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        assert!(matches!(
            base.with(&params(&[(DIRECT_IO_KEY, "true")]), false),
            Err(CsiError::InvalidArgument { .. })
        ));
        assert!(
            base.with(&params(&[(DIRECT_IO_KEY, "false")]), false)
                .is_ok(),
            "turning direct I/O off needs no support"
        );
        let all = Tuning::default()
            .with(
                &params(&[(READ_AHEAD_KEY, "4096"), (DIRECT_IO_KEY, "false")]),
                true,
            )
            .unwrap();
        assert_eq!(
            all.to_map(),
            BTreeMap::from([
                (DIRECT_IO_KEY.to_owned(), "false".to_owned()),
                (READ_AHEAD_KEY.to_owned(), "4096".to_owned()),
            ])
        );
    }

    #[test]
    #[ignore = "needs root: run by scripts/test.sh's root pass"]
    fn settings_reach_a_real_loop_device() {
        mount_utils::require_root!("settings_reach_a_real_loop_device");
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        std::fs::File::create(&image)
            .unwrap()
            .set_len(16 << 20)
            .unwrap();
        // Dropping the handle detaches the device, whatever happens below.
        let dev = mount_utils::LoopDevice::attach(&image, &Default::default()).unwrap();
        let direct = direct_io_supported(dir.path());
        let tuned = Tuning::default()
            .with(
                &params(&[
                    (READ_AHEAD_KEY, "4096"),
                    (DIRECT_IO_KEY, if direct { "true" } else { "false" }),
                ]),
                direct,
            )
            .unwrap();
        tuned.apply(dev.path()).unwrap();
        assert_eq!(current(dev.path()).unwrap(), (4096, direct));
        let back = tuned
            .with(
                &params(&[(DIRECT_IO_KEY, "false"), (READ_AHEAD_KEY, "0")]),
                direct,
            )
            .unwrap();
        back.apply(dev.path()).unwrap();
        assert_eq!(current(dev.path()).unwrap(), (0, false));
        if !direct {
            eprintln!(
                "note: direct I/O not checked: {} has no O_DIRECT",
                dir.path().display()
            );
        }
    }
}
