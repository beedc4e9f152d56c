//! What only the file implementation has: files on disk, their names,
//! modes, damage to them, the lock and cleanup on open.

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use csi_store::{FileStore, RecordStore, StoreError, Table};

fn table_dir(store: &FileStore, table: &str) -> PathBuf {
    store.dir().join("tables").join(table)
}

/// Every path under `root`, relative.
fn tree(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            out.push(p.strip_prefix(root).unwrap().to_string_lossy().into_owned());
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn layout_modes_and_readable_names() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FileStore::open(tmp.path().join("state")).unwrap();
    let vols: Table<u64> = Table::new(&store, "volumes").unwrap();
    vols.put("vol-1", &1).unwrap();
    vols.put("../../escape", &2).unwrap();
    vols.put(&"k".repeat(300), &3).unwrap();

    let files = tree(&tmp.path().join("state"));
    assert!(files.contains(&"LOCK".to_string()), "{files:?}");
    assert!(
        files.contains(&"tables/volumes/vol-1".to_string()),
        "{files:?}"
    );
    assert!(files.contains(&"quarantine".to_string()), "{files:?}");
    // Nothing outside the table directory, whatever the keys said.
    for f in &files {
        assert!(
            f == "LOCK"
                || f == "journal"
                || f == "tables"
                || f == "quarantine"
                || f.starts_with("tables/volumes"),
            "unexpected path {f}"
        );
    }
    let names: Vec<_> = files
        .iter()
        .filter_map(|f| f.strip_prefix("tables/volumes/"))
        .collect();
    assert_eq!(names.len(), 3);
    assert!(names.iter().any(|n| n.starts_with('~')), "{names:?}");
    assert!(
        names.iter().any(|n| n.starts_with('#') && n.len() == 65),
        "{names:?}"
    );

    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&tmp.path().join("state")), 0o700);
    assert_eq!(mode(&table_dir(&store, "volumes")), 0o700);
    assert_eq!(mode(&table_dir(&store, "volumes").join("vol-1")), 0o600);
}

#[test]
fn damaged_and_foreign_files_are_quarantined_and_the_rest_loads() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FileStore::open(tmp.path()).unwrap();
    let vols: Table<String> = Table::new(&store, "volumes").unwrap();
    for i in 0..5 {
        vols.put(&format!("vol-{i}"), &format!("volume {i}"))
            .unwrap();
    }
    let dir = table_dir(&store, "volumes");
    // Truncated, garbage, bit-flipped, a record copied under another key's
    // name, a stray file, a directory and a symlink.
    let good = fs::read(dir.join("vol-0")).unwrap();
    fs::write(dir.join("vol-1"), &good[..good.len() - 3]).unwrap();
    fs::write(dir.join("vol-2"), b"not a record at all").unwrap();
    let mut flipped = fs::read(dir.join("vol-3")).unwrap();
    *flipped.last_mut().unwrap() ^= 0x20;
    fs::write(dir.join("vol-3"), flipped).unwrap();
    fs::write(dir.join("vol-9"), &good).unwrap();
    fs::write(dir.join("notes .txt"), b"hello").unwrap();
    fs::create_dir(dir.join("subdir")).unwrap();
    symlink("/etc/passwd", dir.join("vol-8")).unwrap();

    let scan = vols.scan().unwrap();
    let keys: Vec<_> = scan.records.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["vol-0", "vol-4"]);
    let mut reasons: Vec<(Option<String>, String)> = scan
        .quarantined
        .iter()
        .map(|q| (q.key.clone(), q.reason.clone()))
        .collect();
    reasons.sort();
    let want: Vec<(Option<&str>, &str)> = vec![
        (None, "file name is not a record name"),
        (Some("subdir"), "not a regular file"),
        (Some("vol-1"), "length 28 does not match the header's 31"),
        (Some("vol-2"), "not a record file (bad magic)"),
        (Some("vol-3"), "checksum mismatch"),
        (Some("vol-8"), "a symbolic link"),
        (
            Some("vol-9"),
            "the record's key does not match its file name",
        ),
    ];
    let got: Vec<(Option<&str>, &str)> = reasons
        .iter()
        .map(|(k, r)| (k.as_deref(), r.as_str()))
        .collect();
    assert_eq!(got, want);
    for q in &scan.quarantined {
        let moved = q.moved_to.as_ref().expect("moved aside");
        assert!(
            moved.starts_with(store.quarantine_dir().join("volumes")),
            "{moved:?}"
        );
        assert!(fs::symlink_metadata(moved).is_ok(), "{moved:?} exists");
    }
    assert_eq!(store.stats().quarantined, 7);
    // The symlink's target was neither read nor touched.
    assert!(Path::new("/etc/passwd").exists());
    // Only the good records are left in the table; a rescan is clean.
    assert_eq!(tree(&dir), ["vol-0", "vol-4"]);
    assert!(vols.scan().unwrap().quarantined.is_empty());
    assert_eq!(
        vols.quarantined_keys().unwrap(),
        ["subdir", "vol-1", "vol-2", "vol-3", "vol-8", "vol-9"]
    );
}

