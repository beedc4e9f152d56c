//! [`FakeMounter`]: an in-memory [`Mounter`] for unit tests of drivers.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use nix::errno::Errno;

use crate::error::{MountError, is_corrupted_mount_errno};
use crate::linux::{refs_in, remove_mount_point, shown_options};
use crate::mounter::Mounter;
use crate::mountinfo::MountInfo;
use crate::options::{MountOptions, Sensitive};

/// An operation of [`FakeMounter`] that can be made to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FakeOp {
    /// [`Mounter::mount`] and [`Mounter::mount_sensitive`] (keyed by target).
    Mount,
    /// [`Mounter::bind_mount`] (keyed by target).
    BindMount,
    /// [`Mounter::unmount`].
    Unmount,
    /// Inspecting a path: [`Mounter::is_mount_point`],
    /// [`Mounter::is_likely_not_mount_point`] and the first step of
    /// [`Mounter::cleanup_mount_point`].
    Stat,
    /// [`Mounter::mount_points`] and [`Mounter::mount_refs`] (use
    /// [`FakeMounter::inject_error_any_path`]).
    MountPoints,
    /// Removing the directory in [`Mounter::cleanup_mount_point`].
    Remove,
}

/// A state change recorded by [`FakeMounter`], in call order. Only
/// successful changes are logged; no-ops (unmounting something not
/// mounted) are not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FakeAction {
    /// A mount (including `bind` given as an option).
    Mount {
        /// Source as given.
        source: String,
        /// Target, lexically normalised.
        target: PathBuf,
        /// Filesystem type as given.
        fstype: String,
        /// Non-sensitive options as given.
        options: Vec<String>,
        /// Sensitive options; their `Debug` is redacted.
        sensitive_options: Vec<Sensitive>,
    },
    /// A [`Mounter::bind_mount`].
    BindMount {
        /// Source, lexically normalised.
        source: PathBuf,
        /// Target, lexically normalised.
        target: PathBuf,
        /// Whether it was read-only.
        read_only: bool,
    },
    /// An unmount of a mounted path.
    Unmount {
        /// Target, lexically normalised.
        target: PathBuf,
        /// Whether it was lazy.
        lazy: bool,
    },
    /// [`Mounter::cleanup_mount_point`] removed the path from disk.
    Remove {
        /// The path.
        path: PathBuf,
    },
}

#[derive(Debug, Default)]
struct State {
    mounts: Vec<MountInfo>,
    next_id: u32,
    devices: HashMap<String, u32>,
    log: Vec<FakeAction>,
    errors: HashMap<(FakeOp, Option<PathBuf>), Errno>,
    corrupted: HashMap<PathBuf, Errno>,
}

/// In-memory [`Mounter`] for unit tests.
///
/// - Mount table: [`Mounter::mount_points`] returns [`MountInfo`] entries
///   like the kernel's. Each distinct source gets its own fake device number.
/// - Bind-source resolution: binding a path inside a fake mount yields an
///   entry with that mount's source, device and root, so a bind of a bind
///   resolves to the original device and [`Mounter::mount_refs`] works.
/// - Action log ([`FakeMounter::actions`]) to assert on.
/// - Injectable errors per operation and path ([`FakeMounter::inject_error`])
///   and corrupted mounts ([`FakeMounter::mark_corrupted`]).
/// - The same idempotent semantics as [`LinuxMounter`](crate::LinuxMounter):
///   unmounting something not mounted succeeds, cleanup of an absent path
///   succeeds. A non-lazy unmount of a mount that has mounts below it fails
///   with `EBUSY`, a lazy one removes the whole subtree.
///
/// Paths are compared after lexical normalisation (no filesystem access),
/// except that `cleanup_mount_point` removes the path from disk if it exists
/// and is empty, so it can be used with temporary directories.
///
/// ```
/// use std::path::Path;
/// use mount_utils::{FakeAction, FakeMounter, Mounter};
///
/// let m = FakeMounter::new();
/// m.mount("/dev/sdb", Path::new("/staging"), "ext4", &[]).unwrap();
/// m.bind_mount(Path::new("/staging"), Path::new("/pods/a"), true).unwrap();
/// m.bind_mount(Path::new("/pods/a"), Path::new("/pods/b"), false).unwrap();
///
/// // A bind of a bind still points at the device.
/// let b = m.mount_points().unwrap().into_iter().last().unwrap();
/// assert_eq!(b.source, "/dev/sdb");
/// assert_eq!(m.mount_refs(Path::new("/staging")).unwrap().len(), 2);
///
/// m.unmount(Path::new("/pods/b"), false).unwrap();
/// m.unmount(Path::new("/pods/b"), false).unwrap(); // not mounted: still Ok
/// assert_eq!(
///     m.actions().last(),
///     Some(&FakeAction::Unmount { target: "/pods/b".into(), lazy: false })
/// );
/// ```
#[derive(Debug, Default)]
pub struct FakeMounter {
    state: Mutex<State>,
}

