//! The invariants, checked on the real world: the driver's answers, the
//! mount table, the loop devices and the files under the run's directory.

use std::collections::BTreeSet;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use csi_proto::v1::{ListSnapshotsRequest, ListVolumesRequest};
use mount_utils::{LinuxMounter, Mounter};

use super::co::Co;

/// The file the CO writes into a volume through its first writable pod.
const DATA_FILE: &str = "crash-companion-data";

/// After a call answered OK: every acknowledged volume and snapshot is
/// listed, data written through a pod is still there through every pod,
/// and read-only publications are read-only.
pub(crate) async fn after_call(co: &mut Co<'_>) -> Result<(), String> {
    let (volumes, snapshots) = listed(co).await?;
    if let Some(listed) = volumes {
        for (pv, id) in &co.model.volumes {
            if !listed.contains(id) {
                return Err(format!("acknowledged volume {pv} ({id}) is not listed"));
            }
        }
    }
    if let Some(listed) = snapshots {
        let groups = co.model.groups.values().flat_map(|(_, m)| m.iter());
        for id in co.model.snapshots.values().chain(groups) {
            if !listed.contains(id) {
                return Err(format!("acknowledged snapshot {id} is not listed"));
            }
        }
    }
    let published: Vec<_> = co.model.published.iter().map(|(k, ro)| (*k, *ro)).collect();
    for ((pv, pod), readonly) in &published {
        if !readonly && !co.model.written.contains_key(pv) {
            let data = format!("{pv} written through {pod}\n");
            write_data(co, &co.target_path(pv, pod), &data)?;
            co.model.written.insert(pv, data);
        }
    }
    for ((pv, pod), readonly) in published {
        let target = co.target_path(pv, pod);
        if let Some(data) = co.model.written.get(pv) {
            let found = read_data(co, &target, data.len());
            if found.as_deref().ok() != Some(data.as_str()) {
                return Err(format!(
                    "{pv}'s data through {pod}: {found:?}, expected {data:?}"
                ));
            }
        }
        if readonly {
            read_only(&target, co.block).map_err(|e| format!("{pv} for {pod}: {e}"))?;
        }
    }
    Ok(())
}

/// Writes `data` through a pod's `target`: into a file on a mount volume,
/// at the start of a block volume's device (synced: a crash keeps it).
fn write_data(co: &Co<'_>, target: &Path, data: &str) -> Result<(), String> {
    use std::io::Write;
    let path = match co.block {
        true => target.to_owned(),
        false => target.join(DATA_FILE),
    };
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(!co.block).truncate(!co.block);
    let written = options.open(&path).and_then(|mut f| {
        f.write_all(data.as_bytes())?;
        f.sync_all()
    });
    written.map_err(|e| format!("writing {}: {e}", path.display()))
}

