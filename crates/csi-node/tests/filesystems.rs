//! NodeService for drivers whose volumes are filesystems mounted by type,
//! source and options: an NFS-like one with a password from the NodeStage
//! secrets, and tmpfs. On a fake host. The secret must reach the mount call
//! and nothing else (logs of this whole test binary, errors, records); a
//! mount whose identity exists only once mounted is recognised after a
//! crash by the id of the mount the plugin made, never by its source.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use csi_driver::{CallContext, Method, Node};
use csi_node::testing::FakeHost;
use csi_node::testing::requests::*;
use csi_node::{
    FilesystemSource, NodeBackend, NodeError, NodeInfo, NodeService, NodeVolumeRecord,
    STAGED_TABLE, StageRecord, StageState, VolumeContexts, VolumeInfo, VolumeLocator, VolumeSource,
};
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::*;
use csi_store::{FakeStore, RecordStore};
use mount_utils::{Errno, FakeAction, FakeOp, FakeResolver, FuseConnection, Mounter};
use std::os::fd::AsRawFd;
use tonic::Code;

const SECRET: &str = "hunter2-e1f0c3";

/// Every log line of this test binary, at every level.
fn logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(csi_node::testing::requests::capture_all_logs)
}

fn assert_no_secret(what: &str, text: &str) {
    assert!(
        !text.contains(SECRET),
        "the secret leaked into {what}: {text}"
    );
}

/// An NFS-like driver: the share from the volume context, a password from
/// the NodeStage secrets.
struct Nfs;

impl VolumeLocator for Nfs {
    fn source_in(
        &self,
        _volume_id: &str,
        contexts: &VolumeContexts,
    ) -> Result<Option<VolumeSource>, NodeError> {
        let share = format!(
            "{}:{}",
            contexts.volume("server")?,
            contexts.volume("share")?
        );
        let fs = FilesystemSource::new("nfs", share)
            .options(["vers=4.1"])
            .secret_option("password");
        Ok(Some(VolumeSource::Filesystem(fs)))
    }
}

impl NodeBackend for Nfs {
    fn volume_in(&self, _: &str, _: &VolumeContexts) -> Result<Option<VolumeInfo>, NodeError> {
        Ok(Some(VolumeInfo::new(false, 0)))
    }
}

/// A tmpfs driver: every volume is a fresh tmpfs.
struct Tmpfs;

impl VolumeLocator for Tmpfs {
    fn source(&self, _volume_id: &str) -> Option<VolumeSource> {
        let fs = FilesystemSource::new("tmpfs", "tmpfs").options(["size=1m"]);
        Some(VolumeSource::Filesystem(fs))
    }
}

impl NodeBackend for Tmpfs {
    fn volume(&self, _: &str) -> Option<VolumeInfo> {
        Some(VolumeInfo::new(false, 1 << 20))
    }
}

/// A FUSE driver: each volume an in-memory filesystem its daemon serves
/// (here: the connections are kept, as a daemon would hold them).
#[derive(Clone, Default)]
struct Fuse {
    /// (volume, descriptor number) of each connection served.
    served: Arc<Mutex<Vec<(String, i32)>>>,
    connections: Arc<Mutex<Vec<FuseConnection>>>,
}

impl VolumeLocator for Fuse {
    fn source(&self, volume_id: &str) -> Option<VolumeSource> {
        let fs = FilesystemSource::new("fuse.memfs", format!("memfs:{volume_id}"));
        Some(VolumeSource::Filesystem(
            fs.options(["default_permissions"]),
        ))
    }

    fn serve_fuse(
        &self,
        volume_id: &str,
        _source: &FilesystemSource,
        connection: FuseConnection,
    ) -> Result<(), NodeError> {
        let fd = connection.as_raw_fd();
        self.served.lock().unwrap().push((volume_id.into(), fd));
        self.connections.lock().unwrap().push(connection);
        Ok(())
    }
}

impl NodeBackend for Fuse {
    fn volume(&self, _: &str) -> Option<VolumeInfo> {
        Some(VolumeInfo::new(false, 0))
    }
}

/// A FUSE volume's source from a driver that serves no FUSE filesystem.
struct FuseUnserved;

