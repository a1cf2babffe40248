//! Authentication and authorization as kube-apiserver does them: bearer tokens (an admin token,
//! static tokens and ServiceAccount JWTs), client certificates, anonymous requests, request
//! attributes from URLs, the RBAC authorizer with escalation prevention, and access reviews.

// `ApiError` is the crate's Status value, built at most once per request on a denial path;
// boxing it would only add an allocation and noise at every call site.
#![allow(clippy::result_large_err)]

mod escalation;
mod impersonation;
mod policy;
mod rbac;
mod review;
mod token;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;

pub use escalation::{
    breakdown_rule, check_escalation, check_escalation_update, covers, rule_covers,
};
pub use impersonation::{impersonate, wants_impersonation};
pub use policy::{default_cluster_role_bindings, default_cluster_roles};
pub use rbac::{
    Decision, PolicyRule, RBAC_GROUP, RbacView, SYSTEM_MASTERS, Subject, aggregate, authorize,
    decide, forbidden_message, label_selector_matches,
};
pub use review::{
    local_subject_access_review, self_subject_access_review, self_subject_review,
    self_subject_rules_review, subject_access_review,
};
pub use token::{
    DEFAULT_EXPIRATION_SECONDS, DEFAULT_ISSUER, MAX_EXPIRATION_SECONDS, MIN_EXPIRATION_SECONDS,
    ServiceAccountClaims, TokenError, TokenIssuer, token_request, token_request_bound,
};

use crate::error::ApiError;
use crate::tls::{CertAuthority, ClientIdentity};

/// The group every authenticated user is in.
pub const SYSTEM_AUTHENTICATED: &str = "system:authenticated";
/// The group of anonymous requests.
pub const SYSTEM_UNAUTHENTICATED: &str = "system:unauthenticated";
/// The user name of anonymous requests.
pub const ANONYMOUS_USER: &str = "system:anonymous";
/// The user name the admin token authenticates as.
pub const ADMIN_USER: &str = "admin";

/// Who made a request, as authenticators report it (`user.Info`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserInfo {
    /// User name, e.g. `alice` or `system:serviceaccount:ns:name`.
    pub username: String,
    /// Unique ID (a ServiceAccount's uid for its tokens), may be empty.
    pub uid: String,
    /// Groups, ending with `system:authenticated` for authenticated users.
    pub groups: Vec<String>,
    /// Extra attributes (e.g. `authentication.kubernetes.io/credential-id`).
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// A user with the given groups, plus `system:authenticated` as kube-apiserver adds it.
    pub fn authenticated(username: &str, groups: &[String]) -> UserInfo {
        let mut groups = groups.to_vec();
        if !groups.iter().any(|g| g == SYSTEM_AUTHENTICATED) {
            groups.push(SYSTEM_AUTHENTICATED.to_owned());
        }
        UserInfo {
            username: username.to_owned(),
            groups,
            ..UserInfo::default()
        }
    }

    /// The anonymous user.
    pub fn anonymous() -> UserInfo {
        UserInfo {
            username: ANONYMOUS_USER.to_owned(),
            groups: vec![SYSTEM_UNAUTHENTICATED.to_owned()],
            ..UserInfo::default()
        }
    }
}

/// A bearer token kept out of logs: `Debug` prints only its length.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretToken(String);

impl SecretToken {
    /// Wraps a token.
    pub fn new(token: impl Into<String>) -> Self {
        SecretToken(token.into())
    }

    /// The token itself, for a kubeconfig or an Authorization header.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Constant-time comparison, so response timing does not leak a prefix.
    fn matches(&self, candidate: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), candidate.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}

impl fmt::Debug for SecretToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretToken(<{} bytes redacted>)", self.0.len())
    }
}

/// Looks up a ServiceAccount by (namespace, name) and returns its uid if it exists.
pub type ServiceAccountLookup = Arc<dyn Fn(&str, &str) -> Option<String> + Send + Sync>;
/// Looks up an object a token is bound to by (kind `Pod`/`Secret`/`Node`, namespace, name) and
/// returns its uid if it exists.
pub type BoundObjectLookup = Arc<dyn Fn(&str, &str, &str) -> Option<String> + Send + Sync>;