/// What [`write_data`] wrote, `len` bytes, read through `target`.
fn read_data(co: &Co<'_>, target: &Path, len: usize) -> std::io::Result<String> {
    use std::io::Read;
    if !co.block {
        return std::fs::read_to_string(target.join(DATA_FILE));
    }
    let mut buf = vec![0; len];
    std::fs::File::open(target)?.read_exact(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// A read-only publication: mounted read-only and refusing a write (of a
/// new file; of the device itself for a block volume).
fn read_only(target: &Path, block: bool) -> Result<(), String> {
    let info = LinuxMounter::new()
        .mounted_at(target)
        .map_err(|e| e.to_string())?
        .ok_or("the read-only publication is not mounted")?;
    if !info.is_read_only() {
        return Err("the read-only publication is mounted read-write".into());
    }
    if block {
        return match std::fs::OpenOptions::new().write(true).open(target) {
            Err(_) => Ok(()),
            Ok(_) => Err("the read-only block publication opens for writing".into()),
        };
    }
    match std::fs::write(target.join("not-allowed"), b"x") {
        Err(e) if e.kind() == ErrorKind::ReadOnlyFilesystem => Ok(()),
        other => Err(format!("a write to the read-only publication: {other:?}")),
    }
}

/// The ids ListVolumes and ListSnapshots answer (`None`: not offered).
async fn listed(
    co: &Co<'_>,
) -> Result<(Option<BTreeSet<String>>, Option<BTreeSet<String>>), String> {
    let c = co.client()?;
    let (volumes, snapshots) = co.lists();
    let volumes = match volumes {
        false => None,
        true => {
            let r = c.list_volumes(ListVolumesRequest::default()).await;
            let r = r.map_err(|e| format!("ListVolumes: {e}"))?;
            Some(
                r.entries
                    .into_iter()
                    .filter_map(|e| e.volume)
                    .map(|v| v.volume_id)
                    .collect(),
            )
        }
    };
    let snapshots = match snapshots {
        false => None,
        true => {
            let r = c.list_snapshots(ListSnapshotsRequest::default()).await;
            let r = r.map_err(|e| format!("ListSnapshots: {e}"))?;
            Some(
                r.entries
                    .into_iter()
                    .filter_map(|e| e.snapshot)
                    .map(|s| s.snapshot_id)
                    .collect(),
            )
        }
    };
    Ok((volumes, snapshots))
}

/// After the workload (which deletes all it made): nothing is listed,
/// mounted under the run's directory, attached from it, or left in the
/// driver's data directories.
pub(crate) async fn at_end(co: &Co<'_>) -> Result<(), String> {
    let (volumes, snapshots) = listed(co).await?;
    for (what, left) in [("volumes", volumes), ("snapshots", snapshots)] {
        if let Some(left) = left.filter(|l| !l.is_empty()) {
            return Err(format!("{what} listed after all were deleted: {left:?}"));
        }
    }
    let (spared_mounts, spared_loops) = &co.spared;
    let mut mounts = mounts_under(&co.layout.base)?;
    mounts.retain(|m| !spared_mounts.contains(m));
    if !mounts.is_empty() {
        return Err(format!("still mounted: {mounts:?}"));
    }
    let loops = loops_under_within(&co.layout.base, spared_loops, Duration::from_secs(3)).await;
    if !loops.is_empty() {
        return Err(format!("loop devices still attached: {loops:?}"));
    }
    for dir in (co.target.data_dirs)(&co.layout) {
        let left: Vec<_> = match std::fs::read_dir(&dir) {
            Ok(entries) => entries.flatten().map(|e| e.file_name()).collect(),
            Err(e) if e.kind() == ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(format!("{}: {e}", dir.display())),
        };
        if !left.is_empty() {
            return Err(format!("orphan files in {}: {left:?}", dir.display()));
        }
    }
    Ok(())
}

/// Mount points under `dir` in this thread's mount namespace.
pub(crate) fn mounts_under(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let text = std::fs::read("/proc/thread-self/mountinfo").map_err(|e| e.to_string())?;
    let table = mount_utils::parse_mountinfo(&text).map_err(|e| e.to_string())?;
    Ok(table
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(dir))
        .collect())
}

/// Loop devices backed by files under `dir` but not `spared`, waiting up
/// to `wait` for an autoclear detach (deferred until the last user lets go).
async fn loops_under_within(dir: &Path, spared: &[String], wait: Duration) -> Vec<String> {
    let deadline = Instant::now() + wait;
    loop {
        let mut found = loops_under(dir);
        found.retain(|l| !spared.contains(l));
        if found.is_empty() || Instant::now() > deadline {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) fn loops_under(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let backing = std::fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
            let name = e.file_name().to_string_lossy().into_owned();
            Path::new(backing.trim_end())
                .starts_with(dir)
                .then_some(name)
        })
        .collect()
}

/// Takes down what a failed run left: mounts under `dir` (deepest first)
/// and loop devices backed by its files.
pub(crate) fn clean_up(dir: &Path) {
    let m = LinuxMounter::new();
    for _ in 0..4 {
        let mut mounts = mounts_under(dir).unwrap_or_default();
        if mounts.is_empty() {
            break;
        }
        mounts.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for p in mounts {
            let _ = m.unmount(&p, true);
        }
    }
    mount_utils::testing::detach_loop_devices_under(dir);
}
