//! [`FileStore`]: one crash-safe file per record.
//!
//! One file over 700 lines: every `RecordStore` method shares the store's
//! directory layout, journal and spare-file bookkeeping below.
//!
//! ```text
//! DIR/LOCK                          flock held for the store's life (pid inside)
//! DIR/journal                       write-ahead journal (see crate::journal)
//! DIR/tables/<table>/<name>         one record per file (see crate::key for names)
//! DIR/tables/<table>/.tmp-<pid>-<n> a write in progress; removed on open
//! DIR/quarantine/<table>/<t>-<n>-<name>   records that could not be read
//! ```
//!
//! A put writes a temporary file (a spare one when there is one) and
//! renames it over the record's name, exchanging so the replaced file
//! becomes a spare; a delete renames the record to a spare or unlinks it.
//! On a disk, each change is also appended to the journal,
//! and returns once an `fdatasync` of the journal covers it: one flush,
//! shared with every concurrent writer (group commit), instead of a flush
//! of the record file plus one of its directory. Replay at open and
//! checkpoints keep the record files in step with the journal. Neither
//! reads or rewrites any other record, so their cost does not depend on how
//! many records exist; a delete needs no free space (the journal's blocks
//! are written when it is created). Without room to create a journal, or
//! for records too big for it, a put `fdatasync`s the file and syncs the
//! directory itself (the directory sync shared, see [`crate::group`]).

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::codec::CodecId;
use crate::error::{StoreError, is_full};
use crate::format;
use crate::fs::{FileSystem, FsFile, OpenMode, RealFs};
use crate::group::GroupSync;
use crate::journal::{self, Change, CommitError, Journal};
use crate::key::{self, NameKind, TMP_PREFIX, check_key, check_table, file_name, shorten};
use crate::lock::DirLock;
use crate::store::{
    MAX_RECORD_LEN, Quarantined, RawRecord, RawScan, RecordStore, check_at, check_put,
};

const TABLES: &str = "tables";
const QUARANTINE: &str = "quarantine";

/// Records in one file each under a state directory that this store locks
/// for as long as any clone of it lives.
///
/// ```
/// use csi_store::{CodecId, FileStore, RecordStore, StoreError};
///
/// let dir = tempfile::tempdir().unwrap();
/// let store = FileStore::open(dir.path()).unwrap();
/// store.put("volumes", "vol-1", CodecId::JSON, br#"{"size":1}"#).unwrap();
/// assert!(store.get("volumes", "vol-1").unwrap().is_some());
///
/// // A second instance on the same directory is refused.
/// let err = FileStore::open(dir.path()).unwrap_err();
/// assert!(matches!(err, StoreError::Locked { .. }));
/// assert!(err.to_string().contains("in use by another process"));
/// ```
#[derive(Debug, Clone)]
pub struct FileStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    fs: Arc<dyn FileSystem>,
    dir: PathBuf,
    tables_dir: PathBuf,
    quarantine_dir: PathBuf,
    // Ordered, so spares are removed in the same order at every close.
    tables: Mutex<BTreeMap<String, Arc<TableDir>>>,
    /// Syncs of `tables/` after a table directory is created.
    tables_sync: GroupSync,
    seq: AtomicU64,
    pid: u32,
    puts: AtomicU64,
    deletes: AtomicU64,
    quarantined: AtomicU64,
    temps_removed: u64,
    /// `None` on tmpfs/ramfs, or when there was no room to create it.
    journal: Option<Journal>,
    journal_replayed: journal::Replayed,
    /// What the replay left in record files, by table, until the table's
    /// first scan takes it (the first change forgets it all).
    replayed_files: Mutex<HashMap<String, HashMap<OsString, Vec<u8>>>>,
    /// False on tmpfs/ramfs, where fsync is a no-op: skipping it there
    /// saves the group commit's coordination, not durability.
    syncs: bool,
    _lock: DirLock,
}

/// Spare files kept per table directory (see [`TableDir::spares`]).
const MAX_SPARES: usize = 32;

