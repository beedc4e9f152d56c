//! NodeService, the ready Node service, with a fake driver on a fake host
//! (no root): what it adds over NodeVolumes (the driver's volumes, access
//! types, inline ephemeral volumes, stats, expansion, NodeGetInfo). The
//! record's own rules are in fakes.rs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_driver::request::EPHEMERAL_CONTEXT_KEY;
use csi_driver::{CallContext, Capabilities, CsiError, CsiResult, Method, Node, PluginInfo};
use csi_node::testing::FakeHost;
use csi_node::testing::requests::*;
use csi_node::{NodeBackend, NodeInfo, NodeService, VolumeInfo, VolumeLocator, VolumeSource};
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::*;
use csi_store::FakeStore;
use mount_utils::{Errno, ExecOutput, FakeExec, FakeOp, FsUsage, Mounter, ResizeFs};
use tonic::Code;

const MIB: i64 = 1 << 20;

/// Volumes under a temp dir: `<id>` directories (mount) and `<id>.img`
/// files (block, or mount when the id starts with `fs-`).
struct Fake {
    base: PathBuf,
    volumes: Mutex<BTreeMap<String, VolumeInfo>>,
    retired: Mutex<BTreeSet<String>>,
    lock: tokio::sync::RwLock<()>,
}

impl Fake {
    fn add(&self, id: &str, block: bool) -> String {
        if block || id.starts_with("fs-") {
            let f = std::fs::File::create(self.base.join(format!("{id}.img"))).unwrap();
            f.set_len(MIB as u64).unwrap();
        } else {
            std::fs::create_dir(self.base.join(id)).unwrap();
        }
        let info = VolumeInfo::new(block, MIB);
        self.volumes.lock().unwrap().insert(id.into(), info);
        id.into()
    }
}

impl VolumeLocator for Fake {
    fn source(&self, id: &str) -> Option<VolumeSource> {
        self.volumes.lock().unwrap().get(id)?;
        let dir = self.base.join(id);
        Some(if dir.is_dir() {
            VolumeSource::Directory(dir)
        } else {
            VolumeSource::Image(self.base.join(format!("{id}.img")))
        })
    }
}

impl NodeBackend for Fake {
    fn volume(&self, id: &str) -> Option<VolumeInfo> {
        self.volumes.lock().unwrap().get(id).copied()
    }

    fn check_stage(&self, req: &NodeStageVolumeRequest) -> CsiResult<()> {
        match req.publish_context.get("disk") {
            Some(d) if d != &req.volume_id => Err(CsiError::invalid(
                "publish_context[disk]",
                "not this volume",
            )),
            _ => Ok(()),
        }
    }

    fn stage_lock(&self) -> Option<&tokio::sync::RwLock<()>> {
        Some(&self.lock)
    }

    fn ephemeral_volume(
        &self,
        name: &str,
        _: &NodePublishVolumeRequest,
    ) -> CsiResult<(VolumeInfo, bool)> {
        let created = self.volume(name).is_none();
        if created {
            self.add(name, false);
        }
        Ok((self.volume(name).unwrap(), created))
    }

    fn is_ephemeral(&self, name: &str) -> bool {
        name.starts_with("inline-") && self.volume(name).is_some()
    }

    fn remove_ephemeral(&self, name: &str) -> CsiResult<()> {
        self.volumes.lock().unwrap().remove(name);
        std::fs::remove_dir(self.base.join(name)).unwrap();
        self.retired.lock().unwrap().insert(name.into());
        Ok(())
    }

    fn ephemeral_retired(&self, name: &str) -> bool {
        self.retired.lock().unwrap().contains(name)
    }
}

struct Env {
    dir: tempfile::TempDir,
    host: FakeHost,
    fake: Arc<Fake>,
    node: NodeService<Fake>,
}

/// A fake driver with no volumes yet, keeping them under `dir/volumes`.
fn fake_in(dir: &Path) -> Arc<Fake> {
    let base = dir.join("volumes");
    std::fs::create_dir(&base).unwrap();
    Arc::new(Fake {
        base,
        volumes: Mutex::default(),
        retired: Mutex::default(),
        lock: tokio::sync::RwLock::new(()),
    })
}

