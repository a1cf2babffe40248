//! Discovers the addresses peers use (the API server and the authentication Service) and
//! publishes them, with the cluster ID, the public key and the authentication certificate's
//! fingerprint, in the ConfigMap `tether-public-identity`.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams};
use tether_api::names::{labels, objects, public_identity};
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::context::{Ctx, FIELD_MANAGER, Published};

/// `https://ADDR:PORT` of the API server from the `kubernetes` EndpointSlice.
pub fn api_server_url(slice: &EndpointSlice) -> Option<String> {
    let addr = slice
        .endpoints
        .iter()
        .find(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))?
        .addresses
        .first()?;
    let port = slice
        .ports
        .as_ref()?
        .iter()
        .find(|p| p.name.as_deref() == Some("https"))
        .or_else(|| slice.ports.as_ref()?.first())?
        .port?;
    Some(format!("https://{}:{port}", host(addr)))
}

/// `https://ADDR:PORT` of the authentication Service as another cluster reaches it: the
/// load balancer's address, or a Ready node's InternalIP and the node port.
pub fn auth_url(service: &Service, nodes: &[Node]) -> Option<String> {
    let spec = service.spec.as_ref()?;
    let port = spec.ports.as_ref()?.first()?;
    match spec.type_.as_deref() {
        Some("LoadBalancer") => {
            let ingress = service
                .status
                .as_ref()?
                .load_balancer
                .as_ref()?
                .ingress
                .as_ref()?
                .first()?;
            let addr = ingress.ip.as_ref().or(ingress.hostname.as_ref())?;
            Some(format!("https://{}:{}", host(addr), port.port))
        }
        Some("NodePort") => {
            let node_port = port.node_port?;
            let ip = nodes
                .iter()
                .filter(|n| node_ready(n))
                .find_map(internal_ip)?;
            Some(format!("https://{}:{node_port}", host(&ip)))
        }
        _ => {
            let ip = spec
                .cluster_ip
                .as_ref()
                .filter(|ip| ip.as_str() != "None")?;
            Some(format!("https://{}:{}", host(ip), port.port))
        }
    }
}

fn host(addr: &str) -> String {
    if addr.contains(':') {
        format!("[{addr}]")
    } else {
        addr.to_owned()
    }
}

fn node_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn internal_ip(n: &Node) -> Option<String> {
    n.status
        .as_ref()?
        .addresses
        .as_ref()?
        .iter()
        .find(|a| a.type_ == "InternalIP")
        .map(|a| a.address.clone())
}

/// Discovers the current facts (overrides from the command line win).
pub async fn discover(ctx: &Ctx) -> Result<Published, Error> {
    let api_server_url = match &ctx.settings.api_server_url {
        Some(u) => Some(u.clone()),
        None => Api::<EndpointSlice>::namespaced(ctx.client.clone(), "default")
            .get_opt("kubernetes")
            .await
            .map_err(Error::kube("reading EndpointSlice default/kubernetes"))?
            .as_ref()
            .and_then(api_server_url),
    };
    let auth_url = match &ctx.settings.auth_url {
        Some(u) => Some(u.clone()),
        None => {
            let svc = Api::<Service>::namespaced(ctx.client.clone(), &ctx.settings.namespace)
                .get_opt(&ctx.settings.auth_service)
                .await
                .map_err(Error::kube(format!(
                    "reading Service {}",
                    ctx.settings.auth_service
                )))?;
            match svc {
                None => None,
                Some(svc) => {
                    let nodes =
                        if svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("NodePort") {
                            Api::<Node>::all(ctx.client.clone())
                                .list(&ListParams::default().limit(50))
                                .await
                                .map_err(Error::kube("listing nodes"))?
                                .items
                        } else {
                            Vec::new()
                        };
                    auth_url(&svc, &nodes)
                }
            }
        }
    };
    Ok(Published {
        api_server_url,
        auth_url,
    })
}

