//! The provider's wire format: the JSON bodies of its HTTP API, shared by the
//! provider process and the client so the two cannot drift apart.
//!
//! The shape follows a public cloud's block storage API (DigitalOcean's is the
//! model): objects wrapped in a one-key envelope (`{"volume": {...}}`), lists
//! paged by `page`/`per_page` with `links.pages.next` and `meta.total`,
//! attach/detach/resize as actions polled until they leave `in-progress`, and
//! errors as `{"id": ..., "message": ...}`.

use serde::{Deserialize, Serialize};

/// Prefix of the stable by-id link an attach creates in the device directory;
/// the full name is `csi-kit-cloud-<volume id>` ([`device_link_name`]).
pub const DEVICE_LINK_PREFIX: &str = "csi-kit-cloud-";

/// The by-id link name under which an attached volume's device appears (what
/// a node plugin waits for, like `/dev/disk/by-id/scsi-0DO_Volume_<name>`).
pub fn device_link_name(volume_id: &str) -> String {
    format!("{DEVICE_LINK_PREFIX}{volume_id}")
}

/// Bytes in a GiB, the unit of every size in the API.
pub const GIB: u64 = 1 << 30;

/// Default page size of list calls.
pub const DEFAULT_PER_PAGE: u32 = 20;
/// Largest page size the provider serves.
pub const MAX_PER_PAGE: u32 = 200;

/// A block storage volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Volume {
    /// Provider-assigned id (a UUID).
    pub id: String,
    /// Unique per region; what a CSI driver looks volumes up by.
    pub name: String,
    /// Free text.
    #[serde(default)]
    pub description: String,
    /// Region slug: where the volume lives and which nodes can use it.
    pub region: String,
    /// Size in GiB.
    pub size_gigabytes: u64,
    /// Nodes the volume is attached to (at most one; completed attaches only).
    #[serde(default)]
    pub node_ids: Vec<String>,
    /// Tags given at creation.
    #[serde(default)]
    pub tags: Vec<String>,
    /// The snapshot it was created from, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<String>,
    /// RFC 3339 creation time.
    pub created_at: String,
}

impl Volume {
    /// The size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.size_gigabytes.saturating_mul(GIB)
    }
}

/// A point-in-time copy of a volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Provider-assigned id (a UUID).
    pub id: String,
    /// Unique among snapshots.
    pub name: String,
    /// The volume it was taken from (which may since have been deleted).
    pub resource_id: String,
    /// Always `volume`.
    pub resource_type: String,
    /// Regions it can be restored in.
    pub regions: Vec<String>,
    /// The smallest volume (GiB) it can be restored to: the source's size.
    pub min_disk_size: u64,
    /// Size of the copy in GiB.
    pub size_gigabytes: u64,
    /// Tags given at creation.
    #[serde(default)]
    pub tags: Vec<String>,
    /// RFC 3339 creation time.
    pub created_at: String,
}

impl Snapshot {
    /// The size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.size_gigabytes.saturating_mul(GIB)
    }
}

/// What an action does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionKind {
    /// Attach a volume to a node.
    Attach,
    /// Detach a volume from a node.
    Detach,
    /// Grow a volume.
    Resize,
}

/// Where an action is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ActionStatus {
    /// Still running: poll again.
    InProgress,
    /// Done.
    Completed,
    /// Failed; nothing changed (see [`Action::error`]).
    Errored,
}

/// An asynchronous operation on a volume, polled until it completes or errs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Action {
    /// Provider-assigned, increasing.
    pub id: u64,
    /// Where it is.
    pub status: ActionStatus,
    /// What it does.
    #[serde(rename = "type")]
    pub kind: ActionKind,
    /// The volume.
    pub resource_id: String,
    /// Always `volume`.
    pub resource_type: String,
    /// The volume's region.
    pub region_slug: String,
    /// The node of an attach or detach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    /// The new size of a resize (GiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_gigabytes: Option<u64>,
    /// RFC 3339 start time.
    pub started_at: String,
    /// RFC 3339 end time, once it has ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<String>,
    /// Why it errored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A region volumes can be created in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Region {
    /// Its slug, for example `dev-1`.
    pub slug: String,
    /// Whether volumes can be created there.
    pub available: bool,
}

