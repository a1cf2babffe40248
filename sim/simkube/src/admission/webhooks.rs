//! Dynamic admission control: `MutatingWebhookConfiguration` and
//! `ValidatingWebhookConfiguration` (admissionregistration.k8s.io/v1) defaulted and validated as
//! kube-apiserver does, matched against requests (rules, scope, namespace and object selectors)
//! and called over HTTPS with an `admission.k8s.io/v1` (or v1beta1) `AdmissionReview`, with
//! kube-apiserver's failure policies, patches, warnings and error messages.
//!
//! Where simkube differs (see FIDELITY.md): `matchPolicy: Equivalent` is treated as `Exact`;
//! `matchConditions` (CEL) are refused when a configuration is written; a service reference is
//! dialled at a ready endpoint of its EndpointSlices (kube-apiserver dials the ClusterIP unless
//! `--enable-aggregator-routing`); without a `caBundle` no server is trusted (kube-apiserver falls
//! back to the system roots).

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use serde_json::{Map, Value, json};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::auth::UserInfo;
use crate::error::{ApiError, Cause};
use crate::http::ServerState;
use crate::selectors::LabelSelector;
use crate::store::TypeKey;

/// The group of the configuration kinds.
pub const GROUP: &str = "admissionregistration.k8s.io";
/// Plural of `MutatingWebhookConfiguration`.
pub const MUTATING: &str = "mutatingwebhookconfigurations";
/// Plural of `ValidatingWebhookConfiguration`.
pub const VALIDATING: &str = "validatingwebhookconfigurations";
/// The largest AdmissionReview answer read (kube-apiserver's client reads about as much).
const MAX_RESPONSE_BYTES: usize = 3 * 1024 * 1024;

/// A ready endpoint of a webhook's Service, as its EndpointSlice names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookEndpoint {
    /// The endpoint's address (a pod IP).
    pub ip: std::net::IpAddr,
    /// The target port.
    pub port: u16,
    /// The node the endpoint runs on, when the slice says.
    pub node_name: Option<String>,
}

/// Opens the TCP connection to a Service's endpoint. Simulated clusters install one that
/// connects from inside the endpoint's node, because pod addresses are not routed to the API
/// server's namespace; TLS and HTTP then run over it as usual.
pub type WebhookDialer = Arc<
    dyn Fn(WebhookEndpoint) -> futures::future::BoxFuture<'static, io::Result<TcpStream>>
        + Send
        + Sync,
>;

/// What a write does, as admission names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// Create, or server-side apply of a missing object.
    Create,
    /// Update, patch, or apply of an existing object.
    Update,
    /// Delete.
    Delete,
}

impl Operation {
    /// The upper-case name in rules and AdmissionReviews.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Create => "CREATE",
            Self::Update => "UPDATE",
            Self::Delete => "DELETE",
        }
    }
}

/// The request as admission sees it.
#[derive(Debug, Clone)]
pub struct Attributes {
    /// API group of the resource.
    pub group: String,
    /// The version the request came in.
    pub version: String,
    /// Plural resource.
    pub resource: String,
    /// Subresource, empty for the main resource.
    pub subresource: String,
    /// Kind of the object (the parent kind for `status`).
    pub kind: String,
    /// Whether the resource is namespaced.
    pub namespaced: bool,
    /// Namespace, empty for cluster-scoped objects.
    pub namespace: String,
    /// Object name (empty for a create with `generateName` before the name is made).
    pub name: String,
    /// The operation.
    pub operation: Operation,
    /// Whether this is a `dryRun=All` request.
    pub dry_run: bool,
    /// The caller.
    pub user: UserInfo,
    /// The `*Options` object of the request (CreateOptions, UpdateOptions, PatchOptions,
    /// DeleteOptions).
    pub options: Value,
}

/// One webhook of a configuration, with the v1 defaults applied.
#[derive(Debug, Clone)]
pub struct Hook {
    /// Its name (unique in its configuration).
    pub name: String,
    /// The configuration it came from.
    pub configuration: String,
    /// Mutating or validating.
    pub mutating: bool,
    webhook: Value,
}

impl Hook {
    fn timeout(&self) -> Duration {
        let secs = self.webhook["timeoutSeconds"]
            .as_u64()
            .unwrap_or(10)
            .clamp(1, 30);
        Duration::from_secs(secs)
    }

    fn fails_open(&self) -> bool {
        self.webhook["failurePolicy"].as_str() == Some("Ignore")
    }

    /// The AdmissionReview version to send: the first listed one this server speaks (v1 and
    /// v1beta1 have the same shape).
    fn review_api_version(&self) -> &'static str {
        let listed = self.webhook["admissionReviewVersions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .find(|v| matches!(*v, "v1" | "v1beta1"));
        match listed {
            Some("v1beta1") => "admission.k8s.io/v1beta1",
            _ => "admission.k8s.io/v1",
        }
    }

    fn reinvoke_if_needed(&self) -> bool {
        self.webhook["reinvocationPolicy"].as_str() == Some("IfNeeded")
    }
}

// ---------------------------------------------------------------------------------------------
// Configurations

/// Applies the v1 defaults to a configuration being written (failurePolicy Fail, matchPolicy
/// Equivalent, empty selectors, timeoutSeconds 10, reinvocationPolicy Never, scope `*`, service
/// port 443) and validates it, answering 422 with kube-apiserver's causes.
pub fn default_and_validate(kind: &str, obj: &mut Value) -> Result<(), ApiError> {
    let mutating = kind == "MutatingWebhookConfiguration";
    if let Some(hooks) = obj["webhooks"].as_array_mut() {
        for hook in hooks.iter_mut().filter(|h| h.is_object()) {
            default_hook(hook, mutating);
        }
    }
    let causes = validate(obj, mutating);
    if causes.is_empty() {
        return Ok(());
    }
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    Err(ApiError::invalid(GROUP, kind, name, &causes))
}

