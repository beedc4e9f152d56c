//! [`copy_tree`]: a directory tree, walked through open directories.

use std::collections::HashMap;
use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{self as rfs, AtFlags, Dir, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

use crate::CopyError;
use crate::data::copy_data;
use crate::meta::{Node, copy_metadata};

/// What [`copy_tree`] copied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreeStats {
    /// Directories below the root.
    pub dirs: u64,
    /// Regular files (each inode once).
    pub files: u64,
    /// Symbolic links (each inode once).
    pub symlinks: u64,
    /// FIFOs, sockets and device nodes (each inode once).
    pub specials: u64,
    /// Further names of an inode already copied, linked again.
    pub hard_links: u64,
    /// Bytes of file data copied (holes excluded).
    pub bytes: u64,
    /// Directories on another filesystem (mount points), not copied.
    pub skipped_mounts: u64,
}

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Copies the directory `src` into `dst` (created if absent; an existing
/// one must not contain any of `src`'s names), keeping for every node its
/// owner, group, mode, xattrs and timestamps, hard links between files of
/// the tree, symlinks as symlinks (never followed), special files and
/// holes; `dst` itself gets `src`'s metadata. Directories on another
/// filesystem than `src` are skipped and counted. Data is flushed
/// (`syncfs`) before it returns.
///
/// On error the copy stops and `dst` holds whatever was copied so far:
/// the caller removes it. Each directory level keeps two descriptors open,
/// so the depth of a tree is bounded by the open-file limit.
pub fn copy_tree(src: &Path, dst: &Path) -> Result<TreeStats, CopyError> {
    let src_root = open_dir(None, src).map_err(|e| CopyError::new("opening", src, e))?;
    let st = rfs::fstat(&src_root).map_err(|e| CopyError::new("inspecting", src, e))?;
    match rfs::mkdir(dst, Mode::from_raw_mode(0o700)) {
        Ok(()) | Err(Errno::EXIST) => {}
        Err(e) => return Err(CopyError::new("creating", dst, e)),
    }
    let dst_root = open_dir(None, dst).map_err(|e| CopyError::new("opening", dst, e))?;
    let entries = list(&src_root).map_err(|e| CopyError::new("listing", src, e))?;
    let mut copier = Copier {
        src: src.to_owned(),
        dst: dst.to_owned(),
        dst_root: dst_root
            .try_clone()
            .map_err(|e| CopyError::new("opening", dst, e))?,
        dev: st.st_dev,
        links: HashMap::new(),
        stats: TreeStats::default(),
    };
    let root = Frame {
        src: src_root,
        dst: dst_root,
        st,
        rel: PathBuf::new(),
        entries: entries.into_iter(),
    };
    copier.run(root)?;
    rfs::syncfs(&copier.dst_root).map_err(|e| CopyError::new("syncing", dst, e))?;
    Ok(copier.stats)
}

/// A directory being copied.
struct Frame {
    src: OwnedFd,
    dst: OwnedFd,
    st: Stat,
    /// Its path below the roots.
    rel: PathBuf,
    entries: std::vec::IntoIter<CString>,
}

struct Copier {
    src: PathBuf,
    dst: PathBuf,
    dst_root: OwnedFd,
    dev: u64,
    /// Inodes with several links already copied: (dev, ino) → path below
    /// the destination root.
    links: HashMap<(u64, u64), PathBuf>,
    stats: TreeStats,
}

impl Copier {
    /// Depth first, without recursion: a deep tree cannot overflow the stack.
    fn run(&mut self, root: Frame) -> Result<(), CopyError> {
        let mut stack = vec![root];
        while let Some(top) = stack.last_mut() {
            match top.entries.next() {
                Some(name) => {
                    if let Some(child) = self.entry(top, &name)? {
                        stack.push(child);
                    }
                }
                None => {
                    let done = stack.pop().expect("a frame");
                    // Directory metadata last: creating entries changes mtime.
                    copy_metadata(
                        Node::Fd(done.src.as_fd()),
                        Node::Fd(done.dst.as_fd()),
                        &done.st,
                        false,
                        &self.dst.join(&done.rel),
                    )?;
                }
            }
        }
        Ok(())
    }

    /// Copies one entry of `dir`; a subdirectory comes back as a new frame.
    fn entry(&mut self, dir: &Frame, name: &CStr) -> Result<Option<Frame>, CopyError> {
        let rel = dir.rel.join(OsStr::from_bytes(name.to_bytes()));
        let src_path = self.src.join(&rel);
        let dst_path = self.dst.join(&rel);
        let st = match rfs::statat(&dir.src, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            // Removed since the listing: nothing to copy.
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(CopyError::new("inspecting", &src_path, e)),
        };
        let kind = FileType::from_raw_mode(st.st_mode);
        if kind == FileType::Directory {
            if st.st_dev != self.dev {
                self.stats.skipped_mounts += 1;
                return Ok(None);
            }
            rfs::mkdirat(&dir.dst, name, Mode::from_raw_mode(0o700))
                .map_err(|e| CopyError::new("creating", &dst_path, e))?;
            let src = open_dir(Some(&dir.src), name)
                .map_err(|e| CopyError::new("opening", &src_path, e))?;
            same_node(&src, &st).map_err(|e| CopyError::new("opening", &src_path, e))?;
            let dst = open_dir(Some(&dir.dst), name)
                .map_err(|e| CopyError::new("opening", &dst_path, e))?;
            let entries = list(&src).map_err(|e| CopyError::new("listing", &src_path, e))?;
            self.stats.dirs += 1;
            return Ok(Some(Frame {
                src,
                dst,
                st,
                rel,
                entries: entries.into_iter(),
            }));
        }
        let key = (st.st_dev, st.st_ino);
        if st.st_nlink > 1
            && let Some(first) = self.links.get(&key)
        {
            rfs::linkat(&self.dst_root, first, &dir.dst, name, AtFlags::empty())
                .map_err(|e| CopyError::new("linking", &dst_path, e))?;
            self.stats.hard_links += 1;
            return Ok(None);
        }
        match kind {
            FileType::RegularFile => self.file(dir, name, &st, &src_path, &dst_path)?,
            FileType::Symlink => {
                let target = rfs::readlinkat(&dir.src, name, Vec::new())
                    .map_err(|e| CopyError::new("reading", &src_path, e))?;
                rfs::symlinkat(target.as_c_str(), &dir.dst, name)
                    .map_err(|e| CopyError::new("creating", &dst_path, e))?;
                let (s, d) = (at(&dir.src, name), at(&dir.dst, name));
                copy_metadata(s, d, &st, true, &dst_path)?;
                self.stats.symlinks += 1;
            }
            FileType::Fifo
            | FileType::Socket
            | FileType::CharacterDevice
            | FileType::BlockDevice => {
                rfs::mknodat(&dir.dst, name, kind, Mode::from_raw_mode(0o600), st.st_rdev)
                    .map_err(|e| CopyError::new("creating", &dst_path, e))?;
                let (s, d) = (at(&dir.src, name), at(&dir.dst, name));
                copy_metadata(s, d, &st, false, &dst_path)?;
                self.stats.specials += 1;
            }
            _ => {
                return Err(CopyError::new(
                    "copying",
                    &src_path,
                    io::Error::new(io::ErrorKind::Unsupported, "unknown file type"),
                ));
            }
        }
        if st.st_nlink > 1 {
            self.links.insert(key, rel);
        }
        Ok(None)
    }

    fn file(
        &mut self,
        dir: &Frame,
        name: &CStr,
        st: &Stat,
        src_path: &Path,
        dst_path: &Path,
    ) -> Result<(), CopyError> {
        // NONBLOCK: if the name became a FIFO since the lstat, opening it
        // must not hang; same_node then refuses it.
        let flags =
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK;
        let src = rfs::openat(&dir.src, name, flags, Mode::empty())
            .map(File::from)
            .map_err(|e| CopyError::new("opening", src_path, e))?;
        same_node(&src, st).map_err(|e| CopyError::new("opening", src_path, e))?;
        let create =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let dst = rfs::openat(&dir.dst, name, create, Mode::from_raw_mode(0o600))
            .map(File::from)
            .map_err(|e| CopyError::new("creating", dst_path, e))?;
        let copied = copy_data(&src, &dst, st.st_size as u64)
            .map_err(|e| CopyError::new("copying data to", dst_path, e))?;
        copy_metadata(
            Node::Fd(src.as_fd()),
            Node::Fd(dst.as_fd()),
            st,
            false,
            dst_path,
        )?;
        self.stats.files += 1;
        self.stats.bytes += copied;
        Ok(())
    }
}

fn at<'a>(dir: &'a OwnedFd, name: &'a CStr) -> Node<'a> {
    Node::At {
        dir: dir.as_fd(),
        name,
    }
}

fn open_dir<P: rustix::path::Arg>(
    parent: Option<&OwnedFd>,
    path: P,
) -> rustix::io::Result<OwnedFd> {
    match parent {
        Some(dir) => rfs::openat(dir, path, DIR_FLAGS, Mode::empty()),
        None => rfs::open(path, DIR_FLAGS, Mode::empty()),
    }
}

/// The names in a directory, sorted (so copies are made in a stable order).
fn list(dir: &OwnedFd) -> rustix::io::Result<Vec<CString>> {
    let mut names = Vec::new();
    for entry in Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if name != c"." && name != c".." {
            names.push(name.to_owned());
        }
    }
    names.sort();
    Ok(names)
}

/// Fails unless `fd` is the node `st` described: the name was not swapped
/// for something else between the `lstat` and the open.
fn same_node(fd: &impl AsFd, st: &Stat) -> io::Result<()> {
    let now = rfs::fstat(fd)?;
    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) {
        return Err(io::Error::other("changed while being copied"));
    }
    Ok(())
}
