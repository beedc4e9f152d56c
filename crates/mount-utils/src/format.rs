//! [`SafeFormatAndMount`]: format a device only when it is provably empty,
//! check existing filesystems, then mount.

use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};

use crate::error::MountError;
use crate::exec::{Exec, ExecError, ExecOutput, Started};
use crate::mounter::{MountArgs, Mounter};
use crate::options::{MountOptions, Sensitive};

/// Filesystem used when the caller does not name one.
pub const DEFAULT_FS_TYPE: &str = "ext4";

/// What [`SafeFormatAndMount::probe`] found on a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiskFormat {
    /// No filesystem signature and no partition table.
    Unformatted,
    /// A filesystem of this type (`ext4`, `xfs`, `crypto_LUKS`, ...).
    Filesystem(String),
    /// A partition table of this type (`gpt`, `dos`).
    PartitionTable(String),
}

/// A probe [`SafeFormatAndMount::start_probe`] started.
#[derive(Debug)]
pub struct StartedProbe {
    device: String,
    run: Started,
}

impl StartedProbe {
    /// Waits for `blkid`: what is on the device.
    pub fn finish(self) -> Result<DiskFormat, FormatError> {
        probed(&self.device, self.run.wait()?)
    }
}

/// Why [`SafeFormatAndMount`] refused or failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// The device has a different filesystem than requested; formatting it
    /// would destroy data.
    #[error("device {device} already contains {existing}, refusing to use it as {requested}")]
    FilesystemMismatch {
        /// Device path.
        device: String,
        /// Filesystem found.
        existing: String,
        /// Filesystem requested.
        requested: String,
    },
    /// The device shows no filesystem although the caller knows it formatted
    /// it ([`SafeFormatAndMount::mount_formatted`]): damaged or replaced,
    /// and formatting it again would destroy what is left.
    #[error(
        "device {device} has no filesystem although it was formatted; refusing to format it again"
    )]
    FilesystemMissing {
        /// Device path.
        device: String,
    },
    /// The device is empty but the mount is read-only, so it cannot be
    /// formatted.
    #[error("device {device} is unformatted and the mount is read-only")]
    UnformattedReadOnly {
        /// Device path.
        device: String,
    },
    /// The device has a partition table; it is not formatted as a whole.
    #[error("device {device} has a {pttype} partition table, refusing to format it")]
    HasPartitionTable {
        /// Device path.
        device: String,
        /// Partition table type.
        pttype: String,
    },
    /// The requested filesystem is not one this crate formats.
    #[error("unsupported filesystem type {fstype} (supported: ext3, ext4, xfs, btrfs)")]
    UnsupportedFilesystem {
        /// Requested type.
        fstype: String,
    },
    /// `blkid` failed.
    #[error("probing {device} with blkid failed (exit {code:?}): {stderr}")]
    ProbeFailed {
        /// Device path.
        device: String,
        /// Exit code.
        code: Option<i32>,
        /// blkid's standard error.
        stderr: String,
    },
    /// `mkfs` failed.
    #[error("formatting {device} as {fstype} failed (exit {code:?}): {stderr}")]
    FormatFailed {
        /// Device path.
        device: String,
        /// Filesystem type.
        fstype: String,
        /// Exit code.
        code: Option<i32>,
        /// mkfs's standard error.
        stderr: String,
    },
    /// `fsck` found errors it could not correct (exit code bit 4).
    #[error("filesystem on {device} has errors fsck could not correct: {output}")]
    HasFilesystemErrors {
        /// Device path.
        device: String,
        /// fsck's output.
        output: String,
    },
    /// `fsck` itself failed (operational error, usage error, ...).
    #[error("fsck of {device} failed (exit {code:?}): {stderr}")]
    FsckFailed {
        /// Device path.
        device: String,
        /// Exit code.
        code: Option<i32>,
        /// fsck's standard error.
        stderr: String,
    },
    /// A tool could not be run.
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// The mount failed.
    #[error(transparent)]
    Mount(#[from] MountError),
}

