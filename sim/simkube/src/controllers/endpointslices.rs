//! The EndpointSlice controller (and the legacy Endpoints controller): for every Service with a
//! selector, `discovery.k8s.io/v1` slices listing the pods it selects that have an IP, with
//! their readiness (`ready`, `serving`, `terminating`), node, target reference and the ports
//! the Service's `targetPort`s resolve to (numbers or named container ports), at most 100
//! endpoints per slice; and the `Endpoints` object of the same name.
//!
//! [`desired_slices`] and [`desired_endpoints`] are pure.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, ObjectReference, Pod, Service,
};
use k8s_openapi::api::discovery::v1::{
    Endpoint, EndpointConditions, EndpointPort as SlicePort, EndpointSlice,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, ResourceExt as _};
use tokio_util::sync::CancellationToken;

use super::is_status;
use super::workloads::controller_ref;

/// Label naming the Service a slice belongs to.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Label naming the controller that manages a slice.
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// This controller's value of [`MANAGED_BY_LABEL`], as kube-controller-manager's.
pub const MANAGED_BY: &str = "endpointslice-controller.k8s.io";
/// Endpoints per slice, the real controller's default.
pub const MAX_ENDPOINTS_PER_SLICE: usize = 100;

/// Errors of one reconcile pass.
#[derive(Debug, thiserror::Error)]
pub enum EndpointSliceError {
    /// The API server refused or failed a request.
    #[error("endpointslice controller: {0}")]
    Kube(#[from] kube::Error),
}

fn selects(service: &Service, pod: &Pod) -> bool {
    let Some(selector) = service.spec.as_ref().and_then(|s| s.selector.as_ref()) else {
        return false;
    };
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    service.namespace() == pod.namespace()
        && !selector.is_empty()
        && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn has_selector(service: &Service) -> bool {
    let spec = service.spec.clone().unwrap_or_default();
    spec.type_.as_deref() != Some("ExternalName") && spec.selector.is_some_and(|s| !s.is_empty())
}

/// Whether a pod belongs in the endpoints at all: it has an IP and has not finished.
fn eligible(pod: &Pod) -> bool {
    let status = pod.status.clone().unwrap_or_default();
    status.pod_ip.is_some_and(|ip| !ip.is_empty())
        && !matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"))
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The ports a pod serves for the Service: each service port's `targetPort` resolved against
/// the pod's named container ports (a name the pod lacks drops that port).
fn resolved_ports(service: &Service, pod: &Pod) -> Vec<SlicePort> {
    let mut out = Vec::new();
    for port in service.spec.iter().flat_map(|s| s.ports.iter().flatten()) {
        let number = match &port.target_port {
            None => Some(port.port),
            Some(IntOrString::Int(n)) => Some(*n),
            Some(IntOrString::String(name)) => pod
                .spec
                .iter()
                .flat_map(|s| s.containers.iter())
                .flat_map(|c| c.ports.iter().flatten())
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .map(|p| p.container_port),
        };
        if let Some(number) = number {
            out.push(SlicePort {
                name: Some(port.name.clone().unwrap_or_default()),
                port: Some(number),
                protocol: Some(port.protocol.clone().unwrap_or_else(|| "TCP".into())),
                app_protocol: port.app_protocol.clone(),
            });
        }
    }
    out
}

fn endpoint_of(service: &Service, pod: &Pod) -> Endpoint {
    let terminating = pod.metadata.deletion_timestamp.is_some();
    let publish = service
        .spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false);
    let serving = publish || pod_ready(pod);
    let spec = pod.spec.clone().unwrap_or_default();
    let hostname = spec
        .hostname
        .filter(|_| spec.subdomain.as_deref() == service.metadata.name.as_deref());
    Endpoint {
        addresses: vec![
            pod.status
                .as_ref()
                .and_then(|s| s.pod_ip.clone())
                .unwrap_or_default(),
        ],
        conditions: Some(EndpointConditions {
            ready: Some(serving && !terminating),
            serving: Some(serving),
            terminating: Some(terminating),
        }),
        hostname,
        node_name: spec.node_name,
        target_ref: Some(ObjectReference {
            kind: Some("Pod".into()),
            namespace: pod.namespace(),
            name: pod.metadata.name.clone(),
            uid: pod.metadata.uid.clone(),
            ..ObjectReference::default()
        }),
        ..Endpoint::default()
    }
}

/// Pods grouped by the ports they resolve to (pods resolving a named port differently land in
/// different slices, as in the real controller), pods sorted by name within a group.
fn groups<'a>(service: &Service, pods: &'a [Pod]) -> Vec<(Vec<SlicePort>, Vec<&'a Pod>)> {
    let mut by_ports: BTreeMap<String, (Vec<SlicePort>, Vec<&Pod>)> = BTreeMap::new();
    let mut selected: Vec<&Pod> = pods
        .iter()
        .filter(|p| selects(service, p) && eligible(p))
        .collect();
    selected.sort_by_key(|p| p.name_any());
    for pod in selected {
        let ports = resolved_ports(service, pod);
        let key = serde_json::to_string(&ports).unwrap_or_default();
        by_ports
            .entry(key)
            .or_insert_with(|| (ports, Vec::new()))
            .1
            .push(pod);
    }
    by_ports.into_values().collect()
}

/// The slices a Service should have (names left to `generateName`).
pub fn desired_slices(service: &Service, pods: &[Pod]) -> Vec<EndpointSlice> {
    let name = service.name_any();
    let mut labels: BTreeMap<String, String> = service.labels().clone();
    labels.insert(SERVICE_NAME_LABEL.into(), name.clone());
    labels.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
    let mut out = Vec::new();
    let make = |ports: Vec<SlicePort>, endpoints: Vec<Endpoint>| EndpointSlice {
        metadata: ObjectMeta {
            generate_name: Some(format!("{name}-")),
            namespace: service.namespace(),
            labels: Some(labels.clone()),
            owner_references: controller_ref(service).map(|r| vec![r]),
            ..ObjectMeta::default()
        },
        address_type: "IPv4".into(),
        endpoints,
        ports: Some(ports),
    };
    for (ports, pods) in groups(service, pods) {
        for chunk in pods.chunks(MAX_ENDPOINTS_PER_SLICE) {
            let endpoints = chunk.iter().map(|p| endpoint_of(service, p)).collect();
            out.push(make(ports.clone(), endpoints));
        }
    }
    if out.is_empty() {
        // A selector that matches nothing still gets one empty placeholder slice.
        let mut placeholder = make(Vec::new(), Vec::new());
        placeholder.ports = None;
        out.push(placeholder);
    }
    out
}

/// The legacy Endpoints object: ready addresses, not-ready ones, per port group; terminating
/// pods are left out.
pub fn desired_endpoints(service: &Service, pods: &[Pod]) -> Endpoints {
    let mut subsets = Vec::new();
    for (ports, pods) in groups(service, pods) {
        let mut ready = Vec::new();
        let mut not_ready = Vec::new();
        for pod in pods {
            if pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let e = endpoint_of(service, pod);
            let address = EndpointAddress {
                ip: e.addresses[0].clone(),
                hostname: e.hostname.clone(),
                node_name: e.node_name.clone(),
                target_ref: e.target_ref.clone(),
            };
            if e.conditions.and_then(|c| c.ready) == Some(true) {
                ready.push(address);
            } else {
                not_ready.push(address);
            }
        }
        if ready.is_empty() && not_ready.is_empty() {
            continue;
        }
        subsets.push(EndpointSubset {
            addresses: (!ready.is_empty()).then_some(ready),
            not_ready_addresses: (!not_ready.is_empty()).then_some(not_ready),
            ports: Some(
                ports
                    .into_iter()
                    .map(|p| EndpointPort {
                        name: p.name.filter(|n| !n.is_empty()),
                        port: p.port.unwrap_or_default(),
                        protocol: p.protocol,
                        app_protocol: p.app_protocol,
                    })
                    .collect(),
            ),
        });
    }
    Endpoints {
        metadata: ObjectMeta {
            name: service.metadata.name.clone(),
            namespace: service.namespace(),
            labels: Some(service.labels().clone()),
            ..ObjectMeta::default()
        },
        subsets: (!subsets.is_empty()).then_some(subsets),
    }
}

struct Context {
    client: Client,
}

/// Runs the controller until `shutdown`.
pub async fn run(client: Client, shutdown: CancellationToken) {
    let services: Api<Service> = Api::all(client.clone());
    let controller = Controller::new(services, watcher::Config::default());
    let store = controller.store();
    controller
        .owns(
            Api::<EndpointSlice>::all(client.clone()),
            watcher::Config::default(),
        )
        .watches(
            Api::<Pod>::all(client.clone()),
            watcher::Config::default(),
            move |pod| {
                store
                    .state()
                    .into_iter()
                    .filter(|svc| selects(svc, &pod))
                    .map(|svc| ObjectRef::from_obj(&*svc))
                    .collect::<Vec<_>>()
            },
        )
        .graceful_shutdown_on(shutdown.cancelled_owned())
        .run(reconcile, error_policy, Arc::new(Context { client }))
        .for_each(|_| async {})
        .await;
}

fn error_policy(_s: Arc<Service>, error: &EndpointSliceError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "endpointslice pass failed; retrying");
    Action::requeue(Duration::from_secs(1))
}