#[derive(Debug)]
struct TableDir {
    fs: Arc<dyn FileSystem>,
    path: PathBuf,
    handle: Box<dyn FsFile>,
    sync: GroupSync,
    /// Temporary-named files kept for reuse: a put overwrites one instead
    /// of creating a file, and a replaced or deleted record's file becomes
    /// one instead of being freed. Creating and freeing inodes (and, with
    /// `discard`, blocks) is most of a small write's cost on ext4 under
    /// churn; a record's old contents in a spare are never read (temporary
    /// names are skipped by scans and removed at open).
    spares: Mutex<Vec<OsString>>,
}

impl Drop for TableDir {
    fn drop(&mut self) {
        for name in self.spares.get_mut().unwrap_or_else(|e| e.into_inner()) {
            let _ = self.fs.remove_file(&self.path.join(name));
        }
    }
}

impl TableDir {
    /// A file to write a record into: a spare when there is one, else a
    /// new temporary file.
    fn scratch_file(
        &self,
        fresh_name: impl FnOnce() -> OsString,
    ) -> io::Result<(Box<dyn FsFile>, PathBuf)> {
        loop {
            let Some(name) = self.spares().pop() else {
                break;
            };
            let path = self.path.join(name);
            if let Ok(f) = self.fs.open(&path, OpenMode::Write) {
                return Ok((f, path));
            }
        }
        let path = self.path.join(fresh_name());
        let file = self.fs.open(&path, OpenMode::CreateNew)?;
        Ok((file, path))
    }

    /// Keeps the file at `path` (a temporary name in this directory) as a
    /// spare, or removes it when there are enough.
    fn keep_spare(&self, path: &Path) {
        let mut spares = self.spares();
        match path.file_name() {
            Some(name) if spares.len() < MAX_SPARES => spares.push(name.to_owned()),
            _ => {
                drop(spares);
                let _ = self.fs.remove_file(path);
            }
        }
    }

    /// Removes the record file `name`: renamed to a spare when one is
    /// wanted, else (or when the rename fails, e.g. a full directory
    /// block) unlinked, which needs no space. False when it was absent.
    fn retire(&self, name: &OsStr, spare_name: impl FnOnce() -> OsString) -> io::Result<bool> {
        let path = self.path.join(name);
        if self.spares().len() < MAX_SPARES {
            let spare = spare_name();
            match self.fs.rename(&path, &self.path.join(&spare)) {
                Ok(()) => {
                    self.keep_spare(&self.path.join(spare));
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
                Err(_) => {}
            }
        }
        match self.fs.remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn spares(&self) -> MutexGuard<'_, Vec<OsString>> {
        self.spares.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sync(&self, needed: bool) -> Result<(), StoreError> {
        if !needed {
            return Ok(());
        }
        self.sync
            .sync(|| self.handle.sync_all())
            .map_err(|e| StoreError::io("syncing directory", &self.path, e))
    }
}

/// Counters of a [`FileStore`] since it was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Records written.
    pub puts: u64,
    /// Deletes (of present or absent records).
    pub deletes: u64,
    /// Directory fsyncs run (by checkpoints, or for changes made without
    /// the journal: shared by concurrent writers).
    pub dir_syncs: u64,
    /// Flushes of the journal run for puts and deletes; fewer than puts +
    /// deletes when concurrent writers shared them.
    pub journal_syncs: u64,
    /// Checkpoints of the journal (at open only after a torn journal
    /// write, see [`crate::FileStore::open`]).
    pub checkpoints: u64,
    /// Journal entries replayed by `open`.
    pub journal_replayed_at_open: u64,
    /// Record files `open` had to rewrite or remove to say what the
    /// journal says (lost, stale or torn by a power loss).
    pub journal_files_fixed_at_open: u64,
    /// Records moved to quarantine.
    pub quarantined: u64,
    /// Temporary files of interrupted writes removed by `open`.
    pub temps_removed_at_open: u64,
}

impl FileStore {
    /// Opens (creating if needed, mode 0700) the store in `dir`: takes the
    /// directory's lock ([`StoreError::Locked`] if another instance has it)
    /// and removes temporary files left by interrupted writes.
    pub fn open(dir: impl AsRef<Path>) -> Result<FileStore, StoreError> {
        Self::open_on(Arc::new(RealFs), dir)
    }