/// Formats-if-empty and mounts block devices, the `NodeStageVolume` core.
///
/// Rules:
/// - probe with `blkid -p`; format only when there is no filesystem **and**
///   no partition table;
/// - never format for a read-only mount ([`FormatError::UnformattedReadOnly`]);
/// - an existing filesystem of another type than requested is
///   [`FormatError::FilesystemMismatch`]; an empty `fstype` accepts any;
/// - before a read-write mount of an existing ext2/3/4 filesystem run
///   `e2fsck -p` (exit 0/1/2 fine, bit 4 is [`FormatError::HasFilesystemErrors`]);
/// - optionally bound concurrent `mkfs` runs
///   ([`SafeFormatAndMount::with_max_concurrent_formats`]), which are I/O heavy.
///
/// ```
/// use std::{path::Path, sync::Arc};
/// use mount_utils::{ExecOutput, FakeExec, FakeMounter, Mounter, SafeFormatAndMount};
///
/// let mounter = Arc::new(FakeMounter::new());
/// let exec = Arc::new(FakeExec::new());
/// exec.expect("blkid", ExecOutput::exit(2, "")); // nothing on the device
/// exec.expect("mkfs.ext4", ExecOutput::ok(""));
/// let sfm = SafeFormatAndMount::new(mounter.clone(), exec.clone());
/// sfm.format_and_mount("/dev/sdb", Path::new("/staging"), "", &[], &[]).unwrap();
/// assert_eq!(mounter.mount_points().unwrap()[0].fs_type, "ext4");
/// ```
#[derive(Clone)]
pub struct SafeFormatAndMount {
    mounter: Arc<dyn Mounter>,
    exec: Arc<dyn Exec>,
    format_limit: Option<Arc<Limit>>,
}

impl std::fmt::Debug for SafeFormatAndMount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafeFormatAndMount")
            .field(
                "max_concurrent_formats",
                &self.format_limit.as_ref().map(|l| l.max),
            )
            .finish_non_exhaustive()
    }
}

impl SafeFormatAndMount {
    /// Uses `mounter` to mount and `exec` to run blkid, mkfs and fsck.
    pub fn new(mounter: Arc<dyn Mounter>, exec: Arc<dyn Exec>) -> Self {
        SafeFormatAndMount {
            mounter,
            exec,
            format_limit: None,
        }
    }

    /// Runs at most `max` (at least 1) `mkfs` at once; other callers wait.
    pub fn with_max_concurrent_formats(mut self, max: usize) -> Self {
        self.format_limit = Some(Arc::new(Limit::new(max.max(1))));
        self
    }

    /// The mounter in use.
    pub fn mounter(&self) -> &Arc<dyn Mounter> {
        &self.mounter
    }

    /// What is on `device`, from `blkid -p` (low-level probe, no cache).
    pub fn probe(&self, device: &str) -> Result<DiskFormat, FormatError> {
        probe_device(self.exec.as_ref(), device)
    }

    /// [`probe`](Self::probe) started ([`Exec::start`]) for a caller with
    /// something else to do while `blkid` runs: [`StartedProbe::finish`]
    /// gives what `probe` would have.
    pub fn start_probe(&self, device: &str) -> StartedProbe {
        StartedProbe {
            device: device.to_owned(),
            run: self.exec.start("blkid", &blkid_args(device)),
        }
    }

    /// Formats `device` if it is empty and mounts it on `target`.
    /// `fstype` empty means "whatever is there", or ext4 for a new one.
    pub fn format_and_mount(
        &self,
        device: &str,
        target: &Path,
        fstype: &str,
        options: &[&str],
        format_options: &[&str],
    ) -> Result<(), FormatError> {
        let args = MountArgs::new(device, target, fstype, options);
        self.mount_probed(&args, Some(format_options))
    }

    /// [`format_and_mount`](Self::format_and_mount) with sensitive mount
    /// options (see [`Mounter::mount_sensitive`]); `args.source` is the
    /// device.
    pub fn format_and_mount_sensitive(
        &self,
        args: &MountArgs<'_>,
        format_options: &[&str],
    ) -> Result<(), FormatError> {
        self.mount_probed(args, Some(format_options))
    }

    /// Mounts a device the caller formatted earlier (its record says so),
    /// checking it as [`format_and_mount`](Self::format_and_mount) does but
    /// never formatting: a device that shows no filesystem is
    /// [`FormatError::FilesystemMissing`] (report the volume abnormal; its
    /// first blocks are damaged, and mkfs would destroy the rest).
    pub fn mount_formatted(
        &self,
        device: &str,
        target: &Path,
        fstype: &str,
        options: &[&str],
        sensitive_options: &[Sensitive],
    ) -> Result<(), FormatError> {
        let args = MountArgs::new(device, target, fstype, options);
        self.mount_probed(&args.with_sensitive_options(sensitive_options), None)
    }