impl FakeMounter {
    /// An empty mount table.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking test must not poison the fake for the others.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes `op` on `path` fail with `errno` until
    /// [`clear_errors`](FakeMounter::clear_errors).
    pub fn inject_error(&self, op: FakeOp, path: impl AsRef<Path>, errno: Errno) {
        self.lock()
            .errors
            .insert((op, Some(normalize(path.as_ref()))), errno);
    }

    /// Makes `op` fail with `errno` for every path.
    pub fn inject_error_any_path(&self, op: FakeOp, errno: Errno) {
        self.lock().errors.insert((op, None), errno);
    }

    /// Removes all injected errors (not corrupted mounts).
    pub fn clear_errors(&self) {
        self.lock().errors.clear();
    }

    /// Simulates a broken mount at `path` (a dead FUSE daemon: `ENOTCONN`, a
    /// stale NFS handle: `ESTALE`): inspecting it fails with `errno` until it
    /// is unmounted. The path is also added to the mount table if absent.
    pub fn mark_corrupted(&self, path: impl AsRef<Path>, errno: Errno) {
        let path = normalize(path.as_ref());
        let mut st = self.lock();
        if !st.mounts.iter().any(|m| m.mount_point == path) {
            let source = "fake-corrupted".to_string();
            add_entry(
                &mut st,
                source,
                path.clone(),
                PathBuf::from("/"),
                "fuse".into(),
                vec!["rw".into()],
            );
        }
        st.corrupted.insert(path, errno);
    }

    /// Adds an entry as if something else had mounted it, without logging.
    pub fn add_mount(&self, source: &str, target: impl AsRef<Path>, fstype: &str) {
        let mut st = self.lock();
        let target = normalize(target.as_ref());
        add_entry(
            &mut st,
            source.into(),
            target,
            PathBuf::from("/"),
            fstype.into(),
            vec!["rw".into()],
        );
    }

    /// The action log, oldest first.
    pub fn actions(&self) -> Vec<FakeAction> {
        self.lock().log.clone()
    }

    /// Clears the action log (not the mount table).
    pub fn clear_actions(&self) {
        self.lock().log.clear();
    }

    fn check(st: &State, op: FakeOp, path: &Path) -> Result<(), Errno> {
        let err = st
            .errors
            .get(&(op, Some(path.to_path_buf())))
            .or_else(|| st.errors.get(&(op, None)));
        match err {
            Some(e) => Err(*e),
            None => Ok(()),
        }
    }

    fn stat(st: &State, path: &Path) -> Result<(), MountError> {
        let fail = Self::check(st, FakeOp::Stat, path)
            .err()
            .or_else(|| st.corrupted.get(path).copied());
        match fail {
            Some(errno) => Err(MountError::Stat {
                path: path.to_path_buf(),
                errno,
            }),
            None => Ok(()),
        }
    }

    fn apply_remount(m: &mut MountInfo, opts: &MountOptions) {
        let ro = if opts.is_read_only() { "ro" } else { "rw" };
        m.mount_options.retain(|o| o != "ro" && o != "rw");
        m.mount_options.insert(0, ro.into());
    }

