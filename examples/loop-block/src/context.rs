//! What ControllerPublishVolume tells the node in the publish context, so
//! the node needs no controller in its process (`--mode node`): the
//! backing file (what a cloud driver would return as the attached device),
//! the access type and size the disk was created with, and its mutable
//! parameters as they were at attach time.
//!
//! The CO hands the publish context back unchanged to NodeStageVolume and
//! NodePublishVolume (spec: ControllerPublishVolume, "publish_context").

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use csi_controller::{Access, VolumeRecord};
use csi_node::{NodeError, VolumeContexts, VolumeInfo};
use csi_server::{CsiError, CsiResult};

use crate::tuning::Tuning;

/// The backing file to attach.
pub const BACKING_FILE_KEY: &str = "loop-block.csi-kit.dev/backing-file";
/// `block` or `mount`: how the disk was created.
pub const ACCESS_KEY: &str = "loop-block.csi-kit.dev/access";
/// The disk's size in bytes when it was attached.
pub const CAPACITY_KEY: &str = "loop-block.csi-kit.dev/capacity-bytes";
/// Prefix of the mutable parameters (`…/readAheadKiB`, `…/directIO`).
pub const TUNING_PREFIX: &str = "loop-block.csi-kit.dev/tuning.";

/// ControllerPublishVolume's publish context for disk `v`, whose backing
/// file is `backing`.
pub fn publish_context(v: &VolumeRecord, backing: &Path) -> HashMap<String, String> {
    let access = match v.access {
        Access::Block => "block",
        Access::Mount => "mount",
    };
    let mut context: HashMap<String, String> = [
        (BACKING_FILE_KEY, backing.to_string_lossy().into_owned()),
        (ACCESS_KEY, access.to_owned()),
        (CAPACITY_KEY, v.capacity_bytes.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    for (key, value) in &v.mutable_parameters {
        context.insert(format!("{TUNING_PREFIX}{key}"), value.clone());
    }
    context
}

/// Whether `contexts` are loop-block's (they carry the access type).
pub fn describes_volume(contexts: &VolumeContexts) -> bool {
    contexts.publish_context.contains_key(ACCESS_KEY)
}

/// The disk as the publish context describes it; a missing or bad key is
/// INVALID_ARGUMENT naming it.
pub fn volume_info(contexts: &VolumeContexts) -> Result<VolumeInfo, NodeError> {
    let block = match contexts.publish(ACCESS_KEY)? {
        "block" => true,
        "mount" => false,
        other => {
            let why = format!("{other:?} is neither block nor mount");
            return Err(NodeError::invalid(
                format!("publish_context[{ACCESS_KEY}]"),
                why,
            ));
        }
    };
    let capacity = contexts.publish(CAPACITY_KEY)?;
    let capacity_bytes = capacity.parse::<i64>().ok().filter(|c| *c >= 0);
    let capacity_bytes = capacity_bytes.ok_or_else(|| {
        let why = format!("{capacity:?} is not a size in bytes");
        NodeError::invalid(format!("publish_context[{CAPACITY_KEY}]"), why)
    })?;
    Ok(VolumeInfo::new(block, capacity_bytes))
}

/// The tuning a publish context carries (none: the kernel's defaults).
/// The controller checked the values; the node checks them again, naming
/// the publish context key of a bad one.
pub fn tuning(
    publish_context: &BTreeMap<String, String>,
    direct_io_supported: bool,
) -> CsiResult<Tuning> {
    let mut tuning = Tuning::default();
    for (key, value) in publish_context {
        let Some(param) = key.strip_prefix(TUNING_PREFIX) else {
            continue;
        };
        let one = HashMap::from([(param.to_owned(), value.clone())]);
        tuning = tuning
            .with(&one, direct_io_supported)
            .map_err(|e| match e {
                CsiError::InvalidArgument { reason, .. } => {
                    CsiError::invalid(format!("publish_context[{key}]"), reason)
                }
                other => other,
            })?;
    }
    Ok(tuning)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tuning::{DIRECT_IO_KEY, READ_AHEAD_KEY};

    fn contexts(pairs: &[(&str, &str)]) -> VolumeContexts {
        let publish: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        VolumeContexts::of(&HashMap::new(), &publish)
    }

    #[test]
    fn the_node_reads_access_size_and_tuning_and_names_a_bad_key() {
        let read_ahead = format!("{TUNING_PREFIX}{READ_AHEAD_KEY}");
        let direct = format!("{TUNING_PREFIX}{DIRECT_IO_KEY}");
        let good = contexts(&[
            (BACKING_FILE_KEY, "/data/volumes/x.img"),
            (ACCESS_KEY, "block"),
            (CAPACITY_KEY, "1048576"),
            (&read_ahead, "512"),
            (&direct, "true"),
        ]);
        assert!(describes_volume(&good));
        assert_eq!(volume_info(&good).unwrap(), VolumeInfo::new(true, 1 << 20));
        let t = tuning(&good.publish_context, true).unwrap();
        assert_eq!((t.read_ahead_kib, t.direct_io), (Some(512), Some(true)));

        let e = tuning(&good.publish_context, false).unwrap_err();
        assert!(
            matches!(&e, CsiError::InvalidArgument { field, .. } if *field == format!("publish_context[{direct}]")),
            "{e:?}"
        );
        for (pairs, key) in [
            (vec![(ACCESS_KEY, "mount")], CAPACITY_KEY),
            (vec![(CAPACITY_KEY, "1")], ACCESS_KEY),
            (vec![(ACCESS_KEY, "tape"), (CAPACITY_KEY, "1")], ACCESS_KEY),
            (
                vec![(ACCESS_KEY, "mount"), (CAPACITY_KEY, "-1")],
                CAPACITY_KEY,
            ),
        ] {
            let e = volume_info(&contexts(&pairs)).unwrap_err();
            let text = CsiError::from(e).to_string();
            assert!(text.contains(key), "{pairs:?}: {text}");
        }
        assert!(!describes_volume(&contexts(&[])));
    }
}
