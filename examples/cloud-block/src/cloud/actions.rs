//! Actions: attach, detach and resize, started in progress and ended later.

use super::{ApiError, Cloud, FINISHED_ACTIONS_KEPT, Limits, check_node, paginate};
use crate::api::{Action, ActionKind, ActionRequest, ActionStatus, PageRequest, error_id};

impl Cloud {
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

    pub(super) fn running_on(&self, volume_id: &str) -> Option<&Action> {
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
                if !limits.nodes.is_empty() && !limits.nodes.iter().any(|n| n == node) {
                    return Err(ApiError::not_found("node", node));
                }
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
