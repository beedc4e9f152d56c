//! The CSI method table, derived from the compiled descriptor: per RPC its
//! service, Rust names, message types, streaming, the capability that gates
//! it, the request fields it locks and its secret fields. Emitted as data
//! (`Method`, `Service`, `MethodInfo`), as an `RpcRequest` impl per request
//! message, and as the `for_each_method!` callback macro.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use heck::{ToShoutySnakeCase, ToSnakeCase, ToUpperCamelCase};
use prost_reflect::{
    Cardinality, DescriptorPool, EnumDescriptor, ExtensionDescriptor, FieldDescriptor, Kind,
    MessageDescriptor, MethodDescriptor, ServiceDescriptor, Value,
};

const PACKAGE: &str = "csi.v1";

/// Verbs of RPCs that only read: they take no locks.
const READ_VERBS: &[&str] = &["Get", "List", "Validate", "Probe"];

/// Request fields that name a resource, and the lock kind they take.
/// Ids are found at any depth (a content source's id locks the source);
/// names and node paths only at the top level.
const ID_FIELDS: &[(&str, &str)] = &[
    ("volume_id", "Volume"),
    ("source_volume_id", "Volume"),
    ("source_volume_ids", "Volume"),
    ("snapshot_id", "Snapshot"),
    ("snapshot_ids", "Snapshot"),
    ("group_snapshot_id", "GroupSnapshot"),
];
const PATH_FIELDS: &[&str] = &["staging_target_path", "target_path"];

struct Lock {
    kind: String,
    /// Dotted path for docs, e.g. `volume_content_source.snapshot.snapshot_id`.
    field: String,
    /// Statements pushing the key(s) into `keys`.
    code: String,
}

struct Requirement {
    /// `Requirement::Controller(...)` as a Rust expression.
    expr: String,
    /// E.g. `controller capability CREATE_DELETE_VOLUME`.
    doc: String,
}

struct Rpc {
    name: String,
    rust: String,
    request: MessageDescriptor,
    response: MessageDescriptor,
    streaming: bool,
    alpha: bool,
    requirement: Option<Requirement>,
    locks: Vec<Lock>,
    secrets: Vec<String>,
    /// The field the call concerns, for tracing.
    volume_field: Option<String>,
}

struct Svc {
    name: String,
    alpha: bool,
    rpcs: Vec<Rpc>,
}

/// Generates `csi.v1.methods.rs` (data and impls) and `csi.v1.for_each_method.rs` (macro).
pub fn generate(pool: &DescriptorPool) -> (String, String) {
    let secret_ext = pool
        .get_extension_by_name("csi.v1.csi_secret")
        .expect("csi_secret extension");
    let alpha_method = pool
        .get_extension_by_name("csi.v1.alpha_method")
        .expect("alpha_method extension");
    let alpha_service = pool
        .get_extension_by_name("csi.v1.alpha_service")
        .expect("alpha_service extension");

    let services: Vec<Svc> = pool
        .services()
        .filter(|s| s.package_name() == PACKAGE)
        .map(|s| service(pool, &s, &secret_ext, &alpha_method, &alpha_service))
        .collect();

    let mut names = BTreeSet::new();
    let mut requests = BTreeSet::new();
    for rpc in services.iter().flat_map(|s| &s.rpcs) {
        assert!(names.insert(rpc.name.clone()), "RPC {} twice", rpc.name);
        assert!(
            requests.insert(rpc.request.full_name().to_owned()),
            "{} is the request of two RPCs; the table keys methods by request type",
            rpc.request.full_name()
        );
    }
    (data(&services), callback_macro(&services))
}

fn flag(opts: &prost_reflect::DynamicMessage, ext: &ExtensionDescriptor) -> bool {
    opts.has_extension(ext) && matches!(opts.get_extension(ext).as_ref(), Value::Bool(true))
}

