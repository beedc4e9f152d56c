//! [`HttpProvider`]: the provider's API over HTTP/1.1 with pooled connections.
//! Each call that changes the cloud is a crash point of test builds
//! (`crash_points::effect_async`); reads are not, so polling an action
//! leaves the steps' numbering the same from run to run.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use crash_points::effect_async;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, RETRY_AFTER};
use hyper::{Method, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::de::DeserializeOwned;

use super::{ConflictKind, ProviderClient, ProviderError};
use crate::api::{
    Action, ActionEnvelope, ActionKind, ActionList, ActionRequest, CreateSnapshotRequest,
    CreateVolumeRequest, ErrorBody, Page, PageRequest, Region, RegionsEnvelope, Snapshot,
    SnapshotEnvelope, SnapshotFilter, SnapshotList, Volume, VolumeEnvelope, VolumeFilter,
    VolumeList, error_id, page_of_link,
};
use crate::cloud::is_provider_id;
use crate::token::Token;

/// Largest answer read; anything bigger is garbage for this API.
const MAX_ANSWER_BYTES: usize = 8 << 20;

/// The provider's API over HTTP (plain HTTP: meant for loopback or a
/// cluster-internal Service). `Debug` does not show the token.
#[derive(Clone)]
pub struct HttpProvider {
    endpoint: String,
    token: Token,
    timeout: Duration,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl std::fmt::Debug for HttpProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpProvider")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl HttpProvider {
    /// A client of the provider at `endpoint` (`http://host:port`), calls
    /// timing out after 30 s and connections after 5 s.
    pub fn new(endpoint: &str, token: Token) -> Result<Self, ProviderError> {
        let endpoint = endpoint.trim_end_matches('/').to_owned();
        let valid = endpoint
            .strip_prefix("http://")
            .is_some_and(|rest| !rest.is_empty() && !rest.contains(['/', '?', '#', '@']))
            && endpoint.parse::<hyper::Uri>().is_ok();
        if !valid {
            return Err(ProviderError::Invalid {
                message: format!("provider endpoint {endpoint:?}: expected http://host:port"),
            });
        }
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(HttpProvider {
            endpoint,
            token,
            timeout: Duration::from_secs(30),
            client,
        })
    }

    /// Sets how long one call may take in all.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The endpoint, for example `http://127.0.0.1:8080`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Sends one request and returns the decoded answer (`None` for 204).
    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Vec<u8>>,
    ) -> Result<Option<T>, ProviderError> {
        let label = format!("{method} {path}");
        let mut uri = format!("{}{path}", self.endpoint);
        for (i, (key, value)) in query.iter().enumerate() {
            uri.push(if i == 0 { '?' } else { '&' });
            uri.push_str(key);
            uri.push('=');
            uri.push_str(&percent_encode(value));
        }
        let mut builder = hyper::Request::builder()
            .method(method)
            .uri(uri)
            .header(AUTHORIZATION, format!("Bearer {}", self.token.expose()))
            .header(ACCEPT, "application/json");
        if body.is_some() {
            builder = builder.header(CONTENT_TYPE, "application/json");
        }
        let request = builder
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| ProviderError::Invalid {
                message: format!("{label}: {e}"),
            })?;
        let exchange = async {
            let response = self.client.request(request).await.map_err(|e| {
                let reason = if e.is_connect() {
                    format!("connecting to {}: {}", self.endpoint, source_chain(&e))
                } else {
                    source_chain(&e)
                };
                ProviderError::Connection {
                    request: label.clone(),
                    reason,
                }
            })?;
            let (parts, body) = response.into_parts();
            let bytes = Limited::new(body, MAX_ANSWER_BYTES)
                .collect()
                .await
                .map_err(|e| ProviderError::Connection {
                    request: label.clone(),
                    reason: format!("reading the answer: {e}"),
                })?
                .to_bytes();
            Ok::<_, ProviderError>((parts.status, parts.headers, bytes))
        };
        let (status, headers, bytes) = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| ProviderError::Timeout {
                request: label.clone(),
                after: self.timeout,
            })??;
        if !status.is_success() {
            return Err(error_from(&label, status, &headers, &bytes));
        }
        if status == StatusCode::NO_CONTENT {
            return Ok(None);
        }
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| ProviderError::Garbage {
                request: label,
                reason: format!(
                    "HTTP {status} with a body that is not the expected JSON ({} bytes): {e}",
                    bytes.len()
                ),
            })
    }

    /// A call that must answer with a body.
    async fn fetch<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Vec<u8>>,
    ) -> Result<T, ProviderError> {
        let label = format!("{method} {path}");
        self.call(method, path, query, body)
            .await?
            .ok_or_else(|| ProviderError::Garbage {
                request: label,
                reason: "HTTP 204 where a body was expected".to_owned(),
            })
    }

    /// Starts an action; `kind` names it in a crash trace.
    async fn action(
        &self,
        kind: &str,
        volume_id: &str,
        req: ActionRequest,
    ) -> Result<Action, ProviderError> {
        check_id("volume", volume_id)?;
        let body = json(&req);
        let path = format!("/v2/volumes/{volume_id}/actions");
        let call = self.fetch(Method::POST, &path, &[], Some(body));
        let answer: ActionEnvelope = effect_async(kind, call).await?;
        Ok(answer.action)
    }
}

