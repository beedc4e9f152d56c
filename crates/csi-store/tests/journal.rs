//! The write-ahead journal of a store on disk: concurrent writers share
//! its flushes, replay at open repairs record files lost or stale (as a
//! power loss leaves them) and ignores a torn tail, and on a full ext4
//! filesystem deletes still work (root only, on a scratch filesystem).

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};

use csi_store::{DirEntry, FileStore, FileSystem, OpenMode, Opened, RealFs, StoreError, Table};
use mount_utils::testing::{ScratchFilesystem, in_private_mount_ns};

const JOURNAL_ENTRIES: u64 = 4096;

/// A store directory on a disk (not tmpfs, where there is no journal), or
/// `None` with the reason printed.
fn disk_store(tmp: &Path, test: &str) -> Option<FileStore> {
    let store = FileStore::open(tmp.join("state")).unwrap();
    if !store.syncs_to_disk() {
        eprintln!("{test}: skipped: the temporary directory is on tmpfs (no journal there)");
        return None;
    }
    Some(store)
}

#[test]
fn concurrent_writers_share_journal_flushes() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(store) = disk_store(tmp.path(), "concurrent_writers_share_journal_flushes") else {
        return;
    };
    let table: Table<u64> = Table::new(&store, "volumes").unwrap();
    const WRITERS: usize = 8;
    const ROUNDS: u64 = 40;
    let barrier = Arc::new(Barrier::new(WRITERS));
    let before = store.stats();
    std::thread::scope(|s| {
        for w in 0..WRITERS {
            let (table, barrier) = (table.clone(), barrier.clone());
            s.spawn(move || {
                for i in 0..ROUNDS {
                    // All eight change at once: one batch per round or two.
                    barrier.wait();
                    table.put(&format!("w{w}-{i}"), &i).unwrap();
                    barrier.wait();
                    table.delete(&format!("w{w}-{i}")).unwrap();
                }
            });
        }
    });
    let s = store.stats();
    let ops = (s.puts + s.deletes) - (before.puts + before.deletes);
    let flushes = s.journal_syncs - before.journal_syncs;
    assert_eq!(ops, WRITERS as u64 * ROUNDS * 2);
    assert_eq!(s.dir_syncs, 0, "no directory syncs outside checkpoints");
    eprintln!("{ops} changes by {WRITERS} writers: {flushes} journal flushes");
    assert!(
        flushes * 2 <= ops,
        "{flushes} flushes for {ops} changes: not shared"
    );
    assert!(table.scan().unwrap().records.is_empty());
}

#[test]
fn replay_restores_lost_and_stale_record_files() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(store) = disk_store(tmp.path(), "replay_restores_lost_and_stale_record_files") else {
        return;
    };
    let t: Table<String> = Table::new(&store, "volumes").unwrap();
    for i in 0..20 {
        t.put(&format!("vol-{i}"), &format!("v{i}")).unwrap();
    }
    t.put("vol-3", &"rewritten".to_string()).unwrap();
    t.delete("vol-4").unwrap();
    drop(t);
    drop(store);
    // What a power loss may leave of writes never fsynced: a record file
    // missing, one holding an older value, one deleted that came back,
    // one torn.
    let dir = tmp.path().join("state/tables/volumes");
    fs::remove_file(dir.join("vol-1")).unwrap();
    fs::copy(dir.join("vol-2"), dir.join("vol-3")).unwrap();
    fs::copy(dir.join("vol-5"), dir.join("vol-4")).unwrap();
    let torn = fs::read(dir.join("vol-6")).unwrap();
    fs::write(dir.join("vol-6"), &torn[..torn.len() / 2]).unwrap();

    let store = FileStore::open(tmp.path().join("state")).unwrap();
    assert_eq!(store.stats().journal_replayed_at_open, 22);
    assert_twenty_but_vol_4(&store, Some("rewritten"));
    assert_eq!(store.stats().journal_files_fixed_at_open, 4);
    drop(store);
    // Replayed: a third open finds every file as the journal says.
    let store = FileStore::open(tmp.path().join("state")).unwrap();
    assert_eq!(store.stats().journal_files_fixed_at_open, 0);
}

