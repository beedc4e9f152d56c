//! Generic pieces shared by the example drivers (hostpath, loop-block),
//! included from each `main.rs` with `#[path = "../common/mod.rs"] mod common;`.
//! Nothing here knows about one driver's records or layout.
// Each example uses a different subset of these helpers.
#![allow(dead_code)]

pub mod state;

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, OpenOptions};
use std::path::Path;

use csi_proto::v1::{
    ControllerUnpublishVolumeRequest, CreateVolumeGroupSnapshotRequest,
    DeleteVolumeGroupSnapshotRequest, GetVolumeGroupSnapshotRequest,
    GetVolumeGroupSnapshotResponse, Snapshot, ValidateVolumeCapabilitiesRequest,
    ValidateVolumeCapabilitiesResponse, VolumeCapability, VolumeContentSource, VolumeGroupSnapshot,
    validate_volume_capabilities_response, volume_content_source,
};
use csi_server::helpers::paging::{Page, paginate};
use csi_server::{CsiError, CsiResult};
use serde::{Deserialize, Serialize};

/// Runs blocking file and mount work off the async runtime.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> CsiResult<T> + Send + 'static,
) -> CsiResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(CsiError::Internal(format!("blocking task failed: {e}"))))
}

/// An INTERNAL error naming the path it happened on.
pub fn internal(what: &str, path: &Path, e: impl std::fmt::Display) -> CsiError {
    CsiError::Internal(format!("{what} {}: {e}", path.display()))
}

/// An I/O failure on `path`: RESOURCE_EXHAUSTED when the filesystem (or a
/// quota) is full, so the CO backs off instead of retrying at once;
/// INTERNAL otherwise.
pub fn io_failure(what: &str, path: &Path, e: std::io::Error) -> CsiError {
    if matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)) {
        return CsiError::ResourceExhausted(format!("{what} {}: {e}", path.display()));
    }
    internal(what, path, e)
}

/// A failed copy, as [`io_failure`] classifies it.
pub fn copy_failure(e: tree_copy::CopyError) -> CsiError {
    if e.is_no_space() {
        CsiError::ResourceExhausted(e.to_string())
    } else {
        CsiError::Internal(e.to_string())
    }
}

/// Sets up logging to stderr; `RUST_LOG` wins over `default_filter`.
pub fn init_tracing(default_filter: &str) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// clap value parser for sizes in bytes or with a suffix (10Gi).
pub fn parse_size(text: &str) -> Result<i64, String> {
    csi_proto::size::parse_bytes(text).ok_or_else(|| format!("{text:?} is not a size like 10Gi"))
}

/// `nodeid`, or the hostname when it is not given.
pub fn node_id_or_hostname(nodeid: Option<&str>) -> String {
    nodeid.map(str::to_owned).unwrap_or_else(|| {
        nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".to_owned())
    })
}

/// Nanoseconds since the epoch (0 if the clock is before it).
pub fn now_nanos() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0)
}

/// A protobuf timestamp from [`now_nanos`]-style nanoseconds.
pub fn timestamp(nanos: i128) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: (nanos / 1_000_000_000) as i64,
        nanos: (nanos % 1_000_000_000) as i32,
    }
}

/// A wire map from a stored (sorted) one.
pub fn to_map(m: &BTreeMap<String, String>) -> HashMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// A stored (sorted, so the state file is stable) map from a wire one.
pub fn sorted(m: &HashMap<String, String>) -> BTreeMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// How a volume is consumed: the access type it was created for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Access {
    /// Through a filesystem.
    Mount,
    /// As a raw block device.
    Block,
}

/// The one access type of a set of capabilities (mixing is INVALID_ARGUMENT).
pub fn access_of(caps: &[VolumeCapability]) -> CsiResult<Access> {
    let block = caps.iter().any(VolumeCapability::is_block);
    let mount = caps.iter().any(|c| !c.is_block());
    match (block, mount) {
        (true, true) => Err(CsiError::invalid(
            "volume_capabilities",
            "cannot mix block and mount access for one volume",
        )),
        (true, false) => Ok(Access::Block),
        _ => Ok(Access::Mount),
    }
}

/// Where a volume's initial contents came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Source {
    /// Restored from a snapshot.
    Snapshot(String),
    /// Cloned from a volume.
    Volume(String),
}

impl Source {
    /// The source a CreateVolume request names, if any.
    pub fn of(content: Option<&VolumeContentSource>) -> Option<Source> {
        match content?.r#type.as_ref()? {
            volume_content_source::Type::Snapshot(s) => {
                Some(Source::Snapshot(s.snapshot_id.clone()))
            }
            volume_content_source::Type::Volume(v) => Some(Source::Volume(v.volume_id.clone())),
        }
    }

    /// The wire form.
    pub fn message(&self) -> VolumeContentSource {
        use volume_content_source::{SnapshotSource, Type, VolumeSource};
        VolumeContentSource {
            r#type: Some(match self {
                Source::Snapshot(id) => Type::Snapshot(SnapshotSource {
                    snapshot_id: id.clone(),
                }),
                Source::Volume(id) => Type::Volume(VolumeSource {
                    volume_id: id.clone(),
                }),
            }),
        }
    }
}

