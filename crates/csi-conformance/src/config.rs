//! What the suite needs to know about the driver under test and the host.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use csi_proto::methods::Method;
use csi_proto::v1::volume_capability::access_mode::Mode;

/// How test volumes are accessed: through a filesystem or as a raw block device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SuiteAccessType {
    /// A mounted filesystem; an empty `fs_type` lets the driver pick.
    Mount {
        /// Filesystem type passed in `MountVolume.fs_type`.
        fs_type: String,
    },
    /// A raw block device.
    Block,
}

/// Which request a set of secrets belongs to: one of the RPCs whose
/// request has a `csi_secret` field (from csi-proto's method table).
pub type SecretKind = Method;

/// Every RPC whose request carries secrets, in proto order.
pub fn secret_kinds() -> impl Iterator<Item = SecretKind> {
    Method::ALL
        .iter()
        .copied()
        .filter(|m| !m.info().secret_fields.is_empty())
}

/// The key csi-sanity's secrets file uses for `kind`, e.g.
/// `CreateVolumeSecret` (csi-sanity names ValidateVolumeCapabilities
/// `ControllerValidateVolumeCapabilities`).
pub fn secrets_file_key(kind: SecretKind) -> String {
    match kind {
        Method::ValidateVolumeCapabilities => format!("Controller{}Secret", kind.name()),
        _ => format!("{}Secret", kind.name()),
    }
}

/// The kind a csi-sanity secrets-file key names.
pub fn from_secrets_file_key(key: &str) -> Option<SecretKind> {
    secret_kinds().find(|k| secrets_file_key(*k) == key)
}

/// The secrets sent with each kind of request.
///
/// By default every kind carries one entry whose value is a marker unique to
/// the run, so the suite can later prove the driver never logged it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secrets {
    by_kind: BTreeMap<SecretKind, HashMap<String, String>>,
}

impl std::fmt::Debug for Secrets {
    // Values are the very thing that must not leak; show only the shape.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.by_kind.iter().map(|(k, v)| (k, v.len())))
            .finish()
    }
}

impl Secrets {
    /// No secrets for any request.
    pub fn none() -> Self {
        Self {
            by_kind: BTreeMap::new(),
        }
    }

    /// Every kind carries `{"csi-conformance-marker": marker}`.
    pub fn with_marker(marker: &str) -> Self {
        let map: HashMap<String, String> =
            [("csi-conformance-marker".to_string(), marker.to_string())].into();
        Self {
            by_kind: secret_kinds().map(|k| (k, map.clone())).collect(),
        }
    }

    /// Builds secrets from csi-sanity style `(FileKey, map)` pairs; unknown keys
    /// are returned as the error.
    pub fn from_file_entries<I>(entries: I) -> Result<Self, String>
    where
        I: IntoIterator<Item = (String, HashMap<String, String>)>,
    {
        let mut s = Self::none();
        for (key, map) in entries {
            let kind = from_secrets_file_key(&key).ok_or(key)?;
            s.by_kind.insert(kind, map);
        }
        Ok(s)
    }

    /// Sets the secrets for one kind of request.
    pub fn set(&mut self, kind: SecretKind, secrets: HashMap<String, String>) -> &mut Self {
        self.by_kind.insert(kind, secrets);
        self
    }

    /// The secrets for one kind of request (empty when none are configured).
    pub fn get(&self, kind: SecretKind) -> HashMap<String, String> {
        self.by_kind.get(&kind).cloned().unwrap_or_default()
    }

    /// Every distinct secret value of at least 8 bytes: what the log scan looks
    /// for (shorter values would match ordinary text).
    pub fn log_markers(&self) -> Vec<String> {
        let mut values: Vec<String> = self
            .by_kind
            .values()
            .flat_map(|m| m.values())
            .filter(|v| v.len() >= 8)
            .cloned()
            .collect();
        values.sort();
        values.dedup();
        values
    }
}

/// Time limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timeouts {
    /// Dialing the endpoint.
    pub connect: Duration,
    /// Each RPC; a call that takes longer fails its check with DEADLINE_EXCEEDED.
    pub rpc: Duration,
    /// Each check as a whole, cleanup excluded.
    pub check: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(10),
            rpc: Duration::from_secs(60),
            check: Duration::from_secs(300),
        }
    }
}

