//! CreateVolume: repeat rules by name, sizes, topology and content
//! sources; over local data (records, claims, reserved capacity) or over
//! a provider's catalog (found by name, so a retry after a timeout or a
//! restart resumes the volume instead of making a second one).

use std::collections::{BTreeMap, HashMap};

use csi_driver::helpers::idempotency::compare_volume;
use csi_driver::{CallContext, CsiError, CsiResult};
use csi_proto::v1::*;
use prost::Message;

use crate::access::{Access, ContentSource};
use crate::backend::{ControllerBackend, ProviderVolume, VolumeCatalog};
use crate::error::BackendError;
use crate::ids::IdKind;
use crate::records::VolumeRecord;
use crate::retry::Deadline;
use crate::service::{ControllerService, not_found};
use crate::state::{Claim, Res, Reservation};
use crate::wire::sorted;

/// Parameter keys the external-provisioner adds (PVC and PV names).
const PROVISIONER_KEYS: &str = "csi.storage.k8s.io/";

impl<B: ControllerBackend> ControllerService<B> {
    pub(crate) async fn create_volume_rpc(
        &self,
        ctx: &CallContext,
        req: CreateVolumeRequest,
    ) -> CsiResult<CreateVolumeResponse> {
        let access = Access::of(&req.volume_capabilities)?;
        self.check_parameters(&req.parameters)?;
        self.backend()
            .check_capabilities(&req.volume_capabilities)?;
        let mutable = self.initial_mutable(&req.mutable_parameters)?;
        let source = ContentSource::of(req.volume_content_source.as_ref());
        match &source {
            Some(ContentSource::Volume(_)) if !self.backend().clones_volumes() => {
                return Err(CsiError::invalid(
                    "volume_content_source",
                    "this plugin does not clone volumes",
                ));
            }
            Some(ContentSource::Snapshot(_)) if self.backend().snapshots().is_none() => {
                return Err(CsiError::invalid(
                    "volume_content_source",
                    "this plugin does not restore snapshots",
                ));
            }
            _ => {}
        }
        // One CreateVolume per name at a time, however long its work runs.
        let claim = self
            .in_flight()
            .claim("CreateVolume", &[(Res::VolumeName, &req.name)])?;
        if self.catalog().is_some() {
            let (this, deadline) = (self.clone(), self.deadline(ctx));
            return self
                .run(claim, async move {
                    let catalog = this.catalog().ok_or_else(no_catalog)?;
                    let plan = (access, source, mutable);
                    this.create_on_provider(catalog, &deadline, req, plan).await
                })
                .await;
        }
        self.create_local(req, claim, access, source, mutable).await
    }

    /// Unknown parameters are INVALID_ARGUMENT naming the key.
    fn check_parameters(&self, parameters: &HashMap<String, String>) -> CsiResult<()> {
        let Some(accepted) = self.backend().accepted_parameters() else {
            return Ok(());
        };
        let mut keys: Vec<&String> = parameters.keys().collect();
        keys.sort();
        match keys
            .into_iter()
            .find(|k| !k.starts_with(PROVISIONER_KEYS) && !accepted.contains(&k.as_str()))
        {
            Some(k) => Err(CsiError::invalid(
                format!("parameters.{k}"),
                format!("unknown parameter; this plugin accepts {accepted:?}"),
            )),
            None => Ok(()),
        }
    }

    fn initial_mutable(
        &self,
        requested: &HashMap<String, String>,
    ) -> CsiResult<BTreeMap<String, String>> {
        match self.backend().modification() {
            Some(m) => m.mutable_parameters(&BTreeMap::new(), requested),
            None if requested.is_empty() => Ok(BTreeMap::new()),
            None => Err(CsiError::invalid(
                "mutable_parameters",
                "this plugin has no mutable parameters",
            )),
        }
    }