/// Authenticates requests the way kube-apiserver's union authenticator does: a verified client
/// certificate first, then the bearer token (admin token, static tokens, ServiceAccount JWTs);
/// with no credentials at all the request is anonymous (or 401 when anonymous auth is off);
/// credentials that do not verify are always 401.
pub struct Authenticator {
    admin_token: SecretToken,
    static_tokens: Vec<(SecretToken, UserInfo)>,
    client_certs: bool,
    issuer: Arc<TokenIssuer>,
    service_accounts: ServiceAccountLookup,
    bound_objects: Option<BoundObjectLookup>,
    anonymous: bool,
}

impl fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authenticator")
            .field("admin_token", &self.admin_token)
            .field("static_tokens", &self.static_tokens.len())
            .field("client_certs", &self.client_certs)
            .field("issuer", &self.issuer)
            .field("anonymous", &self.anonymous)
            .finish_non_exhaustive()
    }
}

fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Prefix of the WebSocket subprotocol through which browsers and kubectl pass a bearer token.
const WS_BEARER_PREFIX: &str = "base64url.bearer.authorization.k8s.io.";

fn bearer_token(headers: &http::HeaderMap) -> Option<String> {
    if let Some(value) = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        let mut parts = value.trim().splitn(3, ' ');
        if let (Some(scheme), Some(token)) = (parts.next(), parts.next())
            && scheme.eq_ignore_ascii_case("bearer")
            && !token.is_empty()
        {
            return Some(token.to_owned());
        }
    }
    let protocols = headers.get_all(http::header::SEC_WEBSOCKET_PROTOCOL);
    for value in protocols.iter().filter_map(|v| v.to_str().ok()) {
        for protocol in value.split(',').map(str::trim) {
            if let Some(encoded) = protocol.strip_prefix(WS_BEARER_PREFIX)
                && let Ok(raw) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(encoded)
                && let Ok(token) = String::from_utf8(raw)
                && !token.is_empty()
            {
                return Some(token);
            }
        }
    }
    None
}

impl Authenticator {
    /// An authenticator accepting `admin_token` (user `admin` in `system:masters`), client
    /// certificates when `ca` is given (the TLS layer verifies them against it and passes
    /// [`ClientIdentity`]), and ServiceAccount tokens from `issuer` whose ServiceAccount
    /// `service_accounts` still finds with the same uid. Anonymous requests are allowed (as
    /// kube-apiserver's default `--anonymous-auth=true`); RBAC then limits them to the public
    /// health and version endpoints.
    pub fn new(
        admin_token: impl Into<String>,
        ca: Option<&CertAuthority>,
        issuer: Arc<TokenIssuer>,
        service_accounts: ServiceAccountLookup,
    ) -> Self {
        Authenticator {
            admin_token: SecretToken::new(admin_token),
            static_tokens: Vec::new(),
            client_certs: ca.is_some(),
            issuer,
            service_accounts,
            bound_objects: None,
            anonymous: true,
        }
    }

    /// Turns anonymous authentication on or off (`--anonymous-auth`); off makes requests without
    /// credentials 401.
    pub fn with_anonymous(mut self, allowed: bool) -> Self {
        self.anonymous = allowed;
        self
    }

    /// Adds a static bearer token for a fixed identity (like `--token-auth-file`).
    pub fn with_static_token(mut self, token: impl Into<String>, user: UserInfo) -> Self {
        let user = UserInfo::authenticated(&user.username, &user.groups);
        self.static_tokens.push((SecretToken::new(token), user));
        self
    }

    /// Checks that objects tokens are bound to (pods, secrets, nodes) still exist with the same
    /// uid; without it bound tokens are accepted while their ServiceAccount exists.
    pub fn with_bound_object_lookup(mut self, lookup: BoundObjectLookup) -> Self {
        self.bound_objects = Some(lookup);
        self
    }

