//! The provider's side of issuing an identity: checks a request, records the Tenant, grants
//! its access and has Kubernetes sign the consumer's client certificate.

use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition, CertificateSigningRequestSpec,
    CertificateSigningRequestStatus,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use tether_api::ClusterId;
use tether_api::authentication::{Tenant, TenantSpec};
use tether_api::conditions::Time;
use tether_api::names;

use super::csr;
use super::protocol::{self, IdentityRequest, IssuedIdentity, Reason, RevocationRequest};
use crate::context::Ctx;
use crate::{identity, namespaces, tenant, tokens};

/// The signer of Kubernetes client certificates.
pub const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client";
/// How long to wait for Kubernetes to sign.
const SIGN_TIMEOUT: Duration = Duration::from_secs(15);

/// A refusal: the reason and a message for the consumer's admin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Why.
    pub reason: Reason,
    /// What went wrong and what to do.
    pub message: String,
}

impl Refusal {
    fn new(reason: Reason, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }

    fn internal(e: impl std::fmt::Display) -> Self {
        tracing::warn!(error = %e, "authentication request failed inside the provider");
        Self::new(
            Reason::Internal,
            format!("the provider failed: {e}; retrying may help"),
        )
    }
}

fn consumer_id(s: &str) -> Result<ClusterId, Refusal> {
    ClusterId::new(s).map_err(|e| Refusal::new(Reason::BadRequest, e.to_string()))
}

fn not_self(ctx: &Ctx, consumer: &ClusterId) -> Result<(), Refusal> {
    if consumer == ctx.cluster_id() {
        return Err(Refusal::new(
            Reason::ClusterIdConflict,
            format!(
                "the consumer and this provider both have cluster ID {consumer}: a cluster cannot \
                 peer with itself, and two clusters must not share an ID; reinstall one of them \
                 with another --cluster-id"
            ),
        ));
    }
    Ok(())
}

fn unix_now() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_second()
}

/// Checks and serves an identity request.
pub async fn issue(
    ctx: &Ctx,
    sealer: &protocol::NonceSealer,
    req: &IdentityRequest,
) -> Result<IssuedIdentity, Refusal> {
    let consumer = consumer_id(&req.cluster_id)?;
    not_self(ctx, &consumer)?;
    if !identity::is_public_key(&req.public_key) {
        return Err(Refusal::new(
            Reason::BadRequest,
            "publicKey is not a base64 Ed25519 public key",
        ));
    }
    sealer
        .verify(&req.nonce, consumer.as_str(), unix_now())
        .map_err(|m| Refusal::new(Reason::NonceRejected, m))?;
    let payload = protocol::identity_payload(
        &req.nonce,
        consumer.as_str(),
        ctx.cluster_id().as_str(),
        &req.csr,
    );
    if !identity::verify_b64(&req.public_key, &payload, &req.signature) {
        return Err(Refusal::new(
            Reason::SignatureRejected,
            "the signature does not verify with the public key sent; the request was altered \
             or signed with another key",
        ));
    }
    let tenants: Api<Tenant> = Api::all(ctx.client.clone());
    let existing = tenants
        .get_opt(consumer.as_str())
        .await
        .map_err(Refusal::internal)?;
    match &existing {
        Some(t) if t.metadata.deletion_timestamp.is_some() => {
            return Err(Refusal::new(
                Reason::Internal,
                format!("tenant {consumer} is being revoked; retry once that is done"),
            ));
        }
        Some(t) if t.spec.public_key != req.public_key => {
            return Err(Refusal::new(
                Reason::ClusterIdConflict,
                format!(
                    "cluster ID {consumer} already peers with this provider under another key: \
                     either another cluster uses the same ID (reinstall one with another \
                     --cluster-id) or this cluster was reinstalled (unpeer it on the provider \
                     first with `tether unpeer --force`)"
                ),
            ));
        }
        Some(_) => {}
        None => {
            let token = req.token.as_deref().ok_or_else(|| {
                Refusal::new(
                    Reason::TokenRejected,
                    "a first peering needs a token; ask the provider's admin for one \
                     (`tether generate peer-command`)",
                )
            })?;
            tokens::validate(
                &ctx.client,
                &ctx.settings.namespace,
                ctx.cluster_id(),
                token,
            )
            .await
            .map_err(Refusal::internal)?
            .map_err(|m| Refusal::new(Reason::TokenRejected, m))?;
        }
    }
    let username = names::consumer_username(&consumer);
    csr::check(&req.csr, &username).map_err(|m| Refusal::new(Reason::CsrRejected, m))?;
    if existing.is_none() {
        create_tenant(ctx, &consumer, &req.public_key).await?;
    }
    let namespace = tenant::grant(ctx, &consumer)
        .await
        .map_err(Refusal::internal)?;
    let certificate = sign(ctx, &consumer, &req.csr).await?;
    let expires_at = csr::not_after(&certificate).map_err(Refusal::internal)?;
    record_issue(ctx, &consumer, expires_at)
        .await
        .map_err(Refusal::internal)?;
    let api_server_url = ctx.published().api_server_url.ok_or_else(|| {
        Refusal::new(
            Reason::Internal,
            "the provider does not know its API server address yet; retry shortly",
        )
    })?;
    Ok(IssuedIdentity {
        provider_cluster_id: ctx.cluster_id().to_string(),
        api_server_url,
        ca_data: cluster_ca(ctx).await?,
        certificate,
        namespace,
        username,
        expires_at,
    })
}

