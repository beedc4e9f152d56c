//! The faults that are not a driver method's: a request log that may leak
//! secrets, and answers given before the server's validation runs.

use std::io::Write;
use std::path::PathBuf;
use std::task::{Context, Poll};

use csi_proto::v1::*;
use csi_server::layer::CsiCall;
use csi_server::tower;
use csi_server::{CsiError, CsiRequest, Method};
use futures::future::{Either, Ready, ready};

use super::Fault;

/// What a fault layer does with each request before the driver sees it:
/// `Some` is an answer given in the driver's place.
pub(super) trait BeforeCall: Clone {
    fn before<Req: CsiRequest>(&self, request: &Req) -> Option<CsiError>;
}

/// A fault layer's service: [`BeforeCall`], then the driver unless it
/// answered.
#[derive(Clone)]
pub(super) struct FaultLayer<B, S> {
    pub(super) before: B,
    pub(super) inner: S,
}

impl<B, S, Req> tower::Service<CsiCall<Req>> for FaultLayer<B, S>
where
    B: BeforeCall,
    Req: CsiRequest,
    S: tower::Service<CsiCall<Req>, Response = Req::Output, Error = CsiError>,
{
    type Response = Req::Output;
    type Error = CsiError;
    type Future = Either<S::Future, Ready<Result<Req::Output, CsiError>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), CsiError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: CsiCall<Req>) -> Self::Future {
        match self.before.before(&call.request) {
            Some(e) => Either::Right(ready(Err(e))),
            None => Either::Left(self.inner.call(call)),
        }
    }
}

/// Logs every request as `<Method> <redacted request>`; with
/// [`Fault::LeaksSecretsToLog`] also its secrets, in plain text.
#[derive(Clone)]
pub(super) struct RequestLog {
    pub(super) log: Option<PathBuf>,
    pub(super) leak: bool,
}

impl BeforeCall for RequestLog {
    fn before<Req: CsiRequest>(&self, request: &Req) -> Option<CsiError> {
        if let Some(path) = &self.log {
            let mut line = format!("{} {:?}", Req::METHOD, request);
            if let Some(secrets) = request.secrets().filter(|s| self.leak && !s.is_empty()) {
                line.push_str(&format!(" secrets={secrets:?}"));
            }
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
            {
                let _ = writeln!(f, "{line}");
            }
        }
        None
    }
}

/// The faults that answer before validation does.
#[derive(Clone)]
pub(super) struct EarlyAnswers {
    pub(super) faults: Vec<Fault>,
    pub(super) stage_unstage: bool,
}

/// The request as another type of the same RPC (the layer is generic over
/// the request type; the faults concern specific RPCs).
fn view<T: prost::Message + Default>(request: &impl prost::Message) -> T {
    T::decode(request.encode_to_vec().as_slice()).unwrap_or_default()
}

impl BeforeCall for EarlyAnswers {
    fn before<Req: CsiRequest>(&self, request: &Req) -> Option<CsiError> {
        let relative = |path: &str| !path.is_empty() && !path.starts_with('/');
        match Req::METHOD {
            Method::NodePublishVolume if self.faults.contains(&Fault::StagingCheckedFirst) => {
                let req: NodePublishVolumeRequest = view(request);
                (self.stage_unstage && req.staging_target_path.is_empty()).then(|| {
                    CsiError::FailedPrecondition(
                        "STAGE_UNSTAGE_VOLUME is advertised: staging_target_path is required"
                            .into(),
                    )
                })
            }
            Method::NodeGetVolumeStats
                if self.faults.contains(&Fault::RelativeVolumePathInvalid) =>
            {
                let req: NodeGetVolumeStatsRequest = view(request);
                relative(&req.volume_path)
                    .then(|| CsiError::invalid("volume_path", "must be absolute"))
            }
            Method::NodeExpandVolume if self.faults.contains(&Fault::RelativeVolumePathInvalid) => {
                let req: NodeExpandVolumeRequest = view(request);
                relative(&req.volume_path)
                    .then(|| CsiError::invalid("volume_path", "must be absolute"))
            }
            _ => None,
        }
    }
}