#[test]
fn a_torn_journal_tail_is_ignored() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(store) = disk_store(tmp.path(), "a_torn_journal_tail_is_ignored") else {
        return;
    };
    let t: Table<String> = Table::new(&store, "volumes").unwrap();
    t.put("a", &"one".to_string()).unwrap();
    t.put("b", &"two".to_string()).unwrap();
    drop(t);
    drop(store);
    // Tear the last entry (b's): its final byte lost; and b's record file
    // never reached the disk either.
    let journal = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(tmp.path().join("state/journal"))
        .unwrap();
    let mut buf = vec![0u8; 64 << 10];
    journal.read_exact_at(&mut buf, JOURNAL_ENTRIES).unwrap();
    let last = buf.iter().rposition(|b| *b != 0).unwrap();
    journal
        .write_all_at(&[buf[last] ^ 0xff], JOURNAL_ENTRIES + last as u64)
        .unwrap();
    drop(journal);
    let dir = tmp.path().join("state/tables/volumes");
    fs::remove_file(dir.join("a")).unwrap();
    fs::remove_file(dir.join("b")).unwrap();

    let store = FileStore::open(tmp.path().join("state")).unwrap();
    assert_eq!(store.stats().journal_replayed_at_open, 1, "only a's entry");
    let t: Table<String> = Table::new(&store, "volumes").unwrap();
    let scan = t.scan().unwrap();
    assert!(scan.quarantined.is_empty());
    assert_eq!(scan.records, vec![("a".to_string(), "one".to_string())]);
}

fn temporaries(dir: &Path) -> usize {
    fs::read_dir(dir).map_or(0, |d| {
        d.flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp-"))
            .count()
    })
}

