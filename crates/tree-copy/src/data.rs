//! Copying a file's bytes: shared extents where possible, holes kept.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use rustix::fs::{self as rfs, Mode, OFlags, SeekFrom};
use rustix::io::Errno;

use crate::CopyError;

/// Copies `len` bytes of `src` into the empty file `dst`: one `FICLONE`
/// when the filesystem shares extents, otherwise each data region found
/// with `SEEK_DATA`/`SEEK_HOLE` (holes stay holes), then sets the length.
/// Returns the bytes copied (data regions only).
pub(crate) fn copy_data(src: &File, dst: &File, len: u64) -> io::Result<u64> {
    if len == 0 {
        return Ok(0);
    }
    if rfs::ioctl_ficlone(dst, src).is_ok() {
        return Ok(len);
    }
    let mut offset = 0u64;
    let mut copied = 0u64;
    while offset < len {
        let start = match rfs::seek(src, SeekFrom::Data(offset)) {
            Ok(start) => start,
            // Nothing but a hole from here on.
            Err(Errno::NXIO) => break,
            Err(e) => return Err(e.into()),
        };
        if start >= len {
            break;
        }
        let end = rfs::seek(src, SeekFrom::Hole(start))?.min(len);
        copy_range(src, dst, start, end)?;
        copied += end - start;
        offset = end;
    }
    dst.set_len(len)?;
    Ok(copied)
}

/// Copies bytes `start..end` at the same offsets, in the kernel when it can.
fn copy_range(src: &File, dst: &File, mut start: u64, end: u64) -> io::Result<()> {
    while start < end {
        let (mut from, mut to) = (start, start);
        let want = (end - start).min(1 << 30) as usize;
        match rfs::copy_file_range(src, Some(&mut from), dst, Some(&mut to), want) {
            // The source shrank under us: what is left reads as a hole.
            Ok(0) => return Ok(()),
            Ok(n) => start += n as u64,
            Err(Errno::XDEV | Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => {
                return copy_range_by_hand(src, dst, start, end);
            }
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn copy_range_by_hand(src: &File, dst: &File, mut start: u64, end: u64) -> io::Result<()> {
    let mut buf = vec![0u8; (end - start).min(1 << 20) as usize];
    while start < end {
        let want = ((end - start) as usize).min(buf.len());
        let n = match src.read_at(&mut buf[..want], start) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        dst.write_all_at(&buf[..n], start)?;
        start += n as u64;
    }
    Ok(())
}

/// Copies the regular file `src` to `dst`, which must not exist: data
/// (extents shared where the filesystem can, holes kept) and permission
/// bits, synced before returning. `src` must not be a symlink. On error
/// nothing is left at `dst`. Returns the file's length.
///
/// ```
/// let tmp = tempfile::tempdir().unwrap();
/// let (a, b) = (tmp.path().join("a.img"), tmp.path().join("b.img"));
/// let f = std::fs::File::create(&a).unwrap();
/// f.set_len(64 << 20).unwrap(); // sparse
/// std::os::unix::fs::FileExt::write_at(&f, b"superblock", 1 << 20).unwrap();
///
/// assert_eq!(tree_copy::copy_file(&a, &b).unwrap(), 64 << 20);
/// let mut buf = [0u8; 10];
/// std::os::unix::fs::FileExt::read_at(&std::fs::File::open(&b).unwrap(), &mut buf, 1 << 20).unwrap();
/// assert_eq!(&buf, b"superblock");
/// assert!(tree_copy::copy_file(&a, &b).is_err(), "an existing destination is never overwritten");
/// ```
pub fn copy_file(src: &Path, dst: &Path) -> Result<u64, CopyError> {
    let source = rfs::open(
        src,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK,
        Mode::empty(),
    )
    .map(File::from)
    .map_err(|e| CopyError::new("opening", src, e))?;
    let meta = source
        .metadata()
        .map_err(|e| CopyError::new("inspecting", src, e))?;
    if !meta.is_file() {
        return Err(CopyError::new(
            "copying",
            src,
            io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"),
        ));
    }
    let target = rfs::open(
        dst,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map(File::from)
    .map_err(|e| CopyError::new("creating", dst, e))?;
    let result = (|| {
        use std::os::unix::fs::PermissionsExt;
        copy_data(&source, &target, meta.len())
            .map_err(|e| CopyError::new("copying data to", dst, e))?;
        let mode = std::fs::Permissions::from_mode(meta.permissions().mode() & 0o7777);
        target
            .set_permissions(mode)
            .map_err(|e| CopyError::new("setting the mode of", dst, e))?;
        target
            .sync_all()
            .map_err(|e| CopyError::new("syncing", dst, e))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(dst);
    }
    result.map(|()| meta.len())
}