    async fn create_local(
        &self,
        req: CreateVolumeRequest,
        mut claim: Claim,
        access: Access,
        source: Option<ContentSource>,
        mutable: BTreeMap<String, String>,
    ) -> CsiResult<CreateVolumeResponse> {
        let t = self.local()?;
        if let Some(existing) = t.volumes.by_name(&req.name) {
            let original =
                CreateVolumeRequest::decode(existing.request.as_slice()).map_err(|e| {
                    CsiError::Internal(format!("record of volume {}: {e}", existing.id))
                })?;
            let volume = existing.message();
            compare_volume(&original, &volume, &req)?;
            return Ok(CreateVolumeResponse {
                volume: Some(volume),
            });
        }
        self.check_topology(&req)?;
        let size = self.volume_size(req.capacity_range.as_ref(), access)?;
        // The source must exist, have the same access type, fit, and stay
        // while it is copied (its claim makes deleting it ABORTED meanwhile).
        if let Some(src) = &source {
            let source_size = self.source_size(src, access, &mut claim)?;
            check_fits(size, source_size)?;
        }
        let reservation = self.reserve(
            size,
            &format!("for {}", csi_proto::size::format_bytes(size)),
        )?;
        let record = self.new_record(req, size, access, source, mutable);
        claim.also(&[(Res::Volume, &record.id)])?;
        let (this, mut made) = (self.clone(), record);
        // The answer is the record as the backend left it (e.g. its volume
        // context), as a repeated CreateVolume answers from the saved one.
        let made = self
            .run(claim, async move {
                this.make_volume(&mut made, Some(reservation))
                    .await
                    .map(|()| made)
            })
            .await?;
        tracing::info!(volume = %made.id, name = %made.name, size, "created volume");
        Ok(CreateVolumeResponse {
            volume: Some(made.message()),
        })
    }

    fn check_topology(&self, req: &CreateVolumeRequest) -> CsiResult<()> {
        if !self.topology_fits(req.accessibility_requirements.as_ref()) {
            return Err(CsiError::ResourceExhausted(format!(
                "node {} is not in the requested topology",
                self.config().node_id
            )));
        }
        Ok(())
    }

    fn new_record(
        &self,
        req: CreateVolumeRequest,
        size: i64,
        access: Access,
        source: Option<ContentSource>,
        mutable: BTreeMap<String, String>,
    ) -> VolumeRecord {
        VolumeRecord {
            id: IdKind::Volume.generate(),
            name: req.name.clone(),
            capacity_bytes: size,
            access,
            source,
            parameters: sorted(&req.parameters),
            mutable_parameters: mutable,
            topology: self.segment(),
            request: CreateVolumeRequest {
                secrets: Default::default(),
                ..req
            }
            .encode_to_vec(),
            ephemeral: false,
        }
    }

    /// Makes a new volume's data, then saves its record; if either fails,
    /// removes what was made (a full disk leaves nothing behind).
    pub(crate) async fn make_volume(
        &self,
        record: &mut VolumeRecord,
        reservation: Option<Reservation>,
    ) -> CsiResult<()> {
        let t = self.local()?;
        self.backend().create_volume(record).await?;
        if let Err(e) = t.volumes.put(&record.id, record.clone()) {
            if let Err(undo) = self.backend().delete_volume(&record.id).await {
                tracing::error!(volume = %record.id, error = %undo, "removing the data of a volume whose record could not be saved");
            }
            return Err(e.into());
        }
        if let Some(r) = reservation {
            r.keep();
        }
        Ok(())
    }

    /// The smallest size a volume made from `source` may have, once the
    /// source is claimed and known to have the same access type.
    fn source_size(
        &self,
        source: &ContentSource,
        access: Access,
        claim: &mut Claim,
    ) -> CsiResult<i64> {
        let (source_access, size) = match source {
            ContentSource::Snapshot(id) => {
                claim.also(&[(Res::Snapshot, id)])?;
                let s = self.known_snapshot(id)?;
                (s.access, s.size_bytes)
            }
            ContentSource::Volume(id) => {
                claim.also(&[(Res::Volume, id)])?;
                let v = self
                    .known_volume(id)
                    .map_err(|_| not_found("source volume", id))?;
                (v.access, v.capacity_bytes)
            }
        };
        check_access(source_access, access)?;
        Ok(size)
    }