fn service(
    pool: &DescriptorPool,
    s: &ServiceDescriptor,
    secret_ext: &ExtensionDescriptor,
    alpha_method: &ExtensionDescriptor,
    alpha_service: &ExtensionDescriptor,
) -> Svc {
    let rpcs = s
        .methods()
        .map(|m| rpc(pool, s, &m, secret_ext, alpha_method))
        .collect();
    Svc {
        name: s.name().to_owned(),
        alpha: flag(&s.options(), alpha_service),
        rpcs,
    }
}

fn rpc(
    pool: &DescriptorPool,
    s: &ServiceDescriptor,
    m: &MethodDescriptor,
    secret_ext: &ExtensionDescriptor,
    alpha_method: &ExtensionDescriptor,
) -> Rpc {
    assert!(
        !m.is_client_streaming(),
        "{}: client streaming is not supported",
        m.full_name()
    );
    let request = m.input();
    let response = m.output();
    for msg in [&request, &response] {
        assert_eq!(
            msg.package_name(),
            PACKAGE,
            "{}: messages outside {PACKAGE}",
            m.full_name()
        );
        assert!(
            msg.parent_message().is_none(),
            "{}: nested request/response messages are not supported",
            m.full_name()
        );
    }
    let words = method_words(s.name(), m.name());
    let read_only = READ_VERBS.contains(&words[0].as_str());
    let locks = if read_only {
        Vec::new()
    } else {
        locks(m, &request, &response)
    };
    let secrets = request
        .fields()
        .filter(|f| flag(&f.options(), secret_ext))
        .map(|f| f.name().to_owned())
        .collect();
    let volume_field = ["volume_id", "source_volume_id"]
        .into_iter()
        .find(|n| {
            request
                .get_field_by_name(n)
                .is_some_and(|f| is_string(&f) && f.cardinality() != Cardinality::Repeated)
        })
        .map(str::to_owned);
    Rpc {
        name: m.name().to_owned(),
        rust: m.name().to_snake_case(),
        request,
        response,
        streaming: m.is_server_streaming(),
        alpha: flag(&m.options(), alpha_method),
        requirement: requirement(pool, s, m, &words),
        locks,
        secrets,
        volume_field,
    }
}

/// `Controller`, `ControllerPublishVolume` → `[Publish, Volume]`: the RPC
/// name without its service prefix, split into words.
fn method_words(service: &str, method: &str) -> Vec<String> {
    let rest = method
        .strip_prefix(service)
        .filter(|r| r.starts_with(|c: char| c.is_ascii_uppercase()))
        .unwrap_or(method);
    rest.to_snake_case()
        .split('_')
        .map(|w| w.to_upper_camel_case())
        .collect()
}

/// The capability that gates an RPC. A service with an RPC capability enum
/// (`<Service>ServiceCapability.RPC.Type`) is gated per RPC: a value
/// `VERB_VERB_NOUN…` gates the RPC whose verb is one of the verbs and whose
/// remaining words are the nouns (CREATE_DELETE_VOLUME gates CreateVolume
/// and DeleteVolume). A service without one is gated as a whole by the plugin
/// capability `<SERVICE>_SERVICE`, if there is one.
fn requirement(
    pool: &DescriptorPool,
    s: &ServiceDescriptor,
    m: &MethodDescriptor,
    words: &[String],
) -> Option<Requirement> {
    let rpc_enum =
        pool.get_enum_by_name(&format!("{PACKAGE}.{}ServiceCapability.RPC.Type", s.name()));
    if let Some(e) = rpc_enum {
        let wanted: Vec<String> = words.iter().map(|w| w.to_uppercase()).collect();
        let (verb, nouns) = wanted.split_first().expect("a method name has a word");
        let matches: Vec<_> = e
            .values()
            .filter(|v| v.number() != 0)
            .filter(|v| {
                let parts: Vec<&str> = v.name().split('_').collect();
                (1..parts.len())
                    .any(|k| parts[..k].contains(&verb.as_str()) && parts[k..] == *nouns)
            })
            .collect();
        assert!(
            matches.len() <= 1,
            "{}: ambiguous capability, both {} and {} match",
            m.full_name(),
            matches[0].name(),
            matches[1].name()
        );
        return matches.first().map(|v| Requirement {
            expr: format!(
                "Requirement::{}({}::{})",
                s.name(),
                rust_enum_path(&e),
                v.name().to_upper_camel_case()
            ),
            doc: format!(
                "the {} capability `{}`",
                human(&format!("{}Rpc", s.name())),
                v.name()
            ),
        });
    }
    let plugin = pool
        .get_enum_by_name(&format!("{PACKAGE}.PluginCapability.Service.Type"))
        .expect("PluginCapability.Service.Type");
    let wanted = format!("{}_SERVICE", s.name().to_shouty_snake_case());
    plugin.get_value_by_name(&wanted).map(|v| Requirement {
        expr: format!(
            "Requirement::Plugin({}::{})",
            rust_enum_path(&plugin),
            v.name().to_upper_camel_case()
        ),
        doc: format!("the plugin capability `{}`", v.name()),
    })
}