/// Everything the suite needs to run against one driver.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SuiteConfig {
    /// The driver's endpoint, e.g. `unix:///run/csi/csi.sock`: the node
    /// plugin's when [`controller_endpoint`](Self::controller_endpoint) is set.
    pub endpoint: String,
    /// The controller plugin's endpoint when controller and node run as
    /// separate processes: Identity, Controller and GroupController calls go
    /// there, Node calls to `endpoint`, and identity is checked on both.
    pub controller_endpoint: Option<String>,
    /// Parent of the staging paths; the suite creates (and removes) a unique
    /// directory below it per check.
    pub staging_dir: PathBuf,
    /// Parent of the target paths; the suite creates a unique parent below it
    /// and passes a target path that does not exist yet, as a CO does.
    pub target_dir: PathBuf,
    /// Requested volume size in bytes.
    pub volume_size: i64,
    /// `parameters` for CreateVolume.
    pub parameters: HashMap<String, String>,
    /// `parameters` for CreateSnapshot and CreateVolumeGroupSnapshot.
    pub snapshot_parameters: HashMap<String, String>,
    /// `mutable_parameters` the driver accepts (a VolumeAttributesClass),
    /// sent with ControllerModifyVolume. Empty by default, as csi-sanity
    /// sends them: every driver with MODIFY_VOLUME must accept an empty map.
    pub mutable_parameters: HashMap<String, String>,
    /// Secrets per request kind.
    pub secrets: Secrets,
    /// Mount or block volumes.
    pub access_type: SuiteAccessType,
    /// The access mode of ordinary test volumes.
    pub access_mode: Mode,
    /// Checks to skip: an exact id, a group name (`node`), or a prefix ending
    /// in `*` (`controller.list_volumes.*`).
    pub skip: Vec<String>,
    /// When not empty, run only the checks matching one of these patterns
    /// (same syntax as `skip`).
    pub focus: Vec<String>,
    /// Time limits.
    pub timeouts: Timeouts,
    /// The driver's captured log; when set, the suite asserts no secret value
    /// appears in it once every check has run.
    pub driver_log: Option<PathBuf>,
    /// The controller process's captured log when it runs apart from the
    /// node ([`controller_endpoint`](Self::controller_endpoint)); scanned
    /// like [`driver_log`](Self::driver_log).
    pub controller_log: Option<PathBuf>,
    /// Prefix of every volume, snapshot and group snapshot name.
    pub test_volume_prefix: String,
    /// How many concurrent identical calls the concurrency checks fire.
    pub concurrency: usize,
    /// How many volumes (and snapshots) the paging checks create.
    pub paging_items: usize,
    /// The largest NodeGetInfo `max_volumes_per_node` the attach-limit
    /// check tests (it creates and attaches one volume more than the
    /// limit); a larger limit skips the check.
    pub attach_limit_max: i64,
    /// Whether the driver shares this process's filesystem view, so the suite
    /// can check that target paths are created and removed by the plugin.
    pub check_target_paths: bool,
}

impl SuiteConfig {
    /// Defaults for `endpoint`: paths under the system temp directory, 1 GiB
    /// mount volumes (driver-chosen fs), SINGLE_NODE_WRITER, marker secrets.
    pub fn new(endpoint: impl Into<String>) -> Self {
        let run = uuid::Uuid::new_v4().simple().to_string();
        Self {
            endpoint: endpoint.into(),
            controller_endpoint: None,
            staging_dir: std::env::temp_dir(),
            target_dir: std::env::temp_dir(),
            volume_size: csi_proto::size::GIB,
            parameters: HashMap::new(),
            snapshot_parameters: HashMap::new(),
            mutable_parameters: HashMap::new(),
            secrets: Secrets::with_marker(&format!("csi-conformance-secret-{run}")),
            access_type: SuiteAccessType::Mount {
                fs_type: String::new(),
            },
            access_mode: Mode::SingleNodeWriter,
            skip: Vec::new(),
            focus: Vec::new(),
            timeouts: Timeouts::default(),
            driver_log: None,
            controller_log: None,
            test_volume_prefix: "csi-conformance".to_string(),
            concurrency: 16,
            paging_items: 5,
            attach_limit_max: 32,
            check_target_paths: true,
        }
    }

    /// Sends Identity, Controller and GroupController calls to `endpoint`
    /// (a separate controller process) and Node calls to the main endpoint.
    pub fn controller_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.controller_endpoint = Some(endpoint.into());
        self
    }

    /// Uses raw block volumes.
    pub fn block(mut self) -> Self {
        self.access_type = SuiteAccessType::Block;
        self
    }

    /// Skips checks matching `pattern` (see [`skip`](Self::skip)).
    pub fn skip(mut self, pattern: impl Into<String>) -> Self {
        self.skip.push(pattern.into());
        self
    }

    /// Runs only checks matching `pattern` (may be repeated).
    pub fn focus(mut self, pattern: impl Into<String>) -> Self {
        self.focus.push(pattern.into());
        self
    }

    /// Scans `path` for secrets after the run.
    pub fn driver_log(mut self, path: impl Into<PathBuf>) -> Self {
        self.driver_log = Some(path.into());
        self
    }
}

/// Whether `pattern` selects the check `id` in `group`.
pub(crate) fn pattern_matches(pattern: &str, id: &str, group: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => id.starts_with(prefix),
        None => pattern == id || pattern == group,
    }
}
