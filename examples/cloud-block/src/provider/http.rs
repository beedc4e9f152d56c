//! The provider's routes: authentication, the fault mode, and one handler
//! per API call. Handlers run on blocking threads (they do file and device
//! I/O under the state lock); actions' work runs in the background.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST, RETRY_AFTER};
use hyper::{Method, Request, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Faults, Shared, Source, Verdict, internal, lock, now, spawn_action};
use crate::api::{
    ActionEnvelope, ActionList, ActionRequest, CreateSnapshotRequest, CreateVolumeRequest,
    DEFAULT_PER_PAGE, Links, MAX_PER_PAGE, Meta, PageLinks, PageRequest, RegionsEnvelope,
    SnapshotEnvelope, SnapshotFilter, SnapshotList, VolumeEnvelope, VolumeFilter, VolumeList,
    error_id,
};
use crate::cloud::{ApiError, is_provider_id};

/// Largest request body accepted.
const MAX_BODY_BYTES: usize = 1 << 20;

type Answer = Response<Full<Bytes>>;

/// What a handler produced: status, JSON body, and an action to start.
struct Reply {
    status: u16,
    body: Vec<u8>,
    start: Option<crate::api::Action>,
}

fn reply<T: Serialize>(status: u16, value: &T) -> Reply {
    Reply {
        status,
        body: serde_json::to_vec(value).expect("API types always serialize"),
        start: None,
    }
}

fn respond(status: u16, body: Vec<u8>) -> Answer {
    Response::builder()
        .status(status)
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("status and header are valid")
}

fn error_answer(e: &ApiError) -> Answer {
    respond(e.status, serde_json::to_vec(&e.body).expect("serializes"))
}

/// The request as the handlers see it.
struct Call {
    method: Method,
    segments: Vec<String>,
    query: Vec<(String, String)>,
    host: String,
    path: String,
    body: Bytes,
}

impl Call {
    fn param(&self, key: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn page(&self) -> Result<PageRequest, ApiError> {
        let number = |key: &str, default: u32, max: u32| match self.param(key) {
            None => Ok(default),
            Some(v) => v
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=max).contains(n))
                .ok_or_else(|| {
                    ApiError::bad_request(format!("{key}: expected 1 to {max}, got {v:?}"))
                }),
        };
        Ok(PageRequest {
            page: number("page", 1, u32::MAX)?,
            per_page: number("per_page", DEFAULT_PER_PAGE, MAX_PER_PAGE)?,
        })
    }

    /// `links` pointing at `next`, keeping the other query parameters.
    fn links(&self, next: Option<u32>) -> Links {
        let next = next.map(|page| {
            let mut url = format!("http://{}{}?page={page}", self.host, self.path);
            for (k, v) in self.query.iter().filter(|(k, _)| k != "page") {
                url.push_str(&format!("&{k}={}", encode(v)));
            }
            url
        });
        Links {
            pages: PageLinks { next },
        }
    }

    fn json<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        serde_json::from_slice(&self.body)
            .map_err(|e| ApiError::bad_request(format!("request body: {e}")))
    }
}

fn decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Serves one HTTP request.
pub(crate) async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Answer, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let answer = serve(&shared, req).await;
    // Never the headers: the Authorization header holds the token.
    tracing::info!(%method, %path, status = answer.status().as_u16(), "request");
    Ok(answer)
}

async fn serve(shared: &Arc<Shared>, req: Request<Incoming>) -> Answer {
    if req.uri().path() == "/healthz" {
        return respond(200, b"{\"status\":\"ok\"}".to_vec());
    }
    let presented = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if !presented.is_some_and(|t| shared.token.matches(t)) {
        return error_answer(&ApiError::new(
            401,
            error_id::UNAUTHORIZED,
            "unable to authenticate you: send Authorization: Bearer <token>",
        ));
    }
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return error_answer(&ApiError::bad_request(format!("request body: {e}"))),
    };
    let Some(query) = parts
        .uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            Some((decode(k)?, decode(v)?))
        })
        .collect::<Option<Vec<_>>>()
    else {
        return error_answer(&ApiError::bad_request("query: bad percent-encoding"));
    };
    let call = Call {
        method: parts.method,
        segments: parts
            .uri
            .path()
            .split('/')
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
        query,
        host: parts
            .headers
            .get(HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("localhost")
            .to_owned(),
        path: parts.uri.path().to_owned(),
        body,
    };
    if call.segments.first().map(String::as_str) == Some("admin") {
        return admin(shared, &call);
    }
    let (verdict, latency) = {
        let mut faults = lock(&shared.faults);
        (faults.judge(), faults.faults().latency_ms)
    };
    super::delay(Duration::from_millis(latency)).await;
    let lose_reply = match verdict {
        Verdict::Garbage => {
            return Response::builder()
                .status(200)
                .header(CONTENT_TYPE, "application/json")
                .body(Full::new(Bytes::from_static(
                    b"<html>502 Bad Gateway</html>",
                )))
                .expect("valid");
        }
        Verdict::Throttle(secs) => {
            let mut answer = error_answer(&ApiError::new(
                429,
                error_id::TOO_MANY_REQUESTS,
                "API rate limit exceeded",
            ));
            answer
                .headers_mut()
                .insert(RETRY_AFTER, secs.to_string().parse().expect("digits"));
            return answer;
        }
        Verdict::Fail => return unavailable(),
        Verdict::Serve { lose_reply } => lose_reply,
    };
    let worker = shared.clone();
    let outcome = tokio::task::spawn_blocking(move || route(&worker, &call)).await;
    let answer = match outcome {
        Ok(Ok(reply)) => {
            if let Some(action) = reply.start {
                spawn_action(shared.clone(), action);
            }
            respond(reply.status, reply.body)
        }
        Ok(Err(e)) => error_answer(&e),
        Err(e) => error_answer(&internal("handler", e)),
    };
    if lose_reply { unavailable() } else { answer }
}