fn env_with(info: NodeInfo, resizer: Option<ResizeFs>) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let host = FakeHost::new();
    let fake = fake_in(dir.path());
    let b = NodeService::builder(fake.clone(), info, host.mounter());
    // Every device seam is the fake host's: nothing here reads the real /dev.
    let mut b = b.volumes(|v| {
        v.loop_devices(host.loops())
            .block_devices(host.block_devices())
    });
    if let Some(r) = resizer {
        b = b.resize_filesystems(r);
    }
    let node = b.open(Arc::new(FakeStore::new())).unwrap();
    Env {
        dir,
        host,
        fake,
        node,
    }
}

fn env() -> Env {
    env_with(NodeInfo::new("n1"), None)
}

impl Env {
    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }
}

fn ctx() -> CallContext {
    let info = PluginInfo::new("fake.csi.csi-kit.dev", "test").unwrap();
    CallContext::for_test(Method::NodeStageVolume, info, Capabilities::new())
}

fn code<T>(r: CsiResult<T>) -> Code {
    r.err().map_or(Code::Ok, |e| e.code())
}

#[tokio::test]
async fn a_capability_of_the_other_access_type_is_failed_precondition() {
    let e = env();
    // (volume is block, capability is block, expected)
    let table = [
        (false, false, Code::Ok),
        (false, true, Code::FailedPrecondition),
        (true, false, Code::FailedPrecondition),
        (true, true, Code::Ok),
    ];
    for (i, (vol_block, cap_block, want)) in table.into_iter().enumerate() {
        let id = e.fake.add(&format!("v{i}"), vol_block);
        let c = cap(cap_block, Mode::SingleNodeWriter, &[]);
        let staging = e.path(&format!("s{i}"));
        let got = code(
            e.node
                .node_stage_volume(&ctx(), stage_req(&id, &staging, c.clone()))
                .await,
        );
        assert_eq!(got, want, "stage, row {i}");
        let target = e.path(&format!("t{i}"));
        let publish = publish_req(&id, &staging, &target, c);
        let got = code(e.node.node_publish_volume(&ctx(), publish).await);
        assert_eq!(got, want, "publish, row {i}");
        if want != Code::Ok {
            assert!(e.host.mounts_at(&staging).is_empty() && e.host.attached() == 0);
        }
    }
}

#[tokio::test]
async fn a_volume_the_driver_does_not_have_is_not_found_and_the_driver_may_refuse_a_stage() {
    let e = env();
    let (s, t) = (e.path("s"), e.path("t"));
    let c = cap(false, Mode::SingleNodeWriter, &[]);
    let n = &e.node;
    let codes = [
        code(
            n.node_stage_volume(&ctx(), stage_req("gone", &s, c.clone()))
                .await,
        ),
        code(
            n.node_publish_volume(&ctx(), publish_req("gone", &s, &t, c.clone()))
                .await,
        ),
        code(n.node_get_volume_stats(&ctx(), stats_req("gone", &t)).await),
        code(
            n.node_expand_volume(
                &ctx(),
                NodeExpandVolumeRequest {
                    volume_id: "gone".into(),
                    volume_path: t.to_string_lossy().into(),
                    ..Default::default()
                },
            )
            .await,
        ),
    ];
    assert_eq!(codes, [Code::NotFound; 4]);
    let unstage = n.node_unstage_volume(&ctx(), unstage_req("gone", &s)).await;
    assert_eq!(code(unstage), Code::NotFound, "the record's answer");

    let id = e.fake.add("v", false);
    let mut req = stage_req(&id, &s, c);
    req.publish_context.insert("disk".into(), "other".into());
    assert_eq!(
        code(n.node_stage_volume(&ctx(), req).await),
        Code::InvalidArgument
    );
    assert!(e.host.mounted().is_empty());
    assert!(n.volumes().records().is_empty());
}

