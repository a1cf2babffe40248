//! The controller's admission webhook: places new pods of offloaded namespaces (the
//! toleration of the virtual nodes and the affinity their strategy asks for, decided by
//! `offloading::placement`). Every replica serves it behind the `tether-webhook` Service with
//! a certificate from a CA kept in a Secret; the CA goes into the webhook configuration's
//! `caBundle`, which is how the API server trusts it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use base64::Engine as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, ObjectMeta, PostParams};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{Value, json};
use tether_api::names::{labels, objects};
use tether_api::offloading::NamespaceOffloading;
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::auth::tls::{pem, provider};
use crate::context::Ctx;
use crate::offloading::local::Local;

/// The webhook's CA and serving certificate.
#[derive(Clone)]
pub struct WebhookCert {
    /// The CA certificate, PEM: what the webhook configuration's `caBundle` holds.
    pub ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

impl std::fmt::Debug for WebhookCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WebhookCert(key <redacted>)")
    }
}

impl WebhookCert {
    /// A CA and a certificate it signed for the webhook Service's names in `namespace`.
    pub fn generate(namespace: &str) -> Result<Self, Error> {
        let ca_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(Error::cert("generating the webhook CA key"))?;
        let mut ca = rcgen::CertificateParams::default();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, "tether-webhook-ca");
        ca.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        ca.not_before = rcgen::date_time_ymd(2024, 1, 1);
        ca.not_after = rcgen::date_time_ymd(2124, 1, 1);
        let ca_cert = ca
            .self_signed(&ca_key)
            .map_err(Error::cert("self-signing the webhook CA"))?;
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let service = objects::WEBHOOK_SERVICE;
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(Error::cert("generating the webhook key"))?;
        let mut leaf = rcgen::CertificateParams::new(vec![
            format!("{service}.{namespace}.svc"),
            format!("{service}.{namespace}.svc.cluster.local"),
            format!("{service}.{namespace}"),
        ])
        .map_err(Error::cert("naming the webhook certificate"))?;
        leaf.distinguished_name.push(
            rcgen::DnType::CommonName,
            format!("{service}.{namespace}.svc"),
        );
        leaf.not_before = rcgen::date_time_ymd(2024, 1, 1);
        leaf.not_after = rcgen::date_time_ymd(2124, 1, 1);
        let cert = leaf
            .signed_by(&key, &issuer)
            .map_err(Error::cert("signing the webhook certificate"))?;
        Ok(Self {
            ca_pem: ca_cert.pem(),
            cert_pem: cert.pem(),
            key_pem: pem("PRIVATE KEY", &key.serialize_der()),
        })
    }

    /// Loads the Secret, creating it on first start (another replica's is read if it won).
    pub async fn load_or_create(client: kube::Client, namespace: &str) -> Result<Self, Error> {
        let api: Api<Secret> = Api::namespaced(client, namespace);
        let name = objects::WEBHOOK_TLS_SECRET;
        let what = format!("Secret {namespace}/{name}");
        for _ in 0..3 {
            if let Some(s) = api
                .get_opt(name)
                .await
                .map_err(Error::kube(format!("reading {what}")))?
            {
                let get = |k: &str| {
                    s.data
                        .as_ref()
                        .and_then(|d| d.get(k))
                        .and_then(|b| String::from_utf8(b.0.clone()).ok())
                };
                return match (get("ca.crt"), get("tls.crt"), get("tls.key")) {
                    (Some(ca_pem), Some(cert_pem), Some(key_pem)) => Ok(Self {
                        ca_pem,
                        cert_pem,
                        key_pem,
                    }),
                    _ => Err(Error::Invalid(format!(
                        "{what} lacks ca.crt, tls.crt or tls.key; delete it and the controller makes a new one"
                    ))),
                };
            }
            let fresh = Self::generate(namespace)?;
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    labels: Some(labels::managed()),
                    ..Default::default()
                },
                type_: Some("kubernetes.io/tls".to_owned()),
                immutable: Some(true),
                data: Some(BTreeMap::from([
                    (
                        "ca.crt".to_owned(),
                        ByteString(fresh.ca_pem.clone().into_bytes()),
                    ),
                    (
                        "tls.crt".to_owned(),
                        ByteString(fresh.cert_pem.clone().into_bytes()),
                    ),
                    (
                        "tls.key".to_owned(),
                        ByteString(fresh.key_pem.clone().into_bytes()),
                    ),
                ])),
                ..Default::default()
            };
            match api.create(&PostParams::default(), &secret).await {
                Ok(_) => return Ok(fresh),
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(e) => return Err(Error::kube(format!("creating {what}"))(e)),
            }
        }
        Err(Error::Invalid(format!(
            "{what} kept changing while it was read"
        )))
    }

    fn server_config(&self) -> Result<rustls::ServerConfig, Error> {
        let der = |pem_text: &str| -> Result<Vec<u8>, Error> {
            let mut reader = std::io::BufReader::new(pem_text.as_bytes());
            match rustls_pemfile::read_one(&mut reader) {
                Ok(Some(rustls_pemfile::Item::X509Certificate(d))) => Ok(d.to_vec()),
                Ok(Some(rustls_pemfile::Item::Pkcs8Key(d))) => Ok(d.secret_pkcs8_der().to_vec()),
                _ => Err(Error::Invalid(
                    "the webhook certificate or key is unreadable".to_owned(),
                )),
            }
        };
        let cert = CertificateDer::from(der(&self.cert_pem)?);
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(der(&self.key_pem)?));
        rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Invalid(format!("TLS versions: {e}")))?
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)
            .map_err(|e| Error::Invalid(format!("the webhook certificate is unusable: {e}")))
    }
}

