//! FileStore on the simulated filesystem: what a crash keeps, and every
//! crash state of every effect of a sequence of puts and deletes.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use csi_store::testing::{CrashKeep, FsEffect, FsHook, SimFs};
use csi_store::{CodecId, FileStore, OpenMode, RecordStore, StoreError};

const DIR: &str = "/var/lib/driver/state";

#[test]
fn a_crash_keeps_synced_data_and_entries_and_may_lose_the_rest() {
    let sim = SimFs::new();
    let fs = sim.handle();
    fs.create_dir(Path::new("/d")).unwrap();
    fs.open(Path::new("/"), OpenMode::Directory)
        .unwrap()
        .sync_all()
        .unwrap();
    let synced = fs
        .open(Path::new("/d/synced"), OpenMode::CreateNew)
        .unwrap();
    synced.write_all_at(b"kept", 0).unwrap();
    synced.sync_data().unwrap();
    fs.open(Path::new("/d"), OpenMode::Directory)
        .unwrap()
        .sync_all()
        .unwrap();
    let loose = fs.open(Path::new("/d/loose"), OpenMode::CreateNew).unwrap();
    loose.write_all_at(b"maybe", 0).unwrap();
    synced.write_all_at(b"KEPT", 0).unwrap();
    // Unsynced: the create of `loose`, its data, the rewrite of `synced`.
    assert_eq!(sim.unsynced(), 3);
    assert_eq!(
        sim.crash_states(),
        vec![
            CrashKeep::Prefix(0),
            CrashKeep::Prefix(1),
            CrashKeep::Prefix(2),
            CrashKeep::All
        ]
    );
    sim.crash(CrashKeep::Prefix(1));
    assert_eq!(sim.read(Path::new("/d/synced")).unwrap(), b"kept");
    assert_eq!(
        sim.read(Path::new("/d/loose")).unwrap(),
        b"",
        "created, data lost"
    );
    // The crashed process's handles are gone.
    let e = synced.write_all_at(b"x", 0).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO));
    let e = fs.remove_file(Path::new("/d/loose")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO));
    assert_eq!(sim.unsynced(), 0);
}

#[test]
fn the_lock_is_released_by_a_crash_and_held_against_a_second_open() {
    let sim = SimFs::new();
    let store = FileStore::open_on(sim.handle(), DIR).unwrap();
    let second = FileStore::open_on(sim.handle(), DIR).unwrap_err();
    assert!(matches!(second, StoreError::Locked { .. }), "{second}");
    sim.crash(CrashKeep::All);
    let again = FileStore::open_on(sim.handle(), DIR).unwrap();
    drop(store);
    drop(again);
}

thread_local! {
    /// Effects the last `run_until` of this thread made.
    static EFFECTS: Arc<AtomicUsize> = Arc::new(AtomicUsize::new(0));
}

/// Fails every effect from the `at`th on (the process is dead), counting them.
struct CrashAt {
    at: usize,
    seen: Arc<AtomicUsize>,
}

impl FsHook for CrashAt {
    fn before(&self, _: FsEffect, _: &Path) -> io::Result<()> {
        if self.seen.fetch_add(1, Ordering::SeqCst) >= self.at {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Put(&'static str, &'static str),
    Delete(&'static str),
}

const OPS: [Op; 6] = [
    Op::Put("vol-1", "one"),
    Op::Put("vol-2", "two"),
    Op::Put("vol-1", "one, grown"),
    Op::Delete("vol-2"),
    Op::Put("vol-3", "three"),
    Op::Delete("vol-1"),
];

/// Runs OPS until the effect `at` fails; returns what was acknowledged
/// and the op in flight when the process died.
fn run_until(sim: &SimFs, at: usize) -> (BTreeMap<&'static str, &'static str>, Option<Op>) {
    let seen = EFFECTS.with(|n| {
        n.store(0, Ordering::SeqCst);
        n.clone()
    });
    sim.set_hook(Some(Arc::new(CrashAt { at, seen })));
    let mut acked = BTreeMap::new();
    let Ok(store) = FileStore::open_on(sim.handle(), DIR) else {
        return (acked, None);
    };
    for op in OPS {
        let result = match op {
            Op::Put(k, v) => store.put("volumes", k, CodecId::JSON, v.as_bytes()),
            Op::Delete(k) => store.delete("volumes", k).map(drop),
        };
        if result.is_err() {
            return (acked, Some(op));
        }
        match op {
            Op::Put(k, v) => acked.insert(k, v),
            Op::Delete(k) => acked.remove(k),
        };
    }
    (acked, None)
}

#[test]
fn every_crash_state_at_every_effect_keeps_every_acknowledged_change() {
    let sim = SimFs::new();
    let (acked, in_flight) = run_until(&sim, usize::MAX);
    assert!(in_flight.is_none());
    assert_eq!(
        acked.into_iter().collect::<Vec<_>>(),
        vec![("vol-3", "three")]
    );
    let total = EFFECTS.with(|n| n.load(Ordering::SeqCst));
    assert!(total > 20, "{total} effects");
    let mut states = 0;
    for at in 0..total {
        let probe = SimFs::new();
        run_until(&probe, at);
        for keep in probe.crash_states() {
            let sim = SimFs::new();
            let (acked, in_flight) = run_until(&sim, at);
            sim.set_hook(None);
            sim.crash(keep);
            states += 1;
            let store = FileStore::open_on(sim.handle(), DIR)
                .unwrap_or_else(|e| panic!("effect {at}, {keep:?}: reopen: {e}"));
            let found: BTreeMap<String, String> = store
                .scan("volumes")
                .unwrap()
                .records
                .into_iter()
                .map(|(k, r)| (k, String::from_utf8(r.bytes).unwrap()))
                .collect();
            // Exactly the acknowledged state, or (for the key of the op in
            // flight) that op's outcome: never a torn or older value.
            let mut after = acked.clone();
            match in_flight {
                Some(Op::Put(k, v)) => {
                    after.insert(k, v);
                }
                Some(Op::Delete(k)) => {
                    after.remove(k);
                }
                None => {}
            }
            let as_strings = |m: &BTreeMap<&str, &str>| -> BTreeMap<String, String> {
                m.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            };
            assert!(
                found == as_strings(&acked) || found == as_strings(&after),
                "effect {at}, {keep:?}: found {found:?}, acknowledged {acked:?}, in flight {in_flight:?}"
            );
        }
    }
    assert!(states > total, "{states} crash states");
}

/// Found by csi-sim: the store created missing parents of its directory
/// but synced only the last one's entry, so a power loss after an
/// acknowledged put could take the whole state directory with it.
#[test]
fn a_power_loss_keeps_a_state_directory_created_with_its_parents() {
    let sim = SimFs::new();
    let store = FileStore::open_on(sim.handle(), DIR).unwrap();
    store.put("volumes", "vol-1", CodecId::JSON, b"{}").unwrap();
    drop(store);
    sim.crash(CrashKeep::Prefix(0));
    let store = FileStore::open_on(sim.handle(), DIR).unwrap();
    assert!(store.get("volumes", "vol-1").unwrap().is_some());
}
