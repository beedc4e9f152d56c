//! [`SimFs`]: an in-memory filesystem behind the store's seam that keeps
//! what a crash keeps, and lets a test fail or crash any effect.
//!
//! One file over 700 lines: the operation log, the sync rules and the
//! crash replay are one model over one inode table.
//!
//! Every change is logged as an operation on inodes. An operation becomes
//! persistent when something that covers it is synced: a file's data ops
//! by `fsync`/`fdatasync` of that file, a directory's entry ops (create,
//! mkdir, rename, exchange, unlink) by `fsync` of that directory, and
//! everything by `syncfs`. A crash keeps the persistent operations plus,
//! depending on the chosen [`CrashKeep`], some of the others: none (the
//! worst case), a prefix in the order they were made, all, or one of the
//! reordered states below.
//!
//! # Reordered crash states
//!
//! ext4 with `data=ordered` (its default) does not write unsynced changes
//! in the order they were made. [`SimFs::reordered_states`] lists the
//! states in between that it may leave, under these rules:
//!
//! - metadata (create, mkdir, rename, exchange, unlink, truncate) reaches
//!   the disk in order: the jbd2 journal commits transactions in sequence,
//!   so a kept metadata operation keeps every earlier one;
//! - file data is written back page by page, independently of the
//!   metadata and of other pages: a later write may persist before an
//!   earlier one, but a page holds its latest contents, so a later write
//!   to a page keeps the earlier writes to that page;
//! - a write that grows a file persists with its new size (ordered mode
//!   writes the data before the size that exposes it);
//! - a rename over an existing file persists only with the renamed
//!   file's data (`auto_da_alloc` flushes it first); a rename to a new
//!   name does not wait, so the name may survive without the data.
//!
//! The states listed, bounded by [`MAX_REORDERED`] and each distinct from
//! the worst case, from keeping everything and from the others: the
//! metadata kept without the data, the data without the metadata, each
//! prefix of the operations since the last sync, and for each of those
//! operations the state without it (and what the rules drop with it).
//! Older unsynced operations vary only in the first two: the states that
//! matter most are those of the step in flight, and the runner crashes
//! at every step.
//!
//! One file of about 1,000 lines: the image, the operation log and the
//! handles that append to it are one model, each part read with the others.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::fmt;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::fs::{DirEntry, FileMeta, FileSystem, FsFile, OpenMode};

type Ino = u64;
const ROOT: Ino = 1;

/// An effect the store is about to make, passed to the [`FsHook`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsEffect {
    /// A file is created.
    Create,
    /// A directory is created.
    Mkdir,
    /// Data is written.
    Write,
    /// A file's length is set (or it is truncated at open).
    Truncate,
    /// A file or directory is synced (`fsync`, `fdatasync`, `syncfs`).
    Sync,
    /// A rename or exchange.
    Rename,
    /// An unlink.
    Unlink,
}

/// Decides, before each effect, whether it happens: `Err` fails it (the
/// effect is not made). A crash is a hook that fails the effect and then
/// has the test call [`SimFs::crash`].
pub trait FsHook: Send + Sync {
    /// Called before `effect` on `path`.
    fn before(&self, effect: FsEffect, path: &Path) -> io::Result<()>;
}

/// Which of the unsynced operations a crash keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CrashKeep {
    /// The first `n` of them, in the order they were made (0: the worst
    /// case, only what was synced).
    Prefix(usize),
    /// All of them (as if the process died and the kernel flushed later).
    All,
    /// The `i`th of the states [`SimFs::reordered_states`] counts (all of
    /// them if there are not that many).
    Reordered(usize),
}

/// At most this many reordered states per crash (see the module docs).
pub const MAX_REORDERED: usize = 2;

/// The granularity of data writeback.
const PAGE: u64 = 4096;

#[derive(Debug, Clone)]
enum Node {
    /// Shared until written: crash states are images built side by side.
    File(Arc<Vec<u8>>),
    Dir(BTreeMap<OsString, Ino>),
}

#[derive(Debug, Clone)]
enum Op {
    Link {
        dir: Ino,
        name: OsString,
        ino: Ino,
        dir_node: bool,
    },
    Unlink {
        dir: Ino,
        name: OsString,
    },
    /// `from` and `to` are (directory, name) as [`parent`] gives them.
    Rename {
        from: (Ino, OsString),
        to: (Ino, OsString),
        exchange: bool,
        /// The inode renamed, and whether the rename replaced a file.
        ino: Ino,
        replaces: bool,
    },
    Write {
        ino: Ino,
        offset: u64,
        bytes: Vec<u8>,
    },
    SetLen {
        ino: Ino,
        len: u64,
    },
}

