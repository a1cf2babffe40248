//! The gateway reconciler: turns a GatewayServer or GatewayClient into its key Secret,
//! ServiceAccount and bindings, Deployment and (for a server) Service, and publishes in the
//! status what the other cluster needs: the public key, and where a server can be reached.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use tether_api::conditions::{self, Status, Time, types};
use tether_api::names::{TENANT_NAMESPACE_PREFIX, gateway_key, in_band, labels, objects};
use tether_api::networking::{
    Endpoint, GatewayClient, GatewayClientStatus, GatewayServer, GatewayServerStatus,
    InternalEndpoint, ServiceType,
};

use super::configuration::NetCtx;
use super::local;
use super::render::{End, Gateway};
use crate::Error;
use crate::context::{Ctx, FIELD_MANAGER};

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// What the reconciler found out about one gateway.
struct Observed {
    public_key: String,
    internal: Option<InternalEndpoint>,
    available: bool,
    endpoint: Option<Endpoint>,
    waiting_for: Option<String>,
}

/// Reconciles one GatewayServer.
pub async fn reconcile_server(gw: Arc<GatewayServer>, nctx: Arc<NetCtx>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = server(&gw, &nctx).await;
    nctx.ctx
        .metrics
        .reconciled("gatewayserver", result.as_ref().err(), started.elapsed());
    conflict_is_a_requeue(result)
}

/// Reconciles one GatewayClient.
pub async fn reconcile_client(gw: Arc<GatewayClient>, nctx: Arc<NetCtx>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = client(&gw, &nctx).await;
    nctx.ctx
        .metrics
        .reconciled("gatewayclient", result.as_ref().err(), started.elapsed());
    conflict_is_a_requeue(result)
}

fn conflict_is_a_requeue(result: Result<Action, Error>) -> Result<Action, Error> {
    match result {
        Err(e) if e.api_status() == Some(409) => Ok(Action::requeue(Duration::from_millis(200))),
        other => other,
    }
}

fn in_tenant_namespace<K: Resource>(k: &K) -> Option<String> {
    let ns = k.meta().namespace.clone()?;
    (ns.starts_with(TENANT_NAMESPACE_PREFIX) && k.meta().deletion_timestamp.is_none()).then_some(ns)
}

async fn server(gw: &GatewayServer, nctx: &NetCtx) -> Result<Action, Error> {
    let Some(ns) = in_tenant_namespace(gw) else {
        return Ok(Action::await_change());
    };
    let end = End::Server {
        port: gw.spec.endpoint.port,
        service_type: gw.spec.endpoint.service_type,
        node_port: gw.spec.endpoint.node_port,
    };
    let owner = gw
        .controller_owner_ref(&())
        .expect("a stored object has a name and uid");
    let obs = ensure(
        nctx,
        &ns,
        &gw.spec.remote_cluster_id,
        end,
        owner,
        gw.spec.in_band,
    )
    .await?;
    let mut st: GatewayServerStatus = gw.status.clone().unwrap_or_default();
    st.public_key = Some(obs.public_key.clone());
    st.internal_endpoint = obs.internal.clone();
    st.endpoint = obs.endpoint.clone();
    let (ready, requeue) =
        ready_condition(&mut st.conditions, &obs, gw.metadata.generation, || {
            gw.spec
                .client_public_key
                .is_none()
                .then(|| "waiting for the client's public key".to_owned())
        });
    if gw.status.as_ref() != Some(&st) {
        let mut next = gw.clone();
        next.status = Some(st);
        Api::<GatewayServer>::namespaced(nctx.ctx.client.clone(), &ns)
            .replace_status(&gw.name_any(), &PostParams::default(), &next)
            .await
            .map_err(Error::kube(format!("updating GatewayServer {ns} status")))?;
    }
    Ok(Action::requeue(if ready {
        Duration::from_secs(30)
    } else {
        requeue
    }))
}

