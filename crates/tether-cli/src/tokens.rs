//! Peering tokens on the provider: the token Secret (only the hash is stored), `tether token
//! list` rows, creation and revocation.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde::Serialize;
use tether_api::ClusterId;
use tether_api::names::{SYSTEM_NAMESPACE, annotations, labels};
use tether_api::peering::{self, PeeringToken};

use crate::error::{Error, Result, is_not_found};
use crate::text;

/// The provider's Secret for a token (the layout lives in `tether_api::peering`).
pub use tether_api::peering::token_secret;

/// RFC 3339 in UTC, whole seconds.
pub fn rfc3339(t: Timestamp) -> String {
    let whole = Timestamp::from_second(t.as_second()).unwrap_or(t);
    whole.to_string()
}

/// A token as `tether token list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenInfo {
    /// The public token ID.
    pub id: String,
    /// When it expires.
    pub expires: Option<String>,
    /// Whether it has expired.
    pub expired: bool,
    /// The `--description`.
    pub description: Option<String>,
    /// When it was created.
    pub created: Option<String>,
}

/// Reads a token Secret.
pub fn token_info(secret: &Secret, now: Timestamp) -> Option<TokenInfo> {
    let name = secret.metadata.name.as_deref()?;
    let id = name.strip_prefix(peering::TOKEN_SECRET_PREFIX)?.to_owned();
    let ann = secret.metadata.annotations.clone().unwrap_or_default();
    let expires = ann.get(annotations::TOKEN_EXPIRES).cloned();
    let expired = expires
        .as_deref()
        .and_then(|e| e.parse::<Timestamp>().ok())
        .is_some_and(|e| e <= now);
    Some(TokenInfo {
        id,
        expires,
        expired,
        description: ann.get(annotations::TOKEN_DESCRIPTION).cloned(),
        created: secret
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| rfc3339(t.0)),
    })
}

/// The `tether token list` table.
pub fn render_list(tokens: &[TokenInfo], now: Timestamp) -> String {
    if tokens.is_empty() {
        return "No peering tokens. Create one with `tether generate peer-command`.\n".to_owned();
    }
    let rows: Vec<Vec<String>> = tokens
        .iter()
        .map(|t| {
            let expires = match (&t.expires, t.expired) {
                (Some(e), true) => format!("{e} (expired)"),
                (Some(e), false) => e.clone(),
                (None, _) => "never".to_owned(),
            };
            vec![
                t.id.clone(),
                expires,
                t.description.clone().unwrap_or_default(),
                t.created
                    .as_deref()
                    .and_then(|c| c.parse::<Timestamp>().ok())
                    .map(|c| text::age(since(c, now)))
                    .unwrap_or_else(|| "<unknown>".to_owned()),
            ]
        })
        .collect();
    text::table(&["ID", "EXPIRES", "DESCRIPTION", "AGE"], &rows)
}

/// `now - then`, zero when `then` is in the future.
pub fn since(then: Timestamp, now: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(then)).unwrap_or(Duration::ZERO)
}

/// Creates a token for `cluster_id` valid for `ttl`; returns it and its expiry.
pub async fn create(
    client: &kube::Client,
    cluster_id: &ClusterId,
    ttl: Duration,
    description: Option<&str>,
) -> Result<(PeeringToken, Timestamp)> {
    let ttl = SignedDuration::try_from(ttl)
        .map_err(|_| Error::Usage("the token lifetime is too long".to_owned()))?;
    let expires = Timestamp::now()
        .checked_add(ttl)
        .map_err(|_| Error::Usage("the token lifetime is too long".to_owned()))?;
    let api: Api<Secret> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    // A collision of random IDs is astronomically unlikely; a retry makes it harmless.
    for _ in 0..3 {
        let token = PeeringToken::generate(cluster_id.clone());
        let secret = token_secret(&token, expires, description);
        match api.create(&PostParams::default(), &secret).await {
            Ok(_) => return Ok((token, expires)),
            Err(e) if crate::error::is_conflict(&e) => continue,
            Err(e) => {
                return Err(Error::api(format!(
                    "creating the token Secret in {SYSTEM_NAMESPACE}"
                ))(e));
            }
        }
    }
    Err(Error::Check(
        "could not find a free token ID; try again".to_owned(),
    ))
}

