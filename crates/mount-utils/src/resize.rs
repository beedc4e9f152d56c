//! Growing a filesystem after its device grew.

use std::path::Path;
use std::sync::Arc;

use nix::errno::Errno;

use crate::exec::{Exec, ExecError, ExecOutput};
use crate::format::{DiskFormat, FormatError, probe_device};

/// Why a resize or size query failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResizeError {
    /// The device has no filesystem to grow.
    #[error("device {device} has no filesystem")]
    NoFilesystem {
        /// Device path.
        device: String,
    },
    /// Growing this filesystem type is not supported.
    #[error("resizing {fstype} is not supported (supported: ext3, ext4, xfs, btrfs)")]
    UnsupportedFilesystem {
        /// Filesystem type.
        fstype: String,
    },
    /// Probing the device failed.
    #[error(transparent)]
    Probe(#[from] FormatError),
    /// Reading the device size failed.
    #[error("size of {device}: {errno}")]
    DeviceSize {
        /// Device path.
        device: String,
        /// Kernel error.
        errno: Errno,
    },
    /// A tool exited non-zero.
    #[error("{program} failed (exit {code:?}): {stderr}")]
    CommandFailed {
        /// Program name.
        program: String,
        /// Exit code.
        code: Option<i32>,
        /// Its standard error.
        stderr: String,
    },
    /// A tool's output did not contain the expected values.
    #[error("cannot find {what} in the output of {program}")]
    UnexpectedOutput {
        /// Program name.
        program: String,
        /// What was looked for.
        what: &'static str,
    },
    /// A tool could not be run.
    #[error(transparent)]
    Exec(#[from] ExecError),
}

type DeviceSizeFn = dyn Fn(&str) -> std::io::Result<u64> + Send + Sync;

/// Grows ext3/ext4 (`resize2fs` on the device), xfs (`xfs_growfs` on the
/// mount path) and btrfs (`btrfs filesystem resize max` on the mount path),
/// and tells whether that is needed.
///
/// ```
/// use std::{path::Path, sync::Arc};
/// use mount_utils::{ExecOutput, FakeExec, ResizeFs};
///
/// let exec = Arc::new(FakeExec::new());
/// exec.expect("blkid", ExecOutput::ok("TYPE=ext4\n"));
/// exec.expect("dumpe2fs", ExecOutput::ok("Block count: 262144\nBlock size: 4096\n"));
/// // The device is 2 GiB, the filesystem 1 GiB.
/// let r = ResizeFs::new(exec.clone()).with_device_size_fn(|_| Ok(2 << 30));
/// assert!(r.need_resize("/dev/sdb", Path::new("/staging")).unwrap());
/// ```
#[derive(Clone)]
pub struct ResizeFs {
    exec: Arc<dyn Exec>,
    device_size: Arc<DeviceSizeFn>,
}

impl std::fmt::Debug for ResizeFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResizeFs").finish_non_exhaustive()
    }
}

impl ResizeFs {
    /// Runs tools with `exec`; device sizes come from `BLKGETSIZE64`.
    pub fn new(exec: Arc<dyn Exec>) -> Self {
        ResizeFs {
            exec,
            device_size: Arc::new(|dev: &str| crate::block::device_size(dev)),
        }
    }

    /// Replaces how device sizes are read (for tests without devices).
    pub fn with_device_size_fn(
        mut self,
        f: impl Fn(&str) -> std::io::Result<u64> + Send + Sync + 'static,
    ) -> Self {
        self.device_size = Arc::new(f);
        self
    }

    fn fs_type(&self, device: &str) -> Result<String, ResizeError> {
        match probe_device(self.exec.as_ref(), device)? {
            DiskFormat::Filesystem(fs) => Ok(fs),
            _ => Err(ResizeError::NoFilesystem {
                device: device.into(),
            }),
        }
    }

    fn run(&self, program: &str, args: &[&str]) -> Result<ExecOutput, ResizeError> {
        let out = self.exec.run(program, args)?;
        if !out.success() {
            return Err(ResizeError::CommandFailed {
                program: program.into(),
                code: out.code,
                stderr: out.stderr,
            });
        }
        Ok(out)
    }

