//! The kubeconfig a consumer keeps for its provider, built from the issued identity and the
//! consumer's own key, and the Secret that stores it with its renewal schedule.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::ObjectMeta;
use tether_api::ClusterId;
use tether_api::names::objects;

use crate::auth::protocol::IssuedIdentity;

/// Key of the kubeconfig in the Secret.
pub const KUBECONFIG_KEY: &str = "kubeconfig";
/// Annotation: when the credential expires (Unix seconds).
pub const EXPIRES_AT: &str = "tether.dev/expires-at";
/// Annotation: when to renew it (Unix seconds).
pub const RENEW_AT: &str = "tether.dev/renew-at";
/// Annotation: how many renewals so far.
pub const RENEWALS: &str = "tether.dev/renewals";
/// Annotation: the username.
pub const USERNAME: &str = "tether.dev/username";
/// Annotation: the remote tenant namespace.
pub const REMOTE_NAMESPACE: &str = "tether.dev/remote-namespace";
/// Annotation: the provider's API server.
pub const API_SERVER: &str = "tether.dev/api-server";
/// Annotation: the provider's authentication service (for renewal and revocation).
pub const AUTH_URL: &str = "tether.dev/auth-url";
/// Annotation: the pinned fingerprint of the provider's authentication service.
pub const AUTH_FINGERPRINT: &str = "tether.dev/auth-fingerprint";

/// When to renew a credential valid from `issued` to `expires`: after two thirds of its life,
/// so that a failing renewal has a third of the lifetime to succeed.
pub fn renew_at(issued: i64, expires: i64) -> i64 {
    issued + (expires - issued).max(0) * 2 / 3
}

/// The kubeconfig YAML for `issued` with the consumer's `key_pem`.
pub fn render(provider: &ClusterId, issued: &IssuedIdentity, key_pem: &str) -> String {
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": provider.as_str(),
            "cluster": {
                "server": issued.api_server_url,
                "certificate-authority-data": B64.encode(&issued.ca_data),
            },
        }],
        "users": [{
            "name": issued.username,
            "user": {
                "client-certificate-data": B64.encode(&issued.certificate),
                "client-key-data": B64.encode(key_pem),
            },
        }],
        "contexts": [{
            "name": provider.as_str(),
            "context": {
                "cluster": provider.as_str(),
                "user": issued.username,
                "namespace": issued.namespace,
            },
        }],
        "current-context": provider.as_str(),
    });
    serde_yaml::to_string(&config).unwrap_or_default()
}

/// Points every cluster of `kubeconfig` at `server`, verifying the server's certificate
/// against `tls_server_name` instead of the address: an in-band peering reaches the provider's
/// API server at an address of its external CIDR, which no certificate carries, under the
/// name every API server certificate does. Fails only on YAML that is not a kubeconfig.
pub fn rewrite_server(
    kubeconfig: &str,
    server: &str,
    tls_server_name: &str,
) -> Result<String, String> {
    let mut doc: serde_yaml::Value = serde_yaml::from_str(kubeconfig)
        .map_err(|e| format!("the kubeconfig is unreadable: {e}"))?;
    let clusters = doc
        .get_mut("clusters")
        .and_then(serde_yaml::Value::as_sequence_mut)
        .ok_or("the kubeconfig has no clusters")?;
    for entry in clusters {
        let cluster = entry
            .get_mut("cluster")
            .and_then(serde_yaml::Value::as_mapping_mut)
            .ok_or("a cluster of the kubeconfig has no `cluster` map")?;
        cluster.insert("server".into(), server.into());
        cluster.insert("tls-server-name".into(), tls_server_name.into());
    }
    serde_yaml::to_string(&doc).map_err(|e| format!("writing the kubeconfig: {e}"))
}

/// What the consumer stores: the kubeconfig plus its schedule in annotations.
#[derive(Clone, PartialEq, Eq)]
pub struct Stored {
    /// The kubeconfig YAML.
    pub kubeconfig: String,
    /// Expiry, Unix seconds.
    pub expires_at: i64,
    /// Renewal time, Unix seconds.
    pub renew_at: i64,
    /// Renewals so far.
    pub renewals: u32,
    /// The username on the provider.
    pub username: String,
    /// The tenant namespace on the provider.
    pub remote_namespace: String,
    /// The provider's API server.
    pub api_server: String,
    /// The provider's authentication service.
    pub auth_url: String,
    /// Its pinned certificate fingerprint.
    pub auth_fingerprint: String,
}

impl std::fmt::Debug for Stored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stored")
            .field("kubeconfig", &"<redacted>")
            .field("expires_at", &self.expires_at)
            .field("renew_at", &self.renew_at)
            .field("renewals", &self.renewals)
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

impl Stored {
    /// The record for a freshly issued identity.
    pub fn new(
        provider: &ClusterId,
        issued: &IssuedIdentity,
        key_pem: &str,
        now: i64,
        renewals: u32,
        auth: (&str, &str),
    ) -> Self {
        Self {
            kubeconfig: render(provider, issued, key_pem),
            expires_at: issued.expires_at,
            renew_at: renew_at(now, issued.expires_at),
            renewals,
            username: issued.username.clone(),
            remote_namespace: issued.namespace.clone(),
            api_server: issued.api_server_url.clone(),
            auth_url: auth.0.to_owned(),
            auth_fingerprint: auth.1.to_owned(),
        }
    }

    /// The record with the provider's API server reached in-band at `server` (see
    /// [`rewrite_server`]); the issued address is not kept, since it is unreachable here.
    pub fn in_band(mut self, server: &str) -> Result<Self, String> {
        self.kubeconfig = rewrite_server(
            &self.kubeconfig,
            server,
            tether_api::names::in_band::API_SERVER_NAME,
        )?;
        self.api_server = server.to_owned();
        Ok(self)
    }