fn default_hook(hook: &mut Value, mutating: bool) {
    let fill = |hook: &mut Value, field: &str, value: Value| {
        if hook[field].is_null() {
            hook[field] = value;
        }
    };
    fill(hook, "failurePolicy", json!("Fail"));
    fill(hook, "matchPolicy", json!("Equivalent"));
    fill(hook, "namespaceSelector", json!({}));
    fill(hook, "objectSelector", json!({}));
    fill(hook, "timeoutSeconds", json!(10));
    if mutating {
        fill(hook, "reinvocationPolicy", json!("Never"));
    }
    if let Some(rules) = hook["rules"].as_array_mut() {
        for rule in rules.iter_mut().filter(|r| r.is_object()) {
            if rule["scope"].is_null() {
                rule["scope"] = json!("*");
            }
        }
    }
    let service = &mut hook["clientConfig"]["service"];
    if service.is_object() && service["port"].is_null() {
        service["port"] = json!(443);
    }
}

fn cause(reason: &str, field: String, message: String) -> Cause {
    Cause {
        reason: reason.into(),
        message,
        field,
    }
}

fn required(field: String, detail: &str) -> Cause {
    let message = if detail.is_empty() {
        "Required value".to_owned()
    } else {
        format!("Required value: {detail}")
    };
    cause("FieldValueRequired", field, message)
}

fn unsupported(field: String, value: &Value, supported: &[&str]) -> Cause {
    let list: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
    cause(
        "FieldValueNotSupported",
        field,
        format!(
            "Unsupported value: {value}: supported values: {}",
            list.join(", ")
        ),
    )
}

/// `value` is already formatted as Go prints it (`"quoted"` strings, bare numbers).
fn invalid(field: String, value: &str, detail: &str) -> Cause {
    cause(
        "FieldValueInvalid",
        field,
        format!("Invalid value: {value}: {detail}"),
    )
}

/// Go's `%#v` of a string slice, as apimachinery prints a list value.
fn go_string_slice(values: &[Value]) -> String {
    let items: Vec<String> = values.iter().map(|v| v.to_string()).collect();
    format!("[]string{{{}}}", items.join(", "))
}

fn validate(obj: &Value, mutating: bool) -> Vec<Cause> {
    let mut causes = Vec::new();
    let empty = Vec::new();
    let hooks = obj["webhooks"].as_array().unwrap_or(&empty);
    let mut seen = std::collections::HashSet::new();
    // Causes in the order kube-apiserver's validation finds them.
    for (i, hook) in hooks.iter().enumerate() {
        let at = |f: &str| format!("webhooks[{i}].{f}");
        match hook["name"].as_str().filter(|n| !n.is_empty()) {
            None => causes.push(required(at("name"), "")),
            Some(name) => {
                if !seen.insert(name.to_owned()) {
                    causes.push(cause(
                        "FieldValueDuplicate",
                        at("name"),
                        format!("Duplicate value: {name:?}"),
                    ));
                }
                if name.split('.').filter(|s| !s.is_empty()).count() < 3 {
                    causes.push(invalid(
                        at("name"),
                        &json!(name).to_string(),
                        "should be a domain with at least three segments separated by dots",
                    ));
                }
            }
        }
        for (j, rule) in hook["rules"]
            .as_array()
            .unwrap_or(&empty)
            .iter()
            .enumerate()
        {
            validate_rule(rule, &format!("webhooks[{i}].rules[{j}]"), &mut causes);
        }
        let policy = &hook["failurePolicy"];
        if !matches!(policy.as_str(), Some("Fail" | "Ignore")) {
            causes.push(unsupported(
                at("failurePolicy"),
                policy,
                &["Fail", "Ignore"],
            ));
        }
        let policy = &hook["matchPolicy"];
        if !matches!(policy.as_str(), Some("Exact" | "Equivalent")) {
            causes.push(unsupported(
                at("matchPolicy"),
                policy,
                &["Equivalent", "Exact"],
            ));
        }
        let effects = &hook["sideEffects"];
        match effects.as_str() {
            None => causes.push(required(
                at("sideEffects"),
                "must specify one of None, NoneOnDryRun",
            )),
            Some("None" | "NoneOnDryRun") => {}
            Some(_) => causes.push(unsupported(
                at("sideEffects"),
                effects,
                &["None", "NoneOnDryRun"],
            )),
        }
        if let Some(t) = hook["timeoutSeconds"].as_i64()
            && !(1..=30).contains(&t)
        {
            causes.push(invalid(
                at("timeoutSeconds"),
                &t.to_string(),
                "the timeout value must be between 1 and 30 seconds",
            ));
        }
        if mutating {
            let policy = &hook["reinvocationPolicy"];
            if !matches!(policy.as_str(), Some("Never" | "IfNeeded")) {
                causes.push(unsupported(
                    at("reinvocationPolicy"),
                    policy,
                    &["IfNeeded", "Never"],
                ));
            }
        }
        for selector in ["namespaceSelector", "objectSelector"] {
            if let Err(e) = LabelSelector::from_object(&hook[selector]) {
                causes.push(invalid(
                    at(selector),
                    &hook[selector].to_string(),
                    &e.message,
                ));
            }
        }
        validate_client_config(&hook["clientConfig"], &at("clientConfig"), &mut causes);
        if hook["matchConditions"]
            .as_array()
            .is_some_and(|m| !m.is_empty())
        {
            causes.push(cause(
                "FieldValueForbidden",
                at("matchConditions"),
                "Forbidden: CEL match conditions are not supported by this server (simkube); \
                 remove them and match with rules, namespaceSelector and objectSelector"
                    .to_owned(),
            ));
        }
        match hook["admissionReviewVersions"].as_array() {
            Some(v) if !v.is_empty() => {
                if !v
                    .iter()
                    .any(|x| matches!(x.as_str(), Some("v1" | "v1beta1")))
                {
                    causes.push(invalid(
                        at("admissionReviewVersions"),
                        &go_string_slice(v),
                        "must include at least one of v1, v1beta1",
                    ));
                }
            }
            _ => causes.push(required(
                at("admissionReviewVersions"),
                "must specify one of v1, v1beta1",
            )),
        }
    }
    causes
}

