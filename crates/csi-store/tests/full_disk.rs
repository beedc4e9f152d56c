//! A full filesystem, for real: a tiny tmpfs mounted in a private mount
//! namespace (root only; skipped with the reason otherwise). Writes fail
//! with `NoSpace` and leave nothing behind; deletes still work and free
//! room; the store opens and scans on a full disk.

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use csi_store::{CachedTable, FileStore, StoreError, Table};
use mount_utils::testing::in_private_mount_ns;

/// A tmpfs on a fresh directory, unmounted (then removed) when dropped; the
/// private namespace takes it away even if that fails.
struct Tmpfs {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(options: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_owned();
        let target = CString::new(path.as_os_str().as_bytes()).unwrap();
        let opts = CString::new(options).unwrap();
        // SAFETY: valid NUL-terminated strings that outlive the call.
        let rc = unsafe {
            libc::mount(
                c"tmpfs".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                opts.as_ptr().cast(),
            )
        };
        assert_eq!(rc, 0, "mount tmpfs: {}", std::io::Error::last_os_error());
        Tmpfs { path, _dir: dir }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let target = CString::new(self.path.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid path string.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

fn temporaries(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp-"))
        .collect()
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn full_disk_fails_puts_cleanly_and_deletes_still_work() {
    mount_utils::require_root!("full_disk_fails_puts_cleanly_and_deletes_still_work");
    in_private_mount_ns("full-disk", || {
        let fs = Tmpfs::mount("size=256k,mode=0700");
        let state = fs.path.join("state");
        let store = FileStore::open(&state).unwrap();
        let vols: Table<String> = Table::new(&store, "volumes").unwrap();
        let table_dir = state.join("tables/volumes");
        let payload = "p".repeat(6000);

        let mut acked = Vec::new();
        let err = loop {
            let key = format!("vol-{}", acked.len());
            match vols.put(&key, &payload) {
                Ok(()) => acked.push(key),
                Err(e) => break e,
            }
            assert!(acked.len() < 1000, "the tmpfs never filled");
        };
        assert!(acked.len() > 10, "only {} records fit", acked.len());
        eprintln!("{} records of 6 KB filled the 256 KiB tmpfs", acked.len());
        match &err {
            StoreError::NoSpace { table, key, .. } => {
                assert_eq!(table, "volumes");
                assert_eq!(key, &format!("vol-{}", acked.len()));
            }
            other => panic!("expected NoSpace, got {other:?}"),
        }
        assert!(err.to_string().starts_with("no space left in"), "{err}");
        assert!(
            temporaries(&table_dir).is_empty(),
            "a failed put left a temporary file"
        );
        // Again, to be sure the failure is stable and still clean.
        assert!(vols.put("vol-x", &payload).unwrap_err().is_no_space());
        assert!(temporaries(&table_dir).is_empty());

        // Everything acknowledged is intact.
        let scan = vols.scan().unwrap();
        assert!(scan.quarantined.is_empty());
        assert_eq!(scan.records.len(), acked.len());

        // The store opens and reads on the full disk (a restarted driver).
        drop(vols);
        drop(store);
        let store = FileStore::open(&state).expect("open on a full disk");
        let vols: Table<String> = Table::new(&store, "volumes").unwrap();
        let (cached, q) = CachedTable::load(vols.clone()).unwrap();
        assert!(q.is_empty());
        assert_eq!(cached.len(), acked.len());
        let err = cached.put("vol-y", payload.clone()).unwrap_err();
        assert!(err.is_no_space());
        assert!(!cached.contains_key("vol-y"), "memory did not run ahead");

        // Deletes work while full, and free room for new records.
        for key in &acked[..3] {
            assert!(cached.delete(key).unwrap(), "delete {key} on a full disk");
        }
        cached.put("vol-new", payload.clone()).unwrap();
        assert_eq!(
            vols.get("vol-new").unwrap().as_deref(),
            Some(payload.as_str())
        );
        // Deleted records' files are kept as spares while the store is
        // open (reused by later puts); closing it removes them.
        drop((cached, vols, store));
        assert!(temporaries(&table_dir).is_empty(), "spares left behind");
    });
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn running_out_of_inodes_is_no_space_too() {
    mount_utils::require_root!("running_out_of_inodes_is_no_space_too");
    in_private_mount_ns("no-inodes", || {
        let fs = Tmpfs::mount("size=16m,nr_inodes=24,mode=0700");
        let state = fs.path.join("state");
        let store = FileStore::open(&state).unwrap();
        let t: Table<u32> = Table::new(&store, "volumes").unwrap();
        let mut n = 0;
        let err = loop {
            match t.put(&format!("vol-{n}"), &n) {
                Ok(()) => n += 1,
                Err(e) => break e,
            }
            assert!(n < 100, "inodes never ran out");
        };
        assert!(err.is_no_space(), "{err:?}");
        assert!(temporaries(&state.join("tables/volumes")).is_empty());
        assert!(t.delete("vol-0").unwrap());
        t.put("vol-again", &1).unwrap();
        assert_eq!(t.scan().unwrap().records.len(), n as usize);
    });
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn a_table_cannot_be_created_on_a_full_disk_but_reads_of_it_work() {
    mount_utils::require_root!("a_table_cannot_be_created_on_a_full_disk_but_reads_of_it_work");
    in_private_mount_ns("full-new-table", || {
        let fs = Tmpfs::mount("size=16m,nr_inodes=24,mode=0700");
        let state = fs.path.join("state");
        let store = FileStore::open(&state).unwrap();
        let a: Table<u32> = Table::new(&store, "a").unwrap();
        let mut n = 0;
        while a.put(&format!("k{n}"), &n).is_ok() {
            n += 1;
            assert!(n < 100, "inodes never ran out");
        }
        let b: Table<u32> = Table::new(&store, "b").unwrap();
        match b.put("k", &1) {
            Err(StoreError::NoSpace { table, key, .. }) => {
                assert_eq!((table.as_str(), key.as_str()), ("b", "k"))
            }
            other => panic!("expected NoSpace, got {other:?}"),
        }
        assert!(!state.join("tables/b").exists());
        assert_eq!(b.get("k").unwrap(), None);
        assert!(!b.delete("k").unwrap());
        assert!(b.scan().unwrap().records.is_empty());
        eprintln!("{n} records filled the inodes; creating table b failed with NoSpace");
    });
}
