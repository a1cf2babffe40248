//! ServiceAccount tokens for offloaded pods: the consumer mints a token of the pod's own
//! ServiceAccount (TokenRequest) and keeps it, with its CA and namespace, in a Secret of the
//! twin namespace, which the pod's token volume reads at the provider. So an offloaded pod
//! authenticates to the consumer's API server as itself, and the consumer's RBAC applies.
//!
//! One token per ServiceAccount and twin, not per pod: a burst of a thousand replicas costs
//! one TokenRequest and one Secret, not a thousand of each. The price is that a token outlives
//! the pods that used it by at most its lifetime, since it is bound to no pod.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use tether_api::ClusterId;
use tether_api::names::{annotations, labels};

use super::OffCtx;
use super::translate::{CA_KEY, NAMESPACE_KEY, TOKEN_KEY};
use crate::Error;
use crate::context::FIELD_MANAGER;
use crate::providers::Access;

/// Prefix of the Secret holding a ServiceAccount's token in a twin namespace.
pub const SECRET_PREFIX: &str = "tether-token-";
/// [`labels::TETHER_MANAGED_BY`] of such a Secret.
pub const MANAGED_BY: &str = "service-account-token";
/// Annotation of such a Secret: the ServiceAccount it stands for.
pub const SERVICE_ACCOUNT: &str = "tether.dev/service-account";
/// How long a minted token lives; kube-apiserver's own pod tokens live an hour too.
const LIFETIME: i64 = 3600;
/// A token is minted again with this much of its life left, so that a pod never reads an
/// expired one (the kubelet refreshes its projected tokens at 80% of their life).
const RENEW_WITH: i64 = LIFETIME / 3;
/// Longest wait for one call to either API server.
const CALL: Duration = Duration::from_secs(5);
/// The ConfigMap every namespace has with the API server's CA (`ca.crt`).
const ROOT_CA: &str = "kube-root-ca.crt";

/// When each reflected token expires, by (provider, twin namespace, ServiceAccount), in Unix
/// seconds. Lost on restart, which only mints each token once more.
#[derive(Default)]
pub struct Minted {
    expiry: Mutex<HashMap<(String, String, String), i64>>,
    /// Held while minting, so a burst of pods of one ServiceAccount mints one token, not one
    /// each while the first is on its way.
    minting: tokio::sync::Mutex<()>,
}

impl Minted {
    fn fresh(&self, key: &(String, String, String), now: i64) -> bool {
        self.expiry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(key)
            .is_some_and(|expires| expires - now > RENEW_WITH)
    }

    fn record(&self, key: (String, String, String), expires: i64) {
        self.expiry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(key, expires);
    }
}

/// The name of the Secret holding `sa`'s token. A ServiceAccount name may be as long as a
/// Secret's, so a long one is shortened with a digest that keeps names apart.
pub fn secret_name(sa: &str) -> String {
    const MAX: usize = 253;
    let name = format!("{SECRET_PREFIX}{sa}");
    if name.len() <= MAX {
        return name;
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, sa.as_bytes());
    let hex: String = digest.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let keep = MAX - SECRET_PREFIX.len() - hex.len() - 1;
    // ServiceAccount names are ASCII (DNS subdomains), so any byte index is a boundary.
    format!("{SECRET_PREFIX}{}-{hex}", &sa[..keep])
}

fn unix_now() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_second()
}

