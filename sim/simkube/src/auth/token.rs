//! ServiceAccount tokens: ES256 JWTs shaped like kube-apiserver's bound tokens, the TokenRequest
//! subresource, and their verification (signature, issuer, audience, expiry with the same one
//! minute leeway go-jose applies).

use std::collections::HashSet;
use std::fmt;
use std::sync::{Mutex, PoisonError};

use base64::Engine as _;
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, KeyPair as _};
use serde_json::{Value, json};

use crate::error::{ApiError, Cause};

/// Where in-cluster clients expect the issuer, and the default (and only) API audience.
pub const DEFAULT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// TokenRequest default lifetime.
pub const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;
/// TokenRequest minimum lifetime.
pub const MIN_EXPIRATION_SECONDS: i64 = 600;
/// TokenRequest maximum lifetime (2^32 seconds).
pub const MAX_EXPIRATION_SECONDS: i64 = 1 << 32;
/// Clock leeway for `exp` and `nbf`, as go-jose's default.
const LEEWAY_SECONDS: i64 = 60;

/// Why a token did not verify. The server answers every one of these with the same 401; the
/// variants exist for logs and tests.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Not three base64url segments of JSON.
    #[error("malformed token")]
    Malformed,
    /// Signed by another key or with another algorithm.
    #[error("invalid signature")]
    BadSignature,
    /// `iss` is not this cluster's issuer.
    #[error("token issuer {0:?} is not trusted")]
    WrongIssuer(String),
    /// No `aud` entry is an API audience.
    #[error("token audiences {0:?} do not include an API audience")]
    WrongAudience(Vec<String>),
    /// `exp` is in the past (beyond the leeway).
    #[error("service account token has expired")]
    Expired,
    /// `nbf` is in the future (beyond the leeway).
    #[error("service account token is not valid yet")]
    NotYetValid,
    /// The claims lack the `kubernetes.io` private claim or its service account.
    #[error("token is not a service account token")]
    NotServiceAccount,
    /// Key generation failed (the system RNG failed).
    #[error("could not generate a signing key")]
    KeyGeneration,
}

/// The verified content of a ServiceAccount token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceAccountClaims {
    /// Namespace of the ServiceAccount.
    pub namespace: String,
    /// Name of the ServiceAccount.
    pub name: String,
    /// UID of the ServiceAccount when the token was issued.
    pub uid: String,
    /// Token ID (`jti`).
    pub jti: String,
    /// Object the token is bound to: (kind, name, uid), kind `Pod`, `Secret` or `Node`.
    pub bound: Vec<(String, String, String)>,
    /// Node of a pod-bound token, when known.
    pub node: Option<(String, String)>,
    /// `exp`, Unix seconds.
    pub expires: i64,
    /// `aud`.
    pub audiences: Vec<String>,
}

/// Signs and verifies ServiceAccount tokens for one cluster. The key is generated per cluster
/// and never leaves the process; `Debug` shows only the key ID.
pub struct TokenIssuer {
    key: EcdsaKeyPair,
    rng: SystemRandom,
    kid: String,
    issuer: String,
    api_audiences: Vec<String>,
    /// Tokens whose signature this key has already checked. A signature check is pure and a
    /// client sends the same token with every request: rechecking it (ECDSA, tens of
    /// microseconds) was a few percent of a busy server's time. Claims are still read and
    /// checked (expiry, audience) on every request.
    verified: Mutex<HashSet<String>>,
}

/// How many checked signatures [`TokenIssuer`] remembers before it starts over.
const VERIFIED_KEPT: usize = 4096;

impl fmt::Debug for TokenIssuer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenIssuer")
            .field("issuer", &self.issuer)
            .field("kid", &self.kid)
            .field("key", &"<redacted>")
            .finish()
    }
}

fn b64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn b64url_decode(text: &str) -> Result<Vec<u8>, TokenError> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(text)
        .map_err(|_| TokenError::Malformed)
}

impl TokenIssuer {
    /// A fresh ES256 key and the default issuer and API audience
    /// (`https://kubernetes.default.svc.cluster.local`).
    pub fn generate() -> Result<TokenIssuer, TokenError> {
        Self::with_issuer(DEFAULT_ISSUER)
    }