/// Every token of this cluster, oldest first.
pub async fn list(client: &kube::Client) -> Result<Vec<TokenInfo>> {
    let api: Api<Secret> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let secrets = api
        .list(&ListParams::default().labels(&format!("{}=true", labels::PEERING_TOKEN)))
        .await
        .map_err(Error::api(format!(
            "listing token Secrets in {SYSTEM_NAMESPACE}"
        )))?;
    let now = Timestamp::now();
    let mut tokens: Vec<TokenInfo> = secrets
        .items
        .iter()
        .filter_map(|s| token_info(s, now))
        .collect();
    tokens.sort_by(|a, b| a.created.cmp(&b.created).then(a.id.cmp(&b.id)));
    Ok(tokens)
}

/// Deletes token `id`'s Secret.
pub async fn revoke(client: &kube::Client, id: &str) -> Result<()> {
    let valid = id.len() == peering::TOKEN_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if !valid {
        return Err(Error::Usage(format!(
            "{id:?} is not a token ID: IDs are 6 lower-case letters or digits, as `tether token \
             list` shows them (the middle part of a token)"
        )));
    }
    let api: Api<Secret> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let name = peering::token_secret_name(id);
    match api.delete(&name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => Err(Error::Check(format!(
            "there is no token {id} in this cluster (it may have expired and been deleted); \
             `tether token list` shows the tokens"
        ))),
        Err(e) => Err(Error::api(format!(
            "deleting Secret {SYSTEM_NAMESPACE}/{name}"
        ))(e)),
    }
}

/// The line a consumer's admin runs.
pub fn peer_command(auth_url: &str, token: &PeeringToken, fingerprint: &str) -> String {
    format!(
        "tether peer --auth-url {auth_url} --token {} --ca-fingerprint {fingerprint}",
        token.expose()
    )
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    #[test]
    fn the_secret_stores_only_the_hash_with_expiry_and_description() {
        let token =
            PeeringToken::parse("prov-1.abc123.0123456789abcdefghijklmnopqrstuv").expect("token");
        let secret = token_secret(&token, ts("2030-01-02T03:04:05.678Z"), Some("for west"));
        let yaml = serde_yaml::to_string(&secret).expect("yaml");
        assert!(!yaml.contains("0123456789abcdefghijklmnopqrstuv"), "{yaml}");
        expect![[r#"
            apiVersion: v1
            kind: Secret
            data:
              tokenHash: M2ViZDZjYTVjNzNhZjg0MTU3NzljN2JkMmM4YmM5MzhlZTI5MGQzYThjZjU5ZGQwZDkyNjNmZGVlMzBiZjQxNg==
            metadata:
              annotations:
                tether.dev/description: for west
                tether.dev/expires: 2030-01-02T03:04:05Z
              labels:
                app.kubernetes.io/part-of: tether
                tether.dev/peering-token: 'true'
              name: tether-token-abc123
              namespace: tether-system
            type: Opaque
        "#]]
        .assert_eq(&yaml);
    }

    #[test]
    fn the_list_marks_expired_tokens() {
        let now = ts("2030-01-02T00:00:00Z");
        let tokens = vec![
            TokenInfo {
                id: "abc123".into(),
                expires: Some("2030-01-01T00:00:00Z".into()),
                expired: true,
                description: Some("old".into()),
                created: Some("2029-12-31T00:00:00Z".into()),
            },
            TokenInfo {
                id: "zzz999".into(),
                expires: Some("2030-01-03T00:00:00Z".into()),
                expired: false,
                description: None,
                created: Some("2030-01-01T23:00:00Z".into()),
            },
        ];
        expect![[r#"
            ID       EXPIRES                          DESCRIPTION   AGE
            abc123   2030-01-01T00:00:00Z (expired)   old           2d
            zzz999   2030-01-03T00:00:00Z                           60m
        "#]]
        .assert_eq(&render_list(&tokens, now));
        assert!(render_list(&[], now).contains("tether generate peer-command"));
    }
}
