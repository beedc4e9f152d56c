//! [`FakeMounter`]: an in-memory [`Mounter`] for unit tests of drivers.
//! What it records and can fail is in `fake/actions.rs`, its tests in
//! `fake/tests.rs`.
//!
//! One file over 700 lines: the fake mount table and the `Mounter` methods
//! over it share its private state and helpers.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use nix::errno::Errno;

use crate::block::DeviceNumber;
use crate::error::{MountError, is_corrupted_mount_errno};
use crate::fake_loop::{LOOP_MAJOR, number_of};
use crate::linux::{bind_source_in, refs_in, remove_mount_point};
use crate::mounter::{MAX_STACKED_UNMOUNTS, MountArgs, Mounter};
use crate::mountinfo::{MountInfo, containing_mount};
use crate::nofollow::normalize;
use crate::options::{MountOptions, RedactedOptions};
use crate::source::{FsUsage, MountSource};

mod actions;
pub use actions::{FakeAction, FakeOp};

/// Device number of the fake root filesystem that unmounted paths are on.
const FAKE_ROOTFS: DeviceNumber = DeviceNumber::new(0, 1);
/// Device number of the fake `/dev` (devtmpfs), for binds of device nodes.
const FAKE_DEVTMPFS: DeviceNumber = DeviceNumber::new(0, 6);
/// First minor handed out to pseudo filesystems (tmpfs, ...).
const FIRST_ANON_MINOR: u32 = 1000;

#[derive(Debug, Default)]
struct State {
    mounts: Vec<MountInfo>,
    next_id: u32,
    /// Devices of sources that are paths (`/dev/sdb`): stable per source.
    source_devices: HashMap<String, DeviceNumber>,
    next_anon: u32,
    /// Registered block device nodes, besides `/dev/loopN`.
    block_devices: HashMap<PathBuf, DeviceNumber>,
    /// Mount id to the block device node the mount shows.
    device_nodes: HashMap<u32, DeviceNumber>,
    symlinks: BTreeSet<PathBuf>,
    usage: HashMap<PathBuf, FsUsage>,
    log: Vec<FakeAction>,
    errors: HashMap<(FakeOp, Option<PathBuf>), Errno>,
    corrupted: HashMap<PathBuf, Errno>,
}

