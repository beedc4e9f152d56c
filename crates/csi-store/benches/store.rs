//! Figures for docs/benchmarks.md (prints markdown tables).
//!
//! 1. put + delete of a fresh key (what CreateVolume + DeleteVolume cost the
//!    store) with 10, 2,000 and 20,000 records present, on a tmpfs and on
//!    the work disk; the three sizes are measured in alternating batches so
//!    drift of the shared machine hits them alike. For contrast, the same
//!    change through `persist::JsonStateFile` (the whole state
//!    rewritten per change, as the example drivers do today).
//! 2. Throughput of 1–8 concurrent writers, with the store's shared
//!    journal flushes and, for contrast, with one file per record written
//!    by `persist::write_atomic` (a directory fsync per write).
//!
//! ```sh
//! cargo bench -p csi-store --bench store
//! ```
//! Environment: `CSI_STORE_BENCH_TMPFS` (default /dev/shm),
//! `CSI_STORE_BENCH_DISK` (default the target directory),
//! `CSI_STORE_BENCH_QUICK=1` for a short run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[path = "support/persist.rs"]
mod persist;

use csi_store::{FileStore, Table};
use persist::{JsonStateFile, write_atomic};
use serde::{Deserialize, Serialize};

/// About the size of a driver's volume record.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    name: String,
    capacity_bytes: i64,
    parameters: BTreeMap<String, String>,
    request: Vec<u8>,
}

fn record(i: u64) -> Record {
    Record {
        name: format!("pvc-{i:032x}"),
        capacity_bytes: 1 << 30,
        parameters: BTreeMap::from([
            ("type".into(), "fast".into()),
            ("csi.storage.k8s.io/pvc/namespace".into(), "default".into()),
        ]),
        request: vec![7; 256],
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

/// Fills a table with `n` records using 8 writers (group commit makes this
/// quick even on a disk).
fn populate(table: &Table<Record>, n: u64) {
    let next = Arc::new(AtomicU64::new(0));
    std::thread::scope(|s| {
        for _ in 0..8 {
            let (table, next) = (table.clone(), next.clone());
            s.spawn(move || {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    table.put(&format!("vol-{i:032x}"), &record(i)).unwrap();
                }
            });
        }
    });
}

struct Sizes {
    label: &'static str,
    root: PathBuf,
}

/// Returns how long a startup scan of each size took (best of 3).
fn put_delete(fs: &Sizes, rounds: usize, batch: usize) -> Vec<(u64, Duration)> {
    let sizes = [10u64, 2_000, 20_000];
    let dirs: Vec<_> = sizes
        .iter()
        .map(|n| {
            tempfile::Builder::new()
                .prefix(&format!("csi-store-bench-{n}-"))
                .tempdir_in(&fs.root)
                .unwrap()
        })
        .collect();
    let started = Instant::now();
    let tables: Vec<(FileStore, Table<Record>)> = sizes
        .iter()
        .zip(&dirs)
        .map(|(&n, dir)| {
            let store = FileStore::open(dir.path()).unwrap();
            let table = Table::new(&store, "volumes").unwrap();
            populate(&table, n);
            (store, table)
        })
        .collect();
    eprintln!(
        "{}: populated in {:.1} s",
        fs.label,
        started.elapsed().as_secs_f64()
    );

    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); sizes.len()];
    let value = record(u64::MAX);
    let mut seq = 0u64;
    for round in 0..=rounds {
        for (i, (_, table)) in tables.iter().enumerate() {
            for _ in 0..batch {
                seq += 1;
                let key = format!("vol-new-{seq:x}");
                let t = Instant::now();
                table.put(&key, &value).unwrap();
                table.delete(&key).unwrap();
                if round > 0 {
                    // round 0 warms up
                    samples[i].push(t.elapsed());
                }
            }
        }
    }
    let base = {
        let mut s = samples[0].clone();
        s.sort();
        percentile(&s, 0.5)
    };
    for (n, mut s) in sizes.iter().zip(samples) {
        s.sort();
        let median = percentile(&s, 0.5);
        println!(
            "| csi-store put + delete, {} | {n} | {} | {} | {} | {:.2} |",
            fs.label,
            ms(median),
            ms(percentile(&s, 0.9)),
            s.len(),
            median.as_secs_f64() / base.as_secs_f64()
        );
    }
    sizes
        .iter()
        .zip(&tables)
        .map(|(&n, (_, table))| {
            let best = (0..3)
                .map(|_| {
                    let t = Instant::now();
                    let scan = table.scan().unwrap();
                    assert_eq!(scan.records.len() as u64, n);
                    t.elapsed()
                })
                .min()
                .unwrap();
            (n, best)
        })
        .collect()
}

/// The example drivers' way today: one JSON state file rewritten per change.
fn whole_file(fs: &Sizes, samples_per_size: usize) {
    let sizes = [10u64, 2_000, 20_000];
    let mut base = None;
    for n in sizes {
        let dir = tempfile::tempdir_in(&fs.root).unwrap();
        let file = JsonStateFile::<BTreeMap<String, Record>>::new(dir.path().join("state.json"));
        let mut state: BTreeMap<String, Record> = (0..n)
            .map(|i| (format!("vol-{i:032x}"), record(i)))
            .collect();
        file.save(&state).unwrap();
        let mut s = Vec::new();
        for i in 0..=samples_per_size {
            let key = format!("vol-new-{i:x}");
            let t = Instant::now();
            state.insert(key.clone(), record(u64::MAX));
            file.save(&state).unwrap();
            state.remove(&key);
            file.save(&state).unwrap();
            if i > 0 {
                s.push(t.elapsed());
            }
        }
        s.sort();
        let median = percentile(&s, 0.5);
        let base = *base.get_or_insert(median);
        println!(
            "| whole JSON state file rewritten (today's drivers), {} | {n} | {} | {} | {} | {:.2} |",
            fs.label,
            ms(median),
            ms(percentile(&s, 0.9)),
            s.len(),
            median.as_secs_f64() / base.as_secs_f64()
        );
    }
}

