//! The node-side record: what this plugin staged and published, as plain
//! data that is persisted (JSON) before every mount and unmount.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};

use csi_proto::v1::VolumeCapability;
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::volume_capability::{
    AccessMode, AccessType as ProtoAccess, BlockVolume, MountVolume,
};
use serde::{Deserialize, Serialize};

use crate::error::NodeError;

/// A capability's mount flags. Stored (they must be applied again after a
/// restart) but never shown: `Debug` prints only how many there are.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MountFlags(Vec<String>);

impl MountFlags {
    /// Wraps flags as the CO sent them.
    pub fn new(flags: Vec<String>) -> Self {
        Self(flags)
    }

    /// The flags, for the mount call only.
    pub fn expose(&self) -> &[String] {
        &self.0
    }

    /// How many flags there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for MountFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MountFlags(<{} redacted>)", self.0.len())
    }
}

/// How the volume is consumed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AccessKind {
    /// As a raw block device.
    Block,
    /// Through a filesystem.
    Mount {
        /// The filesystem type asked for (empty: the driver's default).
        fs_type: String,
        /// The mount flags asked for.
        flags: MountFlags,
        /// The group the volume is mounted for (`volume_mount_group`).
        volume_mount_group: String,
    },
}

/// A volume capability as plain data: converts to and from the proto
/// without loss, so repeat calls compare exactly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capability {
    /// Block or mount, with the mount's details.
    pub access: AccessKind,
    /// The access mode (`None` when the request had none).
    pub access_mode: Option<i32>,
}

impl Capability {
    /// The capability of a request; `field` names it in the error when it
    /// is absent or has no access type.
    pub fn from_proto(cap: Option<&VolumeCapability>, field: &str) -> Result<Self, NodeError> {
        let cap = cap.ok_or_else(|| NodeError::invalid(field, "required"))?;
        let access = match &cap.access_type {
            Some(ProtoAccess::Block(_)) => AccessKind::Block,
            Some(ProtoAccess::Mount(m)) => AccessKind::Mount {
                fs_type: m.fs_type.clone(),
                flags: MountFlags::new(m.mount_flags.clone()),
                volume_mount_group: m.volume_mount_group.clone(),
            },
            None => {
                return Err(NodeError::invalid(
                    format!("{field}.access_type"),
                    "required",
                ));
            }
        };
        Ok(Self {
            access,
            access_mode: cap.access_mode.as_ref().map(|m| m.mode),
        })
    }

    /// The proto message this was made from.
    pub fn to_proto(&self) -> VolumeCapability {
        VolumeCapability {
            access_mode: self.access_mode.map(|mode| AccessMode { mode }),
            access_type: Some(match &self.access {
                AccessKind::Block => ProtoAccess::Block(BlockVolume {}),
                AccessKind::Mount {
                    fs_type,
                    flags,
                    volume_mount_group,
                } => ProtoAccess::Mount(MountVolume {
                    fs_type: fs_type.clone(),
                    mount_flags: flags.expose().to_vec(),
                    volume_mount_group: volume_mount_group.clone(),
                }),
            }),
        }
    }

    /// Whether this is block access.
    pub fn is_block(&self) -> bool {
        matches!(self.access, AccessKind::Block)
    }

    /// The access mode (`Unknown` when absent or unrecognised).
    pub fn mode(&self) -> Mode {
        self.access_mode
            .and_then(|m| Mode::try_from(m).ok())
            .unwrap_or(Mode::Unknown)
    }

    /// The mount flags (none for block access).
    pub fn flags(&self) -> &[String] {
        match &self.access {
            AccessKind::Mount { flags, .. } => flags.expose(),
            AccessKind::Block => &[],
        }
    }

    /// The filesystem type asked for (`None` for block access).
    pub fn fs_type(&self) -> Option<&str> {
        match &self.access {
            AccessKind::Mount { fs_type, .. } => Some(fs_type),
            AccessKind::Block => None,
        }
    }
}

/// A block device: its node and its device number, so a mount of it is
/// recognised in mountinfo whatever the mount's source string says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    /// The device node, e.g. `/dev/loop3`.
    pub path: PathBuf,
    /// Major device number.
    pub major: u32,
    /// Minor device number.
    pub minor: u32,
}

impl Device {
    /// The device of a loop device's info.
    pub fn of(info: &mount_utils::LoopDeviceInfo) -> Self {
        Self {
            path: info.path.clone(),
            major: info.device.major,
            minor: info.device.minor,
        }
    }
}

/// Where a volume's data lives on this node, as the driver knows it
/// ([`VolumeLocator`](crate::VolumeLocator)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum VolumeSource {
    /// A directory, bind-mounted at the staging path (mount access only).
    Directory(PathBuf),
    /// An image file, attached as a loop device; for mount access the
    /// filesystem on it is mounted at the staging path.
    Image(PathBuf),
    /// A block device the controller attached, by its path or a stable
    /// name (`/dev/disk/by-id/<serial>`): waited for at NodeStage, for
    /// mount access formatted only if it holds no filesystem (never
    /// reformatted) and mounted; never detached by the node.
    Device(PathBuf),
    /// A filesystem mounted by type, source and options (NFS, SMB, CephFS,
    /// FUSE, tmpfs), recognised as this volume's by the id of the mount
    /// this plugin made, never by its source string.
    Filesystem(FilesystemSource),
}

