//! The authentication module end to end, in process: two simkube API servers (TLS, RBAC, CSR
//! signer), a controller replica for each, and a ForeignCluster written as `tether peer` writes
//! it. Covers issuing, the provider's records, every refusal (wrong/expired/revoked token,
//! fingerprint, tampered signature, cluster-ID conflicts, rate limiting), renewal and unpeering.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use prometheus_client::registry::Registry;
use simkube::Cluster;
use simkube::controllers::Controllers;
use tether_api::ClusterId;
use tether_api::authentication::{ResourceSlice, Tenant};
use tether_api::conditions as cond;
use tether_api::core::{
    ForeignCluster, ForeignClusterSpec, LocalObjectRef, Modules, Phase, ProviderAccess,
};
use tether_api::names::objects;
use tether_api::peering::{PeeringToken, TOKEN_KEY};
use tether_controllers::auth::client::{AuthClient, ClientError};
use tether_controllers::auth::csr::ClientKey;
use tether_controllers::auth::protocol::{self, IdentityRequest, Reason};
use tether_controllers::identity::Keys;
use tether_controllers::metrics::Metrics;
use tether_controllers::run::{self, Replica};
use tether_testkit::assert_eventually_async;
use tokio_util::sync::CancellationToken;

const NS: &str = "tether-system";

/// One simulated cluster with a running controller replica.
struct Side {
    cluster: Cluster,
    replica: Arc<Replica>,
    stop: CancellationToken,
    id: ClusterId,
}

impl Side {
    async fn start(id: &str, signing: Duration) -> Side {
        // Controller logs go to the test's output (shown for failing tests); RUST_LOG tunes them.
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "info,kube=warn,simkube=warn".into()),
            )
            .try_init();
        let cluster = Cluster::builder()
            .name(id)
            .tls(true)
            .rbac(true)
            .controllers(Controllers::all())
            .cluster_signing_duration(signing)
            .start()
            .await
            .expect("simkube starts");
        let client = cluster.client();
        install_crds(&client).await;
        Api::<Namespace>::all(client.clone())
            .create(
                &PostParams::default(),
                &Namespace {
                    metadata: ObjectMeta {
                        name: Some(NS.into()),
                        ..Default::default()
                    },
                    ..Default::default()
                },
            )
            .await
            .expect("namespace");
        // `tether install` creates the tenant role; the controller binds it per tenant.
        let role = k8s_openapi::api::rbac::v1::ClusterRole {
            metadata: ObjectMeta {
                name: Some(objects::TENANT_ROLE.into()),
                ..Default::default()
            },
            rules: Some(tether_api::rbac::tenant_rules()),
            ..Default::default()
        };
        Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(cluster.client())
            .create(&PostParams::default(), &role)
            .await
            .expect("tenant role");
        let settings = support::settings(NS, cluster.url());
        let stop = CancellationToken::new();
        let id = ClusterId::new(id).expect("id");
        let metrics = Metrics::register(&mut Registry::default());
        let (replica, _tasks) = run::start(
            client,
            id.clone(),
            settings,
            "127.0.0.1:0".parse().expect("addr"),
            metrics,
            stop.clone(),
        )
        .await
        .expect("controller starts");
        let replica = Arc::new(replica);
        let leader = replica.clone();
        let token = stop.clone();
        tokio::spawn(async move { leader.lead(token).await });
        Side {
            cluster,
            replica,
            stop,
            id,
        }
    }

    fn client(&self) -> kube::Client {
        self.cluster.client()
    }

    fn auth_url(&self) -> String {
        format!("https://{}", self.replica.auth_addr)
    }

    fn fingerprint(&self) -> String {
        self.replica.ctx.auth_fingerprint.clone()
    }

    /// What `tether generate peer-command` does: a token whose hash is stored here.
    async fn new_token(&self, expires_in_secs: i64) -> PeeringToken {
        let token = PeeringToken::generate(self.id.clone());
        let expires = k8s_openapi::jiff::Timestamp::now()
            .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(
                expires_in_secs,
            ))
            .expect("time");
        Api::<Secret>::namespaced(self.client(), NS)
            .create(
                &PostParams::default(),
                &tether_api::peering::token_secret(&token, expires, None),
            )
            .await
            .expect("token secret");
        token
    }

    /// What `tether peer` writes on the consumer.
    async fn peer_with(&self, provider: &Side, token: &str, fingerprint: &str) {
        // One Secret per token, as `tether peer` writes it: a new token changes the spec, so
        // the controller retries at once instead of waiting out a failure's back-off.
        let secret_name = match PeeringToken::parse(token) {
            Ok(t) => format!("tether-peering-token-{}-{}", provider.id, t.id()),
            Err(_) => format!("tether-peering-token-{}", provider.id),
        };
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(secret_name.clone()),
                ..Default::default()
            },
            data: Some(BTreeMap::from([(
                TOKEN_KEY.into(),
                ByteString(token.as_bytes().to_vec()),
            )])),
            ..Default::default()
        };
        Api::<Secret>::namespaced(self.client(), NS)
            .patch(
                &secret_name,
                &PatchParams::apply("test").force(),
                &Patch::Apply(&secret),
            )
            .await
            .expect("token secret");
        let fc = ForeignCluster {
            metadata: ObjectMeta {
                name: Some(provider.id.to_string()),
                ..Default::default()
            },
            spec: ForeignClusterSpec {
                cluster_id: provider.id.to_string(),
                provider: Some(ProviderAccess {
                    auth_url: provider.auth_url(),
                    ca_fingerprint: fingerprint.into(),
                    token_secret_ref: Some(LocalObjectRef { name: secret_name }),
                    in_band: false,
                }),
                modules: Modules::default(),
                networking: tether_api::core::NetworkingOptions::default(),
            },
            status: None,
        };
        let mut value = serde_json::to_value(&fc).expect("json");
        value["apiVersion"] = "core.tether.dev/v1alpha1".into();
        value["kind"] = "ForeignCluster".into();
        Api::<ForeignCluster>::all(self.client())
            .patch(
                provider.id.as_str(),
                &PatchParams::apply("test").force(),
                &Patch::Apply(&value),
            )
            .await
            .expect("foreign cluster");
    }

    async fn fc(&self, name: &str) -> Option<ForeignCluster> {
        Api::<ForeignCluster>::all(self.client())
            .get_opt(name)
            .await
            .expect("get fc")
    }

    async fn stop(self) {
        self.stop.cancel();
        self.cluster.shutdown().await;
    }
}