    /// The ServiceAccount token issuer (for TokenRequest and the OIDC discovery endpoints).
    pub fn issuer(&self) -> &Arc<TokenIssuer> {
        &self.issuer
    }

    /// Authenticates a request at the current time.
    pub fn authenticate(
        &self,
        headers: &http::HeaderMap,
        peer: Option<&ClientIdentity>,
    ) -> Result<UserInfo, ApiError> {
        self.authenticate_at(headers, peer, now_unix())
    }

    /// Authenticates a request at `now_unix` (for token expiry).
    pub fn authenticate_at(
        &self,
        headers: &http::HeaderMap,
        peer: Option<&ClientIdentity>,
        now_unix: i64,
    ) -> Result<UserInfo, ApiError> {
        if self.client_certs
            && let Some(identity) = peer
            && !identity.common_name.is_empty()
        {
            return Ok(UserInfo::authenticated(
                &identity.common_name,
                &identity.organizations,
            ));
        }
        let Some(token) = bearer_token(headers) else {
            if self.anonymous {
                return Ok(UserInfo::anonymous());
            }
            return Err(ApiError::unauthorized());
        };
        if self.admin_token.matches(&token) {
            return Ok(UserInfo::authenticated(
                ADMIN_USER,
                &[SYSTEM_MASTERS.to_owned()],
            ));
        }
        if let Some((_, user)) = self.static_tokens.iter().find(|(t, _)| t.matches(&token)) {
            return Ok(user.clone());
        }
        self.service_account_user(&token, now_unix)
            .map_err(|error| {
                tracing::debug!(%error, "bearer token rejected");
                ApiError::unauthorized()
            })
    }

    fn service_account_user(&self, token: &str, now_unix: i64) -> Result<UserInfo, String> {
        self.service_account_user_for(token, now_unix, self.issuer.api_audiences())
            .map(|(user, _)| user)
    }

    /// Answers a TokenReview (authentication.k8s.io/v1): whether `spec.token` authenticates, for
    /// `spec.audiences` (default: the API audiences), and as whom. Failures are reported in
    /// `status.error` with `authenticated: false`, never as an HTTP error.
    pub fn token_review(&self, review: &serde_json::Value) -> serde_json::Value {
        self.token_review_at(review, now_unix())
    }

    /// [`Authenticator::token_review`] at `now_unix`.
    pub fn token_review_at(&self, review: &serde_json::Value, now_unix: i64) -> serde_json::Value {
        use serde_json::{Value, json};
        let spec = review.get("spec").cloned().unwrap_or_else(|| json!({}));
        let token = spec
            .get("token")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let requested: Vec<String> = spec
            .get("audiences")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        let accepted: Vec<String> = if requested.is_empty() {
            self.issuer.api_audiences().to_vec()
        } else {
            requested.clone()
        };
        let api_audience = accepted
            .iter()
            .any(|a| self.issuer.api_audiences().contains(a));
        let fixed = if token.is_empty() || !api_audience {
            None
        } else if self.admin_token.matches(token) {
            Some(UserInfo::authenticated(
                ADMIN_USER,
                &[SYSTEM_MASTERS.to_owned()],
            ))
        } else {
            self.static_tokens
                .iter()
                .find(|(t, _)| t.matches(token))
                .map(|(_, u)| u.clone())
        };
        let outcome = match fixed {
            Some(user) => Ok((user, self.issuer.api_audiences().to_vec())),
            None if token.is_empty() => Err("token is empty".to_owned()),
            None => self.service_account_user_for(token, now_unix, &accepted),
        };
        let status = match outcome {
            Ok((user, token_audiences)) => {
                let audiences: Vec<&String> = token_audiences
                    .iter()
                    .filter(|a| accepted.contains(a))
                    .collect();
                let mut info = json!({"username": user.username, "groups": user.groups});
                if !user.uid.is_empty() {
                    info["uid"] = json!(user.uid);
                }
                if !user.extra.is_empty() {
                    info["extra"] = json!(user.extra);
                }
                json!({"authenticated": true, "user": info, "audiences": audiences})
            }
            Err(error) => json!({
                "authenticated": false,
                "user": {},
                "error": format!("[invalid bearer token, {error}]"),
            }),
        };
        let mut metadata = review.get("metadata").cloned().unwrap_or_else(|| json!({}));
        if metadata.get("creationTimestamp").is_none() {
            metadata["creationTimestamp"] = Value::Null;
        }
        let mut spec = spec;
        if !requested.is_empty() {
            spec["audiences"] = json!(requested);
        }
        json!({
            "kind": "TokenReview",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": metadata,
            "spec": spec,
            "status": status,
        })
    }

