//! The traits a driver implements, one per CSI service, generated from the
//! method table (`csi_proto::for_each_method!`). Every method has a default:
//! the `*GetCapabilities`, GetPluginInfo and Probe defaults answer from the
//! declaration; everything else returns UNIMPLEMENTED, so a node-only
//! driver writes only node methods.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use csi_proto::v1::*;
use futures::Stream;

use crate::capabilities::{Capabilities, PluginInfo};
use crate::error::CsiError;
use csi_proto::methods::Method;

/// What a driver method knows about the call besides the request.
#[derive(Debug, Clone)]
pub struct CallContext {
    /// A per-server counter, also recorded in the call's tracing span.
    pub request_id: u64,
    /// The RPC being served.
    pub method: Method,
    declared: Arc<Declared>,
    deadline: Option<std::time::Instant>,
}

/// The declaration a server was built with, shared by every call.
#[derive(Debug)]
pub struct Declared {
    /// The plugin's name and version.
    pub info: PluginInfo,
    /// The capabilities it serves with.
    pub capabilities: Capabilities,
}

impl CallContext {
    /// The context of call `request_id` of `method` on a server built with
    /// `declared`.
    pub fn new(request_id: u64, method: Method, declared: Arc<Declared>) -> Self {
        Self {
            request_id,
            method,
            declared,
            deadline: None,
        }
    }

    /// This context with the instant the caller stops waiting (from the
    /// call's `grpc-timeout`).
    pub fn with_deadline(mut self, deadline: Option<std::time::Instant>) -> Self {
        self.deadline = deadline;
        self
    }

    /// When the caller stops waiting, if it said (`grpc-timeout`).
    pub fn deadline(&self) -> Option<std::time::Instant> {
        self.deadline
    }

    /// A context for calling driver methods directly in unit tests.
    pub fn for_test(method: Method, info: PluginInfo, capabilities: Capabilities) -> Self {
        Self::new(0, method, Arc::new(Declared { info, capabilities }))
    }

    /// A context with an empty declaration, for calls made outside a server
    /// (layers tested alone).
    pub fn detached(request_id: u64, method: Method) -> Self {
        static EMPTY: std::sync::OnceLock<Arc<Declared>> = std::sync::OnceLock::new();
        let declared = EMPTY.get_or_init(|| {
            Arc::new(Declared {
                info: PluginInfo::new("csi-kit.invalid", "0").expect("a valid plugin name"),
                capabilities: Capabilities::new(),
            })
        });
        Self::new(request_id, method, declared.clone())
    }

    /// The capabilities the server serves with.
    pub fn capabilities(&self) -> &Capabilities {
        &self.declared.capabilities
    }

    /// The plugin's name and version.
    pub fn plugin_info(&self) -> &PluginInfo {
        &self.declared.info
    }
}

/// The result of a driver method.
pub type CsiResult<T> = Result<T, CsiError>;

/// A server-streaming response.
pub type CsiStream<T> = Pin<Box<dyn Stream<Item = CsiResult<T>> + Send + 'static>>;

/// A driver's stream travelling back through the layers, which see it as
/// an opaque value (its `Debug` prints `<stream>`).
pub struct ResponseStream<T>(pub CsiStream<T>);

impl<T> fmt::Debug for ResponseStream<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<stream>")
    }
}

/// The default of every driver method without one of its own.
fn unimplemented<T>(ctx: &CallContext) -> CsiResult<T> {
    Err(CsiError::unimplemented(ctx.method.name()))
}

/// The default answer of a driver method: from the declaration for the
/// Identity RPCs and the `*GetCapabilities` RPCs, UNIMPLEMENTED otherwise.
macro_rules! default_answer {
    (GetPluginInfo, $ctx:ident) => {
        Ok($ctx.plugin_info().response())
    };
    (GetPluginCapabilities, $ctx:ident) => {
        Ok($ctx.capabilities().plugin_response())
    };
    (Probe, $ctx:ident) => {{
        let _ = $ctx;
        Ok(ProbeResponse { ready: Some(true) })
    }};
    (ControllerGetCapabilities, $ctx:ident) => {
        Ok($ctx.capabilities().controller_response())
    };
    (NodeGetCapabilities, $ctx:ident) => {
        Ok($ctx.capabilities().node_response())
    };
    (GroupControllerGetCapabilities, $ctx:ident) => {
        Ok($ctx.capabilities().group_controller_response())
    };
    ($other:ident, $ctx:ident) => {
        unimplemented($ctx)
    };
}

macro_rules! driver_traits {
    (() $($svc:ident {
        unary: [$($m:ident { rust: $fn:ident, request: $req:ident, response: $resp:ident, doc: $doc:literal, })*],
        server_streaming: [$($sm:ident { rust: $sfn:ident, request: $sreq:ident, response: $sresp:ident, doc: $smdoc:literal, $($_sk:ident: $_sv:tt,)* })*],
        doc: $sdoc:literal, $($_k:ident: $_v:tt,)*
    })*) => {$(
        #[doc = $sdoc]
        #[doc = ""]
        #[doc = "Every method has a default: GetPluginInfo, GetPluginCapabilities, Probe and the \
                 `*GetCapabilities` RPCs answer from the declared [`PluginInfo`] and \
                 [`Capabilities`]; every other method answers UNIMPLEMENTED. Implement the \
                 methods whose capabilities you declare: the server never calls a method whose \
                 capability is missing, and validates every request before the driver sees it."]
        #[async_trait]
        pub trait $svc: Send + Sync + 'static {
            $(
                #[doc = $doc]
                async fn $fn(&self, ctx: &CallContext, _req: $req) -> CsiResult<$resp> {
                    default_answer!($m, ctx)
                }
            )*
            $(
                #[doc = $smdoc]
                #[doc = ""]
                #[doc = "Returns a boxed stream; an `Err` item ends the stream with that error."]
                async fn $sfn(&self, ctx: &CallContext, _req: $sreq) -> CsiResult<CsiStream<$sresp>> {
                    unimplemented(ctx)
                }
            )*
        }
    )*};
}

csi_proto::for_each_method!(driver_traits);

/// An Identity service made only of the defaults.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultIdentity;

impl Identity for DefaultIdentity {}

#[cfg(test)]
mod tests {
    use super::*;

    struct NodeOnly;
    impl Node for NodeOnly {}

    #[tokio::test]
    async fn defaults_answer_from_the_declaration_or_unimplemented() {
        use csi_proto::v1::node_service_capability::rpc::Type as NodeRpc;
        let ctx = CallContext::for_test(
            Method::NodeGetCapabilities,
            PluginInfo::new("x.y", "1").unwrap(),
            Capabilities::new().node([NodeRpc::GetVolumeStats]),
        );
        let caps = NodeOnly
            .node_get_capabilities(&ctx, Default::default())
            .await
            .unwrap();
        assert_eq!(caps.capabilities.len(), 1);
        let err = NodeOnly
            .node_get_info(&ctx, Default::default())
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unimplemented);
        let info = DefaultIdentity
            .get_plugin_info(&ctx, Default::default())
            .await
            .unwrap();
        assert_eq!(info.name, "x.y");
    }
}