impl Op {
    /// Whether syncing `synced` (a file or a directory) makes this op
    /// persistent.
    fn covered_by(&self, synced: Ino) -> bool {
        match self {
            Op::Link { dir, .. } | Op::Unlink { dir, .. } => *dir == synced,
            Op::Rename { from, to, .. } => from.0 == synced || to.0 == synced,
            Op::Write { ino, .. } | Op::SetLen { ino, .. } => *ino == synced,
        }
    }

    /// File data, written back apart from the metadata journal.
    fn is_data(&self) -> bool {
        matches!(self, Op::Write { .. })
    }

    /// The pages a write covers.
    fn pages(&self) -> Option<(Ino, u64, u64)> {
        match self {
            Op::Write { ino, offset, bytes } if !bytes.is_empty() => Some((
                *ino,
                offset / PAGE,
                (offset + bytes.len() as u64 - 1) / PAGE,
            )),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
struct Image {
    nodes: HashMap<Ino, Node>,
}

impl Image {
    fn new() -> Self {
        Image {
            nodes: HashMap::from([(ROOT, Node::Dir(BTreeMap::new()))]),
        }
    }

    fn dir_mut(&mut self, ino: Ino) -> Option<&mut BTreeMap<OsString, Ino>> {
        let node = self
            .nodes
            .entry(ino)
            .or_insert_with(|| Node::Dir(BTreeMap::new()));
        match node {
            Node::Dir(d) => Some(d),
            Node::File(_) => None,
        }
    }

    fn file_mut(&mut self, ino: Ino) -> Option<&mut Vec<u8>> {
        match self
            .nodes
            .entry(ino)
            .or_insert_with(|| Node::File(Arc::default()))
        {
            Node::File(f) => Some(Arc::make_mut(f)),
            Node::Dir(_) => None,
        }
    }

    /// Whether the trees reachable from the roots hold the same names and
    /// contents (inode numbers aside).
    fn same_tree(&self, a: Ino, other: &Image, b: Ino) -> bool {
        match (self.nodes.get(&a), other.nodes.get(&b)) {
            (Some(Node::File(x)), Some(Node::File(y))) => Arc::ptr_eq(x, y) || x == y,
            (Some(Node::Dir(x)), Some(Node::Dir(y))) => {
                x.len() == y.len()
                    && x.iter()
                        .zip(y)
                        .all(|((n, i), (m, j))| n == m && self.same_tree(*i, other, *j))
            }
            (None, None) => true,
            _ => false,
        }
    }

    /// Applies `op`; an op whose premises a crash lost (its source entry,
    /// say) does what it still can.
    fn apply(&mut self, op: &Op) {
        match op {
            Op::Link {
                dir,
                name,
                ino,
                dir_node,
            } => {
                self.nodes.entry(*ino).or_insert_with(|| match dir_node {
                    true => Node::Dir(BTreeMap::new()),
                    false => Node::File(Arc::default()),
                });
                if let Some(d) = self.dir_mut(*dir) {
                    d.insert(name.clone(), *ino);
                }
            }
            Op::Unlink { dir, name } => {
                if let Some(d) = self.dir_mut(*dir) {
                    d.remove(name);
                }
            }
            Op::Rename {
                from: (from_dir, from),
                to: (to_dir, to),
                exchange,
                ..
            } => {
                let a = self.dir_mut(*from_dir).and_then(|d| d.get(from).copied());
                let b = self.dir_mut(*to_dir).and_then(|d| d.get(to).copied());
                let Some(a) = a else { return };
                match (exchange, b) {
                    (true, Some(b)) => {
                        if let Some(d) = self.dir_mut(*from_dir) {
                            d.insert(from.clone(), b);
                        }
                    }
                    (true, None) => return,
                    (false, _) => {
                        if let Some(d) = self.dir_mut(*from_dir) {
                            d.remove(from);
                        }
                    }
                }
                if let Some(d) = self.dir_mut(*to_dir) {
                    d.insert(to.clone(), a);
                }
            }
            Op::Write { ino, offset, bytes } => {
                if let Some(f) = self.file_mut(*ino) {
                    let at = *offset as usize;
                    resize_zeroed(f, at.max(f.len()));
                    let overlap = (f.len() - at).min(bytes.len());
                    f[at..at + overlap].copy_from_slice(&bytes[..overlap]);
                    f.extend_from_slice(&bytes[overlap..]);
                }
            }
            Op::SetLen { ino, len } => {
                if let Some(f) = self.file_mut(*ino) {
                    resize_zeroed(f, *len as usize);
                }
            }
        }
    }

    fn lookup(&self, dir: Ino, name: &OsString) -> Option<Ino> {
        match self.nodes.get(&dir)? {
            Node::Dir(d) => d.get(name).copied(),
            Node::File(_) => None,
        }
    }
}

/// Truncates or zero-extends `f` to `len`. A store's journal is written
/// with a megabyte of zeros: `Vec::resize` fills byte by byte in a test
/// build, where a zeroed allocation and one copy do not.
fn resize_zeroed(f: &mut Vec<u8>, len: usize) {
    match len.checked_sub(f.len()) {
        Some(0) => {}
        Some(more) => f.extend_from_slice(&vec![0; more]),
        None => f.truncate(len),
    }
}

#[derive(Debug)]
struct State {
    generation: u64,
    base: Image,
    live: Image,
    /// Operations since `base`, with whether they are persistent; the
    /// first is not (a persistent head is folded into `base`).
    log: Vec<(Op, bool)>,
    /// Where in `log` the operations since the last sync start.
    window: usize,
    next_ino: Ino,
    /// Locked inode -> the open file holding the lock.
    locks: HashMap<Ino, u64>,
}

struct Shared {
    state: Mutex<State>,
    hook: Mutex<Option<Arc<dyn FsHook>>>,
    next_handle: AtomicU64,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimFs").finish_non_exhaustive()
    }
}

/// The simulated filesystem, shared by the test and every store on it.
/// [`handle`](Self::handle) gives the [`FileSystem`] for a store; after
/// [`crash`](Self::crash) every earlier handle and file fails with `EIO`
/// (the process that held them is gone).
#[derive(Debug, Clone)]
pub struct SimFs {
    shared: Arc<Shared>,
}

impl Default for SimFs {
    fn default() -> Self {
        Self::new()
    }
}

fn errno(n: i32) -> io::Error {
    io::Error::from_raw_os_error(n)
}

/// The components of an absolute path (`.` skipped); `..` is refused.
fn components(path: &Path) -> io::Result<Vec<OsString>> {
    let mut out = Vec::new();
    for c in path.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(n) => out.push(n.to_owned()),
            Component::ParentDir | Component::Prefix(_) => return Err(errno(libc::EINVAL)),
        }
    }
    Ok(out)
}

