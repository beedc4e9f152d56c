//! The write-ahead journal of a [`crate::FileStore`] on disk.
//!
//! One file over 700 lines: the format, its append, replay and checkpoint
//! must agree byte for byte; a quarter of it is their unit tests.
//!
//! ```text
//! DIR/journal   LEN bytes, written with zeros when created, never grown:
//! 0      header: "CSIJHDR1", epoch (u64 LE), CRC-32C of those 16 bytes
//! 4096   entries, back to back:
//!        0  "CSIJ"  4 entry length  8 CRC-32C of every other byte
//!        12 epoch   20 sequence number (from 0 in each epoch)
//!        28 op (1 put, 2 delete)  29 table length  31 name length
//!        33 table, file name, then (put) the record file's bytes
//! ```
//!
//! A change is appended here, then made to the record file (rename or
//! unlink, with no fsync), both under one mutex so the journal's order is
//! the files' order; the writer then waits for an `fdatasync` of the
//! journal shared with every writer that appended meanwhile (group commit,
//! [`crate::group`]). The journal's blocks were written at creation, so
//! that flush has no block allocation or file size to record: it writes
//! the changed pages only.
//!
//! An entry counts if its checksum holds and it carries the header's epoch
//! and the next sequence number, so a torn tail, the zeros after it and
//! entries of earlier epochs end the replay. At open the entries are
//! replayed (the record files made to say what the journal says) and the
//! journal is flushed, so what the store then serves is durable; its
//! entries stay, and new ones follow them in the same epoch. When the
//! journal is full it is checkpointed: the record files it touched and
//! their directories are fsynced, then a new epoch is written to the
//! header, which empties it. Open checkpoints only when the header is bad
//! or something past the last entry could pass for a later entry of this
//! epoch (a torn write): appending there could make it count. Every step
//! needs no free space.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::format::crc32c;
use crate::fs::{FileSystem, FsFile, OpenMode};
use crate::group::GroupSync;
use crate::key::TMP_PREFIX;

/// The journal file's name in the state directory.
pub(crate) const JOURNAL_FILE: &str = "journal";
/// Whether a change of this size goes through the journal.
pub(crate) fn journaled(table: &str, name: &OsString, contents: usize) -> bool {
    FIXED + table.len() + name.len() + contents <= MAX_ENTRY
}

/// Its size: about 3,000 entries of a few hundred bytes between checkpoints.
pub(crate) const LEN: u64 = 1 << 20;
/// Larger records bypass the journal (checkpoint, then a direct write).
pub(crate) const MAX_ENTRY: usize = 128 << 10;
const START: u64 = 4096;
const HEADER_MAGIC: &[u8; 8] = b"CSIJHDR1";
const MAGIC: &[u8; 4] = b"CSIJ";
const FIXED: usize = 33;
const OP_PUT: u8 = 1;
const OP_DELETE: u8 = 2;
/// Above this many touched files a checkpoint uses one syncfs(2) instead
/// of an fsync per file.
const SYNCFS_ABOVE: usize = 64;

/// What to do to one record file.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Change<'a> {
    /// Make the file hold these bytes.
    Put(&'a [u8]),
    /// Remove the file.
    Delete,
}

#[derive(Debug)]
pub(crate) struct Journal {
    fs: Arc<dyn FileSystem>,
    path: PathBuf,
    file: Box<dyn FsFile>,
    state: Mutex<State>,
    sync: GroupSync,
    checkpoints: AtomicU64,
    dir_syncs: AtomicU64,
}

#[derive(Debug)]
struct State {
    epoch: u64,
    seq: u64,
    head: u64,
    /// Directories changed since the last checkpoint, with the record
    /// files written there since and still present (a removed one needs
    /// only its directory synced, so it is dropped: the set stays small
    /// under churn).
    dirty: HashMap<PathBuf, HashSet<OsString>>,
}

impl State {
    fn mark(&mut self, dir: PathBuf, name: OsString, written: bool) {
        let names = self.dirty.entry(dir).or_default();
        if written {
            names.insert(name);
        } else {
            names.remove(&name);
        }
    }
}