    /// Filesystem size and block size in bytes, from `dumpe2fs -h`,
    /// `xfs_info` or `btrfs filesystem show --raw`.
    pub fn filesystem_size(
        &self,
        device: &str,
        mount_path: &Path,
    ) -> Result<(u64, u64), ResizeError> {
        let fstype = self.fs_type(device)?;
        let mp = mount_path.to_string_lossy();
        match fstype.as_str() {
            "ext2" | "ext3" | "ext4" => {
                let out = self.run("dumpe2fs", &["-h", device])?;
                parse_dumpe2fs(&out.stdout)
            }
            "xfs" => {
                let out = self.run("xfs_info", &[&mp])?;
                parse_xfs_info(&out.stdout)
            }
            "btrfs" => {
                let out = self.run("btrfs", &["filesystem", "show", "--raw", &mp])?;
                parse_btrfs_show(&out.stdout, device).map(|size| (size, 4096))
            }
            _ => Err(ResizeError::UnsupportedFilesystem { fstype }),
        }
    }

    /// Whether the device is larger than the filesystem by more than one
    /// filesystem block (smaller slack cannot be used anyway).
    pub fn need_resize(&self, device: &str, mount_path: &Path) -> Result<bool, ResizeError> {
        let dev_size = (self.device_size)(device).map_err(|e| ResizeError::DeviceSize {
            device: device.into(),
            errno: crate::error::io_errno(&e),
        })?;
        let (fs_size, block) = self.filesystem_size(device, mount_path)?;
        Ok(dev_size > fs_size.saturating_add(block))
    }

    /// Grows the filesystem on `device`, mounted at `mount_path`, to fill
    /// the device.
    pub fn resize(&self, device: &str, mount_path: &Path) -> Result<(), ResizeError> {
        let fstype = self.fs_type(device)?;
        let mp = mount_path.to_string_lossy();
        tracing::info!(device, fstype, "growing filesystem");
        match fstype.as_str() {
            "ext3" | "ext4" => self.run("resize2fs", &[device]).map(drop),
            "xfs" => self.run("xfs_growfs", &["-d", &mp]).map(drop),
            "btrfs" => self
                .run("btrfs", &["filesystem", "resize", "max", &mp])
                .map(drop),
            _ => Err(ResizeError::UnsupportedFilesystem { fstype }),
        }
    }
}

fn field_u64(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|rest| rest.trim_start_matches(':').trim().parse().ok())
}

fn parse_dumpe2fs(out: &str) -> Result<(u64, u64), ResizeError> {
    let missing = |what| ResizeError::UnexpectedOutput {
        program: "dumpe2fs".into(),
        what,
    };
    let count = field_u64(out, "Block count").ok_or_else(|| missing("Block count"))?;
    let size = field_u64(out, "Block size").ok_or_else(|| missing("Block size"))?;
    Ok((count * size, size))
}

fn parse_xfs_info(out: &str) -> Result<(u64, u64), ResizeError> {
    // data     =                       bsize=4096   blocks=262144, imaxpct=25
    let line = out.lines().find(|l| l.trim_start().starts_with("data"));
    let value = |key: &str| {
        line?
            .split_whitespace()
            .find_map(|t| t.strip_prefix(key))
            .and_then(|v| v.trim_end_matches(',').parse::<u64>().ok())
    };
    match (value("bsize="), value("blocks=")) {
        (Some(bsize), Some(blocks)) => Ok((bsize * blocks, bsize)),
        _ => Err(ResizeError::UnexpectedOutput {
            program: "xfs_info".into(),
            what: "data bsize/blocks",
        }),
    }
}

