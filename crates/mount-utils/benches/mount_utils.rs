//! Benchmarks: mountinfo parsing of 10,000 entries (whole, and only one
//! volume's lines), and `is_mount_point`
//! latency (statx vs mountinfo scan, and the symlink-refusing
//! `Mounter::is_mount_point` and `mounted_at`) as the mount table grows to
//! 10,000.
//!
//! Run: `cargo bench -p mount-utils --bench mount_utils`. The
//! `is_mount_point` and `cpu_time` groups need root; they create their
//! mounts in a private mount namespace of the benchmark process, so nothing
//! leaks to the host. `cpu_time` measures the calling thread's CPU time
//! instead of wall time, so other load on a shared machine barely moves it.

use std::fmt::Write as _;
use std::hint::black_box;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use mount_utils::{LinuxMounter, Mounter, parse_mountinfo};

/// A kubelet-like mount table: escaped paths, optional fields, SELinux
/// contexts, overlay options.
fn synth_mountinfo(entries: usize) -> Vec<u8> {
    let mut s = String::with_capacity(entries * 200);
    for i in 0..entries {
        let id = i + 30;
        match i % 4 {
            0 => writeln!(
                s,
                "{id} 29 0:{} / /var/lib/kubelet/pods/{i:08x}-pod/volumes/kubernetes.io~empty-dir/cache rw,nosuid,nodev,relatime shared:{i} - tmpfs tmpfs rw,size=65536k,mode=755",
                i % 200
            ),
            1 => writeln!(
                s,
                "{id} 29 253:{} /vol{i} /var/lib/kubelet/plugins/kubernetes.io/csi/pv/pvc\\040{i}/globalmount rw,relatime shared:{i} master:3 - xfs /dev/mapper/vg-lv{i} rw,seclabel,context=\"system_u:object_r:container_file_t:s0:c1,c2\",attr2,inode64,noquota",
                i % 16
            ),
            2 => writeln!(
                s,
                "{id} 29 0:{} / /run/containerd/io.containerd.runtime.v2.task/k8s.io/{i:064x}/rootfs rw,relatime - overlay overlay rw,lowerdir=/var/lib/containerd/snapshots/{i}/fs:/var/lib/containerd/snapshots/1/fs,upperdir=/var/lib/containerd/snapshots/{}/fs,workdir=/var/lib/containerd/snapshots/{}/work",
                i % 200,
                i + 1,
                i + 1
            ),
            _ => writeln!(
                s,
                "{id} 29 8:1 /var/lib/kubelet/pods/{i:08x}/etc-hosts /var/lib/kubelet/pods/{i:08x}/containers/app/etc/hosts rw,relatime - ext4 /dev/sda1 rw"
            ),
        }
        .unwrap();
    }
    s.into_bytes()
}

fn bench_parse(c: &mut Criterion) {
    let text = synth_mountinfo(10_000);
    assert_eq!(parse_mountinfo(&text).unwrap().len(), 10_000);
    let mut g = c.benchmark_group("mountinfo_parse");
    g.throughput(criterion::Throughput::Elements(10_000));
    g.bench_function("10000_entries", |b| {
        b.iter(|| parse_mountinfo(black_box(&text)).unwrap())
    });
    g.finish();

    // One volume's mounts (its staging mount and a pod's bind) among them,
    // found by reading the table whole or by keeping its device's lines.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mountinfo");
    let mut table = text.clone();
    table.extend_from_slice(b"20030 29 7:3 / /staging/vol rw,relatime - ext4 /dev/loop3 rw\n");
    table.extend_from_slice(b"20031 29 7:3 / /pods/vol rw,relatime - ext4 /dev/loop3 rw\n");
    std::fs::write(&path, table).unwrap();
    let mounter = LinuxMounter::with_mountinfo_path(&path);
    let loop3 = mount_utils::DeviceNumber::new(7, 3);
    let keep = |_: u32, dev: mount_utils::DeviceNumber| dev == loop3;
    assert_eq!(mounter.mount_points_where(&keep).unwrap().len(), 2);
    let mut g = c.benchmark_group("one_volume_of_10002_mounts");
    g.bench_function("whole_table", |b| {
        b.iter(|| {
            let mut all = mounter.mount_points().unwrap();
            all.retain(|m| keep(m.mount_id, m.device()));
            all
        })
    });
    g.bench_function("device_lines_only", |b| {
        b.iter(|| mounter.mount_points_where(black_box(&keep)).unwrap())
    });
    g.finish();
}

/// Bind mounts in this process's private namespace, grown on demand.
struct MountTable {
    base: PathBuf,
    source: PathBuf,
    mounted: usize,
    _dir: tempfile::TempDir,
}

impl MountTable {
    fn new() -> Self {
        mount_utils::testing::enter_private_mount_ns();
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().to_path_buf();
        // A tmpfs holds the 10,000 directories so the host disk is untouched.
        LinuxMounter::new()
            .mount("tmpfs", &base, "tmpfs", &["size=64m"])
            .unwrap();
        let source = base.join("source");
        std::fs::create_dir(&source).unwrap();
        MountTable {
            base,
            source,
            mounted: 0,
            _dir: dir,
        }
    }

    fn target(&self, i: usize) -> PathBuf {
        self.base.join(format!("m{i}"))
    }

