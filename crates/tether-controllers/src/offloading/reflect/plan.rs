//! What the reflection of an offloaded namespace changes in a twin namespace (pure): from the
//! consumer's ConfigMaps, Secrets, Services and EndpointSlices and what the twin holds, the
//! objects to apply, recreate and delete there. Only copies this consumer made (its labels)
//! are ever changed or deleted; a same-named object of someone else is a conflict, left alone.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    ConfigMap, ObjectReference, Secret, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointSlice};
use k8s_openapi::api::events::v1::Event;
use kube::api::ObjectMeta;
use kube::{Resource, ResourceExt};

use crate::offloading::translate::{LAST_APPLIED, PodView};

/// Label on every copy: made by reflection.
pub const REFLECTED: &str = "tether.dev/reflected";
/// Label on every copy: the consumer it reflects (`tether.dev/remote-cluster-id`).
pub const REMOTE_CLUSTER_ID: &str = tether_api::names::labels::REMOTE_CLUSTER_ID;
/// Annotation that keeps an object (`"true"`) out of reflection.
pub const SKIP: &str = "tether.dev/skip-reflection";
/// Annotation on a LoadBalancer Service that keeps its copy a LoadBalancer (`"true"`);
/// without it the copy is a ClusterIP Service, since the address a provider's load balancer
/// would hand out belongs to the provider and is not the consumer's to publish.
pub const KEEP_LOAD_BALANCER: &str = "tether.dev/reflect-load-balancer";
/// The Service an EndpointSlice belongs to.
pub const SERVICE_NAME: &str = "kubernetes.io/service-name";
/// Who manages an EndpointSlice.
pub const SLICE_MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
/// Our value of [`SLICE_MANAGED_BY`]: the provider's EndpointSlice controller leaves these be.
pub const SLICE_MANAGER: &str = "tether";
/// The Kubernetes EndpointSlice controller's value of [`SLICE_MANAGED_BY`].
pub const KUBE_SLICE_MANAGER: &str = "endpointslice-controller.k8s.io";
/// The CA bundle every namespace gets from its own cluster.
const ROOT_CA: &str = "kube-root-ca.crt";
const TOKEN_SECRET: &str = "kubernetes.io/service-account-token";

/// One change in the twin.
#[derive(Debug, Clone, PartialEq)]
pub enum Op<K> {
    /// Create or update (server-side apply) to this.
    Apply(K),
    /// Delete and create again: the copy cannot change in place (immutable, or a Secret's
    /// type).
    Recreate(K),
    /// Delete our copy of this name.
    Delete(String),
    /// An object of this name in the twin is not ours; the local one is not reflected.
    Conflict(String),
}

impl<K: Resource> Op<K> {
    /// The name the change is about.
    pub fn name(&self) -> String {
        match self {
            Op::Apply(k) | Op::Recreate(k) => k.meta().name.clone().unwrap_or_default(),
            Op::Delete(n) | Op::Conflict(n) => n.clone(),
        }
    }

    /// A fixed word for metrics and logs.
    pub fn outcome(&self) -> &'static str {
        match self {
            Op::Apply(_) => "applied",
            Op::Recreate(_) => "recreated",
            Op::Delete(_) => "deleted",
            Op::Conflict(_) => "conflict",
        }
    }
}

/// Whether `meta` marks a copy this consumer made.
pub fn is_ours(meta: &ObjectMeta, consumer: &str) -> bool {
    let l = meta.labels.as_ref();
    l.and_then(|l| l.get(REFLECTED)).map(String::as_str) == Some("true")
        && l.and_then(|l| l.get(REMOTE_CLUSTER_ID)).map(String::as_str) == Some(consumer)
}

fn skipped(meta: &ObjectMeta) -> bool {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(SKIP))
        .is_some_and(|v| v == "true")
}

/// The metadata of a copy: the local labels and annotations plus our marks.
fn copy_meta(local: &ObjectMeta, consumer: &str) -> ObjectMeta {
    let mut labels = local.labels.clone().unwrap_or_default();
    labels.insert(REFLECTED.to_owned(), "true".to_owned());
    labels.insert(REMOTE_CLUSTER_ID.to_owned(), consumer.to_owned());
    let mut annotations = local.annotations.clone().unwrap_or_default();
    annotations.remove(LAST_APPLIED);
    ObjectMeta {
        name: local.name.clone(),
        labels: Some(labels),
        annotations: (!annotations.is_empty()).then_some(annotations),
        ..ObjectMeta::default()
    }
}