fn validate_client_config(cc: &Value, at: &str, causes: &mut Vec<Cause>) {
    let url = cc["url"].as_str();
    let service = cc["service"].is_object().then_some(&cc["service"]);
    match (url, service) {
        (Some(_), Some(_)) | (None, None) => causes.push(required(
            at.to_owned(),
            "exactly one of url or service is required",
        )),
        (Some(url), None) => {
            let field = format!("{at}.url");
            match url.parse::<http::Uri>() {
                Ok(uri) if uri.scheme_str() != Some("https") => causes.push(invalid(
                    field,
                    &json!(uri.scheme_str().unwrap_or_default()).to_string(),
                    "'https' is the only allowed URL scheme",
                )),
                Ok(uri) if uri.host().is_none_or(str::is_empty) => {
                    causes.push(invalid(field, "\"\"", "host must be specified"));
                }
                Ok(_) => {}
                Err(e) => causes.push(invalid(field, &json!(url).to_string(), &e.to_string())),
            }
        }
        (None, Some(svc)) => {
            for f in ["namespace", "name"] {
                if svc[f].as_str().is_none_or(str::is_empty) {
                    let detail = format!("service {f} is required");
                    causes.push(required(format!("{at}.service.{f}"), &detail));
                }
            }
            if let Some(path) = svc["path"].as_str()
                && !path.is_empty()
                && !path.starts_with('/')
            {
                causes.push(invalid(
                    format!("{at}.service.path"),
                    &json!(path).to_string(),
                    "must start with a '/'",
                ));
            }
            if let Some(port) = svc["port"].as_i64()
                && !(1..=65535).contains(&port)
            {
                causes.push(invalid(
                    format!("{at}.service.port"),
                    &port.to_string(),
                    "port is not valid: must be between 1 and 65535, inclusive",
                ));
            }
        }
    }
}

fn validate_rule(rule: &Value, at: &str, causes: &mut Vec<Cause>) {
    for list in ["operations", "apiGroups", "apiVersions", "resources"] {
        if rule[list].as_array().is_none_or(Vec::is_empty) {
            causes.push(required(format!("{at}.{list}"), ""));
        }
    }
    for (k, op) in rule["operations"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        if !matches!(
            op.as_str(),
            Some("*" | "CREATE" | "UPDATE" | "DELETE" | "CONNECT")
        ) {
            causes.push(unsupported(
                format!("{at}.operations[{k}]"),
                op,
                &["*", "CONNECT", "CREATE", "DELETE", "UPDATE"],
            ));
        }
    }
    let scope = &rule["scope"];
    if !matches!(scope.as_str(), Some("*" | "Cluster" | "Namespaced")) {
        causes.push(unsupported(
            format!("{at}.scope"),
            scope,
            &["*", "Cluster", "Namespaced"],
        ));
    }
}

