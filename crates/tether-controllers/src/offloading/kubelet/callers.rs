//! Who may call the virtual kubelet API, decided as a kubelet with `--client-ca-file` and
//! `--authorization-mode=Webhook` decides: the caller's client certificate must chain to the
//! cluster's client CA (401 otherwise), and a SubjectAccessReview must allow its user the
//! verb on the `proxy` subresource of the pod's node (403 otherwise). The API server presents
//! such a certificate (`--kubelet-client-certificate`), which its kubeadm binding lets do
//! anything; a pod of the cluster holding no certificate from that CA is refused.
//!
//! The CA comes from where every in-cluster component reads it: ConfigMap
//! `kube-system/extension-apiserver-authentication`, key `client-ca-file`, read again now and
//! then so a rotated CA is followed. The TLS handshake asks for a certificate without
//! requiring one, and checks only that the caller holds its key; the chain is checked per
//! request against the CA of the moment, so a missing or foreign certificate gets the
//! kubelet's `401 Unauthorized` rather than a handshake alert, as upstream.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use http::Method;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use tokio_util::sync::CancellationToken;

use crate::Error;

/// The namespace of the ConfigMap holding the client CA.
pub const CLIENT_CA_NAMESPACE: &str = "kube-system";
/// The ConfigMap kube-apiserver publishes its client CA in.
pub const CLIENT_CA_CONFIGMAP: &str = "extension-apiserver-authentication";
/// Its key holding the PEM CA bundle.
pub const CLIENT_CA_KEY: &str = "client-ca-file";
/// The group every authenticated user is in.
const AUTHENTICATED: &str = "system:authenticated";
/// How often the CA is read again while it is known, and after a failed read.
const RELOAD: Duration = Duration::from_secs(60);
const RETRY: Duration = Duration::from_secs(5);

/// An authenticated caller: the certificate's CN and its O's, as kube-apiserver's x509
/// authenticator reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The user (CN).
    pub user: String,
    /// The groups (each O, then `system:authenticated`).
    pub groups: Vec<String>,
}

/// The client CA of the moment, or why there is none.
pub struct ClientCa {
    verifier: RwLock<Result<Arc<dyn ClientCertVerifier>, String>>,
}

impl std::fmt::Debug for ClientCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCa").finish_non_exhaustive()
    }
}

impl Default for ClientCa {
    fn default() -> Self {
        Self {
            verifier: RwLock::new(Err(format!(
                "the client CA has not been read yet from ConfigMap \
                 {CLIENT_CA_NAMESPACE}/{CLIENT_CA_CONFIGMAP}"
            ))),
        }
    }
}

impl ClientCa {
    /// A client CA from a PEM bundle.
    pub fn from_pem(pem: &str) -> Result<Self, String> {
        let ca = Self::default();
        ca.set(pem)?;
        Ok(ca)
    }