async fn client(gw: &GatewayClient, nctx: &NetCtx) -> Result<Action, Error> {
    let Some(ns) = in_tenant_namespace(gw) else {
        return Ok(Action::await_change());
    };
    let owner = gw
        .controller_owner_ref(&())
        .expect("a stored object has a name and uid");
    let obs = ensure(
        nctx,
        &ns,
        &gw.spec.remote_cluster_id,
        End::Client,
        owner,
        gw.spec.in_band,
    )
    .await?;
    let mut st: GatewayClientStatus = gw.status.clone().unwrap_or_default();
    st.public_key = Some(obs.public_key.clone());
    st.internal_endpoint = obs.internal.clone();
    let (ready, requeue) =
        ready_condition(&mut st.conditions, &obs, gw.metadata.generation, || None);
    if gw.status.as_ref() != Some(&st) {
        let mut next = gw.clone();
        next.status = Some(st);
        Api::<GatewayClient>::namespaced(nctx.ctx.client.clone(), &ns)
            .replace_status(&gw.name_any(), &PostParams::default(), &next)
            .await
            .map_err(Error::kube(format!("updating GatewayClient {ns} status")))?;
    }
    Ok(Action::requeue(if ready {
        Duration::from_secs(30)
    } else {
        requeue
    }))
}

/// Sets `Ready` from what was observed; returns whether it is and when to look again.
fn ready_condition(
    conds: &mut Vec<tether_api::conditions::Condition>,
    obs: &Observed,
    generation: Option<i64>,
    also: impl FnOnce() -> Option<String>,
) -> (bool, Duration) {
    let waiting = obs.waiting_for.clone().or_else(also);
    let (status, reason, message) = match (&waiting, obs.available) {
        (Some(w), _) => (Status::False, "Waiting", w.clone()),
        (None, false) => (
            Status::False,
            "Starting",
            "the gateway Deployment has no available pod yet".to_owned(),
        ),
        (None, true) => (
            Status::True,
            "Available",
            match &obs.internal {
                Some(InternalEndpoint {
                    ip: Some(ip),
                    node: Some(node),
                }) => {
                    format!("the gateway runs at {ip} on {node}")
                }
                _ => "the gateway is available".to_owned(),
            },
        ),
    };
    conditions::set(
        conds,
        types::READY,
        status,
        reason,
        message,
        generation,
        now(),
    );
    (status == Status::True, Duration::from_secs(2))
}

async fn ensure(
    nctx: &NetCtx,
    ns: &str,
    remote: &str,
    end: End,
    owner: OwnerReference,
    in_band: bool,
) -> Result<Observed, Error> {
    let ctx = &nctx.ctx;
    let client = ctx.client.clone();
    let publish = control_plane(ctx, in_band).await?;
    let g = Gateway {
        namespace: ns,
        remote,
        end: end.clone(),
        image: &ctx.settings.gateway_image,
        owner,
        publish,
    };
    let public_key = ensure_key(&client, ns, remote).await?;
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .patch(objects::GATEWAY, &pp, &Patch::Apply(&g.service_account()))
        .await
        .map_err(Error::kube(format!(
            "applying ServiceAccount {ns}/{}",
            objects::GATEWAY
        )))?;
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .patch(objects::GATEWAY, &pp, &Patch::Apply(&g.role_binding()))
        .await
        .map_err(Error::kube(format!(
            "applying RoleBinding {ns}/{}",
            objects::GATEWAY
        )))?;
    let namespace = Api::<Namespace>::all(client.clone())
        .get(ns)
        .await
        .map_err(Error::kube(format!("reading namespace {ns}")))?;
    let ns_owner = OwnerReference {
        api_version: "v1".to_owned(),
        kind: "Namespace".to_owned(),
        name: ns.to_owned(),
        uid: namespace.metadata.uid.clone().unwrap_or_default(),
        controller: None,
        block_owner_deletion: None,
    };
    Api::<ClusterRoleBinding>::all(client.clone())
        .patch(
            &g.node_binding_name(),
            &pp,
            &Patch::Apply(&g.node_binding(ns_owner)),
        )
        .await
        .map_err(Error::kube(format!(
            "applying ClusterRoleBinding {}",
            g.node_binding_name()
        )))?;
    let deployment = Api::<Deployment>::namespaced(client.clone(), ns)
        .patch(objects::GATEWAY, &pp, &Patch::Apply(&g.deployment()))
        .await
        .map_err(Error::kube(format!(
            "applying Deployment {ns}/{}",
            objects::GATEWAY
        )))?;
    let available = deployment
        .status
        .as_ref()
        .and_then(|s| s.available_replicas)
        .unwrap_or(0)
        > 0;
    let mut waiting_for = None;
    let endpoint = match g.service() {
        None => None,
        Some(svc) => {
            let svc = Api::<Service>::namespaced(client.clone(), ns)
                .patch(objects::GATEWAY, &pp, &Patch::Apply(&svc))
                .await
                .map_err(Error::kube(format!(
                    "applying Service {ns}/{}",
                    objects::GATEWAY
                )))?;
            let nodes = match &end {
                End::Server {
                    service_type: ServiceType::NodePort,
                    ..
                } => {
                    Api::<Node>::all(client.clone())
                        .list(&ListParams::default())
                        .await
                        .map_err(Error::kube("listing nodes"))?
                        .items
                }
                _ => Vec::new(),
            };
            let e = server_endpoint(&svc, &nodes);
            if e.is_none() {
                waiting_for = Some(format!(
                    "Service {ns}/{} has no address yet (a LoadBalancer needs a load-balancer \
                     implementation; use --gateway-service-type NodePort without one)",
                    objects::GATEWAY
                ));
            }
            e
        }
    };
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!(
            "{}={}",
            labels::COMPONENT,
            labels::COMPONENT_GATEWAY
        )))
        .await
        .map_err(Error::kube(format!("listing gateway pods in {ns}")))?;
    let internal = pods
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .find_map(|p| {
            let ip = p.status.as_ref()?.pod_ip.clone()?;
            Some(InternalEndpoint {
                ip: Some(ip),
                node: p.spec.as_ref()?.node_name.clone(),
            })
        });
    Ok(Observed {
        public_key,
        internal,
        available,
        endpoint,
        waiting_for,
    })
}

