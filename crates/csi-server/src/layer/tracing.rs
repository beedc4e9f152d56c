//! One span per call (request id, method, volume id, duration, code) and
//! debug events with the request and response. Both are formatted only
//! when the level is enabled, and `Debug` of every request hides secrets
//! and mount flags (csi-proto's redaction).

use std::time::Instant;

use futures::future::BoxFuture;
use tonic::Code;
use tracing::field::Empty;
use tracing::{Instrument, Level};

use super::{Call, CallResult, Layer, Next};

/// Traces every call.
#[derive(Debug, Clone, Copy, Default)]
pub struct TracingLayer;

impl Layer for TracingLayer {
    fn call<'a>(&'a self, call: Call, next: Next<'a>) -> BoxFuture<'a, CallResult> {
        let span = tracing::info_span!(
            "csi",
            request_id = call.request_id,
            method = call.method.name(),
            volume_id = Empty,
            code = Empty,
            duration_us = Empty,
        );
        if !span.is_disabled() {
            if let Some(v) = call.request().volume_id() {
                span.record("volume_id", v);
            }
        }
        tracing::debug!(parent: &span, request = ?call.request(), "request");
        let start = Instant::now();
        Box::pin(async move {
            let result = next.run(call).instrument(span.clone()).await;
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
        })
    }
}