/// `GroupControllerRpc` → `group controller RPC`.
fn human(name: &str) -> String {
    name.to_snake_case().replace('_', " ").replace("rpc", "RPC")
}

fn is_string(f: &FieldDescriptor) -> bool {
    matches!(f.kind(), Kind::String)
}

fn locks(
    m: &MethodDescriptor,
    request: &MessageDescriptor,
    response: &MessageDescriptor,
) -> Vec<Lock> {
    let mut out = Vec::new();
    for f in request.fields() {
        if f.name() == "name" && is_string(&f) {
            // What the name names: the response's one message field
            // (`volume`, `snapshot`, `group_snapshot`).
            let created: Vec<_> = response
                .fields()
                .filter(|rf| matches!(rf.kind(), Kind::Message(_)))
                .collect();
            assert_eq!(
                created.len(),
                1,
                "{}: cannot derive what `name` names from {}",
                m.full_name(),
                response.full_name()
            );
            let kind = format!("{}Name", created[0].name().to_upper_camel_case());
            out.push(Lock {
                code: format!("push(&mut keys, KeyKind::{kind}, &self.name);"),
                kind,
                field: "name".into(),
            });
        } else if PATH_FIELDS.contains(&f.name()) && is_string(&f) {
            let ident = rust_ident(f.name());
            out.push(Lock {
                kind: "Path".into(),
                field: f.name().into(),
                code: format!("push(&mut keys, KeyKind::Path, &self.{ident});"),
            });
        }
    }
    id_locks(request, "self", "", &mut Vec::new(), &mut out);
    out
}

/// Id fields of `msg` (bound to `var`) and of its singular message fields, recursively.
fn id_locks(
    msg: &MessageDescriptor,
    var: &str,
    prefix: &str,
    seen: &mut Vec<String>,
    out: &mut Vec<Lock>,
) {
    if seen.iter().any(|s| s == msg.full_name()) {
        return;
    }
    seen.push(msg.full_name().to_owned());
    for f in msg.fields() {
        let field = format!("{prefix}{}", f.name());
        let ident = rust_ident(f.name());
        if let Some((_, kind)) = ID_FIELDS.iter().find(|(n, _)| *n == f.name()) {
            assert!(is_string(&f), "{}: id field is not a string", f.full_name());
            let code = if f.cardinality() == Cardinality::Repeated {
                format!("for v in &{var}.{ident} {{ push(&mut keys, KeyKind::{kind}, v); }}")
            } else {
                format!("push(&mut keys, KeyKind::{kind}, &{var}.{ident});")
            };
            out.push(Lock {
                kind: (*kind).into(),
                field,
                code,
            });
            continue;
        }
        let Kind::Message(sub) = f.kind() else {
            continue;
        };
        if f.cardinality() == Cardinality::Repeated || f.is_map() || sub.package_name() != PACKAGE {
            continue;
        }
        let inner_var = format!("x{}", seen.len());
        let mut inner = Vec::new();
        id_locks(&sub, &inner_var, &format!("{field}."), seen, &mut inner);
        if inner.is_empty() {
            continue;
        }
        let binding = match f.containing_oneof() {
            Some(oneof) => format!(
                "Some({}::{}::{}({inner_var})) = &{var}.{}",
                module_path(msg),
                oneof.name().to_upper_camel_case(),
                f.name().to_upper_camel_case(),
                rust_ident(oneof.name())
            ),
            None => format!("Some({inner_var}) = &{var}.{ident}"),
        };
        for lock in inner {
            // One let-chain for a nested field, not nested `if let`s.
            let code = match lock.code.strip_prefix("if ") {
                Some(chain) => format!("if let {binding} && {chain}"),
                None => format!("if let {binding} {{ {} }}", lock.code),
            };
            out.push(Lock { code, ..lock });
        }
    }
    seen.pop();
}