impl VolumeLocator for FuseUnserved {
    fn source(&self, volume_id: &str) -> Option<VolumeSource> {
        let fs = FilesystemSource::new("fuse.memfs", format!("memfs:{volume_id}"));
        Some(VolumeSource::Filesystem(fs))
    }
}

impl NodeBackend for FuseUnserved {
    fn volume(&self, _: &str) -> Option<VolumeInfo> {
        Some(VolumeInfo::new(false, 0))
    }
}

struct World {
    host: FakeHost,
    store: Arc<FakeStore>,
    dns: Arc<FakeResolver>,
    dir: tempfile::TempDir,
}

impl World {
    fn new() -> Self {
        World {
            host: FakeHost::new(),
            store: Arc::new(FakeStore::new()),
            dns: Arc::new(FakeResolver::new()),
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn private(&self) -> PathBuf {
        self.dir.path().join("private")
    }

    /// A node service (a new process after a crash: same host and store).
    fn node<D: NodeBackend>(&self, driver: D) -> NodeService<D> {
        let private = self.private();
        NodeService::builder(Arc::new(driver), NodeInfo::new("n1"), self.host.mounter())
            .volumes(|v| {
                let v = v.loop_devices(self.host.loops()).private_mounts(private);
                // The fake mounter takes any descriptor for a FUSE connection.
                v.resolver(self.dns.clone()).fuse_device("/dev/null")
            })
            .open(self.store.clone())
            .unwrap()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn records_text(&self) -> String {
        let staged = self.store.scan(STAGED_TABLE).unwrap();
        let published = self.store.scan(csi_node::PUBLISHED_TABLE).unwrap();
        format!("{staged:?} {published:?}")
    }

    /// What is mounted besides the private root (a mount of itself, kept
    /// for the plugin's life).
    fn leftovers(&self) -> Vec<PathBuf> {
        let mut left = self.host.mounted();
        left.retain(|p| p != &self.private());
        left
    }

    fn mounts(&self) -> usize {
        let actions = self.host.actions();
        actions
            .iter()
            .filter(|a| matches!(a, FakeAction::Mount { .. }))
            .count()
    }
}

fn ctx() -> CallContext {
    CallContext::detached(0, Method::NodeStageVolume)
}

/// Unpublishes `target` (when given) and unstages `id`: nothing of it may
/// be left, mounted or recorded.
async fn tear_down<D: NodeBackend>(
    w: &World,
    node: &NodeService<D>,
    id: &str,
    staging: &Path,
    target: Option<&Path>,
) {
    if let Some(target) = target {
        node.node_unpublish_volume(&ctx(), unpublish_req(id, target))
            .await
            .unwrap();
    }
    node.node_unstage_volume(&ctx(), unstage_req(id, staging))
        .await
        .unwrap();
    assert!(w.leftovers().is_empty() && node.volumes().records().is_empty());
}

fn nfs_stage(id: &str, staging: &Path, secret: Option<&str>) -> NodeStageVolumeRequest {
    nfs_stage_from("10.0.0.7", id, staging, secret)
}

fn nfs_stage_from(
    server: &str,
    id: &str,
    staging: &Path,
    secret: Option<&str>,
) -> NodeStageVolumeRequest {
    let mut req = stage_req(id, staging, cap(false, Mode::MultiNodeMultiWriter, &[]));
    req.volume_context = [
        ("server".to_string(), server.to_string()),
        ("share".to_string(), "/exports/a".to_string()),
    ]
    .into();
    if let Some(s) = secret {
        req.secrets.insert("password".into(), s.into());
    }
    req
}

#[tokio::test]
async fn an_nfs_like_volume_gets_its_password_in_the_mount_call_only() {
    logs();
    let w = World::new();
    let node = w.node(Nfs);
    let (staging, target) = (w.path("staging"), w.path("pod"));

    // A missing secret names its key; nothing is mounted or kept.
    let e = node
        .node_stage_volume(&ctx(), nfs_stage("v1", &staging, None))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    assert!(e.to_string().contains("secrets[password]"), "{e}");
    assert!(w.leftovers().is_empty() && node.volumes().records().is_empty());

    // A mount that fails: the error carries no option value.
    let private_of_v1 = w.private().join("v1");
    w.host
        .inject_error(FakeOp::Mount, &private_of_v1, Errno::EACCES);
    let req = nfs_stage("v1", &staging, Some(SECRET));
    let e = node
        .node_stage_volume(&ctx(), req.clone())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Internal, "{e}");
    assert_no_secret("an error", &format!("{e} {e:?}"));
    assert!(
        node.volumes().records().is_empty(),
        "a failed first stage is undone"
    );
    w.host.clear_errors();

    node.node_stage_volume(&ctx(), req.clone()).await.unwrap();
    let here = w.host.mounts_at(&staging);
    assert_eq!(here.len(), 1);
    assert_eq!(
        (here[0].fs_type.as_str(), here[0].source.as_str()),
        ("nfs", "10.0.0.7:/exports/a")
    );
    let reached = w.host.actions().into_iter().any(|a| match a {
        FakeAction::Mount {
            sensitive_options,
            options,
            ..
        } => {
            options.contains(&"vers=4.1".to_string())
                && sensitive_options
                    .iter()
                    .any(|s| s.expose() == format!("password={SECRET}"))
        }
        _ => false,
    });
    assert!(reached, "the password reached the mount call");
    assert!(
        !private_of_v1.exists(),
        "the private directory is gone after the move"
    );
    node.node_stage_volume(&ctx(), req).await.unwrap();

    let mut publish = publish_req(
        "v1",
        &staging,
        &target,
        cap(false, Mode::MultiNodeMultiWriter, &[]),
    );
    publish.secrets.insert("password".into(), SECRET.into());
    node.node_publish_volume(&ctx(), publish).await.unwrap();
    assert_eq!(w.host.mounts_at(&target).len(), 1);
    let stats = node
        .node_get_volume_stats(&ctx(), stats_req("v1", &target))
        .await
        .unwrap();
    assert!(!stats.volume_condition.unwrap().abnormal);

    assert_no_secret("the records", &w.records_text());
    assert_no_secret(
        "the records' Debug",
        &format!("{:?}", node.volumes().records()),
    );
    tear_down(&w, &node, "v1", &staging, Some(&target)).await;
    let logged = String::from_utf8_lossy(&logs().lock().unwrap()).into_owned();
    assert!(logged.contains("staged"), "logs are captured");
    assert_no_secret("the logs", &logged);
}

/// The options of every mount call so far.
fn mount_options(w: &World) -> Vec<Vec<String>> {
    let actions = w.host.actions().into_iter();
    let options = actions.filter_map(|a| match a {
        FakeAction::Mount { options, .. } => Some(options),
        _ => None,
    });
    options.collect()
}

#[tokio::test]
async fn an_nfs_server_named_by_host_is_mounted_by_its_address() {
    logs();
    let w = World::new();
    w.dns.add("files.example", &["10.0.0.9", "fd00::9"]);
    let node = w.node(Nfs);
    let staging = w.path("staging");

    // A host that does not resolve: UNAVAILABLE naming it, before any effect.
    let req = nfs_stage_from("gone.example", "v1", &staging, Some(SECRET));
    let e = node.node_stage_volume(&ctx(), req).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    assert!(e.to_string().contains("gone.example"), "{e}");
    assert_no_secret("an error", &format!("{e} {e:?}"));
    assert_eq!(w.mounts(), 0);
    assert!(w.leftovers().is_empty() && node.volumes().records().is_empty());
    assert!(!w.private().join("v1").exists());

    // The kernel gets the first address as addr=; the record keeps the
    // source as the driver gave it, so a later mount looks it up again.
    let req = nfs_stage_from("files.example", "v1", &staging, Some(SECRET));
    node.node_stage_volume(&ctx(), req).await.unwrap();
    assert_eq!(w.dns.lookups(), ["gone.example", "files.example"]);
    let calls = mount_options(&w);
    let nfs = calls.iter().find(|o| o.contains(&"vers=4.1".to_string()));
    let nfs = nfs.expect("the nfs mount call");
    assert!(nfs.contains(&"addr=10.0.0.9".to_string()), "{nfs:?}");
    let here = w.host.mounts_at(&staging);
    assert_eq!(here[0].source, "files.example:/exports/a");
    let staged = node.volumes().records();
    let stage = staged.get("v1").and_then(|r| r.stage.as_ref());
    let Some(VolumeSource::Filesystem(fs)) = stage.map(|s| &s.source) else {
        panic!("a filesystem stage record: {staged:?}");
    };
    assert_eq!(fs.source, "files.example:/exports/a");
    assert!(!format!("{staged:?}").contains("10.0.0.9"));

    tear_down(&w, &node, "v1", &staging, None).await;
}

#[tokio::test]
async fn a_fuse_volume_is_mounted_through_a_connection_its_driver_serves() {
    logs();
    let w = World::new();
    let driver = Fuse::default();
    let node = w.node(driver.clone());
    let (staging, target) = (w.path("staging"), w.path("pod"));
    let c = cap(false, Mode::SingleNodeWriter, &[]);
    node.node_stage_volume(&ctx(), stage_req("f1", &staging, c.clone()))
        .await
        .unwrap();

    let served = driver.served.lock().unwrap().clone();
    let [(volume, fd)] = served.as_slice() else {
        panic!("one connection served: {served:?}");
    };
    assert_eq!(volume, "f1");
    let calls = mount_options(&w);
    let fuse = calls
        .iter()
        .find(|o| o.contains(&"default_permissions".to_string()));
    let fuse = fuse.expect("the FUSE mount call");
    for option in [format!("fd={fd}"), "rootmode=40000".into()] {
        assert!(fuse.contains(&option), "{option} in {fuse:?}");
    }
    assert!(fuse.iter().any(|o| o.starts_with("user_id=")), "{fuse:?}");
    assert!(fuse.iter().any(|o| o.starts_with("group_id=")), "{fuse:?}");
    let here = w.host.mounts_at(&staging);
    assert_eq!(here.len(), 1);
    assert_eq!(here[0].fs_type, "fuse.memfs");
    assert!(!w.records_text().contains("fd="), "{}", w.records_text());

    // A repeat finds the mount by its id and mounts nothing.
    let mounts = w.mounts();
    node.node_stage_volume(&ctx(), stage_req("f1", &staging, c.clone()))
        .await
        .unwrap();
    assert_eq!(w.mounts(), mounts);
    let publish = publish_req("f1", &staging, &target, c);
    node.node_publish_volume(&ctx(), publish).await.unwrap();
    assert_eq!(w.host.mounts_at(&target).len(), 1);
    tear_down(&w, &node, "f1", &staging, Some(&target)).await;
    assert_eq!(driver.served.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_driver_that_serves_no_fuse_filesystem_is_refused_and_nothing_is_left() {
    logs();
    let w = World::new();
    let node = w.node(FuseUnserved);
    let staging = w.path("staging");
    let c = cap(false, Mode::SingleNodeWriter, &[]);
    let e = node
        .node_stage_volume(&ctx(), stage_req("f1", &staging, c))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
    assert!(
        e.to_string().contains("f1") && e.to_string().contains("FUSE"),
        "{e}"
    );
    assert!(w.leftovers().is_empty(), "{:?}", w.host.mounted());
    assert!(node.volumes().records().is_empty());
    assert!(!w.private().join("f1").exists());
}

#[tokio::test]
async fn a_fuse_mount_a_crash_left_in_the_private_directory_is_made_anew() {
    logs();
    let w = World::new();
    let driver = Fuse::default();
    let staging = w.path("staging");
    let c = cap(false, Mode::SingleNodeWriter, &[]);
    let first = w.node(driver.clone());
    first
        .node_stage_volume(&ctx(), stage_req("f1", &staging, c.clone()))
        .await
        .unwrap();
    let old = w.host.mounts_at(&staging)[0].mount_id;
    drop(first);
    // The crash came after the mount, before its id was saved and it moved.
    let private = w.private().join("f1");
    std::fs::create_dir_all(&private).unwrap();
    w.host.move_mount(&staging, &private).unwrap();
    crash_record(&w, "f1", &staging, None);

    let node = w.node(driver.clone());
    node.restore();
    node.node_stage_volume(&ctx(), stage_req("f1", &staging, c))
        .await
        .unwrap();
    let here = w.host.mounts_at(&staging);
    assert_eq!(here.len(), 1, "{here:?}");
    assert_ne!(here[0].mount_id, old, "a new mount, served anew");
    assert_eq!(driver.served.lock().unwrap().len(), 2);
    assert!(w.host.mounts_at(&private).is_empty());
    tear_down(&w, &node, "f1", &staging, None).await;
}

async fn stats_of<D: NodeBackend>(
    node: &NodeService<D>,
    path: &Path,
) -> NodeGetVolumeStatsResponse {
    let ctx = ctx();
    let stats = node.node_get_volume_stats(&ctx, stats_req("t1", path));
    stats.await.unwrap()
}

#[tokio::test]
async fn a_filesystem_that_fails_as_a_broken_mount_makes_the_volume_abnormal() {
    logs();
    let w = World::new();
    let node = w.node(Tmpfs);
    let (staging, target) = (w.path("staging"), w.path("pod"));
    let c = cap(false, Mode::SingleNodeWriter, &[]);
    node.node_stage_volume(&ctx(), stage_req("t1", &staging, c.clone()))
        .await
        .unwrap();
    let publish = publish_req("t1", &staging, &target, c);
    node.node_publish_volume(&ctx(), publish).await.unwrap();
    let condition = stats_of(&node, &target).await.volume_condition.unwrap();
    assert!(!condition.abnormal, "{condition:?}");

    // Its server went away: statvfs fails with ENOTCONN.
    w.host.inject_error(FakeOp::Stat, &target, Errno::ENOTCONN);
    let stats = stats_of(&node, &target).await;
    let condition = stats.volume_condition.clone().unwrap();
    assert!(condition.abnormal, "{condition:?}");
    assert!(
        condition.message.contains(&target.display().to_string()),
        "{condition:?}"
    );
    assert!(stats.usage.is_empty());
    w.host.clear_errors();
    tear_down(&w, &node, "t1", &staging, Some(&target)).await;
}

#[tokio::test]
async fn a_tmpfs_volume_is_staged_published_and_cleaned_up() {
    logs();
    let w = World::new();
    let node = w.node(Tmpfs);
    let (staging, target) = (w.path("staging"), w.path("pod"));
    let c = cap(false, Mode::SingleNodeWriter, &[]);
    // The CO passes the NodeStage secrets to every driver: a tmpfs has no
    // use for them, and they reach no record or log either.
    let mut stage = stage_req("t1", &staging, c.clone());
    stage.secrets.insert("password".into(), SECRET.into());
    node.node_stage_volume(&ctx(), stage).await.unwrap();
    assert_no_secret("the records", &w.records_text());
    let staged = w.host.mounts_at(&staging);
    assert_eq!(staged.len(), 1);
    assert_eq!(staged[0].fs_type, "tmpfs");
    let record = node.volumes().record("t1").unwrap().stage.unwrap();
    assert_eq!(
        record.mount_id,
        Some(staged[0].mount_id),
        "the id survives the move"
    );

    let block = stage_req(
        "t2",
        &w.path("other"),
        cap(true, Mode::SingleNodeWriter, &[]),
    );
    let e = node.node_stage_volume(&ctx(), block).await.unwrap_err();
    assert_eq!(
        e.code(),
        Code::FailedPrecondition,
        "a filesystem has no block access"
    );

    node.node_publish_volume(&ctx(), publish_req("t1", &staging, &target, c))
        .await
        .unwrap();
    // Still in use: unstage refuses.
    let e = node
        .node_unstage_volume(&ctx(), unstage_req("t1", &staging))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    tear_down(&w, &node, "t1", &staging, Some(&target)).await;
    assert!(!staging.exists() || std::fs::read_dir(&staging).unwrap().next().is_none());
    let logged = String::from_utf8_lossy(&logs().lock().unwrap()).into_owned();
    assert_no_secret("the logs", &logged);
}

/// The record as a crash left it: the intent saved, then the process died
/// (`mount_id` as saved by then).
fn crash_record(w: &World, id: &str, staging: &Path, mount_id: Option<u32>) {
    let table =
        csi_store::Table::<StageRecord>::with_shared(w.store.clone(), STAGED_TABLE).unwrap();
    let mut stage = table.get(id).unwrap().unwrap();
    stage.state = StageState::Staging;
    stage.mount_id = mount_id;
    assert_eq!(stage.path, staging);
    table.put(id, &stage).unwrap();
}

/// Stages `t1` with a first process, then makes the world what a crash at
/// `moved` (after the move) or before it (the mount still in the private
/// directory) leaves: the record says `Staging`.
async fn crashed_stage(w: &World, moved: bool, id_saved: bool) -> (PathBuf, u32) {
    let staging = w.path("staging");
    let first = w.node(Tmpfs);
    let c = cap(false, Mode::SingleNodeWriter, &[]);
    first
        .node_stage_volume(&ctx(), stage_req("t1", &staging, c))
        .await
        .unwrap();
    let mount_id = w.host.mounts_at(&staging)[0].mount_id;
    drop(first);
    if !moved {
        let private = w.private().join("t1");
        std::fs::create_dir_all(&private).unwrap();
        w.host.move_mount(&staging, &private).unwrap();
    }
    crash_record(w, "t1", &staging, id_saved.then_some(mount_id));
    (staging, mount_id)
}

#[tokio::test]
async fn a_crash_after_the_mount_before_the_record_says_so_is_finished_by_the_retry() {
    logs();
    for (moved, id_saved) in [(false, false), (false, true), (true, true)] {
        let w = World::new();
        let (staging, mount_id) = crashed_stage(&w, moved, id_saved).await;
        let mounts = w.mounts();
        let node = w.node(Tmpfs);
        let report = node.restore();
        assert!(report.abnormal.is_empty(), "{report:?}");
        let c = cap(false, Mode::SingleNodeWriter, &[]);
        node.node_stage_volume(&ctx(), stage_req("t1", &staging, c))
            .await
            .unwrap();
        let here = w.host.mounts_at(&staging);
        assert_eq!(here.len(), 1, "moved {moved} id saved {id_saved}");
        assert_eq!(
            here[0].mount_id, mount_id,
            "the same mount, recognised by its id"
        );
        assert_eq!(w.mounts(), mounts, "nothing mounted again");
        let stage = node.volumes().record("t1").unwrap().stage.unwrap();
        assert_eq!(
            (stage.state, stage.mount_id),
            (StageState::Staged, Some(mount_id))
        );
        node.node_unstage_volume(&ctx(), unstage_req("t1", &staging))
            .await
            .unwrap();
        assert!(w.leftovers().is_empty());
    }
}

#[tokio::test]
async fn a_crash_after_the_mount_is_cleaned_up_by_unstage() {
    logs();
    for (moved, id_saved) in [(false, false), (true, true)] {
        let w = World::new();
        let (staging, _) = crashed_stage(&w, moved, id_saved).await;
        let node = w.node(Tmpfs);
        node.restore();
        node.node_unstage_volume(&ctx(), unstage_req("t1", &staging))
            .await
            .unwrap();
        assert!(
            w.leftovers().is_empty(),
            "moved {moved}: {:?}",
            w.host.mounted()
        );
        assert!(!w.private().join("t1").exists());
        assert!(node.volumes().records().is_empty());
    }
}

#[tokio::test]
async fn a_tmpfs_someone_else_mounted_is_not_ours_whatever_its_source() {
    logs();
    let w = World::new();
    let (staging, _) = crashed_stage(&w, true, false).await;
    // The crash lost the id; the mount there now has the same type and
    // source string as ours, but nothing proves it is.
    w.host.unmount(&staging, false).unwrap();
    w.host
        .mount("tmpfs", &staging, "tmpfs", &["size=1m"])
        .unwrap();
    let node = w.node(Tmpfs);
    let c = cap(false, Mode::SingleNodeWriter, &[]);
    let e = node
        .node_stage_volume(&ctx(), stage_req("t1", &staging, c))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e}");
    let e = node
        .node_unstage_volume(&ctx(), unstage_req("t1", &staging))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
    assert_eq!(w.host.mounts_at(&staging).len(), 1, "left alone");
    let record: Option<NodeVolumeRecord> = node.volumes().record("t1");
    assert!(record.is_some(), "kept for a later cleanup");
}