/// The error a non-2xx answer means.
fn error_from(label: &str, status: StatusCode, headers: &HeaderMap, bytes: &[u8]) -> ProviderError {
    let retry_after = headers
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    error_of(
        label,
        status.as_u16(),
        retry_after,
        serde_json::from_slice(bytes).ok(),
    )
}

/// The error an answer with `status` and (when it could be read) `body` means.
pub(crate) fn error_of(
    label: &str,
    status: u16,
    retry_after: Option<Duration>,
    body: Option<ErrorBody>,
) -> ProviderError {
    let message = body.as_ref().map_or_else(
        || format!("HTTP {status} without an error body"),
        |b| b.message.clone(),
    );
    let id = body.as_ref().map(|b| b.id.as_str()).unwrap_or_default();
    match status {
        429 => ProviderError::RateLimited {
            retry_after,
            message,
        },
        500..=599 => ProviderError::Unavailable { status, message },
        401 | 403 => ProviderError::Unauthorized { status, message },
        404 => ProviderError::NotFound { message },
        409 | 422 => {
            let kind = match id {
                error_id::NAME_TAKEN => ConflictKind::NameTaken,
                error_id::ATTACHED_ELSEWHERE => ConflictKind::AttachedElsewhere {
                    node_id: body.as_ref().and_then(|b| b.node_id.clone()),
                },
                error_id::ALREADY_ATTACHED => ConflictKind::AlreadyAttached,
                error_id::NOT_ATTACHED => ConflictKind::NotAttached,
                error_id::ACTION_IN_PROGRESS => ConflictKind::ActionInProgress {
                    action_id: body.as_ref().and_then(|b| b.action_id),
                },
                error_id::VOLUME_ATTACHED => ConflictKind::VolumeAttached,
                error_id::ATTACH_LIMIT => ConflictKind::AttachLimit,
                _ if status == 422 => return ProviderError::Invalid { message },
                other => ConflictKind::Other(other.to_owned()),
            };
            ProviderError::Conflict { kind, message }
        }
        400 => ProviderError::Invalid { message },
        _ => ProviderError::Garbage {
            request: label.to_owned(),
            reason: format!("unexpected HTTP {status}: {message}"),
        },
    }
}

/// The error and its causes, without the request (which holds the token).
fn source_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Ids go into URL paths: anything that is not one of the provider's ids
/// cannot exist, so it is not found without asking.
pub(crate) fn check_id(kind: &str, id: &str) -> Result<(), ProviderError> {
    if is_provider_id(id) {
        Ok(())
    } else {
        Err(ProviderError::NotFound {
            message: format!("no {kind} has id {id:?} (not a provider id)"),
        })
    }
}

