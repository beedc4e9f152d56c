//! The simulated CO: what it believes it created and set up ([`Model`]),
//! and how it performs a workload's call, retrying until the answer is
//! final ([`Co`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;

use csi_driver::{CallContext, CsiError, Method};
use csi_node::testing::requests::{cap, publish_req, stage_req, unpublish_req, unstage_req};
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::*;

use crate::runner::{MAX_ATTEMPTS, Services, Start};
use crate::targets::NODE_ID;
use crate::workload::{Call, Content};
use crate::world::World;

/// What the CO believes: what it created and what kubelet has set up.
#[derive(Debug, Default)]
pub(crate) struct Model {
    pub(crate) volumes: BTreeMap<&'static str, String>,
    pub(crate) snapshots: BTreeMap<&'static str, String>,
    pub(crate) groups: BTreeMap<&'static str, (String, Vec<String>)>,
    pub(crate) staged: BTreeSet<&'static str>,
    pub(crate) published: BTreeMap<(&'static str, &'static str), bool>,
    /// Volumes ControllerPublish answered OK for (and ControllerUnpublish
    /// not since).
    pub(crate) attached: BTreeSet<&'static str>,
    /// What the CO hands NodeStage and NodePublish: CreateVolume's
    /// volume_context and ControllerPublish's publish_context, by volume.
    pub(crate) contexts: BTreeMap<&'static str, Contexts>,
}

/// A volume's contexts, as the driver answered them.
#[derive(Debug, Default, Clone)]
pub(crate) struct Contexts {
    volume: HashMap<String, String>,
    publish: HashMap<String, String>,
}

pub(crate) struct Co<'a> {
    pub(crate) world: World,
    start: &'a Start,
    services: Option<Services>,
    pub(crate) model: Model,
    /// Steps made when the driver first started.
    pub(crate) start_steps: Option<u64>,
    /// The access mode asked for.
    mode: Mode,
}

/// One attempt's answer: OK, or an error worth retrying.
type Answer = Result<(), CsiError>;

impl<'a> Co<'a> {
    /// A CO that has created nothing yet, for the driver `start` starts.
    pub(crate) fn new(world: &World, start: &'a Start, mode: Mode) -> Self {
        Co {
            world: world.clone(),
            start,
            services: None,
            model: Model::default(),
            start_steps: None,
            mode,
        }
    }

    pub(crate) fn staging(&self, pv: &str) -> PathBuf {
        self.world.host_dir().join("kubelet/staging").join(pv)
    }

    pub(crate) fn target(&self, pv: &str, pod: &str) -> PathBuf {
        self.world
            .host_dir()
            .join("kubelet/pods")
            .join(pod)
            .join(pv)
            .join("mount")
    }

    pub(crate) fn id(&self, pv: &str) -> String {
        self.model.volumes.get(pv).cloned().unwrap_or_default()
    }

    /// The driver, started (again) when it is not running.
    pub(crate) async fn services(&mut self) -> Result<&Services, String> {
        if self.world.crashed() {
            self.services = None;
            self.world.restart();
        }
        if self.services.is_none() {
            let mut last = String::new();
            for _ in 0..MAX_ATTEMPTS {
                match (self.start)(&self.world).await {
                    Ok(s) => {
                        self.services = Some(s);
                        self.start_steps.get_or_insert(self.world.steps());
                        break;
                    }
                    Err(e) => {
                        last = e;
                        if self.world.crashed() {
                            self.world.restart();
                        }
                    }
                }
            }
            if self.services.is_none() {
                return Err(format!("the driver does not start: {last}"));
            }
        }
        Ok(self.services.as_ref().expect("started above"))
    }

    /// Retries `call` until it is answered OK, as the CO does.
    pub(crate) async fn perform(&mut self, call: &Call) -> Result<(), String> {
        let mut call = call.clone();
        let mut last = String::new();
        for _ in 0..MAX_ATTEMPTS {
            let answer = self.attempt(&call).await?;
            if self.world.crashed() {
                self.services = None;
                last = format!("driver crashed ({answer:?})");
                continue;
            }
            match answer {
                Ok(()) => return Ok(()),
                Err(e) => {
                    last = e.to_string();
                    if let Call::Publish {
                        pv,
                        pod,
                        deleted_if_uncertain: true,
                        ..
                    } = call
                    {
                        // The pod is gone: tear its publication down.
                        call = Call::Unpublish(pv, pod);
                    }
                }
            }
        }
        Err(format!(
            "no final answer after {MAX_ATTEMPTS} attempts: {last}"
        ))
    }