/// ControllerUnpublish on an attachment map: an empty node id detaches
/// from every node; a node it is not attached to is fine.
pub fn forget_attachment(
    attached: &mut BTreeMap<String, bool>,
    req: &ControllerUnpublishVolumeRequest,
) {
    if req.node_id.is_empty() {
        attached.clear();
    } else {
        attached.remove(&req.node_id);
    }
}

/// ValidateVolumeCapabilities' answer when everything asked for is supported.
pub fn confirmed(req: ValidateVolumeCapabilitiesRequest) -> ValidateVolumeCapabilitiesResponse {
    ValidateVolumeCapabilitiesResponse {
        confirmed: Some(validate_volume_capabilities_response::Confirmed {
            volume_context: req.volume_context,
            volume_capabilities: req.volume_capabilities,
            parameters: req.parameters,
            mutable_parameters: req.mutable_parameters,
        }),
        message: String::new(),
    }
}

/// One page of `all` (csi-server's paging rules), each entry mapped by `entry`.
pub fn page<T, E>(
    all: Vec<&T>,
    max_entries: i32,
    starting_token: &str,
    entry: impl Fn(&T) -> E,
) -> CsiResult<(Vec<E>, String)> {
    paginate(all, max_entries, starting_token).map(
        |Page {
             entries,
             next_token,
         }| (entries.into_iter().map(entry).collect(), next_token),
    )
}

/// Kinds of generated ids, each with its prefix.
#[derive(Debug, Clone, Copy)]
pub enum IdKind {
    Volume,
    Snapshot,
    GroupSnapshot,
}

impl IdKind {
    fn prefix(self) -> &'static str {
        match self {
            IdKind::Volume => "vol-",
            IdKind::Snapshot => "snap-",
            IdKind::GroupSnapshot => "group-",
        }
    }

    /// A fresh id.
    pub fn generate(self) -> String {
        format!("{}{}", self.prefix(), uuid::Uuid::new_v4().simple())
    }

    /// Whether `id` is one this driver could have generated. Ids become
    /// paths, so anything else (`../../etc`, `a/b`, NUL) is rejected before
    /// it touches the filesystem.
    pub fn is_valid(self, id: &str) -> bool {
        id.strip_prefix(self.prefix()).is_some_and(|hex| {
            hex.len() == 32
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        })
    }
}

/// Creates (or keeps) a sparse file of `size` bytes, synced.
pub fn create_sparse(path: &Path, size: i64) -> CsiResult<()> {
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| io_failure("creating", path, e))?;
    f.set_len(size as u64)
        .map_err(|e| io_failure("sizing", path, e))?;
    f.sync_all().map_err(|e| io_failure("syncing", path, e))
}

/// Grows a file to `size` bytes (never shrinks it).
pub fn grow_file(path: &Path, size: i64) -> CsiResult<()> {
    let f = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| internal("opening", path, e))?;
    let current = f
        .metadata()
        .map_err(|e| internal("reading", path, e))?
        .len();
    if (size as u64) > current {
        f.set_len(size as u64)
            .map_err(|e| io_failure("growing", path, e))?;
        f.sync_all().map_err(|e| io_failure("syncing", path, e))?;
    }
    Ok(())
}

/// Removes a file; an absent one is fine (idempotent delete).
pub fn remove_file_if_present(path: &Path) -> CsiResult<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(internal("removing", path, e)),
        _ => Ok(()),
    }
}

/// Copies an image to a new file, sharing extents where the filesystem can
/// and keeping holes otherwise (std::fs::copy promises neither), synced.
/// Nothing is left at `dst` on error.
pub fn copy_sparse(src: &Path, dst: &Path) -> CsiResult<()> {
    tree_copy::copy_file(src, dst)
        .map(drop)
        .map_err(copy_failure)
}

/// Records a ControllerPublish of a volume to `node` in its attachment map
/// (node → read-only). A repeat with the same read-only flag is OK, another
/// flag is ALREADY_EXISTS, a second node for a single-node capability is
/// FAILED_PRECONDITION.
pub fn record_attachment(
    volume_id: &str,
    attached: &mut BTreeMap<String, bool>,
    node: &str,
    readonly: bool,
    multi_node: bool,
) -> CsiResult<()> {
    if let Some(was) = attached.get(node) {
        if *was == readonly {
            return Ok(());
        }
        return Err(CsiError::AlreadyExists(format!(
            "volume {volume_id} is published to {node} with readonly={was}"
        )));
    }
    if let Some(other) = attached.keys().next().filter(|_| !multi_node) {
        return Err(CsiError::FailedPrecondition(format!(
            "volume {volume_id} is published to node {other}"
        )));
    }
    attached.insert(node.to_owned(), readonly);
    Ok(())
}