/// Whether the copy's labels and annotations are the wanted ones (annotations the provider's
/// side added are not ours to remove).
fn meta_matches(want: &ObjectMeta, have: &ObjectMeta) -> bool {
    want.labels == have.labels
        && want
            .annotations
            .iter()
            .flatten()
            .all(|(k, v)| have.annotations.as_ref().and_then(|a| a.get(k)) == Some(v))
}

/// The copy of a local ConfigMap, `None` for one that is not reflected.
pub fn config_map(local: &ConfigMap, consumer: &str) -> Option<ConfigMap> {
    if local.name_any() == ROOT_CA || skipped(&local.metadata) {
        return None;
    }
    Some(ConfigMap {
        metadata: copy_meta(&local.metadata, consumer),
        data: local.data.clone(),
        binary_data: local.binary_data.clone(),
        immutable: local.immutable,
    })
}

/// The copy of a local Secret, `None` for one that is not reflected.
pub fn secret(local: &Secret, consumer: &str) -> Option<Secret> {
    if local.type_.as_deref() == Some(TOKEN_SECRET) || skipped(&local.metadata) {
        return None;
    }
    Some(Secret {
        metadata: copy_meta(&local.metadata, consumer),
        data: local.data.clone(),
        string_data: None,
        type_: local.type_.clone(),
        immutable: local.immutable,
    })
}

/// The fields of a Service spec a copy carries; everything the provider allocates (cluster
/// IPs, node ports, load-balancer addresses) or that names the consumer's addresses is left
/// out. A headless Service stays headless.
fn service_spec(spec: &ServiceSpec) -> ServiceSpec {
    ServiceSpec {
        type_: spec.type_.clone(),
        selector: spec.selector.clone(),
        ports: spec.ports.as_ref().map(|ps| {
            ps.iter()
                .map(|p| ServicePort {
                    node_port: None,
                    ..p.clone()
                })
                .collect()
        }),
        cluster_ip: spec.cluster_ip.clone().filter(|ip| ip == "None"),
        external_name: spec.external_name.clone(),
        publish_not_ready_addresses: spec.publish_not_ready_addresses,
        session_affinity: spec.session_affinity.clone(),
        ..ServiceSpec::default()
    }
}

/// The copy of a local Service, `None` for one that is not reflected.
pub fn service(local: &Service, consumer: &str) -> Option<Service> {
    if skipped(&local.metadata) {
        return None;
    }
    let mut spec = service_spec(&local.spec.clone().unwrap_or_default());
    let keep_lb = local
        .annotations()
        .get(KEEP_LOAD_BALANCER)
        .is_some_and(|v| v == "true");
    if spec.type_.as_deref() == Some("LoadBalancer") && !keep_lb {
        spec.type_ = Some("ClusterIP".to_owned());
    }
    Some(Service {
        metadata: copy_meta(&local.metadata, consumer),
        spec: Some(spec),
        status: None,
    })
}