async fn create_tenant(ctx: &Ctx, consumer: &ClusterId, public_key: &str) -> Result<(), Refusal> {
    let t = Tenant {
        metadata: ObjectMeta {
            name: Some(consumer.to_string()),
            labels: Some(namespaces::peer_labels(consumer)),
            ..Default::default()
        },
        spec: TenantSpec {
            cluster_id: consumer.to_string(),
            public_key: public_key.to_owned(),
            tenant_condition: Default::default(),
        },
        status: None,
    };
    let api: Api<Tenant> = Api::all(ctx.client.clone());
    match api.create(&PostParams::default(), &t).await {
        Ok(_) => {
            tracing::info!(consumer = %consumer, "new tenant");
            Ok(())
        }
        // A concurrent request created it: fine if it holds the same key.
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let now = api
                .get(consumer.as_str())
                .await
                .map_err(Refusal::internal)?;
            if now.spec.public_key == public_key {
                Ok(())
            } else {
                Err(Refusal::new(
                    Reason::ClusterIdConflict,
                    format!("cluster ID {consumer} was just taken by another key"),
                ))
            }
        }
        Err(e) => Err(Refusal::internal(e)),
    }
}

async fn record_issue(
    ctx: &Ctx,
    consumer: &ClusterId,
    expires_at: i64,
) -> Result<(), crate::Error> {
    let expiry = k8s_openapi::jiff::Timestamp::from_second(expires_at)
        .ok()
        .map(Time);
    let username = names::consumer_username(consumer);
    tenant::update_status(ctx, consumer, |status| {
        status.identities_issued += 1;
        status.identity_expires_at = expiry.clone();
        status.username = Some(username.clone());
    })
    .await
}

async fn cluster_ca(ctx: &Ctx) -> Result<String, Refusal> {
    let cm = Api::<ConfigMap>::namespaced(ctx.client.clone(), &ctx.settings.namespace)
        .get_opt("kube-root-ca.crt")
        .await
        .map_err(Refusal::internal)?;
    cm.and_then(|c| c.data?.get("ca.crt").cloned())
        .ok_or_else(|| {
            Refusal::new(
                Reason::Internal,
                "the provider's kube-root-ca.crt ConfigMap is missing; retry shortly",
            )
        })
}

/// Has Kubernetes sign `csr_pem` as a client certificate and returns it (PEM).
async fn sign(ctx: &Ctx, consumer: &ClusterId, csr_pem: &str) -> Result<String, Refusal> {
    let api: Api<CertificateSigningRequest> = Api::all(ctx.client.clone());
    let suffix: String = {
        use rand::Rng;
        let mut rng = rand::rng();
        (0..6)
            .map(|_| char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[rng.random_range(0..36)]))
            .collect()
    };
    let name = format!("tether-{consumer}-{suffix}");
    let lifetime = i32::try_from(ctx.settings.identity_lifetime.as_secs()).unwrap_or(i32::MAX);
    let request = CertificateSigningRequest {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(namespaces::peer_labels(consumer)),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(csr_pem.as_bytes().to_vec()),
            signer_name: CLIENT_SIGNER.to_owned(),
            usages: Some(vec![
                "client auth".to_owned(),
                "digital signature".to_owned(),
            ]),
            expiration_seconds: Some(lifetime),
            ..Default::default()
        },
        status: None,
    };
    api.create(&PostParams::default(), &request)
        .await
        .map_err(Refusal::internal)?;
    let result = approve_and_wait(&api, &name, consumer).await;
    // The certificate is in hand (or the attempt failed): the CSR object has done its job.
    let _ = api.delete(&name, &DeleteParams::default()).await;
    result
}

