//! `tether peer` and `tether unpeer` against two in-process simkube clusters, with a stand-in
//! for the controllers' side of the contract: the checks that refuse before anything is
//! written (and write nothing), the objects a peering writes, the wait, cleanup after a
//! failure, the idempotent re-run, and unpeer with and without `--force`.

mod support;

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::Api;
use kube::api::{ListParams, PostParams};
use support::{Answer, Sim, answer_foreign_clusters, fingerprint_of, unreachable_kubeconfig};
use tether_api::ClusterId;
use tether_api::core::ForeignCluster;
use tether_api::names::SYSTEM_NAMESPACE;
use tether_api::peering::PeeringToken;

/// Two installed clusters whose controllers report ready.
async fn pair(name: &str, consumer_id: &str, provider_id: &str) -> (Sim, Sim) {
    let consumer = Sim::start(&format!("{name}-c")).await;
    let provider = Sim::start(&format!("{name}-p")).await;
    consumer.install(consumer_id).await;
    provider.install(provider_id).await;
    consumer.fake_controller_ready(consumer_id).await;
    provider.fake_controller_ready(provider_id).await;
    (consumer, provider)
}

async fn foreign_clusters(client: &kube::Client) -> Vec<String> {
    Api::<ForeignCluster>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .filter_map(|f| f.metadata.name)
        .collect()
}

async fn secret_names(client: &kube::Client) -> Vec<String> {
    let mut names: Vec<String> = Api::<Secret>::namespaced(client.clone(), SYSTEM_NAMESPACE)
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .filter_map(|s| s.metadata.name)
        // `tether install` writes the admission webhook's certificate; a peering does not.
        .filter(|n| n != tether_api::names::objects::WEBHOOK_TLS_SECRET)
        .collect();
    names.sort();
    names
}

/// Nothing a peering writes exists on either side.
async fn assert_nothing_written(consumer: &Sim, provider: Option<&Sim>) {
    assert_eq!(
        foreign_clusters(&consumer.client()).await,
        Vec::<String>::new()
    );
    assert_eq!(secret_names(&consumer.client()).await, Vec::<String>::new());
    if let Some(p) = provider {
        assert_eq!(foreign_clusters(&p.client()).await, Vec::<String>::new());
        assert_eq!(secret_names(&p.client()).await, Vec::<String>::new());
    }
}

fn token_for(provider: &str) -> String {
    PeeringToken::generate(ClusterId::new(provider).expect("id")).expose()
}

#[tokio::test]
async fn checks_refuse_before_anything_is_written() {
    let (consumer, provider) = pair("checks", "west-1", "east-1").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let gone = unreachable_kubeconfig(dir.path());
    let gone = gone.to_str().expect("utf-8");

    // The same cluster twice.
    consumer
        .tether(&[
            "peer",
            "--modules",
            "authentication",
            "--remote-kubeconfig",
            consumer.kubeconfig(),
        ])
        .await
        .assert_fails(2, &["cannot peer cluster west-1 with itself"]);
    // Token form naming this cluster, with its own fingerprint.
    let own = fingerprint_of("west-1");
    consumer
        .tether(&[
            "peer",
            "--modules",
            "authentication",
            "--auth-url",
            "https://west-1.example:443",
            "--token",
            &token_for("west-1"),
            "--ca-fingerprint",
            &own,
        ])
        .await
        .assert_fails(2, &["with itself"]);
    // Token form naming this cluster's ID, from another cluster.
    consumer
        .tether(&[
            "peer",
            "--modules",
            "authentication",
            "--auth-url",
            "https://other.example:443",
            "--token",
            &token_for("west-1"),
            "--ca-fingerprint",
            &fingerprint_of("other"),
        ])
        .await
        .assert_fails(
            4,
            &["both clusters have the cluster ID west-1", "--cluster-id"],
        );
    // An unreachable provider kubeconfig.
    consumer
        .tether(&[
            "peer",
            "--modules",
            "authentication",
            "--remote-kubeconfig",
            gone,
        ])
        .await
        .assert_fails(3, &["cannot reach the remote cluster's API server"]);
    // Malformed input.
    consumer
        .tether(&[
            "peer",
            "--modules",
            "authentication",
            "--auth-url",
            "https://east-1.example:443",
            "--token",
            "east-1.short.x",
            "--ca-fingerprint",
            &fingerprint_of("east-1"),
        ])
        .await
        .assert_fails(2, &["malformed peering token"]);
    consumer
        .tether(&[
            "peer",
            "--modules",
            "authentication",
            "--auth-url",
            "https://east-1.example:443",
            "--token",
            &token_for("east-1"),
            "--ca-fingerprint",
            "sha256:12",
        ])
        .await
        .assert_fails(2, &["64 hex digits"]);
    assert_nothing_written(&consumer, Some(&provider)).await;

    // Two clusters installed with the same ID.
    let twin = Sim::start("checks-twin").await;
    twin.install("west-1").await;
    twin.fake_controller_ready("west-1").await;
    consumer
        .tether(&[
            "peer",
            "--modules",
            "authentication",
            "--remote-kubeconfig",
            twin.kubeconfig(),
        ])
        .await
        .assert_fails(
            4,
            &[
                "both clusters have the cluster ID west-1",
                "tether install --cluster-id",
            ],
        );
    assert_nothing_written(&consumer, Some(&twin)).await;

    // A provider where Tether is not installed.
    let bare = Sim::start("checks-bare").await;
    consumer
        .tether(&[
            "peer",
            "--modules",
            "authentication",
            "--remote-kubeconfig",
            bare.kubeconfig(),
        ])
        .await
        .assert_fails(
            4,
            &["not installed in the remote cluster", "tether install"],
        );
    assert_nothing_written(&consumer, None).await;
}

