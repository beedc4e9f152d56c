//! The file-operation seam under [`crate::FileStore`]: every system call
//! the store makes goes through [`FileSystem`] and [`FsFile`], so a test
//! can run the store on a simulated filesystem that fails or crashes at
//! any step (`testing::SimFs`, feature `testing`). [`RealFs`] is the
//! default: the calls the store always made, behind one virtual call each
//! (its cost is nothing next to the system call itself).

use std::ffi::{CString, OsStr, OsString};
use std::fmt;
use std::fs::{self, DirBuilder, File};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt};
use std::path::Path;

/// How a file is opened; the store needs only these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// Read only, never following a symlink (`ELOOP`) nor blocking on a FIFO.
    Read,
    /// Write an existing file, never following a symlink.
    Write,
    /// Create a file that must not exist (mode 0600), for writing.
    CreateNew,
    /// Read and write an existing file.
    ReadWrite,
    /// Read and write, created (mode 0600) or truncated.
    CreateTruncate,
    /// Read and write, created (mode 0600) if missing, never truncated.
    CreateKeep,
    /// A directory, for fsync.
    Directory,
}

/// What [`FsFile::metadata`] tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileMeta {
    /// A regular file.
    pub is_file: bool,
    /// Its size in bytes.
    pub len: u64,
}

/// One entry of [`FileSystem::read_dir`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// Its name.
    pub name: OsString,
    /// Whether it is a directory (never following a symlink).
    pub is_dir: bool,
}

/// What [`FileSystem::open_in`] returns.
pub type Opened = io::Result<Box<dyn FsFile>>;

/// An open file or directory.
pub trait FsFile: Send + Sync + fmt::Debug {
    /// Reads exactly `buf.len()` bytes at `offset`.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Reads from the current position to the end.
    fn read_to_end(&mut self, buf: &mut Vec<u8>) -> io::Result<usize>;
    /// Reads from the current position to the end, `None` past `max`
    /// bytes; what is not a regular file reads as empty or fails (the
    /// caller asks [`metadata`](Self::metadata) then, not on every read).
    fn read_bounded(&mut self, max: usize) -> io::Result<Option<Vec<u8>>> {
        let meta = self.metadata()?;
        if !meta.is_file {
            return Ok(Some(Vec::new()));
        }
        if meta.len > max as u64 {
            return Ok(None);
        }
        let mut buf = Vec::with_capacity(meta.len as usize);
        self.read_to_end(&mut buf)?;
        Ok((buf.len() <= max).then_some(buf))
    }
    /// Writes all of `buf` at `offset`.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Truncates or extends the file.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// `fdatasync(2)`.
    fn sync_data(&self) -> io::Result<()>;
    /// `fsync(2)` (of a directory: its entries).
    fn sync_all(&self) -> io::Result<()>;
    /// Kind and size.
    fn metadata(&self) -> io::Result<FileMeta>;
    /// Takes an exclusive `flock` without waiting: false when another
    /// open file holds it.
    fn try_lock_exclusive(&self) -> io::Result<bool>;
    /// `syncfs(2)` of the filesystem holding this file.
    fn sync_filesystem(&self) -> io::Result<()>;
    /// The kernel's descriptor, where there is one: what
    /// [`FileSystem::open_in`] opens relative to.
    fn raw_fd(&self) -> Option<RawFd> {
        None
    }
}

/// The path operations of the store (paths are never followed through a
/// final symlink where [`OpenMode`] says so).
pub trait FileSystem: Send + Sync + fmt::Debug + 'static {
    /// Opens `path` as `mode` says.
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn FsFile>>;
    /// Opens `name` in the directory `dir` (opened from `at` as
    /// [`OpenMode::Directory`]) as `mode` says: a scan of thousands of
    /// files then resolves one name each, not their whole paths. By
    /// default, [`open`](Self::open) of the joined path.
    fn open_in(&self, dir: &dyn FsFile, at: &Path, name: &OsStr, mode: OpenMode) -> Opened {
        let _ = dir;
        self.open(&at.join(name), mode)
    }
    /// Creates one directory (mode 0700); `AlreadyExists` if present.
    fn create_dir(&self, path: &Path) -> io::Result<()>;
    /// Whether `path` is a directory.
    fn is_dir(&self, path: &Path) -> bool;
    /// `rename(2)`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// `renameat2(RENAME_EXCHANGE)`: `ENOENT` when `to` is absent,
    /// `EINVAL` or `ENOSYS` where the filesystem cannot.
    fn exchange(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// `unlink(2)`.
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// The entries of a directory, in no particular order.
    fn read_dir(&self, path: &Path) -> io::Result<Vec<DirEntry>>;
    /// Whether fsync does nothing here (tmpfs, ramfs): the store then
    /// keeps no journal.
    fn in_memory(&self, dir: &Path) -> bool;
}