impl SimFs {
    /// An empty filesystem (only `/`).
    pub fn new() -> Self {
        SimFs {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    generation: 0,
                    base: Image::new(),
                    live: Image::new(),
                    log: Vec::new(),
                    window: 0,
                    next_ino: ROOT + 1,
                    locks: HashMap::new(),
                }),
                hook: Mutex::new(None),
                next_handle: AtomicU64::new(1),
            }),
        }
    }

    /// Sets the hook asked before every effect.
    pub fn set_hook(&self, hook: Option<Arc<dyn FsHook>>) {
        *self.shared.hook.lock().unwrap_or_else(|e| e.into_inner()) = hook;
    }

    /// The filesystem as the current process sees it.
    pub fn handle(&self) -> Arc<dyn FileSystem> {
        Arc::new(SimHandle {
            shared: self.shared.clone(),
            generation: self.lock().generation,
        })
    }

    /// How many operations are not persistent yet.
    pub fn unsynced(&self) -> usize {
        self.lock().log.iter().filter(|(_, p)| !p).count()
    }

    /// Every state a crash now may leave, the worst case first: each
    /// prefix of the unsynced operations, ending with all of them.
    pub fn crash_states(&self) -> Vec<CrashKeep> {
        let n = self.unsynced();
        (0..n)
            .map(CrashKeep::Prefix)
            .chain([CrashKeep::All])
            .collect()
    }

    /// How many reordered crash states (see the module docs) a crash now
    /// may leave besides the worst case and keeping everything; each is
    /// [`CrashKeep::Reordered`]`(i)` for `i` below it.
    pub fn reordered_states(&self) -> usize {
        reordered(&self.lock()).len()
    }

    /// Crashes: the files of the process die with it (handles made before
    /// fail with `EIO`, locks are released) and the filesystem keeps the
    /// persistent operations plus what `keep` says of the others.
    pub fn crash(&self, keep: CrashKeep) {
        let mut st = self.lock();
        let kept: Vec<bool> = match keep {
            CrashKeep::All => vec![true; st.log.len()],
            CrashKeep::Prefix(n) => {
                let mut unsynced = 0;
                st.log
                    .iter()
                    .map(|(_, persistent)| {
                        unsynced += usize::from(!persistent);
                        *persistent || unsynced <= n
                    })
                    .collect()
            }
            CrashKeep::Reordered(i) => reordered(&st)
                .into_iter()
                .nth(i)
                .unwrap_or_else(|| vec![true; st.log.len()]),
        };
        let image = image_of(&st, &kept);
        st.base = image.clone();
        st.live = image;
        st.log.clear();
        st.window = 0;
        st.locks.clear();
        st.generation += 1;
    }

    /// The contents of the file at `path`, as the running process sees it.
    pub fn read(&self, path: &Path) -> Option<Vec<u8>> {
        let st = self.lock();
        let ino = resolve(&st.live, path).ok()?;
        match st.live.nodes.get(&ino)? {
            Node::File(f) => Some(f.to_vec()),
            Node::Dir(_) => None,
        }
    }

    /// The names in the directory at `path` (empty if there is none).
    pub fn list(&self, path: &Path) -> Vec<OsString> {
        let st = self.lock();
        match resolve(&st.live, path)
            .ok()
            .and_then(|i| st.live.nodes.get(&i))
        {
            Some(Node::Dir(d)) => d.keys().cloned().collect(),
            _ => Vec::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn resolve(image: &Image, path: &Path) -> io::Result<Ino> {
    let mut ino = ROOT;
    for c in components(path)? {
        match image.nodes.get(&ino) {
            Some(Node::Dir(d)) => ino = *d.get(&c).ok_or_else(|| errno(libc::ENOENT))?,
            _ => return Err(errno(libc::ENOTDIR)),
        }
    }
    Ok(ino)
}

/// The directory holding `path` and the last component.
fn parent(image: &Image, path: &Path) -> io::Result<(Ino, OsString)> {
    let mut parts = components(path)?;
    let name = parts.pop().ok_or_else(|| errno(libc::EINVAL))?;
    let dir = resolve(image, &parts.iter().collect::<PathBuf>())?;
    match image.nodes.get(&dir) {
        Some(Node::Dir(_)) => Ok((dir, name)),
        _ => Err(errno(libc::ENOTDIR)),
    }
}

#[derive(Debug)]
struct SimHandle {
    shared: Arc<Shared>,
    generation: u64,
}

impl SimHandle {
    /// The state, if this handle's process is still alive.
    fn state(&self) -> io::Result<MutexGuard<'_, State>> {
        let st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.generation != self.generation {
            return Err(errno(libc::EIO));
        }
        Ok(st)
    }

    fn before(&self, effect: FsEffect, path: &Path) -> io::Result<()> {
        let hook = self
            .shared
            .hook
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        match hook {
            Some(h) => h.before(effect, path),
            None => Ok(()),
        }
    }

    fn file(&self, ino: Ino, writable: bool, path: &Path) -> Box<dyn FsFile> {
        Box::new(SimFile {
            shared: self.shared.clone(),
            generation: self.generation,
            ino,
            id: self.shared.next_handle.fetch_add(1, Ordering::Relaxed),
            writable,
            pos: 0,
            path: path.to_owned(),
        })
    }
}

/// Links a new inode (a directory when `dir_node`) at `path`.
fn link_new(st: &mut State, path: &Path, dir_node: bool) -> io::Result<Ino> {
    let (dir, name) = parent(&st.live, path)?;
    let ino = st.next_ino;
    st.next_ino += 1;
    record(
        st,
        Op::Link {
            dir,
            name,
            ino,
            dir_node,
        },
    );
    Ok(ino)
}

fn record(st: &mut State, op: Op) {
    st.live.apply(&op);
    st.log.push((op, false));
}

fn persist(st: &mut State, synced: Option<Ino>) {
    for (op, persistent) in &mut st.log {
        if synced.is_none_or(|ino| op.covered_by(ino)) {
            *persistent = true;
        }
    }
    // The persistent head is in every crash state: fold it into the base.
    let head = st.log.iter().take_while(|(_, p)| *p).count();
    for (op, _) in st.log.drain(..head) {
        st.base.apply(&op);
    }
    st.window = st.log.len();
}

/// The image a crash keeping `kept` (one flag per logged operation) leaves.
fn image_of(st: &State, kept: &[bool]) -> Image {
    let mut image = st.base.clone();
    for ((op, persistent), keep) in st.log.iter().zip(kept) {
        if *persistent || *keep {
            image.apply(op);
        }
    }
    image
}

/// Drops from `kept` what the rules of the module docs drop with the
/// operations it already drops, until nothing changes.
fn legal(log: &[(Op, bool)], mut kept: Vec<bool>) -> Vec<bool> {
    let dropped = |kept: &[bool], i: usize| !log[i].1 && !kept[i];
    loop {
        let before = kept.clone();
        // Metadata in order: after a dropped one, none.
        if let Some(first) = (0..log.len()).find(|&i| !log[i].0.is_data() && dropped(&kept, i)) {
            for (i, (op, persistent)) in log.iter().enumerate().skip(first) {
                if !op.is_data() && !persistent {
                    kept[i] = false;
                }
            }
        }
        for i in 0..log.len() {
            if !dropped(&kept, i) {
                continue;
            }
            // A later write to a page holds the earlier ones.
            if let Some((ino, from, to)) = log[i].0.pages() {
                for (j, (op, persistent)) in log.iter().enumerate().skip(i + 1) {
                    if let Some((other, a, b)) = op.pages()
                        && other == ino
                        && a <= to
                        && from <= b
                        && !persistent
                    {
                        kept[j] = false;
                    }
                }
            }
            // A rename over a file waits for the renamed file's data.
            if let Op::Write { ino, .. } = log[i].0 {
                for (j, (op, persistent)) in log.iter().enumerate().skip(i + 1) {
                    if let Op::Rename {
                        ino: renamed,
                        replaces: true,
                        exchange: false,
                        ..
                    } = op
                        && *renamed == ino
                        && !persistent
                    {
                        kept[j] = false;
                    }
                }
            }
        }
        if kept == before {
            return kept;
        }
    }
}

/// The reordered crash states of the module docs: each a flag per logged
/// operation, legal, distinct in the image it leaves, at most
/// [`MAX_REORDERED`].
fn reordered(st: &State) -> Vec<Vec<bool>> {
    let log = &st.log;
    let n = log.len();
    let unsynced = log.iter().filter(|(_, p)| !p).count();
    if unsynced < 2 {
        return Vec::new();
    }
    let window: Vec<usize> = (st.window..n).filter(|&i| !log[i].1).collect();
    let mut candidates: Vec<Vec<bool>> = vec![
        log.iter().map(|(op, _)| !op.is_data()).collect(),
        log.iter().map(|(op, _)| op.is_data()).collect(),
    ];
    for &end in window.iter().skip(1) {
        candidates.push((0..n).map(|i| i < end).collect());
    }
    for &gone in &window {
        let mut kept = vec![true; n];
        kept[gone] = false;
        if !log[gone].0.is_data() {
            // The metadata from it on; the data stays.
            for (i, (op, _)) in log.iter().enumerate().skip(gone) {
                kept[i] = op.is_data();
            }
        }
        candidates.push(kept);
    }
    let worst = image_of(st, &vec![false; n]);
    let all = image_of(st, &vec![true; n]);
    let mut states: Vec<(Vec<bool>, Image)> = Vec::new();
    for kept in candidates {
        if states.len() == MAX_REORDERED {
            break;
        }
        let kept = legal(log, kept);
        let image = image_of(st, &kept);
        let seen = [&worst, &all]
            .into_iter()
            .chain(states.iter().map(|(_, i)| i))
            .any(|other| image.same_tree(ROOT, other, ROOT));
        if !seen {
            states.push((kept, image));
        }
    }
    states.into_iter().map(|(kept, _)| kept).collect()
}

impl FileSystem for SimHandle {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn FsFile>> {
        let existing = {
            let st = self.state()?;
            match resolve(&st.live, path) {
                Ok(ino) => Some((ino, matches!(st.live.nodes.get(&ino), Some(Node::Dir(_))))),
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => None,
                Err(e) => return Err(e),
            }
        };
        let writable = !matches!(mode, OpenMode::Read | OpenMode::Directory);
        let file = match (mode, existing) {
            (OpenMode::Directory, Some((ino, true))) => self.file(ino, false, path),
            (OpenMode::Directory, Some((_, false))) => return Err(errno(libc::ENOTDIR)),
            (_, Some((_, true))) if writable => return Err(errno(libc::EISDIR)),
            (OpenMode::CreateNew, Some(_)) => return Err(errno(libc::EEXIST)),
            (OpenMode::CreateTruncate, Some((ino, _))) => {
                self.before(FsEffect::Truncate, path)?;
                record(&mut *self.state()?, Op::SetLen { ino, len: 0 });
                self.file(ino, true, path)
            }
            (_, Some((ino, _))) => self.file(ino, writable, path),
            (OpenMode::CreateNew | OpenMode::CreateTruncate | OpenMode::CreateKeep, None) => {
                self.before(FsEffect::Create, path)?;
                let ino = link_new(&mut *self.state()?, path, false)?;
                self.file(ino, true, path)
            }
            (_, None) => return Err(errno(libc::ENOENT)),
        };
        Ok(file)
    }

    fn create_dir(&self, path: &Path) -> io::Result<()> {
        {
            let st = self.state()?;
            let (dir, name) = parent(&st.live, path)?;
            if st.live.lookup(dir, &name).is_some() {
                return Err(errno(libc::EEXIST));
            }
        }
        self.before(FsEffect::Mkdir, path)?;
        link_new(&mut *self.state()?, path, true)?;
        Ok(())
    }

    fn is_dir(&self, path: &Path) -> bool {
        let Ok(st) = self.state() else { return false };
        resolve(&st.live, path)
            .ok()
            .is_some_and(|i| matches!(st.live.nodes.get(&i), Some(Node::Dir(_))))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.rename_op(from, to, false)
    }

    fn exchange(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.rename_op(from, to, true)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        {
            let st = self.state()?;
            let (dir, name) = parent(&st.live, path)?;
            match st
                .live
                .lookup(dir, &name)
                .and_then(|i| st.live.nodes.get(&i))
            {
                None => return Err(errno(libc::ENOENT)),
                Some(Node::Dir(_)) => return Err(errno(libc::EISDIR)),
                Some(Node::File(_)) => {}
            }
        }
        self.before(FsEffect::Unlink, path)?;
        let mut st = self.state()?;
        let (dir, name) = parent(&st.live, path)?;
        record(&mut st, Op::Unlink { dir, name });
        Ok(())
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<DirEntry>> {
        let st = self.state()?;
        let ino = resolve(&st.live, path)?;
        match st.live.nodes.get(&ino) {
            Some(Node::Dir(d)) => Ok(d
                .iter()
                .map(|(name, i)| DirEntry {
                    name: name.clone(),
                    is_dir: matches!(st.live.nodes.get(i), Some(Node::Dir(_))),
                })
                .collect()),
            _ => Err(errno(libc::ENOTDIR)),
        }
    }

    fn in_memory(&self, _dir: &Path) -> bool {
        false
    }
}

impl SimHandle {
    fn rename_op(&self, from: &Path, to: &Path, exchange: bool) -> io::Result<()> {
        {
            let st = self.state()?;
            let (fd, f) = parent(&st.live, from)?;
            let (td, t) = parent(&st.live, to)?;
            if st.live.lookup(fd, &f).is_none() {
                return Err(errno(libc::ENOENT));
            }
            if exchange && st.live.lookup(td, &t).is_none() {
                return Err(errno(libc::ENOENT));
            }
        }
        self.before(FsEffect::Rename, to)?;
        let mut st = self.state()?;
        let from = parent(&st.live, from)?;
        let to = parent(&st.live, to)?;
        let ino = st.live.lookup(from.0, &from.1).unwrap_or(0);
        let replaces = st.live.lookup(to.0, &to.1).is_some();
        record(
            &mut st,
            Op::Rename {
                from,
                to,
                exchange,
                ino,
                replaces,
            },
        );
        Ok(())
    }
}

struct SimFile {
    shared: Arc<Shared>,
    generation: u64,
    ino: Ino,
    id: u64,
    writable: bool,
    pos: u64,
    path: PathBuf,
}

impl fmt::Debug for SimFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimFile")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Drop for SimFile {
    fn drop(&mut self) {
        let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.locks.get(&self.ino) == Some(&self.id) {
            st.locks.remove(&self.ino);
        }
    }
}

impl SimFile {
    fn handle(&self) -> SimHandle {
        SimHandle {
            shared: self.shared.clone(),
            generation: self.generation,
        }
    }

    fn contents(&self) -> io::Result<Vec<u8>> {
        let h = self.handle();
        let st = h.state()?;
        match st.live.nodes.get(&self.ino) {
            Some(Node::File(f)) => Ok(f.to_vec()),
            _ => Err(errno(libc::EISDIR)),
        }
    }

    fn change(&self, effect: FsEffect, op: Op) -> io::Result<()> {
        if !self.writable {
            return Err(errno(libc::EBADF));
        }
        let h = self.handle();
        drop(h.state()?);
        h.before(effect, &self.path)?;
        record(&mut *h.state()?, op);
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        let h = self.handle();
        drop(h.state()?);
        h.before(FsEffect::Sync, &self.path)?;
        persist(&mut *h.state()?, Some(self.ino));
        Ok(())
    }
}

impl FsFile for SimFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let h = self.handle();
        let st = h.state()?;
        let Some(Node::File(data)) = st.live.nodes.get(&self.ino) else {
            return Err(errno(libc::EISDIR));
        };
        let end = offset as usize + buf.len();
        if end > data.len() {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
        }
        buf.copy_from_slice(&data[offset as usize..end]);
        Ok(())
    }

    fn read_to_end(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        let data = self.contents()?;
        let from = (self.pos as usize).min(data.len());
        buf.extend_from_slice(&data[from..]);
        self.pos = data.len() as u64;
        Ok(data.len() - from)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.change(
            FsEffect::Write,
            Op::Write {
                ino: self.ino,
                offset,
                bytes: buf.to_vec(),
            },
        )
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.change(FsEffect::Truncate, Op::SetLen { ino: self.ino, len })
    }

    fn sync_data(&self) -> io::Result<()> {
        self.sync()
    }

    fn sync_all(&self) -> io::Result<()> {
        self.sync()
    }

    fn metadata(&self) -> io::Result<FileMeta> {
        let h = self.handle();
        let st = h.state()?;
        Ok(match st.live.nodes.get(&self.ino) {
            Some(Node::File(f)) => FileMeta {
                is_file: true,
                len: f.len() as u64,
            },
            _ => FileMeta {
                is_file: false,
                len: 0,
            },
        })
    }

    fn try_lock_exclusive(&self) -> io::Result<bool> {
        let h = self.handle();
        let mut st = h.state()?;
        match st.locks.get(&self.ino) {
            Some(holder) if *holder != self.id => Ok(false),
            _ => {
                st.locks.insert(self.ino, self.id);
                Ok(true)
            }
        }
    }

    fn sync_filesystem(&self) -> io::Result<()> {
        let h = self.handle();
        drop(h.state()?);
        h.before(FsEffect::Sync, &self.path)?;
        persist(&mut *h.state()?, None);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_past_the_end_and_lengths_fill_with_zeros_live_and_after_a_crash() {
        let sim = SimFs::new();
        let path = Path::new("/f");
        let f = sim.handle().open(path, OpenMode::CreateNew).unwrap();
        f.write_all_at(b"ab", 0).unwrap();
        // A gap, an overlap with the end, then growing and shrinking.
        f.write_all_at(b"xy", 4).unwrap();
        f.write_all_at(b"YZW", 5).unwrap();
        assert_eq!(sim.read(path).unwrap(), b"ab\0\0xYZW");
        f.set_len(10).unwrap();
        assert_eq!(sim.read(path).unwrap(), b"ab\0\0xYZW\0\0");
        f.set_len(3).unwrap();
        assert_eq!(sim.read(path).unwrap(), b"ab\0");
        f.sync_all().unwrap();
        sim.handle()
            .open(Path::new("/"), OpenMode::Directory)
            .unwrap()
            .sync_all()
            .unwrap();
        sim.crash(CrashKeep::Prefix(0));
        assert_eq!(sim.read(path).unwrap(), b"ab\0");
    }
}