    fn bind_locked(
        st: &mut State,
        source: &Path,
        target: PathBuf,
        read_only: bool,
        op: FakeOp,
    ) -> Result<(), Errno> {
        Self::check(st, op, &target)?;
        // Resolve through the deepest mount containing the source, so a bind
        // of a bind (or of a subdirectory of a mount) shows the original
        // device and the right root.
        let base = st
            .mounts
            .iter()
            .rev()
            .filter(|m| source.starts_with(&m.mount_point))
            .max_by_key(|m| m.mount_point.components().count())
            .cloned();
        let opt = if read_only { "ro" } else { "rw" };
        match base {
            Some(m) => {
                let rel = source.strip_prefix(&m.mount_point).unwrap_or(Path::new(""));
                let root = if rel.as_os_str().is_empty() {
                    m.root.clone()
                } else {
                    m.root.join(rel)
                };
                let id = next_id(st);
                st.mounts.push(MountInfo {
                    mount_id: id,
                    parent_id: parent_of(st, &target),
                    root,
                    mount_point: target,
                    mount_options: vec![opt.into()],
                    ..m
                });
            }
            None => add_entry(
                st,
                source.display().to_string(),
                target,
                PathBuf::from("/"),
                "none".into(),
                vec![opt.into()],
            ),
        }
        Ok(())
    }
}

impl Mounter for FakeMounter {
    fn mount_sensitive(
        &self,
        source: &str,
        target: &Path,
        fstype: &str,
        options: &[&str],
        sensitive_options: &[Sensitive],
    ) -> Result<(), MountError> {
        let target = normalize(target);
        let opts = MountOptions::parse(options);
        let mut st = self.lock();
        let result = if opts.flags.contains(nix::mount::MsFlags::MS_REMOUNT) {
            // Like the kernel: a remount needs an existing mount.
            match Self::check(&st, FakeOp::Mount, &target) {
                Err(e) => Err(e),
                Ok(()) => match st.mounts.iter_mut().rev().find(|m| m.mount_point == target) {
                    Some(m) => {
                        Self::apply_remount(m, &opts);
                        Ok(())
                    }
                    None => Err(Errno::EINVAL),
                },
            }
        } else if opts.is_bind() {
            Self::bind_locked(
                &mut st,
                &normalize(Path::new(source)),
                target.clone(),
                opts.is_read_only(),
                FakeOp::Mount,
            )
        } else {
            Self::check(&st, FakeOp::Mount, &target).map(|()| {
                let ro = if opts.is_read_only() { "ro" } else { "rw" };
                add_entry(
                    &mut st,
                    source.into(),
                    target.clone(),
                    PathBuf::from("/"),
                    fstype.into(),
                    vec![ro.into()],
                );
            })
        };
        result.map_err(|errno| MountError::Mount {
            device: source.into(),
            target: target.clone(),
            fstype: fstype.into(),
            options: shown_options(options, sensitive_options),
            errno,
        })?;
        st.log.push(FakeAction::Mount {
            source: source.into(),
            target,
            fstype: fstype.into(),
            options: options.iter().map(|s| s.to_string()).collect(),
            sensitive_options: sensitive_options.to_vec(),
        });
        Ok(())
    }

    fn bind_mount(&self, source: &Path, target: &Path, read_only: bool) -> Result<(), MountError> {
        let (source, target) = (normalize(source), normalize(target));
        let mut st = self.lock();
        Self::bind_locked(
            &mut st,
            &source,
            target.clone(),
            read_only,
            FakeOp::BindMount,
        )
        .map_err(|errno| MountError::Mount {
            device: source.display().to_string(),
            target: target.clone(),
            fstype: String::new(),
            options: "bind".into(),
            errno,
        })?;
        st.log.push(FakeAction::BindMount {
            source,
            target,
            read_only,
        });
        Ok(())
    }

    fn unmount(&self, target: &Path, lazy: bool) -> Result<(), MountError> {
        let target = normalize(target);
        let mut st = self.lock();
        let err = |errno| MountError::Unmount {
            target: target.clone(),
            errno,
        };
        Self::check(&st, FakeOp::Unmount, &target).map_err(err)?;
        let Some(idx) = st.mounts.iter().rposition(|m| m.mount_point == target) else {
            return Ok(());
        };
        let below = |m: &MountInfo| m.mount_point != target && m.mount_point.starts_with(&target);
        if lazy {
            st.mounts.retain(|m| !below(m));
            let idx = st
                .mounts
                .iter()
                .rposition(|m| m.mount_point == target)
                .unwrap_or(idx);
            st.mounts.remove(idx);
        } else if st.mounts.iter().any(below) {
            return Err(err(Errno::EBUSY));
        } else {
            st.mounts.remove(idx);
        }
        if !st.mounts.iter().any(|m| m.mount_point == target) {
            st.corrupted.remove(&target);
        }
        st.log.push(FakeAction::Unmount { target, lazy });
        Ok(())
    }