    /// [`open`](Self::open) with every file operation made through `fs`
    /// (a simulated filesystem in tests; [`open`](Self::open) uses
    /// [`RealFs`]).
    pub fn open_on(
        fs: Arc<dyn FileSystem>,
        dir: impl AsRef<Path>,
    ) -> Result<FileStore, StoreError> {
        let dir = dir.as_ref().to_owned();
        make_dir(&*fs, &dir)?;
        let lock = DirLock::acquire_on(&*fs, &dir)?;
        let tables_dir = dir.join(TABLES);
        let quarantine_dir = dir.join(QUARANTINE);
        make_dir(&*fs, &tables_dir)?;
        make_dir(&*fs, &quarantine_dir)?;
        let temps_removed = remove_temporaries(&*fs, &tables_dir)?;
        let syncs = !fs.in_memory(&dir);
        if temps_removed > 0 {
            tracing::info!(dir = %dir.display(), files = temps_removed, "removed temporary files of interrupted writes");
        }
        let (journal, mut journal_replayed) = if syncs {
            match Journal::open(&fs, &dir, &tables_dir) {
                Ok(Some((j, r))) => {
                    if r.files_fixed > 0 {
                        tracing::info!(dir = %dir.display(), entries = r.entries, files = r.files_fixed,
                            "journal replayed onto record files");
                    }
                    (Some(j), r)
                }
                Ok(None) => {
                    tracing::warn!(dir = %dir.display(),
                        "no room to create the journal; every write flushes its own file and directory");
                    (None, journal::Replayed::default())
                }
                Err(e) if is_full(&e) => {
                    return Err(StoreError::NoSpace {
                        dir: dir.clone(),
                        table: String::new(),
                        key: "(journal replay)".into(),
                    });
                }
                Err(e) => {
                    return Err(StoreError::io(
                        "replaying journal",
                        dir.join(journal::JOURNAL_FILE),
                        e,
                    ));
                }
            }
        } else {
            (None, journal::Replayed::default())
        };
        let replayed_files = Mutex::new(std::mem::take(&mut journal_replayed.files));
        Ok(FileStore {
            inner: Arc::new(Inner {
                fs,
                dir,
                tables_dir,
                quarantine_dir,
                tables: Mutex::new(BTreeMap::new()),
                tables_sync: GroupSync::default(),
                seq: AtomicU64::new(0),
                pid: std::process::id(),
                puts: AtomicU64::new(0),
                deletes: AtomicU64::new(0),
                quarantined: AtomicU64::new(0),
                temps_removed,
                journal,
                journal_replayed,
                replayed_files,
                syncs,
                _lock: lock,
            }),
        })
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Where quarantined records of every table go.
    pub fn quarantine_dir(&self) -> &Path {
        &self.inner.quarantine_dir
    }

    /// Whether writes are fsynced. False when the directory is on tmpfs or
    /// ramfs, where fsync does nothing (records there survive a process
    /// crash, never a reboot, synced or not).
    pub fn syncs_to_disk(&self) -> bool {
        self.inner.syncs
    }

    /// Counters since open.
    pub fn stats(&self) -> Stats {
        let i = &self.inner;
        let dir_syncs: u64 = i
            .tables
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|t| t.sync.syncs())
            .sum();
        let j = i.journal.as_ref();
        Stats {
            puts: i.puts.load(Ordering::Relaxed),
            deletes: i.deletes.load(Ordering::Relaxed),
            dir_syncs: dir_syncs + j.map_or(0, Journal::dir_syncs),
            journal_syncs: j.map_or(0, Journal::syncs),
            checkpoints: j.map_or(0, Journal::checkpoints),
            journal_replayed_at_open: i.journal_replayed.entries,
            journal_files_fixed_at_open: i.journal_replayed.files_fixed,
            quarantined: i.quarantined.load(Ordering::Relaxed),
            temps_removed_at_open: i.temps_removed,
        }
    }

    /// Forgets what the replay left in the record files, before one is
    /// changed: it serves the scans made at open, until the first change
    /// (so it never outlives the start, nor answers for a changed file).
    fn forget_replayed(&self) {
        let mut replayed = self.replayed();
        if !replayed.is_empty() {
            *replayed = HashMap::new();
        }
    }

    fn replayed(&self) -> MutexGuard<'_, HashMap<String, HashMap<OsString, Vec<u8>>>> {
        let replayed = &self.inner.replayed_files;
        replayed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fresh temporary file name (removed at open if left behind).
    fn temporary_name(&self) -> OsString {
        let seq = self.inner.seq.fetch_add(1, Ordering::Relaxed);
        format!("{TMP_PREFIX}{}-{seq}", self.inner.pid).into()
    }