    fn set(&self, pem: &str) -> Result<(), String> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_pemfile::certs(&mut pem.as_bytes()) {
            let cert = cert.map_err(|e| format!("unreadable PEM: {e}"))?;
            roots
                .add(cert)
                .map_err(|e| format!("unusable CA certificate: {e}"))?;
        }
        if roots.is_empty() {
            return Err("no PEM CERTIFICATE in it".to_owned());
        }
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            crate::auth::tls::provider(),
        )
        .build()
        .map_err(|e| format!("unusable CA: {e}"))?;
        *self
            .verifier
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Ok(verifier);
        Ok(())
    }

    /// Reads the CA from its ConfigMap. A CA read earlier stays in use when this fails.
    pub async fn load(&self, client: &kube::Client) -> Result<(), Error> {
        let where_ = format!("ConfigMap {CLIENT_CA_NAMESPACE}/{CLIENT_CA_CONFIGMAP}");
        let cm = Api::<ConfigMap>::namespaced(client.clone(), CLIENT_CA_NAMESPACE)
            .get_opt(CLIENT_CA_CONFIGMAP)
            .await
            .map_err(Error::kube(format!("reading {where_}")))?
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "{where_} does not exist: the API server publishes its client CA there \
                     (kube-apiserver --client-ca-file); the virtual kubelet API refuses every \
                     caller until it does"
                ))
            })?;
        let pem = cm
            .data
            .as_ref()
            .and_then(|d| d.get(CLIENT_CA_KEY))
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "{where_} has no {CLIENT_CA_KEY}: start kube-apiserver with --client-ca-file; \
                     the virtual kubelet API refuses every caller until then"
                ))
            })?;
        self.set(pem)
            .map_err(|e| Error::Invalid(format!("{where_}, key {CLIENT_CA_KEY}: {e}")))
    }

    /// Keeps the CA read from its ConfigMap until `shutdown`.
    pub async fn keep_loaded(self: Arc<Self>, client: kube::Client, shutdown: CancellationToken) {
        let mut failing = false;
        loop {
            let wait = match self.load(&client).await {
                Ok(()) => {
                    if failing {
                        tracing::info!("virtual kubelet API: client CA read");
                    }
                    failing = false;
                    RELOAD
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(error = %e, "virtual kubelet API: cannot read the client CA");
                    }
                    failing = true;
                    RETRY
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// The caller the presented certificate chain names, or why it names none.
    pub fn authenticate(
        &self,
        chain: Option<&[CertificateDer<'static>]>,
    ) -> Result<Caller, String> {
        let Some((leaf, intermediates)) = chain.and_then(<[_]>::split_first) else {
            return Err("no client certificate".to_owned());
        };
        let verifier = self
            .verifier
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()?;
        verifier
            .verify_client_cert(leaf, intermediates, UnixTime::now())
            .map_err(|e| format!("the client certificate is not valid for the client CA: {e}"))?;
        identity(leaf)
    }
}

/// The user and groups of a verified certificate.
fn identity(leaf: &CertificateDer<'_>) -> Result<Caller, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(leaf)
        .map_err(|e| format!("unreadable client certificate: {e}"))?;
    let subject = cert.subject();
    let user = subject
        .iter_common_name()
        .find_map(|cn| cn.as_str().ok())
        .filter(|cn| !cn.is_empty())
        .ok_or("the client certificate has no common name (the user)")?
        .to_owned();
    let mut groups: Vec<String> = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok())
        .map(str::to_owned)
        .collect();
    groups.push(AUTHENTICATED.to_owned());
    Ok(Caller { user, groups })
}

/// The verb a kubelet authorises a request's method as.
pub fn verb(method: &Method) -> &'static str {
    match *method {
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        // GET, HEAD and anything else read.
        _ => "get",
    }
}

/// What a SubjectAccessReview answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Allowed.
    Allowed,
    /// Not allowed: the kubelet's 403 text.
    Forbidden(String),
}

/// The SubjectAccessReview a kubelet sends for `caller` doing `verb` on `nodes/proxy` of
/// `node`.
pub fn review(caller: &Caller, verb: &str, node: &str) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(caller.user.clone()),
            groups: Some(caller.groups.clone()),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.to_owned()),
                resource: Some("nodes".to_owned()),
                subresource: Some("proxy".to_owned()),
                name: Some(node.to_owned()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    }
}

/// How long an allowed answer is reused (kubelet's `--authorization-webhook-cache-authorized-ttl`
/// default), so a `kubectl logs -f` reconnecting or a burst of execs costs one review.
pub const ALLOWED_TTL: Duration = Duration::from_secs(5 * 60);
/// How long a refusal is reused (`--authorization-webhook-cache-unauthorized-ttl`): short, so
/// a RoleBinding just granted takes effect soon.
pub const FORBIDDEN_TTL: Duration = Duration::from_secs(30);
/// Answers kept at most; the authorizer's LRU in the kubelet holds as many.
const DECISIONS_KEPT: usize = 8192;

