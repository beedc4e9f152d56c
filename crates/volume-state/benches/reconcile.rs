//! (a) A plan pass over 10,000 desired volumes that are already in place.
//! (b) Converging 10,000 volumes from empty with an instant fake plugin,
//!     measured as process CPU time on a single-threaded runtime.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use volume_state::node::{ActualNodeState, AttachMode, DesiredNodeState, NodeReconciler};
use volume_state::{FakeVolumePlugin, VolumeSpec};

const VOLUMES: u32 = 10_000;

type Node = NodeReconciler<String, String, String>;
type Setup = (
    Arc<DesiredNodeState<String, String>>,
    Arc<ActualNodeState<String, String>>,
    Node,
);

fn setup() -> Setup {
    let desired = Arc::new(DesiredNodeState::new());
    let actual = Arc::new(ActualNodeState::new());
    let plugin = Arc::new(FakeVolumePlugin::<String, String>::new());
    plugin.set_recording(false);
    let reconciler = NodeReconciler::new(
        "node".to_string(),
        AttachMode::ByNode,
        desired.clone(),
        actual.clone(),
        plugin,
    );
    for i in 0..VOLUMES {
        let volume = format!("pvc-{i:08}");
        let spec = VolumeSpec {
            attachable: true,
            staging_path: Some(format!("/var/lib/kubelet/plugins/staging/{volume}").into()),
            ..VolumeSpec::default()
        };
        let pod = format!("pod-{i:08}");
        let target = format!("/var/lib/kubelet/pods/{pod}/volumes/{volume}").into();
        desired.add_pod(volume, spec, pod, target);
    }
    desired.mark_populated();
    (desired, actual, reconciler)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn cpu_time() -> Duration {
    // SAFETY: getrusage only writes into the zeroed struct we pass.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

fn plan_in_place(c: &mut Criterion) {
    let (_desired, actual, reconciler) = setup();
    runtime().block_on(async {
        reconciler.run_until_idle(10).await;
    });
    assert_eq!(actual.snapshot().len(), VOLUMES as usize);
    assert!(reconciler.plan().is_empty());
    c.bench_function("node plan pass, 10k volumes in place", |b| {
        b.iter(|| black_box(reconciler.plan()))
    });
}

fn converge_from_empty(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("converge");
    group.sample_size(10);
    group.bench_function("node converge 10k volumes from empty (wall)", |b| {
        b.iter_batched(
            setup,
            |(_desired, actual, reconciler)| {
                rt.block_on(reconciler.run_until_idle(10));
                assert_eq!(actual.snapshot().len(), VOLUMES as usize);
            },
            criterion::BatchSize::LargeInput,
        )
    });
    group.finish();

    // CPU time of one convergence on a single-threaded runtime, printed for
    // the benchmark doc (criterion reports wall time).
    let mut samples = Vec::new();
    for _ in 0..5 {
        let (_desired, _actual, reconciler) = setup();
        let before = cpu_time();
        rt.block_on(reconciler.run_until_idle(10));
        samples.push(cpu_time() - before);
    }
    samples.sort();
    println!(
        "converge 10k volumes CPU time: min {:?}, median {:?}, max {:?}",
        samples[0], samples[2], samples[4]
    );
}

criterion_group!(benches, plan_in_place, converge_from_empty);
criterion_main!(benches);