fn data(services: &[Svc]) -> String {
    let rpcs: Vec<&Rpc> = services.iter().flat_map(|s| &s.rpcs).collect();
    let mut out = String::new();
    out.push_str("// Generated by build.rs from csi.proto: do not edit.\n\n");

    // Service.
    out.push_str(
        "/// A CSI gRPC service.\n\
         #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]\n\
         pub enum Service {\n",
    );
    for s in services {
        writeln!(
            out,
            "    /// `{PACKAGE}.{}`{}.",
            s.name,
            alpha_note(s.alpha)
        )
        .unwrap();
        writeln!(out, "    {},", s.name).unwrap();
    }
    out.push_str("}\n\nimpl Service {\n    /// Every service, in proto order.\n    pub const ALL: &'static [Service] = &[");
    for s in services {
        write!(out, "Service::{}, ", s.name).unwrap();
    }
    out.push_str("];\n\n    /// The short name, e.g. `Controller`.\n    pub const fn name(self) -> &'static str {\n        match self {\n");
    for s in services {
        writeln!(out, "            Self::{0} => {0:?},", s.name).unwrap();
    }
    out.push_str("        }\n    }\n\n    /// The full name, e.g. `csi.v1.Controller`.\n    pub const fn full_name(self) -> &'static str {\n        match self {\n");
    for s in services {
        writeln!(
            out,
            "            Self::{} => \"{PACKAGE}.{}\",",
            s.name, s.name
        )
        .unwrap();
    }
    out.push_str("        }\n    }\n\n    /// Whether the service is alpha in the spec.\n    pub const fn alpha(self) -> bool {\n        match self {\n");
    for s in services {
        writeln!(out, "            Self::{} => {},", s.name, s.alpha).unwrap();
    }
    out.push_str("        }\n    }\n\n    /// The service's RPCs, in proto order.\n    pub fn methods(self) -> impl Iterator<Item = Method> {\n        Method::ALL.iter().copied().filter(move |m| m.service() == self)\n    }\n}\n\n");

    // Method.
    out.push_str(
        "/// One CSI RPC.\n\
         #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]\n\
         pub enum Method {\n",
    );
    for r in &rpcs {
        writeln!(out, "    #[doc = {:?}]", method_doc(services, r)).unwrap();
        writeln!(out, "    {},", r.name).unwrap();
    }
    out.push_str("}\n\nimpl Method {\n    /// Every RPC, in proto order.\n    pub const ALL: &'static [Method] = &[");
    for r in &rpcs {
        write!(out, "Method::{}, ", r.name).unwrap();
    }
    out.push_str("];\n\n    /// Everything the table knows about this RPC.\n    pub const fn info(self) -> &'static MethodInfo {\n        &METHODS[self as usize]\n    }\n}\n\n");

    // The table.
    writeln!(
        out,
        "/// The method table, indexed by `Method as usize`.\npub static METHODS: [MethodInfo; {}] = [",
        rpcs.len()
    )
    .unwrap();
    for (s, r) in services
        .iter()
        .flat_map(|s| s.rpcs.iter().map(move |r| (s, r)))
    {
        let requirement = r
            .requirement
            .as_ref()
            .map_or("None".to_owned(), |q| format!("Some({})", q.expr));
        let locks: String = r
            .locks
            .iter()
            .map(|l| {
                format!(
                    "LockField {{ kind: KeyKind::{}, field: {:?} }}, ",
                    l.kind, l.field
                )
            })
            .collect();
        let secrets: String = r.secrets.iter().map(|f| format!("{f:?}, ")).collect();
        writeln!(
            out,
            "    MethodInfo {{ method: Method::{name}, name: {name:?}, service: Service::{svc}, \
             path: \"/{PACKAGE}.{svc}/{name}\", rust_name: {rust:?}, request: {req:?}, response: {resp:?}, \
             streaming: {streaming}, alpha: {alpha}, requirement: {requirement}, locks: &[{locks}], \
             secret_fields: &[{secrets}] }},",
            name = r.name,
            svc = s.name,
            rust = r.rust,
            req = r.request.full_name(),
            resp = r.response.full_name(),
            streaming = if r.streaming { "Streaming::Server" } else { "Streaming::Unary" },
            alpha = r.alpha || s.alpha,
        )
        .unwrap();
    }
    out.push_str("];\n\n");

    // RpcRequest impls.
    for r in &rpcs {
        let req = r.request.name();
        let resp = r.response.name();
        writeln!(out, "impl RpcRequest for super::v1::{req} {{").unwrap();
        writeln!(out, "    type Response = super::v1::{resp};").unwrap();
        writeln!(out, "    const METHOD: Method = Method::{};", r.name).unwrap();
        if !r.locks.is_empty() {
            out.push_str("    fn lock_keys(&self) -> Vec<LockKey> {\n        #[allow(unused_imports)]\n        use super::v1::*;\n        let mut keys = Vec::new();\n");
            for l in &r.locks {
                writeln!(out, "        {}", l.code).unwrap();
            }
            out.push_str("        keys\n    }\n");
        }
        if let Some(f) = &r.volume_field {
            writeln!(
                out,
                "    fn volume_id(&self) -> Option<&str> {{\n        Some(self.{f}.as_str()).filter(|v| !v.is_empty())\n    }}"
            )
            .unwrap();
        }
        if let Some(f) = r
            .secrets
            .iter()
            .find(|f| r.request.get_field_by_name(f).is_some_and(|fd| fd.is_map()))
        {
            writeln!(
                out,
                "    fn secrets(&self) -> Option<&::std::collections::HashMap<String, String>> {{\n        Some(&self.{})\n    }}",
                rust_ident(f)
            )
            .unwrap();
        }
        out.push_str("}\n\n");
    }
    out
}