/// The host's filesystem: what the store runs on outside tests.
#[derive(Debug, Clone, Copy, Default)]
pub struct RealFs;

impl FsFile for File {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }
    fn read_to_end(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        Read::read_to_end(self, buf)
    }
    fn read_bounded(&mut self, max: usize) -> io::Result<Option<Vec<u8>>> {
        // No fstat for a size hint (std's read_to_end asks for one), as a
        // scan reads thousands of files. A regular file's read(2) comes
        // back short only at its end, and a record file is whole before it
        // is renamed into place, so a read that does not fill the buffer
        // is the last: one read per record, not a second to see EOF.
        // The first read goes to the stack, so a record's buffer is its
        // size, not the read's (a scan keeps thousands of them).
        let mut first = [0u8; FIRST_READ];
        let first = &mut first[..FIRST_READ.min(max + 1)];
        let mut len = read_retrying(self, first)?;
        if len < first.len() {
            return Ok(Some(first[..len].to_vec()));
        }
        let mut buf = first.to_vec();
        loop {
            if len > max {
                return Ok(None);
            }
            buf.resize((len * 2).min(max + 1), 0);
            match read_retrying(self, &mut buf[len..])? {
                0 => break,
                n => len += n,
            }
        }
        buf.truncate(len);
        Ok(Some(buf))
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(self, buf, offset)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        File::set_len(self, len)
    }
    fn sync_data(&self) -> io::Result<()> {
        File::sync_data(self)
    }
    fn sync_all(&self) -> io::Result<()> {
        File::sync_all(self)
    }
    fn metadata(&self) -> io::Result<FileMeta> {
        let m = File::metadata(self)?;
        Ok(FileMeta {
            is_file: m.is_file(),
            len: m.len(),
        })
    }
    fn try_lock_exclusive(&self) -> io::Result<bool> {
        loop {
            // SAFETY: flock on a descriptor we own; no memory involved.
            if unsafe { libc::flock(self.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Ok(true);
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EWOULDBLOCK) => return Ok(false),
                _ => return Err(e),
            }
        }
    }
    fn raw_fd(&self) -> Option<RawFd> {
        Some(self.as_raw_fd())
    }
    fn sync_filesystem(&self) -> io::Result<()> {
        // SAFETY: syncfs on an open descriptor.
        if unsafe { libc::syncfs(self.as_raw_fd()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// `read(2)`, again when a signal interrupts it.
fn read_retrying(f: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match Read::read(f, buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            r => return r,
        }
    }
}

/// The first read's size: a record of the drivers' tables fits in it.
const FIRST_READ: usize = 8192;

/// `openat(2)` of `path` relative to `dir` (or the working directory,
/// `AT_FDCWD`) with the flags [`OpenMode`] stands for.
fn open_at(dir: RawFd, path: &OsStr, mode: OpenMode) -> io::Result<Box<dyn FsFile>> {
    let flags = match mode {
        OpenMode::Read => libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK,
        OpenMode::Write => libc::O_WRONLY | libc::O_NOFOLLOW,
        OpenMode::CreateNew => libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
        OpenMode::ReadWrite => libc::O_RDWR,
        OpenMode::CreateTruncate => libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC,
        OpenMode::CreateKeep => libc::O_RDWR | libc::O_CREAT,
        OpenMode::Directory => libc::O_RDONLY | libc::O_DIRECTORY,
    };
    let c =
        CString::new(path.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // A read leaves the access time alone: on a first read after a write
    // (relatime) the update dirtied every record file's inode a scan read,
    // which was a large part of a restart. Only the owner (or CAP_FOWNER)
    // may ask, so without it (EPERM) the file is opened as before.
    let mut extra = match mode {
        OpenMode::Read => libc::O_NOATIME,
        _ => 0,
    };
    loop {
        // SAFETY: a valid path string; the mode is read only with O_CREAT.
        let fd = unsafe {
            libc::openat(
                dir,
                c.as_ptr(),
                flags | extra | libc::O_CLOEXEC,
                0o600 as libc::c_uint,
            )
        };
        if fd >= 0 {
            // SAFETY: openat returned a new descriptor that nothing else owns.
            return Ok(Box::new(unsafe { File::from_raw_fd(fd) }));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => {}
            Some(libc::EPERM) if extra != 0 => extra = 0,
            _ => return Err(e),
        }
    }
}

impl FileSystem for RealFs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn FsFile>> {
        open_at(libc::AT_FDCWD, path.as_os_str(), mode)
    }

    fn open_in(&self, dir: &dyn FsFile, at: &Path, name: &OsStr, mode: OpenMode) -> Opened {
        match dir.raw_fd() {
            // One component: openat never walks out of `dir`.
            Some(fd) if !name.as_bytes().contains(&b'/') => open_at(fd, name, mode),
            _ => self.open(&at.join(name), mode),
        }
    }

    fn create_dir(&self, path: &Path) -> io::Result<()> {
        DirBuilder::new().mode(0o700).create(path)
    }

    fn is_dir(&self, path: &Path) -> bool {
        path.is_dir()
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn exchange(&self, from: &Path, to: &Path) -> io::Result<()> {
        let c = |p: &Path| {
            CString::new(p.as_os_str().as_bytes())
                .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
        };
        let (f, t) = (c(from)?, c(to)?);
        // SAFETY: two valid path strings; renameat2 only reads them.
        let r = unsafe {
            libc::syscall(
                libc::SYS_renameat2,
                libc::AT_FDCWD,
                f.as_ptr(),
                libc::AT_FDCWD,
                t.as_ptr(),
                libc::RENAME_EXCHANGE,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<DirEntry>> {
        let mut out = Vec::new();
        for entry in fs::read_dir(path)? {
            let entry = entry?;
            out.push(DirEntry {
                is_dir: entry.file_type().is_ok_and(|t| t.is_dir()),
                name: entry.file_name(),
            });
        }
        Ok(out)
    }

    fn in_memory(&self, dir: &Path) -> bool {
        const TMPFS_MAGIC: i64 = 0x0102_1994;
        const RAMFS_MAGIC: i64 = 0x8584_58f6;
        let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
            return false;
        };
        let mut st = std::mem::MaybeUninit::<libc::statfs>::uninit();
        // SAFETY: a valid path string and a buffer statfs fills on success.
        if unsafe { libc::statfs(path.as_ptr(), st.as_mut_ptr()) } != 0 {
            return false;
        }
        // SAFETY: statfs returned 0, so the buffer is initialised.
        // f_type's integer type differs between architectures.
        #[allow(clippy::unnecessary_cast)]
        let f_type = unsafe { st.assume_init() }.f_type as i64;
        f_type == TMPFS_MAGIC || f_type == RAMFS_MAGIC
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reading_a_record_leaves_its_access_time_alone() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("record");
        std::fs::write(&path, b"a record").unwrap();
        // Accessed before it was last changed: relatime would update it.
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        let file = File::options().write(true).open(&path).unwrap();
        file.set_times(std::fs::FileTimes::new().set_accessed(old))
            .unwrap();
        drop(file);
        let atime = |p: &Path| std::fs::symlink_metadata(p).unwrap().atime();
        let before = atime(&path);
        let mut f = RealFs.open(&path, OpenMode::Read).unwrap();
        assert_eq!(f.read_bounded(1 << 20).unwrap().unwrap(), b"a record");
        let dir = RealFs.open(tmp.path(), OpenMode::Directory).unwrap();
        let name = OsStr::new("record");
        let mut f = RealFs
            .open_in(&*dir, tmp.path(), name, OpenMode::Read)
            .unwrap();
        assert_eq!(f.read_bounded(1 << 20).unwrap().unwrap(), b"a record");
        assert_eq!(atime(&path), before);
    }

    #[test]
    fn open_in_reads_by_name_and_never_follows_a_symlink() {
        let tmp = tempfile::tempdir().unwrap();
        let fs = RealFs;
        let dir = fs.open(tmp.path(), OpenMode::Directory).unwrap();
        let small = b"a record".to_vec();
        let large = vec![7u8; FIRST_READ * 3 + 5];
        std::fs::write(tmp.path().join("small"), &small).unwrap();
        std::fs::write(tmp.path().join("large"), &large).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("small"), tmp.path().join("link")).unwrap();
        let read = |name: &str, max: usize| {
            fs.open_in(&*dir, tmp.path(), OsStr::new(name), OpenMode::Read)
                .and_then(|mut f| f.read_bounded(max))
        };
        assert_eq!(read("small", 1 << 20).unwrap(), Some(small.clone()));
        assert_eq!(read("small", small.len()).unwrap(), Some(small));
        assert_eq!(read("large", 1 << 20).unwrap(), Some(large.clone()));
        assert_eq!(read("large", large.len()).unwrap(), Some(large.clone()));
        assert_eq!(read("large", large.len() - 1).unwrap(), None, "past max");
        let err = read("link", 1 << 20).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ELOOP));
        let err = read("missing", 1 << 20).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }
}