#[test]
fn get_of_a_truncated_record_quarantines_it() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FileStore::open(tmp.path()).unwrap();
    let vols: Table<String> = Table::new(&store, "volumes").unwrap();
    vols.put("vol-1", &"x".repeat(100)).unwrap();
    let path = table_dir(&store, "volumes").join("vol-1");
    let bytes = fs::read(&path).unwrap();
    fs::write(&path, &bytes[..20]).unwrap();
    match vols.get("vol-1") {
        Err(StoreError::Corrupt {
            key,
            reason,
            moved_to: Some(moved),
            ..
        }) => {
            assert_eq!(key, "vol-1");
            assert!(reason.contains("does not match"), "{reason}");
            assert_eq!(fs::read(moved).unwrap(), &bytes[..20]);
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert_eq!(vols.get("vol-1").unwrap(), None);
}

#[test]
fn a_hashed_name_is_quarantined_under_the_key_its_file_holds() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FileStore::open(tmp.path()).unwrap();
    let t: Table<u8> = Table::new(&store, "long").unwrap();
    let long = "/very/long/target/".repeat(20);
    store
        .put("long", &long, csi_store::CodecId::PROST, b"1")
        .unwrap();
    let scan = t.scan().unwrap();
    assert_eq!(scan.quarantined.len(), 1);
    assert_eq!(scan.quarantined[0].key.as_deref(), Some(long.as_str()));
    assert_eq!(t.quarantined_keys().unwrap(), [long]);
}

#[test]
fn open_removes_temporaries_and_keeps_records() {
    let tmp = tempfile::tempdir().unwrap();
    {
        let store = FileStore::open(tmp.path()).unwrap();
        let t: Table<u8> = Table::new(&store, "volumes").unwrap();
        t.put("vol-1", &1).unwrap();
    }
    let dir = tmp.path().join("tables/volumes");
    fs::write(dir.join(".tmp-123-0"), b"CSIR torn").unwrap();
    fs::write(dir.join(".tmp-123-1"), b"").unwrap();
    let store = FileStore::open(tmp.path()).unwrap();
    assert_eq!(store.stats().temps_removed_at_open, 2);
    assert_eq!(tree(&dir), ["vol-1"]);
    let t: Table<u8> = Table::new(&store, "volumes").unwrap();
    assert_eq!(t.get("vol-1").unwrap(), Some(1));
}

#[test]
fn the_lock_lasts_while_any_clone_lives() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FileStore::open(tmp.path()).unwrap();
    let clone = store.clone();
    drop(store);
    let err = FileStore::open(tmp.path()).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "state directory {} is in use by another process (pid {})",
            tmp.path().display(),
            std::process::id()
        )
    );
    drop(clone);
    // A child that another test of this binary forks (`stat` in
    // `on_tmpfs`) holds a copy of every descriptor, the lock's included,
    // until it execs: the lock is free once that moment has passed.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match FileStore::open(tmp.path()) {
            Err(StoreError::Locked { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            reopened => break drop(reopened.unwrap()),
        }
    }
}

