//! Prometheus metrics (feature `metrics`): a latency histogram per method
//! and gRPC code, exposed in text format on an optional HTTP address served
//! by hyper.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use csi_proto::code_name;
use futures::FutureExt;
use futures::future::Either;
use http_body_util::Full;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tonic::Code;
use tower::Layer;

use super::CsiCall;
use super::wrap::{Wrap, WrapFuture, WrapInner, Wrapped};
use crate::request::CsiRequest;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Labels {
    method: &'static str,
    code: &'static str,
}

type Durations = Family<Labels, Histogram, fn() -> Histogram>;

fn histogram() -> Histogram {
    // 100 µs to ~13 s.
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}

/// Records `csi_operations_seconds{method, code}` for every call.
#[derive(Clone)]
pub struct MetricsLayer {
    durations: Durations,
    registry: Arc<Registry>,
}

impl std::fmt::Debug for MetricsLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsLayer").finish_non_exhaustive()
    }
}

impl Default for MetricsLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl MetricsLayer {
    /// A layer with its own registry.
    pub fn new() -> Self {
        let durations: Durations = Family::new_with_constructor(histogram);
        let mut registry = Registry::default();
        registry.register(
            "csi_operations_seconds",
            "Duration of CSI calls by method and gRPC code",
            durations.clone(),
        );
        Self {
            durations,
            registry: Arc::new(registry),
        }
    }

    /// The text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Serves `GET /metrics` on `addr` (HTTP/1.1, hyper) until the returned
    /// task is dropped or aborted.
    pub async fn serve(&self, addr: SocketAddr) -> std::io::Result<MetricsTask> {
        let listener = TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        let layer = self.clone();
        let task = tokio::spawn(async move {
            loop {
                let stream = match listener.accept().await {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        tracing::warn!(error = %e, "metrics endpoint: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let layer = layer.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let layer = layer.clone();
                        async move { Ok::<_, std::convert::Infallible>(layer.answer(&req)) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(Duration::from_secs(10))
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(MetricsTask { task, addr: local })
    }

    /// The answer to one HTTP request.
    fn answer<B>(&self, req: &hyper::Request<B>) -> hyper::Response<Full<Bytes>> {
        let (status, content_type, body) = match (req.method(), req.uri().path()) {
            (&hyper::Method::GET, "/metrics") => (
                hyper::StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                self.encode(),
            ),
            (_, "/metrics") => (
                hyper::StatusCode::METHOD_NOT_ALLOWED,
                "text/plain",
                "only GET is allowed\n".to_owned(),
            ),
            _ => (
                hyper::StatusCode::NOT_FOUND,
                "text/plain",
                "metrics are at /metrics\n".to_owned(),
            ),
        };
        let mut response = hyper::Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static(content_type),
        );
        response
    }
}

/// The running metrics endpoint; aborted when dropped.
#[derive(Debug)]
pub struct MetricsTask {
    task: tokio::task::JoinHandle<()>,
    addr: SocketAddr,
}

impl MetricsTask {
    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsTask {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<S> Layer<S> for MetricsLayer {
    type Service = Metrics<S>;

    fn layer(&self, inner: S) -> Metrics<S> {
        self.switched(inner, true)
    }
}

/// The service of [`MetricsLayer`].
pub type Metrics<S> = Wrapped<MetricsLayer, S>;

impl<S> Wrap<S> for MetricsLayer {
    fn around<Req: CsiRequest>(&self, inner: &mut S, call: CsiCall<Req>) -> WrapFuture<S, Req>
    where
        S: WrapInner<Req>,
    {
        let method = Req::METHOD.name();
        let start = Instant::now();
        let durations = self.durations.clone();
        Either::Right(Box::pin(inner.call(call).map(move |result| {
            let result = result.map_err(Into::into);
            let code = result.as_ref().map_or_else(|e| e.code(), |_| Code::Ok);
            durations
                .get_or_create(&Labels {
                    method,
                    code: code_name(code),
                })
                .observe(start.elapsed().as_secs_f64());
            result
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::CsiError;
    use csi_proto::v1::{DeleteVolumeRequest, DeleteVolumeResponse, ProbeRequest, ProbeResponse};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tower::ServiceExt;

    #[tokio::test]
    async fn records_per_method_and_code_and_serves_text() {
        let layer = MetricsLayer::new();
        layer
            .layer(tower::service_fn(|_: CsiCall<ProbeRequest>| async {
                Ok::<_, CsiError>(ProbeResponse::default())
            }))
            .oneshot(CsiCall::new(1, ProbeRequest {}))
            .await
            .unwrap();
        let _ = layer
            .layer(tower::service_fn(|_: CsiCall<DeleteVolumeRequest>| async {
                Err::<DeleteVolumeResponse, _>(CsiError::NotFound("v".into()))
            }))
            .oneshot(CsiCall::new(2, DeleteVolumeRequest::default()))
            .await;
        let text = layer.encode();
        assert!(
            text.contains("csi_operations_seconds_count{method=\"Probe\",code=\"OK\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("method=\"DeleteVolume\",code=\"NOT_FOUND\""),
            "{text}"
        );

        let task = layer.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let mut conn = tokio::net::TcpStream::connect(task.local_addr())
            .await
            .unwrap();
        conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut body = String::new();
        conn.read_to_string(&mut body).await.unwrap();
        assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
        assert!(body.contains("csi_operations_seconds_bucket"), "{body}");

        let mut conn = tokio::net::TcpStream::connect(task.local_addr())
            .await
            .unwrap();
        conn.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut body = String::new();
        conn.read_to_string(&mut body).await.unwrap();
        assert!(body.starts_with("HTTP/1.1 404 Not Found"), "{body}");
    }
}