/// The slices to reflect for Service `service` from its local slices: the ready endpoints of
/// pods on this cluster's own nodes (not on `virtual_nodes`: those run at providers and are
/// selected there by the copy of the Service itself), addresses in the provider's view of
/// this cluster's pod CIDR (`view`; an address outside it is left out). One copy per local
/// slice with any such endpoint, named `<service>-tether-<n>`.
pub fn endpoint_slices(
    service: &str,
    local: &[EndpointSlice],
    virtual_nodes: &BTreeSet<String>,
    view: &PodView,
    consumer: &str,
) -> Vec<EndpointSlice> {
    let mut mine: Vec<&EndpointSlice> = local
        .iter()
        .filter(|s| {
            let l = s.labels();
            l.get(SERVICE_NAME).map(String::as_str) == Some(service)
                && l.get(SLICE_MANAGED_BY).map(String::as_str) == Some(KUBE_SLICE_MANAGER)
                && s.address_type == "IPv4"
        })
        .collect();
    mine.sort_by_key(|s| s.name_any());
    let mut out = Vec::new();
    for s in mine {
        let endpoints: Vec<Endpoint> = s
            .endpoints
            .iter()
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
            .filter(|e| {
                e.node_name
                    .as_ref()
                    .is_none_or(|n| !virtual_nodes.contains(n))
            })
            .filter_map(|e| {
                let addresses: Vec<String> = e
                    .addresses
                    .iter()
                    .filter_map(|a| view.translate(a))
                    .collect();
                (!addresses.is_empty()).then(|| Endpoint {
                    addresses,
                    conditions: Some(EndpointConditions {
                        ready: Some(true),
                        serving: Some(true),
                        terminating: Some(false),
                    }),
                    hostname: e.hostname.clone(),
                    ..Endpoint::default()
                })
            })
            .collect();
        if endpoints.is_empty() {
            continue;
        }
        let labels = BTreeMap::from([
            (SERVICE_NAME.to_owned(), service.to_owned()),
            (SLICE_MANAGED_BY.to_owned(), SLICE_MANAGER.to_owned()),
            (REFLECTED.to_owned(), "true".to_owned()),
            (REMOTE_CLUSTER_ID.to_owned(), consumer.to_owned()),
        ]);
        out.push(EndpointSlice {
            metadata: ObjectMeta {
                name: Some(format!("{service}-tether-{}", out.len())),
                labels: Some(labels),
                ..ObjectMeta::default()
            },
            address_type: "IPv4".to_owned(),
            endpoints,
            ports: s.ports.clone(),
        });
    }
    out
}

/// The changes that make the twin hold `wanted` (by name) among `remote`: a missing or
/// different copy is applied (recreated when `must_recreate` says it cannot change in place),
/// a copy of ours nothing wants is deleted, and a name taken by an object that is not ours is
/// a conflict.
pub fn diff<K: Resource + Clone>(
    wanted: Vec<K>,
    remote: &[K],
    consumer: &str,
    same: impl Fn(&K, &K) -> bool,
    must_recreate: impl Fn(&K, &K) -> bool,
) -> Vec<Op<K>> {
    let by_name: BTreeMap<String, &K> = remote
        .iter()
        .map(|k| (k.meta().name.clone().unwrap_or_default(), k))
        .collect();
    let mut ops = Vec::new();
    let mut kept = BTreeSet::new();
    for w in wanted {
        let name = w.meta().name.clone().unwrap_or_default();
        kept.insert(name.clone());
        match by_name.get(&name) {
            None => ops.push(Op::Apply(w)),
            Some(have) if !is_ours(have.meta(), consumer) => ops.push(Op::Conflict(name)),
            Some(have) if same(&w, have) => {}
            Some(have) if must_recreate(&w, have) => ops.push(Op::Recreate(w)),
            Some(_) => ops.push(Op::Apply(w)),
        }
    }
    for (name, have) in &by_name {
        if !kept.contains(name) && is_ours(have.meta(), consumer) {
            ops.push(Op::Delete(name.clone()));
        }
    }
    ops
}

/// The changes for ConfigMaps.
pub fn config_maps(
    local: &[ConfigMap],
    remote: &[ConfigMap],
    consumer: &str,
) -> Vec<Op<ConfigMap>> {
    let wanted = local
        .iter()
        .filter_map(|c| config_map(c, consumer))
        .collect();
    diff(
        wanted,
        remote,
        consumer,
        |w, h| {
            meta_matches(&w.metadata, &h.metadata)
                && w.data == h.data
                && w.binary_data == h.binary_data
                && w.immutable == h.immutable
        },
        |_, h| h.immutable == Some(true),
    )
}

/// The changes for Secrets.
pub fn secrets(local: &[Secret], remote: &[Secret], consumer: &str) -> Vec<Op<Secret>> {
    let wanted = local.iter().filter_map(|s| secret(s, consumer)).collect();
    diff(
        wanted,
        remote,
        consumer,
        |w, h| {
            meta_matches(&w.metadata, &h.metadata)
                && w.data == h.data
                && w.type_.as_deref().unwrap_or("Opaque") == h.type_.as_deref().unwrap_or("Opaque")
                && w.immutable == h.immutable
        },
        |w, h| {
            h.immutable == Some(true)
                || w.type_.as_deref().unwrap_or("Opaque") != h.type_.as_deref().unwrap_or("Opaque")
        },
    )
}