async fn install_crds(client: &kube::Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in tether_api::crds::all() {
        let name = crd.metadata.name.clone().expect("name");
        api.create(&PostParams::default(), &crd).await.expect("crd");
        tokio::time::timeout(
            Duration::from_secs(10),
            await_condition(api.clone(), &name, conditions::is_crd_established()),
        )
        .await
        .expect("established in time")
        .expect("watch");
    }
}

fn auth_condition(fc: &ForeignCluster) -> Option<(String, String, String)> {
    let st = fc.status.as_ref()?;
    let c = cond::find(&st.conditions, cond::types::AUTHENTICATION)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

async fn wait_phase(side: &Side, name: &str, phase: Phase, secs: u64) -> ForeignCluster {
    let mut last = None;
    let deadline =
        tokio::time::Instant::now() + tether_testkit::patience(Duration::from_secs(secs));
    while tokio::time::Instant::now() < deadline {
        if let Some(fc) = side.fc(name).await {
            if fc.status.as_ref().and_then(|s| s.phase) == Some(phase) {
                return fc;
            }
            last = Some(fc);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "ForeignCluster {name} on {} never reached {phase:?}; last: {:#?}",
        side.id,
        last.and_then(|f| f.status)
    );
}

async fn pair() -> (Side, Side) {
    let provider = Side::start("prov", Duration::from_secs(365 * 86400)).await;
    let consumer = Side::start("cons", Duration::from_secs(365 * 86400)).await;
    (provider, consumer)
}

#[tokio::test]
async fn a_token_peering_issues_a_confined_identity_and_unpeering_revokes_it() {
    let (provider, consumer) = pair().await;
    let token = provider.new_token(3600).await;
    consumer
        .peer_with(&provider, &token.expose(), &provider.fingerprint())
        .await;
    let fc = wait_phase(&consumer, "prov", Phase::Established, 30).await;
    let (status, reason, message) = auth_condition(&fc).expect("condition");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "IdentityIssued"),
        "{message}"
    );
    let st = fc.status.clone().expect("status");
    assert_eq!(st.role, Some(tether_api::core::Role::Provider));
    assert!(
        cond::is_true(&st.conditions, cond::types::API_SERVER_REACHABLE),
        "{:#?}",
        st.conditions
    );
    assert_eq!(
        st.identity.as_ref().expect("identity").username,
        "tether:consumer:cons"
    );
    assert_eq!(
        st.tenant_namespace
            .as_ref()
            .and_then(|t| t.remote.clone())
            .as_deref(),
        Some("tether-tenant-cons")
    );

    // The provider recorded the tenant, its namespace and binding, and shows the consumer.
    let tenant = Api::<Tenant>::all(provider.client())
        .get("cons")
        .await
        .expect("tenant");
    assert_eq!(
        tenant.spec.public_key,
        consumer.replica.ctx.identity.keys.public_key_b64()
    );
    assert_eq!(tenant.status.as_ref().map(|s| s.identities_issued), Some(1));
    Api::<RoleBinding>::namespaced(provider.client(), "tether-tenant-cons")
        .get(objects::TENANT_ROLE)
        .await
        .expect("tenant role binding");
    let pfc = wait_phase(&provider, "cons", Phase::Established, 15).await;
    assert_eq!(
        pfc.status.and_then(|s| s.role),
        Some(tether_api::core::Role::Consumer)
    );
    // The consumer's copy of the token is gone once used.
    let token_secret = format!("tether-peering-token-prov-{}", token.id());
    assert!(
        Api::<Secret>::namespaced(consumer.client(), NS)
            .get_opt(&token_secret)
            .await
            .expect("get")
            .is_none()
    );

    // Re-applying the same spec changes nothing: no second identity is issued.
    consumer
        .peer_with(&provider, &token.expose(), &provider.fingerprint())
        .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let tenant = Api::<Tenant>::all(provider.client())
        .get("cons")
        .await
        .expect("tenant");
    assert_eq!(tenant.status.as_ref().map(|s| s.identities_issued), Some(1));

    // The stored kubeconfig works against the provider within the tenant namespace.
    let secret = Api::<Secret>::namespaced(consumer.client(), "tether-tenant-prov")
        .get(objects::PROVIDER_KUBECONFIG_SECRET)
        .await
        .expect("kubeconfig secret");
    let kubeconfig =
        String::from_utf8(secret.data.expect("data")["kubeconfig"].0.clone()).expect("utf8");
    let issued = client_from_kubeconfig(&kubeconfig).await;

    // Unpeer: delete the ForeignCluster on the consumer.
    Api::<ForeignCluster>::all(consumer.client())
        .delete("prov", &DeleteParams::default())
        .await
        .expect("delete fc");
    assert_eventually_async!(
        consumer.fc("prov").await.is_none(),
        Duration::from_secs(20),
        "the consumer's ForeignCluster goes away"
    );
    assert_eventually_async!(
        Api::<Tenant>::all(provider.client())
            .get_opt("cons")
            .await
            .expect("get")
            .is_none(),
        Duration::from_secs(20),
        "the provider's Tenant goes away"
    );
    assert_eventually_async!(
        provider.fc("cons").await.is_none(),
        Duration::from_secs(20),
        "the provider's ForeignCluster goes away"
    );
    assert_eventually_async!(
        Api::<Namespace>::all(consumer.client())
            .get_opt("tether-tenant-prov")
            .await
            .expect("get")
            .is_none(),
        Duration::from_secs(30),
        "the consumer's tenant namespace goes away"
    );
    let denied = Api::<ResourceSlice>::namespaced(issued, "tether-tenant-cons")
        .list(&Default::default())
        .await;
    match denied {
        Err(kube::Error::Api(e)) => assert!(e.code == 403 || e.code == 401, "{e:?}"),
        other => panic!("the revoked identity still works: {other:?}"),
    }
    provider.stop().await;
    consumer.stop().await;
}