    fn grow_to(&mut self, n: usize) {
        let m = LinuxMounter::new();
        let start = Instant::now();
        let from = self.mounted;
        while self.mounted < n {
            let t = self.target(self.mounted);
            std::fs::create_dir(&t).unwrap();
            m.bind_mount(&self.source, &t, false).unwrap();
            self.mounted += 1;
        }
        eprintln!(
            "mount table: {} bind mounts (+{} in {:?})",
            self.mounted,
            n - from,
            start.elapsed()
        );
    }
}

impl Drop for MountTable {
    fn drop(&mut self) {
        // The namespace dies with the process anyway; be tidy regardless.
        let _ = LinuxMounter::new().unmount(&self.base, true);
    }
}

fn bench_is_mount_point(c: &mut Criterion) {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: is_mount_point benchmark: needs root (euid != 0)");
        return;
    }
    // Under `cargo test --benches` criterion runs each benchmark once; keep
    // that quick.
    let bench_mode = std::env::args().any(|a| a == "--bench");
    let sizes: &[usize] = if bench_mode {
        &[100, 1_000, 10_000]
    } else {
        &[100]
    };
    let mut table = MountTable::new();
    let m = LinuxMounter::new();
    let mut g = c.benchmark_group("is_mount_point");
    g.sample_size(20).warm_up_time(Duration::from_millis(500));
    for &n in sizes {
        table.grow_to(n);
        // The mount point checked is in the middle of the table.
        let probe = table.target(n / 2);
        let not_mounted: &Path = &table.source;
        assert_eq!(m.is_mount_point_statx(&probe).unwrap(), Some(true));
        assert!(m.is_mount_point_by_scan(&probe).unwrap());
        assert!(!m.is_mount_point(not_mounted).unwrap());
        g.bench_with_input(BenchmarkId::new("statx", n), &probe, |b, p| {
            b.iter(|| m.is_mount_point_statx(black_box(p)).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("mountinfo_scan", n), &probe, |b, p| {
            b.iter(|| m.is_mount_point_by_scan(black_box(p)).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("is_mount_point", n), &probe, |b, p| {
            b.iter(|| m.is_mount_point(black_box(p)).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("mounted_at", n), &probe, |b, p| {
            b.iter(|| m.mounted_at(black_box(p)).unwrap().unwrap())
        });
        g.bench_with_input(
            BenchmarkId::new("likely_not_mount_point", n),
            &probe,
            |b, p| b.iter(|| m.is_likely_not_mount_point(black_box(p)).unwrap()),
        );
    }
    g.finish();
}

fn thread_cpu_time() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a timespec out-parameter.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    assert_eq!(r, 0, "thread CPU clock");
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// `f` timed in thread CPU time.
fn cpu(iters: u64, mut f: impl FnMut()) -> Duration {
    let start = thread_cpu_time();
    for _ in 0..iters {
        f();
    }
    thread_cpu_time() - start
}

/// `is_likely_not_mount_point` as it was before paths were resolved
/// without symlinks (canonicalize, then two stats): the reference for what
/// the resolution costs.
fn canonicalize_likely_not_mount_point(path: &Path) -> bool {
    let c = std::fs::canonicalize(path).unwrap();
    let parent = c.parent().unwrap();
    std::fs::metadata(&c).unwrap().dev() == std::fs::metadata(parent).unwrap().dev()
}

/// `is_mount_point_by_scan` as it was before (canonicalize, then scan).
fn canonicalize_scan_reference(m: &LinuxMounter, path: &Path) -> bool {
    let c = std::fs::canonicalize(path).unwrap();
    m.mount_points().unwrap().iter().any(|e| e.mount_point == c)
}

fn bench_cpu_time(c: &mut Criterion) {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: cpu_time benchmark: needs root (euid != 0)");
        return;
    }
    let mut table = MountTable::new();
    table.grow_to(100);
    let m = LinuxMounter::new();
    let probe = table.target(50);
    let mut g = c.benchmark_group("cpu_time");
    g.sample_size(20).warm_up_time(Duration::from_millis(500));
    g.bench_function("is_mount_point_statx_raw", |b| {
        b.iter_custom(|n| {
            cpu(n, || {
                assert!(m.is_mount_point_statx(black_box(&probe)).is_ok())
            })
        })
    });
    g.bench_function("is_mount_point", |b| {
        b.iter_custom(|n| cpu(n, || assert!(m.is_mount_point(black_box(&probe)).is_ok())))
    });
    g.bench_function("likely_not_mount_point_canonicalize_reference", |b| {
        b.iter_custom(|n| {
            cpu(n, || {
                assert!(canonicalize_likely_not_mount_point(black_box(&probe)))
            })
        })
    });
    g.bench_function("likely_not_mount_point", |b| {
        b.iter_custom(|n| {
            cpu(n, || {
                assert!(m.is_likely_not_mount_point(black_box(&probe)).is_ok())
            })
        })
    });
    g.bench_function("mountinfo_scan_canonicalize_reference", |b| {
        b.iter_custom(|n| {
            cpu(n, || {
                assert!(canonicalize_scan_reference(&m, black_box(&probe)))
            })
        })
    });
    g.bench_function("mountinfo_scan", |b| {
        b.iter_custom(|n| {
            cpu(n, || {
                assert!(m.is_mount_point_by_scan(black_box(&probe)).is_ok())
            })
        })
    });
    g.bench_function("mounted_at_100_mounts", |b| {
        b.iter_custom(|n| cpu(n, || assert!(m.mounted_at(black_box(&probe)).is_ok())))
    });
    g.finish();
}

criterion_group!(benches, bench_parse, bench_is_mount_point, bench_cpu_time);
criterion_main!(benches);