    async fn attempt(&mut self, call: &Call) -> Result<Answer, String> {
        let ctx = |m| CallContext::detached(0, m);
        let mode = self.mode;
        let mount_cap = || cap(false, mode, &[]);
        let s = self.services().await?;
        let (controller, node, group) = (s.controller.clone(), s.node.clone(), s.group.clone());
        Ok(match call {
            Call::CreateVolume { pv, size, from } => {
                let source = match from {
                    None => None,
                    Some(Content::Snapshot(n)) => Some(
                        csi_controller::ContentSource::Snapshot(
                            self.model.snapshots.get(n).cloned().unwrap_or_default(),
                        )
                        .message(),
                    ),
                    Some(Content::Volume(n)) => {
                        Some(csi_controller::ContentSource::Volume(self.id(n)).message())
                    }
                };
                let req = CreateVolumeRequest {
                    name: (*pv).into(),
                    capacity_range: Some(CapacityRange {
                        required_bytes: *size,
                        limit_bytes: 0,
                    }),
                    volume_capabilities: vec![mount_cap()],
                    volume_content_source: source,
                    ..Default::default()
                };
                match controller
                    .create_volume(&ctx(Method::CreateVolume), req)
                    .await
                {
                    Ok(r) => {
                        let v = r.volume.unwrap_or_default();
                        self.model.volumes.insert(pv, v.volume_id);
                        self.model.contexts.entry(pv).or_default().volume = v.volume_context;
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            Call::DeleteVolume(pv) => {
                let req = DeleteVolumeRequest {
                    volume_id: self.id(pv),
                    ..Default::default()
                };
                let r = controller
                    .delete_volume(&ctx(Method::DeleteVolume), req)
                    .await;
                r.map(|_| {
                    self.model.volumes.remove(pv);
                })
            }
            Call::ControllerPublish(pv) => {
                let req = ControllerPublishVolumeRequest {
                    volume_id: self.id(pv),
                    node_id: NODE_ID.into(),
                    volume_capability: Some(mount_cap()),
                    ..Default::default()
                };
                let r = controller
                    .controller_publish_volume(&ctx(Method::ControllerPublishVolume), req)
                    .await;
                r.map(|r| {
                    self.model.contexts.entry(pv).or_default().publish = r.publish_context;
                    self.model.attached.insert(pv);
                })
            }
            Call::ControllerUnpublish(pv) => {
                let req = ControllerUnpublishVolumeRequest {
                    volume_id: self.id(pv),
                    node_id: NODE_ID.into(),
                    ..Default::default()
                };
                let r = controller
                    .controller_unpublish_volume(&ctx(Method::ControllerUnpublishVolume), req)
                    .await;
                r.map(|_| {
                    self.model.attached.remove(pv);
                })
            }
            Call::Stage(pv) => {
                let staging = self.staging(pv);
                let _ = std::fs::create_dir_all(staging.parent().expect("a parent"));
                let mut req = stage_req(&self.id(pv), &staging, mount_cap());
                let contexts = self.model.contexts.get(pv).cloned().unwrap_or_default();
                (req.volume_context, req.publish_context) = (contexts.volume, contexts.publish);
                let r = node
                    .node_stage_volume(&ctx(Method::NodeStageVolume), req)
                    .await;
                r.map(|_| {
                    self.model.staged.insert(pv);
                })
            }
            Call::Unstage(pv) => {
                let req = unstage_req(&self.id(pv), &self.staging(pv));
                let r = node
                    .node_unstage_volume(&ctx(Method::NodeUnstageVolume), req)
                    .await;
                r.map(|_| {
                    self.model.staged.remove(pv);
                })
            }
            Call::Publish {
                pv, pod, readonly, ..
            } => {
                let target = self.target(pv, pod);
                let _ = std::fs::create_dir_all(target.parent().expect("a parent"));
                let mut req = publish_req(&self.id(pv), &self.staging(pv), &target, mount_cap());
                req.readonly = *readonly;
                let contexts = self.model.contexts.get(pv).cloned().unwrap_or_default();
                (req.volume_context, req.publish_context) = (contexts.volume, contexts.publish);
                let r = node
                    .node_publish_volume(&ctx(Method::NodePublishVolume), req)
                    .await;
                r.map(|_| {
                    self.model.published.insert((pv, pod), *readonly);
                })
            }
            Call::Unpublish(pv, pod) => {
                let req = unpublish_req(&self.id(pv), &self.target(pv, pod));
                let r = node
                    .node_unpublish_volume(&ctx(Method::NodeUnpublishVolume), req)
                    .await;
                r.map(|_| {
                    self.model.published.remove(&(*pv, *pod));
                })
            }
            Call::Expand { pv, pod, size } => {
                let range = Some(CapacityRange {
                    required_bytes: *size,
                    limit_bytes: 0,
                });
                let req = ControllerExpandVolumeRequest {
                    volume_id: self.id(pv),
                    capacity_range: range,
                    volume_capability: Some(mount_cap()),
                    ..Default::default()
                };
                let r = controller
                    .controller_expand_volume(&ctx(Method::ControllerExpandVolume), req)
                    .await;
                match r {
                    Ok(resp) if resp.node_expansion_required => {
                        let req = NodeExpandVolumeRequest {
                            volume_id: self.id(pv),
                            volume_path: self.target(pv, pod).to_string_lossy().into(),
                            staging_target_path: self.staging(pv).to_string_lossy().into(),
                            capacity_range: range,
                            volume_capability: Some(mount_cap()),
                            ..Default::default()
                        };
                        let r = node
                            .node_expand_volume(&ctx(Method::NodeExpandVolume), req)
                            .await;
                        r.map(drop)
                    }
                    r => r.map(drop),
                }
            }
            Call::CreateSnapshot(snap, pv) => {
                let req = create_snapshot_request(snap, self.id(pv));
                match controller
                    .create_snapshot(&ctx(Method::CreateSnapshot), req)
                    .await
                {
                    Ok(r) => {
                        let id = r.snapshot.map(|s| s.snapshot_id).unwrap_or_default();
                        self.model.snapshots.insert(snap, id);
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            Call::DeleteSnapshot(snap) => {
                let req = DeleteSnapshotRequest {
                    snapshot_id: self.model.snapshots.get(snap).cloned().unwrap_or_default(),
                    ..Default::default()
                };
                let r = controller
                    .delete_snapshot(&ctx(Method::DeleteSnapshot), req)
                    .await;
                r.map(|_| {
                    self.model.snapshots.remove(snap);
                })
            }
            Call::CreateGroup(name, pvs) => {
                let group = group.ok_or("the driver has no GroupController")?;
                let req = CreateVolumeGroupSnapshotRequest {
                    name: (*name).into(),
                    source_volume_ids: pvs.iter().map(|p| self.id(p)).collect(),
                    ..Default::default()
                };
                match group
                    .create_volume_group_snapshot(&ctx(Method::CreateVolumeGroupSnapshot), req)
                    .await
                {
                    Ok(r) => {
                        let g = r.group_snapshot.unwrap_or_default();
                        let members = g.snapshots.into_iter().map(|s| s.snapshot_id).collect();
                        self.model
                            .groups
                            .insert(name, (g.group_snapshot_id, members));
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            Call::DeleteGroup(name) => {
                let group = group.ok_or("the driver has no GroupController")?;
                let (id, members) = self.model.groups.get(name).cloned().unwrap_or_default();
                let req = DeleteVolumeGroupSnapshotRequest {
                    group_snapshot_id: id,
                    snapshot_ids: members,
                    ..Default::default()
                };
                let r = group
                    .delete_volume_group_snapshot(&ctx(Method::DeleteVolumeGroupSnapshot), req)
                    .await;
                r.map(|_| {
                    self.model.groups.remove(name);
                })
            }
        })
    }
}

/// The CO's CreateSnapshot of `source_volume_id`, named `name` (the
/// simulator's and the real-kernel companion's).
pub(crate) fn create_snapshot_request(
    name: &str,
    source_volume_id: String,
) -> CreateSnapshotRequest {
    CreateSnapshotRequest {
        source_volume_id,
        name: name.into(),
        ..Default::default()
    }
}
