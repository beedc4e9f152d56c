//! The CO over gRPC: a workload's calls, retried the way Kubernetes does
//! when the driver dies under them, and what it believes exists.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use crash_points::CrashPlan;
use csi_client::CsiClient;
use csi_proto::v1::controller_service_capability::rpc::Type as ControllerRpc;
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use csi_proto::v1::*;
use tonic::Status;

use super::KernelTarget;
use super::process::{Layout, NotServing, Process};
use crate::co::create_snapshot_request;
use crate::runner::MAX_ATTEMPTS;
use crate::workload::{Call, Content};

const GIB: i64 = 1 << 30;

/// What the CO believes: what it created and what kubelet set up.
#[derive(Debug, Default)]
pub(crate) struct Model {
    pub(crate) volumes: BTreeMap<&'static str, String>,
    pub(crate) snapshots: BTreeMap<&'static str, String>,
    pub(crate) groups: BTreeMap<&'static str, (String, Vec<String>)>,
    pub(crate) publish_context: BTreeMap<&'static str, HashMap<String, String>>,
    pub(crate) published: BTreeMap<(&'static str, &'static str), bool>,
    /// Volumes the CO wrote its data into, through a pod.
    pub(crate) written: BTreeMap<&'static str, String>,
}

/// The CO and the driver it talks to.
pub(crate) struct Co<'a> {
    pub(crate) target: &'a KernelTarget,
    pub(crate) layout: Layout,
    pub(crate) model: Model,
    process: Option<Process>,
    client: Option<CsiClient>,
    /// The controller's declared RPCs, from its first start.
    controller_rpcs: Vec<ControllerRpc>,
    /// How many times the driver died.
    pub(crate) deaths: u32,
    /// What happened, for a replay.
    pub(crate) events: Vec<String>,
    /// Calls whose first answer was an error although the driver lived:
    /// in a run without a crash, a workload the driver does not serve.
    pub(crate) refused: Vec<String>,
    /// Whether its volumes are block volumes (else mount volumes).
    pub(crate) block: bool,
    /// Whether its mount volumes are xfs (else the driver's default).
    pub(crate) xfs: bool,
    /// Clones the CO never asked for: the driver declares no CLONE_VOLUME.
    pub(crate) not_cloned: Vec<&'static str>,
    /// Mounts and loop devices under the run's directory that its
    /// auxiliary processes made before the driver started (the storage's,
    /// not the driver's): the end checks leave them out.
    pub(crate) spared: (Vec<PathBuf>, Vec<String>),
}

impl<'a> Co<'a> {
    pub(crate) fn new(target: &'a KernelTarget, layout: Layout, block: bool) -> Self {
        Co {
            target,
            layout,
            block,
            xfs: false,
            model: Model::default(),
            process: None,
            client: None,
            controller_rpcs: Vec::new(),
            deaths: 0,
            events: Vec::new(),
            refused: Vec::new(),
            not_cloned: Vec::new(),
            spared: (Vec::new(), Vec::new()),
        }
    }

    /// Starts the driver (with `plan` and `trace` the first time), and
    /// again without them whenever it dies starting.
    pub(crate) async fn start(
        &mut self,
        plan: Option<CrashPlan>,
        trace: Option<&std::path::Path>,
    ) -> Result<(), String> {
        let (mut plan, mut trace) = (plan, trace);
        for _ in 0..MAX_ATTEMPTS {
            let args = (self.target.args)(&self.layout);
            let mut p = Process::spawn(
                &self.target.program,
                &args,
                self.target.env,
                &self.layout.log(),
                plan.take(),
                trace.take(),
            )?;
            match p.ready(&self.layout.socket).await {
                Ok(client) => {
                    if self.controller_rpcs.is_empty() {
                        self.controller_rpcs = controller_rpcs(&client).await?;
                    }
                    self.process = Some(p);
                    self.client = Some(client);
                    return Ok(());
                }
                Err(NotServing::Died(status)) => {
                    self.deaths += 1;
                    self.events.push(format!("died starting: {status}"));
                }
                Err(NotServing::Failed(e)) => {
                    return Err(format!("the driver does not start: {e}"));
                }
            }
        }
        Err(format!("the driver died at each of {MAX_ATTEMPTS} starts"))
    }