    /// Probes, formats if empty and `format` allows it, checks, mounts.
    fn mount_probed(
        &self,
        args: &MountArgs<'_>,
        format: Option<&[&str]>,
    ) -> Result<(), FormatError> {
        let probed = self.probe(args.source)?;
        self.mount_as_probed(args, format, probed)
    }

    /// What [`format_and_mount_sensitive`](Self::format_and_mount_sensitive)
    /// (`format`: `Some` of its format options) or
    /// [`mount_formatted`](Self::mount_formatted) (`format`: `None`) do
    /// after their probe, with `probed`, what [`probe`](Self::probe) found
    /// on `args.source`: for a caller that probes while it does something
    /// else (a node plugin saving its intent to format). Nothing may have
    /// written to the device since the probe.
    pub fn mount_as_probed(
        &self,
        args: &MountArgs<'_>,
        format: Option<&[&str]>,
        probed: DiskFormat,
    ) -> Result<(), FormatError> {
        let (device, fstype) = (args.source, args.fstype);
        let read_only = MountOptions::parse(args.options).is_read_only();
        let mount_fs = match probed {
            DiskFormat::PartitionTable(pttype) => {
                return Err(FormatError::HasPartitionTable {
                    device: device.into(),
                    pttype,
                });
            }
            DiskFormat::Unformatted => {
                let Some(format_options) = format else {
                    return Err(FormatError::FilesystemMissing {
                        device: device.into(),
                    });
                };
                if read_only {
                    return Err(FormatError::UnformattedReadOnly {
                        device: device.into(),
                    });
                }
                let fs = if fstype.is_empty() {
                    DEFAULT_FS_TYPE
                } else {
                    fstype
                };
                self.format(device, fs, format_options)?;
                fs.to_owned()
            }
            DiskFormat::Filesystem(existing) => {
                if !fstype.is_empty() && existing != fstype {
                    return Err(FormatError::FilesystemMismatch {
                        device: device.into(),
                        existing,
                        requested: fstype.into(),
                    });
                }
                if !read_only && matches!(existing.as_str(), "ext2" | "ext3" | "ext4") {
                    self.check_ext(device)?;
                }
                existing
            }
        };
        self.mounter.mount_with(&MountArgs {
            fstype: &mount_fs,
            ..*args
        })?;
        Ok(())
    }

    /// Runs `mkfs` for `fstype` on `device`, without probing first. Prefer
    /// [`format_and_mount`](Self::format_and_mount).
    pub fn format(
        &self,
        device: &str,
        fstype: &str,
        format_options: &[&str],
    ) -> Result<(), FormatError> {
        let (program, mut args): (String, Vec<&str>) = match fstype {
            // -F: the device is a whole disk, not a partition; -m0: no blocks
            // reserved for root on a data volume.
            "ext3" | "ext4" => (format!("mkfs.{fstype}"), vec!["-F", "-m0"]),
            "xfs" | "btrfs" => (format!("mkfs.{fstype}"), vec![]),
            _ => {
                return Err(FormatError::UnsupportedFilesystem {
                    fstype: fstype.into(),
                });
            }
        };
        args.extend_from_slice(format_options);
        args.push(device);
        let _permit = self.format_limit.as_ref().map(|l| l.acquire());
        tracing::info!(device, fstype, "formatting");
        let out = self.exec.run(&program, &args)?;
        if !out.success() {
            return Err(FormatError::FormatFailed {
                device: device.into(),
                fstype: fstype.into(),
                code: out.code,
                stderr: out.stderr,
            });
        }
        Ok(())
    }

    /// `e2fsck -p`: repair what is safe to repair automatically.
    fn check_ext(&self, device: &str) -> Result<(), FormatError> {
        let out = self.exec.run("e2fsck", &["-p", device])?;
        fsck_result(device, out)
    }
}