#[tokio::test]
async fn inline_ephemeral_volumes_live_from_first_publish_to_last_unpublish() {
    let e = env();
    let ephemeral = |target: &Path| {
        let mut req = publish_req(
            "inline-1",
            Path::new(""),
            target,
            cap(false, Mode::MultiNodeMultiWriter, &[]),
        );
        req.volume_context
            .insert(EPHEMERAL_CONTEXT_KEY.into(), "true".into());
        req
    };
    let (t1, t2) = (e.path("t1"), e.path("t2"));
    e.node
        .node_publish_volume(&ctx(), ephemeral(&t1))
        .await
        .unwrap();
    e.node
        .node_publish_volume(&ctx(), ephemeral(&t2))
        .await
        .unwrap();
    assert_eq!(e.host.mounted().len(), 2);
    e.node
        .node_unpublish_volume(&ctx(), unpublish_req("inline-1", &t1))
        .await
        .unwrap();
    assert!(e.fake.volume("inline-1").is_some(), "still published at t2");
    e.node
        .node_unpublish_volume(&ctx(), unpublish_req("inline-1", &t2))
        .await
        .unwrap();
    assert!(
        e.fake.volume("inline-1").is_none(),
        "removed with its last publication"
    );
    assert!(e.host.mounted().is_empty());
    // A repeat after it was removed is OK; an unknown name is NOT_FOUND.
    e.node
        .node_unpublish_volume(&ctx(), unpublish_req("inline-1", &t2))
        .await
        .unwrap();
    let unknown = e
        .node
        .node_unpublish_volume(&ctx(), unpublish_req("inline-2", &t2))
        .await;
    assert_eq!(code(unknown), Code::NotFound);

    // A publish that fails removes the volume it created.
    let file = e.path("user-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let mut req = ephemeral(&file);
    req.volume_id = "inline-3".into();
    assert!(e.node.node_publish_volume(&ctx(), req).await.is_err());
    assert!(e.fake.volume("inline-3").is_none());
    assert!(e.node.volumes().records().is_empty());
    assert_eq!(std::fs::read(&file).unwrap(), b"not a directory");
}

#[tokio::test]
async fn stats_report_the_condition_and_filesystem_or_device_size() {
    let e = env();
    let (m, b) = (e.fake.add("m", false), e.fake.add("b", true));
    let (sm, tm, sb) = (e.path("sm"), e.path("tm"), e.path("sb"));
    let mc = cap(false, Mode::SingleNodeWriter, &[]);
    e.node
        .node_stage_volume(&ctx(), stage_req(&m, &sm, mc.clone()))
        .await
        .unwrap();
    e.node
        .node_publish_volume(&ctx(), publish_req(&m, &sm, &tm, mc))
        .await
        .unwrap();
    let bc = cap(true, Mode::SingleNodeWriter, &[]);
    e.node
        .node_stage_volume(&ctx(), stage_req(&b, &sb, bc))
        .await
        .unwrap();
    e.host.fake().set_usage(
        &tm,
        FsUsage {
            total_bytes: 100,
            used_bytes: 40,
            total_inodes: 10,
            free_inodes: 9,
            ..FsUsage::default()
        },
    );

    let r = e
        .node
        .node_get_volume_stats(&ctx(), stats_req(&m, &tm))
        .await
        .unwrap();
    assert!(!r.volume_condition.unwrap().abnormal);
    let got: Vec<_> = r
        .usage
        .iter()
        .map(|u| (u.total, u.used, u.available, u.unit))
        .collect();
    assert_eq!(got, [(100, 40, 0, 1), (10, 0, 9, 2)]);
    let r = e
        .node
        .node_get_volume_stats(&ctx(), stats_req(&b, &sb))
        .await
        .unwrap();
    assert!(!r.volume_condition.unwrap().abnormal);
    assert_eq!(
        r.usage[0].total, MIB,
        "the image's size (fake devices have none)"
    );

    // Unmounted behind the plugin's back: abnormal, no usage.
    e.host.unmount(&tm, false).unwrap();
    let r = e
        .node
        .node_get_volume_stats(&ctx(), stats_req(&m, &tm))
        .await
        .unwrap();
    assert!(r.volume_condition.unwrap().abnormal);
    assert!(r.usage.is_empty());
    // Not this volume's path.
    let other = e
        .node
        .node_get_volume_stats(&ctx(), stats_req(&m, &sb))
        .await;
    assert_eq!(code(other), Code::NotFound);
}

#[tokio::test]
async fn expand_refreshes_the_device_and_grows_the_filesystem_when_asked() {
    let exec = Arc::new(FakeExec::new());
    let resizer = ResizeFs::new(exec.clone()).with_device_size_fn(|_| Ok(4 << 20));
    let e = env_with(NodeInfo::new("n1"), Some(resizer));
    let (d, b, f) = (
        e.fake.add("d", false),
        e.fake.add("b", true),
        e.fake.add("fs-1", false),
    );
    let expand = |id: &str, path: &Path| NodeExpandVolumeRequest {
        volume_id: id.into(),
        volume_path: path.to_string_lossy().into(),
        ..Default::default()
    };
    let (sd, sb, sf, sr) = (e.path("sd"), e.path("sb"), e.path("sf"), e.path("sr"));
    let mc = cap(false, Mode::SingleNodeWriter, &[]);
    let bc = cap(true, Mode::SingleNodeWriter, &[]);
    for (id, s, c) in [(&d, &sd, &mc), (&b, &sb, &bc), (&f, &sf, &mc)] {
        e.node
            .node_stage_volume(&ctx(), stage_req(id, s, c.clone()))
            .await
            .unwrap();
    }
    // The images grew (ControllerExpandVolume).
    for id in [&b, &f] {
        let img = e.fake.base.join(format!("{id}.img"));
        std::fs::OpenOptions::new()
            .write(true)
            .open(img)
            .unwrap()
            .set_len(2 << 20)
            .unwrap();
    }

    let r = e
        .node
        .node_expand_volume(&ctx(), expand(&d, &sd))
        .await
        .unwrap();
    assert_eq!(r.capacity_bytes, MIB, "a directory: the driver's size");
    let r = e
        .node
        .node_expand_volume(&ctx(), expand(&b, &sb))
        .await
        .unwrap();
    assert_eq!(r.capacity_bytes, 2 << 20, "the refreshed device");
    assert!(exec.calls().is_empty(), "no filesystem on a block volume");

    exec.expect("blkid", ExecOutput::ok("TYPE=ext4\n"));
    exec.expect(
        "dumpe2fs",
        ExecOutput::ok("Block count: 256\nBlock size: 4096\n"),
    );
    exec.expect("blkid", ExecOutput::ok("TYPE=ext4\n"));
    exec.expect("resize2fs", ExecOutput::ok(""));
    let r = e
        .node
        .node_expand_volume(&ctx(), expand(&f, &sf))
        .await
        .unwrap();
    assert_eq!(r.capacity_bytes, 2 << 20);
    assert!(exec.calls().iter().any(|c| c.program == "resize2fs"));

    // Staged read-only: nothing to grow.
    let r = e.fake.add("fs-2", false);
    let reader = cap(false, Mode::SingleNodeReaderOnly, &[]);
    e.node
        .node_stage_volume(&ctx(), stage_req(&r, &sr, reader))
        .await
        .unwrap();
    let got = e.node.node_expand_volume(&ctx(), expand(&r, &sr)).await;
    assert_eq!(code(got), Code::FailedPrecondition);
}

#[tokio::test]
async fn node_info_comes_from_the_config() {
    let info = |n: NodeInfo| async move {
        let e = env_with(n, None);
        e.node
            .node_get_info(&ctx(), NodeGetInfoRequest {})
            .await
            .unwrap()
    };
    let plain = info(NodeInfo::new("n1")).await;
    assert_eq!(
        (plain.node_id.as_str(), plain.max_volumes_per_node),
        ("n1", 0)
    );
    assert!(plain.accessible_topology.is_none());
    let full = info(NodeInfo::new("n2").max_volumes(7).topology("zone", "a")).await;
    assert_eq!(full.max_volumes_per_node, 7);
    assert_eq!(full.accessible_topology.unwrap().segments["zone"], "a");
}

#[tokio::test]
async fn stage_waits_while_the_driver_holds_its_stage_lock() {
    let e = env();
    let id = e.fake.add("b", true);
    let staging = e.path("s");
    let (held, c) = (e.fake.lock.write().await, ctx());
    let stage = e.node.node_stage_volume(
        &c,
        stage_req(&id, &staging, cap(true, Mode::SingleNodeWriter, &[])),
    );
    tokio::pin!(stage);
    assert!(
        tokio::time::timeout(Duration::from_millis(50), &mut stage)
            .await
            .is_err()
    );
    assert_eq!(
        e.host.attached(),
        0,
        "nothing attached while the lock is held"
    );
    drop(held);
    stage.await.unwrap();
    assert_eq!(e.host.attached(), 1);
}

#[tokio::test]
async fn mount_flag_values_reach_no_answer_or_log_line_at_any_level() {
    // The global subscriber: the blocking pool's threads log too.
    let logs = capture_all_logs();
    let e = env();
    let id = e.fake.add("m", false);
    let (staging, target) = (e.path("s"), e.path("t"));
    let c = cap(false, Mode::SingleNodeWriter, &["password=SECRET"]);
    let (mut answers, cx) = (Vec::new(), ctx());
    for op in [FakeOp::Mount, FakeOp::BindMount] {
        e.host.fake().inject_error(op, &staging, Errno::EINVAL);
    }
    let stage = || {
        e.node
            .node_stage_volume(&cx, stage_req(&id, &staging, c.clone()))
    };
    let publish = || {
        e.node
            .node_publish_volume(&cx, publish_req(&id, &staging, &target, c.clone()))
    };
    answers.push(format!("{:?}", stage().await));
    e.host.fake().clear_errors();
    stage().await.unwrap();
    for op in [FakeOp::Mount, FakeOp::BindMount] {
        e.host.fake().inject_error(op, &target, Errno::EINVAL);
    }
    answers.push(format!("{:?}", publish().await));
    e.host.fake().clear_errors();
    publish().await.unwrap();
    let text = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    assert!(text.contains("published"), "events are captured: {text}");
    assert!(answers.iter().all(|a| a.contains("Err")), "{answers:?}");
    for text in answers.iter().chain([&text]) {
        assert!(!text.contains("SECRET"), "{text}");
    }
}

#[tokio::test]
async fn open_shared_keeps_the_record_in_the_drivers_store_unless_an_earlier_one_exists() {
    use csi_store::RecordStore;
    let dir = tempfile::tempdir().unwrap();
    let host = FakeHost::new();
    let fake = fake_in(dir.path());
    let open = |store: &csi_store::FileStore, separate: &Path| {
        NodeService::builder(fake.clone(), NodeInfo::new("n1"), host.mounter())
            .volumes(|v| v.loop_devices(host.loops()))
            .open_shared(store, separate)
            .unwrap()
    };
    let c = cap(false, Mode::SingleNodeWriter, &[]);
    let id = fake.add("v", false);
    let staging = dir.path().join("s");

    // A new state dir: the stage record lands in the driver's store.
    let driver_store = csi_store::FileStore::open(dir.path().join("state")).unwrap();
    let separate = dir.path().join("state-node");
    let node = open(&driver_store, &separate);
    node.node_stage_volume(&ctx(), stage_req(&id, &staging, c.clone()))
        .await
        .unwrap();
    assert!(!separate.exists(), "nothing written apart");
    let staged = driver_store.scan(csi_node::STAGED_TABLE).unwrap();
    assert_eq!(staged.records.len(), 1);
    node.node_unstage_volume(&ctx(), unstage_req(&id, &staging))
        .await
        .unwrap();
    drop(node);

    // A record kept apart by an earlier version is still the one used.
    let earlier = csi_store::FileStore::open(&separate).unwrap();
    drop(earlier);
    let node = open(&driver_store, &separate);
    node.node_stage_volume(&ctx(), stage_req(&id, &staging, c))
        .await
        .unwrap();
    assert!(
        driver_store
            .scan(csi_node::STAGED_TABLE)
            .unwrap()
            .records
            .is_empty()
    );
    let apart = csi_store::FileStore::open(&separate);
    assert!(
        matches!(apart, Err(csi_store::StoreError::Locked { .. })),
        "the node service holds the separate record"
    );
}
