//! The provider's bookkeeping and rules, with no I/O: which volumes,
//! snapshots and actions exist and what each request may do to them.
//!
//! The provider process ([`crate::provider`]) runs every request through
//! this and adds the effects (files, loop devices, the state file);
//! `FakeProvider` runs the same rules in memory, so the fake answers exactly
//! as the real provider does.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::api::{
    Action, ActionKind, ActionRequest, ActionStatus, CreateSnapshotRequest, CreateVolumeRequest,
    ErrorBody, PageRequest, Snapshot, SnapshotFilter, Volume, VolumeFilter, error_id,
};

/// Finished actions kept for polling; older ones are forgotten.
const FINISHED_ACTIONS_KEPT: usize = 1000;

/// A refusal: the HTTP status and the error body to answer with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// The body.
    pub body: ErrorBody,
}

impl ApiError {
    /// An error with `status`, `id` and `message`.
    pub fn new(status: u16, id: &str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            body: ErrorBody {
                id: id.to_owned(),
                message: message.into(),
                action_id: None,
                node_id: None,
            },
        }
    }

    /// 404 for a `kind` (volume, snapshot, action) with `id`.
    pub fn not_found(kind: &str, id: &str) -> Self {
        Self::new(404, error_id::NOT_FOUND, format!("no {kind} has id {id:?}"))
    }

    /// 422 naming the field whose value is refused.
    pub fn field(field: &str, problem: impl std::fmt::Display) -> Self {
        Self::new(422, error_id::UNPROCESSABLE, format!("{field}: {problem}"))
    }

    /// 400 for a body or query that could not be read.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, error_id::BAD_REQUEST, message)
    }

    fn in_progress(action: &Action) -> Self {
        let mut e = Self::new(
            409,
            error_id::ACTION_IN_PROGRESS,
            format!(
                "{:?} action {} on volume {} is in progress",
                action.kind, action.id, action.resource_id
            ),
        );
        e.body.action_id = Some(action.id);
        e
    }
}

/// Limits and regions, from the provider's flags (not persisted).
#[derive(Debug, Clone)]
pub struct Limits {
    /// Region slugs; the first is the default.
    pub regions: Vec<String>,
    /// Largest volume in GiB.
    pub max_size_gigabytes: u64,
    /// Volumes one node may have attached (or attaching) at once.
    pub max_volumes_per_node: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            regions: vec!["dev-1".to_owned()],
            max_size_gigabytes: 16 * 1024,
            max_volumes_per_node: 7,
        }
    }
}

/// Everything the provider knows; what its state file holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cloud {
    volumes: BTreeMap<String, Volume>,
    snapshots: BTreeMap<String, Snapshot>,
    actions: BTreeMap<u64, Action>,
    next_action_id: u64,
}

/// Whether `id` is one this provider could have made (a lowercase hyphenated
/// UUID), so it is safe as a file name; anything else is simply not found.
pub fn is_provider_id(id: &str) -> bool {
    uuid::Uuid::try_parse(id).is_ok_and(|u| u.hyphenated().to_string() == id)
}

fn check_name(field: &str, name: &str) -> Result<(), ApiError> {
    if name.is_empty() || name.len() > 255 {
        return Err(ApiError::field(field, "must be 1 to 255 bytes long"));
    }
    if name.chars().any(char::is_control) {
        return Err(ApiError::field(
            field,
            "must not contain control characters",
        ));
    }
    Ok(())
}

fn check_tags(tags: &[String]) -> Result<(), ApiError> {
    if tags.len() > 50 {
        return Err(ApiError::field("tags", "at most 50 tags"));
    }
    let ok = |t: &String| {
        !t.is_empty()
            && t.len() <= 255
            && t.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, ':' | '-' | '_' | '.'))
    };
    match tags.iter().find(|t| !ok(t)) {
        Some(bad) => Err(ApiError::field(
            "tags",
            format!("{bad:?}: use 1 to 255 letters, digits, ':', '-', '_' or '.'"),
        )),
        None => Ok(()),
    }
}

fn check_node(node: Option<&String>) -> Result<&str, ApiError> {
    let node = node.ok_or_else(|| ApiError::field("node_id", "required for attach and detach"))?;
    let ok = !node.is_empty()
        && node.len() <= 253
        && node
            .chars()
            .all(|c| c.is_ascii_graphic() && c != '/' && c != '\\');
    if ok {
        Ok(node)
    } else {
        Err(ApiError::field(
            "node_id",
            "must be 1 to 253 printable ASCII characters without slashes",
        ))
    }
}

