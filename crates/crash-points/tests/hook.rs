//! The hook in a child process: this test binary runs itself again with
//! the variables set, and the child makes its effects: three directories,
//! a marked effect and an awaited one (a fourth directory).

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use crash_points::{CRASH_AT_ENV, CRASH_TRACE_ENV, read_trace};

/// Set in the child: the directory its effects go to.
const CHILD_DIR: &str = "CRASH_POINTS_TEST_DIR";

/// The child's part (does nothing in the parent's run).
#[test]
fn child_makes_three_effects() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else {
        return;
    };
    let fs = crash_points::file_system(Arc::new(csi_store::RealFs));
    for name in ["1", "2", "3"] {
        fs.create_dir(&Path::new(&dir).join(name)).unwrap();
    }
    crash_points::effect("provider-call", || ());
    let awaited = crash_points::effect_async("provider-attach", async {
        std::fs::create_dir(Path::new(&dir).join("4")).unwrap();
    });
    ready(awaited);
    if std::env::var_os(CHILD_SEAMS).is_some() {
        every_seam(Path::new(&dir));
    }
}

/// Runs a future that never waits (the test needs no runtime).
fn ready<F: Future>(f: F) -> F::Output {
    use std::task::{Context, Poll, Waker};
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("the future waited"),
    }
}

/// Set in the child: also make one effect of each kind through the fakes.
const CHILD_SEAMS: &str = "CRASH_POINTS_TEST_SEAMS";

fn every_seam(dir: &Path) {
    use mount_utils::{ExecOutput, FakeExec, FakeLoopDevices, FakeMounter, LoopOptions};
    let m = crash_points::mounter(Arc::new(FakeMounter::new()));
    let target = dir.join("1");
    m.bind_mount(&dir.join("2"), &target, true).unwrap();
    assert!(m.mounted_at(&target).unwrap().is_some(), "queries pass");
    m.remount(&target, &["bind", "ro"]).unwrap();
    m.unmount(&target, false).unwrap();
    m.cleanup_mount_point(&target).unwrap();
    let loops = crash_points::loop_devices(Arc::new(FakeLoopDevices::new()));
    let image = dir.join("disk.img");
    std::fs::write(&image, [0u8; 512]).unwrap();
    let attached = loops.attach(&image, &LoopOptions::default()).unwrap();
    loops.set_capacity(attached.path()).unwrap();
    drop(attached);
    let fake = FakeExec::new();
    fake.expect("mkfs.ext4", ExecOutput::ok(""));
    let exec = crash_points::exec(Arc::new(fake));
    exec.run("mkfs.ext4", &["-q", "secret-label"]).unwrap();
    let fs = crash_points::file_system(Arc::new(csi_store::RealFs));
    let (tmp, record) = (dir.join("r.tmp"), dir.join("r"));
    let file = fs.open(&tmp, csi_store::OpenMode::CreateNew).unwrap();
    file.write_all_at(b"x", 0).unwrap();
    file.sync_data().unwrap();
    fs.rename(&tmp, &record).unwrap();
    fs.remove_file(&record).unwrap();
}

/// Runs the child with `plan`; its exit signal, the directories it made
/// and its trace.
fn run_child(plan: Option<&str>) -> (Option<i32>, Vec<String>, Vec<String>) {
    run_child_with(plan, false)
}

fn run_child_with(plan: Option<&str>, seams: bool) -> (Option<i32>, Vec<String>, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace");
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap());
    child
        .args(["--exact", "child_makes_three_effects", "--test-threads=1"])
        .env(CHILD_DIR, &work)
        .env(CRASH_TRACE_ENV, &trace);
    if let Some(plan) = plan {
        child.env(CRASH_AT_ENV, plan);
    }
    if seams {
        child.env(CHILD_SEAMS, "1");
    }
    let out = child.output().unwrap();
    let failed = !out.status.success() && out.status.signal().is_none();
    assert!(!failed, "{}", String::from_utf8_lossy(&out.stdout));
    let mut made: Vec<String> = std::fs::read_dir(&work)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    made.sort();
    let traced = read_trace(&trace)
        .unwrap()
        .iter()
        .map(|e| e.to_string())
        .collect();
    (out.status.signal(), made, traced)
}

#[cfg(feature = "armed")]
#[test]
fn the_planned_effect_kills_the_process_before_or_after_it_and_the_trace_counts_them() {
    let (signal, made, traced) = run_child(None);
    assert_eq!(signal, None, "no plan: the child runs to its end");
    assert_eq!(made, ["1", "2", "3", "4"]);
    assert_eq!(
        traced,
        [
            "1 mkdir",
            "2 mkdir",
            "3 mkdir",
            "4 provider-call",
            "5 provider-attach"
        ]
    );

    let (signal, made, traced) = run_child(Some("2"));
    assert_eq!(signal, Some(libc::SIGKILL));
    assert_eq!(made, ["1"], "killed before the second mkdir");
    assert_eq!(traced, ["1 mkdir", "2 mkdir"]);

    let (signal, made, _) = run_child(Some("2:after"));
    assert_eq!(signal, Some(libc::SIGKILL));
    assert_eq!(made, ["1", "2"], "killed right after the second mkdir");

    let (signal, made, _) = run_child(Some("4:before"));
    assert_eq!((signal, made.len()), (Some(libc::SIGKILL), 3));

    // The awaited effect: before it is polled, or once it is done.
    let (signal, made, _) = run_child(Some("5:before"));
    assert_eq!((signal, made.len()), (Some(libc::SIGKILL), 3));
    let (signal, made, _) = run_child(Some("5:after"));
    assert_eq!((signal, made.len()), (Some(libc::SIGKILL), 4));

    let (signal, _, traced) = run_child(Some("9"));
    assert_eq!(signal, None, "a plan past the last effect never fires");
    assert_eq!(traced.len(), 5);
}

#[cfg(feature = "armed")]
#[test]
fn every_seam_counts_its_effects_and_only_them_without_arguments() {
    let (signal, _, traced) = run_child_with(None, true);
    assert_eq!(signal, None);
    let kinds: Vec<&str> = traced
        .iter()
        .map(|l| l.split_once(' ').unwrap().1)
        .collect();
    assert_eq!(
        kinds[5..],
        [
            "bind-mount",
            "remount",
            "unmount",
            "cleanup-mount-point",
            "loop-attach",
            "loop-set-capacity",
            "loop-detach",
            "exec mkfs.ext4",
            "create",
            "write",
            "fdatasync",
            "rename",
            "unlink",
        ]
    );
}

#[cfg(feature = "armed")]
#[test]
fn a_bad_plan_stops_the_process_with_the_reason() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_makes_three_effects"])
        .env(CHILD_DIR, tempfile::tempdir().unwrap().path())
        .env(CRASH_AT_ENV, "soon")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(CRASH_AT_ENV) && stderr.contains("soon"),
        "{stderr}"
    );
}

#[cfg(not(feature = "armed"))]
#[test]
fn unarmed_builds_ignore_the_variables_and_wrap_nothing() {
    let (signal, made, traced) = run_child(Some("1"));
    assert_eq!(signal, None);
    assert_eq!(made, ["1", "2", "3", "4"]);
    assert!(traced.is_empty(), "{traced:?}");
    let fs: Arc<dyn csi_store::FileSystem> = Arc::new(csi_store::RealFs);
    assert!(Arc::ptr_eq(&crash_points::file_system(fs.clone()), &fs));
    assert!(!crash_points::armed());
}