/// What a [`VolumeSource::Filesystem`] mounts. Recorded: nothing secret
/// belongs here; secret options are named, and their values come from the
/// NodeStage secrets at mount time only.
///
/// The mount is mount(2) itself: no mount helper (`mount.nfs`,
/// `mount.cifs`, `mount.ceph`) runs, so no secret reaches a command line.
/// What a helper would look up is looked up here, at each mount: the
/// server of an `nfs` or `nfs4` source (`server:/path`) becomes `addr=`,
/// the host of a `cifs` or `smb3` UNC `ip=`, and Ceph monitors named by
/// host their addresses (mount-utils' `resolve_servers`, through the
/// [`NodeVolumesBuilder::resolver`](crate::NodeVolumesBuilder::resolver)
/// seam); an address the options give already is kept. The record keeps
/// the source as given. Anything else a helper adds is the driver's to
/// give, as the kernel takes it. A FUSE filesystem (`fuse`,
/// `fuse.<subtype>`) is mounted through a connection the node opens on
/// `/dev/fuse` (`fd=`, and `rootmode=`, `user_id=`, `group_id=` unless
/// given), which the driver's daemon then serves
/// ([`VolumeLocator::serve_fuse`](crate::VolumeLocator::serve_fuse)), as
/// a libfuse daemon given `/dev/fd/N` as its mount point does. A FUSE
/// mount outlives the plugin only while its daemon does: a restore that
/// finds one disconnected (`ENOTCONN`) takes it and the binds of it down,
/// mounts it anew through a connection the driver serves and binds the
/// publications again (a container that holds a copy of an old bind sees
/// `ENOTCONN` until it restarts).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilesystemSource {
    /// The filesystem type (`nfs`, `cifs`, `ceph`, `fuse.sshfs`, `tmpfs`).
    pub fs_type: String,
    /// The mount source (`server:/export`, `//server/share`, `none`).
    pub source: String,
    /// Options that are not secret (`vers=4.1`, `size=1g`).
    pub options: Vec<String>,
    /// Names of NodeStage secrets, each passed to the mount call as
    /// `name=value` and nowhere else (a missing one is INVALID_ARGUMENT
    /// naming `secrets[name]`).
    pub secret_options: Vec<String>,
}

impl FilesystemSource {
    /// `fs_type` mounted from `source` with no options.
    pub fn new(fs_type: impl Into<String>, source: impl Into<String>) -> Self {
        FilesystemSource {
            fs_type: fs_type.into(),
            source: source.into(),
            options: Vec::new(),
            secret_options: Vec::new(),
        }
    }

    /// With the options `options` (not secret).
    pub fn options<S: Into<String>>(mut self, options: impl IntoIterator<Item = S>) -> Self {
        self.options.extend(options.into_iter().map(Into::into));
        self
    }

    /// With the NodeStage secret `name` passed as the option `name=value`.
    pub fn secret_option(mut self, name: impl Into<String>) -> Self {
        self.secret_options.push(name.into());
        self
    }
}

/// Progress of a stage: saved as `Staging` before the first effect, so a
/// crash anywhere leaves a record naming what may need cleaning up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StageState {
    /// NodeStage started: device may be attached, path may be mounted.
    Staging,
    /// NodeStage finished.
    Staged,
    /// NodeUnstage started: never restored after a restart.
    Unstaging,
}

/// Progress of a publish, like [`StageState`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PublishState {
    /// NodePublish started: the target may be mounted.
    Publishing,
    /// NodePublish finished.
    Published,
    /// NodeUnpublish started: never restored after a restart.
    Unpublishing,
}

/// A volume staged on this node (stored under its volume id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageRecord {
    /// The volume id the CO uses.
    pub volume_id: String,
    /// The staging path as the CO gave it.
    pub path: PathBuf,
    /// The capability it was staged with.
    pub capability: Capability,
    /// Whether the staging mount is read-only (a reader-only mode).
    pub readonly: bool,
    /// Where the data comes from.
    pub source: VolumeSource,
    /// The loop device of a [`VolumeSource::Image`], once attached, or the
    /// node of a [`VolumeSource::Device`] once found.
    pub device: Option<Device>,
    /// A filesystem was mounted from the device at least once: it must
    /// never be formatted again.
    pub formatted: bool,
    /// The id of the mount made for a [`VolumeSource::Filesystem`], saved
    /// before it is moved to the staging path (a move keeps it).
    #[serde(default)]
    pub mount_id: Option<u32>,
    /// The publish context of the NodeStage call.
    pub publish_context: BTreeMap<String, String>,
    /// The volume context of the NodeStage call.
    pub volume_context: BTreeMap<String, String>,
    /// Progress.
    pub state: StageState,
}