/// What a gateway publishes, `(external, real)`: the API server (the `default/kubernetes`
/// Service, whose ClusterIP every pod finds in `KUBERNETES_SERVICE_HOST`) under host
/// [`in_band::API_SERVER_HOST`] of the external CIDR, so that pods offloaded to the peer reach
/// this cluster's API server; in band also the authentication Service under
/// [`in_band::AUTH_HOST`], which the peer's controller needs before it has any other way in.
///
/// Out of band the API server is published when it can be: without an external CIDR or
/// outside a pod the peering still works, only offloaded pods cannot reach this API server,
/// which the log says. In band both are required.
async fn control_plane(ctx: &Ctx, in_band: bool) -> Result<Vec<(Ipv4Addr, Ipv4Addr)>, Error> {
    let external = match local::load(ctx).await? {
        Ok(l) => l.external,
        Err(message) => return Err(Error::Invalid(message)),
    };
    let api: Option<Ipv4Addr> = std::env::var(tether_runtime::client::IN_CLUSTER_ENV)
        .ok()
        .and_then(|h| h.parse().ok());
    let (external, api) = match (external, api, in_band) {
        (Some(external), Some(api), _) => (external, api),
        (None, _, true) => {
            return Err(Error::Invalid(format!(
                "an in-band peering needs this cluster's external CIDR, and ConfigMap {} has no \
                 {}: run `tether install --external-cidr CIDR` again",
                objects::NETWORK_CONFIGMAP,
                tether_api::names::network::EXTERNAL_CIDR
            )));
        }
        (Some(_), None, true) => {
            return Err(Error::Invalid(format!(
                "an in-band peering publishes the API server's ClusterIP, which this controller \
                 reads from {}: it is unset or not an IPv4 address (is the controller running \
                 in a pod?)",
                tether_runtime::client::IN_CLUSTER_ENV
            )));
        }
        (external, api, false) => {
            tracing::warn!(
                external_cidr = external.is_some(),
                api_server_address = api.is_some(),
                "not publishing the API server to the peer: it needs an external CIDR and {} \
                 (an IPv4 ClusterIP); pods offloaded to the peer cannot reach this API server",
                tether_runtime::client::IN_CLUSTER_ENV
            );
            return Ok(Vec::new());
        }
    };
    let host = |h| {
        in_band::address(&external.to_string(), h).ok_or_else(|| {
            Error::Invalid(format!(
                "the external CIDR {external} is too small for the published addresses (hosts \
                 1 and 2)"
            ))
        })
    };
    let mut published = vec![(host(in_band::API_SERVER_HOST)?, api)];
    if in_band {
        let name = &ctx.settings.auth_service;
        let svc = Api::<Service>::namespaced(ctx.client.clone(), &ctx.settings.namespace)
            .get(name)
            .await
            .map_err(Error::kube(format!("reading Service {name}")))?;
        let auth: Ipv4Addr = svc
            .spec
            .and_then(|s| s.cluster_ip)
            .and_then(|ip| ip.parse().ok())
            .ok_or_else(|| Error::Invalid(format!("Service {name} has no IPv4 ClusterIP")))?;
        published.push((host(in_band::AUTH_HOST)?, auth));
    }
    Ok(published)
}

