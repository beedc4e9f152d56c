//! Request builders and the locator both test files share.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use csi_driver::CsiError;
use csi_node::{NodeError, VolumeLocator, VolumeSource};
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::*;
use tonic::Code;

/// Volumes under `base`: `data/<id>` directories and `images/<id>.img` files.
pub fn locator(base: &Path) -> Arc<dyn VolumeLocator> {
    let base = base.to_path_buf();
    Arc::new(move |id: &str| {
        let dir = base.join("data").join(id);
        let image = base.join("images").join(format!("{id}.img"));
        if dir.is_dir() {
            Some(VolumeSource::Directory(dir))
        } else if image.is_file() {
            Some(VolumeSource::Image(image))
        } else {
            None
        }
    })
}

/// Creates `data/`, `images/` and `pods/` under `base`.
pub fn layout(base: &Path) {
    for sub in ["data", "images", "pods"] {
        std::fs::create_dir(base.join(sub)).unwrap();
    }
}

pub fn mount_cap(mode: Mode) -> VolumeCapability {
    VolumeCapability::mount("ext4").with_access_mode(mode)
}

pub fn block_cap() -> VolumeCapability {
    VolumeCapability::block().with_access_mode(Mode::SingleNodeWriter)
}

pub fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

pub use csi_node::testing::requests::{
    stage_req as stage, unpublish_req as unpublish, unstage_req as unstage,
};

pub fn publish(
    vol: &str,
    staging: Option<&Path>,
    target: &Path,
    cap: VolumeCapability,
    readonly: bool,
) -> NodePublishVolumeRequest {
    let staging = staging.unwrap_or(Path::new(""));
    NodePublishVolumeRequest {
        readonly,
        ..csi_node::testing::requests::publish_req(vol, staging, target, cap)
    }
}

/// The CSI code of a failed call.
pub fn code<T: std::fmt::Debug>(r: Result<T, NodeError>) -> Code {
    CsiError::from(r.unwrap_err()).code()
}

/// A path under `base`.
pub fn under(base: &Path, rel: &str) -> PathBuf {
    base.join(rel)
}