    /// After a put's rename: the temporary name now holds the replaced
    /// record's file (kept as a spare) or nothing.
    fn after_swap(&self, td: &TableDir, tmp: &mut Temporary<'_>, replaced: bool) {
        if let Some(path) = tmp.path.take().filter(|_| replaced) {
            td.keep_spare(&path);
        }
    }

    /// The directory of `table`; created when missing if `create_for` is
    /// the key of a put (named in a `NoSpace` error).
    fn table_dir(
        &self,
        table: &str,
        create_for: Option<&str>,
    ) -> Result<Option<Arc<TableDir>>, StoreError> {
        if let Some(t) = self
            .inner
            .tables
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(table)
        {
            return Ok(Some(t.clone()));
        }
        let path = self.inner.tables_dir.join(table);
        let fs = &*self.inner.fs;
        let handle = match open_dir(fs, &path) {
            Ok(h) => h,
            Err(e) if e.kind() == io::ErrorKind::NotFound && create_for.is_some() => {
                match fs.create_dir(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) if is_full(&e) => {
                        return Err(StoreError::NoSpace {
                            dir: self.inner.tables_dir.clone(),
                            table: table.to_owned(),
                            key: shorten(create_for.unwrap_or_default()),
                        });
                    }
                    Err(e) => return Err(StoreError::io("creating table directory", &path, e)),
                }
                let tables_dir = &self.inner.tables_dir;
                self.inner
                    .tables_sync
                    .sync(|| open_dir(fs, tables_dir)?.sync_all())
                    .map_err(|e| StoreError::io("syncing directory", tables_dir, e))?;
                open_dir(fs, &path)
                    .map_err(|e| StoreError::io("opening table directory", &path, e))?
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StoreError::io("opening table directory", &path, e)),
        };
        let fresh = Arc::new(TableDir {
            fs: self.inner.fs.clone(),
            path,
            handle,
            sync: GroupSync::default(),
            spares: Mutex::new(Vec::new()),
        });
        let mut tables = self.inner.tables.lock().unwrap_or_else(|e| e.into_inner());
        Ok(Some(
            tables.entry(table.to_owned()).or_insert(fresh).clone(),
        ))
    }

    /// Removes the torn record file `name` of `td`, journaled like any
    /// delete so no older entry brings it back.
    fn remove_torn(&self, td: &TableDir, table: &str, name: &OsStr) -> io::Result<()> {
        let src = td.path.join(name);
        let fs = &*self.inner.fs;
        let removed = match &self.inner.journal {
            Some(j) => j
                .commit(&td.path, &name.to_owned(), table, Change::Delete, || {
                    fs.remove_file(&src)
                })
                .map_err(|e| match e {
                    CommitError::Apply(e) | CommitError::Flush(e) => e,
                }),
            None => fs.remove_file(&src),
        };
        let removed = removed.and_then(|()| td.handle.sync_all());
        match &removed {
            Ok(()) => {
                tracing::info!(table, file = %src.display(), "torn record file of an unacknowledged write removed")
            }
            Err(e) => {
                tracing::warn!(table, file = %src.display(), error = %e, "torn record file could not be removed")
            }
        }
        removed
    }