/// Puts the CA into the pod webhook's `caBundle`, where it is missing or another. A missing
/// configuration (an install without offloading, or a test) is left alone.
pub async fn publish_ca(client: &kube::Client, cert: &WebhookCert) -> Result<bool, Error> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let Some(mut conf) = api
        .get_opt(objects::POD_WEBHOOK)
        .await
        .map_err(Error::kube(format!(
            "reading MutatingWebhookConfiguration {}",
            objects::POD_WEBHOOK
        )))?
    else {
        return Ok(false);
    };
    let bundle = ByteString(cert.ca_pem.clone().into_bytes());
    let mut changed = false;
    for w in conf.webhooks.iter_mut().flatten() {
        if w.client_config.ca_bundle.as_ref() != Some(&bundle) {
            w.client_config.ca_bundle = Some(bundle.clone());
            changed = true;
        }
    }
    if changed {
        conf.metadata.managed_fields = None;
        api.replace(objects::POD_WEBHOOK, &PostParams::default(), &conf)
            .await
            .map_err(Error::kube(format!(
                "writing the caBundle of MutatingWebhookConfiguration {}",
                objects::POD_WEBHOOK
            )))?;
    }
    Ok(changed)
}

/// Binds `addr` and returns the bound address and the serving future.
pub async fn serve(
    ctx: Arc<Ctx>,
    cert: &WebhookCert,
    addr: SocketAddr,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, impl Future<Output = ()> + use<>), Error> {
    let local = Arc::new(Local::new(ctx.client.clone()));
    let app = Router::new()
        .route(objects::POD_WEBHOOK_PATH, post(mutate_pod))
        .with_state((ctx, local));
    crate::https::serve(
        "the admission webhook",
        addr,
        cert.server_config()?,
        app,
        shutdown,
    )
    .await
}

/// An AdmissionReview answer.
fn answer(uid: &str, ops: &[Value], warning: Option<String>) -> Json<Value> {
    let mut response = json!({ "uid": uid, "allowed": true });
    if !ops.is_empty() {
        let patch = serde_json::to_vec(ops).unwrap_or_default();
        response["patchType"] = json!("JSONPatch");
        response["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(patch));
    }
    if let Some(w) = warning {
        response["warnings"] = json!([w]);
    }
    Json(json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    }))
}

async fn mutate_pod(
    State((ctx, local)): State<(Arc<Ctx>, Arc<Local>)>,
    Json(review): Json<Value>,
) -> Json<Value> {
    let request = &review["request"];
    let uid = request["uid"].as_str().unwrap_or_default().to_owned();
    let namespace = request["namespace"].as_str().unwrap_or_default().to_owned();
    let Ok(pod) = serde_json::from_value::<Pod>(request["object"].clone()) else {
        // Not a pod this webhook understands: never block a workload on our account.
        return answer(&uid, &[], None);
    };
    let offloading = match offloading_of(&ctx, &local, &namespace).await {
        Ok(o) => o,
        Err(e) => {
            tracing::warn!(%namespace, error = %e, "reading the NamespaceOffloading for a new pod");
            return answer(
                &uid,
                &[],
                Some(format!(
                    "tether could not read how namespace {namespace} is offloaded ({e}); the pod is placed as written"
                )),
            );
        }
    };
    let Some(no) = offloading.filter(|o| o.metadata.deletion_timestamp.is_none()) else {
        return answer(&uid, &[], None);
    };
    let ops = crate::offloading::placement::patch(
        &pod,
        no.spec.pod_offloading_strategy,
        &no.spec.cluster_selector,
    );
    ctx.metrics.pod_placed(!ops.is_empty());
    tracing::debug!(%namespace, pod = ?pod.metadata.name.or(pod.metadata.generate_name), changes = ops.len(), "pod placed");
    answer(&uid, &ops, None)
}

/// How `namespace` is offloaded: from the watched copy, which a burst of pods reads without
/// asking the API server per pod, or from the API server when the copy has none (a request
/// made a moment ago, or a watch that cannot list).
async fn offloading_of(
    ctx: &Ctx,
    local: &Local,
    namespace: &str,
) -> Result<Option<NamespaceOffloading>, kube::Error> {
    let name = crate::offloading::namespaces::NAME;
    if let Some(o) = local
        .get_if_listed::<NamespaceOffloading>(Some(namespace), name)
        .await
    {
        return Ok(Some((*o).clone()));
    }
    Api::<NamespaceOffloading>::namespaced(ctx.client.clone(), namespace)
        .get_opt(name)
        .await
}