    /// The provider path: the volume found by name is compared and waited
    /// for; otherwise it is made once and waited for. A transient error of
    /// the create is followed by a lookup by name before any second
    /// attempt, so a create that reached the provider is never repeated.
    async fn create_on_provider(
        &self,
        catalog: &dyn VolumeCatalog,
        deadline: &Deadline,
        req: CreateVolumeRequest,
        (access, source, mutable): (Access, Option<ContentSource>, BTreeMap<String, String>),
    ) -> CsiResult<CreateVolumeResponse> {
        let volume = match deadline.retry(|| catalog.volume_by_name(&req.name)).await? {
            Some(found) => {
                let mut original = req.clone();
                original.parameters = crate::wire::to_map(&found.record.parameters);
                original.mutable_parameters = crate::wire::to_map(&found.record.mutable_parameters);
                original.volume_content_source =
                    found.record.source.as_ref().map(ContentSource::message);
                compare_volume(&original, &found.record.message(), &req)?;
                found
            }
            None => {
                self.check_topology(&req)?;
                let size = self.volume_size(req.capacity_range.as_ref(), access)?;
                if let Some(src) = &source {
                    let (source_access, source_size) = match src {
                        ContentSource::Snapshot(id) => {
                            let s = deadline.retry(|| catalog.snapshot(id)).await?;
                            let s = s.ok_or_else(|| not_found("snapshot", id))?.record;
                            (s.access, s.size_bytes)
                        }
                        ContentSource::Volume(id) => {
                            let v = deadline.retry(|| catalog.volume(id)).await?;
                            let v = v.ok_or_else(|| not_found("source volume", id))?.record;
                            (v.access, v.capacity_bytes)
                        }
                    };
                    check_access(source_access, access)?;
                    check_fits(size, source_size)?;
                }
                let plan = self.new_record(req.clone(), size, access, source, mutable);
                self.provision_once(catalog, deadline, &plan).await?
            }
        };
        let volume = if volume.ready {
            volume.record
        } else {
            self.wait_for_volume(catalog, deadline, &volume.record.id, &req.name)
                .await?
        };
        tracing::info!(volume = %volume.id, name = %volume.name, "volume ready");
        Ok(CreateVolumeResponse {
            volume: Some(volume.message()),
        })
    }

    /// Polls volume `id` (CreateVolume name `name`) until the provider
    /// reports it ready.
    async fn wait_for_volume(
        &self,
        catalog: &dyn VolumeCatalog,
        deadline: &Deadline,
        id: &str,
        name: &str,
    ) -> CsiResult<VolumeRecord> {
        deadline
            .wait_until_ready(&format!("volume {id} ({name:?})"), || async {
                match catalog.volume(id).await? {
                    Some(v) if v.ready => Ok(Some(v.record)),
                    Some(_) => Ok(None),
                    None => Err(BackendError::Csi(CsiError::Aborted(format!(
                        "volume {id} disappeared while it was being made; retry"
                    )))),
                }
            })
            .await
    }

    /// Asks the provider to make `plan` once; returns the volume as the
    /// provider answered it.
    async fn provision_once(
        &self,
        catalog: &dyn VolumeCatalog,
        deadline: &Deadline,
        plan: &VolumeRecord,
    ) -> CsiResult<ProviderVolume> {
        let mut retried = false;
        deadline
            .retry(|| {
                // After a transient failure the create may have reached the
                // provider: look before asking again (the first attempt
                // follows the caller's lookup).
                let look = std::mem::replace(&mut retried, true);
                async move {
                    if look && let Some(found) = catalog.volume_by_name(&plan.name).await? {
                        return Ok(found);
                    }
                    let mut made = plan.clone();
                    self.backend().create_volume(&mut made).await?;
                    if made.id.is_empty() {
                        return Err(BackendError::Malformed(format!(
                            "the provider gave volume {:?} no id",
                            plan.name
                        )));
                    }
                    tracing::info!(volume = %made.id, name = %made.name, "provider is making the volume");
                    let ready = catalog.ready_when_created();
                    Ok(ProviderVolume {
                        record: made,
                        ready,
                        attached: Default::default(),
                    })
                }
            })
            .await
            .map_err(CsiError::from)
    }
}

fn check_access(source: Access, requested: Access) -> CsiResult<()> {
    if source != requested {
        return Err(CsiError::invalid(
            "volume_content_source",
            "the source's access type differs from the requested one",
        ));
    }
    Ok(())
}

fn check_fits(size: i64, source_size: i64) -> CsiResult<()> {
    if size < source_size {
        return Err(CsiError::OutOfRange(format!(
            "capacity_range: {size} bytes is smaller than the source's {source_size} bytes"
        )));
    }
    Ok(())
}

pub(crate) fn no_catalog() -> CsiError {
    CsiError::Internal("the backend's catalog went away".into())
}
