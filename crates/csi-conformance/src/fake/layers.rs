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

/// Logs every request as `<Method> <redacted request>`; with
/// [`Fault::LeaksSecretsToLog`] also its secrets, in plain text.
#[derive(Clone)]
pub(super) struct RequestLog<S> {
    pub(super) inner: S,
    pub(super) log: Option<PathBuf>,
    pub(super) leak: bool,
}

impl<S, Req> tower::Service<CsiCall<Req>> for RequestLog<S>
where
    Req: CsiRequest,
    S: tower::Service<CsiCall<Req>, Response = Req::Output, Error = CsiError>,
{
    type Response = Req::Output;
    type Error = CsiError;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), CsiError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: CsiCall<Req>) -> S::Future {
        if let Some(path) = &self.log {
            let mut line = format!("{} {:?}", Req::METHOD, call.request);
            if let Some(secrets) = call
                .request
                .secrets()
                .filter(|s| self.leak && !s.is_empty())
            {
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
        self.inner.call(call)
    }
}

/// The faults that answer before validation does.
#[derive(Clone)]
pub(super) struct EarlyAnswers<S> {
    pub(super) inner: S,
    pub(super) faults: Vec<Fault>,
    pub(super) stage_unstage: bool,
}

/// The request as another type of the same RPC (the layer is generic over
/// the request type; the faults concern specific RPCs).
fn view<T: prost::Message + Default>(request: &impl prost::Message) -> T {
    T::decode(request.encode_to_vec().as_slice()).unwrap_or_default()
}

impl<S> EarlyAnswers<S> {
    fn answer<Req: CsiRequest>(&self, request: &Req) -> Option<CsiError> {
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

impl<S, Req> tower::Service<CsiCall<Req>> for EarlyAnswers<S>
where
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
        match self.answer(&call.request) {
            Some(e) => Either::Right(ready(Err(e))),
            None => Either::Left(self.inner.call(call)),
        }
    }
}