/// `POST /v2/volumes`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateVolumeRequest {
    /// Unique per region.
    pub name: String,
    /// Size in GiB.
    pub size_gigabytes: u64,
    /// Region slug; the provider's first region when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Free text.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// Create from this snapshot (size at least its `min_disk_size`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<String>,
    /// Create as a copy of this volume of the same region (size at least
    /// its size; not with `snapshot_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_volume_id: Option<String>,
    /// Tags.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

/// `POST /v2/volumes/{id}/snapshots`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshotRequest {
    /// Unique among snapshots.
    pub name: String,
    /// Tags.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

/// `POST /v2/volumes/{id}/actions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionRequest {
    /// What to do.
    #[serde(rename = "type")]
    pub kind: ActionKind,
    /// The node, for attach and detach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    /// The new size, for resize.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_gigabytes: Option<u64>,
}

/// One page of a list, as the client returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    /// This page's items.
    pub items: Vec<T>,
    /// The page to ask for next, if there is one.
    pub next_page: Option<u32>,
    /// How many items match in all.
    pub total: u64,
}

/// Which page of a list to fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRequest {
    /// 1-based page number.
    pub page: u32,
    /// Items per page (1 to [`MAX_PER_PAGE`]).
    pub per_page: u32,
}

impl Default for PageRequest {
    fn default() -> Self {
        PageRequest {
            page: 1,
            per_page: DEFAULT_PER_PAGE,
        }
    }
}

/// Filters of `GET /v2/volumes`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeFilter {
    /// Only the volume with this exact name.
    pub name: Option<String>,
    /// Only volumes in this region.
    pub region: Option<String>,
}

/// Filters of `GET /v2/snapshots`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotFilter {
    /// Only the snapshot with this exact name.
    pub name: Option<String>,
    /// Only snapshots of this volume.
    pub resource_id: Option<String>,
}

/// The body of every error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// Machine-readable reason (see [`error_id`]).
    pub id: String,
    /// For people; names the field of a bad request.
    pub message: String,
    /// The action already running on the volume (`action_in_progress`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action_id: Option<u64>,
    /// The node the volume is attached to (`attached_elsewhere`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
}

/// The `id`s of [`ErrorBody`], one per reason a caller decides on.
pub mod error_id {
    /// 400: the body or query could not be read.
    pub const BAD_REQUEST: &str = "bad_request";
    /// 401: no token or the wrong one.
    pub const UNAUTHORIZED: &str = "unauthorized";
    /// 404: no such volume, snapshot or action.
    pub const NOT_FOUND: &str = "not_found";
    /// 409: the name is taken (in the region, for volumes).
    pub const NAME_TAKEN: &str = "name_taken";
    /// 409: attached (or being attached) to another node.
    pub const ATTACHED_ELSEWHERE: &str = "attached_elsewhere";
    /// 409: another action on the volume has not ended.
    pub const ACTION_IN_PROGRESS: &str = "action_in_progress";
    /// 409: a delete of a volume that is attached.
    pub const VOLUME_ATTACHED: &str = "volume_attached";
    /// 422: an attach to the node the volume is already attached to.
    pub const ALREADY_ATTACHED: &str = "already_attached";
    /// 422: a detach from a node the volume is not attached to.
    pub const NOT_ATTACHED: &str = "not_attached";
    /// 422: the node has as many volumes as it may.
    pub const ATTACH_LIMIT: &str = "attach_limit";
    /// 422: a field's value is not acceptable (the message names it).
    pub const UNPROCESSABLE: &str = "unprocessable_entity";
    /// 429: slow down; `Retry-After` says for how long.
    pub const TOO_MANY_REQUESTS: &str = "too_many_requests";
    /// 500: the provider failed.
    pub const SERVER_ERROR: &str = "server_error";
    /// 503: the provider is unavailable.
    pub const UNAVAILABLE: &str = "service_unavailable";
}

/// `{"volume": ...}`.
#[derive(Debug, Serialize, Deserialize)]
pub struct VolumeEnvelope {
    /// The volume.
    pub volume: Volume,
}

/// `{"snapshot": ...}`.
#[derive(Debug, Serialize, Deserialize)]
pub struct SnapshotEnvelope {
    /// The snapshot.
    pub snapshot: Snapshot,
}