fn json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("request types always serialize")
}

/// Percent-encodes a query value (everything but RFC 3986's unreserved set).
fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn page_query(page: PageRequest) -> [(&'static str, String); 2] {
    [
        ("page", page.page.to_string()),
        ("per_page", page.per_page.to_string()),
    ]
}

fn page<T>(items: Vec<T>, next: Option<String>, total: u64) -> Page<T> {
    Page {
        items,
        next_page: next.as_deref().and_then(page_of_link),
        total,
    }
}

#[async_trait]
impl ProviderClient for HttpProvider {
    async fn list_regions(&self) -> Result<Vec<Region>, ProviderError> {
        let answer: RegionsEnvelope = self.fetch(Method::GET, "/v2/regions", &[], None).await?;
        Ok(answer.regions)
    }

    async fn create_volume(&self, req: &CreateVolumeRequest) -> Result<Volume, ProviderError> {
        let call = self.fetch(Method::POST, "/v2/volumes", &[], Some(json(req)));
        let answer: VolumeEnvelope = effect_async("provider-create-volume", call).await?;
        Ok(answer.volume)
    }

    async fn get_volume(&self, id: &str) -> Result<Volume, ProviderError> {
        check_id("volume", id)?;
        let path = format!("/v2/volumes/{id}");
        let answer: VolumeEnvelope = self.fetch(Method::GET, &path, &[], None).await?;
        Ok(answer.volume)
    }

    async fn list_volumes(
        &self,
        filter: &VolumeFilter,
        page_req: PageRequest,
    ) -> Result<Page<Volume>, ProviderError> {
        let mut query = page_query(page_req).to_vec();
        if let Some(name) = &filter.name {
            query.push(("name", name.clone()));
        }
        if let Some(region) = &filter.region {
            query.push(("region", region.clone()));
        }
        let answer: VolumeList = self.fetch(Method::GET, "/v2/volumes", &query, None).await?;
        Ok(page(
            answer.volumes,
            answer.links.pages.next,
            answer.meta.total,
        ))
    }

    async fn delete_volume(&self, id: &str) -> Result<(), ProviderError> {
        check_id("volume", id)?;
        let path = format!("/v2/volumes/{id}");
        let call = self.call::<serde_json::Value>(Method::DELETE, &path, &[], None);
        effect_async("provider-delete-volume", call).await.map(drop)
    }

    async fn attach(&self, volume_id: &str, node_id: &str) -> Result<Action, ProviderError> {
        let req = ActionRequest {
            kind: ActionKind::Attach,
            node_id: Some(node_id.to_owned()),
            size_gigabytes: None,
        };
        self.action("provider-attach", volume_id, req).await
    }

    async fn detach(&self, volume_id: &str, node_id: &str) -> Result<Action, ProviderError> {
        let req = ActionRequest {
            kind: ActionKind::Detach,
            node_id: Some(node_id.to_owned()),
            size_gigabytes: None,
        };
        self.action("provider-detach", volume_id, req).await
    }

    async fn resize(&self, volume_id: &str, size_gigabytes: u64) -> Result<Action, ProviderError> {
        let req = ActionRequest {
            kind: ActionKind::Resize,
            node_id: None,
            size_gigabytes: Some(size_gigabytes),
        };
        self.action("provider-resize", volume_id, req).await
    }

    async fn get_action(&self, id: u64) -> Result<Action, ProviderError> {
        let path = format!("/v2/actions/{id}");
        let answer: ActionEnvelope = self.fetch(Method::GET, &path, &[], None).await?;
        Ok(answer.action)
    }

    async fn list_volume_actions(
        &self,
        volume_id: &str,
        page_req: PageRequest,
    ) -> Result<Page<Action>, ProviderError> {
        check_id("volume", volume_id)?;
        let path = format!("/v2/volumes/{volume_id}/actions");
        let answer: ActionList = self
            .fetch(Method::GET, &path, &page_query(page_req), None)
            .await?;
        Ok(page(
            answer.actions,
            answer.links.pages.next,
            answer.meta.total,
        ))
    }

    async fn create_snapshot(
        &self,
        volume_id: &str,
        req: &CreateSnapshotRequest,
    ) -> Result<Snapshot, ProviderError> {
        check_id("volume", volume_id)?;
        let path = format!("/v2/volumes/{volume_id}/snapshots");
        let call = self.fetch(Method::POST, &path, &[], Some(json(req)));
        let answer: SnapshotEnvelope = effect_async("provider-create-snapshot", call).await?;
        Ok(answer.snapshot)
    }

    async fn get_snapshot(&self, id: &str) -> Result<Snapshot, ProviderError> {
        check_id("snapshot", id)?;
        let path = format!("/v2/snapshots/{id}");
        let answer: SnapshotEnvelope = self.fetch(Method::GET, &path, &[], None).await?;
        Ok(answer.snapshot)
    }

    async fn list_snapshots(
        &self,
        filter: &SnapshotFilter,
        page_req: PageRequest,
    ) -> Result<Page<Snapshot>, ProviderError> {
        let mut query = page_query(page_req).to_vec();
        if let Some(name) = &filter.name {
            query.push(("name", name.clone()));
        }
        if let Some(id) = &filter.resource_id {
            query.push(("resource_id", id.clone()));
        }
        let answer: SnapshotList = self
            .fetch(Method::GET, "/v2/snapshots", &query, None)
            .await?;
        Ok(page(
            answer.snapshots,
            answer.links.pages.next,
            answer.meta.total,
        ))
    }

    async fn delete_snapshot(&self, id: &str) -> Result<(), ProviderError> {
        check_id("snapshot", id)?;
        let path = format!("/v2/snapshots/{id}");
        let call = self.call::<serde_json::Value>(Method::DELETE, &path, &[], None);
        effect_async("provider-delete-snapshot", call)
            .await
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_token() {
        let token = Token::new("hunter2", "test").unwrap();
        let client = HttpProvider::new("http://127.0.0.1:1", token).unwrap();
        assert!(!format!("{client:?}").contains("hunter2"));
    }

    #[test]
    fn endpoints_must_be_plain_http_host_and_port() {
        let token = Token::new("t", "test").unwrap();
        for bad in [
            "https://h:1",
            "http://",
            "http://h:1/v2",
            "h:1",
            "http://u@h:1",
        ] {
            assert!(HttpProvider::new(bad, token.clone()).is_err(), "{bad}");
        }
    }

    #[test]
    fn error_answers_map_to_what_the_caller_decides() {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, "7".parse().unwrap());
        let e = error_from("GET /", StatusCode::TOO_MANY_REQUESTS, &headers, b"");
        assert_eq!(e.retry_after(), Some(Duration::from_secs(7)));
        assert!(e.is_transient());
        let body = br#"{"id":"action_in_progress","message":"m","action_id":4}"#;
        let e = error_from("POST /", StatusCode::CONFLICT, &HeaderMap::new(), body);
        assert_eq!(
            e.conflict(),
            Some(&ConflictKind::ActionInProgress { action_id: Some(4) })
        );
        let body = br#"{"id":"unprocessable_entity","message":"size_gigabytes: no"}"#;
        let e = error_from(
            "POST /",
            StatusCode::UNPROCESSABLE_ENTITY,
            &HeaderMap::new(),
            body,
        );
        assert!(
            matches!(e, ProviderError::Invalid { ref message } if message.contains("size_gigabytes"))
        );
        let e = error_from(
            "GET /",
            StatusCode::BAD_GATEWAY,
            &HeaderMap::new(),
            b"<html>",
        );
        assert!(e.is_transient(), "{e}");
    }

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(percent_encode("a b/c&d=é"), "a%20b%2Fc%26d%3D%C3%A9");
    }
}