    /// Moves `name` out of `td` into the quarantine directory, if its bytes
    /// are still `expected` (`None`: move whatever is there).
    fn move_aside(
        &self,
        td: &TableDir,
        table: &str,
        name: &OsStr,
        key: Option<String>,
        expected: Option<&[u8]>,
        reason: String,
    ) -> Option<Quarantined> {
        self.forget_replayed();
        let src = td.path.join(name);
        let fs = &*self.inner.fs;
        if let Some(expected) = expected {
            match read_record(fs, &src) {
                Ok(now) if now == expected => {}
                _ => return None, // rewritten or removed meanwhile
            }
        }
        // No record is all zeros: such a file is a name (and size) a crash
        // kept without the data, of a write never acknowledged (an
        // acknowledged one is in the journal, replayed before any read, or
        // was synced).
        let torn = expected.is_some_and(|b| b.iter().all(|&x| x == 0));
        if torn && self.remove_torn(td, table, name).is_ok() {
            return None;
        }
        let qdir = self.inner.quarantine_dir.join(table);
        let moved = (|| {
            match fs.create_dir(&qdir) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
                _ => {}
            }
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            let seq = self.inner.seq.fetch_add(1, Ordering::Relaxed);
            let mut dest_name = OsString::from(format!("{nanos:x}-{seq:x}-"));
            dest_name.push(truncate(name, 255 - dest_name.len()));
            let dest = qdir.join(dest_name);
            match &self.inner.journal {
                // Journaled, so no older entry brings the record back.
                Some(j) => j
                    .commit(&td.path, &name.to_owned(), table, Change::Delete, || {
                        fs.rename(&src, &dest)
                    })
                    .map_err(|e| match e {
                        CommitError::Apply(e) | CommitError::Flush(e) => e,
                    })?,
                None => fs.rename(&src, &dest)?,
            }
            td.handle.sync_all()?;
            open_dir(fs, &qdir)?.sync_all()?;
            Ok(dest)
        })();
        let moved_to = match moved {
            Ok(dest) => {
                self.inner.quarantined.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(table, key = key.as_deref().unwrap_or("?"), reason = %reason,
                    moved_to = %dest.display(), "unreadable record quarantined");
                Some(dest)
            }
            Err(e) => {
                tracing::warn!(table, key = key.as_deref().unwrap_or("?"), reason = %reason,
                    file = %src.display(), error = %e, "unreadable record could not be moved to quarantine");
                None
            }
        };
        Some(Quarantined {
            table: table.to_owned(),
            key,
            reason,
            moved_to,
        })
    }
}