/// A volume published at a target on this node (stored under its target).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishRecord {
    /// The volume id the CO uses.
    pub volume_id: String,
    /// The target path as the CO gave it.
    pub target: PathBuf,
    /// The staging path of the call (empty: published without staging).
    pub staging_path: PathBuf,
    /// The capability of the call.
    pub capability: Capability,
    /// `readonly` as the CO asked (for the repeat table).
    pub readonly: bool,
    /// Whether the target is mounted read-only (asked, or a reader-only
    /// mode, or an `ro` flag: read-only always wins).
    pub effective_readonly: bool,
    /// The publish context of the call.
    pub publish_context: BTreeMap<String, String>,
    /// The volume context of the call.
    pub volume_context: BTreeMap<String, String>,
    /// Progress.
    pub state: PublishState,
}

impl PublishRecord {
    /// The call's arguments for csi-driver's repeat table.
    pub fn args(&self) -> csi_driver::helpers::publish::PublishArgs {
        csi_driver::helpers::publish::PublishArgs {
            staging_target_path: self.staging_path.to_string_lossy().into_owned(),
            volume_capability: Some(self.capability.to_proto()),
            readonly: self.readonly,
            publish_context: to_map(&self.publish_context),
            volume_context: to_map(&self.volume_context),
        }
    }
}

/// Everything this node plugin did with one volume. Stored in parts: the
/// stage in table [`STAGED_TABLE`](crate::STAGED_TABLE) under the volume
/// id, each publication in [`PUBLISHED_TABLE`](crate::PUBLISHED_TABLE)
/// under its target, so forgetting one is a delete, which works on a full
/// disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeVolumeRecord {
    /// The volume id the CO uses.
    pub volume_id: String,
    /// Where and how it is staged.
    pub stage: Option<StageRecord>,
    /// Where it is published.
    pub publications: Vec<PublishRecord>,
}

impl NodeVolumeRecord {
    /// A record with nothing staged or published.
    pub fn new(volume_id: &str) -> Self {
        Self {
            volume_id: volume_id.to_owned(),
            stage: None,
            publications: Vec::new(),
        }
    }

    /// Whether nothing is left to remember.
    pub fn is_empty(&self) -> bool {
        self.stage.is_none() && self.publications.is_empty()
    }

    /// The publication at `target`, if any.
    pub fn publication(&self, target: &Path) -> Option<&PublishRecord> {
        self.publications.iter().find(|p| p.target == target)
    }

    /// Whether `path` is this volume's staging path or one of its targets.
    pub fn names(&self, path: &Path) -> bool {
        self.stage.as_ref().is_some_and(|s| s.path == path) || self.publication(path).is_some()
    }
}

/// A sorted map (stable records) from a wire map.
pub(crate) fn sorted(m: &HashMap<String, String>) -> BTreeMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn to_map(m: &BTreeMap<String, String>) -> HashMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_round_trip_exactly() {
        let caps = [
            VolumeCapability::block().with_access_mode(Mode::SingleNodeWriter),
            VolumeCapability::mount("xfs")
                .with_access_mode(Mode::MultiNodeReaderOnly)
                .with_mount_flags(["noatime", "password=hunter2"])
                .with_volume_mount_group("1000"),
            VolumeCapability {
                access_mode: None,
                ..VolumeCapability::mount("")
            },
        ];
        for cap in caps {
            let plain = Capability::from_proto(Some(&cap), "volume_capability").unwrap();
            assert_eq!(plain.to_proto(), cap);
        }
        let err = Capability::from_proto(None, "volume_capability").unwrap_err();
        assert_eq!(err.to_string(), "volume_capability: required");
        let err = Capability::from_proto(Some(&VolumeCapability::default()), "volume_capability")
            .unwrap_err();
        assert_eq!(err.to_string(), "volume_capability.access_type: required");
    }

    #[test]
    fn flags_are_stored_but_never_debug_printed() {
        let cap = VolumeCapability::mount("ext4").with_mount_flags(["password=hunter2", "rw"]);
        let plain = Capability::from_proto(Some(&cap), "c").unwrap();
        let record = NodeVolumeRecord {
            volume_id: "v".into(),
            stage: Some(StageRecord {
                volume_id: "v".into(),
                path: "/s".into(),
                capability: plain.clone(),
                readonly: false,
                source: VolumeSource::Image("/img".into()),
                device: None,
                formatted: false,
                mount_id: None,
                publish_context: BTreeMap::new(),
                volume_context: BTreeMap::new(),
                state: StageState::Staging,
            }),
            publications: vec![],
        };
        let shown = format!("{record:?} {plain:?} {:#?}", record);
        assert!(
            !shown.contains("hunter2") && !shown.contains("\"rw\""),
            "{shown}"
        );
        assert!(shown.contains("<2 redacted>"));
        let stage = record.stage.clone().unwrap();
        let back: StageRecord =
            serde_json::from_slice(&serde_json::to_vec(&stage).unwrap()).unwrap();
        assert_eq!(back, stage);
        assert_eq!(back.capability.flags(), ["password=hunter2", "rw"]);
    }
}