/// What one review asked: the caller as authenticated, the verb and the node.
type Question = (String, Vec<String>, &'static str, String);

/// SubjectAccessReview answers remembered for a while, as a kubelet's webhook authorizer
/// remembers them. Failed reviews are never remembered.
#[derive(Debug)]
pub struct Decisions {
    allowed_ttl: Duration,
    forbidden_ttl: Duration,
    answers: Mutex<HashMap<Question, (Verdict, Instant)>>,
}

impl Default for Decisions {
    fn default() -> Self {
        Self::with_ttls(ALLOWED_TTL, FORBIDDEN_TTL)
    }
}

impl Decisions {
    /// Answers kept `allowed_ttl` when allowed, `forbidden_ttl` when not.
    pub fn with_ttls(allowed_ttl: Duration, forbidden_ttl: Duration) -> Self {
        Self {
            allowed_ttl,
            forbidden_ttl,
            answers: Mutex::default(),
        }
    }

    /// The answer to `question` still valid at `now`, if any.
    fn recall(&self, question: &Question, now: Instant) -> Option<Verdict> {
        let answers = self.answers.lock().unwrap_or_else(PoisonError::into_inner);
        answers
            .get(question)
            .filter(|(_, until)| now < *until)
            .map(|(verdict, _)| verdict.clone())
    }

    /// Remembers `verdict` from `now` for its TTL.
    fn remember(&self, question: Question, verdict: Verdict, now: Instant) {
        let ttl = match verdict {
            Verdict::Allowed => self.allowed_ttl,
            Verdict::Forbidden(_) => self.forbidden_ttl,
        };
        let mut answers = self.answers.lock().unwrap_or_else(PoisonError::into_inner);
        if answers.len() >= DECISIONS_KEPT {
            answers.retain(|_, (_, until)| now < *until);
            if answers.len() >= DECISIONS_KEPT {
                // Still full of live answers: forgetting them costs a review each, no more.
                answers.clear();
            }
        }
        answers.insert(question, (verdict, now + ttl));
    }

    /// Whether `caller` may `verb` on `nodes/proxy` of `node`: a remembered answer, or
    /// `ask`'s, remembered when it is one.
    pub async fn decide<F, Fut>(
        &self,
        caller: &Caller,
        verb: &'static str,
        node: &str,
        ask: F,
    ) -> Result<Verdict, Error>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Verdict, Error>>,
    {
        let question = (
            caller.user.clone(),
            caller.groups.clone(),
            verb,
            node.to_owned(),
        );
        if let Some(verdict) = self.recall(&question, Instant::now()) {
            return Ok(verdict);
        }
        let verdict = ask().await?;
        self.remember(question, verdict.clone(), Instant::now());
        Ok(verdict)
    }
}

/// Asks the API server whether `caller` may `verb` on `nodes/proxy` of `node`.
pub async fn authorize(
    client: &kube::Client,
    caller: &Caller,
    verb: &str,
    node: &str,
) -> Result<Verdict, Error> {
    let answer = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review(caller, verb, node))
        .await
        .map_err(Error::kube(format!(
            "asking whether {} may {verb} nodes/proxy",
            caller.user
        )))?;
    let status = answer.status.unwrap_or_default();
    if status.allowed && status.denied != Some(true) {
        return Ok(Verdict::Allowed);
    }
    Ok(Verdict::Forbidden(format!(
        "Forbidden (user={}, verb={verb}, resource=nodes, subresource(s)=[proxy])",
        caller.user
    )))
}

/// Asks for a client certificate without requiring one, and checks only that the caller
/// holds its key: the chain is checked per request by [`ClientCa::authenticate`].
#[derive(Debug)]
pub struct RequestClientCert {
    algorithms: WebPkiSupportedAlgorithms,
}

impl Default for RequestClientCert {
    fn default() -> Self {
        Self {
            algorithms: crate::auth::tls::provider().signature_verification_algorithms,
        }
    }
}