/// The slice of `items` that `page` selects, and the next page number.
fn paginate<T: Clone>(items: Vec<&T>, page: PageRequest) -> (Vec<T>, Option<u32>, u64) {
    let total = items.len() as u64;
    let per = page.per_page.max(1) as usize;
    let start = (page.page.max(1) as usize - 1).saturating_mul(per);
    let chosen: Vec<T> = items.into_iter().skip(start).take(per).cloned().collect();
    let next = (start.saturating_add(per) < total as usize).then_some(page.page.max(1) + 1);
    (chosen, next, total)
}

impl Cloud {
    /// The volume with `id`.
    pub fn volume(&self, id: &str) -> Result<&Volume, ApiError> {
        self.volumes
            .get(id)
            .ok_or_else(|| ApiError::not_found("volume", id))
    }

    /// Every volume.
    pub fn volumes(&self) -> impl Iterator<Item = &Volume> {
        self.volumes.values()
    }

    /// Every snapshot.
    pub fn snapshots(&self) -> impl Iterator<Item = &Snapshot> {
        self.snapshots.values()
    }

    /// Creates a volume with the provider-chosen `id` after checking the request.
    pub fn create_volume(
        &mut self,
        limits: &Limits,
        req: &CreateVolumeRequest,
        id: String,
        now: &str,
    ) -> Result<Volume, ApiError> {
        check_name("name", &req.name)?;
        if req.description.len() > 1024 {
            return Err(ApiError::field("description", "at most 1024 bytes"));
        }
        check_tags(&req.tags)?;
        let region = match &req.region {
            None => limits.regions[0].clone(),
            Some(r) if limits.regions.contains(r) => r.clone(),
            Some(r) => {
                return Err(ApiError::field(
                    "region",
                    format!("{r:?} is not one of {:?}", limits.regions),
                ));
            }
        };
        if req.size_gigabytes == 0 || req.size_gigabytes > limits.max_size_gigabytes {
            return Err(ApiError::field(
                "size_gigabytes",
                format!("must be 1 to {}", limits.max_size_gigabytes),
            ));
        }
        if let Some(snap_id) = &req.snapshot_id {
            let snap = self
                .snapshots
                .get(snap_id)
                .ok_or_else(|| ApiError::not_found("snapshot", snap_id))?;
            if !snap.regions.contains(&region) {
                return Err(ApiError::field(
                    "snapshot_id",
                    format!("snapshot {snap_id} is not available in region {region}"),
                ));
            }
            if req.size_gigabytes < snap.min_disk_size {
                return Err(ApiError::field(
                    "size_gigabytes",
                    format!(
                        "must be at least the snapshot's min_disk_size ({})",
                        snap.min_disk_size
                    ),
                ));
            }
        }
        if self
            .volumes
            .values()
            .any(|v| v.name == req.name && v.region == region)
        {
            return Err(ApiError::new(
                409,
                error_id::NAME_TAKEN,
                format!("a volume named {:?} exists in region {region}", req.name),
            ));
        }
        let volume = Volume {
            id: id.clone(),
            name: req.name.clone(),
            description: req.description.clone(),
            region,
            size_gigabytes: req.size_gigabytes,
            node_ids: Vec::new(),
            tags: req.tags.clone(),
            snapshot_id: req.snapshot_id.clone(),
            created_at: now.to_owned(),
        };
        self.volumes.insert(id, volume.clone());
        Ok(volume)
    }

    /// Forgets a volume just created whose data could not be made.
    pub fn forget_volume(&mut self, id: &str) {
        self.volumes.remove(id);
    }

    /// A page of volumes, oldest first.
    pub fn list_volumes(
        &self,
        filter: &VolumeFilter,
        page: PageRequest,
    ) -> (Vec<Volume>, Option<u32>, u64) {
        let mut found: Vec<&Volume> = self
            .volumes
            .values()
            .filter(|v| filter.name.as_ref().is_none_or(|n| *n == v.name))
            .filter(|v| filter.region.as_ref().is_none_or(|r| *r == v.region))
            .collect();
        found.sort_by(|a, b| (&a.created_at, &a.id).cmp(&(&b.created_at, &b.id)));
        paginate(found, page)
    }

    /// Deletes a volume that is neither attached nor busy.
    pub fn delete_volume(&mut self, id: &str) -> Result<Volume, ApiError> {
        let volume = self.volume(id)?;
        if let Some(action) = self.running_on(id) {
            return Err(ApiError::in_progress(action));
        }
        if let Some(node) = volume.node_ids.first() {
            let mut e = ApiError::new(
                409,
                error_id::VOLUME_ATTACHED,
                format!("volume {id} is attached to node {node}: detach it first"),
            );
            e.body.node_id = Some(node.clone());
            return Err(e);
        }
        Ok(self.volumes.remove(id).expect("looked up above"))
    }