/// `{"action": ...}`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ActionEnvelope {
    /// The action.
    pub action: Action,
}

/// `{"regions": [...]}`.
#[derive(Debug, Serialize, Deserialize)]
pub struct RegionsEnvelope {
    /// Every region.
    pub regions: Vec<Region>,
}

/// `links` of a list answer.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Links {
    /// Neighbouring pages.
    #[serde(default)]
    pub pages: PageLinks,
}

/// `links.pages`: the URL of the next page, absent on the last one.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct PageLinks {
    /// The next page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// `meta` of a list answer.
#[derive(Debug, Serialize, Deserialize)]
pub struct Meta {
    /// Items matching in all pages.
    pub total: u64,
}

/// `{"volumes": [...], "links": ..., "meta": ...}`.
#[derive(Debug, Serialize, Deserialize)]
pub struct VolumeList {
    /// This page.
    pub volumes: Vec<Volume>,
    /// The next page.
    #[serde(default)]
    pub links: Links,
    /// The total.
    pub meta: Meta,
}

/// `{"snapshots": [...], "links": ..., "meta": ...}`.
#[derive(Debug, Serialize, Deserialize)]
pub struct SnapshotList {
    /// This page.
    pub snapshots: Vec<Snapshot>,
    /// The next page.
    #[serde(default)]
    pub links: Links,
    /// The total.
    pub meta: Meta,
}

/// `{"actions": [...], "links": ..., "meta": ...}`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ActionList {
    /// This page.
    pub actions: Vec<Action>,
    /// The next page.
    #[serde(default)]
    pub links: Links,
    /// The total.
    pub meta: Meta,
}

/// The `page` number in a `links.pages.next` URL.
pub fn page_of_link(url: &str) -> Option<u32> {
    let query = url.split_once('?')?.1;
    query
        .split('&')
        .find_map(|pair| pair.strip_prefix("page="))
        .and_then(|n| n.parse().ok())
}

/// Formats a time as RFC 3339 in UTC with second precision.
pub fn rfc3339(time: std::time::SystemTime) -> String {
    let secs = time
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Days to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Reads a time written by [`rfc3339`] (`YYYY-MM-DDTHH:MM:SSZ`, UTC).
pub fn parse_rfc3339(text: &str) -> Option<std::time::SystemTime> {
    let b = text.as_bytes();
    let shape_ok = b.len() == 20
        && [4, 7].iter().all(|&i| b[i] == b'-')
        && b[10] == b'T'
        && [13, 16].iter().all(|&i| b[i] == b':')
        && b[19] == b'Z';
    if !shape_ok {
        return None;
    }
    let num = |range: std::ops::Range<usize>| -> Option<i64> { text.get(range)?.parse().ok() };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    // A civil date to days (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second;
    u64::try_from(secs)
        .ok()
        .map(|s| std::time::UNIX_EPOCH + std::time::Duration::from_secs(s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_709_210_096);
        assert_eq!(rfc3339(t), "2024-02-29T12:34:56Z");
        assert_eq!(parse_rfc3339("2024-02-29T12:34:56Z"), Some(t));
        let now = std::time::SystemTime::now();
        let whole =
            UNIX_EPOCH + Duration::from_secs(now.duration_since(UNIX_EPOCH).unwrap().as_secs());
        assert_eq!(parse_rfc3339(&rfc3339(now)), Some(whole));
        for bad in [
            "",
            "2024-02-29 12:34:56Z",
            "2024-13-01T00:00:00Z",
            "2024-02-29T12:34:56+01:00",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn next_link_gives_its_page() {
        assert_eq!(
            page_of_link("http://h/v2/volumes?name=a&page=3&per_page=2"),
            Some(3)
        );
        assert_eq!(page_of_link("http://h/v2/volumes"), None);
    }

    #[test]
    fn actions_use_the_cloud_spelling() {
        let json = serde_json::to_value(ActionStatus::InProgress).unwrap();
        assert_eq!(json, "in-progress");
        let req: ActionRequest =
            serde_json::from_str(r#"{"type":"attach","node_id":"n1"}"#).unwrap();
        assert_eq!(req.kind, ActionKind::Attach);
        let err = serde_json::from_str::<ActionRequest>(r#"{"type":"attach","droplet":1}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("droplet"), "{err}");
    }
}
