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
    Action, CreateVolumeRequest, ErrorBody, PageRequest, Region, Snapshot, Volume, VolumeFilter,
    error_id,
};

mod actions;
mod snapshots;
#[cfg(test)]
mod tests;

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
    /// The nodes (a cloud's machines) volumes can be attached to; an
    /// attach to another is 404. Empty: any node.
    pub nodes: Vec<String>,
}

impl Limits {
    /// The regions as the API lists them: every one available.
    pub fn region_list(&self) -> Vec<Region> {
        let region = |slug: &String| Region {
            slug: slug.clone(),
            available: true,
        };
        self.regions.iter().map(region).collect()
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            regions: vec!["dev-1".to_owned()],
            max_size_gigabytes: 16 * 1024,
            max_volumes_per_node: 7,
            nodes: Vec::new(),
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
        if let Some(source) = &req.source_volume_id {
            self.check_clone(source, &region, req)?;
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

    /// A clone's source: another volume of the region, no larger than the
    /// clone, and the only source.
    fn check_clone(
        &self,
        source: &str,
        region: &str,
        req: &CreateVolumeRequest,
    ) -> Result<(), ApiError> {
        if req.snapshot_id.is_some() {
            let why = "cannot be given with snapshot_id";
            return Err(ApiError::field("source_volume_id", why));
        }
        let volume =
            (self.volumes.get(source)).ok_or_else(|| ApiError::not_found("volume", source))?;
        if volume.region != region {
            let why = format!(
                "volume {source} is in region {}, not {region}",
                volume.region
            );
            return Err(ApiError::field("source_volume_id", why));
        }
        if req.size_gigabytes < volume.size_gigabytes {
            let why = format!(
                "must be at least the source volume's size ({})",
                volume.size_gigabytes
            );
            return Err(ApiError::field("size_gigabytes", why));
        }
        Ok(())
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
        let volume = self.volumes.remove(id).expect("looked up above");
        // Its actions go with it: none is running, nothing polls an ended one
        // once the volume is gone, and every change saves the whole cloud.
        self.actions.retain(|_, a| a.resource_id != id);
        Ok(volume)
    }
}