/// The changes for Services.
pub fn services(local: &[Service], remote: &[Service], consumer: &str) -> Vec<Op<Service>> {
    let wanted = local.iter().filter_map(|s| service(s, consumer)).collect();
    diff(
        wanted,
        remote,
        consumer,
        |w, h| {
            meta_matches(&w.metadata, &h.metadata)
                && w.spec.as_ref().map(service_spec) == h.spec.as_ref().map(service_spec)
        },
        // A headless Service cannot become one with an address, nor the reverse.
        |w, h| {
            let headless = |s: &Service| {
                s.spec
                    .as_ref()
                    .and_then(|s| s.cluster_ip.as_deref())
                    .is_some_and(|ip| ip == "None")
            };
            headless(w) != headless(h)
        },
    )
}

/// The changes for the EndpointSlices of every Service in `local_services`; slices of ours
/// for Services that are gone are deleted.
pub fn slices(
    local_services: &[Service],
    local_slices: &[EndpointSlice],
    remote: &[EndpointSlice],
    virtual_nodes: &BTreeSet<String>,
    view: &PodView,
    consumer: &str,
) -> Vec<Op<EndpointSlice>> {
    let wanted = local_services
        .iter()
        .filter(|s| service(s, consumer).is_some())
        .flat_map(|s| endpoint_slices(&s.name_any(), local_slices, virtual_nodes, view, consumer))
        .collect();
    // The provider's EndpointSlice controller copies a Service's labels, our marks included,
    // onto the slices it keeps for the copy: only slices managed by us are ours to change.
    let remote: Vec<EndpointSlice> = remote
        .iter()
        .filter(|s| s.labels().get(SLICE_MANAGED_BY).map(String::as_str) == Some(SLICE_MANAGER))
        .cloned()
        .collect();
    diff(
        wanted,
        &remote,
        consumer,
        |w, h| {
            w.metadata.labels == h.metadata.labels
                && w.endpoints == h.endpoints
                && w.ports == h.ports
                && w.address_type == h.address_type
        },
        |w, h| w.address_type != h.address_type,
    )
}

/// The reporting controller of Events copied back from a provider.
pub const EVENT_REPORTER: &str = "tether.dev/reflection";

/// The Events to show here, in `ns`, for the provider's Events about the pods it runs for
/// this cluster: `offloaded` names them (pod name → UID of the pod here, from the ShadowPods
/// in the twin, which are named after their pods). Each becomes an Event of the same name
/// about the pod here, its reporting instance the provider. Events about anything else in
/// the twin (a pod of that name running here is not the provider's) stay there, and so do
/// Normal Events: only Warnings come back (the watch asks for no others, see
/// [`crate::offloading::watched::WARNINGS_ONLY`]).
pub fn events<'a>(
    remote: impl IntoIterator<Item = &'a Event>,
    offloaded: &BTreeMap<String, String>,
    ns: &str,
    provider: &str,
) -> Vec<Event> {
    remote
        .into_iter()
        .filter_map(|e| {
            let about = e.regarding.as_ref()?;
            if about.kind.as_deref() != Some("Pod") || e.type_.as_deref() != Some("Warning") {
                return None;
            }
            let name = about.name.as_deref()?;
            let uid = offloaded.get(name)?;
            Some(Event {
                metadata: ObjectMeta {
                    name: e.metadata.name.clone(),
                    labels: Some(BTreeMap::from([(REFLECTED.to_owned(), "true".to_owned())])),
                    ..ObjectMeta::default()
                },
                regarding: Some(ObjectReference {
                    api_version: Some("v1".to_owned()),
                    kind: Some("Pod".to_owned()),
                    namespace: Some(ns.to_owned()),
                    name: Some(name.to_owned()),
                    uid: Some(uid.clone()),
                    ..ObjectReference::default()
                }),
                action: e.action.clone(),
                reason: e.reason.clone(),
                note: e.note.clone(),
                type_: e.type_.clone(),
                event_time: e.event_time.clone(),
                series: e.series.clone(),
                reporting_controller: Some(EVENT_REPORTER.to_owned()),
                reporting_instance: Some(provider.to_owned()),
                ..Event::default()
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