/// The webhooks of every stored configuration of one kind, configurations sorted by name and
/// webhooks in their order, as kube-apiserver calls them.
pub fn hooks(state: &ServerState, mutating: bool) -> Vec<Hook> {
    let plural = if mutating { MUTATING } else { VALIDATING };
    let mut configs = state.store.all(&TypeKey::new(GROUP, plural));
    configs.sort_by(|a, b| {
        a["metadata"]["name"]
            .as_str()
            .cmp(&b["metadata"]["name"].as_str())
    });
    let mut out = Vec::new();
    for config in configs {
        let configuration = config["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        for webhook in config["webhooks"].as_array().into_iter().flatten() {
            out.push(Hook {
                name: webhook["name"].as_str().unwrap_or_default().to_owned(),
                configuration: configuration.clone(),
                mutating,
                webhook: webhook.clone(),
            });
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Matching

fn listed(list: &Value, want: &str) -> bool {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .any(|v| v == "*" || v == want)
}

/// Whether one rule covers the request: operation, group, version, resource/subresource and
/// scope, as the rule matcher of kube-apiserver's webhook plugin decides it.
fn rule_matches(rule: &Value, attrs: &Attributes) -> bool {
    let scope_ok = match rule["scope"].as_str().unwrap_or("*") {
        "Cluster" => !attrs.namespaced,
        "Namespaced" => attrs.namespaced,
        _ => true,
    };
    let resource_ok = rule["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .any(|r| {
            let (res, sub) = r.split_once('/').unwrap_or((r, ""));
            (res == "*" || res == attrs.resource) && (sub == "*" || sub == attrs.subresource)
        });
    scope_ok
        && resource_ok
        && listed(&rule["operations"], attrs.operation.as_str())
        && listed(&rule["apiGroups"], &attrs.group)
        && listed(&rule["apiVersions"], &attrs.version)
}

/// Whether any rule of `hook` covers the request (selectors are judged later).
pub fn rules_match(hook: &Hook, attrs: &Attributes) -> bool {
    hook.webhook["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|r| rule_matches(r, attrs))
}

/// Whether any rule of `hook` could cover some operation on the resource.
pub fn covers_resource(hook: &Hook, attrs: &Attributes) -> bool {
    [Operation::Create, Operation::Update, Operation::Delete]
        .into_iter()
        .any(|operation| {
            let attrs = Attributes {
                operation,
                ..attrs.clone()
            };
            rules_match(hook, &attrs)
        })
}

fn labels(obj: Option<&Value>) -> Map<String, Value> {
    obj.and_then(|o| o["metadata"]["labels"].as_object())
        .cloned()
        .unwrap_or_default()
}

fn selector_matches(selector: &Value, labels: &Map<String, Value>) -> bool {
    LabelSelector::from_object(selector).is_ok_and(|s| s.matches(labels))
}

/// Whether the hook's rules, namespaceSelector and objectSelector all admit the request.
/// `old`/`new` are the objects (either may be absent); the namespace's labels are looked up in
/// the store, except for a Namespace object, whose own labels count.
pub fn applies(
    state: &ServerState,
    hook: &Hook,
    attrs: &Attributes,
    old: Option<&Value>,
    new: Option<&Value>,
) -> bool {
    if !rules_match(hook, attrs) {
        return false;
    }
    let namespace_ok = if attrs.group.is_empty() && attrs.resource == "namespaces" {
        selector_matches(&hook.webhook["namespaceSelector"], &labels(new.or(old)))
    } else if attrs.namespaced {
        let ns = state
            .store
            .get(&TypeKey::new("", "namespaces"), "", &attrs.namespace);
        selector_matches(&hook.webhook["namespaceSelector"], &labels(ns.as_deref()))
    } else {
        true
    };
    let object = &hook.webhook["objectSelector"];
    let object_ok = selector_matches(object, &labels(new))
        || (old.is_some() && selector_matches(object, &labels(old)));
    namespace_ok && object_ok
}

// ---------------------------------------------------------------------------------------------
// Calls

/// Why a call did not produce a usable answer; becomes `failed calling webhook "NAME": ...`.
#[derive(Debug, thiserror::Error)]
enum CallError {
    #[error("failed to call webhook: {0}")]
    Call(String),
    #[error("received invalid webhook response: {0}")]
    Response(String),
}

/// A webhook's answer.
#[derive(Debug, Default)]
struct Answer {
    allowed: bool,
    status: Value,
    patch: Option<Value>,
    warnings: Vec<String>,
}

/// The outcome of running webhooks: the (possibly mutated) object and the warnings, or the
/// error with the warnings gathered before it.
#[derive(Debug)]
pub struct Outcome {
    /// The object after every patch (the input for validating webhooks).
    pub object: Option<Value>,
    /// Warnings for the `Warning` header.
    pub warnings: Vec<String>,
    /// Why the request fails, if it does.
    pub error: Option<ApiError>,
}

fn review(
    api_version: &str,
    attrs: &Attributes,
    uid: &str,
    old: Option<&Value>,
    new: Option<&Value>,
) -> Value {
    let mut request = json!({
        "uid": uid,
        "kind": {"group": attrs.group, "version": attrs.version, "kind": attrs.kind},
        "resource": {"group": attrs.group, "version": attrs.version, "resource": attrs.resource},
        "requestKind": {"group": attrs.group, "version": attrs.version, "kind": attrs.kind},
        "requestResource": {"group": attrs.group, "version": attrs.version, "resource": attrs.resource},
        "operation": attrs.operation.as_str(),
        "userInfo": user_info(&attrs.user),
        "object": new.cloned().unwrap_or(Value::Null),
        "oldObject": old.cloned().unwrap_or(Value::Null),
        "dryRun": attrs.dry_run,
        "options": attrs.options,
    });
    if !attrs.subresource.is_empty() {
        request["subResource"] = json!(attrs.subresource);
        request["requestSubResource"] = json!(attrs.subresource);
    }
    if !attrs.name.is_empty() {
        request["name"] = json!(attrs.name);
    }
    if !attrs.namespace.is_empty() {
        request["namespace"] = json!(attrs.namespace);
    }
    json!({"kind": "AdmissionReview", "apiVersion": api_version, "request": request})
}

fn user_info(user: &UserInfo) -> Value {
    let mut info = json!({"username": user.username});
    if !user.uid.is_empty() {
        info["uid"] = json!(user.uid);
    }
    if !user.groups.is_empty() {
        info["groups"] = json!(user.groups);
    }
    if !user.extra.is_empty() {
        info["extra"] = json!(user.extra);
    }
    info
}

/// Where a call goes: the address dialled, the TLS server name and the URL kube-apiserver would
/// print.
struct Target {
    addr: String,
    /// Set for a Service reference: the endpoint the dialer is given.
    endpoint: Option<WebhookEndpoint>,
    server_name: String,
    url: String,
    path_and_query: String,
}

fn target(state: &ServerState, hook: &Hook) -> Result<Target, CallError> {
    let cc = &hook.webhook["clientConfig"];
    let timeout = format!("timeout={}s", hook.timeout().as_secs());
    if let Some(url) = cc["url"].as_str() {
        let uri: http::Uri = url
            .parse()
            .map_err(|e| CallError::Call(format!("parse {url:?}: {e}")))?;
        let host = uri.host().unwrap_or_default().trim_matches(['[', ']']);
        let port = uri.port_u16().unwrap_or(443);
        let sep = if uri.query().is_some() { '&' } else { '?' };
        let path_and_query = format!(
            "{}{sep}{timeout}",
            uri.path_and_query().map_or("/", |p| p.as_str())
        );
        let addr = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        return Ok(Target {
            url: format!("https://{addr}{path_and_query}"),
            addr,
            endpoint: None,
            server_name: host.to_owned(),
            path_and_query,
        });
    }
    let svc = &cc["service"];
    let ns = svc["namespace"].as_str().unwrap_or_default();
    let name = svc["name"].as_str().unwrap_or_default();
    let port = svc["port"].as_i64().unwrap_or(443);
    let path = svc["path"]
        .as_str()
        .filter(|p| !p.is_empty())
        .unwrap_or("/");
    let path_and_query = format!("{path}?{timeout}");
    let server_name = format!("{name}.{ns}.svc");
    let endpoint = endpoint(state, ns, name, port)?;
    Ok(Target {
        url: format!("https://{server_name}:{port}{path_and_query}"),
        addr: std::net::SocketAddr::new(endpoint.ip, endpoint.port).to_string(),
        endpoint: Some(endpoint),
        server_name,
        path_and_query,
    })
}

/// A ready endpoint of the Service's EndpointSlices for its port `port`.
fn endpoint(
    state: &ServerState,
    ns: &str,
    name: &str,
    port: i64,
) -> Result<WebhookEndpoint, CallError> {
    let service = state
        .store
        .get(&TypeKey::new("", "services"), ns, name)
        .ok_or_else(|| CallError::Call(format!("service \"{name}\" not found")))?;
    let port_name = service["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["port"].as_i64() == Some(port))
        .map(|p| p["name"].as_str().unwrap_or_default().to_owned())
        .ok_or_else(|| CallError::Call(format!("service \"{name}\" has no port {port}")))?;
    let slices = state
        .store
        .all(&TypeKey::new("discovery.k8s.io", "endpointslices"));
    for slice in slices.iter().filter(|s| {
        s["metadata"]["namespace"] == ns
            && s["metadata"]["labels"]["kubernetes.io/service-name"] == name
    }) {
        let Some(target_port) = slice["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"].as_str().unwrap_or_default() == port_name)
            .and_then(|p| u16::try_from(p["port"].as_i64()?).ok())
        else {
            continue;
        };
        let ready = slice["endpoints"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["conditions"]["ready"].as_bool() != Some(false))
            .find_map(|e| {
                let ip = e["addresses"].as_array()?.first()?.as_str()?.parse().ok()?;
                Some(WebhookEndpoint {
                    ip,
                    port: target_port,
                    node_name: e["nodeName"].as_str().map(str::to_owned),
                })
            });
        if let Some(endpoint) = ready {
            return Ok(endpoint);
        }
    }
    Err(CallError::Call(format!(
        "no endpoints available for service \"{name}\""
    )))
}

fn tls_connector(hook: &Hook) -> Result<TlsConnector, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    if let Some(bundle) = hook.webhook["clientConfig"]["caBundle"].as_str() {
        let pem = base64::engine::general_purpose::STANDARD
            .decode(bundle)
            .map_err(|e| format!("caBundle is not base64: {e}"))?;
        for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
            let cert = cert.map_err(|e| format!("caBundle: {e}"))?;
            roots.add(cert).map_err(|e| format!("caBundle: {e}"))?;
        }
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsConnector::from(Arc::new(config)))
}

fn go_io_error(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => "connection refused".to_owned(),
        io::ErrorKind::TimedOut => "i/o timeout".to_owned(),
        _ => e.to_string(),
    }
}