impl RecordStore for FileStore {
    fn put(&self, table: &str, key: &str, codec: CodecId, bytes: &[u8]) -> Result<(), StoreError> {
        check_put(table, key, bytes.len())?;
        let td = self
            .table_dir(table, Some(key))?
            .expect("table_dir creates the table");
        let err = |op: &'static str, path: &Path, e: io::Error| {
            if is_full(&e) {
                StoreError::NoSpace {
                    dir: td.path.clone(),
                    table: table.to_owned(),
                    key: shorten(key),
                }
            } else {
                StoreError::io(op, path, e)
            }
        };
        let contents = format::encode(key, codec, bytes);
        let name = OsString::from(file_name(key));
        self.forget_replayed();
        let (file, tmp_path) = td
            .scratch_file(|| self.temporary_name())
            .map_err(|e| err("creating", &td.path, e))?;
        let mut tmp = Temporary {
            path: Some(tmp_path),
            fs: &*self.inner.fs,
        };
        let tmp_path = tmp.path.as_deref().expect("set above");
        file.write_all_at(&contents, 0)
            .and_then(|()| file.set_len(contents.len() as u64))
            .map_err(|e| err("writing", tmp_path, e))?;
        let journal = self.inner.journal.as_ref();
        let journaled = journal.is_some() && journal::journaled(table, &name, contents.len());
        if self.inner.syncs && !journaled {
            file.sync_data().map_err(|e| err("syncing", tmp_path, e))?;
        }
        drop(file);
        let dest = td.path.join(&name);
        let Some(j) = journal else {
            let replaced = swap_into(&*self.inner.fs, tmp_path, &dest)
                .map_err(|e| err("renaming", &dest, e))?;
            self.inner.puts.fetch_add(1, Ordering::Relaxed);
            self.after_swap(&td, &mut tmp, replaced);
            return td.sync(self.inner.syncs);
        };
        let result = j.commit(&td.path, &name, table, Change::Put(&contents), || {
            swap_into(&*self.inner.fs, tmp_path, &dest)
        });
        let replaced = match result {
            Ok(replaced) => replaced,
            Err(CommitError::Apply(e)) => return Err(err("renaming", &dest, e)),
            Err(CommitError::Flush(e)) => {
                tmp.path = None;
                return Err(StoreError::io("syncing journal", self.inner.dir.clone(), e));
            }
        };
        self.inner.puts.fetch_add(1, Ordering::Relaxed);
        self.after_swap(&td, &mut tmp, replaced);
        Ok(())
    }

    fn get(&self, table: &str, key: &str) -> Result<Option<RawRecord>, StoreError> {
        check_at(table, key)?;
        let Some(td) = self.table_dir(table, None)? else {
            return Ok(None);
        };
        let name = file_name(key);
        let path = td.path.join(&name);
        let bytes = match read_record(&*self.inner.fs, &path) {
            Ok(b) => b,
            Err(ReadError::Io(e)) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(ReadError::Io(e)) => return Err(StoreError::io("reading", &path, e)),
            Err(ReadError::NotRecord(reason)) => {
                let q = self.move_aside(
                    &td,
                    table,
                    name.as_ref(),
                    Some(key.to_owned()),
                    None,
                    reason.to_owned(),
                );
                return Err(corrupt(table, key, reason.to_owned(), q));
            }
        };
        match check_record(&name, &bytes) {
            Ok((found, codec, start)) if found == key => Ok(Some(RawRecord {
                codec,
                bytes: bytes[start..].to_vec(),
            })),
            result => {
                let reason = match result {
                    Ok(_) => "the record holds another key".to_owned(),
                    Err(reason) => reason,
                };
                let q = self.move_aside(
                    &td,
                    table,
                    name.as_ref(),
                    Some(key.to_owned()),
                    Some(&bytes),
                    reason.clone(),
                );
                Err(corrupt(table, key, reason, q))
            }
        }
    }

    fn delete(&self, table: &str, key: &str) -> Result<bool, StoreError> {
        check_at(table, key)?;
        let Some(td) = self.table_dir(table, None)? else {
            return Ok(false);
        };
        let name = OsString::from(file_name(key));
        self.forget_replayed();
        let path = td.path.join(&name);
        let unlink = || td.retire(&name, || self.temporary_name());
        if let Some(j) = &self.inner.journal {
            // Journaled also when absent: a concurrent delete's entry may
            // not be flushed yet.
            let existed = match j.commit(&td.path, &name, table, Change::Delete, unlink) {
                Ok(existed) => existed,
                Err(CommitError::Apply(e)) => return Err(StoreError::io("removing", &path, e)),
                Err(CommitError::Flush(e)) => {
                    return Err(StoreError::io("syncing journal", self.inner.dir.clone(), e));
                }
            };
            self.inner.deletes.fetch_add(1, Ordering::Relaxed);
            return Ok(existed);
        }
        let existed = unlink().map_err(|e| StoreError::io("removing", &path, e))?;
        self.inner.deletes.fetch_add(1, Ordering::Relaxed);
        // Also when absent: a concurrent delete's unlink may not be durable yet.
        td.sync(self.inner.syncs)?;
        Ok(existed)
    }

    fn scan(&self, table: &str) -> Result<RawScan, StoreError> {
        check_table(table)?;
        let Some(td) = self.table_dir(table, None)? else {
            return Ok(RawScan::default());
        };
        let mut scan = RawScan::default();
        // Taken before listing: a file changed after this was forgotten
        // from it first, so what is left is what the files hold.
        let mut replayed = self.replayed().remove(table).unwrap_or_default();
        let entries = (self.inner.fs)
            .read_dir(&td.path)
            .map_err(|e| StoreError::io("listing", &td.path, e))?;
        for entry in entries {
            let os_name = entry.name;
            let kind = os_name.to_str().map_or(NameKind::Foreign, key::classify);
            let named_key = match kind {
                NameKind::Temporary => continue, // a write in progress
                NameKind::Foreign => {
                    let reason = "file name is not a record name".to_owned();
                    scan.quarantined
                        .extend(self.move_aside(&td, table, &os_name, None, None, reason));
                    continue;
                }
                NameKind::Key(k) => Some(k),
                NameKind::Hashed => None,
            };
            let name = os_name.to_str().expect("classified names are UTF-8");
            let read = match replayed.remove(&os_name) {
                Some(bytes) => Ok(bytes),
                None => read_record_in(&td, &os_name),
            };
            let bytes = match read {
                Ok(b) => b,
                Err(ReadError::Io(e)) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(ReadError::Io(e)) => {
                    return Err(StoreError::io("reading", td.path.join(&os_name), e));
                }
                Err(ReadError::NotRecord(reason)) => {
                    scan.quarantined.extend(self.move_aside(
                        &td,
                        table,
                        &os_name,
                        named_key,
                        None,
                        reason.to_owned(),
                    ));
                    continue;
                }
            };
            match check_record(name, &bytes) {
                Ok((key, codec, start)) => {
                    let key = key.to_owned();
                    let mut bytes = bytes;
                    bytes.drain(..start);
                    scan.records.push((key, RawRecord { codec, bytes }));
                }
                Err(reason) => {
                    scan.quarantined.extend(self.move_aside(
                        &td,
                        table,
                        &os_name,
                        named_key,
                        Some(&bytes),
                        reason,
                    ));
                }
            }
        }
        scan.records.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(scan)
    }

    fn quarantine(
        &self,
        table: &str,
        key: &str,
        seen: &RawRecord,
        reason: &str,
    ) -> Result<Option<Quarantined>, StoreError> {
        check_at(table, key)?;
        let Some(td) = self.table_dir(table, None)? else {
            return Ok(None);
        };
        let name = file_name(key);
        let Ok(bytes) = read_record(&*self.inner.fs, &td.path.join(&name)) else {
            return Ok(None);
        };
        let same = matches!(check_record(&name, &bytes),
            Ok((_, codec, start)) if codec == seen.codec && bytes[start..] == seen.bytes[..]);
        if !same {
            return Ok(None);
        }
        Ok(self.move_aside(
            &td,
            table,
            name.as_ref(),
            Some(key.to_owned()),
            Some(&bytes),
            reason.to_owned(),
        ))
    }

    fn quarantined_keys(&self, table: &str) -> Result<Vec<String>, StoreError> {
        check_table(table)?;
        let qdir = self.inner.quarantine_dir.join(table);
        let entries = match self.inner.fs.read_dir(&qdir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(StoreError::io("listing", &qdir, e)),
        };
        let mut keys = Vec::new();
        for entry in entries {
            let name = entry.name;
            let original = name
                .to_str()
                .and_then(|n| n.splitn(3, '-').nth(2))
                .map(key::classify);
            match original {
                Some(NameKind::Key(k)) => keys.push(k),
                // Hashed or cut short: the file may still say.
                _ => {
                    let bytes = read_record(&*self.inner.fs, &qdir.join(&name)).ok();
                    if let Some(d) = bytes.as_deref().and_then(|b| format::decode(b).ok()) {
                        keys.push(d.key.to_owned());
                    }
                }
            }
        }
        keys.sort();
        keys.dedup();
        Ok(keys)
    }
}

