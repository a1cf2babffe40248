//! A load-balancer provider for simulated clusters: LoadBalancer Services get
//! `status.loadBalancer.ingress[].ip` from a configured pool, and give it back when they stop
//! being LoadBalancers. Without a pool, Services stay pending, as on a real cluster with no
//! provider. [`pick`] is pure.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::watcher;
use kube::{Client, ResourceExt as _};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::is_status;

/// Errors of one reconcile pass.
#[derive(Debug, thiserror::Error)]
pub enum LoadBalancerError {
    /// The API server refused or failed a request.
    #[error("load balancer controller: {0}")]
    Kube(#[from] kube::Error),
}

/// The ingress IPs a Service reports.
pub fn ingress_ips(svc: &Service) -> Vec<String> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.clone())
        .collect()
}

/// The first pool address no Service uses (a requested `spec.loadBalancerIP` from the pool
/// wins if free).
pub fn pick(
    pool: &[Ipv4Addr],
    used: &BTreeSet<String>,
    requested: Option<&str>,
) -> Option<Ipv4Addr> {
    if let Some(ip) = requested.and_then(|r| r.parse::<Ipv4Addr>().ok()) {
        return (pool.contains(&ip) && !used.contains(&ip.to_string())).then_some(ip);
    }
    pool.iter()
        .copied()
        .find(|ip| !used.contains(&ip.to_string()))
}

struct Context {
    client: Client,
    pool: Vec<Ipv4Addr>,
}

/// Runs the controller until `shutdown`. One Service at a time, so two never get one IP.
pub async fn run(client: Client, pool: Vec<Ipv4Addr>, shutdown: CancellationToken) {
    let services: Api<Service> = Api::all(client.clone());
    Controller::new(services, watcher::Config::default())
        .with_config(controller::Config::default().concurrency(1))
        .graceful_shutdown_on(shutdown.cancelled_owned())
        .run(reconcile, error_policy, Arc::new(Context { client, pool }))
        .for_each(|_| async {})
        .await;
}

fn error_policy(_s: Arc<Service>, error: &LoadBalancerError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "load balancer pass failed; retrying");
    Action::requeue(Duration::from_secs(1))
}

async fn reconcile(cached: Arc<Service>, ctx: Arc<Context>) -> Result<Action, LoadBalancerError> {
    let namespace = cached.namespace().unwrap_or_default();
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), &namespace);
    let Some(svc) = api.get_opt(&cached.name_any()).await? else {
        return Ok(Action::await_change());
    };
    let spec = svc.spec.clone().unwrap_or_default();
    let is_lb = spec.type_.as_deref() == Some("LoadBalancer")
        && spec
            .load_balancer_class
            .as_deref()
            .is_none_or(str::is_empty)
        && svc.metadata.deletion_timestamp.is_none();
    let current = ingress_ips(&svc);
    let pooled: Vec<&String> = current
        .iter()
        .filter(|ip| {
            ip.parse::<Ipv4Addr>()
                .is_ok_and(|ip| ctx.pool.contains(&ip))
        })
        .collect();
    let status = if !is_lb {
        if pooled.is_empty() {
            return Ok(Action::await_change());
        }
        json!({"status": {"loadBalancer": {"ingress": null}}})
    } else if !current.is_empty() || ctx.pool.is_empty() {
        return Ok(Action::await_change());
    } else {
        let all = Api::<Service>::all(ctx.client.clone())
            .list(&ListParams::default())
            .await?;
        let used: BTreeSet<String> = all.items.iter().flat_map(ingress_ips).collect();
        let Some(ip) = pick(&ctx.pool, &used, spec.load_balancer_ip.as_deref()) else {
            // Freed addresses change other Services, not this one: look again later.
            tracing::warn!(service = %svc.name_any(), %namespace, "load balancer pool exhausted");
            return Ok(Action::requeue(Duration::from_secs(1)));
        };
        json!({"status": {"loadBalancer": {"ingress": [{"ip": ip.to_string(), "ipMode": "VIP"}]}}})
    };
    match api
        .patch_status(
            &svc.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await
    {
        Ok(_) => {}
        Err(e) if is_status(&e, 404) || is_status(&e, 409) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_first_free_pool_address() {
        let pool = [Ipv4Addr::new(198, 18, 0, 10), Ipv4Addr::new(198, 18, 0, 11)];
        let used = BTreeSet::from(["198.18.0.10".to_owned()]);
        assert_eq!(pick(&pool, &BTreeSet::new(), None), Some(pool[0]));
        assert_eq!(pick(&pool, &used, None), Some(pool[1]));
        assert_eq!(pick(&pool, &used, Some("198.18.0.11")), Some(pool[1]));
        assert_eq!(pick(&pool, &used, Some("198.18.0.10")), None);
        assert_eq!(pick(&pool, &used, Some("203.0.113.1")), None);
        let full = BTreeSet::from(["198.18.0.10".to_owned(), "198.18.0.11".to_owned()]);
        assert_eq!(pick(&pool, &full, None), None);
        assert_eq!(pick(&[], &BTreeSet::new(), None), None);
    }
}