fn unavailable() -> Answer {
    error_answer(&ApiError::new(
        503,
        error_id::UNAVAILABLE,
        "the service is temporarily unavailable",
    ))
}

fn admin(shared: &Shared, call: &Call) -> Answer {
    let segments: Vec<&str> = call.segments.iter().map(String::as_str).collect();
    match (&call.method, segments.as_slice()) {
        (&Method::GET, ["admin", "faults"]) => {
            let faults = lock(&shared.faults).faults().clone();
            respond(200, serde_json::to_vec(&faults).expect("serializes"))
        }
        (&Method::PUT, ["admin", "faults"]) => {
            let faults: Faults = match call.json() {
                Ok(f) => f,
                Err(e) => return error_answer(&e),
            };
            if let Err(e) = faults.validate() {
                return error_answer(&ApiError::field("faults", e));
            }
            tracing::info!(?faults, "fault mode changed");
            lock(&shared.faults).set(faults.clone());
            respond(200, serde_json::to_vec(&faults).expect("serializes"))
        }
        _ => error_answer(&no_route(call)),
    }
}

fn no_route(call: &Call) -> ApiError {
    ApiError::new(
        404,
        error_id::NOT_FOUND,
        format!("no route for {} {}", call.method, call.path),
    )
}

/// An id from the path: one the provider could have made, else not found.
fn id<'a>(kind: &str, id: &'a str) -> Result<&'a str, ApiError> {
    if is_provider_id(id) {
        Ok(id)
    } else {
        Err(ApiError::not_found(kind, id))
    }
}

fn route(shared: &Shared, call: &Call) -> Result<Reply, ApiError> {
    let segments: Vec<&str> = call.segments.iter().map(String::as_str).collect();
    let m = &call.method;
    match segments.as_slice() {
        ["v2", "regions"] if m == Method::GET => {
            let regions = shared.limits.region_list();
            Ok(reply(200, &RegionsEnvelope { regions }))
        }
        ["v2", "volumes"] if m == Method::POST => create_volume(shared, call),
        ["v2", "volumes"] if m == Method::GET => {
            let filter = VolumeFilter {
                name: call.param("name").map(str::to_owned),
                region: call.param("region").map(str::to_owned),
            };
            let (volumes, next, total) = lock(&shared.cloud).list_volumes(&filter, call.page()?);
            let links = call.links(next);
            Ok(reply(
                200,
                &VolumeList {
                    volumes,
                    links,
                    meta: Meta { total },
                },
            ))
        }
        ["v2", "volumes", vid] if m == Method::GET => {
            let volume = lock(&shared.cloud).volume(id("volume", vid)?)?.clone();
            Ok(reply(200, &VolumeEnvelope { volume }))
        }
        ["v2", "volumes", vid] if m == Method::DELETE => delete_volume(shared, id("volume", vid)?),
        ["v2", "volumes", vid, "actions"] if m == Method::POST => {
            let vid = id("volume", vid)?;
            let req: ActionRequest = call.json()?;
            let action = shared.commit(
                |cloud| cloud.start_action(&shared.limits, vid, &req, &now()),
                |_| {},
            )?;
            let mut r = reply(
                202,
                &ActionEnvelope {
                    action: action.clone(),
                },
            );
            r.start = Some(action);
            Ok(r)
        }
        ["v2", "volumes", vid, "actions"] if m == Method::GET => {
            let (actions, next, total) =
                lock(&shared.cloud).list_actions(id("volume", vid)?, call.page()?)?;
            let links = call.links(next);
            Ok(reply(
                200,
                &ActionList {
                    actions,
                    links,
                    meta: Meta { total },
                },
            ))
        }
        ["v2", "actions", aid] if m == Method::GET => get_action(shared, None, aid),
        ["v2", "volumes", vid, "actions", aid] if m == Method::GET => {
            get_action(shared, Some(vid), aid)
        }
        ["v2", "volumes", vid, "snapshots"] if m == Method::POST => {
            create_snapshot(shared, call, id("volume", vid)?)
        }
        ["v2", "volumes", vid, "snapshots"] if m == Method::GET => {
            let filter = SnapshotFilter {
                name: None,
                resource_id: Some(id("volume", vid)?.to_owned()),
            };
            list_snapshots(shared, call, &filter)
        }
        ["v2", "snapshots"] if m == Method::GET => {
            let filter = SnapshotFilter {
                name: call.param("name").map(str::to_owned),
                resource_id: call.param("resource_id").map(str::to_owned),
            };
            list_snapshots(shared, call, &filter)
        }
        ["v2", "snapshots", sid] if m == Method::GET => {
            let snapshot = lock(&shared.cloud).snapshot(id("snapshot", sid)?)?.clone();
            Ok(reply(200, &SnapshotEnvelope { snapshot }))
        }
        ["v2", "snapshots", sid] if m == Method::DELETE => {
            let sid = id("snapshot", sid)?;
            shared.commit(|cloud| cloud.delete_snapshot(sid), |_| {})?;
            if let Err(e) = shared.disks.remove_snapshot(sid) {
                // The record is gone; the next start sweeps the file.
                tracing::warn!(snapshot = sid, error = %e, "removing a snapshot's file");
            }
            Ok(Reply {
                status: 204,
                body: Vec::new(),
                start: None,
            })
        }
        _ => Err(no_route(call)),
    }
}