/// Makes sure the twin `twin` at `provider` holds a token of ServiceAccount `sa` of namespace
/// `ns` with most of its life left, minting one when not; returns the Secret's name.
pub async fn ensure(
    octx: &OffCtx,
    provider: &ClusterId,
    access: &Access,
    ns: &str,
    twin: &str,
    sa: &str,
) -> Result<String, Error> {
    let name = secret_name(sa);
    let key = (provider.as_str().to_owned(), twin.to_owned(), sa.to_owned());
    if octx.tokens.fresh(&key, unix_now()) {
        return Ok(name);
    }
    let _minting = octx.tokens.minting.lock().await;
    if octx.tokens.fresh(&key, unix_now()) {
        return Ok(name);
    }
    let client = &octx.ctx.client;
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: Some(LIFETIME),
            bound_object_ref: None,
        },
        ..Default::default()
    };
    let minted = Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create_token_request(sa, &PostParams::default(), &request)
        .await
        .map_err(Error::kube(format!(
            "minting a token of ServiceAccount {ns}/{sa} for its offloaded pods"
        )))?;
    let Some(status) = minted.status else {
        return Err(Error::Invalid(format!(
            "the API server minted no token for ServiceAccount {ns}/{sa}"
        )));
    };
    let ca = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get_opt(ROOT_CA)
        .await
        .map_err(Error::kube(format!("reading ConfigMap {ns}/{ROOT_CA}")))?
        .and_then(|cm| cm.data?.remove(CA_KEY))
        .ok_or_else(|| {
            Error::Invalid(format!(
                "ConfigMap {ns}/{ROOT_CA} has no {CA_KEY}, which an offloaded pod needs to \
                 trust this API server"
            ))
        })?;
    let expires = status.expiration_timestamp.0.as_second();
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(BTreeMap::from([
                (labels::TETHER_MANAGED_BY.to_owned(), MANAGED_BY.to_owned()),
                (
                    labels::REMOTE_CLUSTER_ID.to_owned(),
                    octx.ctx.cluster_id().as_str().to_owned(),
                ),
            ])),
            annotations: Some(BTreeMap::from([
                (SERVICE_ACCOUNT.to_owned(), sa.to_owned()),
                (
                    annotations::TOKEN_EXPIRES.to_owned(),
                    status.expiration_timestamp.0.to_string(),
                ),
            ])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            (TOKEN_KEY.to_owned(), ByteString(status.token.into_bytes())),
            (CA_KEY.to_owned(), ByteString(ca.into_bytes())),
            (NAMESPACE_KEY.to_owned(), ByteString(ns.as_bytes().to_vec())),
        ])),
        type_: Some("Opaque".to_owned()),
        ..Default::default()
    };
    let remote = Api::<Secret>::namespaced(access.client.clone(), twin);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let patch = Patch::Apply(&secret);
    // Metadata back only: the token need not cross the link a second time.
    let write = remote.patch_metadata(&name, &params, &patch);
    let outcome = match tokio::time::timeout(CALL, write).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(Error::kube(format!(
            "writing Secret {twin}/{name} at {provider}"
        ))(e)),
        Err(_) => Err(Error::Timeout(format!(
            "writing Secret {twin}/{name} at {provider}"
        ))),
    };
    let metrics = &octx.ctx.metrics;
    match outcome {
        Ok(()) => {
            metrics.reflected("ServiceAccountToken", "applied");
            octx.tokens.record(key, expires);
            tracing::info!(namespace = %ns, service_account = %sa, %provider, twin = %twin, "service account token reflected");
            Ok(name)
        }
        Err(e) => {
            metrics.reflected("ServiceAccountToken", "error");
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_names_fit_and_stay_apart() {
        assert_eq!(secret_name("app"), "tether-token-app");
        let a = "a".repeat(253);
        let mut b = a.clone();
        b.replace_range(252.., "b");
        let (na, nb) = (secret_name(&a), secret_name(&b));
        assert_eq!(na.len(), 253);
        assert_eq!(nb.len(), 253);
        assert_ne!(na, nb);
        assert!(na.starts_with(SECRET_PREFIX));
    }

    #[test]
    fn a_token_is_renewed_with_a_third_of_its_life_left() {
        let m = Minted::default();
        let key = ("p".to_owned(), "t".to_owned(), "sa".to_owned());
        assert!(!m.fresh(&key, 0));
        m.record(key.clone(), LIFETIME);
        assert!(m.fresh(&key, 0));
        assert!(m.fresh(&key, LIFETIME - RENEW_WITH - 1));
        assert!(!m.fresh(&key, LIFETIME - RENEW_WITH));
    }
}