fn parse_btrfs_show(out: &str, device: &str) -> Result<u64, ResizeError> {
    // devid    1 size 1073741824 used 230686720 path /dev/loop0
    let devs: Vec<(u64, &str)> = out
        .lines()
        .filter(|l| l.trim_start().starts_with("devid"))
        .filter_map(|l| {
            let t: Vec<&str> = l.split_whitespace().collect();
            let size = t
                .iter()
                .position(|&x| x == "size")
                .and_then(|i| t.get(i + 1))?
                .parse()
                .ok()?;
            let path = t
                .iter()
                .position(|&x| x == "path")
                .and_then(|i| t.get(i + 1))
                .copied()
                .unwrap_or("");
            Some((size, path))
        })
        .collect();
    devs.iter()
        .find(|(_, p)| *p == device)
        .or(devs.first())
        .map(|(s, _)| *s)
        .ok_or(ResizeError::UnexpectedOutput {
            program: "btrfs".into(),
            what: "devid size",
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FakeExec;

    fn with(size: u64) -> (Arc<FakeExec>, ResizeFs) {
        let e = Arc::new(FakeExec::new());
        let r = ResizeFs::new(e.clone()).with_device_size_fn(move |_| Ok(size));
        (e, r)
    }

    const DUMPE2FS: &str = "dumpe2fs 1.47.0 (5-Feb-2023)\nFilesystem volume name:   <none>\nBlock count:              16384\nReserved block count:     0\nBlock size:               4096\n";
    const XFS_INFO: &str = "meta-data=/dev/loop0             isize=512    agcount=4, agsize=65536 blks\n         =                       sectsz=512   attr=2, projid32bit=1\ndata     =                       bsize=4096   blocks=262144, imaxpct=25\n         =                       sunit=0      swidth=0 blks\nnaming   =version 2              bsize=4096   ascii-ci=0, ftype=1\nlog      =internal log           bsize=4096   blocks=16384, version=2\n";
    const BTRFS: &str = "Label: none  uuid: 1a2b\n\tTotal devices 2 FS bytes used 147456\n\tdevid    1 size 1073741824 used 230686720 path /dev/loop0\n\tdevid    2 size 2147483648 used 0 path /dev/loop1\n\n";

    #[test]
    fn ext4_need_resize_from_sizes() {
        let (e, r) = with(64 << 20);
        e.expect("blkid", ExecOutput::ok("TYPE=ext4\n"));
        e.expect_args("dumpe2fs", &["-h", "/dev/x"], ExecOutput::ok(DUMPE2FS));
        assert!(!r.need_resize("/dev/x", Path::new("/m")).unwrap());
        let (e, r) = with(128 << 20);
        e.expect("blkid", ExecOutput::ok("TYPE=ext4\n"));
        e.expect("dumpe2fs", ExecOutput::ok(DUMPE2FS));
        assert!(r.need_resize("/dev/x", Path::new("/m")).unwrap());
        // Less than one block of slack is not worth a resize.
        let (e, r) = with((64 << 20) + 1024);
        e.expect("blkid", ExecOutput::ok("TYPE=ext4\n"));
        e.expect("dumpe2fs", ExecOutput::ok(DUMPE2FS));
        assert!(!r.need_resize("/dev/x", Path::new("/m")).unwrap());
    }

    #[test]
    fn xfs_and_btrfs_sizes() {
        let (e, r) = with(0);
        e.expect("blkid", ExecOutput::ok("TYPE=xfs\n"));
        e.expect_args("xfs_info", &["/m"], ExecOutput::ok(XFS_INFO));
        assert_eq!(
            r.filesystem_size("/dev/x", Path::new("/m")).unwrap(),
            (1 << 30, 4096)
        );
        e.expect("blkid", ExecOutput::ok("TYPE=btrfs\n"));
        e.expect("btrfs", ExecOutput::ok(BTRFS));
        assert_eq!(
            r.filesystem_size("/dev/loop1", Path::new("/m")).unwrap().0,
            2 << 30
        );
        assert_eq!(parse_btrfs_show(BTRFS, "/dev/other").unwrap(), 1 << 30);
    }

    #[test]
    fn resize_runs_the_right_tool() {
        let (e, r) = with(0);
        e.expect("blkid", ExecOutput::ok("TYPE=ext4\n"));
        e.expect_args("resize2fs", &["/dev/x"], ExecOutput::ok(""));
        e.expect("blkid", ExecOutput::ok("TYPE=xfs\n"));
        e.expect_args("xfs_growfs", &["-d", "/m"], ExecOutput::ok(""));
        e.expect("blkid", ExecOutput::ok("TYPE=btrfs\n"));
        e.expect_args(
            "btrfs",
            &["filesystem", "resize", "max", "/m"],
            ExecOutput::ok(""),
        );
        for _ in 0..3 {
            r.resize("/dev/x", Path::new("/m")).unwrap();
        }
        assert_eq!(e.pending(), 0);
        e.expect("blkid", ExecOutput::ok("TYPE=vfat\n"));
        assert!(matches!(
            r.resize("/dev/x", Path::new("/m")),
            Err(ResizeError::UnsupportedFilesystem { .. })
        ));
        e.expect("blkid", ExecOutput::exit(2, ""));
        assert!(matches!(
            r.resize("/dev/x", Path::new("/m")),
            Err(ResizeError::NoFilesystem { .. })
        ));
        e.expect("blkid", ExecOutput::ok("TYPE=ext4\n"));
        e.expect("resize2fs", ExecOutput::exit(1, "no space"));
        assert!(matches!(
            r.resize("/dev/x", Path::new("/m")),
            Err(ResizeError::CommandFailed { code: Some(1), .. })
        ));
    }

    #[test]
    fn garbage_tool_output_is_an_error() {
        assert!(parse_dumpe2fs("nothing").is_err());
        assert!(parse_xfs_info("data = bsize=x").is_err());
        assert!(parse_btrfs_show("", "/dev/x").is_err());
    }
}