#[test]
fn stats_count_puts_deletes_and_directory_syncs() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FileStore::open(tmp.path()).unwrap();
    let t: Table<u8> = Table::new(&store, "volumes").unwrap();
    t.put("a", &1).unwrap();
    t.put("b", &1).unwrap();
    t.delete("a").unwrap();
    t.delete("zz").unwrap();
    let s = store.stats();
    assert_eq!((s.puts, s.deletes), (2, 2));
    // One writer: nothing to share, one journal flush per change and no
    // directory sync (none at all where fsync is a no-op).
    let expected = if store.syncs_to_disk() { 4 } else { 0 };
    assert_eq!(s.journal_syncs, expected);
    assert_eq!(s.dir_syncs, 0);
}

#[test]
fn syncs_are_skipped_only_where_they_do_nothing() {
    let disk = tempfile::tempdir().unwrap();
    assert!(FileStore::open(disk.path()).unwrap().syncs_to_disk() || on_tmpfs(disk.path()));
    if Path::new("/dev/shm").is_dir() && on_tmpfs(Path::new("/dev/shm")) {
        let shm = tempfile::tempdir_in("/dev/shm").unwrap();
        let store = FileStore::open(shm.path()).unwrap();
        assert!(!store.syncs_to_disk());
        let t: Table<u8> = Table::new(&store, "volumes").unwrap();
        t.put("a", &1).unwrap();
        assert_eq!(store.stats().dir_syncs, 0);
    }
}

fn on_tmpfs(path: &Path) -> bool {
    let out = std::process::Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim() == "tmpfs"
}

#[test]
fn reads_of_a_missing_table_create_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FileStore::open(tmp.path()).unwrap();
    let t: Table<u8> = Table::new(&store, "never").unwrap();
    assert_eq!(t.get("k").unwrap(), None);
    assert!(!t.delete("k").unwrap());
    assert!(t.scan().unwrap().records.is_empty());
    assert!(t.quarantined_keys().unwrap().is_empty());
    assert!(!tmp.path().join("tables/never").exists());
}

/// Inode numbers of the files in `dir` (records and spares).
fn inodes(dir: &Path) -> std::collections::BTreeSet<u64> {
    use std::os::unix::fs::MetadataExt;
    fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.metadata().unwrap().ino())
        .collect()
}

#[test]
fn churn_reuses_files_and_closing_leaves_only_records() {
    let tmp = tempfile::tempdir().unwrap();
    let store = FileStore::open(tmp.path().join("state")).unwrap();
    let vols: Table<String> = Table::new(&store, "volumes").unwrap();
    let dir = table_dir(&store, "volumes");

    // Warm up: one record written, replaced and deleted leaves spares.
    vols.put("warm", &"a".into()).unwrap();
    vols.put("warm", &"b".into()).unwrap();
    assert!(vols.delete("warm").unwrap());
    let seen = inodes(&dir);

    // Creates, replacements and deletes now reuse those files: no new inode.
    for round in 0..20 {
        let key = format!("vol-{round}");
        vols.put(&key, &"x".repeat(round)).unwrap();
        vols.put(&key, &"y".repeat(100 - round)).unwrap();
        assert_eq!(vols.get(&key).unwrap(), Some("y".repeat(100 - round)));
        assert!(vols.delete(&key).unwrap());
        assert!(!vols.delete(&key).unwrap());
        assert!(
            inodes(&dir).is_subset(&seen),
            "round {round} created a file"
        );
    }
    vols.put("kept", &"z".into()).unwrap();
    // Spares are never records.
    let scan = vols.scan().unwrap();
    assert_eq!(scan.records, vec![("kept".to_string(), "z".to_string())]);
    assert!(scan.quarantined.is_empty());

    // Closing removes the spares; the record stays.
    drop((vols, store));
    let left: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["kept"]);
    let store = FileStore::open(tmp.path().join("state")).unwrap();
    assert_eq!(store.stats().temps_removed_at_open, 0);
}
