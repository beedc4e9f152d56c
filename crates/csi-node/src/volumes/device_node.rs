//! The device node behind a stable name: a block volume is bind-mounted
//! from the node itself, since binds never follow a link.

use std::path::PathBuf;

use mount_utils::BlockDevices;

use crate::error::NodeError;
use crate::record::Device;

/// `device`'s node: a stable name (a by-id link, which udev or a provider
/// may re-point) is resolved and must still lead to the device that was
/// staged; anything else is returned as it is. `devices` (the node's
/// seam) reads the links, so a fake host's device is never looked up in
/// the real `/dev`.
pub(super) fn device_node(
    devices: &dyn BlockDevices,
    device: &Device,
) -> Result<PathBuf, NodeError> {
    let path = &device.path;
    let target = devices
        .link_target(path)
        .map_err(|e| NodeError::block_device(path, &e))?;
    let Some((node, found)) = target else {
        return Ok(path.clone());
    };
    if (found.major, found.minor) != (device.major, device.minor) {
        return Err(NodeError::failed_precondition(format!(
            "{} now leads to another device than the one staged",
            path.display()
        )));
    }
    Ok(node)
}