    /// A fresh key with a custom issuer, which is also the API audience (as kube-apiserver
    /// defaults `--api-audiences` to `--service-account-issuer`).
    pub fn with_issuer(issuer: &str) -> Result<TokenIssuer, TokenError> {
        let rng = SystemRandom::new();
        let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
        let pkcs8 =
            EcdsaKeyPair::generate_pkcs8(alg, &rng).map_err(|_| TokenError::KeyGeneration)?;
        let key = EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng)
            .map_err(|_| TokenError::KeyGeneration)?;
        // Like kube-apiserver, the key ID is derived from the public key so verifiers can pick it.
        let digest = ring::digest::digest(&ring::digest::SHA256, key.public_key().as_ref());
        let kid = b64url(digest.as_ref());
        Ok(TokenIssuer {
            key,
            rng,
            kid,
            issuer: issuer.to_owned(),
            api_audiences: vec![issuer.to_owned()],
            verified: Mutex::new(HashSet::new()),
        })
    }

    fn verified(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.verified.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `token`'s signature was checked before (by this key).
    fn signature_checked(&self, token: &str) -> bool {
        self.verified().contains(token)
    }

    fn remember_signature(&self, token: &str) {
        let mut verified = self.verified();
        if verified.len() >= VERIFIED_KEPT {
            verified.clear();
        }
        verified.insert(token.to_owned());
    }

    /// The `iss` claim of every token.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// Audiences the API server accepts.
    pub fn api_audiences(&self) -> &[String] {
        &self.api_audiences
    }

    /// The public key set, as served at `/openid/v1/jwks`.
    pub fn jwks(&self) -> Value {
        let point = self.key.public_key().as_ref();
        // Uncompressed SEC1 point: 0x04 || X (32 bytes) || Y (32 bytes).
        let (x, y) = (&point[1..33], &point[33..65]);
        json!({"keys": [{
            "use": "sig", "kty": "EC", "kid": self.kid, "crv": "P-256", "alg": "ES256",
            "x": b64url(x), "y": b64url(y),
        }]})
    }

    /// The OpenID discovery document, as served at `/.well-known/openid-configuration`.
    pub fn openid_configuration(&self) -> Value {
        json!({
            "issuer": self.issuer,
            "jwks_uri": format!("{}/openid/v1/jwks", self.issuer),
            "response_types_supported": ["id_token"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["ES256"],
        })
    }

    /// Signs arbitrary claims as a compact JWS.
    pub fn sign(&self, claims: &Value) -> String {
        let header = json!({"alg": "ES256", "kid": self.kid});
        let signing_input = format!(
            "{}.{}",
            b64url(header.to_string().as_bytes()),
            b64url(claims.to_string().as_bytes())
        );
        let sig = self
            .key
            .sign(&self.rng, signing_input.as_bytes())
            .expect("invariant: ECDSA signing fails only if the system RNG fails");
        format!("{signing_input}.{}", b64url(sig.as_ref()))
    }

    /// Verifies signature, issuer, audience and validity window at `now_unix`, and extracts the
    /// ServiceAccount claims. Whether the ServiceAccount still exists is the caller's check.
    pub fn verify(&self, token: &str, now_unix: i64) -> Result<ServiceAccountClaims, TokenError> {
        self.verify_for(token, now_unix, &self.api_audiences)
    }

    /// [`TokenIssuer::verify`] accepting any of `audiences` instead of the API audiences (for a
    /// TokenReview naming its own audiences). The claims' `audiences` are the token's `aud`.
    pub fn verify_for(
        &self,
        token: &str,
        now_unix: i64,
        accepted: &[String],
    ) -> Result<ServiceAccountClaims, TokenError> {
        let mut parts = token.split('.');
        let (Some(h), Some(c), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed);
        };
        let header: Value =
            serde_json::from_slice(&b64url_decode(h)?).map_err(|_| TokenError::Malformed)?;
        if header.get("alg").and_then(Value::as_str) != Some("ES256") {
            return Err(TokenError::BadSignature);
        }
        if !self.signature_checked(token) {
            let sig = b64url_decode(s)?;
            let public = signature::UnparsedPublicKey::new(
                &signature::ECDSA_P256_SHA256_FIXED,
                self.key.public_key().as_ref(),
            );
            public
                .verify(format!("{h}.{c}").as_bytes(), &sig)
                .map_err(|_| TokenError::BadSignature)?;
            self.remember_signature(token);
        }
        let claims: Value =
            serde_json::from_slice(&b64url_decode(c)?).map_err(|_| TokenError::Malformed)?;
        let iss = claims
            .get("iss")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if iss != self.issuer {
            return Err(TokenError::WrongIssuer(iss.to_owned()));
        }
        let audiences: Vec<String> = match claims.get("aud") {
            Some(Value::String(a)) => vec![a.clone()],
            Some(Value::Array(list)) => list
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
            _ => Vec::new(),
        };
        if !audiences.iter().any(|a| accepted.contains(a)) {
            return Err(TokenError::WrongAudience(audiences));
        }
        let exp = claims
            .get("exp")
            .and_then(Value::as_i64)
            .ok_or(TokenError::Malformed)?;
        if now_unix > exp + LEEWAY_SECONDS {
            return Err(TokenError::Expired);
        }
        if let Some(nbf) = claims.get("nbf").and_then(Value::as_i64)
            && now_unix + LEEWAY_SECONDS < nbf
        {
            return Err(TokenError::NotYetValid);
        }
        let k8s = claims
            .get("kubernetes.io")
            .ok_or(TokenError::NotServiceAccount)?;
        let text = |v: &Value, path: &[&str]| -> String {
            let mut cur = v;
            for p in path {
                match cur.get(p) {
                    Some(next) => cur = next,
                    None => return String::new(),
                }
            }
            cur.as_str().unwrap_or_default().to_owned()
        };
        let namespace = text(k8s, &["namespace"]);
        let name = text(k8s, &["serviceaccount", "name"]);
        if namespace.is_empty() || name.is_empty() {
            return Err(TokenError::NotServiceAccount);
        }
        let mut bound = Vec::new();
        for (claim, kind) in [("pod", "Pod"), ("secret", "Secret")] {
            if k8s.get(claim).is_some() {
                bound.push((
                    kind.to_owned(),
                    text(k8s, &[claim, "name"]),
                    text(k8s, &[claim, "uid"]),
                ));
            }
        }
        let node = k8s
            .get("node")
            .map(|_| (text(k8s, &["node", "name"]), text(k8s, &["node", "uid"])));
        if let Some((node_name, node_uid)) = &node
            && bound.is_empty()
        {
            bound.push(("Node".to_owned(), node_name.clone(), node_uid.clone()));
        }
        Ok(ServiceAccountClaims {
            namespace,
            name,
            uid: text(k8s, &["serviceaccount", "uid"]),
            jti: claims
                .get("jti")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            bound,
            node,
            expires: exp,
            audiences,
        })
    }
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj.pointer(&format!("/metadata/{field}"))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn token_request_invalid(name: &str, value: i64, message: &str) -> ApiError {
    ApiError::invalid(
        "authentication.k8s.io",
        "TokenRequest",
        name,
        &[Cause {
            reason: "FieldValueInvalid".into(),
            message: format!("Invalid value: {value}: {message}"),
            field: "spec.expirationSeconds".into(),
        }],
    )
}

/// Answers `POST .../serviceaccounts/<name>/token` (TokenRequest, authentication.k8s.io/v1):
/// validates `spec.expirationSeconds` (default 3600, at least 600, at most 2^32), defaults
/// `spec.audiences` to the API audiences, and binds to `spec.boundObjectRef` (`Pod`, `Secret` or
/// `Node`, apiVersion `v1`). The caller checks that the bound object exists and fills its `uid`
/// into the reference (or use [`token_request_bound`], which does that from the object).
pub fn token_request(
    issuer: &TokenIssuer,
    service_account: &Value,
    request: &Value,
    now_unix: i64,
) -> Result<Value, ApiError> {
    token_request_bound(issuer, service_account, request, None, now_unix)
}

/// [`token_request`] with the bound object itself, so its uid is taken from it and a Pod is
/// checked to run as this ServiceAccount, as kube-apiserver does.
pub fn token_request_bound(
    issuer: &TokenIssuer,
    service_account: &Value,
    request: &Value,
    bound_object: Option<&Value>,
    now_unix: i64,
) -> Result<Value, ApiError> {
    let namespace = meta_str(service_account, "namespace");
    let name = meta_str(service_account, "name");
    let sa_uid = meta_str(service_account, "uid");
    let spec = request.get("spec").cloned().unwrap_or_else(|| json!({}));
    let expiration = match spec.get("expirationSeconds") {
        None | Some(Value::Null) => DEFAULT_EXPIRATION_SECONDS,
        Some(v) => v.as_i64().ok_or_else(|| {
            ApiError::bad_request("spec.expirationSeconds must be an integer number of seconds")
        })?,
    };
    if expiration < MIN_EXPIRATION_SECONDS {
        return Err(token_request_invalid(
            name,
            expiration,
            "may not specify a duration less than 10 minutes",
        ));
    }
    if expiration > MAX_EXPIRATION_SECONDS {
        return Err(token_request_invalid(
            name,
            expiration,
            "may not specify a duration larger than 2^32 seconds",
        ));
    }
    let mut audiences: Vec<String> = spec
        .get("audiences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    if audiences.is_empty() {
        audiences = issuer.api_audiences().to_vec();
    }
    let mut private = json!({
        "namespace": namespace,
        "serviceaccount": {"name": name, "uid": sa_uid},
    });
    let mut bound_ref = Value::Null;
    if let Some(reference) = spec.get("boundObjectRef").filter(|r| !r.is_null()) {
        let kind = reference
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let api_version = reference
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("v1")
            .to_owned();
        let ref_name = reference
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if api_version != "v1" || !matches!(kind, "Pod" | "Secret" | "Node") {
            let gvk = if api_version.contains('/') {
                format!(
                    "{}, Kind={kind}",
                    api_version.replacen('/', ", Version=", 1)
                )
            } else {
                format!("/{api_version}, Kind={kind}")
            };
            return Err(ApiError::bad_request(format!(
                "cannot bind token to object of type {gvk}"
            )));
        }
        let mut uid = reference
            .get("uid")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        if let Some(object) = bound_object {
            let actual = meta_str(object, "uid");
            if !uid.is_empty() && uid != actual {
                return Err(ApiError::conflict(
                    "",
                    &format!("{}s", kind.to_lowercase()),
                    ref_name,
                    &format!(
                        "the UID in the bound object reference ({uid}) does not match the \
                              UID in record. The object might have been deleted and then recreated"
                    ),
                ));
            }
            uid = actual.to_owned();
            if kind == "Pod" {
                let pod_sa = object
                    .pointer("/spec/serviceAccountName")
                    .and_then(Value::as_str)
                    .unwrap_or("default");
                if pod_sa != name {
                    return Err(ApiError::bad_request(format!(
                        "cannot bind token for serviceaccount \"{name}\" to pod running with \
                         different serviceaccount name."
                    )));
                }
                if let Some(node) = object.pointer("/spec/nodeName").and_then(Value::as_str) {
                    private["node"] = json!({"name": node, "uid": ""});
                }
            }
        }
        private[kind.to_lowercase()] = json!({"name": ref_name, "uid": uid});
        bound_ref = json!({"kind": kind, "apiVersion": api_version, "name": ref_name, "uid": uid});
    }
    let exp = now_unix + expiration;
    let claims = json!({
        "aud": audiences,
        "exp": exp,
        "iat": now_unix,
        "iss": issuer.issuer(),
        "jti": uuid::Uuid::new_v4().to_string(),
        "kubernetes.io": private,
        "nbf": now_unix,
        "sub": format!("system:serviceaccount:{namespace}:{name}"),
    });
    let token = issuer.sign(&claims);
    let mut out_spec = json!({"audiences": audiences, "expirationSeconds": expiration});
    out_spec["boundObjectRef"] = bound_ref;
    Ok(json!({
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": crate::timefmt::rfc3339(now_unix)},
        "spec": out_spec,
        "status": {"token": token, "expirationTimestamp": crate::timefmt::rfc3339(exp)},
    }))
}