/// Creates the key Secret once (never overwritten: the peer trusts its public key) and
/// returns the public key.
async fn ensure_key(client: &kube::Client, ns: &str, remote: &str) -> Result<String, Error> {
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    let what = format!("Secret {ns}/{}", objects::GATEWAY_KEY_SECRET);
    let existing = api
        .get_opt(objects::GATEWAY_KEY_SECRET)
        .await
        .map_err(Error::kube(format!("reading {what}")))?;
    let secret = match existing {
        Some(s) => s,
        None => {
            let key = tether_wg::PrivateKey::generate();
            let mut l = labels::managed();
            l.insert(labels::REMOTE_CLUSTER_ID.to_owned(), remote.to_owned());
            let s = Secret {
                metadata: ObjectMeta {
                    name: Some(objects::GATEWAY_KEY_SECRET.to_owned()),
                    labels: Some(l),
                    ..Default::default()
                },
                data: Some(BTreeMap::from([
                    (
                        gateway_key::PRIVATE_KEY.to_owned(),
                        ByteString(key.to_base64().into_bytes()),
                    ),
                    (
                        gateway_key::PUBLIC_KEY.to_owned(),
                        ByteString(key.public().to_string().into_bytes()),
                    ),
                ])),
                ..Default::default()
            };
            match api.create(&PostParams::default(), &s).await {
                Ok(s) => s,
                // Another reconcile created it first: use that one.
                Err(kube::Error::Api(e)) if e.code == 409 => api
                    .get(objects::GATEWAY_KEY_SECRET)
                    .await
                    .map_err(Error::kube(format!("reading {what}")))?,
                Err(e) => return Err(Error::kube(format!("creating {what}"))(e)),
            }
        }
    };
    secret
        .data
        .and_then(|d| d.get(gateway_key::PUBLIC_KEY).cloned())
        .map(|b| String::from_utf8_lossy(&b.0).trim().to_owned())
        .filter(|k| k.parse::<tether_wg::PublicKey>().is_ok())
        .ok_or_else(|| {
            Error::Invalid(format!(
                "{what} has no valid {} key; delete it to have a new key pair generated",
                gateway_key::PUBLIC_KEY
            ))
        })
}

/// Where the client should dial, from the Service and (for NodePort) the nodes.
pub fn server_endpoint(svc: &Service, nodes: &[Node]) -> Option<Endpoint> {
    let spec = svc.spec.as_ref()?;
    let port = spec.ports.as_ref()?.first()?;
    match spec.type_.as_deref() {
        Some("LoadBalancer") => {
            let addresses: Vec<String> = svc
                .status
                .as_ref()?
                .load_balancer
                .as_ref()?
                .ingress
                .iter()
                .flatten()
                .filter_map(|i| i.ip.clone().or_else(|| i.hostname.clone()))
                .collect();
            let port = u16::try_from(port.port).ok()?;
            (!addresses.is_empty()).then_some(Endpoint { addresses, port })
        }
        Some("NodePort") => {
            let mut addresses: Vec<String> = nodes
                .iter()
                .filter_map(|n| {
                    let addrs = n.status.as_ref()?.addresses.as_ref()?;
                    addrs
                        .iter()
                        .find(|a| a.type_ == "ExternalIP")
                        .or_else(|| addrs.iter().find(|a| a.type_ == "InternalIP"))
                        .map(|a| a.address.clone())
                })
                .collect();
            addresses.sort();
            addresses.truncate(16);
            let node_port = u16::try_from(port.node_port?).ok()?;
            (!addresses.is_empty()).then_some(Endpoint {
                addresses,
                port: node_port,
            })
        }
        _ => Some(Endpoint {
            addresses: vec![spec.cluster_ip.clone()?],
            port: u16::try_from(port.port).ok()?,
        }),
    }
}