    fn mount_points(&self) -> Result<Vec<MountInfo>, MountError> {
        let st = self.lock();
        Self::check(
            &st,
            FakeOp::MountPoints,
            Path::new("/proc/thread-self/mountinfo"),
        )
        .map_err(|errno| MountError::ReadMountInfo {
            path: PathBuf::from("/proc/thread-self/mountinfo"),
            errno,
        })?;
        Ok(st.mounts.clone())
    }

    fn is_mount_point(&self, path: &Path) -> Result<bool, MountError> {
        let path = normalize(path);
        let st = self.lock();
        Self::stat(&st, &path)?;
        Ok(st.mounts.iter().any(|m| m.mount_point == path))
    }

    /// Exact in the fake (it has no device numbers to compare).
    fn is_likely_not_mount_point(&self, path: &Path) -> Result<bool, MountError> {
        self.is_mount_point(path).map(|m| !m)
    }

    fn mount_refs(&self, path: &Path) -> Result<Vec<PathBuf>, MountError> {
        let mounts = self.mount_points()?;
        Ok(refs_in(&mounts, &normalize(path)))
    }

    fn cleanup_mount_point(&self, path: &Path) -> Result<(), MountError> {
        let path = normalize(path);
        let mut attempts = 0;
        loop {
            let mounted = match self.is_mount_point(&path) {
                Ok(m) => m,
                Err(MountError::Stat {
                    errno: Errno::ENOENT,
                    ..
                }) => return Ok(()),
                Err(MountError::Stat { errno, .. }) if is_corrupted_mount_errno(errno) => true,
                Err(e) => return Err(e),
            };
            if !mounted {
                break;
            }
            // Same bound as the real one; an injected stat error never clears.
            attempts += 1;
            if attempts > 32 {
                return Err(MountError::StillMounted { path, attempts: 32 });
            }
            self.unmount(&path, false)?;
        }
        {
            let st = self.lock();
            Self::check(&st, FakeOp::Remove, &path).map_err(|errno| MountError::Remove {
                path: path.clone(),
                errno,
            })?;
        }
        let existed = path.exists();
        remove_mount_point(&path)?;
        if existed {
            self.lock().log.push(FakeAction::Remove { path });
        }
        Ok(())
    }
}

fn next_id(st: &mut State) -> u32 {
    st.next_id += 1;
    st.next_id + 100
}

fn parent_of(st: &State, target: &Path) -> u32 {
    st.mounts
        .iter()
        .rev()
        .filter(|m| m.mount_point != target && target.starts_with(&m.mount_point))
        .max_by_key(|m| m.mount_point.components().count())
        .map_or(1, |m| m.mount_id)
}

fn add_entry(
    st: &mut State,
    source: String,
    target: PathBuf,
    root: PathBuf,
    fs_type: String,
    opts: Vec<String>,
) {
    let n = st.devices.len() as u32;
    let minor = *st.devices.entry(source.clone()).or_insert(n + 1);
    let id = next_id(st);
    let parent_id = parent_of(st, &target);
    st.mounts.push(MountInfo {
        mount_id: id,
        parent_id,
        major: 0,
        minor,
        root,
        mount_point: target,
        mount_options: opts,
        optional_fields: Vec::new(),
        fs_type,
        source,
        super_options: vec!["rw".into()],
    });
}