    /// The snapshot with `id`.
    pub fn snapshot(&self, id: &str) -> Result<&Snapshot, ApiError> {
        self.snapshots
            .get(id)
            .ok_or_else(|| ApiError::not_found("snapshot", id))
    }

    /// Records a snapshot of `volume_id` with the provider-chosen `id`.
    pub fn create_snapshot(
        &mut self,
        volume_id: &str,
        req: &CreateSnapshotRequest,
        id: String,
        now: &str,
    ) -> Result<Snapshot, ApiError> {
        let volume = self.volume(volume_id)?;
        check_name("name", &req.name)?;
        check_tags(&req.tags)?;
        if self.snapshots.values().any(|s| s.name == req.name) {
            return Err(ApiError::new(
                409,
                error_id::NAME_TAKEN,
                format!("a snapshot named {:?} exists", req.name),
            ));
        }
        let snapshot = Snapshot {
            id: id.clone(),
            name: req.name.clone(),
            resource_id: volume.id.clone(),
            resource_type: "volume".to_owned(),
            regions: vec![volume.region.clone()],
            min_disk_size: volume.size_gigabytes,
            size_gigabytes: volume.size_gigabytes,
            tags: req.tags.clone(),
            created_at: now.to_owned(),
        };
        self.snapshots.insert(id, snapshot.clone());
        Ok(snapshot)
    }

    /// Forgets a snapshot just created whose data could not be copied.
    pub fn forget_snapshot(&mut self, id: &str) {
        self.snapshots.remove(id);
    }

    /// A page of snapshots, oldest first.
    pub fn list_snapshots(
        &self,
        filter: &SnapshotFilter,
        page: PageRequest,
    ) -> (Vec<Snapshot>, Option<u32>, u64) {
        let mut found: Vec<&Snapshot> = self
            .snapshots
            .values()
            .filter(|s| filter.name.as_ref().is_none_or(|n| *n == s.name))
            .filter(|s| {
                filter
                    .resource_id
                    .as_ref()
                    .is_none_or(|r| *r == s.resource_id)
            })
            .collect();
        found.sort_by(|a, b| (&a.created_at, &a.id).cmp(&(&b.created_at, &b.id)));
        paginate(found, page)
    }

    /// Deletes a snapshot (volumes made from it keep their data).
    pub fn delete_snapshot(&mut self, id: &str) -> Result<Snapshot, ApiError> {
        self.snapshots
            .remove(id)
            .ok_or_else(|| ApiError::not_found("snapshot", id))
    }

    /// The action with `id`.
    pub fn action(&self, id: u64) -> Result<&Action, ApiError> {
        self.actions
            .get(&id)
            .ok_or_else(|| ApiError::not_found("action", &id.to_string()))
    }

    /// A page of a volume's actions, newest first.
    pub fn list_actions(
        &self,
        volume_id: &str,
        page: PageRequest,
    ) -> Result<(Vec<Action>, Option<u32>, u64), ApiError> {
        self.volume(volume_id)?;
        let found: Vec<&Action> = self
            .actions
            .values()
            .rev()
            .filter(|a| a.resource_id == volume_id)
            .collect();
        Ok(paginate(found, page))
    }

    /// Actions that have not ended (to resume after a restart).
    pub fn running(&self) -> Vec<Action> {
        self.actions
            .values()
            .filter(|a| a.status == ActionStatus::InProgress)
            .cloned()
            .collect()
    }

    fn running_on(&self, volume_id: &str) -> Option<&Action> {
        self.actions
            .values()
            .find(|a| a.status == ActionStatus::InProgress && a.resource_id == volume_id)
    }