    fn service_account_user_for(
        &self,
        token: &str,
        now_unix: i64,
        accepted: &[String],
    ) -> Result<(UserInfo, Vec<String>), String> {
        let claims = self
            .issuer
            .verify_for(token, now_unix, accepted)
            .map_err(|e| e.to_string())?;
        match (self.service_accounts)(&claims.namespace, &claims.name) {
            Some(uid) if claims.uid.is_empty() || uid == claims.uid => {}
            Some(_) => {
                return Err(format!(
                    "service account UID ({}) does not match claim",
                    claims.uid
                ));
            }
            None => {
                return Err(format!(
                    "service account {}/{} has been deleted",
                    claims.namespace, claims.name
                ));
            }
        }
        if let Some(lookup) = &self.bound_objects {
            for (kind, name, uid) in &claims.bound {
                let namespace = if kind == "Node" {
                    ""
                } else {
                    claims.namespace.as_str()
                };
                match lookup(kind, namespace, name) {
                    Some(actual) if uid.is_empty() || actual == *uid => {}
                    _ => return Err(format!("{kind} {name} bound to the token no longer exists")),
                }
            }
        }
        let mut user = UserInfo::authenticated(
            &format!("system:serviceaccount:{}:{}", claims.namespace, claims.name),
            &[
                "system:serviceaccounts".to_owned(),
                format!("system:serviceaccounts:{}", claims.namespace),
            ],
        );
        user.uid = claims.uid.clone();
        if !claims.jti.is_empty() {
            user.extra.insert(
                "authentication.kubernetes.io/credential-id".into(),
                vec![format!("JTI={}", claims.jti)],
            );
        }
        for (kind, name, uid) in &claims.bound {
            if kind == "Pod" {
                user.extra.insert(
                    "authentication.kubernetes.io/pod-name".into(),
                    vec![name.clone()],
                );
                user.extra.insert(
                    "authentication.kubernetes.io/pod-uid".into(),
                    vec![uid.clone()],
                );
            }
        }
        if let Some((node, node_uid)) = &claims.node {
            user.extra.insert(
                "authentication.kubernetes.io/node-name".into(),
                vec![node.clone()],
            );
            if !node_uid.is_empty() {
                user.extra.insert(
                    "authentication.kubernetes.io/node-uid".into(),
                    vec![node_uid.clone()],
                );
            }
        }
        Ok((user, claims.audiences))
    }
}