/// Free bytes of the filesystem holding `dir` (0 when it cannot be read).
pub fn free_space(dir: &Path) -> i64 {
    nix::sys::statvfs::statvfs(dir)
        .map(|s| s.blocks_available() as i64 * s.fragment_size() as i64)
        .unwrap_or(0)
}

/// A group snapshot: member snapshots cut at one point in time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupSnapshotRecord {
    pub id: String,
    pub name: String,
    pub source_volume_ids: Vec<String>,
    pub snapshot_ids: Vec<String>,
    pub parameters: BTreeMap<String, String>,
    pub created_unix_nanos: i128,
}

impl GroupSnapshotRecord {
    /// The wire form, with the members' messages.
    pub fn message(&self, snapshots: Vec<Snapshot>) -> VolumeGroupSnapshot {
        VolumeGroupSnapshot {
            group_snapshot_id: self.id.clone(),
            snapshots,
            creation_time: Some(timestamp(self.created_unix_nanos)),
            ready_to_use: true,
        }
    }

    /// A repeated CreateVolumeGroupSnapshot under this group's name must
    /// name the same volumes (in any order) and parameters.
    pub fn check_repeat(&self, req: &CreateVolumeGroupSnapshotRequest) -> CsiResult<()> {
        let mut ours = self.source_volume_ids.clone();
        let mut theirs = req.source_volume_ids.clone();
        ours.sort();
        theirs.sort();
        if ours != theirs || self.parameters != sorted(&req.parameters) {
            return Err(CsiError::AlreadyExists(format!(
                "group snapshot {:?} exists with other source volumes or parameters",
                req.name
            )));
        }
        Ok(())
    }

    /// `snapshot_ids` sent by the CO must be exactly the members (in any
    /// order); none sent is not a mismatch (proto3 cannot tell empty from absent).
    pub fn check_members(&self, ids: &[String]) -> CsiResult<()> {
        let mut given = ids.to_vec();
        let mut ours = self.snapshot_ids.clone();
        given.sort();
        ours.sort();
        if !ids.is_empty() && given != ours {
            return Err(CsiError::invalid(
                "snapshot_ids",
                format!("not the members of group snapshot {}", self.id),
            ));
        }
        Ok(())
    }
}

/// A group and its members' messages, from a driver's records.
pub fn group_with_members<S>(
    groups: &state::Records<GroupSnapshotRecord>,
    snapshots: &state::Records<S>,
    id: &str,
    message: impl Fn(&S) -> Snapshot,
) -> Option<(GroupSnapshotRecord, Vec<Snapshot>)>
where
    S: Clone + PartialEq + Serialize + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let g = groups.get(id)?;
    let members = g
        .snapshot_ids
        .iter()
        .filter_map(|sid| snapshots.get(sid))
        .map(|s| message(&s))
        .collect();
    Some((g, members))
}

/// GetVolumeGroupSnapshot from `lookup` (see [`group_with_members`]): an
/// id this driver could not have made, or does not know, is NOT_FOUND.
pub fn get_group_snapshot(
    req: &GetVolumeGroupSnapshotRequest,
    lookup: impl FnOnce(&str) -> Option<(GroupSnapshotRecord, Vec<Snapshot>)>,
) -> CsiResult<GetVolumeGroupSnapshotResponse> {
    let id = &req.group_snapshot_id;
    let (g, members) = IdKind::GroupSnapshot
        .is_valid(id)
        .then(|| lookup(id))
        .flatten()
        .ok_or_else(|| CsiError::NotFound(format!("group snapshot {id:?} does not exist")))?;
    g.check_members(&req.snapshot_ids)?;
    Ok(GetVolumeGroupSnapshotResponse {
        group_snapshot: Some(g.message(members)),
    })
}

/// Saves a new group snapshot: its members first, then the group, so a
/// crash in between leaves members without a group, which
/// [`settle_groups`] removes at the next start.
pub fn save_group<S>(
    groups: &state::Records<GroupSnapshotRecord>,
    snapshots: &state::Records<S>,
    group: &GroupSnapshotRecord,
    members: &[(String, S)],
) -> CsiResult<()>
where
    S: Clone + PartialEq + Serialize + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    for (id, snap) in members {
        snapshots.put(id, snap.clone())?;
    }
    groups.put(&group.id, group.clone())?;
    Ok(())
}