#[tokio::test]
async fn peering_with_two_kubeconfigs_writes_the_contract_and_a_rerun_changes_nothing() {
    let (consumer, provider) = pair("kubeconfigs", "west-1", "east-1").await;
    let answers = answer_foreign_clusters(consumer.client(), Answer::Authenticate);
    let run = consumer
        .tether(&[
            "peer",
            "--modules",
            "authentication",
            "--remote-kubeconfig",
            provider.kubeconfig(),
            "--timeout",
            "30s",
        ])
        .await;
    run.assert_code(0);
    assert!(run.stdout.contains("Peered with east-1"), "{}", run.stdout);
    for needle in [
        "token ",
        "created on the provider",
        "ForeignCluster east-1 written",
        "phase Established",
        "Authentication True (IdentityIssued)",
    ] {
        assert!(
            run.stderr.contains(needle),
            "stderr lacks {needle:?}:\n{}",
            run.stderr
        );
    }

    let fcs: Api<ForeignCluster> = Api::all(consumer.client());
    let fc = fcs.get("east-1").await.expect("ForeignCluster east-1");
    let mut spec = serde_json::to_value(&fc.spec).expect("json");
    // The token Secret is named after the token's ID, so a new token changes the spec.
    let token_secret = spec["provider"]["tokenSecretRef"]["name"]
        .as_str()
        .expect("tokenSecretRef")
        .to_owned();
    assert!(
        token_secret.starts_with("tether-peering-token-east-1-"),
        "{token_secret}"
    );
    spec["provider"]["tokenSecretRef"]["name"] = "<token secret>".into();
    assert_eq!(
        spec,
        serde_json::json!({
            "clusterID": "east-1",
            "provider": {
                "authURL": "https://east-1.example:443",
                "caFingerprint": fingerprint_of("east-1"),
                "tokenSecretRef": {"name": "<token secret>"},
            },
            "modules": {
                "authentication": {"enabled": true},
                "networking": {"enabled": false},
                "offloading": {"enabled": false},
            },
            "networking": {"gatewayServer": "Auto", "serviceType": "LoadBalancer", "port": 51840},
        })
    );
    let secret = Api::<Secret>::namespaced(consumer.client(), SYSTEM_NAMESPACE)
        .get(&token_secret)
        .await
        .expect("token Secret");
    let token = String::from_utf8(secret.data.expect("data")["token"].0.clone()).expect("utf-8");
    let token = PeeringToken::parse(&token).expect("a full token");
    assert_eq!(token.provider().as_str(), "east-1");
    assert_eq!(
        token_secret,
        format!("tether-peering-token-east-1-{}", token.id())
    );
    // The short-lived provider token is gone once the peering is done.
    assert_eq!(secret_names(&provider.client()).await, Vec::<String>::new());

    let rv = fc.metadata.resource_version.clone();
    let again = consumer
        .tether(&[
            "peer",
            "--modules",
            "authentication",
            "--remote-kubeconfig",
            provider.kubeconfig(),
        ])
        .await;
    again.assert_code(0);
    assert!(
        again
            .stdout
            .contains("Already peered with east-1; nothing changed"),
        "{}",
        again.stdout
    );
    assert_eq!(
        fcs.get("east-1")
            .await
            .expect("fc")
            .metadata
            .resource_version,
        rv
    );
    assert_eq!(secret_names(&provider.client()).await, Vec::<String>::new());
    answers.abort();
}