/// What `open` found and redid.
#[derive(Debug, Default)]
pub(crate) struct Replayed {
    pub entries: u64,
    pub files_fixed: u64,
    /// What each record file the replay compared or wrote now holds, by
    /// table and file name: the first scan of a table takes these instead
    /// of reading the files again.
    pub files: HashMap<String, HashMap<OsString, Vec<u8>>>,
}

impl Journal {
    /// Opens (creating it if missing) the journal in `dir`, replays it onto
    /// the record files under `tables_dir` and checkpoints.
    /// `Ok(None)` when there is none and no room to create one: nothing
    /// to replay, and the store then writes without a journal.
    pub(crate) fn open(
        fs: &Arc<dyn FileSystem>,
        dir: &Path,
        tables_dir: &Path,
    ) -> io::Result<Option<(Journal, Replayed)>> {
        let path = dir.join(JOURNAL_FILE);
        let created = |dir, path| match create(&**fs, dir, path) {
            Err(e) if crate::error::is_full(&e) => Ok(None),
            r => r.map(Some),
        };
        let file = match fs.open(&path, OpenMode::ReadWrite) {
            Ok(f) if f.metadata()?.len == LEN => f,
            // Never a journal we wrote: ours are renamed in at full length.
            Ok(_) => match created(dir, &path)? {
                Some(f) => f,
                None => return Ok(None),
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => match created(dir, &path)? {
                Some(f) => f,
                None => return Ok(None),
            },
            Err(e) => return Err(e),
        };
        // Only the last change of each file is kept while reading.
        let mut last: BTreeMap<(String, OsString), Option<Vec<u8>>> = BTreeMap::new();
        let found = read_entries(&*file, |e| {
            last.insert((e.table, e.name), e.contents);
        })?;
        let journal = Journal {
            fs: fs.clone(),
            path,
            file,
            state: Mutex::new(State {
                epoch: found.epoch,
                seq: found.entries,
                head: found.head,
                dirty: HashMap::new(),
            }),
            sync: GroupSync::default(),
            checkpoints: AtomicU64::new(0),
            dir_syncs: AtomicU64::new(0),
        };
        let mut replayed = Replayed {
            entries: found.entries,
            ..Replayed::default()
        };
        let mut st = journal.lock();
        // Entries come table by table: each table's directory is opened
        // once and its files compared by name.
        let mut opened: Option<(String, Option<Box<dyn FsFile>>)> = None;
        for ((table, name), contents) in last {
            let table_dir = tables_dir.join(&table);
            if opened.as_ref().is_none_or(|(t, _)| *t != table) {
                let handle = fs.open(&table_dir, OpenMode::Directory).ok();
                opened = Some((table.clone(), handle));
            }
            let handle = opened.as_ref().and_then(|(_, h)| h.as_deref());
            if replay_one(&**fs, &table_dir, handle, &name, contents.as_deref())? {
                replayed.files_fixed += 1;
            }
            st.mark(table_dir, name.clone(), contents.is_some());
            if let Some(bytes) = contents {
                let files = replayed.files.entry(table).or_default();
                files.insert(name, bytes);
            }
        }
        if found.append_safe {
            // The entries stay the record of the files replayed: no file
            // needs a flush now (a syncfs here waited on every process's
            // writes), only the journal, for entries of a write that was
            // never acknowledged and is served from now on.
            if found.entries > 0 {
                journal.file.sync_data()?;
            }
        } else {
            journal.checkpoint_locked(&mut st)?;
        }
        drop(st);
        Ok(Some((journal, replayed)))
    }

    /// Records `change` of `name` in `dir`, making it with `apply` under
    /// the journal's lock, and returns `apply`'s value once the change is
    /// durable. An error from `apply` is returned as is, with nothing
    /// journaled.
    pub(crate) fn commit<T>(
        &self,
        dir: &Path,
        name: &OsString,
        table: &str,
        change: Change<'_>,
        apply: impl FnOnce() -> io::Result<T>,
    ) -> Result<T, CommitError> {
        let contents = match change {
            Change::Put(b) => b.len(),
            Change::Delete => 0,
        };
        let entry_len = FIXED + table.len() + name.len() + contents;
        let mut st = self.lock();
        if !journaled(table, name, contents) {
            // Too big to journal: make everything journaled durable first,
            // so no older entry for this name can be replayed over it.
            // (A failure here comes before the change: it was not made.)
            self.checkpoint_locked(&mut st)
                .map_err(CommitError::Apply)?;
            // (The caller flushed a put's file before `apply` renamed it.)
            let out = apply().map_err(CommitError::Apply)?;
            self.sync_dir(dir).map_err(CommitError::Flush)?;
            return Ok(out);
        }
        if st.head + entry_len as u64 > LEN {
            self.checkpoint_locked(&mut st)
                .map_err(CommitError::Apply)?;
        }
        let out = apply().map_err(CommitError::Apply)?;
        let entry = encode(st.epoch, st.seq, table, name, change);
        st.mark(
            dir.to_owned(),
            name.clone(),
            matches!(change, Change::Put(_)),
        );
        match self.file.write_all_at(&entry, st.head) {
            Ok(()) => {
                st.head += entry.len() as u64;
                st.seq += 1;
            }
            Err(e) => {
                // The change is made but not journaled: make it durable by
                // a checkpoint, which also empties the journal so no older
                // entry for this name is replayed over it.
                tracing::warn!(journal = %self.path.display(), error = %e,
                    "journal write failed; checkpointing instead");
                self.checkpoint_locked(&mut st)
                    .map_err(CommitError::Flush)?;
                return Ok(out);
            }
        }
        drop(st);
        self.sync
            .sync(|| self.file.sync_data())
            .map_err(CommitError::Flush)?;
        Ok(out)
    }

    /// Flushes of the journal run for commits.
    pub(crate) fn syncs(&self) -> u64 {
        self.sync.syncs()
    }

    pub(crate) fn checkpoints(&self) -> u64 {
        self.checkpoints.load(Ordering::Relaxed)
    }

    pub(crate) fn dir_syncs(&self) -> u64 {
        self.dir_syncs.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        open_dir(&*self.fs, dir)?.sync_all()?;
        self.dir_syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Makes every file the journal covers durable, then empties it.
    fn checkpoint_locked(&self, st: &mut State) -> io::Result<()> {
        let live = || {
            st.dirty
                .iter()
                .flat_map(|(dir, names)| names.iter().map(move |name| dir.join(name)))
        };
        if live().count() > SYNCFS_ABOVE {
            self.file.sync_filesystem()?;
        } else {
            // In path order, so a simulated run replays the same steps.
            let mut files: Vec<PathBuf> = live().collect();
            files.sort();
            for path in files {
                sync_file(&*self.fs, &path)?;
            }
            let mut dirs: Vec<&PathBuf> = st.dirty.keys().collect();
            dirs.sort();
            for dir in dirs {
                match self.sync_dir(dir) {
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    r => r?,
                }
            }
        }
        let epoch = st.epoch.wrapping_add(1);
        self.file.write_all_at(&header(epoch), 0)?;
        self.file.sync_data()?;
        st.epoch = epoch;
        st.seq = 0;
        st.head = START;
        st.dirty.clear();
        self.checkpoints.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Why a commit failed.
#[derive(Debug)]
pub(crate) enum CommitError {
    /// The change was not made.
    Apply(io::Error),
    /// The change was made; whether it is durable is unknown.
    Flush(io::Error),
}

fn header(epoch: u64) -> [u8; 20] {
    let mut h = [0u8; 20];
    h[..8].copy_from_slice(HEADER_MAGIC);
    h[8..16].copy_from_slice(&epoch.to_le_bytes());
    let crc = crc32c(&[&h[..16]]);
    h[16..].copy_from_slice(&crc.to_le_bytes());
    h
}

fn encode(epoch: u64, seq: u64, table: &str, name: &OsString, change: Change<'_>) -> Vec<u8> {
    let (op, contents): (u8, &[u8]) = match change {
        Change::Put(b) => (OP_PUT, b),
        Change::Delete => (OP_DELETE, &[]),
    };
    let name = name.as_bytes();
    let len = FIXED + table.len() + name.len() + contents.len();
    let mut e = Vec::with_capacity(len);
    e.extend_from_slice(MAGIC);
    e.extend_from_slice(&(len as u32).to_le_bytes());
    e.extend_from_slice(&[0; 4]);
    e.extend_from_slice(&epoch.to_le_bytes());
    e.extend_from_slice(&seq.to_le_bytes());
    e.push(op);
    e.extend_from_slice(&(table.len() as u16).to_le_bytes());
    e.extend_from_slice(&(name.len() as u16).to_le_bytes());
    e.extend_from_slice(table.as_bytes());
    e.extend_from_slice(name);
    e.extend_from_slice(contents);
    let crc = crc32c(&[&e[..8], &e[12..]]);
    e[8..12].copy_from_slice(&crc.to_le_bytes());
    e
}

/// One replayable entry.
#[derive(Debug, PartialEq)]
pub(crate) struct Entry {
    pub table: String,
    pub name: OsString,
    pub contents: Option<Vec<u8>>,
}

/// What [`read_entries`] found.
struct Found {
    /// The header's epoch (a fresh one if the header is unreadable).
    epoch: u64,
    /// How many entries count.
    entries: u64,
    /// Where the next entry goes.
    head: u64,
    /// Whether entries may be appended at `head` in `epoch`: the header
    /// holds, and nothing after `head` starts like an entry of `epoch`.
    append_safe: bool,
}

/// Reads the journal: each entry that counts is passed to `each`. Read a
/// window at a time, so opening costs few reads and little memory.
fn read_entries(file: &dyn FsFile, mut each: impl FnMut(Entry)) -> io::Result<Found> {
    let mut h = [0u8; 20];
    file.read_exact_at(&mut h, 0)?;
    let epoch = u64::from_le_bytes(h[8..16].try_into().expect("8 bytes"));
    if h != header(epoch) {
        // No checkpoint ever completed with this header, so nothing in the
        // journal was acknowledged; a new epoch unlike any entry's.
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        return Ok(Found {
            epoch: nanos,
            entries: 0,
            head: START,
            append_safe: false,
        });
    }
    let mut window = Window::default();
    let mut entries = 0;
    let mut at = START;
    while at + FIXED as u64 <= LEN {
        let fixed = window.get(file, at, FIXED)?;
        let len = u32::from_le_bytes(fixed[4..8].try_into().expect("4 bytes")) as usize;
        if &fixed[..4] != MAGIC || !(FIXED..=MAX_ENTRY).contains(&len) || at + len as u64 > LEN {
            break;
        }
        match decode(window.get(file, at, len)?, epoch, entries) {
            Some(entry) => each(entry),
            None => break,
        }
        entries += 1;
        at += len as u64;
    }
    let append_safe = !window.entry_of_epoch_after(file, at, epoch)?;
    Ok(Found {
        epoch,
        entries,
        head: at,
        append_safe,
    })
}

/// A part of the journal read in one call.
#[derive(Default)]
struct Window {
    start: u64,
    buf: Vec<u8>,
}

impl Window {
    const SIZE: usize = 64 << 10;

    /// `len` bytes at `at` (within the journal).
    fn get(&mut self, file: &dyn FsFile, at: u64, len: usize) -> io::Result<&[u8]> {
        let end = at + len as u64;
        if at < self.start || end > self.start + self.buf.len() as u64 {
            let size = (LEN - at).min(len.max(Self::SIZE) as u64) as usize;
            self.buf.resize(size, 0);
            file.read_exact_at(&mut self.buf, at)?;
            self.start = at;
        }
        let from = (at - self.start) as usize;
        Ok(&self.buf[from..from + len])
    }

    /// Whether anything from `at` on starts like an entry of `epoch`
    /// (its magic, and the epoch where an entry holds it).
    fn entry_of_epoch_after(&mut self, file: &dyn FsFile, at: u64, epoch: u64) -> io::Result<bool> {
        let epoch = epoch.to_le_bytes();
        let mut from = at;
        while from + FIXED as u64 <= LEN {
            // Windows overlap by an entry's fixed part, so none is missed.
            let len = (LEN - from).min(Self::SIZE as u64) as usize;
            let part = self.get(file, from, len)?;
            // A substring search for the magic, then the epoch where it
            // stands: a byte-by-byte window compare made each open (and a
            // simulated restart) scan the whole journal slowly.
            let starts = memchr::memmem::find_iter(part, MAGIC)
                .any(|i| i + FIXED <= part.len() && part[i + 12..i + 20] == epoch);
            if starts {
                return Ok(true);
            }
            from += (len - FIXED + 1) as u64;
        }
        Ok(false)
    }
}

/// An entry, if its checksum, epoch, sequence number and names hold.
fn decode(e: &[u8], epoch: u64, seq: u64) -> Option<Entry> {
    let crc = u32::from_le_bytes(e[8..12].try_into().ok()?);
    if crc32c(&[&e[..8], &e[12..]]) != crc
        || u64::from_le_bytes(e[12..20].try_into().ok()?) != epoch
        || u64::from_le_bytes(e[20..28].try_into().ok()?) != seq
    {
        return None;
    }
    let op = e[28];
    let tlen = u16::from_le_bytes([e[29], e[30]]) as usize;
    let nlen = u16::from_le_bytes([e[31], e[32]]) as usize;
    let table = std::str::from_utf8(e.get(FIXED..FIXED + tlen)?).ok()?;
    let name = e.get(FIXED + tlen..FIXED + tlen + nlen)?;
    let rest = &e[FIXED + tlen + nlen..];
    crate::key::check_table(table).ok()?;
    if name.is_empty()
        || name.contains(&b'/')
        || name.contains(&0)
        || name == b"."
        || name == b".."
        || name.starts_with(TMP_PREFIX.as_bytes())
    {
        return None;
    }
    let contents = match op {
        OP_PUT => Some(rest.to_vec()),
        OP_DELETE if rest.is_empty() => None,
        _ => return None,
    };
    Some(Entry {
        table: table.to_owned(),
        name: OsString::from_vec(name.to_vec()),
        contents,
    })
}

/// Makes `dir/name` hold `contents` (or be absent); true if it had to
/// change. `handle`: `dir` opened, when it exists.
fn replay_one(
    fs: &dyn FileSystem,
    dir: &Path,
    handle: Option<&dyn FsFile>,
    name: &OsString,
    contents: Option<&[u8]>,
) -> io::Result<bool> {
    let path = dir.join(name);
    match contents {
        None => match fs.remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        },
        Some(bytes) => {
            let opened = match handle {
                Some(h) => fs.open_in(h, dir, name, OpenMode::Read),
                None => fs.open(&path, OpenMode::Read),
            };
            let same = opened
                .and_then(|mut f| f.read_bounded(bytes.len()))
                .is_ok_and(|now| now.as_deref() == Some(bytes));
            if same {
                return Ok(false);
            }
            match fs.create_dir(dir) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
                _ => {}
            }
            let tmp = dir.join(format!("{TMP_PREFIX}{}-replay", std::process::id()));
            let f = fs.open(&tmp, OpenMode::CreateTruncate)?;
            f.write_all_at(bytes, 0)?;
            drop(f);
            fs.rename(&tmp, &path)?;
            Ok(true)
        }
    }
}

/// Creates the journal: zeros, then an empty first epoch, written under a
/// temporary name and renamed so a cut-short creation is never taken for
/// a journal.
fn create(fs: &dyn FileSystem, dir: &Path, path: &Path) -> io::Result<Box<dyn FsFile>> {
    let tmp = dir.join(format!("{JOURNAL_FILE}.new"));
    let result = create_at(fs, dir, &tmp, path);
    if result.is_err() {
        let _ = fs.remove_file(&tmp);
    }
    result
}

fn create_at(
    fs: &dyn FileSystem,
    dir: &Path,
    tmp: &Path,
    path: &Path,
) -> io::Result<Box<dyn FsFile>> {
    let f = fs.open(tmp, OpenMode::CreateTruncate)?;
    let zeros = [0u8; 64 << 10];
    let mut at = 0;
    while at < LEN {
        let n = (LEN - at).min(zeros.len() as u64) as usize;
        f.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    f.write_all_at(&header(1), 0)?;
    f.sync_all()?;
    fs.rename(tmp, path)?;
    open_dir(fs, dir)?.sync_all()?;
    Ok(f)
}

fn sync_file(fs: &dyn FileSystem, path: &Path) -> io::Result<()> {
    match fs.open(path, OpenMode::Read) {
        Ok(f) => f.sync_data(),
        // Deleted since, or not a file we wrote: nothing to flush.
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => Ok(()),
        Err(e) => Err(e),
    }
}

fn open_dir(fs: &dyn FileSystem, path: &Path) -> io::Result<Box<dyn FsFile>> {
    fs.open(path, OpenMode::Directory)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::RealFs;
    use std::fs;

    fn real() -> Arc<dyn FileSystem> {
        Arc::new(RealFs)
    }

    fn open(tmp: &tempfile::TempDir, tables: &Path) -> (Journal, Replayed) {
        Journal::open(&real(), tmp.path(), tables).unwrap().unwrap()
    }

    fn name(s: &str) -> OsString {
        OsString::from(s)
    }

    fn setup() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let tables = tmp.path().join("tables");
        fs::create_dir_all(tables.join("t")).unwrap();
        (tmp, tables)
    }

    fn put(j: &Journal, tables: &Path, n: &str, bytes: &[u8]) {
        let dir = tables.join("t");
        let path = dir.join(n);
        j.commit(&dir, &name(n), "t", Change::Put(bytes), || {
            fs::write(&path, bytes)
        })
        .unwrap();
    }

    #[test]
    fn entries_round_trip_and_every_corruption_ends_the_replay() {
        let e = encode(7, 3, "t", &name("k"), Change::Put(b"abc"));
        let d = decode(&e, 7, 3).unwrap();
        assert_eq!(d.contents.as_deref(), Some(&b"abc"[..]));
        assert!(decode(&e, 8, 3).is_none(), "another epoch");
        assert!(decode(&e, 7, 4).is_none(), "out of sequence");
        for i in 0..e.len() {
            let mut b = e.clone();
            b[i] ^= 0x10;
            if (4..8).contains(&i) {
                continue; // the length: caught before decode
            }
            assert!(decode(&b, 7, 3).is_none(), "flip in byte {i}");
        }
        let bad = encode(7, 0, "t", &name("../x"), Change::Delete);
        assert!(decode(&bad, 7, 0).is_none(), "a name with a slash");
    }

    #[test]
    fn replay_makes_the_files_match_and_stops_at_a_torn_tail() {
        let (tmp, tables) = setup();
        let (j, _) = open(&tmp, &tables);
        put(&j, &tables, "a", b"one");
        put(&j, &tables, "b", b"two");
        put(&j, &tables, "a", b"three");
        let head = j.lock().head;
        // Files lost or stale as after a power loss; a fourth entry torn.
        fs::remove_file(tables.join("t/a")).unwrap();
        fs::write(tables.join("t/b"), b"stale").unwrap();
        let torn = encode(j.lock().epoch, 3, "t", &name("c"), Change::Put(b"four"));
        j.file.write_all_at(&torn[..torn.len() - 2], head).unwrap();
        drop(j);
        let (j, replayed) = open(&tmp, &tables);
        assert_eq!(replayed.entries, 3);
        assert_eq!(replayed.files_fixed, 2);
        assert_eq!(fs::read(tables.join("t/a")).unwrap(), b"three");
        assert_eq!(fs::read(tables.join("t/b")).unwrap(), b"two");
        assert!(!tables.join("t/c").exists(), "the torn entry is ignored");
        assert_eq!(j.checkpoints(), 1, "open checkpoints after a torn entry");
        drop(j);
        // Checkpointed: the old entries are never replayed again.
        fs::write(tables.join("t/a"), b"changed by hand").unwrap();
        let (_j, replayed) = open(&tmp, &tables);
        assert_eq!(replayed.entries, 0);
        assert_eq!(fs::read(tables.join("t/a")).unwrap(), b"changed by hand");
    }

    #[test]
    fn open_keeps_the_entries_and_appends_after_them() {
        let (tmp, tables) = setup();
        let (j, _) = open(&tmp, &tables);
        put(&j, &tables, "a", b"one");
        put(&j, &tables, "b", b"two");
        drop(j);
        let (j, replayed) = open(&tmp, &tables);
        assert_eq!((replayed.entries, replayed.files_fixed), (2, 0));
        assert_eq!(j.checkpoints(), 0, "nothing torn: no checkpoint at open");
        assert_eq!(j.lock().seq, 2, "the epoch goes on after the entries");
        put(&j, &tables, "a", b"three");
        drop(j);
        // Both runs' entries count, in order, as after a power loss.
        fs::remove_file(tables.join("t/a")).unwrap();
        fs::remove_file(tables.join("t/b")).unwrap();
        let (_j, replayed) = open(&tmp, &tables);
        assert_eq!((replayed.entries, replayed.files_fixed), (3, 2));
        assert_eq!(fs::read(tables.join("t/a")).unwrap(), b"three");
        assert_eq!(fs::read(tables.join("t/b")).unwrap(), b"two");
    }

    #[test]
    fn an_entry_of_this_epoch_past_a_torn_one_makes_open_checkpoint() {
        let (tmp, tables) = setup();
        let (j, _) = open(&tmp, &tables);
        put(&j, &tables, "a", b"one");
        let epoch = j.lock().epoch;
        let head = j.lock().head;
        // Entry 1 torn, entry 2 whole (flushed in another order): an
        // entry 1 appended later could end where entry 2 starts.
        let one = encode(epoch, 1, "t", &name("b"), Change::Put(b"two"));
        let two = encode(epoch, 2, "t", &name("b"), Change::Delete);
        let mut torn = one.clone();
        torn[FIXED] ^= 0xff;
        j.file.write_all_at(&torn, head).unwrap();
        j.file.write_all_at(&two, head + one.len() as u64).unwrap();
        drop(j);
        let (j, replayed) = open(&tmp, &tables);
        assert_eq!(replayed.entries, 1);
        assert_eq!(j.checkpoints(), 1);
        assert_ne!(j.lock().epoch, epoch, "a new epoch: entry 2 never counts");
        put(&j, &tables, "b", b"again");
        drop(j);
        let (_j, replayed) = open(&tmp, &tables);
        assert_eq!(replayed.entries, 1);
        assert_eq!(fs::read(tables.join("t/b")).unwrap(), b"again");
    }

    #[test]
    fn a_full_journal_is_checkpointed_and_reused() {
        let (tmp, tables) = setup();
        let (j, _) = open(&tmp, &tables);
        let value = vec![b'x'; 10_000];
        for i in 0..300 {
            put(&j, &tables, &format!("k{}", i % 7), &value);
        }
        assert!(j.checkpoints() >= 2, "{} checkpoints", j.checkpoints());
        assert_eq!(j.syncs(), 300);
        drop(j);
        let (_j, replayed) = open(&tmp, &tables);
        assert!(replayed.entries < 110);
        assert_eq!(replayed.files_fixed, 0);
    }

    #[test]
    fn a_bad_header_means_an_empty_journal() {
        let (tmp, tables) = setup();
        let (j, _) = open(&tmp, &tables);
        put(&j, &tables, "a", b"one");
        j.file.write_all_at(b"garbage!", 0).unwrap();
        drop(j);
        fs::remove_file(tables.join("t/a")).unwrap();
        let (_j, replayed) = open(&tmp, &tables);
        assert_eq!(replayed.entries, 0);
        assert!(!tables.join("t/a").exists());
    }

    #[test]
    fn a_short_journal_is_made_anew() {
        let (tmp, tables) = setup();
        fs::write(tmp.path().join(JOURNAL_FILE), b"CSIJHDR1").unwrap();
        let (j, replayed) = open(&tmp, &tables);
        assert_eq!(replayed.entries, 0);
        assert_eq!(j.file.metadata().unwrap().len, LEN);
    }

    #[test]
    fn records_too_big_to_journal_are_written_directly() {
        let (tmp, tables) = setup();
        let (j, _) = open(&tmp, &tables);
        put(&j, &tables, "a", b"small");
        let big = vec![b'y'; MAX_ENTRY + 1];
        put(&j, &tables, "a", &big);
        assert_eq!(j.checkpoints(), 1, "the big write checkpoints first");
        drop(j);
        let (_j, replayed) = open(&tmp, &tables);
        assert_eq!(replayed.entries, 0);
        assert_eq!(fs::read(tables.join("t/a")).unwrap(), big);
    }
}