/// Puts of fresh keys by `writers` threads for `secs`, through the store
/// (`shared`) or `write_atomic`: puts done, latencies, flushes (journal
/// and directory syncs) per put.
fn run_writers(fs: &Sizes, writers: usize, shared: bool, secs: f64) -> (u64, Vec<Duration>, f64) {
    let dir = tempfile::tempdir_in(&fs.root).unwrap();
    let store = FileStore::open(dir.path().join("store")).unwrap();
    let table: Table<Record> = Table::new(&store, "volumes").unwrap();
    let plain_dir = dir.path().join("plain");
    std::fs::create_dir(&plain_dir).unwrap();
    let stop = AtomicBool::new(false);
    let latencies = std::thread::scope(|s| {
        let handles: Vec<_> = (0..writers)
            .map(|w| {
                let (table, stop, plain_dir) = (table.clone(), &stop, &plain_dir);
                s.spawn(move || {
                    let mut lat = Vec::new();
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let key = format!("vol-{w}-{i:x}");
                        let t = Instant::now();
                        if shared {
                            table.put(&key, &record(i)).unwrap();
                        } else {
                            // Encoded per write, as the store does.
                            let bytes = serde_json::to_vec(&record(i)).unwrap();
                            write_atomic(&plain_dir.join(&key), &bytes).unwrap();
                        }
                        lat.push(t.elapsed());
                        i += 1;
                    }
                    lat
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    let stats = store.stats();
    let per_put = if shared {
        (stats.journal_syncs + stats.dir_syncs) as f64 / stats.puts.max(1) as f64
    } else {
        1.0
    };
    (latencies.len() as u64, latencies, per_put)
}

/// Throughput of 1–8 writers, the store and the baseline alternating in
/// short runs so the shared machine's drift hits both alike; medians.
fn throughput(fs: &Sizes, secs: f64, reps: usize) {
    for writers in [1usize, 2, 4, 8] {
        let mut runs: [(Vec<f64>, Vec<Duration>, Vec<f64>); 2] = Default::default();
        for _ in 0..reps {
            for (slot, shared) in [(0, true), (1, false)] {
                let (n, lat, syncs) = run_writers(fs, writers, shared, secs);
                runs[slot].0.push(n as f64 / secs);
                runs[slot].1.extend(lat);
                runs[slot].2.push(syncs);
            }
        }
        for (slot, (mut rates, mut lat, syncs)) in runs.into_iter().enumerate() {
            rates.sort_by(f64::total_cmp);
            lat.sort();
            let syncs = syncs.iter().sum::<f64>() / syncs.len() as f64;
            println!(
                "| {} | {} | {writers} | {:.0} puts/s ({:.0}–{:.0}) | {} | {} | {:.2} |",
                fs.label,
                if slot == 0 {
                    "csi-store (shared journal flushes)"
                } else {
                    "a dir fsync per write (`persist::write_atomic`)"
                },
                rates[rates.len() / 2],
                rates[0],
                rates[rates.len() - 1],
                ms(percentile(&lat, 0.5)),
                ms(percentile(&lat, 0.99)),
                syncs,
            );
        }
    }
}

fn main() {
    let quick = std::env::var("CSI_STORE_BENCH_QUICK").is_ok();
    let tmpfs = Sizes {
        label: "tmpfs",
        root: std::env::var_os("CSI_STORE_BENCH_TMPFS")
            .map_or_else(|| PathBuf::from("/dev/shm"), PathBuf::from),
    };
    let disk = Sizes {
        label: "disk",
        root: std::env::var_os("CSI_STORE_BENCH_DISK")
            .map_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")), PathBuf::from),
    };
    for fs in [&tmpfs, &disk] {
        assert!(
            Path::new(&fs.root).is_dir(),
            "{} does not exist",
            fs.root.display()
        );
    }
    let (rounds, batch) = if quick { (4, 25) } else { (20, 50) };

    println!("### put + delete of a fresh key, by records present\n");
    println!("| what | records present | median | p90 | samples | median / median at 10 |");
    println!("|---|---:|---:|---:|---:|---:|");
    let scans = [
        (tmpfs.label, put_delete(&tmpfs, rounds, batch)),
        // Finer alternation on the disk, whose fsync latency swings with load.
        (disk.label, put_delete(&disk, rounds * 5, batch / 10)),
    ];
    whole_file(&tmpfs, if quick { 10 } else { 40 });

    println!("\n### startup scan (read and decode every record; page cache warm)\n");
    println!("| filesystem | records | time | per record |");
    println!("|---|---:|---:|---:|");
    for (label, rows) in scans {
        for (n, d) in rows {
            println!(
                "| {label} | {n} | {} | {:.1} µs |",
                ms(d),
                d.as_secs_f64() * 1e6 / n as f64
            );
        }
    }

    println!("\n### concurrent writers, puts of fresh keys\n");
    println!(
        "| filesystem | writes | writers | throughput, median (range) | p50 | p99 | flushes per put |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|");
    let (secs, reps) = if quick { (0.5, 3) } else { (1.0, 7) };
    throughput(&disk, secs, reps);
    throughput(&tmpfs, secs, reps);
}