/// In-memory [`Mounter`] for unit tests, with the same rules as
/// [`LinuxMounter`](crate::LinuxMounter).
///
/// - Mount table: [`Mounter::mount_points`] and [`Mounter::mounted_at`]
///   return [`MountInfo`] entries like the kernel's, with device numbers:
///   a filesystem from `/dev/loopN` is `7:N` (as
///   [`FakeLoopDevices`](crate::FakeLoopDevices) hands out), one from another
///   registered block device ([`add_block_device`](Self::add_block_device))
///   has its number, other path sources keep one number each, and pseudo
///   filesystems (`tmpfs`, ...) get a fresh one per mount.
/// - Binds resolve like the kernel's: through the deepest fake mount
///   containing the source (device and root of that mount), otherwise on a
///   fake root filesystem (`0:1`, root = the path). A bind of a block
///   device node shows that device to [`Mounter::block_device_at`], so
///   [`MountSource`] checks behave as on a real node.
/// - Read-only: `ro` is sticky (a later `rw` does not undo it) and shows as
///   `ro` in the entry's mount options.
/// - Symlinks: paths registered with [`add_symlink`](Self::add_symlink), and
///   real symlinks on disk, are refused by every operation with
///   [`MountError::Symlink`], anywhere in the path.
/// - Action log ([`FakeMounter::actions`]) to assert on; injectable errors
///   per operation and path ([`FakeMounter::inject_error`]) and corrupted
///   mounts ([`FakeMounter::mark_corrupted`]).
/// - Idempotent teardown as on Linux: unmounting something not mounted and
///   cleanup of an absent path succeed. A non-lazy unmount of a mount that
///   has mounts below it fails with `EBUSY`, a lazy one removes the subtree.
///
/// Paths are compared after lexical normalisation (no filesystem access),
/// except that removals act on disk if the path exists there, so it can be
/// used with temporary directories.
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
/// let b = m.mounted_at(Path::new("/pods/b")).unwrap().unwrap();
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
            add_entry(
                &mut st,
                "fake-corrupted",
                path.clone(),
                "fuse",
                vec!["rw".into()],
            );
        }
        st.corrupted.insert(path, errno);
    }

    /// Adds an entry as if something else had mounted it, without logging.
    pub fn add_mount(&self, source: &str, target: impl AsRef<Path>, fstype: &str) {
        let mut st = self.lock();
        add_entry(
            &mut st,
            source,
            normalize(target.as_ref()),
            fstype,
            vec!["rw".into()],
        );
    }

    /// Makes `path` a symbolic link: every operation on it or below it
    /// fails with [`MountError::Symlink`], as on a real node.
    pub fn add_symlink(&self, path: impl AsRef<Path>) {
        self.lock().symlinks.insert(normalize(path.as_ref()));
    }

    /// Declares `path` a block device node with `device` as `st_rdev`
    /// (`/dev/loopN` is `7:N` without declaring it).
    pub fn add_block_device(&self, path: impl AsRef<Path>, device: DeviceNumber) {
        self.lock()
            .block_devices
            .insert(normalize(path.as_ref()), device);
    }

    /// What [`Mounter::fs_usage`] reports for `path` and everything below it.
    pub fn set_usage(&self, path: impl AsRef<Path>, usage: FsUsage) {
        self.lock().usage.insert(normalize(path.as_ref()), usage);
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

    /// Refuses `path` if it, or a directory on the way, is a registered or
    /// real symlink (real: in the test's directories; the fake's device
    /// nodes are not looked up on the host).
    fn check_symlinks(st: &State, path: &Path) -> Result<(), MountError> {
        let refuse = || {
            Err(MountError::Symlink {
                path: path.to_path_buf(),
            })
        };
        if st.symlinks.iter().any(|l| path.starts_with(l)) {
            return refuse();
        }
        // A device node of the fake (a loop device, a registered block
        // device) is no file of the host: the real /dev is never read.
        if Self::device_node(st, path).is_some() {
            return Ok(());
        }
        let mut on_disk = PathBuf::new();
        for c in path.components() {
            on_disk.push(c.as_os_str());
            match std::fs::symlink_metadata(&on_disk) {
                Ok(m) if m.file_type().is_symlink() => return refuse(),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        Ok(())
    }

    fn stat(st: &State, path: &Path) -> Result<(), MountError> {
        Self::check_symlinks(st, path)?;
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

    fn top(st: &State, path: &Path) -> Option<usize> {
        st.mounts.iter().rposition(|m| m.mount_point == path)
    }

    /// Whether `path` is a block device node, and which.
    fn device_node(st: &State, path: &Path) -> Option<DeviceNumber> {
        st.block_devices
            .get(path)
            .copied()
            .or_else(|| number_of(path).map(|n| DeviceNumber::new(LOOP_MAJOR, n)))
    }

    /// What a bind of `source` shows: the mount entry fields (with mount
    /// id and mount point to fill in) and the device node, if it is one.
    fn resolve_bind(st: &State, source: &Path) -> (MountInfo, Option<DeviceNumber>) {
        if let Some(base) = containing_mount(&st.mounts, source) {
            let MountSource::Bind { root, .. } = bind_source_in(base, source) else {
                unreachable!("bind_source_in returns Bind");
            };
            let node = (base.mount_point == source)
                .then(|| st.device_nodes.get(&base.mount_id).copied())
                .flatten();
            return (
                MountInfo {
                    root,
                    ..base.clone()
                },
                node,
            );
        }
        let node = Self::device_node(st, source);
        let entry = match node {
            Some(_) => MountInfo {
                major: FAKE_DEVTMPFS.major,
                minor: FAKE_DEVTMPFS.minor,
                root: Path::new("/").join(source.strip_prefix("/dev").unwrap_or(source)),
                fs_type: "devtmpfs".into(),
                source: "udev".into(),
                ..blank_entry()
            },
            None => MountInfo {
                major: FAKE_ROOTFS.major,
                minor: FAKE_ROOTFS.minor,
                root: source.to_path_buf(),
                fs_type: "none".into(),
                source: source.display().to_string(),
                ..blank_entry()
            },
        };
        (entry, node)
    }

    fn bind_locked(
        st: &mut State,
        source: &Path,
        target: PathBuf,
        opts: &MountOptions,
        op: FakeOp,
    ) -> Result<(), MountError> {
        Self::check_symlinks(st, source)?;
        Self::check_symlinks(st, &target)?;
        Self::check(st, op, &target).map_err(|errno| bind_error(source, &target, opts, errno))?;
        let (base, node) = Self::resolve_bind(st, source);
        let id = next_id(st);
        st.mounts.push(MountInfo {
            mount_id: id,
            parent_id: parent_of(st, &target),
            mount_point: target,
            mount_options: per_mount_options(opts, &[]),
            optional_fields: Vec::new(),
            ..base
        });
        if let Some(node) = node {
            st.device_nodes.insert(id, node);
        }
        Ok(())
    }

    fn remount_locked(st: &mut State, target: &Path, opts: &MountOptions) -> Result<(), Errno> {
        Self::check(st, FakeOp::Mount, target)?;
        // Like the kernel: a remount needs an existing mount.
        let idx = Self::top(st, target).ok_or(Errno::EINVAL)?;
        let m = &mut st.mounts[idx];
        m.mount_options = per_mount_options(opts, &m.mount_options);
        Ok(())
    }

    fn remove_locked(&self, path: &Path) -> Result<(), MountError> {
        let st = self.lock();
        Self::check_symlinks(&st, path)?;
        let fail = |errno| MountError::Remove {
            path: path.to_path_buf(),
            errno,
        };
        Self::check(&st, FakeOp::Remove, path).map_err(fail)?;
        if Self::top(&st, path).is_some() {
            return Err(fail(Errno::EBUSY));
        }
        drop(st);
        let existed = path.symlink_metadata().is_ok();
        remove_mount_point(path)?;
        if existed {
            self.lock().log.push(FakeAction::Remove {
                path: path.to_path_buf(),
            });
        }
        Ok(())
    }
}

impl Mounter for FakeMounter {
    fn mount_with(&self, args: &MountArgs<'_>) -> Result<(), MountError> {
        let (source, target, fstype, options) =
            (args.source, args.target, args.fstype, args.options);
        let target = normalize(target);
        let opts = MountOptions::parse(options);
        let mut st = self.lock();
        Self::check_symlinks(&st, &target)?;
        let err = |errno| MountError::Mount {
            device: source.into(),
            target: target.clone(),
            fstype: fstype.into(),
            options: args.redacted_options(),
            errno,
        };
        if opts.is_remount() {
            Self::remount_locked(&mut st, &target, &opts).map_err(err)?;
        } else if opts.is_bind() {
            let source = normalize(Path::new(source));
            Self::bind_locked(&mut st, &source, target.clone(), &opts, FakeOp::Mount).map_err(
                |e| match e {
                    MountError::Mount { errno, .. } => err(errno),
                    other => other,
                },
            )?;
        } else {
            Self::check(&st, FakeOp::Mount, &target).map_err(err)?;
            let options = per_mount_options(&opts, &[]);
            add_entry(&mut st, source, target.clone(), fstype, options);
        }
        st.log.push(FakeAction::Mount {
            source: source.into(),
            target,
            fstype: fstype.into(),
            options: options.iter().map(|s| s.to_string()).collect(),
            sensitive_options: args.sensitive_options.to_vec(),
        });
        Ok(())
    }

    fn bind_mount(&self, source: &Path, target: &Path, read_only: bool) -> Result<(), MountError> {
        let (source, target) = (normalize(source), normalize(target));
        let opts = MountOptions::parse(&[if read_only { "ro" } else { "rw" }]);
        let mut st = self.lock();
        Self::bind_locked(&mut st, &source, target.clone(), &opts, FakeOp::BindMount)?;
        st.log.push(FakeAction::BindMount {
            source,
            target,
            read_only,
        });
        Ok(())
    }

    fn remount(&self, target: &Path, options: &[&str]) -> Result<(), MountError> {
        let target = normalize(target);
        let opts = MountOptions::parse(options);
        let mut st = self.lock();
        Self::check_symlinks(&st, &target)?;
        if opts.is_bind() && !opts.data.is_empty() {
            return Err(MountError::InvalidArgument {
                what: "options",
                reason: "filesystem options need a remount without bind",
            });
        }
        Self::remount_locked(&mut st, &target, &opts).map_err(|errno| MountError::Remount {
            target: target.clone(),
            options: RedactedOptions::new(options, &[]),
            errno,
        })?;
        st.log.push(FakeAction::Remount {
            target,
            options: options.iter().map(|s| s.to_string()).collect(),
        });
        Ok(())
    }

    fn move_mount(&self, from: &Path, to: &Path) -> Result<(), MountError> {
        let (from, to) = (normalize(from), normalize(to));
        let mut st = self.lock();
        Self::check_symlinks(&st, &from)?;
        Self::check_symlinks(&st, &to)?;
        let err = |errno| MountError::moving(&from, &to, errno);
        Self::check(&st, FakeOp::Mount, &to).map_err(err)?;
        let idx = Self::top(&st, &from).ok_or_else(|| err(Errno::EINVAL))?;
        // The id stays; what was mounted below `from` moves along.
        for (i, m) in st.mounts.iter_mut().enumerate() {
            // Mounts stacked below it at `from` stay.
            if i == idx || (m.mount_point != from && m.mount_point.starts_with(&from)) {
                let rest = m.mount_point.strip_prefix(&from).map(Path::to_path_buf);
                if let Ok(rest) = rest {
                    m.mount_point = if rest.as_os_str().is_empty() {
                        to.clone()
                    } else {
                        to.join(rest)
                    };
                }
            }
        }
        // The moved mount is now the topmost at `to`.
        let moved = st.mounts.remove(idx);
        st.mounts.push(moved);
        st.log.push(FakeAction::Move { from, to });
        Ok(())
    }

    fn unmount(&self, target: &Path, lazy: bool) -> Result<(), MountError> {
        let target = normalize(target);
        let mut st = self.lock();
        Self::check_symlinks(&st, &target)?;
        let err = |errno| MountError::Unmount {
            target: target.clone(),
            errno,
        };
        Self::check(&st, FakeOp::Unmount, &target).map_err(err)?;
        let Some(idx) = Self::top(&st, &target) else {
            return Ok(());
        };
        let below = |m: &MountInfo| m.mount_point != target && m.mount_point.starts_with(&target);
        if lazy {
            st.mounts.retain(|m| !below(m));
            let idx = Self::top(&st, &target).unwrap_or(idx);
            st.mounts.remove(idx);
        } else if st.mounts.iter().any(below) {
            return Err(err(Errno::EBUSY));
        } else {
            st.mounts.remove(idx);
        }
        let live: BTreeSet<u32> = st.mounts.iter().map(|m| m.mount_id).collect();
        st.device_nodes.retain(|id, _| live.contains(id));
        if Self::top(&st, &target).is_none() {
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

    /// Corrupted mounts are still reported, as Linux finds them in mountinfo.
    fn mounted_at(&self, path: &Path) -> Result<Option<MountInfo>, MountError> {
        let path = normalize(path);
        let st = self.lock();
        match Self::stat(&st, &path) {
            Ok(()) => {}
            Err(MountError::Stat { errno, .. }) if is_corrupted_mount_errno(errno) => {}
            Err(e) => return Err(e),
        }
        Ok(Self::top(&st, &path).map(|i| st.mounts[i].clone()))
    }

    fn block_device_at(&self, path: &Path) -> Result<Option<DeviceNumber>, MountError> {
        let path = normalize(path);
        let st = self.lock();
        Self::stat(&st, &path)?;
        Ok(match Self::top(&st, &path) {
            Some(i) => st.device_nodes.get(&st.mounts[i].mount_id).copied(),
            None => Self::device_node(&st, &path),
        })
    }

    fn bind_source(&self, source: &Path) -> Result<MountSource, MountError> {
        let source = normalize(source);
        let st = self.lock();
        Self::check_symlinks(&st, &source)?;
        let (entry, node) = Self::resolve_bind(&st, &source);
        Ok(match node {
            Some(d) => MountSource::DeviceNode(d),
            None => MountSource::of_mount(&entry),
        })
    }

    fn is_mount_point(&self, path: &Path) -> Result<bool, MountError> {
        let path = normalize(path);
        let st = self.lock();
        Self::stat(&st, &path)?;
        Ok(Self::top(&st, &path).is_some())
    }

    /// Exact in the fake (it has no device numbers to compare).
    fn is_likely_not_mount_point(&self, path: &Path) -> Result<bool, MountError> {
        self.is_mount_point(path).map(|m| !m)
    }

    fn mount_refs(&self, path: &Path) -> Result<Vec<PathBuf>, MountError> {
        let path = normalize(path);
        Self::check_symlinks(&self.lock(), &path)?;
        let mounts = self.mount_points()?;
        Ok(refs_in(&mounts, &path))
    }

    fn cleanup_mount_point(&self, path: &Path) -> Result<(), MountError> {
        let path = normalize(path);
        for _ in 0..MAX_STACKED_UNMOUNTS {
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
                return self.remove_locked(&path);
            }
            self.unmount(&path, false)?;
        }
        // Same bound as the real one; an injected stat error never clears.
        Err(MountError::StillMounted {
            path,
            attempts: MAX_STACKED_UNMOUNTS,
        })
    }

    fn remove_mount_point(&self, path: &Path) -> Result<(), MountError> {
        self.remove_locked(&normalize(path))
    }

    fn fs_usage(&self, path: &Path) -> Result<FsUsage, MountError> {
        let path = normalize(path);
        let st = self.lock();
        Self::stat(&st, &path)?;
        let registered = st
            .usage
            .iter()
            .filter(|(p, _)| path.starts_with(p))
            .max_by_key(|(p, _)| p.components().count())
            .map(|(_, u)| *u);
        if let Some(u) = registered {
            return Ok(u);
        }
        let vfs = nix::sys::statvfs::statvfs(&path).map_err(|errno| MountError::Stat {
            path: path.clone(),
            errno,
        })?;
        Ok(FsUsage::from_statvfs(&vfs))
    }
}

/// The per-mount options of an entry after applying `opts` to `current`:
/// `ro`/`rw` first, then `nosuid`, `nodev`, `noexec` as set.
fn per_mount_options(opts: &MountOptions, current: &[String]) -> Vec<String> {
    use nix::mount::MsFlags as F;
    let has = |name: &str| current.iter().any(|o| o == name);
    let state = |flag: F, name: &str| {
        if opts.flags.contains(flag) {
            true
        } else if opts.cleared.contains(flag) {
            false
        } else {
            has(name)
        }
    };
    let mut out = vec![
        if state(F::MS_RDONLY, "ro") {
            "ro"
        } else {
            "rw"
        }
        .to_string(),
    ];
    for (flag, name) in [
        (F::MS_NOSUID, "nosuid"),
        (F::MS_NODEV, "nodev"),
        (F::MS_NOEXEC, "noexec"),
    ] {
        if state(flag, name) {
            out.push(name.into());
        }
    }
    out
}

fn bind_error(source: &Path, target: &Path, opts: &MountOptions, errno: Errno) -> MountError {
    let mut names = vec!["bind"];
    if opts.is_read_only() {
        names.push("ro");
    }
    MountError::Mount {
        device: source.display().to_string(),
        target: target.to_path_buf(),
        fstype: String::new(),
        options: RedactedOptions::from_flag_names(names),
        errno,
    }
}

fn next_id(st: &mut State) -> u32 {
    st.next_id += 1;
    st.next_id + 100
}

fn parent_of(st: &State, target: &Path) -> u32 {
    // `max_by_key` keeps the last of equal keys: in table order, the top.
    st.mounts
        .iter()
        .filter(|m| m.mount_point != target && target.starts_with(&m.mount_point))
        .max_by_key(|m| m.mount_point.components().count())
        .map_or(1, |m| m.mount_id)
}

fn blank_entry() -> MountInfo {
    MountInfo {
        mount_id: 0,
        parent_id: 0,
        major: 0,
        minor: 0,
        root: PathBuf::from("/"),
        mount_point: PathBuf::new(),
        mount_options: Vec::new(),
        optional_fields: Vec::new(),
        fs_type: String::new(),
        source: String::new(),
        super_options: vec!["rw".into()],
    }
}

/// The device a filesystem mounted from `source` shows.
fn device_for_source(st: &mut State, source: &str) -> DeviceNumber {
    let path = Path::new(source);
    if let Some(d) = FakeMounter::device_node(st, &normalize(path)) {
        return d;
    }
    if source.starts_with('/')
        && let Some(d) = st.source_devices.get(source)
    {
        return *d;
    }
    st.next_anon += 1;
    let d = DeviceNumber::new(0, FIRST_ANON_MINOR + st.next_anon);
    if source.starts_with('/') {
        st.source_devices.insert(source.to_owned(), d);
    }
    d
}

/// Adds a filesystem mount.
fn add_entry(
    st: &mut State,
    source: &str,
    target: PathBuf,
    fs_type: &str,
    mount_options: Vec<String>,
) {
    let device = device_for_source(st, source);
    let id = next_id(st);
    let parent_id = parent_of(st, &target);
    st.mounts.push(MountInfo {
        mount_id: id,
        parent_id,
        major: device.major,
        minor: device.minor,
        mount_point: target,
        mount_options,
        fs_type: fs_type.into(),
        source: source.into(),
        ..blank_entry()
    });
}

#[cfg(test)]
mod tests;
