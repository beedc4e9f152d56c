//! The volume plugin interface the reconcilers drive (its fake is in
//! `fake_plugin.rs`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;

use crate::error::PluginError;
use crate::types::{AttachInfo, Key, VolumeSpec};

/// Arguments of [`VolumePlugin::stage`] (CSI NodeStageVolume).
#[derive(Debug, Clone)]
pub struct StageRequest<V> {
    /// The volume.
    pub volume: V,
    /// Its spec (capability: access mode, fs type, mount options, attributes).
    pub spec: Arc<VolumeSpec>,
    /// Where to stage.
    pub staging_path: PathBuf,
    /// What attach reported (device path, publish context).
    pub attach: Arc<AttachInfo>,
}

/// Arguments of [`VolumePlugin::publish`] (CSI NodePublishVolume).
#[derive(Debug, Clone)]
pub struct PublishRequest<V> {
    /// The volume.
    pub volume: V,
    /// Its spec; `spec.read_only` says whether to publish read-only.
    pub spec: Arc<VolumeSpec>,
    /// The pod's mount point.
    pub target_path: PathBuf,
    /// The staging path, if the volume was staged.
    pub staging_path: Option<PathBuf>,
    /// What attach reported (device path, publish context).
    pub attach: Arc<AttachInfo>,
}

/// Arguments of [`VolumePlugin::expand`] (CSI NodeExpandVolume).
#[derive(Debug, Clone)]
pub struct ExpandRequest<V> {
    /// The volume.
    pub volume: V,
    /// Its spec.
    pub spec: Arc<VolumeSpec>,
    /// A path where the volume is published.
    pub volume_path: PathBuf,
    /// The staging path, if staged.
    pub staging_path: Option<PathBuf>,
    /// The requested size in bytes.
    pub new_size: u64,
}

/// What a successful stage or publish learned about the volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MountResult {
    /// The volume's size in bytes, if the plugin knows it. It feeds the
    /// expansion planner when the spec had no size at first mount.
    pub size: Option<u64>,
}

impl MountResult {
    /// A result reporting `size` bytes.
    pub fn with_size(size: u64) -> Self {
        Self { size: Some(size) }
    }
}

/// Performs the real work for a volume: attach, stage, publish and back.
///
/// Calls must be idempotent: after an uncertain failure or a restart the
/// reconciler repeats them. The error kind decides the next state (see
/// [`crate::transition`]).
#[async_trait]
pub trait VolumePlugin<V: Key, N: Key>: Send + Sync {
    /// Attaches `volume` to `node` (CSI ControllerPublishVolume).
    async fn attach(
        &self,
        volume: &V,
        node: &N,
        spec: &VolumeSpec,
    ) -> Result<AttachInfo, PluginError>;

    /// Waits until someone else (the attach/detach controller) has attached
    /// `volume` to `node` and returns the attachment's details.
    async fn wait_for_attach(
        &self,
        volume: &V,
        node: &N,
        spec: &VolumeSpec,
    ) -> Result<AttachInfo, PluginError>;

    /// Detaches `volume` from `node` (CSI ControllerUnpublishVolume).
    async fn detach(&self, volume: &V, node: &N) -> Result<(), PluginError>;

    /// Stages the device (CSI NodeStageVolume).
    async fn stage(&self, request: &StageRequest<V>) -> Result<MountResult, PluginError>;

    /// Unstages the device (CSI NodeUnstageVolume).
    async fn unstage(&self, volume: &V, staging_path: &Path) -> Result<(), PluginError>;

    /// Publishes the volume for a pod (CSI NodePublishVolume).
    async fn publish(&self, request: &PublishRequest<V>) -> Result<MountResult, PluginError>;

    /// Unpublishes the volume from a pod's path (CSI NodeUnpublishVolume).
    async fn unpublish(&self, volume: &V, target_path: &Path) -> Result<(), PluginError>;

    /// Expands the filesystem on the node; returns the new size in bytes.
    async fn expand(&self, request: &ExpandRequest<V>) -> Result<u64, PluginError>;
}