/// An action, by id alone or as one of a volume's.
fn get_action(shared: &Shared, volume_id: Option<&str>, aid: &str) -> Result<Reply, ApiError> {
    let action_id: u64 = aid
        .parse()
        .map_err(|_| ApiError::not_found("action", aid))?;
    let action = lock(&shared.cloud).action(action_id)?.clone();
    if volume_id.is_some_and(|v| v != action.resource_id) {
        return Err(ApiError::not_found("action", aid));
    }
    Ok(reply(200, &ActionEnvelope { action }))
}

fn create_volume(shared: &Shared, call: &Call) -> Result<Reply, ApiError> {
    let req: CreateVolumeRequest = call.json()?;
    let from = match (&req.snapshot_id, &req.source_volume_id) {
        (Some(snap), _) => Some(Source::Snapshot(id("snapshot", snap)?)),
        (None, Some(volume)) => Some(Source::Volume(id("volume", volume)?)),
        (None, None) => None,
    };
    let vid = uuid::Uuid::new_v4().to_string();
    let volume = shared.commit(
        |cloud| {
            let volume = cloud.create_volume(&shared.limits, &req, vid.clone(), &now())?;
            shared
                .disks
                .create_volume(&vid, volume.size_gigabytes, from)
                .map_err(|e| {
                    let _ = shared.disks.remove_volume(&vid);
                    internal("creating the volume's file", e)
                })?;
            Ok(volume)
        },
        |_| {
            let _ = shared.disks.remove_volume(&vid);
        },
    )?;
    tracing::info!(volume = %volume.id, size_gigabytes = volume.size_gigabytes, "volume created");
    Ok(reply(201, &VolumeEnvelope { volume }))
}

fn delete_volume(shared: &Shared, vid: &str) -> Result<Reply, ApiError> {
    shared.commit(|cloud| cloud.delete_volume(vid), |_| {})?;
    if let Err(e) = shared.disks.remove_volume(vid) {
        // The record is gone; the next start sweeps the file.
        tracing::warn!(volume = vid, error = %e, "removing a volume's file");
    }
    tracing::info!(volume = vid, "volume deleted");
    Ok(Reply {
        status: 204,
        body: Vec::new(),
        start: None,
    })
}

fn create_snapshot(shared: &Shared, call: &Call, vid: &str) -> Result<Reply, ApiError> {
    let req: CreateSnapshotRequest = call.json()?;
    let sid = uuid::Uuid::new_v4().to_string();
    let snapshot = shared.commit(
        |cloud| {
            let snapshot = cloud.create_snapshot(vid, &req, sid.clone(), &now())?;
            shared.disks.create_snapshot(vid, &sid).map_err(|e| {
                let _ = shared.disks.remove_snapshot(&sid);
                internal("copying the volume", e)
            })?;
            Ok(snapshot)
        },
        |_| {
            let _ = shared.disks.remove_snapshot(&sid);
        },
    )?;
    Ok(reply(201, &SnapshotEnvelope { snapshot }))
}

fn list_snapshots(
    shared: &Shared,
    call: &Call,
    filter: &SnapshotFilter,
) -> Result<Reply, ApiError> {
    let (snapshots, next, total) = lock(&shared.cloud).list_snapshots(filter, call.page()?);
    let links = call.links(next);
    Ok(reply(
        200,
        &SnapshotList {
            snapshots,
            links,
            meta: Meta { total },
        },
    ))
}