/// The ConfigMap for the current facts.
pub fn config_map(ctx: &Ctx, p: &Published) -> ConfigMap {
    let mut data = BTreeMap::from([
        (
            public_identity::CLUSTER_ID.to_owned(),
            ctx.cluster_id().to_string(),
        ),
        (
            public_identity::PUBLIC_KEY.to_owned(),
            ctx.identity.keys.public_key_b64(),
        ),
        (
            public_identity::AUTH_FINGERPRINT.to_owned(),
            ctx.auth_fingerprint.clone(),
        ),
    ]);
    if let Some(u) = &p.auth_url {
        data.insert(public_identity::AUTH_URL.to_owned(), u.clone());
    }
    if let Some(u) = &p.api_server_url {
        data.insert(public_identity::API_SERVER_URL.to_owned(), u.clone());
    }
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(objects::PUBLIC_IDENTITY_CONFIGMAP.to_owned()),
            namespace: Some(ctx.settings.namespace.clone()),
            labels: Some(labels::managed()),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    }
}

/// Keeps the published facts current on every replica; the leader (when `is_leader` says so)
/// also writes the ConfigMap. Polls quickly until both addresses are known, then slowly.
pub async fn run(ctx: &Ctx, is_leader: impl Fn() -> bool, shutdown: CancellationToken) {
    let mut written: Option<Published> = None;
    loop {
        match discover(ctx).await {
            Ok(p) => {
                if ctx.published() != p {
                    tracing::info!(api_server = ?p.api_server_url, auth = ?p.auth_url, "published addresses changed");
                }
                ctx.set_published(p.clone());
                if is_leader() && written.as_ref() != Some(&p) {
                    let cm = config_map(ctx, &p);
                    let res =
                        Api::<ConfigMap>::namespaced(ctx.client.clone(), &ctx.settings.namespace)
                            .patch(
                                objects::PUBLIC_IDENTITY_CONFIGMAP,
                                &PatchParams::apply(FIELD_MANAGER).force(),
                                &Patch::Apply(&cm),
                            )
                            .await;
                    match res {
                        Ok(_) => written = Some(p),
                        Err(e) => tracing::warn!(error = %e, "writing the public identity failed"),
                    }
                } else if !is_leader() {
                    written = None;
                }
            }
            Err(e) => tracing::warn!(error = %e, "discovering the published addresses failed"),
        }
        let complete =
            ctx.published().api_server_url.is_some() && ctx.published().auth_url.is_some();
        let pause = if complete {
            Duration::from_secs(15)
        } else {
            Duration::from_secs(1)
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_json<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
        serde_json::from_value(v).expect("fixture")
    }

    #[test]
    fn the_api_server_url_comes_from_the_https_port_of_a_ready_endpoint() {
        let slice: EndpointSlice = from_json(serde_json::json!({
            "metadata": {"name": "kubernetes"},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["198.18.2.1"], "conditions": {"ready": true}}],
            "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}]
        }));
        assert_eq!(
            api_server_url(&slice).as_deref(),
            Some("https://198.18.2.1:6443")
        );
    }

    #[test]
    fn the_auth_url_follows_the_service_type() {
        let lb: Service = from_json(serde_json::json!({
            "spec": {"type": "LoadBalancer", "ports": [{"port": 443, "nodePort": 31000}], "clusterIP": "10.96.0.20"},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.19.2.1"}]}}
        }));
        assert_eq!(
            auth_url(&lb, &[]).as_deref(),
            Some("https://198.19.2.1:443")
        );
        let pending: Service = from_json(serde_json::json!({
            "spec": {"type": "LoadBalancer", "ports": [{"port": 443}]}, "status": {}
        }));
        assert_eq!(auth_url(&pending, &[]), None);
        let np: Service = from_json(serde_json::json!({
            "spec": {"type": "NodePort", "ports": [{"port": 443, "nodePort": 31000}]}
        }));
        let nodes: Vec<Node> = vec![
            from_json(serde_json::json!({"metadata": {"name": "a"}, "status": {
                "conditions": [{"type": "Ready", "status": "False"}],
                "addresses": [{"type": "InternalIP", "address": "198.18.2.11"}]}})),
            from_json(serde_json::json!({"metadata": {"name": "b"}, "status": {
                "conditions": [{"type": "Ready", "status": "True"}],
                "addresses": [{"type": "Hostname", "address": "b"}, {"type": "InternalIP", "address": "198.18.2.12"}]}})),
        ];
        assert_eq!(
            auth_url(&np, &nodes).as_deref(),
            Some("https://198.18.2.12:31000")
        );
    }
}