/// DeleteVolumeGroupSnapshot's change to the records: the members go
/// first, then the group (a crash in between leaves a group missing
/// members, which [`settle_groups`] finishes removing), returned so their
/// data can be removed after. An unknown group is nothing to do.
pub fn remove_group<S>(
    groups: &state::Records<GroupSnapshotRecord>,
    snapshots: &state::Records<S>,
    req: &DeleteVolumeGroupSnapshotRequest,
) -> CsiResult<Vec<S>>
where
    S: Clone + PartialEq + Serialize + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let Some(g) = groups.get(&req.group_snapshot_id) else {
        return Ok(Vec::new());
    };
    g.check_members(&req.snapshot_ids)?;
    let mut removed = Vec::new();
    for id in &g.snapshot_ids {
        removed.extend(snapshots.remove(id)?);
    }
    groups.remove(&g.id)?;
    Ok(removed)
}

/// Startup check after a crash in the middle of saving or removing a group
/// snapshot: a group missing a member (none of them quarantined) and member
/// snapshots of a group that does not exist are removed. Returns the
/// removed snapshots, whose data goes too.
pub fn settle_groups<S>(
    groups: &state::Records<GroupSnapshotRecord>,
    snapshots: &state::Records<S>,
    group_of: fn(&S) -> Option<&str>,
    quarantined_snapshots: &std::collections::BTreeSet<String>,
) -> CsiResult<Vec<S>>
where
    S: Clone + PartialEq + Serialize + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let broken: Vec<GroupSnapshotRecord> = groups.read(|all| {
        all.values()
            .filter(|g| {
                g.snapshot_ids
                    .iter()
                    .any(|id| !snapshots.contains(id) && !quarantined_snapshots.contains(id))
            })
            .cloned()
            .collect()
    });
    let mut removed = Vec::new();
    for g in broken {
        tracing::warn!(group = %g.id, "group snapshot left half saved or half removed by a crash; removing it");
        for id in &g.snapshot_ids {
            removed.extend(snapshots.remove(id)?);
        }
        groups.remove(&g.id)?;
    }
    let strays: Vec<String> = snapshots.read(|all| {
        all.iter()
            .filter(|(_, s)| group_of(s).is_some_and(|g| !groups.contains(g)))
            .map(|(id, _)| id.clone())
            .collect()
    });
    for id in strays {
        tracing::warn!(snapshot = %id, "member of a group snapshot that was never saved; removing it");
        removed.extend(snapshots.remove(&id)?);
    }
    Ok(removed)
}

/// ControllerPublish's attach limit: a volume new to a node that already
/// has `limit` attached is RESOURCE_EXHAUSTED (0 = no limit).
pub fn check_attach_limit(
    node: &str,
    attached_here: usize,
    new_here: bool,
    limit: i64,
) -> CsiResult<()> {
    if new_here && limit > 0 && attached_here as i64 >= limit {
        return Err(CsiError::ResourceExhausted(format!(
            "node {node} has reached its limit of {limit} attached volumes"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_validated_before_use_as_paths() {
        let id = IdKind::Volume.generate();
        assert!(IdKind::Volume.is_valid(&id));
        assert!(!IdKind::Snapshot.is_valid(&id));
        for bad in [
            "../../etc",
            "vol-../../etc",
            "vol-",
            "vol-a/b",
            "vol-\0",
            &format!("{id}x"),
            &id.to_uppercase(),
        ] {
            assert!(!IdKind::Volume.is_valid(bad), "{bad:?}");
        }
    }

    #[test]
    fn attachments_follow_the_single_node_rules() {
        let mut attached = BTreeMap::new();
        record_attachment("v", &mut attached, "a", false, false).unwrap();
        record_attachment("v", &mut attached, "a", false, false).unwrap();
        assert!(matches!(
            record_attachment("v", &mut attached, "a", true, false),
            Err(CsiError::AlreadyExists(_))
        ));
        assert!(matches!(
            record_attachment("v", &mut attached, "b", false, false),
            Err(CsiError::FailedPrecondition(_))
        ));
        record_attachment("v", &mut attached, "b", false, true).unwrap();
        assert_eq!(attached.len(), 2);
    }

    #[test]
    fn sparse_files_grow_and_never_shrink() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        create_sparse(&a, 8 << 20).unwrap();
        grow_file(&a, 16 << 20).unwrap();
        grow_file(&a, 1 << 20).unwrap();
        assert_eq!(fs::metadata(&a).unwrap().len(), 16 << 20);
        copy_sparse(&a, &b).unwrap();
        assert_eq!(fs::metadata(&b).unwrap().len(), 16 << 20);
        remove_file_if_present(&b).unwrap();
        remove_file_if_present(&b).unwrap();
        assert!(!b.exists());
    }
}