/// What a request asks to do, as the authorizer sees it (`authorizer.Attributes`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestAttributes {
    /// Who asks.
    pub user: UserInfo,
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`, or a
    /// lower-cased HTTP method for non-resource requests.
    pub verb: String,
    /// API group; empty for core.
    pub api_group: String,
    /// API version.
    pub api_version: String,
    /// Plural resource.
    pub resource: String,
    /// Subresource, e.g. `status`, `log`.
    pub subresource: String,
    /// Namespace; empty for cluster scope. For a Namespace object it is that namespace.
    pub namespace: String,
    /// Object name; for list/watch a `metadata.name=` field selector supplies it.
    pub name: String,
    /// URL path.
    pub path: String,
    /// Whether this is an API resource request (else a non-resource URL).
    pub resource_request: bool,
}

fn query_param<'a>(query: &'a str, key: &str) -> Option<std::borrow::Cow<'a, str>> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == key).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.contains(['%', '+']) {
        return std::borrow::Cow::Borrowed(s);
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    std::borrow::Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

/// The name a `metadata.name=x` (or `==`) term of a field selector pins, if any.
fn field_selector_name(selector: &str) -> Option<String> {
    selector.split(',').find_map(|term| {
        let (key, value) = term.split_once("==").or_else(|| term.split_once('='))?;
        (key.trim() == "metadata.name" && !key.ends_with('!')).then(|| value.trim().to_owned())
    })
}

fn is_valid_path_segment_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '%'])
}

impl RequestAttributes {
    /// Derives the attributes of an HTTP request as kube-apiserver's `RequestInfoFactory` does:
    /// `/api/v1/...` and `/apis/<group>/<version>/...` are resource requests (a `watch/` path
    /// prefix or `?watch=true` makes a watch, GET without a name a list, DELETE without a name a
    /// deletecollection, and a `fieldSelector=metadata.name=x` names the object); anything else
    /// is a non-resource request whose verb is the lower-cased method.
    pub fn from_request(user: UserInfo, method: &http::Method, path: &str, query: &str) -> Self {
        let mut attrs = RequestAttributes {
            user,
            verb: method.as_str().to_lowercase(),
            path: path.to_owned(),
            ..RequestAttributes::default()
        };
        let parts: Vec<&str> = path
            .trim_matches('/')
            .split('/')
            .filter(|p| !p.is_empty())
            .collect();
        if parts.len() < 3 || !matches!(parts[0], "api" | "apis") {
            return attrs;
        }
        let mut rest = &parts[1..];
        if parts[0] == "apis" {
            if rest.len() < 3 {
                return attrs;
            }
            attrs.api_group = rest[0].to_owned();
            rest = &rest[1..];
        }
        attrs.resource_request = true;
        attrs.api_version = rest[0].to_owned();
        rest = &rest[1..];
        let mut verb_from_path = false;
        if matches!(rest.first(), Some(&"watch") | Some(&"proxy")) && rest.len() >= 2 {
            attrs.verb = rest[0].to_owned();
            rest = &rest[1..];
            verb_from_path = true;
        } else {
            attrs.verb = match *method {
                http::Method::POST => "create",
                http::Method::GET | http::Method::HEAD => "get",
                http::Method::PUT => "update",
                http::Method::PATCH => "patch",
                http::Method::DELETE => "delete",
                _ => "",
            }
            .to_owned();
        }
        if rest.first() == Some(&"namespaces") && rest.len() > 1 {
            attrs.namespace = rest[1].to_owned();
            // `namespaces/<ns>/status` and `/finalize` are subresources of the Namespace.
            if rest.len() > 2 && !matches!(rest[2], "status" | "finalize") {
                rest = &rest[2..];
            }
        }
        if rest.len() >= 3 && attrs.verb != "proxy" {
            attrs.subresource = rest[2].to_owned();
        }
        if rest.len() >= 2 {
            attrs.name = rest[1].to_owned();
        }
        if let Some(resource) = rest.first() {
            attrs.resource = (*resource).to_owned();
        }
        if attrs.name.is_empty() && attrs.verb == "get" && !verb_from_path {
            let watch = query_param(query, "watch")
                .is_some_and(|v| matches!(v.as_ref(), "true" | "1" | "t" | "T" | "TRUE" | "True"));
            attrs.verb = if watch { "watch" } else { "list" }.to_owned();
            if let Some(selector) = query_param(query, "fieldSelector")
                && let Some(name) = field_selector_name(&selector)
                && is_valid_path_segment_name(&name)
            {
                attrs.name = name;
            }
        }
        if attrs.name.is_empty() && attrs.verb == "delete" {
            attrs.verb = "deletecollection".to_owned();
        }
        attrs
    }
}