    /// The Secret holding this record.
    pub fn to_secret(&self, namespace: &str, labels: BTreeMap<String, String>) -> Secret {
        let annotations = BTreeMap::from([
            (EXPIRES_AT.to_owned(), self.expires_at.to_string()),
            (RENEW_AT.to_owned(), self.renew_at.to_string()),
            (RENEWALS.to_owned(), self.renewals.to_string()),
            (USERNAME.to_owned(), self.username.clone()),
            (REMOTE_NAMESPACE.to_owned(), self.remote_namespace.clone()),
            (API_SERVER.to_owned(), self.api_server.clone()),
            (AUTH_URL.to_owned(), self.auth_url.clone()),
            (AUTH_FINGERPRINT.to_owned(), self.auth_fingerprint.clone()),
        ]);
        Secret {
            metadata: ObjectMeta {
                name: Some(objects::PROVIDER_KUBECONFIG_SECRET.to_owned()),
                namespace: Some(namespace.to_owned()),
                labels: Some(labels),
                annotations: Some(annotations),
                ..Default::default()
            },
            type_: Some("Opaque".to_owned()),
            data: Some(BTreeMap::from([(
                KUBECONFIG_KEY.to_owned(),
                ByteString(self.kubeconfig.clone().into_bytes()),
            )])),
            ..Default::default()
        }
    }

    /// Reads a record back; `None` when the Secret is incomplete.
    pub fn from_secret(s: &Secret) -> Option<Self> {
        let a = s.metadata.annotations.as_ref()?;
        let kubeconfig = String::from_utf8(s.data.as_ref()?.get(KUBECONFIG_KEY)?.0.clone()).ok()?;
        Some(Self {
            kubeconfig,
            expires_at: a.get(EXPIRES_AT)?.parse().ok()?,
            renew_at: a.get(RENEW_AT)?.parse().ok()?,
            renewals: a.get(RENEWALS)?.parse().ok()?,
            username: a.get(USERNAME)?.clone(),
            remote_namespace: a.get(REMOTE_NAMESPACE)?.clone(),
            api_server: a.get(API_SERVER)?.clone(),
            auth_url: a.get(AUTH_URL)?.clone(),
            auth_fingerprint: a.get(AUTH_FINGERPRINT)?.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issued() -> IssuedIdentity {
        IssuedIdentity {
            provider_cluster_id: "p1".into(),
            api_server_url: "https://192.0.2.1:6443".into(),
            ca_data: "CA".into(),
            certificate: "CERT".into(),
            namespace: "tether-tenant-c1".into(),
            username: "tether:consumer:c1".into(),
            expires_at: 1300,
        }
    }

    #[test]
    fn renewal_comes_after_two_thirds_of_the_lifetime() {
        assert_eq!(renew_at(1000, 1300), 1200);
        assert_eq!(renew_at(1000, 1000), 1000);
        assert_eq!(renew_at(1000, 900), 1000);
    }

    #[test]
    fn the_kubeconfig_points_at_the_provider_in_the_tenant_namespace() {
        let p = ClusterId::new("p1").expect("id");
        expect_test::expect![[r#"
            apiVersion: v1
            kind: Config
            clusters:
            - name: p1
              cluster:
                server: https://192.0.2.1:6443
                certificate-authority-data: Q0E=
            users:
            - name: tether:consumer:c1
              user:
                client-certificate-data: Q0VSVA==
                client-key-data: S0VZ
            contexts:
            - name: p1
              context:
                cluster: p1
                user: tether:consumer:c1
                namespace: tether-tenant-c1
            current-context: p1
        "#]]
        .assert_eq(&render(&p, &issued(), "KEY"));
    }

    #[test]
    fn in_band_the_kubeconfig_points_at_the_tunnel_and_verifies_the_api_server_name() {
        let p = ClusterId::new("p1").expect("id");
        let s = Stored::new(&p, &issued(), "KEY", 1000, 0, ("https://a:1", "sha256:00"))
            .in_band("https://10.71.0.1:443")
            .expect("rewritten");
        assert_eq!(s.api_server, "https://10.71.0.1:443");
        expect_test::expect![[r#"
            apiVersion: v1
            kind: Config
            clusters:
            - name: p1
              cluster:
                server: https://10.71.0.1:443
                certificate-authority-data: Q0E=
                tls-server-name: kubernetes.default.svc
            users:
            - name: tether:consumer:c1
              user:
                client-certificate-data: Q0VSVA==
                client-key-data: S0VZ
            contexts:
            - name: p1
              context:
                cluster: p1
                user: tether:consumer:c1
                namespace: tether-tenant-c1
            current-context: p1
        "#]]
        .assert_eq(&s.kubeconfig);
        // kube reads the name back, which is what its TLS connector verifies against.
        let parsed = kube::config::Kubeconfig::from_yaml(&s.kubeconfig).expect("a kubeconfig");
        let cluster = parsed.clusters[0].cluster.as_ref().expect("cluster");
        assert_eq!(
            cluster.tls_server_name.as_deref(),
            Some("kubernetes.default.svc")
        );
        assert!(rewrite_server("clusters: 3", "https://x", "n").is_err());
    }

    #[test]
    fn the_secret_round_trips_and_debug_hides_the_kubeconfig() {
        let p = ClusterId::new("p1").expect("id");
        let s = Stored::new(&p, &issued(), "KEY", 1000, 2, ("https://a:1", "sha256:00"));
        assert_eq!(s.renew_at, 1200);
        let back = Stored::from_secret(&s.to_secret("ns", BTreeMap::new())).expect("parse");
        assert_eq!(back, s);
        assert!(!format!("{s:?}").contains("client-key-data"));
    }
}