fn corrupt(table: &str, key: &str, reason: String, q: Option<Quarantined>) -> StoreError {
    StoreError::Corrupt {
        table: table.to_owned(),
        key: shorten(key),
        reason,
        moved_to: q.and_then(|q| q.moved_to),
    }
}

/// Decodes a record file found under `name`: its key (which must give that
/// name), codec and where the payload starts.
fn check_record<'a>(name: &str, bytes: &'a [u8]) -> Result<(&'a str, CodecId, usize), String> {
    let d = format::decode(bytes)?;
    if check_key(d.key).is_err() || file_name(d.key) != name {
        return Err("the record's key does not match its file name".into());
    }
    Ok((d.key, d.codec, d.payload_start))
}

enum ReadError {
    Io(io::Error),
    NotRecord(&'static str),
}

/// Reads a record file without following symlinks, blocking on FIFOs or
/// reading anything too large to be a record.
fn read_record(fs: &dyn FileSystem, path: &Path) -> Result<Vec<u8>, ReadError> {
    read_opened(fs.open(path, OpenMode::Read))
}

/// [`read_record`] of `name` in a table directory, opened relative to it.
fn read_record_in(td: &TableDir, name: &OsStr) -> Result<Vec<u8>, ReadError> {
    read_opened(td.fs.open_in(&*td.handle, &td.path, name, OpenMode::Read))
}

fn read_opened(opened: io::Result<Box<dyn FsFile>>) -> Result<Vec<u8>, ReadError> {
    let mut f = match opened {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(ReadError::NotRecord("a symbolic link"));
        }
        Err(e) => return Err(ReadError::Io(e)),
    };
    let not_file = |f: &dyn FsFile| f.metadata().is_ok_and(|m| !m.is_file);
    match f.read_bounded(MAX_RECORD_LEN + key::MAX_KEY_LEN + 64) {
        // No record is empty: only then is the kind worth asking.
        Ok(Some(bytes)) if bytes.is_empty() && not_file(&*f) => {
            Err(ReadError::NotRecord("not a regular file"))
        }
        Ok(Some(bytes)) => Ok(bytes),
        Ok(None) => Err(ReadError::NotRecord("larger than any record")),
        Err(_) if not_file(&*f) => Err(ReadError::NotRecord("not a regular file")),
        Err(e) => Err(ReadError::Io(e)),
    }
}