    /// Stops the driver gracefully.
    pub(crate) async fn stop(&mut self) {
        self.client = None;
        if let Some(p) = self.process.take() {
            p.stop().await;
        }
    }

    pub(crate) fn client(&self) -> Result<&CsiClient, String> {
        self.client
            .as_ref()
            .ok_or_else(|| "the driver is not running".to_owned())
    }

    fn declares(&self, rpc: ControllerRpc) -> bool {
        self.controller_rpcs.contains(&rpc)
    }

    pub(crate) fn lists(&self) -> (bool, bool) {
        (
            self.declares(ControllerRpc::ListVolumes),
            self.declares(ControllerRpc::ListSnapshots),
        )
    }

    pub(crate) fn staging(&self, pv: &str) -> PathBuf {
        self.layout.kubelet.join("staging").join(pv)
    }

    pub(crate) fn target_path(&self, pv: &str, pod: &str) -> PathBuf {
        let pods = self.layout.kubelet.join("pods");
        pods.join(pod).join(pv).join("mount")
    }

    fn id(&self, pv: &str) -> String {
        self.model.volumes.get(pv).cloned().unwrap_or_default()
    }

    /// Retries `call` until it is answered OK, restarting the driver when
    /// it died; a pod whose publication was uncertain is deleted instead
    /// (its publication torn down).
    pub(crate) async fn perform(&mut self, call: &Call) -> Result<(), String> {
        // Kubernetes attaches before staging and detaches before deleting
        // when the driver declares attach, whether or not the workload says.
        // Without CLONE_VOLUME the CO asks for no clone (and deletes none),
        // as csi-sim's `workloads_for` leaves them out.
        match call {
            Call::CreateVolume {
                pv,
                from: Some(Content::Volume(_)),
                ..
            } if !self.declares(ControllerRpc::CloneVolume) => {
                self.not_cloned.push(pv);
                return Ok(());
            }
            Call::DeleteVolume(pv) if self.not_cloned.contains(pv) => return Ok(()),
            _ => {}
        }
        let attach = self.declares(ControllerRpc::PublishUnpublishVolume);
        match call {
            Call::Stage(pv) if attach && !self.model.publish_context.contains_key(pv) => {
                Box::pin(self.perform(&Call::ControllerPublish(pv))).await?;
            }
            Call::DeleteVolume(pv) if attach && self.model.publish_context.contains_key(pv) => {
                Box::pin(self.perform(&Call::ControllerUnpublish(pv))).await?;
            }
            _ => {}
        }
        let mut call = call.clone();
        let mut last = String::new();
        for attempt in 0..MAX_ATTEMPTS {
            let answer = match self.attempt(&call).await? {
                None => return Ok(()), // the CO does not make this call
                Some(answer) => answer,
            };
            let Err(status) = answer else {
                return Ok(());
            };
            last = format!("{:?}: {}", status.code(), status.message());
            let dead = match self.process.as_mut() {
                Some(p) => p.died_within(death_wait(&status)).await,
                None => None,
            };
            if let Some(exit) = dead {
                self.deaths += 1;
                self.events.push(format!("died in {call:?}: {exit}"));
                self.client = None;
                self.process = None;
                self.start(None, None).await?;
            } else {
                self.events.push(format!("{call:?}: {last}"));
                if attempt == 0 {
                    self.refused.push(format!("{call:?}: {last}"));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            // A pod whose publication is uncertain is deleted: the CO
            // tears the publication down instead.
            call = match call {
                Call::Publish {
                    pv,
                    pod,
                    deleted_if_uncertain: true,
                    ..
                } => Call::Unpublish(pv, pod),
                same => same,
            };
        }
        Err(format!("{MAX_ATTEMPTS} attempts, none answered OK: {last}"))
    }

    fn size(&self, workload_size: i64) -> i64 {
        let unit = match self.xfs {
            true => self.target.volume_unit.max(super::XFS_MIN_VOLUME),
            false => self.target.volume_unit,
        };
        workload_size / GIB * unit
    }

    /// One attempt; `None` when the CO would not make this call (a
    /// ControllerPublish to a driver without attach).
    async fn attempt(&mut self, call: &Call) -> Result<Option<Result<(), Status>>, String> {
        let c = self.client()?.clone();
        let cap = capability(self.block, self.xfs);
        let node_id = self.target.node_id.to_owned();
        Ok(Some(match call {
            Call::CreateVolume { pv, size, from } => {
                let source = match from {
                    None => None,
                    Some(Content::Snapshot(n)) => Some(snapshot_source(
                        self.model.snapshots.get(n).cloned().unwrap_or_default(),
                    )),
                    Some(Content::Volume(n)) => Some(volume_source(self.id(n))),
                };
                let req = CreateVolumeRequest {
                    name: (*pv).into(),
                    capacity_range: Some(CapacityRange {
                        required_bytes: self.size(*size),
                        limit_bytes: 0,
                    }),
                    volume_capabilities: vec![cap],
                    volume_content_source: source,
                    ..Default::default()
                };
                c.create_volume(req).await.map(|r| {
                    let id = r.volume.map(|v| v.volume_id).unwrap_or_default();
                    self.model.volumes.insert(pv, id);
                })
            }
            Call::DeleteVolume(pv) => {
                let req = DeleteVolumeRequest {
                    volume_id: self.id(pv),
                    ..Default::default()
                };
                c.delete_volume(req).await.map(|_| {
                    self.model.volumes.remove(pv);
                    self.model.written.remove(pv);
                })
            }
            Call::ControllerPublish(pv) => {
                if !self.declares(ControllerRpc::PublishUnpublishVolume) {
                    return Ok(None);
                }
                let req = ControllerPublishVolumeRequest {
                    volume_id: self.id(pv),
                    node_id,
                    volume_capability: Some(cap),
                    ..Default::default()
                };
                c.controller_publish_volume(req).await.map(|r| {
                    self.model.publish_context.insert(pv, r.publish_context);
                })
            }
            Call::ControllerUnpublish(pv) => {
                if !self.declares(ControllerRpc::PublishUnpublishVolume) {
                    return Ok(None);
                }
                let req = ControllerUnpublishVolumeRequest {
                    volume_id: self.id(pv),
                    node_id,
                    ..Default::default()
                };
                c.controller_unpublish_volume(req).await.map(|_| {
                    self.model.publish_context.remove(pv);
                })
            }
            Call::Stage(pv) => {
                let staging = self.staging(pv);
                make_parent(&staging)?;
                let req = NodeStageVolumeRequest {
                    volume_id: self.id(pv),
                    staging_target_path: path_text(&staging),
                    volume_capability: Some(cap),
                    publish_context: self.context(pv),
                    ..Default::default()
                };
                c.node_stage_volume(req).await.map(drop)
            }
            Call::Unstage(pv) => {
                let req = NodeUnstageVolumeRequest {
                    volume_id: self.id(pv),
                    staging_target_path: path_text(&self.staging(pv)),
                };
                c.node_unstage_volume(req).await.map(drop)
            }
            Call::Publish {
                pv, pod, readonly, ..
            } => {
                let target = self.target_path(pv, pod);
                make_parent(&target)?;
                let req = NodePublishVolumeRequest {
                    volume_id: self.id(pv),
                    staging_target_path: path_text(&self.staging(pv)),
                    target_path: path_text(&target),
                    volume_capability: Some(cap),
                    readonly: *readonly,
                    publish_context: self.context(pv),
                    ..Default::default()
                };
                c.node_publish_volume(req).await.map(|_| {
                    self.model.published.insert((pv, pod), *readonly);
                })
            }
            Call::Unpublish(pv, pod) => {
                let req = NodeUnpublishVolumeRequest {
                    volume_id: self.id(pv),
                    target_path: path_text(&self.target_path(pv, pod)),
                };
                c.node_unpublish_volume(req).await.map(|_| {
                    self.model.published.remove(&(*pv, *pod));
                })
            }
            Call::Expand { pv, pod, size } => {
                let range = Some(CapacityRange {
                    required_bytes: self.size(*size),
                    limit_bytes: 0,
                });
                let req = ControllerExpandVolumeRequest {
                    volume_id: self.id(pv),
                    capacity_range: range,
                    volume_capability: Some(cap.clone()),
                    ..Default::default()
                };
                match c.controller_expand_volume(req).await {
                    Ok(r) if r.node_expansion_required => {
                        let req = NodeExpandVolumeRequest {
                            volume_id: self.id(pv),
                            volume_path: path_text(&self.target_path(pv, pod)),
                            staging_target_path: path_text(&self.staging(pv)),
                            capacity_range: range,
                            volume_capability: Some(cap),
                            ..Default::default()
                        };
                        c.node_expand_volume(req).await.map(drop)
                    }
                    r => r.map(drop),
                }
            }
            Call::CreateSnapshot(snap, pv) => {
                let req = create_snapshot_request(snap, self.id(pv));
                c.create_snapshot(req).await.map(|r| {
                    let id = r.snapshot.map(|s| s.snapshot_id).unwrap_or_default();
                    self.model.snapshots.insert(snap, id);
                })
            }
            Call::DeleteSnapshot(snap) => {
                let req = DeleteSnapshotRequest {
                    snapshot_id: self.model.snapshots.get(snap).cloned().unwrap_or_default(),
                    ..Default::default()
                };
                c.delete_snapshot(req).await.map(|_| {
                    self.model.snapshots.remove(snap);
                })
            }
            Call::CreateGroup(name, pvs) => {
                let req = CreateVolumeGroupSnapshotRequest {
                    name: (*name).into(),
                    source_volume_ids: pvs.iter().map(|p| self.id(p)).collect(),
                    ..Default::default()
                };
                c.create_volume_group_snapshot(req).await.map(|r| {
                    let g = r.group_snapshot.unwrap_or_default();
                    let members = g.snapshots.into_iter().map(|s| s.snapshot_id).collect();
                    self.model
                        .groups
                        .insert(name, (g.group_snapshot_id, members));
                })
            }
            Call::DeleteGroup(name) => {
                let (id, members) = self.model.groups.get(name).cloned().unwrap_or_default();
                let req = DeleteVolumeGroupSnapshotRequest {
                    group_snapshot_id: id,
                    snapshot_ids: members,
                    ..Default::default()
                };
                c.delete_volume_group_snapshot(req).await.map(|_| {
                    self.model.groups.remove(name);
                })
            }
        }))
    }

    fn context(&self, pv: &str) -> HashMap<String, String> {
        self.model
            .publish_context
            .get(pv)
            .cloned()
            .unwrap_or_default()
    }
}

/// How long to wait for the process to be seen dead after `status`: a
/// broken connection means it is dying; an answer means it is alive.
fn death_wait(status: &Status) -> Duration {
    match status.code() {
        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled => {
            Duration::from_secs(2)
        }
        _ => Duration::ZERO,
    }
}

async fn controller_rpcs(client: &CsiClient) -> Result<Vec<ControllerRpc>, String> {
    let caps = client
        .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await
        .map_err(|e| format!("ControllerGetCapabilities: {e}"))?;
    Ok(caps
        .capabilities
        .iter()
        .filter_map(|c| match &c.r#type {
            Some(controller_service_capability::Type::Rpc(rpc)) => {
                ControllerRpc::try_from(rpc.r#type).ok()
            }
            None => None,
        })
        .collect())
}

/// A mount (of xfs, or of the driver's default) or block volume that two
/// pods on the node may share (the shared-staging workload publishes it
/// twice).
fn capability(block: bool, xfs: bool) -> VolumeCapability {
    let access = match (block, xfs) {
        (true, _) => AccessType::Block(BlockVolume::default()),
        (false, true) => AccessType::Mount(MountVolume {
            fs_type: "xfs".into(),
            ..Default::default()
        }),
        (false, false) => AccessType::Mount(MountVolume::default()),
    };
    VolumeCapability {
        access_type: Some(access),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeMultiWriter as i32,
        }),
    }
}

fn snapshot_source(id: String) -> VolumeContentSource {
    use volume_content_source::{SnapshotSource, Type};
    VolumeContentSource {
        r#type: Some(Type::Snapshot(SnapshotSource { snapshot_id: id })),
    }
}

fn volume_source(id: String) -> VolumeContentSource {
    use volume_content_source::{Type, VolumeSource};
    VolumeContentSource {
        r#type: Some(Type::Volume(VolumeSource { volume_id: id })),
    }
}

fn path_text(p: &std::path::Path) -> String {
    p.to_string_lossy().into_owned()
}

fn make_parent(p: &std::path::Path) -> Result<(), String> {
    let parent = p.parent().ok_or("a path with a parent")?;
    std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))
}
