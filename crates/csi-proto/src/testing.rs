//! Test doubles (feature `testing`).

use tonic::{Request, Response, Status};

use crate::v1::identity_server::Identity;
use crate::v1::*;

/// A plain tonic Identity service answering defaults (and `ready: true`),
/// with nothing around it: the baseline a benchmark compares a served
/// stack with.
#[derive(Debug, Clone, Copy, Default)]
pub struct FakeIdentity;

#[tonic::async_trait]
impl Identity for FakeIdentity {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse::default()))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(GetPluginCapabilitiesResponse::default()))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}