    /// Starts an action on a volume after checking it may run now; it stays
    /// `in-progress` until [`finish_action`](Self::finish_action).
    pub fn start_action(
        &mut self,
        limits: &Limits,
        volume_id: &str,
        req: &ActionRequest,
        now: &str,
    ) -> Result<Action, ApiError> {
        let volume = self.volume(volume_id)?;
        if let Some(running) = self.running_on(volume_id) {
            return Err(ApiError::in_progress(running));
        }
        let mut node_id = None;
        let mut size = None;
        match req.kind {
            ActionKind::Attach => {
                let node = check_node(req.node_id.as_ref())?;
                if volume.node_ids.iter().any(|n| n == node) {
                    return Err(ApiError::new(
                        422,
                        error_id::ALREADY_ATTACHED,
                        format!("volume {volume_id} is already attached to node {node}"),
                    ));
                }
                if let Some(other) = volume.node_ids.first() {
                    let mut e = ApiError::new(
                        409,
                        error_id::ATTACHED_ELSEWHERE,
                        format!("volume {volume_id} is attached to node {other}"),
                    );
                    e.body.node_id = Some(other.clone());
                    return Err(e);
                }
                let on_node = self
                    .volumes
                    .values()
                    .filter(|v| v.node_ids.iter().any(|n| n == node))
                    .count()
                    + self
                        .actions
                        .values()
                        .filter(|a| {
                            a.status == ActionStatus::InProgress
                                && a.kind == ActionKind::Attach
                                && a.node_id.as_deref() == Some(node)
                        })
                        .count();
                if on_node >= limits.max_volumes_per_node {
                    return Err(ApiError::new(
                        422,
                        error_id::ATTACH_LIMIT,
                        format!("node {node} has {on_node} volumes attached, the most it may have"),
                    ));
                }
                node_id = Some(node.to_owned());
            }
            ActionKind::Detach => {
                let node = check_node(req.node_id.as_ref())?;
                if !volume.node_ids.iter().any(|n| n == node) {
                    return Err(ApiError::new(
                        422,
                        error_id::NOT_ATTACHED,
                        format!("volume {volume_id} is not attached to node {node}"),
                    ));
                }
                node_id = Some(node.to_owned());
            }
            ActionKind::Resize => {
                let new = req
                    .size_gigabytes
                    .ok_or_else(|| ApiError::field("size_gigabytes", "required for resize"))?;
                if new < volume.size_gigabytes {
                    return Err(ApiError::field(
                        "size_gigabytes",
                        format!("volumes only grow: {new} < {}", volume.size_gigabytes),
                    ));
                }
                if new > limits.max_size_gigabytes {
                    return Err(ApiError::field(
                        "size_gigabytes",
                        format!("at most {}", limits.max_size_gigabytes),
                    ));
                }
                size = Some(new);
            }
        }
        let region_slug = volume.region.clone();
        self.next_action_id += 1;
        let action = Action {
            id: self.next_action_id,
            status: ActionStatus::InProgress,
            kind: req.kind,
            resource_id: volume_id.to_owned(),
            resource_type: "volume".to_owned(),
            region_slug,
            node_id,
            size_gigabytes: size,
            started_at: now.to_owned(),
            completed_at: None,
            error: None,
        };
        self.actions.insert(action.id, action.clone());
        self.prune_actions();
        Ok(action)
    }

    /// Ends an action: `Ok` applies it to its volume, `Err` leaves the volume
    /// as it was and records why. Returns the ended action.
    pub fn finish_action(
        &mut self,
        id: u64,
        outcome: Result<(), String>,
        now: &str,
    ) -> Option<Action> {
        let action = self.actions.get_mut(&id)?;
        if action.status != ActionStatus::InProgress {
            return Some(action.clone());
        }
        action.completed_at = Some(now.to_owned());
        match outcome {
            Err(why) => {
                action.status = ActionStatus::Errored;
                action.error = Some(why);
            }
            Ok(()) => {
                action.status = ActionStatus::Completed;
                if let Some(volume) = self.volumes.get_mut(&action.resource_id) {
                    match (action.kind, &action.node_id, action.size_gigabytes) {
                        (ActionKind::Attach, Some(node), _) => volume.node_ids = vec![node.clone()],
                        (ActionKind::Detach, Some(node), _) => {
                            volume.node_ids.retain(|n| n != node)
                        }
                        (ActionKind::Resize, _, Some(size)) => volume.size_gigabytes = size,
                        _ => {}
                    }
                }
            }
        }
        Some(action.clone())
    }

    fn prune_actions(&mut self) {
        let finished: Vec<u64> = self
            .actions
            .values()
            .filter(|a| a.status != ActionStatus::InProgress)
            .map(|a| a.id)
            .collect();
        let excess = finished.len().saturating_sub(FINISHED_ACTIONS_KEPT);
        for id in &finished[..excess] {
            self.actions.remove(id);
        }
    }

