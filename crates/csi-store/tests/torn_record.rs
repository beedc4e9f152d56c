//! A crash may keep a new record file's name and size without its data (a
//! reordered crash state of `SimFs`): the file then holds only zeros, and
//! its write was never acknowledged. Found by csi-sim's crash states: such
//! a file was quarantined, and the node service reported the volume
//! abnormal after the restart.

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use csi_store::testing::{CrashKeep, FsEffect, FsHook, SimFs};
use csi_store::{CodecId, FileStore, RecordStore};

const DIR: &str = "/var/lib/driver/state";

/// Once armed, fails the first write after a rename and everything after
/// it: the process dies before the journal entry of the renamed record.
#[derive(Default)]
struct DieBeforeJournalEntry(AtomicU8);

const IDLE: u8 = 0;
const ARMED: u8 = 1;
const RENAMED: u8 = 2;
const DEAD: u8 = 3;

impl FsHook for DieBeforeJournalEntry {
    fn before(&self, effect: FsEffect, _: &Path) -> io::Result<()> {
        let state = self.0.load(Ordering::SeqCst);
        let next = match (state, effect) {
            (ARMED, FsEffect::Rename) => RENAMED,
            (RENAMED, FsEffect::Write) | (DEAD, _) => DEAD,
            (s, _) => s,
        };
        self.0.store(next, Ordering::SeqCst);
        match next {
            DEAD => Err(io::Error::from_raw_os_error(libc::EIO)),
            _ => Ok(()),
        }
    }
}

#[test]
fn a_record_file_a_crash_left_without_its_data_is_removed_not_quarantined() {
    let sim = SimFs::new();
    let hook = Arc::new(DieBeforeJournalEntry::default());
    sim.set_hook(Some(hook.clone()));
    let store = FileStore::open_on(sim.handle(), DIR).unwrap();
    store.put("t", "a", CodecId::JSON, b"acknowledged").unwrap();
    hook.0.store(ARMED, Ordering::SeqCst);
    assert!(
        store
            .put("t", "b", CodecId::JSON, b"never acknowledged")
            .is_err()
    );
    drop(store);
    hook.0.store(IDLE, Ordering::SeqCst);
    // The first reordered state: metadata kept, file data lost.
    assert!(sim.reordered_states() > 0);
    sim.crash(CrashKeep::Reordered(0));
    let torn = sim.read(&Path::new(DIR).join("tables/t/b")).unwrap();
    assert!(!torn.is_empty() && torn.iter().all(|&b| b == 0), "{torn:?}");

    let store = FileStore::open_on(sim.handle(), DIR).unwrap();
    let scan = store.scan("t").unwrap();
    let keys: Vec<&str> = scan.records.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["a"]);
    assert!(scan.quarantined.is_empty(), "{:?}", scan.quarantined);
    assert!(
        sim.read(&Path::new(DIR).join("tables/t/b")).is_none(),
        "removed"
    );
    assert_eq!(store.get("t", "a").unwrap().unwrap().bytes, b"acknowledged");
}