/// Runs `f` on a fresh 16 MiB ext4 (no reserved blocks) in a private mount
/// namespace; says so and returns if mkfs.ext4 is missing.
fn on_scratch_ext4(test: &str, ns: &str, f: impl FnOnce(&ScratchFilesystem) + Send + 'static) {
    if !mount_utils::testing::have_program(test, "mkfs.ext4") {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let work_path = work.path().to_owned();
    in_private_mount_ns(ns, move || {
        let fs = ScratchFilesystem::with_options(
            &work_path,
            "ext4",
            16 << 20,
            "ext4",
            &["-m", "0"],
            &[],
        )
        .unwrap();
        f(&fs);
    });
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn on_a_full_ext4_disk_deletes_work_and_the_journal_survives() {
    mount_utils::require_root!("on_a_full_ext4_disk_deletes_work_and_the_journal_survives");
    on_scratch_ext4(
        "on_a_full_ext4_disk_deletes_work_and_the_journal_survives",
        "journal-full",
        |fs| {
            let state = fs.path().join("state");
            let store = FileStore::open(&state).unwrap();
            assert!(store.syncs_to_disk());
            let t: Table<String> = Table::new(&store, "volumes").unwrap();
            let payload = "p".repeat(6000);
            let mut acked = Vec::new();
            let err = loop {
                match t.put(&format!("vol-{}", acked.len()), &payload) {
                    Ok(()) => acked.push(format!("vol-{}", acked.len())),
                    Err(e) => break e,
                }
                assert!(acked.len() < 10_000, "the filesystem never filled");
            };
            assert!(matches!(err, StoreError::NoSpace { .. }), "{err:?}");
            assert!(acked.len() > 100, "only {} records fit", acked.len());
            assert!(store.stats().journal_syncs > 0, "the journal was used");
            assert_eq!(temporaries(&state.join("tables/volumes")), 0);
            // Deletes on the full disk, more than the journal holds between
            // checkpoints, so checkpoints run on the full disk too.
            let half = acked.len() / 2;
            for key in &acked[..half] {
                assert!(t.delete(key).unwrap(), "delete {key} on a full disk");
            }
            drop(t);
            drop(store);
            // Reopens (replay and checkpoint need no room) with every change.
            let store = FileStore::open(&state).unwrap();
            let t: Table<String> = Table::new(&store, "volumes").unwrap();
            let scan = t.scan().unwrap();
            assert!(scan.quarantined.is_empty());
            let keys: Vec<_> = scan.records.into_iter().map(|(k, _)| k).collect();
            let mut want = acked[half..].to_vec();
            want.sort();
            assert_eq!(keys, want);
            t.put("vol-new", &payload).unwrap();
            eprintln!(
                "{} records filled 16 MiB of ext4; {half} deleted while full",
                acked.len()
            );
        },
    );
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn without_room_for_a_journal_the_store_writes_directly() {
    mount_utils::require_root!("without_room_for_a_journal_the_store_writes_directly");
    on_scratch_ext4(
        "without_room_for_a_journal_the_store_writes_directly",
        "journal-no-room",
        |fs| {
            let state = fs.path().join("state");
            fs::create_dir_all(state.join("tables/volumes")).unwrap();
            fs::create_dir_all(state.join("quarantine")).unwrap();
            let filler = fs.path().join("filler");
            let fill = || {
                use std::io::Write;
                let mut f = fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&filler)
                    .unwrap();
                for size in [64 << 10, 4096, 512, 1] {
                    let chunk = vec![1u8; size];
                    while f.write_all(&chunk).is_ok() {}
                }
                let _ = f.sync_all();
            };
            fill();
            let store = FileStore::open(&state).unwrap();
            assert!(!state.join("journal").exists());
            assert!(!state.join("journal.new").exists(), "nothing left behind");
            // The attempt freed what it had written: fill that too.
            fill();
            let t: Table<String> = Table::new(&store, "volumes").unwrap();
            assert!(t.put("vol-1", &"x".repeat(6000)).unwrap_err().is_no_space());
            fs::remove_file(&filler).unwrap();
            t.put("vol-1", &"x".to_string()).unwrap();
            assert!(t.delete("vol-1").unwrap());
            let s = store.stats();
            assert_eq!(s.journal_syncs, 0);
            assert!(s.dir_syncs >= 2, "direct writes sync the directory");
        },
    );
}

/// The host's filesystem, its opens for reading counted.
#[derive(Debug, Default)]
struct CountingReads {
    reads: AtomicUsize,
}

impl CountingReads {
    fn count(&self, mode: OpenMode) {
        if mode == OpenMode::Read {
            self.reads.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn take(&self) -> usize {
        self.reads.swap(0, Ordering::SeqCst)
    }
}

impl FileSystem for CountingReads {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn csi_store::FsFile>> {
        self.count(mode);
        RealFs.open(path, mode)
    }
    fn open_in(
        &self,
        dir: &dyn csi_store::FsFile,
        at: &Path,
        name: &OsStr,
        mode: OpenMode,
    ) -> Opened {
        self.count(mode);
        RealFs.open_in(dir, at, name, mode)
    }
    fn create_dir(&self, path: &Path) -> io::Result<()> {
        RealFs.create_dir(path)
    }
    fn is_dir(&self, path: &Path) -> bool {
        RealFs.is_dir(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        RealFs.rename(from, to)
    }
    fn exchange(&self, from: &Path, to: &Path) -> io::Result<()> {
        RealFs.exchange(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        RealFs.remove_file(path)
    }
    fn read_dir(&self, path: &Path) -> io::Result<Vec<DirEntry>> {
        RealFs.read_dir(path)
    }
    fn in_memory(&self, dir: &Path) -> bool {
        RealFs.in_memory(dir)
    }
}

#[test]
fn the_first_scan_after_a_replay_reads_no_record_file_twice() {
    let tmp = tempfile::tempdir().unwrap();
    let test = "the_first_scan_after_a_replay_reads_no_record_file_twice";
    let Some(store) = disk_store(tmp.path(), test) else {
        return;
    };
    let t: Table<String> = Table::new(&store, "volumes").unwrap();
    for i in 0..20 {
        t.put(&format!("vol-{i}"), &format!("v{i}")).unwrap();
    }
    t.delete("vol-4").unwrap();
    drop((t, store));

    let fs = Arc::new(CountingReads::default());
    let store = FileStore::open_on(fs.clone(), tmp.path().join("state")).unwrap();
    assert_eq!(store.stats().journal_replayed_at_open, 21);
    assert_eq!(
        fs.take(),
        19,
        "the replay compares each file the journal names"
    );
    assert_twenty_but_vol_4(&store, None);
    assert_eq!(fs.take(), 0, "the scan takes what the replay read");
    assert_twenty_but_vol_4(&store, None);
    assert_eq!(fs.take(), 19, "later scans read the files");
    drop(store);

    // A change after open: the scan reads the files, and sees the change.
    let store = FileStore::open_on(fs.clone(), tmp.path().join("state")).unwrap();
    fs.take();
    let t: Table<String> = Table::new(&store, "volumes").unwrap();
    t.put("vol-3", &"rewritten".to_string()).unwrap();
    fs.take();
    assert_twenty_but_vol_4(&store, Some("rewritten"));
    assert_eq!(fs.take(), 19);
}

/// The "volumes" table holds vol-0..vol-19 but vol-4, each `v{i}`, except
/// vol-3 when `vol_3` names its newer value; nothing quarantined.
fn assert_twenty_but_vol_4(store: &FileStore, vol_3: Option<&str>) {
    let t: Table<String> = Table::new(store, "volumes").unwrap();
    let scan = t.scan().unwrap();
    assert!(scan.quarantined.is_empty(), "{:?}", scan.quarantined);
    let mut want: Vec<(String, String)> = (0..20)
        .filter(|i| *i != 4)
        .map(|i| (format!("vol-{i}"), format!("v{i}")))
        .collect();
    if let Some(v) = vol_3 {
        want.iter_mut().find(|(k, _)| k == "vol-3").unwrap().1 = v.into();
    }
    want.sort();
    assert_eq!(scan.records, want);
}
