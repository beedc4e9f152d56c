//! [`FileStore`]: one crash-safe file per record.
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

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::codec::CodecId;
use crate::error::{StoreError, is_full};
use crate::format;
use crate::group::GroupSync;
use crate::journal::{self, Change, CommitError, Journal};
use crate::key::{self, NameKind, TMP_PREFIX, check_key, check_table, file_name, shorten};
use crate::lock::DirLock;
use crate::store::{MAX_RECORD_LEN, Quarantined, RawRecord, RawScan, RecordStore, check_put};

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
    dir: PathBuf,
    tables_dir: PathBuf,
    quarantine_dir: PathBuf,
    tables: Mutex<HashMap<String, Arc<TableDir>>>,
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
    journal_replayed: u64,
    /// False on tmpfs/ramfs, where fsync is a no-op: skipping it there
    /// saves the group commit's coordination, not durability.
    syncs: bool,
    _lock: DirLock,
}

/// Spare files kept per table directory (see [`TableDir::spares`]).
const MAX_SPARES: usize = 32;

#[derive(Debug)]
struct TableDir {
    path: PathBuf,
    handle: File,
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
            let _ = fs::remove_file(self.path.join(name));
        }
    }
}

impl TableDir {
    /// A file to write a record into: a spare when there is one, else a
    /// new temporary file.
    fn scratch_file(&self, fresh_name: impl FnOnce() -> OsString) -> io::Result<(File, PathBuf)> {
        loop {
            let Some(name) = self.spares().pop() else {
                break;
            };
            let path = self.path.join(name);
            if let Ok(f) = OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&path)
            {
                return Ok((f, path));
            }
        }
        let path = self.path.join(fresh_name());
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
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
                let _ = fs::remove_file(path);
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
            match fs::rename(&path, self.path.join(&spare)) {
                Ok(()) => {
                    self.keep_spare(&self.path.join(spare));
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
                Err(_) => {}
            }
        }
        match fs::remove_file(&path) {
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
    /// Checkpoints of the journal (the one at open included).
    pub checkpoints: u64,
    /// Journal entries replayed by `open`.
    pub journal_replayed_at_open: u64,
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
        let dir = dir.as_ref().to_owned();
        make_dir(&dir)?;
        let lock = DirLock::acquire(&dir)?;
        let tables_dir = dir.join(TABLES);
        let quarantine_dir = dir.join(QUARANTINE);
        make_dir(&tables_dir)?;
        make_dir(&quarantine_dir)?;
        let temps_removed = remove_temporaries(&tables_dir)?;
        let syncs = !in_memory_fs(&dir);
        if temps_removed > 0 {
            tracing::info!(dir = %dir.display(), files = temps_removed, "removed temporary files of interrupted writes");
        }
        let (journal, journal_replayed) = if syncs {
            match Journal::open(&dir, &tables_dir) {
                Ok(Some((j, r))) => {
                    if r.files_fixed > 0 {
                        tracing::info!(dir = %dir.display(), entries = r.entries, files = r.files_fixed,
                            "journal replayed onto record files");
                    }
                    (Some(j), r.entries)
                }
                Ok(None) => {
                    tracing::warn!(dir = %dir.display(),
                        "no room to create the journal; every write flushes its own file and directory");
                    (None, 0)
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
            (None, 0)
        };
        Ok(FileStore {
            inner: Arc::new(Inner {
                dir,
                tables_dir,
                quarantine_dir,
                tables: Mutex::new(HashMap::new()),
                tables_sync: GroupSync::default(),
                seq: AtomicU64::new(0),
                pid: std::process::id(),
                puts: AtomicU64::new(0),
                deletes: AtomicU64::new(0),
                quarantined: AtomicU64::new(0),
                temps_removed,
                journal,
                journal_replayed,
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
            journal_replayed_at_open: i.journal_replayed,
            quarantined: i.quarantined.load(Ordering::Relaxed),
            temps_removed_at_open: i.temps_removed,
        }
    }

    /// A fresh temporary file name (removed at open if left behind).
    fn temporary_name(&self) -> OsString {
        let seq = self.inner.seq.fetch_add(1, Ordering::Relaxed);
        format!("{TMP_PREFIX}{}-{seq}", self.inner.pid).into()
    }

    /// After a put's rename: the temporary name now holds the replaced
    /// record's file (kept as a spare) or nothing.
    fn after_swap(&self, td: &TableDir, tmp: &mut Temporary, replaced: bool) {
        if let Some(path) = tmp.0.take().filter(|_| replaced) {
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
        let handle = match open_dir(&path) {
            Ok(h) => h,
            Err(e) if e.kind() == io::ErrorKind::NotFound && create_for.is_some() => {
                match DirBuilder::new().mode(0o700).create(&path) {
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
                    .sync(|| open_dir(tables_dir)?.sync_all())
                    .map_err(|e| StoreError::io("syncing directory", tables_dir, e))?;
                open_dir(&path).map_err(|e| StoreError::io("opening table directory", &path, e))?
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StoreError::io("opening table directory", &path, e)),
        };
        let fresh = Arc::new(TableDir {
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
        let src = td.path.join(name);
        if let Some(expected) = expected {
            match read_record(&src) {
                Ok(now) if now == expected => {}
                _ => return None, // rewritten or removed meanwhile
            }
        }
        let qdir = self.inner.quarantine_dir.join(table);
        let moved = (|| {
            match DirBuilder::new().mode(0o700).create(&qdir) {
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
                        fs::rename(&src, &dest)
                    })
                    .map_err(|e| match e {
                        CommitError::Apply(e) | CommitError::Flush(e) => e,
                    })?,
                None => fs::rename(&src, &dest)?,
            }
            td.handle.sync_all()?;
            open_dir(&qdir)?.sync_all()?;
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
        let (file, tmp_path) = td
            .scratch_file(|| self.temporary_name())
            .map_err(|e| err("creating", &td.path, e))?;
        let mut tmp = Temporary(Some(tmp_path));
        let tmp_path = tmp.0.as_deref().expect("set above");
        file.write_all_at(&contents, 0)
            .and_then(|()| file.set_len(contents.len() as u64))
            .map_err(|e| err("writing", tmp_path, e))?;
        let name = OsString::from(file_name(key));
        let journal = self.inner.journal.as_ref();
        let journaled = journal.is_some() && journal::journaled(table, &name, contents.len());
        if self.inner.syncs && !journaled {
            file.sync_data().map_err(|e| err("syncing", tmp_path, e))?;
        }
        drop(file);
        let dest = td.path.join(&name);
        let Some(j) = journal else {
            let replaced = swap_into(tmp_path, &dest).map_err(|e| err("renaming", &dest, e))?;
            self.inner.puts.fetch_add(1, Ordering::Relaxed);
            self.after_swap(&td, &mut tmp, replaced);
            return td.sync(self.inner.syncs);
        };
        let result = j.commit(&td.path, &name, table, Change::Put(&contents), || {
            swap_into(tmp_path, &dest)
        });
        let replaced = match result {
            Ok(replaced) => replaced,
            Err(CommitError::Apply(e)) => return Err(err("renaming", &dest, e)),
            Err(CommitError::Flush(e)) => {
                tmp.0 = None;
                return Err(StoreError::io("syncing journal", self.inner.dir.clone(), e));
            }
        };
        self.inner.puts.fetch_add(1, Ordering::Relaxed);
        self.after_swap(&td, &mut tmp, replaced);
        Ok(())
    }

    fn get(&self, table: &str, key: &str) -> Result<Option<RawRecord>, StoreError> {
        check_table(table)?;
        check_key(key)?;
        let Some(td) = self.table_dir(table, None)? else {
            return Ok(None);
        };
        let name = file_name(key);
        let path = td.path.join(&name);
        let bytes = match read_record(&path) {
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
        check_table(table)?;
        check_key(key)?;
        let Some(td) = self.table_dir(table, None)? else {
            return Ok(false);
        };
        let name = OsString::from(file_name(key));
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
        let entries = fs::read_dir(&td.path).map_err(|e| StoreError::io("listing", &td.path, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| StoreError::io("listing", &td.path, e))?;
            let os_name = entry.file_name();
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
            let bytes = match read_record(&entry.path()) {
                Ok(b) => b,
                Err(ReadError::Io(e)) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(ReadError::Io(e)) => return Err(StoreError::io("reading", entry.path(), e)),
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
        check_table(table)?;
        check_key(key)?;
        let Some(td) = self.table_dir(table, None)? else {
            return Ok(None);
        };
        let name = file_name(key);
        let Ok(bytes) = read_record(&td.path.join(&name)) else {
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
        let entries = match fs::read_dir(&qdir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(StoreError::io("listing", &qdir, e)),
        };
        let mut keys = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| StoreError::io("listing", &qdir, e))?;
            let name = entry.file_name();
            let original = name
                .to_str()
                .and_then(|n| n.splitn(3, '-').nth(2))
                .map(key::classify);
            match original {
                Some(NameKind::Key(k)) => keys.push(k),
                // Hashed or cut short: the file may still say.
                _ => {
                    let bytes = read_record(&entry.path()).ok();
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
fn read_record(path: &Path) -> Result<Vec<u8>, ReadError> {
    let mut f = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(ReadError::NotRecord("a symbolic link"));
        }
        Err(e) => return Err(ReadError::Io(e)),
    };
    let meta = f.metadata().map_err(ReadError::Io)?;
    if !meta.is_file() {
        return Err(ReadError::NotRecord("not a regular file"));
    }
    if meta.len() > (MAX_RECORD_LEN + key::MAX_KEY_LEN + 64) as u64 {
        return Err(ReadError::NotRecord("larger than any record"));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    f.read_to_end(&mut bytes).map_err(ReadError::Io)?;
    Ok(bytes)
}

/// Removes the temporary file of a write that did not finish (unlink needs
/// no space, so this works on a full filesystem too).
struct Temporary(Option<PathBuf>);

impl Drop for Temporary {
    fn drop(&mut self) {
        if let Some(path) = &self.0 {
            let _ = fs::remove_file(path);
        }
    }
}

/// Renames `from` over `to`. When `to` existed its file is exchanged to
/// `from` (true) rather than freed, so it can be reused; filesystems
/// without `RENAME_EXCHANGE` get a plain rename.
fn swap_into(from: &Path, to: &Path) -> io::Result<bool> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
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
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        // `to` absent, or no exchange here.
        Some(libc::ENOENT | libc::EINVAL | libc::ENOSYS) => fs::rename(from, to).map(|()| false),
        _ => Err(e),
    }
}

/// Whether `dir` is on tmpfs or ramfs (whose fsync does nothing).
fn in_memory_fs(dir: &Path) -> bool {
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

fn open_dir(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(path)
}

/// Creates `dir` (mode 0700) and its parents; a new directory's entry is
/// synced into its parent.
fn make_dir(dir: &Path) -> Result<(), StoreError> {
    if dir.is_dir() {
        return Ok(());
    }
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| StoreError::io("creating directory", dir, e))?;
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    open_dir(parent)
        .and_then(|d| d.sync_all())
        .map_err(|e| StoreError::io("syncing directory", parent, e))
}

/// Removes every temporary file in every table directory; the lock is held,
/// so they belong to writes that can no longer finish.
fn remove_temporaries(tables_dir: &Path) -> Result<u64, StoreError> {
    let listing = |dir: &Path| fs::read_dir(dir).map_err(|e| StoreError::io("listing", dir, e));
    let mut removed = 0;
    for table in listing(tables_dir)? {
        let table = table.map_err(|e| StoreError::io("listing", tables_dir, e))?;
        if !table.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let dir = table.path();
        let mut here = 0;
        for entry in listing(&dir)? {
            let entry = entry.map_err(|e| StoreError::io("listing", &dir, e))?;
            if entry
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(TMP_PREFIX))
            {
                match fs::remove_file(entry.path()) {
                    Ok(()) => here += 1,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(StoreError::io("removing", entry.path(), e)),
                }
            }
        }
        if here > 0 {
            open_dir(&dir)
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