/// Lexical normalisation: drops `.`, resolves `..`, strips trailing `/`.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> &Path {
        Path::new(s)
    }

    #[test]
    fn mount_unmount_and_log() {
        let m = FakeMounter::new();
        m.mount("tmpfs", p("/mnt/a/"), "tmpfs", &["size=1m", "ro"])
            .unwrap();
        assert!(m.is_mount_point(p("/mnt/a")).unwrap());
        assert!(!m.is_likely_not_mount_point(p("/mnt/./a")).unwrap());
        let mi = &m.mount_points().unwrap()[0];
        assert!(mi.is_read_only());
        assert_eq!(mi.fs_type, "tmpfs");
        m.unmount(p("/mnt/a"), false).unwrap();
        assert!(!m.is_mount_point(p("/mnt/a")).unwrap());
        m.unmount(p("/mnt/a"), false).unwrap();
        assert_eq!(m.actions().len(), 2);
        assert!(matches!(
            &m.actions()[1],
            FakeAction::Unmount { lazy: false, .. }
        ));
        m.clear_actions();
        assert!(m.actions().is_empty());
    }

    #[test]
    fn sensitive_options_are_recorded_but_redacted() {
        let m = FakeMounter::new();
        m.mount_sensitive(
            "//srv/share",
            p("/mnt/c"),
            "cifs",
            &["vers=3.0"],
            &[Sensitive::new("password=pw")],
        )
        .unwrap();
        let log = format!("{:?}", m.actions());
        assert!(!log.contains("password"), "{log}");
        match &m.actions()[0] {
            FakeAction::Mount {
                sensitive_options, ..
            } => assert_eq!(sensitive_options[0].expose(), "password=pw"),
            other => panic!("unexpected {other:?}"),
        }
        m.inject_error(FakeOp::Mount, "/mnt/d", Errno::EPERM);
        let err = m
            .mount_sensitive(
                "//srv/share",
                p("/mnt/d"),
                "cifs",
                &[],
                &[Sensitive::new("password=pw")],
            )
            .unwrap_err();
        assert_eq!(err.errno(), Some(Errno::EPERM));
        assert!(!err.to_string().contains("password"));
        assert!(!format!("{err:?}").contains("password"));
    }

    #[test]
    fn bind_of_bind_resolves_to_original_source() {
        let m = FakeMounter::new();
        m.mount("/dev/sdb", p("/staging"), "ext4", &[]).unwrap();
        m.bind_mount(p("/staging"), p("/pod1"), false).unwrap();
        m.bind_mount(p("/pod1"), p("/pod2"), true).unwrap();
        m.mount("/pod2/sub", p("/pod3"), "", &["bind", "ro"])
            .unwrap();
        let mounts = m.mount_points().unwrap();
        assert_eq!(mounts.len(), 4);
        assert!(
            mounts
                .iter()
                .all(|e| e.source == "/dev/sdb" && e.fs_type == "ext4")
        );
        assert_eq!(mounts[3].root, p("/sub"));
        assert!(mounts[2].is_read_only() && mounts[3].is_read_only());
        let mut refs = m.mount_refs(p("/staging")).unwrap();
        refs.sort();
        assert_eq!(refs, vec![PathBuf::from("/pod1"), PathBuf::from("/pod2")]);
        assert!(m.mount_refs(p("/not-mounted")).unwrap().is_empty());
        // Binds of an unmounted directory share a device, so refs work too.
        m.bind_mount(p("/var/data"), p("/x"), false).unwrap();
        m.bind_mount(p("/var/data"), p("/y"), false).unwrap();
        assert_eq!(m.mount_refs(p("/x")).unwrap(), vec![PathBuf::from("/y")]);
    }

    #[test]
    fn remount_changes_an_existing_mount() {
        let m = FakeMounter::new();
        let err = m.mount("", p("/r"), "", &["remount", "ro"]).unwrap_err();
        assert_eq!(err.errno(), Some(Errno::EINVAL));
        m.bind_mount(p("/src"), p("/r"), false).unwrap();
        m.mount("", p("/r"), "", &["remount", "bind", "ro"])
            .unwrap();
        let mounts = m.mount_points().unwrap();
        assert_eq!(mounts.len(), 1);
        assert!(mounts[0].is_read_only());
    }

    #[test]
    fn unmount_busy_and_lazy() {
        let m = FakeMounter::new();
        m.mount("tmpfs", p("/a"), "tmpfs", &[]).unwrap();
        m.mount("tmpfs", p("/a/b"), "tmpfs", &[]).unwrap();
        let err = m.unmount(p("/a"), false).unwrap_err();
        assert_eq!(err.errno(), Some(Errno::EBUSY));
        m.unmount(p("/a"), true).unwrap();
        assert!(m.mount_points().unwrap().is_empty());
    }

    #[test]
    fn stacked_mounts_unmount_top_first() {
        let m = FakeMounter::new();
        m.mount("one", p("/s"), "tmpfs", &[]).unwrap();
        m.mount("two", p("/s"), "tmpfs", &[]).unwrap();
        m.unmount(p("/s"), false).unwrap();
        assert_eq!(m.mount_points().unwrap()[0].source, "one");
    }

    #[test]
    fn injected_errors_per_path_and_op() {
        let m = FakeMounter::new();
        m.mount("tmpfs", p("/a"), "tmpfs", &[]).unwrap();
        m.inject_error(FakeOp::Unmount, "/a", Errno::EBUSY);
        assert_eq!(
            m.unmount(p("/a"), false).unwrap_err().errno(),
            Some(Errno::EBUSY)
        );
        // Other paths and operations are unaffected.
        m.unmount(p("/b"), false).unwrap();
        assert!(m.is_mount_point(p("/a")).unwrap());
        m.inject_error_any_path(FakeOp::MountPoints, Errno::EIO);
        assert_eq!(m.mount_points().unwrap_err().errno(), Some(Errno::EIO));
        m.inject_error_any_path(FakeOp::BindMount, Errno::EPERM);
        assert!(m.bind_mount(p("/a"), p("/c"), false).is_err());
        m.clear_errors();
        m.unmount(p("/a"), false).unwrap();
        assert!(m.mount_points().unwrap().is_empty());
    }

    #[test]
    fn cleanup_semantics() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("t");
        std::fs::create_dir(&target).unwrap();
        let m = FakeMounter::new();
        m.mount("tmpfs", &target, "tmpfs", &[]).unwrap();
        m.mount("tmpfs", &target, "tmpfs", &[]).unwrap();
        m.cleanup_mount_point(&target).unwrap();
        assert!(!target.exists());
        assert!(m.mount_points().unwrap().is_empty());
        assert!(matches!(
            m.actions().last(),
            Some(FakeAction::Remove { .. })
        ));
        // Absent path: success, nothing logged.
        let n = m.actions().len();
        m.cleanup_mount_point(&target).unwrap();
        assert_eq!(m.actions().len(), n);
        // Non-empty directory is kept.
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("f"), b"x").unwrap();
        let err = m.cleanup_mount_point(&target).unwrap_err();
        assert_eq!(err.errno(), Some(Errno::ENOTEMPTY));
        assert!(target.join("f").exists());
    }

    #[test]
    fn cleanup_of_corrupted_mount() {
        let m = FakeMounter::new();
        m.mount("fuse-daemon", p("/gone/mnt"), "fuse", &[]).unwrap();
        m.mark_corrupted("/gone/mnt", Errno::ENOTCONN);
        let err = m.is_mount_point(p("/gone/mnt")).unwrap_err();
        assert!(err.is_corrupted_mount());
        m.cleanup_mount_point(p("/gone/mnt")).unwrap();
        assert!(!m.is_mount_point(p("/gone/mnt")).unwrap());
        assert!(m.actions().contains(&FakeAction::Unmount {
            target: "/gone/mnt".into(),
            lazy: false
        }));
        // A non-corruption stat error is reported, not papered over.
        m.inject_error(FakeOp::Stat, "/x", Errno::EPERM);
        assert_eq!(
            m.cleanup_mount_point(p("/x")).unwrap_err().errno(),
            Some(Errno::EPERM)
        );
        m.inject_error(FakeOp::Stat, "/y", Errno::ENOENT);
        m.cleanup_mount_point(p("/y")).unwrap();
    }

    #[test]
    fn usable_as_trait_object() {
        let m: std::sync::Arc<dyn Mounter> = std::sync::Arc::new(FakeMounter::new());
        m.mount("tmpfs", p("/z"), "tmpfs", &[]).unwrap();
        assert!(m.is_mount_point(p("/z")).unwrap());
    }
}