async fn client_from_kubeconfig(yaml: &str) -> kube::Client {
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(yaml).expect("kubeconfig"),
        &Default::default(),
    )
    .await
    .expect("config");
    kube::Client::try_from(config).expect("client")
}

#[tokio::test]
async fn bad_tokens_and_fingerprints_fail_with_a_reason_and_create_nothing_on_the_provider() {
    let (provider, consumer) = pair().await;

    // A token the provider never issued.
    let forged = PeeringToken::generate(provider.id.clone());
    consumer
        .peer_with(&provider, &forged.expose(), &provider.fingerprint())
        .await;
    let fc = wait_phase(&consumer, "prov", Phase::Failed, 20).await;
    let (_, reason, message) = auth_condition(&fc).expect("condition");
    assert_eq!(reason, "TokenRejected", "{message}");
    assert!(
        message.contains("unknown here") && message.contains("tether generate peer-command"),
        "{message}"
    );

    // An expired one.
    let expired = provider.new_token(-10).await;
    consumer
        .peer_with(&provider, &expired.expose(), &provider.fingerprint())
        .await;
    assert_eventually_async!(
        consumer
            .fc("prov")
            .await
            .and_then(|f| auth_condition(&f))
            .is_some_and(|(_, _, m)| m.contains("has expired")),
        Duration::from_secs(20),
        "an expired token is refused as expired"
    );

    // A revoked one (its Secret deleted, as `tether token revoke` does).
    let revoked = provider.new_token(3600).await;
    Api::<Secret>::namespaced(provider.client(), NS)
        .delete(&revoked.secret_name(), &DeleteParams::default())
        .await
        .expect("revoke");
    consumer
        .peer_with(&provider, &revoked.expose(), &provider.fingerprint())
        .await;
    assert_eventually_async!(
        consumer
            .fc("prov")
            .await
            .and_then(|f| auth_condition(&f))
            .is_some_and(|(_, r, m)| r == "TokenRejected" && m.contains(revoked.id())),
        Duration::from_secs(20),
        "a revoked token is refused"
    );

    // A good token with the wrong fingerprint never reaches the provider's logic.
    let good = provider.new_token(3600).await;
    let wrong = format!("sha256:{}", "ab".repeat(32));
    consumer.peer_with(&provider, &good.expose(), &wrong).await;
    assert_eventually_async!(
        consumer
            .fc("prov")
            .await
            .and_then(|f| auth_condition(&f))
            .is_some_and(
                |(_, r, m)| r == "FingerprintMismatch" && m.contains(&provider.fingerprint())
            ),
        Duration::from_secs(20),
        "a wrong fingerprint is named with the one presented"
    );

    // Nothing was created on the provider by any of these attempts.
    assert!(
        Api::<Tenant>::all(provider.client())
            .list(&Default::default())
            .await
            .expect("list")
            .items
            .is_empty()
    );
    assert!(provider.fc("cons").await.is_none());
    assert!(
        Api::<Namespace>::all(provider.client())
            .get_opt("tether-tenant-cons")
            .await
            .expect("get")
            .is_none()
    );

    // With the right fingerprint the same good token works.
    consumer
        .peer_with(&provider, &good.expose(), &provider.fingerprint())
        .await;
    wait_phase(&consumer, "prov", Phase::Established, 30).await;
    provider.stop().await;
    consumer.stop().await;
}

