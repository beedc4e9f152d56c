//! One span per call (request id, method, volume id, duration, code) and
//! debug events with the request and response. Both are formatted only
//! when the level is enabled, and `Debug` of every request hides secrets
//! and mount flags (csi-proto's redaction).

use std::time::Instant;

use futures::future::Either;
use tonic::Code;
use tower::Layer;
use tracing::field::Empty;
use tracing::{Instrument, Level};

use super::CsiCall;
use super::wrap::{Wrap, WrapFuture, WrapInner, Wrapped};
use crate::request::CsiRequest;

/// Traces every call.
#[derive(Debug, Clone, Copy, Default)]
pub struct TracingLayer;

impl<S> Layer<S> for TracingLayer {
    type Service = Tracing<S>;

    fn layer(&self, inner: S) -> Tracing<S> {
        self.switched(inner, true)
    }
}

/// The service of [`TracingLayer`].
pub type Tracing<S> = Wrapped<TracingLayer, S>;

impl<S> Wrap<S> for TracingLayer {
    fn around<Req: CsiRequest>(&self, inner: &mut S, call: CsiCall<Req>) -> WrapFuture<S, Req>
    where
        S: WrapInner<Req>,
    {
        let span = tracing::info_span!(
            "csi",
            request_id = call.ctx.request_id,
            method = Req::METHOD.name(),
            volume_id = Empty,
            code = Empty,
            duration_us = Empty,
        );
        if !span.is_disabled()
            && let Some(v) = call.request.volume_id()
        {
            span.record("volume_id", v);
        }
        tracing::debug!(parent: &span, request = ?call.request, "request");
        let start = Instant::now();
        let future = {
            let _entered = span.enter();
            inner.call(call)
        };
        Either::Right(Box::pin(async move {
            let result = future.instrument(span.clone()).await.map_err(Into::into);
            let code = result.as_ref().map_or_else(|e| e.code(), |_| Code::Ok);
            span.record("code", tracing::field::debug(code));
            span.record("duration_us", start.elapsed().as_micros() as u64);
            match &result {
                Ok(response) => tracing::debug!(parent: &span, ?response, "ok"),
                Err(e) if matches!(code, Code::Internal | Code::Unknown | Code::DataLoss) => {
                    tracing::error!(parent: &span, error = %e, "failed")
                }
                Err(e) if tracing::enabled!(Level::INFO) => {
                    tracing::info!(parent: &span, error = %e, ?code, "failed")
                }
                Err(_) => {}
            }
            result
        }))
    }
}