impl ClientCertVerifier for RequestClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // No hints: clients then offer the certificate they have, whatever its issuer.
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CA and a client certificate it signed for `user` in `groups`, as PEM and DER.
    fn ca_and_client(user: &str, groups: &[&str]) -> (String, CertificateDer<'static>) {
        let ca_key = rcgen::KeyPair::generate().expect("key");
        let mut ca = rcgen::CertificateParams::default();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, "test client CA");
        let ca_cert = ca.self_signed(&ca_key).expect("CA");
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let mut leaf = rcgen::CertificateParams::default();
        leaf.distinguished_name = rcgen::DistinguishedName::new();
        leaf.distinguished_name
            .push(rcgen::DnType::CommonName, user);
        if let Some(g) = groups.first() {
            leaf.distinguished_name
                .push(rcgen::DnType::OrganizationName, *g);
        }
        leaf.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = leaf.signed_by(&key, &issuer).expect("leaf");
        (ca_cert.pem(), cert.der().clone())
    }

    #[test]
    fn certificates_of_the_client_ca_name_their_user_and_others_are_refused() {
        let (pem, cert) = ca_and_client("kube-apiserver-kubelet-client", &["system:masters"]);
        let ca = ClientCa::from_pem(&pem).expect("CA");
        assert_eq!(
            ca.authenticate(Some(std::slice::from_ref(&cert))),
            Ok(Caller {
                user: "kube-apiserver-kubelet-client".to_owned(),
                groups: vec!["system:masters".to_owned(), AUTHENTICATED.to_owned()],
            })
        );
        let e = ca.authenticate(None).expect_err("no certificate");
        assert_eq!(e, "no client certificate");
        assert!(ca.authenticate(Some(&[][..])).is_err());
        let (_, foreign) = ca_and_client("kube-apiserver-kubelet-client", &["system:masters"]);
        let e = ca
            .authenticate(Some(std::slice::from_ref(&foreign)))
            .expect_err("another CA");
        assert!(e.contains("not valid for the client CA"), "{e}");
        // Before the CA is known nobody gets in, and the reason says where it comes from.
        let e = ClientCa::default()
            .authenticate(Some(std::slice::from_ref(&cert)))
            .expect_err("no CA yet");
        assert!(e.contains("extension-apiserver-authentication"), "{e}");
        assert!(ClientCa::from_pem("no PEM here").is_err());
    }

    fn caller(user: &str) -> Caller {
        Caller {
            user: user.to_owned(),
            groups: vec![AUTHENTICATED.to_owned()],
        }
    }

    #[tokio::test]
    async fn answers_are_reused_until_their_ttl_and_failures_never() {
        let decisions = Decisions::default();
        let asked = std::sync::atomic::AtomicUsize::new(0);
        let ask = |verdict: Result<Verdict, Error>| {
            asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move { verdict }
        };
        let alice = caller("alice");
        let first = decisions
            .decide(&alice, "get", "n1", || ask(Ok(Verdict::Allowed)))
            .await;
        assert_eq!(first.ok(), Some(Verdict::Allowed));
        // The same question is not asked again; another verb, node or user is.
        let again = decisions
            .decide(&alice, "get", "n1", || {
                ask(Ok(Verdict::Forbidden("no".into())))
            })
            .await;
        assert_eq!(again.ok(), Some(Verdict::Allowed));
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1);
        let create = decisions
            .decide(&alice, "create", "n1", || {
                ask(Ok(Verdict::Forbidden("no".into())))
            })
            .await;
        assert_eq!(create.ok(), Some(Verdict::Forbidden("no".into())));
        let bob = decisions
            .decide(&caller("bob"), "get", "n1", || {
                ask(Ok(Verdict::Forbidden("no".into())))
            })
            .await;
        assert_eq!(bob.ok(), Some(Verdict::Forbidden("no".into())));
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 3);
        // A review that failed is asked again next time.
        let failed = decisions
            .decide(&alice, "get", "n2", || {
                ask(Err(Error::Invalid("unreachable".into())))
            })
            .await;
        assert!(failed.is_err());
        let retried = decisions
            .decide(&alice, "get", "n2", || ask(Ok(Verdict::Allowed)))
            .await;
        assert_eq!(retried.ok(), Some(Verdict::Allowed));
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 5);
        // Refusals expire after 30 s, permissions after 5 min.
        let question = |user: &str, verb| {
            (
                user.to_owned(),
                vec![AUTHENTICATED.to_owned()],
                verb,
                "n1".to_owned(),
            )
        };
        let now = Instant::now();
        let after = |user: &str, ttl: Duration| {
            decisions.recall(&question(user, "get"), now + ttl + Duration::from_secs(1))
        };
        assert_eq!(after("bob", FORBIDDEN_TTL), None);
        assert_eq!(after("alice", FORBIDDEN_TTL), Some(Verdict::Allowed));
        assert_eq!(after("alice", ALLOWED_TTL), None);
    }

    #[test]
    fn a_full_cache_keeps_working() {
        let decisions = Decisions::default();
        let now = Instant::now();
        for i in 0..=DECISIONS_KEPT {
            let q = (format!("u{i}"), Vec::new(), "get", "n".to_owned());
            decisions.remember(q, Verdict::Allowed, now);
        }
        let answers = decisions.answers.lock().expect("lock");
        assert!(answers.len() <= DECISIONS_KEPT, "{}", answers.len());
        assert!(answers.contains_key(&(
            format!("u{DECISIONS_KEPT}"),
            Vec::new(),
            "get",
            "n".to_owned()
        )));
    }

    #[test]
    fn requests_become_the_kubelets_subject_access_review() {
        assert_eq!(verb(&Method::GET), "get");
        assert_eq!(verb(&Method::HEAD), "get");
        assert_eq!(verb(&Method::POST), "create");
        let caller = Caller {
            user: "u".to_owned(),
            groups: vec!["g".to_owned(), AUTHENTICATED.to_owned()],
        };
        let sar = serde_json::to_value(review(&caller, "create", "c2")).expect("json");
        assert_eq!(
            sar["spec"],
            serde_json::json!({
                "user": "u",
                "groups": ["g", AUTHENTICATED],
                "resourceAttributes": {
                    "verb": "create", "resource": "nodes", "subresource": "proxy", "name": "c2"
                }
            })
        );
    }
}