fn alpha_note(alpha: bool) -> &'static str {
    if alpha { " (alpha)" } else { "" }
}

fn method_doc(services: &[Svc], r: &Rpc) -> String {
    let svc = services
        .iter()
        .find(|s| s.rpcs.iter().any(|x| x.name == r.name))
        .expect("rpc in a service");
    let mut doc = format!(
        "`{}` (`/{PACKAGE}.{}/{}`, {} → {}{}){}.",
        r.name,
        svc.name,
        r.name,
        r.request.name(),
        if r.streaming { "stream of " } else { "" },
        r.response.name(),
        alpha_note(r.alpha || svc.alpha),
    );
    match &r.requirement {
        Some(q) => write!(doc, " Served only when {} is declared.", q.doc).unwrap(),
        None => doc.push_str(" Served whenever its service is."),
    }
    if r.locks.is_empty() {
        doc.push_str(" Takes no locks.");
    } else {
        let fields: Vec<String> = r.locks.iter().map(|l| format!("`{}`", l.field)).collect();
        write!(doc, " Locks {}.", fields.join(", ")).unwrap();
    }
    doc
}

fn callback_macro(services: &[Svc]) -> String {
    let mut body = String::new();
    for s in services {
        let snake = s.name.to_snake_case();
        writeln!(body, "            {} {{", s.name).unwrap();
        for (label, streaming) in [("unary", false), ("server_streaming", true)] {
            writeln!(body, "                {label}: [").unwrap();
            for r in s.rpcs.iter().filter(|r| r.streaming == streaming) {
                let stream = if streaming {
                    format!(" stream: {}Stream,", r.name)
                } else {
                    String::new()
                };
                writeln!(
                    body,
                    "                    {} {{ rust: {}, request: {}, response: {}, doc: {:?},{stream} }}",
                    r.name,
                    r.rust,
                    r.request.name(),
                    r.response.name(),
                    method_doc(services, r),
                )
                .unwrap();
            }
            writeln!(body, "                ],").unwrap();
        }
        writeln!(
            body,
            "                doc: {doc:?},\n                rust: {snake}, client_mod: {snake}_client, client: {name}Client,\n                server_mod: {snake}_server, server_trait: {name}, server: {name}Server,\n            }}",
            name = s.name,
            doc = format!(
                "The `{PACKAGE}.{}` service{}: {}.",
                s.name,
                alpha_note(s.alpha),
                s.rpcs.iter().map(|r| r.name.as_str()).collect::<Vec<_>>().join(", ")
            ),
        )
        .unwrap();
    }
    format!(
        "// Generated by build.rs from csi.proto: do not edit.\n\n\
/// Calls `callback!` with the whole CSI method table, grouped by service,
/// so code that must name every RPC (enums, dispatch, trait methods, client
/// methods) is generated from csi.proto instead of written by hand.
///
/// `for_each_method!(callback)` or `for_each_method!(callback, extra tokens)`
/// expands to:
///
/// ```text
/// callback! {{
///     (extra tokens)
///     Identity {{
///         unary: [
///             GetPluginInfo {{ rust: get_plugin_info, request: GetPluginInfoRequest,
///                              response: GetPluginInfoResponse, doc: \"...\", }}
///             ...
///         ],
///         server_streaming: [
///             // as unary, plus `stream: <tonic's associated stream type>,` after `doc`
///         ],
///         doc: \"...\",
///         rust: identity, client_mod: identity_client, client: IdentityClient,
///         server_mod: identity_server, server_trait: Identity, server: IdentityServer,
///     }}
///     Controller {{ ... }}
///     ...
/// }}
/// ```
///
/// A callback matches only the keys it uses and skips the rest of a method
/// or a service with `$($key:ident: $value:tt,)*`: the keys are ordered
/// from the most used (the lists, `rust`, `request`, `response`, `doc`) to
/// the least (the tonic server names).
///
/// Module, message and stream names are identifiers in `csi_proto::v1`.
///
/// ```
/// macro_rules! services {{
///     (() $($svc:ident {{ $($body:tt)* }})*) => {{ [$(stringify!($svc)),*] }};
/// }}
/// assert_eq!(csi_proto::for_each_method!(services).len(), csi_proto::methods::Service::ALL.len());
/// ```
#[macro_export]
macro_rules! for_each_method {{
    ($($callback:ident)::+ $(, $($args:tt)*)?) => {{
        $($callback)::+! {{
            ($($($args)*)?)
{body}        }}
    }};
}}
"
    )
}

fn module_path(msg: &MessageDescriptor) -> String {
    let mut parts = vec![msg.name().to_snake_case()];
    let mut parent = msg.parent_message();
    while let Some(p) = parent {
        parts.push(p.name().to_snake_case());
        parent = p.parent_message();
    }
    parts.reverse();
    parts.join("::")
}

fn rust_enum_path(e: &EnumDescriptor) -> String {
    let mut parts = vec![e.name().to_owned()];
    let mut parent = e.parent_message();
    while let Some(p) = parent {
        parts.push(p.name().to_snake_case());
        parent = p.parent_message();
    }
    parts.reverse();
    format!("super::v1::{}", parts.join("::"))
}

fn rust_ident(name: &str) -> String {
    crate::rust_ident(name)
}
