//! The invariants, checked after every call that got its final answer:
//! the driver's records (as it lists them), the data that exists and what
//! the CO was told agree; every mount is one kubelet asked for, from its own
//! volume, read-only where asked; no loop device is left; the provider's
//! attachments are those ControllerPublish answered.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use csi_driver::{CallContext, Method};
use csi_proto::v1::*;
use mount_utils::Mounter;

use crate::co::Co;

impl Co<'_> {
    /// The invariants, after a call got its final answer.
    pub(crate) async fn check(&mut self) -> Result<(), String> {
        let ctx = |m| CallContext::detached(0, m);
        let s = self.services().await?;
        let (controller, data) = (s.controller.clone(), s.data.clone());
        // Reading the driver's answers is no step of the workload.
        let _unobserved = self.world.unobserved();
        // Records (as ListVolumes and ListSnapshots answer) = what the CO
        // was told exists = the data that exists, each owned by its id.
        let listed: BTreeSet<String> = controller
            .list_volumes(&ctx(Method::ListVolumes), ListVolumesRequest::default())
            .await
            .map_err(|e| format!("ListVolumes: {e}"))?
            .entries
            .into_iter()
            .filter_map(|e| e.volume.map(|v| v.volume_id))
            .collect();
        let acked: BTreeSet<String> = self.model.volumes.values().cloned().collect();
        let volumes = data.volumes();
        compare("volumes listed", &listed, "volumes the CO holds", &acked)?;
        let present: BTreeSet<String> = volumes.keys().cloned().collect();
        compare("volume data", &present, "volumes the CO holds", &acked)?;
        let snaps: BTreeSet<String> = controller
            .list_snapshots(&ctx(Method::ListSnapshots), ListSnapshotsRequest::default())
            .await
            .map_err(|e| format!("ListSnapshots: {e}"))?
            .entries
            .into_iter()
            .filter_map(|e| e.snapshot.map(|s| s.snapshot_id))
            .collect();
        let acked_snaps: BTreeSet<String> = self
            .model
            .snapshots
            .values()
            .cloned()
            .chain(self.model.groups.values().flat_map(|g| g.1.clone()))
            .collect();
        compare(
            "snapshots listed",
            &snaps,
            "snapshots the CO holds",
            &acked_snaps,
        )?;
        let snapshot_data = data.snapshots();
        let present: BTreeSet<String> = snapshot_data.keys().cloned().collect();
        compare(
            "snapshot data",
            &present,
            "snapshots the CO holds",
            &acked_snaps,
        )?;
        for (id, owner) in volumes.iter().chain(&snapshot_data) {
            if id != owner {
                return Err(format!("the data at {id} is {owner:?}'s"));
            }
        }
        // The mount table = what kubelet set up, each from its own volume,
        // read-only where asked.
        let mounts: BTreeMap<PathBuf, mount_utils::MountInfo> = self
            .world
            .mounter()
            .mount_points()
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter(|m| m.mount_point != std::path::Path::new("/"))
            .map(|m| (m.mount_point.clone(), m))
            .collect();
        let mut expected = BTreeMap::new();
        for pv in &self.model.staged {
            expected.insert(self.staging(pv), (*pv, false));
        }
        for ((pv, pod), ro) in &self.model.published {
            expected.insert(self.target(pv, pod), (*pv, *ro));
        }
        let found: BTreeSet<&PathBuf> = mounts.keys().collect();
        let wanted: BTreeSet<&PathBuf> = expected.keys().collect();
        if found != wanted {
            return Err(format!("mounts {found:?}, expected {wanted:?}"));
        }
        for (path, (pv, ro)) in &expected {
            let m = &mounts[path];
            let id = self.id(pv);
            if data.volume_at(m).as_ref() != Some(&id) {
                return Err(format!("{path:?} shows {:?}, not volume {id}", m.root));
            }
            let is_ro = m.mount_options.iter().any(|o| o == "ro");
            if is_ro != *ro {
                return Err(format!("{path:?} is read-only: {is_ro}, asked: {ro}"));
            }
        }
        // Loop devices: one per staged volume that stages through one.
        let staged: BTreeSet<String> = self.model.staged.iter().map(|pv| self.id(pv)).collect();
        let mut unused = self.world.loops().attached();
        unused.retain(|d| !data.loop_volume(d).is_some_and(|id| staged.contains(&id)));
        if !unused.is_empty() {
            return Err(format!("loop devices no volume uses: {unused:?}"));
        }
        // The provider's attachments = what ControllerPublish answered.
        if let Some(attached) = data.attached_volumes() {
            let held = self.model.attached.iter().map(|pv| self.id(pv)).collect();
            compare(
                "provider attachments",
                &attached,
                "volumes the CO holds published",
                &held,
            )?;
        }
        Ok(())
    }
}

fn compare(
    a_name: &str,
    a: &BTreeSet<String>,
    b_name: &str,
    b: &BTreeSet<String>,
) -> Result<(), String> {
    if a == b {
        return Ok(());
    }
    let extra: Vec<_> = a.difference(b).collect();
    let missing: Vec<_> = b.difference(a).collect();
    Err(format!(
        "{a_name} differ from {b_name}: extra {extra:?}, missing {missing:?}"
    ))
}
