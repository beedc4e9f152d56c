//! Probe readiness: Probe answers `ready=false` until the driver flips its
//! [`Readiness`] handle, and FAILED_PRECONDITION while it reports itself
//! unhealthy.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use tower::Layer;

use super::CsiCall;
use super::precheck::{Precheck, Prechecked};
use crate::error::CsiError;
use crate::request::CsiRequest;

const NOT_READY: u8 = 0;
const READY: u8 = 1;
const UNHEALTHY: u8 = 2;

/// The driver's readiness, as Probe reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadinessState {
    /// Starting up: Probe answers `ready=false`.
    NotReady,
    /// Ready: Probe goes on to the driver's `probe`.
    Ready,
    /// Broken: Probe fails with FAILED_PRECONDITION and this reason.
    Unhealthy(String),
}

#[derive(Debug, Default)]
struct Inner {
    state: AtomicU8,
    reason: Mutex<String>,
}

/// A cloneable handle the driver flips when it becomes ready (or breaks).
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    inner: Arc<Inner>,
}

impl Readiness {
    /// A handle that starts not ready.
    pub fn new() -> Self {
        Self::default()
    }

    /// A handle that starts ready.
    pub fn ready() -> Self {
        let r = Self::new();
        r.set_ready();
        r
    }

    /// Reports ready.
    pub fn set_ready(&self) {
        self.inner.state.store(READY, Ordering::Release);
    }

    /// Reports not ready (yet).
    pub fn set_not_ready(&self) {
        self.inner.state.store(NOT_READY, Ordering::Release);
    }

    /// Reports unhealthy; `reason` is sent to the CO, so no secrets.
    pub fn set_unhealthy(&self, reason: impl Into<String>) {
        *self.inner.reason.lock().unwrap_or_else(|e| e.into_inner()) = reason.into();
        self.inner.state.store(UNHEALTHY, Ordering::Release);
    }

    /// Whether the state is [`ReadinessState::Ready`].
    pub fn is_ready(&self) -> bool {
        self.inner.state.load(Ordering::Acquire) == READY
    }

    /// The current state.
    pub fn state(&self) -> ReadinessState {
        match self.inner.state.load(Ordering::Acquire) {
            READY => ReadinessState::Ready,
            UNHEALTHY => ReadinessState::Unhealthy(
                self.inner
                    .reason
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone(),
            ),
            _ => ReadinessState::NotReady,
        }
    }
}

/// Answers Probe from a [`Readiness`] handle before the driver is asked.
#[derive(Debug, Clone)]
pub struct ReadinessLayer {
    readiness: Readiness,
}

impl ReadinessLayer {
    /// Uses `readiness`.
    pub fn new(readiness: Readiness) -> Self {
        Self { readiness }
    }
}

impl Precheck for ReadinessLayer {
    fn answer<Req: CsiRequest>(
        &self,
        _call: &CsiCall<Req>,
    ) -> Option<Result<Req::Output, CsiError>> {
        // Only requests with a not-ready answer (Probe) are affected.
        let not_ready = Req::not_ready_response()?;
        match self.readiness.state() {
            ReadinessState::Ready => None,
            ReadinessState::NotReady => Some(Ok(not_ready)),
            ReadinessState::Unhealthy(reason) => {
                Some(Err(CsiError::FailedPrecondition(if reason.is_empty() {
                    "the plugin is not healthy".into()
                } else {
                    reason
                })))
            }
        }
    }
}

impl<S> Layer<S> for ReadinessLayer {
    type Service = ReadinessService<S>;

    fn layer(&self, inner: S) -> ReadinessService<S> {
        self.switched(inner, true)
    }
}

/// The service of [`ReadinessLayer`].
pub type ReadinessService<S> = Prechecked<ReadinessLayer, S>;