async fn reconcile(cached: Arc<Service>, ctx: Arc<Context>) -> Result<Action, EndpointSliceError> {
    let namespace = cached.namespace().unwrap_or_default();
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &namespace);
    let Some(service) = services.get_opt(&cached.name_any()).await? else {
        return Ok(Action::await_change());
    };
    if service.metadata.deletion_timestamp.is_some() || !has_selector(&service) {
        return Ok(Action::await_change());
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let selector = service
        .spec
        .as_ref()
        .and_then(|s| s.selector.clone())
        .unwrap_or_default()
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let pods = pods
        .list(&ListParams::default().labels(&selector))
        .await?
        .items;
    let slices_api: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut existing = slices_api
        .list(&ListParams::default().labels(&format!(
            "{SERVICE_NAME_LABEL}={},{MANAGED_BY_LABEL}={MANAGED_BY}",
            service.name_any()
        )))
        .await?
        .items;
    existing.sort_by_key(|s| s.name_any());
    let desired = desired_slices(&service, &pods);
    let keep = desired.len();
    for (i, mut want) in desired.into_iter().enumerate() {
        match existing.get(i) {
            Some(have)
                if have.endpoints == want.endpoints
                    && have.ports == want.ports
                    && have.metadata.labels == want.metadata.labels => {}
            Some(have) => {
                want.metadata.name = have.metadata.name.clone();
                want.metadata.generate_name = None;
                want.metadata.resource_version = have.metadata.resource_version.clone();
                tolerate(
                    slices_api
                        .replace(&have.name_any(), &PostParams::default(), &want)
                        .await,
                )?;
            }
            None => tolerate(slices_api.create(&PostParams::default(), &want).await)?,
        }
    }
    for extra in existing.iter().skip(keep) {
        tolerate(
            slices_api
                .delete(&extra.name_any(), &DeleteParams::default())
                .await,
        )?;
    }
    let endpoints_api: Api<Endpoints> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut want = desired_endpoints(&service, &pods);
    match endpoints_api.get_opt(&service.name_any()).await? {
        Some(have) if have.subsets == want.subsets => {}
        Some(have) => {
            want.metadata.resource_version = have.metadata.resource_version;
            tolerate(
                endpoints_api
                    .replace(&service.name_any(), &PostParams::default(), &want)
                    .await,
            )?;
        }
        None => tolerate(endpoints_api.create(&PostParams::default(), &want).await)?,
    }
    Ok(Action::await_change())
}

/// Conflicts and races with deletion resolve on the next watch event.
fn tolerate<T>(result: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match result {
        Ok(_) => Ok(()),
        Err(e) if is_status(&e, 409) || is_status(&e, 404) || is_status(&e, 403) => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests;
