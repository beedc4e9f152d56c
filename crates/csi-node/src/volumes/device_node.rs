//! The device node behind a stable name: a block volume is bind-mounted
//! from the node itself, since binds never follow a link.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use mount_utils::DeviceNumber;

use crate::error::NodeError;
use crate::record::Device;

/// `device`'s node: a stable name (a by-id link, which udev or a provider
/// may re-point) is resolved and must still lead to the device that was
/// staged; anything else is returned as it is.
pub(super) fn device_node(device: &Device) -> Result<PathBuf, NodeError> {
    let path = &device.path;
    let is_link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    if !is_link {
        return Ok(path.clone());
    }
    let node = std::fs::canonicalize(path).map_err(|e| NodeError::io("resolving", path, &e))?;
    let meta = std::fs::metadata(&node).map_err(|e| NodeError::io("inspecting", &node, &e))?;
    let found = DeviceNumber::from_dev_t(meta.rdev() as _);
    if (found.major, found.minor) != (device.major, device.minor) {
        return Err(NodeError::failed_precondition(format!(
            "{} now leads to another device than the one staged",
            path.display()
        )));
    }
    Ok(node)
}