/// How long an idle connection to a webhook is reused (Go's `IdleConnTimeout` in the
/// transport kube-apiserver's webhook clients use).
const IDLE_FOR: Duration = Duration::from_secs(90);
/// How many idle connections to one webhook are kept.
const IDLE_PER_WEBHOOK: usize = 25;

/// Connections to webhooks kept open between calls, as kube-apiserver keeps its webhook
/// clients' (a TLS handshake per admitted object would double the cost of a burst of pod
/// creations). Keyed by where a call goes and whom it trusts.
#[derive(Default)]
pub struct WebhookConnections(Mutex<HashMap<String, Vec<(Instant, Sender)>>>);

/// One HTTP/1.1 connection to a webhook, as a request sender.
type Sender = SendRequest<Full<Bytes>>;

impl WebhookConnections {
    /// An idle connection for `key` that is still open, if any.
    fn take(&self, key: &str) -> Option<Sender> {
        let mut idle = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let list = idle.get_mut(key)?;
        while let Some((since, sender)) = list.pop() {
            if since.elapsed() < IDLE_FOR && !sender.is_closed() {
                return Some(sender);
            }
        }
        None
    }

    /// Keeps `sender` (its last answer fully read) for the next call to `key`.
    fn put(&self, key: String, sender: Sender) {
        let mut idle = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let list = idle.entry(key).or_default();
        list.retain(|(since, s)| since.elapsed() < IDLE_FOR && !s.is_closed());
        if list.len() < IDLE_PER_WEBHOOK && !sender.is_closed() {
            list.push((Instant::now(), sender));
        }
    }
}

/// What makes two calls able to share a connection: the address and endpoint dialled, the
/// name verified and the CAs trusted.
fn connection_key(hook: &Hook, target: &Target) -> String {
    format!(
        "{}|{}|{}|{}",
        target.addr,
        target
            .endpoint
            .as_ref()
            .and_then(|e| e.node_name.as_deref())
            .unwrap_or_default(),
        target.server_name,
        hook.webhook["clientConfig"]["caBundle"]
            .as_str()
            .unwrap_or_default()
    )
}