#[tokio::test]
async fn a_rejected_token_fails_with_its_message_and_removes_what_the_run_created() {
    let (consumer, _provider) = pair("rejected", "west-1", "east-1").await;
    let answers = answer_foreign_clusters(consumer.client(), Answer::RejectToken);
    let run = consumer
        .tether(&[
            "peer",
            "--modules",
            "authentication",
            "--auth-url",
            "https://east-1.example:443",
            "--token",
            &token_for("east-1"),
            "--ca-fingerprint",
            &fingerprint_of("east-1"),
            "--timeout",
            "30s",
        ])
        .await;
    run.assert_fails(4, &[
        "peering with east-1 failed: Authentication: TokenRejected: the provider rejected the token",
        "removed ForeignCluster east-1, Secret tether-system/tether-peering-token-east-1",
    ]);
    answers.abort();
    assert_nothing_written(&consumer, None).await;
}

#[tokio::test]
async fn a_peering_that_never_completes_times_out_and_cleans_up_both_sides() {
    let (consumer, provider) = pair("timeout", "west-1", "east-1").await;
    let run = consumer
        .tether(&[
            "peer",
            "--modules",
            "authentication",
            "--remote-kubeconfig",
            provider.kubeconfig(),
            "--timeout",
            "2s",
        ])
        .await;
    run.assert_fails(
        4,
        &[
            "did not complete in time",
            "https://east-1.example:443",
            "no status yet",
        ],
    );
    assert_nothing_written(&consumer, Some(&provider)).await;
}

#[tokio::test]
async fn unpeer_deletes_the_foreign_cluster_and_force_removes_the_local_side() {
    let (consumer, provider) = pair("unpeer", "west-1", "east-1").await;
    let fcs: Api<ForeignCluster> = Api::all(consumer.client());
    let fingerprint = fingerprint_of("east-1");
    let east = ClusterId::new("east-1").expect("id");
    fcs.create(
        &PostParams::default(),
        &tether_cli::peer::foreign_cluster(
            &east,
            "https://east-1.example:443",
            &fingerprint,
            &tether_api::peering::PeeringToken::generate(east.clone()),
        ),
    )
    .await
    .expect("create");

    // Without a finalizer (as after the controller finished) the object just goes; with the
    // provider's kubeconfig the provider side is checked too (nothing there).
    let run = consumer
        .tether(&[
            "unpeer",
            "--remote-kubeconfig",
            provider.kubeconfig(),
            "--timeout",
            "20s",
        ])
        .await;
    run.assert_code(0);
    assert!(
        run.stderr.contains("ForeignCluster east-1 gone"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("the provider's side is gone"),
        "{}",
        run.stderr
    );
    assert!(foreign_clusters(&consumer.client()).await.is_empty());
    // Nothing to unpeer is fine.
    consumer
        .tether(&["unpeer", "--remote-cluster-id", "east-1", "--timeout", "5s"])
        .await
        .assert_code(0);

    // A finalizer nobody removes (the provider is unreachable): plain unpeer times out and
    // suggests --force; --force removes the local side only and says so.
    let mut held = tether_cli::peer::foreign_cluster(
        &east,
        "https://east-1.example:443",
        &fingerprint,
        &tether_api::peering::PeeringToken::generate(east.clone()),
    );
    held.metadata.finalizers = Some(vec![tether_api::names::finalizers::PEERING.to_owned()]);
    fcs.create(&PostParams::default(), &held)
        .await
        .expect("create");
    let ns: Api<Namespace> = Api::all(consumer.client());
    ns.create(
        &PostParams::default(),
        &serde_json::from_value(serde_json::json!({"metadata": {"name": "tether-tenant-east-1"}}))
            .expect("namespace"),
    )
    .await
    .expect("tenant namespace");
    let dir = tempfile::tempdir().expect("tempdir");
    let gone = unreachable_kubeconfig(dir.path());
    consumer
        .tether(&[
            "unpeer",
            "--remote-kubeconfig",
            gone.to_str().expect("utf-8"),
        ])
        .await
        .assert_fails(3, &["pass --force to remove the local side only"]);
    consumer
        .tether(&["unpeer", "--remote-cluster-id", "east-1", "--timeout", "2s"])
        .await
        .assert_fails(4, &["was not removed in time", "tether unpeer --force"]);
    let forced = consumer
        .tether(&[
            "unpeer",
            "--remote-cluster-id",
            "east-1",
            "--force",
            "--timeout",
            "30s",
        ])
        .await;
    forced.assert_code(0);
    for needle in [
        "removing the ForeignCluster's finalizers",
        "deleted the local tenant namespace tether-tenant-east-1",
        "removed the local side only",
    ] {
        assert!(
            forced.stderr.contains(needle),
            "stderr lacks {needle:?}:\n{}",
            forced.stderr
        );
    }
    assert!(foreign_clusters(&consumer.client()).await.is_empty());
}
