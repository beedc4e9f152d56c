//! Crash safety and the directory lock across processes.
//!
//! The binary is its own child: with `CSI_STORE_CRASH_CHILD=DIR` set it is a
//! writer (or a lock holder) on the store in DIR, printing one line per
//! acknowledged operation; the parent SIGKILLs it at random moments, reopens
//! the store and checks that every acknowledged change is there, nothing
//! else is, no record is partial and no temporary file survives the open.
//!
//! `CSI_STORE_CRASH_ROUNDS` sets the number of kills (default 100) and
//! `CSI_STORE_CRASH_SEED` replays a run (the seed is printed).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use csi_store::{FileStore, StoreError, Table};
use serde::{Deserialize, Serialize};

const TABLE: &str = "records";
const THREADS: u64 = 4;
const KEYS_PER_THREAD: u64 = 16;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Value {
    seed: u64,
    thread: u64,
    op: u64,
    pad: String,
}

#[derive(Debug, Clone)]
enum Op {
    Put(String, Value),
    Delete(String),
}

impl Op {
    fn key(&self) -> &str {
        match self {
            Op::Put(k, _) | Op::Delete(k) => k,
        }
    }

    fn apply(&self, state: &mut BTreeMap<String, Value>) {
        match self {
            Op::Put(k, v) => {
                state.insert(k.clone(), v.clone());
            }
            Op::Delete(k) => {
                state.remove(k);
            }
        }
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Operation `j` of thread `t` in the run with `seed`: the same in the
/// child that performs it and the parent that checks it. Each thread has
/// its own keys, so one thread's order is the order on disk.
fn op(seed: u64, t: u64, j: u64) -> Op {
    let r = splitmix(seed ^ splitmix(t << 40 | j));
    let key = format!("t{t}-k{}", r % KEYS_PER_THREAD);
    if (r >> 8) % 10 < 3 {
        Op::Delete(key)
    } else {
        // Up to 24 KiB, so kills land inside writes too.
        let pad = "x".repeat(((r >> 16) % 24_576) as usize);
        Op::Put(
            key,
            Value {
                seed,
                thread: t,
                op: j,
                pad,
            },
        )
    }
}

fn child(dir: &str) {
    let store = match FileStore::open(dir) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("child: {e}");
            std::process::exit(2);
        }
    };
    println!("ready");
    if std::env::var("CSI_STORE_CRASH_MODE").as_deref() == Ok("hold") {
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    let seed: u64 = std::env::var("CSI_STORE_CRASH_SEED")
        .unwrap()
        .parse()
        .unwrap();
    let table: Table<Value> = Table::new(&store, TABLE).unwrap();
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let table = table.clone();
            std::thread::spawn(move || {
                for j in 0.. {
                    match op(seed, t, j) {
                        Op::Put(k, v) => table.put(&k, &v).unwrap(),
                        Op::Delete(k) => {
                            table.delete(&k).unwrap();
                        }
                    }
                    // One write(2) per line: the parent sees whole lines.
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "ack {t} {j}").unwrap();
                    out.flush().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

fn spawn_child(dir: &Path, envs: &[(&str, String)]) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.env("CSI_STORE_CRASH_CHILD", dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn child")
}

/// Kills the child when dropped, so a failing check leaves no process.
struct Reaper(Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn temporaries(dir: &Path) -> usize {
    let table_dir = dir.join("tables").join(TABLE);
    std::fs::read_dir(table_dir).map_or(0, |entries| {
        entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp-"))
            .count()
    })
}

fn lock_across_processes(root: &Path) {
    let dir = root.join("lock");
    let mut holder = Reaper(spawn_child(
        &dir,
        &[("CSI_STORE_CRASH_MODE", "hold".into())],
    ));
    let mut line = String::new();
    BufReader::new(holder.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    let pid = holder.0.id();
    match FileStore::open(&dir) {
        Err(e @ StoreError::Locked { .. }) => {
            let want = format!(
                "state directory {} is in use by another process (pid {pid})",
                dir.display()
            );
            assert_eq!(e.to_string(), want);
        }
        other => panic!("second instance: expected Locked, got {other:?}"),
    }
    // SIGKILL: the kernel releases the lock with the process.
    drop(holder);
    FileStore::open(&dir).expect("open after the holder died");
    println!(
        "lock_across_processes: a live holder refuses a second instance (pid {pid}); its death frees the directory"
    );
}

fn crash_safety(root: &Path) {
    let dir = root.join("crash");
    let rounds: u64 = std::env::var("CSI_STORE_CRASH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let master = std::env::var("CSI_STORE_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    println!("crash_safety: seed {master} (replay with CSI_STORE_CRASH_SEED={master})");
    let started = Instant::now();
    let mut state: BTreeMap<String, Value> = BTreeMap::new();
    let (mut acks, mut maybe_applied, mut temps_cleaned, mut planted) =
        (0u64, 0u64, 0usize, 0usize);
    for round in 0..rounds {
        let seed = splitmix(master ^ round);
        let mut child = Reaper(spawn_child(
            &dir,
            &[("CSI_STORE_CRASH_SEED", seed.to_string())],
        ));
        let out = child.0.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            BufReader::new(out)
                .lines()
                .map_while(Result::ok)
                .collect::<Vec<_>>()
        });
        // Anywhere from during open to well into the writes.
        std::thread::sleep(Duration::from_micros(splitmix(seed) % 60_000));
        drop(child); // SIGKILL and reap
        let lines = reader.join().unwrap();

        let mut done = [0u64; THREADS as usize];
        for line in &lines {
            let mut w = line.split_whitespace();
            if w.next() != Some("ack") {
                continue;
            }
            let t: usize = w.next().unwrap().parse().unwrap();
            let j: u64 = w.next().unwrap().parse().unwrap();
            assert_eq!(j, done[t], "acks of one thread come in order");
            done[t] += 1;
        }
        acks += done.iter().sum::<u64>();

        if round % 10 == 9 {
            // A leftover that certainly exists, besides the ones kills leave.
            let table_dir = dir.join("tables").join(TABLE);
            std::fs::create_dir_all(&table_dir).unwrap();
            std::fs::write(table_dir.join(".tmp-4000000-1"), b"CSIR half a rec").unwrap();
            planted += 1;
        }
        let leftovers = temporaries(&dir);
        temps_cleaned += leftovers;

        let store = FileStore::open(&dir).expect("reopen after SIGKILL");
        assert_eq!(
            temporaries(&dir),
            0,
            "round {round}: temporary files survived open"
        );
        assert_eq!(store.stats().temps_removed_at_open, leftovers as u64);
        let table: Table<Value> = Table::new(&store, TABLE).unwrap();
        let scan = table.scan().unwrap();
        assert!(
            scan.quarantined.is_empty(),
            "round {round}: partial or bad records: {:?}",
            scan.quarantined
        );
        let actual: BTreeMap<String, Value> = scan.records.into_iter().collect();

        // What every acknowledged operation implies, and the one operation
        // per thread that may have landed without its ack.
        let mut must = state.clone();
        let mut pending = Vec::new();
        for t in 0..THREADS {
            for j in 0..done[t as usize] {
                op(seed, t, j).apply(&mut must);
            }
            pending.push(op(seed, t, done[t as usize]));
        }
        let keys: std::collections::BTreeSet<&String> = must.keys().chain(actual.keys()).collect();
        for key in keys {
            let (want, got) = (must.get(key), actual.get(key));
            if want == got {
                continue;
            }
            let p = pending.iter().find(|p| p.key() == key).unwrap_or_else(|| {
                panic!("round {round}: {key}: acknowledged {want:?}, found {got:?}")
            });
            let mut alt = must.clone();
            p.apply(&mut alt);
            assert_eq!(
                alt.get(key),
                got,
                "round {round}: {key} is neither the acknowledged value nor the one in flight"
            );
            maybe_applied += 1;
        }
        state = actual;
    }
    assert!(acks > 0, "the children never got to write");
    assert!(temps_cleaned >= planted);
    println!(
        "crash_safety: {rounds} SIGKILLs in {:.1} s: {acks} acknowledged operations all present, \
         {maybe_applied} unacknowledged ones found applied, {temps_cleaned} temporary files removed \
         by open ({planted} planted), 0 partial records",
        started.elapsed().as_secs_f64()
    );
}

fn main() {
    if let Ok(dir) = std::env::var("CSI_STORE_CRASH_CHILD") {
        child(&dir);
        return;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        println!("lock_across_processes: test\ncrash_safety: test");
        return;
    }
    // Neither test is ignored, so a run of the ignored tests runs neither.
    if args.iter().any(|a| a == "--ignored") {
        println!("test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 2 filtered out");
        return;
    }
    let root = tempfile::Builder::new()
        .prefix("csi-store-crash-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    lock_across_processes(root.path());
    crash_safety(root.path());
    println!("test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out");
}