/// Interprets fsck exit codes (a bit mask, see `fsck(8)`).
fn fsck_result(device: &str, out: ExecOutput) -> Result<(), FormatError> {
    match out.code {
        // 0: clean; 1: errors corrected; 2: corrected, reboot advised (only
        // matters for the root filesystem).
        Some(0) => Ok(()),
        Some(1 | 2) => {
            tracing::warn!(device, "fsck corrected filesystem errors");
            Ok(())
        }
        Some(c) if c & 4 != 0 => Err(FormatError::HasFilesystemErrors {
            device: device.into(),
            output: format!("{}{}", out.stdout, out.stderr),
        }),
        code => Err(FormatError::FsckFailed {
            device: device.into(),
            code,
            stderr: out.stderr,
        }),
    }
}

/// Probes `device` with `blkid -p` (low-level probe, bypassing the cache).
pub(crate) fn probe_device(exec: &dyn Exec, device: &str) -> Result<DiskFormat, FormatError> {
    probed(device, exec.run("blkid", &blkid_args(device))?)
}

fn blkid_args(device: &str) -> [&str; 8] {
    ["-p", "-s", "TYPE", "-s", "PTTYPE", "-o", "export", device]
}

/// What `blkid -p`'s output `out` says is on `device`.
fn probed(device: &str, out: ExecOutput) -> Result<DiskFormat, FormatError> {
    match out.code {
        // blkid -p exits 2 when it finds nothing.
        Some(2) => Ok(DiskFormat::Unformatted),
        Some(0) => Ok(parse_blkid(&out.stdout)),
        code => Err(FormatError::ProbeFailed {
            device: device.into(),
            code,
            stderr: out.stderr,
        }),
    }
}

fn parse_blkid(stdout: &str) -> DiskFormat {
    let mut fs = None;
    let mut pt = None;
    for line in stdout.lines() {
        if let Some(v) = line.strip_prefix("TYPE=") {
            fs = Some(v.trim().to_owned());
        } else if let Some(v) = line.strip_prefix("PTTYPE=") {
            pt = Some(v.trim().to_owned());
        }
    }
    // A partition table wins: a filesystem signature next to it is most
    // likely a leftover, and formatting would destroy the partitions.
    match (pt, fs) {
        (Some(pt), _) => DiskFormat::PartitionTable(pt),
        (None, Some(fs)) => DiskFormat::Filesystem(fs),
        // Exit 0 with neither value: something we do not understand (for
        // example only a UUID); never treat it as empty.
        (None, None) => DiskFormat::Filesystem("unknown".into()),
    }
}

/// Counting semaphore from std primitives.
#[derive(Debug)]
struct Limit {
    max: usize,
    used: Mutex<usize>,
    freed: Condvar,
}

struct Permit<'a>(&'a Limit);

impl Limit {
    fn new(max: usize) -> Self {
        Limit {
            max,
            used: Mutex::new(0),
            freed: Condvar::new(),
        }
    }

