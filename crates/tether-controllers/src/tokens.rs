//! Peering tokens on the provider: checking one a consumer presents against the hashed
//! Secrets `tether generate peer-command` wrote, and deleting expired ones.

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, ListParams};
use tether_api::ClusterId;
use tether_api::names::{annotations, labels};
use tether_api::peering::{PeeringToken, TOKEN_HASH_KEY};

use crate::Error;

/// Why a token was refused; the message tells the consumer's admin what to do.
pub fn check_secret(
    token: &PeeringToken,
    secret: Option<&Secret>,
    own: &ClusterId,
    now: k8s_openapi::jiff::Timestamp,
) -> Result<(), String> {
    const ASK: &str = "ask the provider's admin for a new one (`tether generate peer-command`)";
    if token.provider() != own {
        return Err(format!(
            "the token was issued by cluster {}, but this is cluster {own}; {ASK}",
            token.provider()
        ));
    }
    let Some(secret) = secret else {
        return Err(format!(
            "token {} is unknown here (revoked or never issued); {ASK}",
            token.id()
        ));
    };
    let is_token = secret
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(labels::PEERING_TOKEN))
        .is_some_and(|v| v == "true");
    let hash = secret
        .data
        .as_ref()
        .and_then(|d| d.get(TOKEN_HASH_KEY))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned());
    let (true, Some(hash)) = (is_token, hash) else {
        return Err(format!("token {} is unknown here; {ASK}", token.id()));
    };
    if !token.matches(&hash) {
        return Err(format!("token {} is wrong; {ASK}", token.id()));
    }
    if expiry(secret).is_none_or(|e| e <= now) {
        return Err(format!("token {} has expired; {ASK}", token.id()));
    }
    Ok(())
}

/// When a token Secret expires; `None` if it carries no readable expiry (treated as expired).
pub fn expiry(secret: &Secret) -> Option<k8s_openapi::jiff::Timestamp> {
    secret
        .metadata
        .annotations
        .as_ref()?
        .get(annotations::TOKEN_EXPIRES)?
        .parse()
        .ok()
}

/// Checks `token` against the Secrets in `namespace`.
pub async fn validate(
    client: &kube::Client,
    namespace: &str,
    own: &ClusterId,
    token: &str,
) -> Result<Result<(), String>, Error> {
    let token = match PeeringToken::parse(token) {
        Ok(t) => t,
        Err(e) => return Ok(Err(e.to_string())),
    };
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = if token.provider() == own {
        api.get_opt(&token.secret_name())
            .await
            .map_err(Error::kube(format!(
                "reading token Secret {}",
                token.secret_name()
            )))?
    } else {
        None
    };
    Ok(check_secret(
        &token,
        secret.as_ref(),
        own,
        k8s_openapi::jiff::Timestamp::now(),
    ))
}

/// How long an expired token's Secret is kept, so that a late attempt with it is told it
/// expired rather than that it is unknown.
pub const EXPIRED_GRACE_SECS: i64 = 3600;

/// Deletes token Secrets that expired more than [`EXPIRED_GRACE_SECS`] ago; returns how many.
pub async fn delete_expired(client: &kube::Client, namespace: &str) -> Result<usize, Error> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let list = api
        .list(&ListParams::default().labels(&format!("{}=true", labels::PEERING_TOKEN)))
        .await
        .map_err(Error::kube("listing peering tokens"))?;
    let cutoff = k8s_openapi::jiff::Timestamp::now()
        .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(
            EXPIRED_GRACE_SECS,
        ))
        .unwrap_or_default();
    let mut deleted = 0;
    for s in list.items {
        if expiry(&s).is_some_and(|e| e <= cutoff) {
            let name = s.metadata.name.clone().unwrap_or_default();
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => deleted += 1,
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(Error::kube(format!("deleting expired token {name}"))(e)),
            }
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {

    use super::*;

    fn secret_for(token: &PeeringToken, expires: &str) -> Secret {
        tether_api::peering::token_secret(token, expires.parse().expect("time"), None)
    }

    #[test]
    fn good_wrong_expired_unknown_and_foreign_tokens() {
        let own = ClusterId::new("prov").expect("id");
        let now: k8s_openapi::jiff::Timestamp = "2026-01-01T00:00:00Z".parse().expect("time");
        let t = PeeringToken::generate(own.clone());
        let s = secret_for(&t, "2026-01-02T00:00:00Z");
        assert_eq!(check_secret(&t, Some(&s), &own, now), Ok(()));

        let expired = secret_for(&t, "2025-12-31T00:00:00Z");
        let e = check_secret(&t, Some(&expired), &own, now).expect_err("expired");
        assert!(
            e.contains("has expired") && e.contains("tether generate peer-command"),
            "{e}"
        );

        let other =
            PeeringToken::parse(&format!("prov.{}.{}", t.id(), "x".repeat(32))).expect("token");
        let e = check_secret(&other, Some(&s), &own, now).expect_err("wrong");
        assert!(e.contains("is wrong"), "{e}");

        let e = check_secret(&t, None, &own, now).expect_err("unknown");
        assert!(e.contains("unknown here"), "{e}");

        let foreign = PeeringToken::generate(ClusterId::new("elsewhere").expect("id"));
        let e = check_secret(&foreign, None, &own, now).expect_err("foreign");
        assert!(e.contains("issued by cluster elsewhere"), "{e}");

        let mut no_expiry = s;
        no_expiry.metadata.annotations = None;
        assert!(check_secret(&t, Some(&no_expiry), &own, now).is_err());
    }
}
