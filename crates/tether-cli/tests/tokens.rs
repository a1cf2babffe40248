//! `tether generate peer-command`, `tether token list` and `tether token revoke` against an
//! in-process simkube cluster: only the hash is stored, expiry and description are recorded,
//! expired tokens are marked, revocation deletes the Secret.

mod support;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ListParams, PostParams};
use support::Sim;
use tether_api::ClusterId;
use tether_api::names::SYSTEM_NAMESPACE;
use tether_api::peering::{PeeringToken, TOKEN_HASH_KEY};

async fn token_secrets(client: &kube::Client) -> Vec<Secret> {
    Api::<Secret>::namespaced(client.clone(), SYSTEM_NAMESPACE)
        .list(&ListParams::default().labels("tether.dev/peering-token=true"))
        .await
        .expect("list")
        .items
}

#[tokio::test]
async fn peer_command_needs_a_published_identity() {
    let sim = Sim::start("tokens-early").await;
    sim.install("prov-1").await;
    let run = sim.tether(&["generate", "peer-command"]).await;
    run.assert_fails(4, &["has not published", "tether status"]);
    assert!(token_secrets(&sim.client()).await.is_empty());
    // Not installed at all.
    let bare = Sim::start("tokens-bare").await;
    bare.tether(&["token", "list"])
        .await
        .assert_fails(4, &["not installed", "tether install"]);
}

#[tokio::test]
async fn tokens_are_created_listed_and_revoked() {
    let sim = Sim::start("tokens").await;
    let client = sim.client();
    sim.install("prov-1").await;
    sim.fake_controller_ready("prov-1").await;

    let run = sim
        .tether(&[
            "generate",
            "peer-command",
            "--ttl",
            "2h",
            "--description",
            "for west",
        ])
        .await;
    run.assert_code(0);
    let line = run.stdout.trim();
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        words[..4],
        ["tether", "peer", "--auth-url", "https://prov-1.example:443"]
    );
    assert_eq!(words[4], "--token");
    assert_eq!(
        words[6..],
        ["--ca-fingerprint", &support::fingerprint_of("prov-1")]
    );
    let token = PeeringToken::parse(words[5]).expect("a valid token");
    assert_eq!(token.provider(), &ClusterId::new("prov-1").expect("id"));
    assert!(
        run.stderr.contains(&format!("Token {}", token.id())),
        "{}",
        run.stderr
    );

    let secrets = token_secrets(&client).await;
    assert_eq!(secrets.len(), 1);
    let secret = &secrets[0];
    assert_eq!(
        secret.metadata.name.as_deref(),
        Some(token.secret_name().as_str())
    );
    let data = secret.data.clone().expect("data");
    assert_eq!(data.len(), 1, "only the hash is stored");
    let stored = String::from_utf8(data[TOKEN_HASH_KEY].0.clone()).expect("utf-8");
    assert!(token.matches(&stored));
    let ann = secret.metadata.annotations.clone().expect("annotations");
    assert_eq!(ann["tether.dev/description"], "for west");
    let expires: k8s_openapi::jiff::Timestamp =
        ann["tether.dev/expires"].parse().expect("RFC 3339");
    let ttl = expires
        .duration_since(k8s_openapi::jiff::Timestamp::now())
        .as_secs();
    assert!((7000..=7200).contains(&ttl), "expires in {ttl}s");

    // JSON form.
    let run = sim
        .tether(&["generate", "peer-command", "-o", "json"])
        .await;
    run.assert_code(0);
    let v: serde_json::Value = serde_json::from_str(&run.stdout).expect("json");
    let json_token = PeeringToken::parse(v["token"].as_str().expect("token")).expect("valid");
    assert_eq!(v["tokenID"], json_token.id());
    assert_eq!(v["clusterID"], "prov-1");
    assert_eq!(v["authURL"], "https://prov-1.example:443");
    assert!(
        v["command"]
            .as_str()
            .expect("command")
            .contains(&json_token.expose())
    );

    // An expired token, as the controller would find it before deleting it.
    let expired = tether_cli::tokens::token_secret(
        &PeeringToken::generate(ClusterId::new("prov-1").expect("id")),
        "2020-01-01T00:00:00Z".parse().expect("ts"),
        Some("old"),
    );
    let expired_id = expired
        .metadata
        .name
        .clone()
        .expect("name")
        .replace("tether-token-", "");
    Api::<Secret>::namespaced(client.clone(), SYSTEM_NAMESPACE)
        .create(&PostParams::default(), &expired)
        .await
        .expect("create");

    let list = sim.tether(&["token", "list"]).await;
    list.assert_code(0);
    let lines: Vec<&str> = list.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{}", list.stdout);
    assert!(
        lines[0].starts_with("ID ")
            && lines[0].contains("EXPIRES")
            && lines[0].contains("DESCRIPTION")
            && lines[0].ends_with("AGE")
    );
    let row = |id: &str| {
        lines
            .iter()
            .find(|l| l.starts_with(id))
            .copied()
            .unwrap_or_else(|| panic!("no row {id}: {}", list.stdout))
    };
    assert!(row(token.id()).contains("for west") && !row(token.id()).contains("(expired)"));
    assert!(row(&expired_id).contains("2020-01-01T00:00:00Z (expired)"));
    let json = sim.tether(&["token", "list", "-o", "json"]).await;
    let v: serde_json::Value = serde_json::from_str(&json.stdout).expect("json");
    assert_eq!(v.as_array().map(Vec::len), Some(3));

    let revoke = sim.tether(&["token", "revoke", token.id()]).await;
    revoke.assert_code(0);
    assert!(
        revoke
            .stdout
            .contains(&format!("Token {} revoked", token.id()))
    );
    assert_eq!(token_secrets(&client).await.len(), 2);
    sim.tether(&["token", "revoke", token.id()])
        .await
        .assert_fails(4, &["no token", "tether token list"]);
    sim.tether(&["token", "revoke", "NOT-AN-ID"])
        .await
        .assert_fails(2, &["not a token ID"]);
}