    fn acquire(&self) -> Permit<'_> {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        while *used >= self.max {
            used = self.freed.wait(used).unwrap_or_else(|e| e.into_inner());
        }
        *used += 1;
        Permit(self)
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        let mut used = self.0.used.lock().unwrap_or_else(|e| e.into_inner());
        *used -= 1;
        self.0.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FakeExec;
    use crate::fake::{FakeAction, FakeMounter};
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn setup() -> (Arc<FakeMounter>, Arc<FakeExec>, SafeFormatAndMount) {
        let m = Arc::new(FakeMounter::new());
        let e = Arc::new(FakeExec::new());
        let s = SafeFormatAndMount::new(m.clone(), e.clone());
        (m, e, s)
    }

    /// Formats (if need be) and mounts `/dev/sdb` on `/st`.
    fn sdb(s: &SafeFormatAndMount, fstype: &str, options: &[&str]) -> Result<(), FormatError> {
        s.format_and_mount("/dev/sdb", Path::new("/st"), fstype, options, &[])
    }

    fn programs(e: &FakeExec) -> Vec<String> {
        e.calls().into_iter().map(|c| c.program).collect()
    }

    #[test]
    fn formats_empty_device_with_options() {
        let (m, e, s) = setup();
        e.expect("blkid", ExecOutput::exit(2, ""));
        e.expect_args("mkfs.xfs", &["-K", "/dev/sdb"], ExecOutput::ok(""));
        s.format_and_mount("/dev/sdb", Path::new("/st"), "xfs", &["nouuid"], &["-K"])
            .unwrap();
        assert_eq!(programs(&e), vec!["blkid", "mkfs.xfs"]);
        assert_eq!(e.pending(), 0);
        let mi = &m.mount_points().unwrap()[0];
        assert_eq!(
            (mi.source.as_str(), mi.fs_type.as_str()),
            ("/dev/sdb", "xfs")
        );
    }

    #[test]
    fn a_formatted_device_is_never_formatted_again() {
        let (m, e, s) = setup();
        // Its first blocks damaged: blkid finds nothing.
        e.expect("blkid", ExecOutput::exit(2, ""));
        let err = s
            .mount_formatted("/dev/sdb", Path::new("/st"), "ext4", &[], &[])
            .unwrap_err();
        assert!(
            matches!(err, FormatError::FilesystemMissing { .. }),
            "{err}"
        );
        assert_eq!(programs(&e), vec!["blkid"]);
        assert!(m.mount_points().unwrap().is_empty());
        // Intact: checked and mounted as usual.
        e.expect("blkid", ExecOutput::ok("TYPE=ext4\n"));
        e.expect("e2fsck", ExecOutput::ok(""));
        s.mount_formatted("/dev/sdb", Path::new("/st"), "ext4", &["nodev"], &[])
            .unwrap();
        assert_eq!(programs(&e), vec!["blkid", "blkid", "e2fsck"]);
        assert_eq!(m.mount_points().unwrap().len(), 1);
    }

    #[test]
    fn default_is_ext4_with_safe_flags() {
        let (_, e, s) = setup();
        e.expect("blkid", ExecOutput::exit(2, ""));
        e.expect_args("mkfs.ext4", &["-F", "-m0", "/dev/sdc"], ExecOutput::ok(""));
        s.format_and_mount("/dev/sdc", Path::new("/st"), "", &[], &[])
            .unwrap();
        assert_eq!(e.pending(), 0);
    }

    #[test]
    fn existing_ext4_is_checked_then_mounted() {
        let (m, e, s) = setup();
        e.expect("blkid", ExecOutput::ok("TYPE=ext4\n"));
        e.expect_args("e2fsck", &["-p", "/dev/sdb"], ExecOutput::exit(1, ""));
        sdb(&s, "ext4", &[]).unwrap();
        assert_eq!(programs(&e), vec!["blkid", "e2fsck"]);
        assert_eq!(m.actions().len(), 1);
    }

    #[test]
    fn fsck_uncorrected_errors_prevent_mount() {
        let (m, e, s) = setup();
        e.expect("blkid", ExecOutput::ok("TYPE=ext4\n"));
        e.expect("e2fsck", ExecOutput::exit(4, "UNEXPECTED INCONSISTENCY"));
        let err = sdb(&s, "", &[]).unwrap_err();
        assert!(
            matches!(err, FormatError::HasFilesystemErrors { .. }),
            "{err}"
        );
        assert!(m.actions().is_empty());
        e.expect("blkid", ExecOutput::ok("TYPE=ext4\n"));
        e.expect("e2fsck", ExecOutput::exit(8, "device busy"));
        let err = sdb(&s, "", &[]).unwrap_err();
        assert!(
            matches!(err, FormatError::FsckFailed { code: Some(8), .. }),
            "{err}"
        );
    }

    #[test]
    fn read_only_never_formats_nor_fscks() {
        let (m, e, s) = setup();
        e.expect("blkid", ExecOutput::exit(2, ""));
        let err = sdb(&s, "ext4", &["ro"]).unwrap_err();
        assert_eq!(
            err,
            FormatError::UnformattedReadOnly {
                device: "/dev/sdb".into()
            }
        );
        e.expect("blkid", ExecOutput::ok("TYPE=ext4\n"));
        sdb(&s, "ext4", &["ro"]).unwrap();
        assert_eq!(programs(&e), vec!["blkid", "blkid"]);
        assert!(m.mount_points().unwrap()[0].is_read_only());
    }

    #[test]
    fn mismatch_and_partition_table_are_refused() {
        let (m, e, s) = setup();
        e.expect("blkid", ExecOutput::ok("TYPE=xfs\n"));
        let err = sdb(&s, "ext4", &[]).unwrap_err();
        assert!(
            matches!(err, FormatError::FilesystemMismatch { ref existing, .. } if existing == "xfs")
        );
        e.expect("blkid", ExecOutput::ok("PTTYPE=gpt\n"));
        let err = sdb(&s, "ext4", &[]).unwrap_err();
        assert!(
            matches!(err, FormatError::HasPartitionTable { ref pttype, .. } if pttype == "gpt")
        );
        assert!(m.actions().is_empty());
        assert_eq!(programs(&e), vec!["blkid", "blkid"]);
    }

    #[test]
    fn failures_are_typed() {
        let (_, e, s) = setup();
        e.expect("blkid", ExecOutput::exit(4, "usage"));
        assert!(matches!(
            sdb(&s, "", &[]),
            Err(FormatError::ProbeFailed { code: Some(4), .. })
        ));
        e.expect("blkid", ExecOutput::exit(2, ""));
        e.expect("mkfs.ext4", ExecOutput::exit(1, "bad"));
        assert!(matches!(
            sdb(&s, "", &[]),
            Err(FormatError::FormatFailed { .. })
        ));
        e.expect("blkid", ExecOutput::exit(2, ""));
        assert!(matches!(
            sdb(&s, "zfs", &[]),
            Err(FormatError::UnsupportedFilesystem { .. })
        ));
    }

    #[test]
    fn mount_failure_keeps_sensitive_options_out_of_the_error() {
        let (m, e, s) = setup();
        let mount_ext4 = || {
            e.expect("blkid", ExecOutput::ok("TYPE=ext4\n"));
            e.expect("e2fsck", ExecOutput::ok(""));
            let secret = [Sensitive::new("key=s3cret")];
            let args = MountArgs::new("/dev/sdb", Path::new("/st"), "", &[]);
            s.format_and_mount_sensitive(&args.with_sensitive_options(&secret), &[])
        };
        m.inject_error(crate::fake::FakeOp::Mount, "/st", nix::errno::Errno::EPERM);
        let err = mount_ext4().unwrap_err();
        assert!(!err.to_string().contains("s3cret"));
        assert!(!format!("{err:?}").contains("s3cret"));
        m.clear_errors();
        mount_ext4().unwrap();
        assert!(
            matches!(&m.actions()[0], FakeAction::Mount { sensitive_options, .. } if sensitive_options.len() == 1)
        );
    }

    #[test]
    fn blkid_output_parsing() {
        assert_eq!(
            parse_blkid("TYPE=ext4\n"),
            DiskFormat::Filesystem("ext4".into())
        );
        assert_eq!(
            parse_blkid("PTTYPE=dos\nTYPE=ext4\n"),
            DiskFormat::PartitionTable("dos".into())
        );
        assert_eq!(
            parse_blkid("UUID=x\n"),
            DiskFormat::Filesystem("unknown".into())
        );
    }

    /// Slow fake mkfs that tracks how many run at once.
    struct CountingExec {
        now: AtomicUsize,
        peak: AtomicUsize,
    }

    impl Exec for CountingExec {
        fn run(&self, program: &str, _args: &[&str]) -> Result<ExecOutput, ExecError> {
            if program == "blkid" {
                return Ok(ExecOutput::exit(2, ""));
            }
            let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.peak.fetch_max(n, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(30));
            self.now.fetch_sub(1, Ordering::SeqCst);
            Ok(ExecOutput::ok(""))
        }
    }

    #[test]
    fn concurrent_formats_are_bounded() {
        let exec = Arc::new(CountingExec {
            now: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        });
        let s = SafeFormatAndMount::new(Arc::new(FakeMounter::new()), exec.clone())
            .with_max_concurrent_formats(2);
        std::thread::scope(|scope| {
            for i in 0..6 {
                let s = &s;
                scope.spawn(move || {
                    let dev = format!("/dev/sd{i}");
                    s.format_and_mount(&dev, Path::new(&format!("/m{i}")), "", &[], &[])
                        .unwrap();
                });
            }
        });
        let peak = exec.peak.load(Ordering::SeqCst);
        assert!((1..=2).contains(&peak), "peak {peak}");
        assert_eq!(s.mounter().mount_points().unwrap().len(), 6);
    }
}