/// Removes the temporary file of a write that did not finish (unlink needs
/// no space, so this works on a full filesystem too).
struct Temporary<'a> {
    path: Option<PathBuf>,
    fs: &'a dyn FileSystem,
}

impl Drop for Temporary<'_> {
    fn drop(&mut self) {
        if let Some(path) = &self.path {
            let _ = self.fs.remove_file(path);
        }
    }
}

/// Renames `from` over `to`. When `to` existed its file is exchanged to
/// `from` (true) rather than freed, so it can be reused; filesystems
/// without `RENAME_EXCHANGE` get a plain rename.
fn swap_into(fs: &dyn FileSystem, from: &Path, to: &Path) -> io::Result<bool> {
    match fs.exchange(from, to) {
        Ok(()) => Ok(true),
        // `to` absent, or no exchange here.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOENT | libc::EINVAL | libc::ENOSYS)
            ) =>
        {
            fs.rename(from, to).map(|()| false)
        }
        Err(e) => Err(e),
    }
}

fn open_dir(fs: &dyn FileSystem, path: &Path) -> io::Result<Box<dyn FsFile>> {
    fs.open(path, OpenMode::Directory)
}

/// Creates `dir` (mode 0700) and its missing parents, each new
/// directory's entry synced into its parent: a parent created here and
/// not synced could vanish in a power loss and take the store with it.
fn make_dir(fs: &dyn FileSystem, dir: &Path) -> Result<(), StoreError> {
    let parent_of = |d: &Path| match d.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    let mut missing = Vec::new();
    let mut at = dir.to_owned();
    while !fs.is_dir(&at) {
        missing.push(at.clone());
        match at.parent() {
            Some(p) if !p.as_os_str().is_empty() => at = p.to_owned(),
            _ => break,
        }
    }
    for d in missing.iter().rev() {
        match fs.create_dir(d) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && fs.is_dir(d) => {}
            r => r.map_err(|e| StoreError::io("creating directory", d, e))?,
        }
        let parent = parent_of(d);
        open_dir(fs, &parent)
            .and_then(|h| h.sync_all())
            .map_err(|e| StoreError::io("syncing directory", parent, e))?;
    }
    Ok(())
}

/// Removes every temporary file in every table directory; the lock is held,
/// so they belong to writes that can no longer finish.
fn remove_temporaries(fs: &dyn FileSystem, tables_dir: &Path) -> Result<u64, StoreError> {
    let listing = |dir: &Path| {
        fs.read_dir(dir)
            .map_err(|e| StoreError::io("listing", dir, e))
    };
    let mut removed = 0;
    for table in listing(tables_dir)? {
        if !table.is_dir {
            continue;
        }
        let dir = tables_dir.join(&table.name);
        let mut here = 0;
        for entry in listing(&dir)? {
            if entry
                .name
                .to_str()
                .is_some_and(|n| n.starts_with(TMP_PREFIX))
            {
                let path = dir.join(&entry.name);
                match fs.remove_file(&path) {
                    Ok(()) => here += 1,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(StoreError::io("removing", path, e)),
                }
            }
        }
        if here > 0 {
            open_dir(fs, &dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| StoreError::io("syncing directory", &dir, e))?;
        }
        removed += here;
    }
    Ok(removed)
}

/// The first `max` bytes of a name, cut at a character boundary.
fn truncate(name: &OsStr, max: usize) -> OsString {
    use std::os::unix::ffi::OsStrExt;
    let b = name.as_bytes();
    if b.len() <= max {
        return name.to_owned();
    }
    let mut end = max;
    // Back off from the middle of a UTF-8 sequence.
    while end > 0 && (b[end] & 0xC0) == 0x80 {
        end -= 1;
    }
    OsStr::from_bytes(&b[..end]).to_owned()
}
