//! A volume's usage for NodeGetVolumeStats (`statvfs` through the
//! `Mounter`), bounded in time. `statvfs` asks the filesystem: a network
//! filesystem whose server is down, or a FUSE filesystem whose daemon
//! hangs, would hold the calling thread for ever, and every stats call of
//! the kubelet would take another thread of the small blocking pool until
//! no call of any volume is served. So the question is asked on a thread of
//! its own, at most one at a time per path, and a filesystem that fails or
//! does not answer in time makes the volume abnormal.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use mount_utils::{FsUsage, Mounter};

/// How long NodeGetVolumeStats waits for a filesystem's usage.
pub(crate) const USAGE_WAIT: Duration = Duration::from_secs(5);

/// The usage of the filesystem at `path`: `Ok(None)` when it cannot be
/// read for a reason that says nothing of the volume's health (as before:
/// no usage is reported), `Err` with why the volume is abnormal when the
/// filesystem fails as a broken mount does or does not answer within
/// `wait` (or has not yet answered an earlier call).
pub(crate) fn usage_within(
    mounter: &Arc<dyn Mounter>,
    path: &Path,
    wait: Duration,
) -> Result<Option<FsUsage>, String> {
    static ASKING: OnceLock<Mutex<HashSet<PathBuf>>> = OnceLock::new();
    let asking = ASKING.get_or_init(Mutex::default);
    let lock = || asking.lock().unwrap_or_else(|e| e.into_inner());
    let silent = || format!("its filesystem at {} does not answer", path.display());
    if !lock().insert(path.to_owned()) {
        return Err(silent());
    }
    let (answer, answered) = std::sync::mpsc::channel();
    let (m, p) = (mounter.clone(), path.to_owned());
    let spawned = std::thread::Builder::new()
        .name("volume-usage".into())
        .spawn(move || {
            let found = m.fs_usage(&p);
            asking.lock().unwrap_or_else(|e| e.into_inner()).remove(&p);
            let _ = answer.send(found);
        });
    if spawned.is_err() {
        lock().remove(path);
        return Ok(None);
    }
    match answered.recv_timeout(wait) {
        Ok(Ok(found)) => Ok(Some(found)),
        Ok(Err(e)) if e.is_corrupted_mount() => Err(format!(
            "its filesystem at {} fails: {}",
            path.display(),
            e.errno().map_or("unknown error", |n| n.desc())
        )),
        Ok(Err(_)) => Ok(None),
        Err(_) => Err(silent()),
    }
}