/// A new connection to `target`, verified against the hook's `caBundle`.
async fn dial(state: &ServerState, hook: &Hook, target: &Target) -> Result<Sender, CallError> {
    let url = &target.url;
    let failed = |why: String| CallError::Call(format!("Post \"{url}\": {why}"));
    let connector = tls_connector(hook).map_err(failed)?;
    let dialer = state
        .webhook_dialer
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let tcp = match (&target.endpoint, dialer) {
        (Some(endpoint), Some(dial)) => dial(endpoint.clone()).await,
        _ => TcpStream::connect(&target.addr).await,
    };
    let tcp = tcp.map_err(|e| {
        failed(format!(
            "dial tcp {}: connect: {}",
            target.addr,
            go_io_error(&e)
        ))
    })?;
    let server_name = match target.server_name.parse::<std::net::IpAddr>() {
        Ok(ip) => ServerName::IpAddress(ip.into()),
        Err(_) => ServerName::try_from(target.server_name.clone())
            .map_err(|e| failed(format!("tls: {e}")))?,
    };
    let tls = connector
        .connect(server_name, tcp)
        .await
        .map_err(|e| failed(format!("tls: failed to verify certificate: {e}")))?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| failed(e.to_string()))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

async fn post(
    state: &ServerState,
    hook: &Hook,
    target: &Target,
    body: Bytes,
) -> Result<Value, CallError> {
    let url = &target.url;
    let failed = |why: String| CallError::Call(format!("Post \"{url}\": {why}"));
    let request = || {
        http::Request::post(&target.path_and_query)
            .header(http::header::HOST, &target.server_name)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json, */*")
            .header(http::header::USER_AGENT, "kube-apiserver-admission")
            .body(Full::new(body.clone()))
            .map_err(|e| failed(e.to_string()))
    };
    let key = connection_key(hook, target);
    let mut reused = state.webhook_connections.take(&key);
    if let Some(sender) = &mut reused
        && sender.ready().await.is_err()
    {
        reused = None;
    }
    let fresh = || async {
        let mut sender = dial(state, hook, target).await?;
        let response = sender
            .send_request(request()?)
            .await
            .map_err(|e| failed(e.to_string()))?;
        Ok::<_, CallError>((sender, response))
    };
    let (mut sender, response) = match reused {
        Some(mut sender) => match sender.send_request(request()?).await {
            Ok(response) => (sender, response),
            // The webhook closed the idle connection as the request went out (Go's transport
            // retries such a request on a new connection too).
            Err(e) if e.is_canceled() || e.is_closed() || e.is_incomplete_message() => {
                fresh().await?
            }
            Err(e) => return Err(failed(e.to_string())),
        },
        None => fresh().await?,
    };
    let status = response.status();
    let limited = http_body_util::Limited::new(response.into_body(), MAX_RESPONSE_BYTES);
    let bytes = limited
        .collect()
        .await
        .map_err(|e| failed(e.to_string()))?
        .to_bytes();
    if sender.ready().await.is_ok() {
        state.webhook_connections.put(key, sender);
    }
    if !status.is_success() {
        let text = String::from_utf8_lossy(&bytes);
        return Err(CallError::Call(format!(
            "an error on the server ({:?}) has prevented the request from succeeding",
            text.trim()
        )));
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| CallError::Response(format!("couldn't decode the response: {e}")))
}

/// One call: the review out, the answer checked (kind, uid, patch type) and decoded.
async fn call(
    state: &ServerState,
    hook: &Hook,
    attrs: &Attributes,
    old: Option<&Value>,
    new: Option<&Value>,
) -> Result<Answer, CallError> {
    let uid = uuid::Uuid::new_v4().to_string();
    let target = target(state, hook)?;
    let api_version = hook.review_api_version();
    let body = Bytes::from(review(api_version, attrs, &uid, old, new).to_string());
    let reply = tokio::time::timeout(hook.timeout(), post(state, hook, &target, body))
        .await
        .map_err(|_| {
            CallError::Call(format!(
                "Post \"{}\": context deadline exceeded",
                target.url
            ))
        })??;
    if reply["apiVersion"] != api_version || reply["kind"] != "AdmissionReview" {
        return Err(CallError::Response(format!(
            "expected webhook response of {api_version}, Kind=AdmissionReview, got {}, Kind={}",
            reply["apiVersion"].as_str().unwrap_or_default(),
            reply["kind"].as_str().unwrap_or_default()
        )));
    }
    let response = &reply["response"];
    if !response.is_object() {
        return Err(CallError::Response("webhook response was absent".into()));
    }
    let got = response["uid"].as_str().unwrap_or_default();
    if got != uid {
        return Err(CallError::Response(format!(
            "expected response.uid={uid:?}, got {got:?}"
        )));
    }
    let patch = match response["patch"].as_str().filter(|p| !p.is_empty()) {
        None => None,
        Some(_) if !hook.mutating => {
            return Err(CallError::Response(
                "validating webhook may not return response.patch".into(),
            ));
        }
        Some(encoded) => {
            match response["patchType"].as_str() {
                None => {
                    return Err(CallError::Response(
                        "webhook returned response.patch but not response.patchType".into(),
                    ));
                }
                Some("JSONPatch") => {}
                Some(other) => {
                    return Err(CallError::Response(format!(
                        "webhook returned invalid response.patchType of {other:?}"
                    )));
                }
            }
            let raw = base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .map_err(|e| CallError::Response(format!("response.patch: {e}")))?;
            Some(
                serde_json::from_slice(&raw)
                    .map_err(|e| CallError::Response(format!("response.patch: {e}")))?,
            )
        }
    };
    Ok(Answer {
        allowed: response["allowed"].as_bool().unwrap_or(false),
        status: response["status"].clone(),
        patch,
        warnings: response["warnings"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
    })
}

/// kube-apiserver's error for a denial: the webhook's status with its code (at least 400) and
/// `admission webhook "NAME" denied the request: MESSAGE`.
fn denied(hook: &Hook, status: &Value) -> ApiError {
    let by = format!("admission webhook {:?} denied the request", hook.name);
    let message = match (status["message"].as_str(), status["reason"].as_str()) {
        (Some(m), _) if !m.is_empty() => format!("{by}: {m}"),
        (_, Some(r)) if !r.is_empty() => format!("{by}: {r}"),
        _ => format!("{by} without explanation"),
    };
    let code = status["code"]
        .as_u64()
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| *c >= 400)
        .unwrap_or(400);
    let mut error = ApiError::new(code, status["reason"].as_str().unwrap_or_default(), message);
    if status["details"].is_object() {
        error.details = Some(status["details"].clone());
    }
    error
}

fn internal(error: String) -> ApiError {
    ApiError::internal(format!("Internal error occurred: {error}")).with_causes(&[Cause {
        reason: String::new(),
        message: error,
        field: String::new(),
    }])
}

/// Refuses a dry run a webhook with side effects would see, as kube-apiserver does.
fn check_dry_run(hook: &Hook, attrs: &Attributes) -> Result<(), ApiError> {
    if attrs.dry_run
        && !matches!(
            hook.webhook["sideEffects"].as_str(),
            Some("None" | "NoneOnDryRun")
        )
    {
        return Err(ApiError::bad_request(format!(
            "admission webhook {:?} does not support dry run",
            hook.name
        )));
    }
    Ok(())
}

/// Outcome of one hook: `Ok(answer)` or `Ok(None)` when a failure was ignored.
async fn invoke(
    state: &ServerState,
    hook: &Hook,
    attrs: &Attributes,
    old: Option<&Value>,
    new: Option<&Value>,
) -> Result<Option<Answer>, ApiError> {
    check_dry_run(hook, attrs)?;
    match call(state, hook, attrs, old, new).await {
        Ok(answer) => {
            state.metrics.webhook_request(
                &hook.name,
                hook.mutating,
                attrs.operation.as_str(),
                200,
                !answer.allowed,
            );
            Ok(Some(answer))
        }
        Err(e) => {
            // kube-apiserver counts a failed call with the status it stands for: 400 when the
            // call failed, 503 when the answer was unusable; failing closed is a rejection.
            let code = match e {
                CallError::Call(_) => 400,
                CallError::Response(_) => 503,
            };
            state.metrics.webhook_request(
                &hook.name,
                hook.mutating,
                attrs.operation.as_str(),
                code,
                !hook.fails_open(),
            );
            let message = format!("failed calling webhook {:?}: {e}", hook.name);
            if hook.fails_open() {
                tracing::warn!(webhook = %hook.name, "Failed calling webhook, failing open: {message}");
                Ok(None)
            } else {
                tracing::warn!(webhook = %hook.name, "Failed calling webhook, failing closed: {message}");
                Err(internal(message))
            }
        }
    }
}

/// Runs the mutating webhooks that apply, in order, applying their JSON patches; webhooks with
/// `reinvocationPolicy: IfNeeded` are called once more when a later webhook changed the object.
pub async fn mutate(
    state: &ServerState,
    attrs: &Attributes,
    old: Option<&Value>,
    new: Option<Value>,
) -> Outcome {
    let mut outcome = Outcome {
        object: new,
        warnings: Vec::new(),
        error: None,
    };
    let hooks = hooks(state, true);
    // For each webhook called: the object as it left it. Selectors are judged against the
    // object as earlier webhooks left it, as kube-apiserver's dispatcher does.
    let mut after: Vec<Option<Option<Value>>> = vec![None; hooks.len()];
    for (i, hook) in hooks.iter().enumerate() {
        if !applies(state, hook, attrs, old, outcome.object.as_ref()) {
            continue;
        }
        if let Err(e) = mutate_once(state, hook, attrs, old, &mut outcome).await {
            outcome.error = Some(e);
            return outcome;
        }
        after[i] = Some(outcome.object.clone());
    }
    for (i, hook) in hooks.iter().enumerate() {
        let changed_since = after[i]
            .as_ref()
            .is_some_and(|seen| *seen != outcome.object);
        if !hook.reinvoke_if_needed()
            || !changed_since
            || !applies(state, hook, attrs, old, outcome.object.as_ref())
        {
            continue;
        }
        if let Err(e) = mutate_once(state, hook, attrs, old, &mut outcome).await {
            outcome.error = Some(e);
            return outcome;
        }
    }
    outcome
}

async fn mutate_once(
    state: &ServerState,
    hook: &Hook,
    attrs: &Attributes,
    old: Option<&Value>,
    outcome: &mut Outcome,
) -> Result<(), ApiError> {
    let Some(answer) = invoke(state, hook, attrs, old, outcome.object.as_ref()).await? else {
        return Ok(());
    };
    outcome.warnings.extend(answer.warnings);
    if !answer.allowed {
        return Err(denied(hook, &answer.status));
    }
    // A DELETE has no object to patch; kube-apiserver ignores what such a patch would do.
    if let (Some(patch), Some(object)) = (answer.patch, outcome.object.as_mut()) {
        let patch: json_patch::Patch =
            serde_json::from_value(patch).map_err(|e| internal(e.to_string()))?;
        let mut patched = object.clone();
        json_patch::patch(&mut patched, &patch).map_err(|e| internal(e.to_string()))?;
        *object = patched;
    }
    Ok(())
}

/// Runs the validating webhooks that apply (one after another; kube-apiserver runs them in
/// parallel, which only changes timing).
pub async fn validate_request(
    state: &ServerState,
    attrs: &Attributes,
    old: Option<&Value>,
    new: Option<&Value>,
) -> Outcome {
    let mut outcome = Outcome {
        object: new.cloned(),
        warnings: Vec::new(),
        error: None,
    };
    for hook in hooks(state, false) {
        if !applies(state, &hook, attrs, old, new) {
            continue;
        }
        match invoke(state, &hook, attrs, old, new).await {
            Ok(Some(answer)) => {
                outcome.warnings.extend(answer.warnings);
                if !answer.allowed {
                    outcome.error = Some(denied(&hook, &answer.status));
                    return outcome;
                }
            }
            Ok(None) => {}
            Err(e) => {
                outcome.error = Some(e);
                return outcome;
            }
        }
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(operation: Operation, resource: &str, sub: &str, namespaced: bool) -> Attributes {
        Attributes {
            group: String::new(),
            version: "v1".into(),
            resource: resource.into(),
            subresource: sub.into(),
            kind: "Pod".into(),
            namespaced,
            namespace: "default".into(),
            name: "p".into(),
            operation,
            dry_run: false,
            user: UserInfo::default(),
            options: json!({}),
        }
    }

    fn rule(ops: &[&str], resources: &[&str], scope: &str) -> Value {
        json!({"operations": ops, "apiGroups": [""], "apiVersions": ["v1"], "resources": resources, "scope": scope})
    }

    #[test]
    fn rules_match_resources_subresources_operations_and_scope() {
        let create = attrs(Operation::Create, "pods", "", true);
        let status = attrs(Operation::Update, "pods", "status", true);
        assert!(rule_matches(&rule(&["CREATE"], &["pods"], "*"), &create));
        assert!(!rule_matches(&rule(&["UPDATE"], &["pods"], "*"), &create));
        assert!(rule_matches(&rule(&["*"], &["*"], "*"), &create));
        assert!(
            !rule_matches(&rule(&["*"], &["*"], "*"), &status),
            "* is main resources only"
        );
        assert!(!rule_matches(&rule(&["*"], &["pods"], "*"), &status));
        assert!(rule_matches(&rule(&["*"], &["pods/status"], "*"), &status));
        assert!(rule_matches(&rule(&["*"], &["*/status"], "*"), &status));
        assert!(rule_matches(&rule(&["*"], &["*/*"], "*"), &status));
        assert!(rule_matches(&rule(&["*"], &["pods/*"], "*"), &create));
        assert!(!rule_matches(&rule(&["*"], &["pods"], "Cluster"), &create));
        assert!(rule_matches(
            &rule(&["*"], &["pods"], "Namespaced"),
            &create
        ));
        let mut other_group = rule(&["*"], &["pods"], "*");
        other_group["apiGroups"] = json!(["apps"]);
        assert!(!rule_matches(&other_group, &create));
    }

    #[test]
    fn configurations_are_defaulted_and_validated_like_v1() {
        let mut ok = json!({"metadata": {"name": "c"}, "webhooks": [{
            "name": "a.example.com", "sideEffects": "None", "admissionReviewVersions": ["v1"],
            "clientConfig": {"service": {"namespace": "ns", "name": "svc"}},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]}]});
        default_and_validate("MutatingWebhookConfiguration", &mut ok).expect("valid");
        let hook = &ok["webhooks"][0];
        assert_eq!(hook["failurePolicy"], "Fail");
        assert_eq!(hook["timeoutSeconds"], 10);
        assert_eq!(hook["reinvocationPolicy"], "Never");
        assert_eq!(hook["rules"][0]["scope"], "*");
        assert_eq!(hook["clientConfig"]["service"]["port"], 443);

        let mut bad = json!({"metadata": {"name": "c"}, "webhooks": [{
            "name": "short", "sideEffects": "Unknown", "admissionReviewVersions": ["v2"],
            "timeoutSeconds": 31, "clientConfig": {"url": "http://x.example.com/"},
            "matchConditions": [{"name": "m", "expression": "true"}]}]});
        let err = default_and_validate("ValidatingWebhookConfiguration", &mut bad).unwrap_err();
        assert_eq!(err.code, 422);
        expect_test::expect![[r#"ValidatingWebhookConfiguration.admissionregistration.k8s.io "c" is invalid: [webhooks[0].name: Invalid value: "short": should be a domain with at least three segments separated by dots, webhooks[0].sideEffects: Unsupported value: "Unknown": supported values: "None", "NoneOnDryRun", webhooks[0].timeoutSeconds: Invalid value: 31: the timeout value must be between 1 and 30 seconds, webhooks[0].clientConfig.url: Invalid value: "http": 'https' is the only allowed URL scheme, webhooks[0].matchConditions: Forbidden: CEL match conditions are not supported by this server (simkube); remove them and match with rules, namespaceSelector and objectSelector, webhooks[0].admissionReviewVersions: Invalid value: []string{"v2"}: must include at least one of v1, v1beta1]"#]]
        .assert_eq(&err.message);
    }

    #[test]
    fn denials_carry_the_webhook_status_with_at_least_400() {
        let hook = Hook {
            name: "deny.example.com".into(),
            configuration: "c".into(),
            mutating: false,
            webhook: json!({}),
        };
        let e = denied(
            &hook,
            &json!({"code": 403, "message": "no", "reason": "Forbidden"}),
        );
        assert_eq!(
            (e.code, e.message.as_str()),
            (
                403,
                "admission webhook \"deny.example.com\" denied the request: no"
            )
        );
        let e = denied(&hook, &json!({"code": 200}));
        assert_eq!(e.code, 400);
        assert_eq!(
            e.message,
            "admission webhook \"deny.example.com\" denied the request without explanation"
        );
        let dry = Attributes {
            dry_run: true,
            ..attrs(Operation::Create, "pods", "", true)
        };
        let unknown = Hook {
            webhook: json!({"sideEffects": "Unknown"}),
            ..hook.clone()
        };
        let e = check_dry_run(&unknown, &dry).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (
                400,
                "admission webhook \"deny.example.com\" does not support dry run"
            )
        );
        let none = Hook {
            webhook: json!({"sideEffects": "NoneOnDryRun"}),
            ..hook
        };
        assert!(check_dry_run(&none, &dry).is_ok());
    }
}