    /// Forgets every attachment (the `--cleanup` path, after detaching them all).
    pub fn clear_attachments(&mut self, now: &str) {
        for action in self.running() {
            self.finish_action(action.id, Err("cancelled by cleanup".to_owned()), now);
        }
        for volume in self.volumes.values_mut() {
            volume.node_ids.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> String {
        format!("00000000-0000-4000-8000-0000000000{n:02x}")
    }

    fn create(cloud: &mut Cloud, name: &str, n: u8) -> Result<Volume, ApiError> {
        let req = CreateVolumeRequest {
            name: name.into(),
            size_gigabytes: 1,
            ..Default::default()
        };
        cloud.create_volume(&Limits::default(), &req, id(n), "2026-01-01T00:00:00Z")
    }

    fn act(cloud: &mut Cloud, vol: u8, kind: ActionKind, node: &str) -> Result<Action, ApiError> {
        let req = ActionRequest {
            kind,
            node_id: Some(node.into()),
            size_gigabytes: None,
        };
        cloud.start_action(&Limits::default(), &id(vol), &req, "t")
    }

    #[test]
    fn names_are_unique_per_region_and_fields_are_named() {
        let mut cloud = Cloud::default();
        create(&mut cloud, "a", 1).unwrap();
        let e = create(&mut cloud, "a", 2).unwrap_err();
        assert_eq!((e.status, e.body.id.as_str()), (409, error_id::NAME_TAKEN));
        let e = create(&mut cloud, "", 3).unwrap_err();
        assert!(e.body.message.starts_with("name:"), "{e:?}");
    }

    #[test]
    fn attach_rules_follow_a_cloud() {
        let mut cloud = Cloud::default();
        create(&mut cloud, "a", 1).unwrap();
        let a = act(&mut cloud, 1, ActionKind::Attach, "n1").unwrap();
        let e = act(&mut cloud, 1, ActionKind::Attach, "n1").unwrap_err();
        assert_eq!(
            e.body.action_id,
            Some(a.id),
            "a retry finds the running action"
        );
        cloud.finish_action(a.id, Ok(()), "t");
        assert_eq!(cloud.volume(&id(1)).unwrap().node_ids, ["n1"]);
        let e = act(&mut cloud, 1, ActionKind::Attach, "n1").unwrap_err();
        assert_eq!(
            (e.status, e.body.id.as_str()),
            (422, error_id::ALREADY_ATTACHED)
        );
        let e = act(&mut cloud, 1, ActionKind::Attach, "n2").unwrap_err();
        assert_eq!(e.body.node_id.as_deref(), Some("n1"));
        let e = cloud.delete_volume(&id(1)).unwrap_err();
        assert_eq!(e.body.id, error_id::VOLUME_ATTACHED);
        let e = act(&mut cloud, 1, ActionKind::Detach, "n2").unwrap_err();
        assert_eq!(e.body.id, error_id::NOT_ATTACHED);
        let d = act(&mut cloud, 1, ActionKind::Detach, "n1").unwrap();
        cloud.finish_action(d.id, Err("boom".into()), "t");
        assert_eq!(
            cloud.volume(&id(1)).unwrap().node_ids,
            ["n1"],
            "errored: unchanged"
        );
        let d = act(&mut cloud, 1, ActionKind::Detach, "n1").unwrap();
        cloud.finish_action(d.id, Ok(()), "t");
        cloud.delete_volume(&id(1)).unwrap();
    }

    #[test]
    fn attach_limit_counts_running_attaches() {
        let mut cloud = Cloud::default();
        let limits = Limits {
            max_volumes_per_node: 1,
            ..Limits::default()
        };
        create(&mut cloud, "a", 1).unwrap();
        create(&mut cloud, "b", 2).unwrap();
        let req = ActionRequest {
            kind: ActionKind::Attach,
            node_id: Some("n".into()),
            size_gigabytes: None,
        };
        cloud.start_action(&limits, &id(1), &req, "t").unwrap();
        let e = cloud.start_action(&limits, &id(2), &req, "t").unwrap_err();
        assert_eq!(e.body.id, error_id::ATTACH_LIMIT);
    }

    #[test]
    fn pages_cover_everything_once() {
        let mut cloud = Cloud::default();
        for n in 0..5 {
            create(&mut cloud, &format!("v{n}"), n).unwrap();
        }
        let mut seen = Vec::new();
        let mut page = PageRequest {
            page: 1,
            per_page: 2,
        };
        loop {
            let (items, next, total) = cloud.list_volumes(&VolumeFilter::default(), page);
            assert_eq!(total, 5);
            seen.extend(items.into_iter().map(|v| v.name));
            match next {
                Some(p) => page.page = p,
                None => break,
            }
        }
        assert_eq!(seen, ["v0", "v1", "v2", "v3", "v4"]);
    }

    #[test]
    fn provider_ids_are_canonical_uuids_only() {
        assert!(is_provider_id(&id(1)));
        assert!(!is_provider_id("../state.json"));
        assert!(!is_provider_id(&id(0xab).to_uppercase()));
    }
}