async fn approve_and_wait(
    api: &Api<CertificateSigningRequest>,
    name: &str,
    consumer: &ClusterId,
) -> Result<String, Refusal> {
    let approval = CertificateSigningRequest {
        status: Some(CertificateSigningRequestStatus {
            conditions: Some(vec![CertificateSigningRequestCondition {
                type_: "Approved".to_owned(),
                status: "True".to_owned(),
                reason: Some("TetherTenantAuthenticated".to_owned()),
                message: Some(format!(
                    "consumer {consumer} proved it holds its key and presented a valid token or tenancy"
                )),
                ..Default::default()
            }]),
            certificate: None,
        }),
        ..Default::default()
    };
    let patch = serde_json::json!({"status": approval.status});
    api.patch_approval(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(Refusal::internal)?;
    let signed = tokio::time::timeout(
        SIGN_TIMEOUT,
        await_condition(
            api.clone(),
            name,
            |csr: Option<&CertificateSigningRequest>| {
                csr.and_then(|c| c.status.as_ref()).is_some_and(|s| {
                    s.certificate.as_ref().is_some_and(|c| !c.0.is_empty())
                        || s.conditions.iter().flatten().any(|c| {
                            (c.type_ == "Denied" || c.type_ == "Failed") && c.status == "True"
                        })
                })
            },
        ),
    )
    .await
    .map_err(|_| {
        Refusal::new(
            Reason::Internal,
            format!(
                "Kubernetes did not sign the client certificate within {}s (is the \
                 {CLIENT_SIGNER} signer running?)",
                SIGN_TIMEOUT.as_secs()
            ),
        )
    })?
    .map_err(Refusal::internal)?;
    let status = signed.and_then(|c| c.status).unwrap_or_default();
    match status.certificate {
        Some(c) if !c.0.is_empty() => Ok(String::from_utf8_lossy(&c.0).into_owned()),
        _ => {
            let why = status
                .conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == "Denied" || c.type_ == "Failed")
                .map(|c| format!("{}: {}", c.type_, c.message.clone().unwrap_or_default()))
                .unwrap_or_else(|| "no certificate".to_owned());
            Err(Refusal::new(
                Reason::Internal,
                format!("Kubernetes did not sign the client certificate ({why})"),
            ))
        }
    }
}

/// Checks and serves a revocation: the consumer ends its own tenancy.
pub async fn revoke(
    ctx: &Ctx,
    sealer: &protocol::NonceSealer,
    req: &RevocationRequest,
) -> Result<(), Refusal> {
    let consumer = consumer_id(&req.cluster_id)?;
    sealer
        .verify(&req.nonce, consumer.as_str(), unix_now())
        .map_err(|m| Refusal::new(Reason::NonceRejected, m))?;
    let api: Api<Tenant> = Api::all(ctx.client.clone());
    let Some(t) = api
        .get_opt(consumer.as_str())
        .await
        .map_err(Refusal::internal)?
    else {
        return Err(Refusal::new(
            Reason::UnknownTenant,
            format!("cluster {consumer} is not a tenant of this provider"),
        ));
    };
    let payload =
        protocol::revocation_payload(&req.nonce, consumer.as_str(), ctx.cluster_id().as_str());
    if !identity::verify_b64(&t.spec.public_key, &payload, &req.signature) {
        return Err(Refusal::new(
            Reason::SignatureRejected,
            "the revocation is not signed with the key this tenant registered",
        ));
    }
    match api
        .delete(consumer.as_str(), &DeleteParams::default())
        .await
    {
        Ok(_) => {
            tracing::info!(consumer = %consumer, "tenant revoked at its own request");
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(Refusal::internal(e)),
    }
}

/// The Secret-free encoding of a PEM for kubeconfig `*-data` fields.
pub fn b64(pem: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(pem)
}