fn request(
    keys: &Keys,
    consumer: &str,
    provider: &str,
    nonce: &str,
    token: Option<String>,
) -> IdentityRequest {
    let csr = ClientKey::generate(&format!("tether:consumer:{consumer}")).expect("csr");
    let payload = protocol::identity_payload(nonce, consumer, provider, &csr.csr_pem);
    IdentityRequest {
        cluster_id: consumer.into(),
        public_key: keys.public_key_b64(),
        nonce: nonce.into(),
        csr: csr.csr_pem,
        signature: keys.sign_b64(&payload),
        token,
    }
}

fn refused(r: Result<impl std::fmt::Debug, ClientError>) -> (Reason, String) {
    match r {
        Err(ClientError::Refused {
            reason, message, ..
        }) => (reason, message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn the_provider_refuses_tampering_conflicts_and_guessing() {
    let provider = Side::start("prov", Duration::from_secs(365 * 86400)).await;
    let client = AuthClient::new(&provider.auth_url(), &provider.fingerprint()).expect("client");
    let id = client.identity().await.expect("identity");
    assert_eq!(id.cluster_id, "prov");
    let keys = Keys::generate().expect("keys");
    let token = provider.new_token(3600).await;

    // A tampered signature.
    let nonce = client.nonce("c1").await.expect("nonce").nonce;
    let mut req = request(&keys, "c1", "prov", &nonce, Some(token.expose()));
    req.csr = ClientKey::generate("tether:consumer:c1")
        .expect("csr")
        .csr_pem;
    let (reason, message) = refused(client.issue(&req).await);
    assert_eq!(reason, Reason::SignatureRejected, "{message}");

    // A CSR asking for another name.
    let nonce = client.nonce("c1").await.expect("nonce").nonce;
    let mut req = request(&keys, "c1", "prov", &nonce, Some(token.expose()));
    let other = ClientKey::generate("system:admin").expect("csr").csr_pem;
    req.signature = keys.sign_b64(&protocol::identity_payload(&nonce, "c1", "prov", &other));
    req.csr = other;
    let (reason, message) = refused(client.issue(&req).await);
    assert_eq!(reason, Reason::CsrRejected, "{message}");

    // A consumer claiming the provider's own ID.
    let nonce = client.nonce("prov").await.expect("nonce").nonce;
    let (reason, message) = refused(
        client
            .issue(&request(
                &keys,
                "prov",
                "prov",
                &nonce,
                Some(token.expose()),
            ))
            .await,
    );
    assert_eq!(reason, Reason::ClusterIdConflict, "{message}");
    assert!(message.contains("--cluster-id"), "{message}");

    // A nonce issued to another cluster.
    let nonce = client.nonce("c2").await.expect("nonce").nonce;
    let (reason, _) = refused(
        client
            .issue(&request(&keys, "c1", "prov", &nonce, Some(token.expose())))
            .await,
    );
    assert_eq!(reason, Reason::NonceRejected);

    // A good request succeeds; the same ID with another key is then a conflict.
    let nonce = client.nonce("c1").await.expect("nonce").nonce;
    let issued = client
        .issue(&request(&keys, "c1", "prov", &nonce, Some(token.expose())))
        .await
        .expect("issued");
    assert_eq!(issued.username, "tether:consumer:c1");
    let impostor = Keys::generate().expect("keys");
    let nonce = client.nonce("c1").await.expect("nonce").nonce;
    let (reason, message) = refused(
        client
            .issue(&request(
                &impostor,
                "c1",
                "prov",
                &nonce,
                Some(token.expose()),
            ))
            .await,
    );
    assert_eq!(reason, Reason::ClusterIdConflict, "{message}");
    // A renewal by the real key needs no token.
    let nonce = client.nonce("c1").await.expect("nonce").nonce;
    client
        .issue(&request(&keys, "c1", "prov", &nonce, None))
        .await
        .expect("renewal without token");
    // A first peering without a token is refused.
    let nonce = client.nonce("c3").await.expect("nonce").nonce;
    let (reason, _) = refused(
        client
            .issue(&request(
                &Keys::generate().expect("keys"),
                "c3",
                "prov",
                &nonce,
                None,
            ))
            .await,
    );
    assert_eq!(reason, Reason::TokenRejected);

    // Guessing tokens: after five failures from this address, 429 with Retry-After.
    let mut last = None;
    for i in 0..7 {
        let guess = PeeringToken::generate(provider.id.clone()).expose();
        let nonce = match client.nonce("c9").await {
            Ok(n) => n.nonce,
            Err(e) => {
                last = Some((i, e));
                break;
            }
        };
        if let Err(e) = client
            .issue(&request(&keys, "c9", "prov", &nonce, Some(guess)))
            .await
        {
            last = Some((i, e));
        }
    }
    // Three credential failures happened above (tampered signature, foreign nonce, missing
    // token); the limit of five is reached after two guesses, so the third is refused.
    match last {
        Some((
            i,
            ClientError::Refused {
                reason: Reason::RateLimited,
                retry_after,
                ..
            },
        )) => {
            assert_eq!(i, 2, "limited at the wrong attempt");
            assert!(
                retry_after.is_some_and(|s| (1..=60).contains(&s)),
                "{retry_after:?}"
            );
        }
        other => panic!("expected rate limiting, got {other:?}"),
    }
    provider.stop().await;
}

#[tokio::test]
async fn the_identity_is_renewed_before_it_expires_and_the_peering_keeps_working() {
    // The provider's signer caps certificates at 30 s; renewal comes at two thirds of that.
    let provider = Side::start("prov", Duration::from_secs(30)).await;
    let consumer = Side::start("cons", Duration::from_secs(365 * 86400)).await;
    let token = provider.new_token(3600).await;
    consumer
        .peer_with(&provider, &token.expose(), &provider.fingerprint())
        .await;
    wait_phase(&consumer, "prov", Phase::Established, 30).await;
    let mut seen_expiries = Vec::new();
    let deadline = tokio::time::Instant::now() + tether_testkit::patience(Duration::from_secs(90));
    loop {
        let fc = consumer.fc("prov").await.expect("fc");
        let st = fc.status.clone().expect("status");
        let identity = st.identity.clone().expect("identity");
        assert!(
            cond::is_true(&st.conditions, cond::types::AUTHENTICATION),
            "{:#?}",
            st.conditions
        );
        if !seen_expiries.contains(&identity.expires_at) {
            seen_expiries.push(identity.expires_at.clone());
        }
        if identity.renewals >= 3 {
            assert!(
                cond::is_true(&st.conditions, cond::types::API_SERVER_REACHABLE),
                "{:#?}",
                st.conditions
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} renewals: {st:#?}",
            identity.renewals
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(seen_expiries.len() >= 3, "{seen_expiries:?}");
    let tenant = Api::<Tenant>::all(provider.client())
        .get("cons")
        .await
        .expect("tenant");
    assert!(tenant.status.expect("status").identities_issued >= 4);
    provider.stop().await;
    consumer.stop().await;
}
