//! `tether install` and `tether uninstall`: apply the rendered objects with server-side apply in
//! dependency order, wait for the controller, explain why it is not ready, and remove it all.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Pod, Service};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, LogParams, Patch, PatchParams,
};
use tether_api::ClusterId;
use tether_api::core::ForeignCluster;
use tether_api::names::{SYSTEM_NAMESPACE, TENANT_NAMESPACE_PREFIX, labels, network, objects};

use crate::cluster::{self, Conn, PublicIdentity};
use crate::error::{Error, Result, is_not_found};
use crate::manifests::{self, Manifest, NetworkCidrs, each_manifest};
use crate::progress::Progress;

/// The field manager of everything the CLI applies.
pub const FIELD_MANAGER: &str = "tether";

/// How often waits poll the API server.
const POLL: Duration = Duration::from_millis(250);

/// Where the cluster ID of an install came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdSource {
    /// `--cluster-id`, on a first install.
    Flag,
    /// The ConfigMap of an earlier install.
    Stored,
    /// Generated now (first install without `--cluster-id`).
    Generated,
}

/// Decides the cluster ID: the stored one wins; `requested` must agree with it; a first install
/// without `requested` gets a generated one.
pub async fn resolve_cluster_id(
    client: &kube::Client,
    requested: Option<&ClusterId>,
) -> Result<(ClusterId, IdSource)> {
    let stored = cluster::stored_cluster_id(client).await?;
    match (requested, stored) {
        (Some(req), Some(stored)) if *req != stored => Err(Error::Usage(format!(
            "this cluster is already installed with cluster ID {stored:?}, not {:?}: a cluster's ID \
             cannot change while peers know it; drop --cluster-id to keep {stored:?}, or run \
             `tether uninstall` first to install with another ID",
            req.as_str()
        ))),
        (_, Some(stored)) => Ok((stored, IdSource::Stored)),
        (Some(req), None) => Ok((req.clone(), IdSource::Flag)),
        (None, None) => Ok((ClusterId::generate(), IdSource::Generated)),
    }
}

/// Where the network CIDRs came from, for the progress line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkSource {
    /// `--pod-cidr`/`--service-cidr`.
    Flags,
    /// The `tether-network` ConfigMap of an earlier install.
    Stored,
    /// The `kube-system/kubeadm-config` ConfigMap.
    Kubeadm,
}

/// Checks one CIDR flag: an IPv4 network without host bits.
pub fn check_cidr(flag: &str, text: &str) -> Result<String> {
    let net: ipnet::Ipv4Net = text.trim().parse().map_err(|_| {
        Error::Usage(format!(
            "--{flag} {text:?} is not an IPv4 CIDR such as 10.244.0.0/16"
        ))
    })?;
    if net.trunc() != net {
        return Err(Error::Usage(format!(
            "--{flag} {text} has host bits set; did you mean {}?",
            net.trunc()
        )));
    }
    Ok(net.to_string())
}

/// Checks `--remap-pool`: an IPv4 CIDR apart from this cluster's own pod and Service CIDRs
/// (a remapped peer must never be addressed like a local pod or Service).
pub fn check_remap_pool(text: &str, pod: &[String], service: &[String]) -> Result<String> {
    let pool = check_cidr("remap-pool", text)?;
    let net: ipnet::Ipv4Net = pool.parse().expect("invariant: just checked");
    for (what, flag, cidr) in pod
        .iter()
        .map(|c| ("pod", "pod-cidr", c))
        .chain(service.iter().map(|c| ("Service", "service-cidr", c)))
    {
        let Ok(own) = cidr.parse::<ipnet::Ipv4Net>() else {
            continue;
        };
        if net.contains(&own.network()) || own.contains(&net.network()) {
            return Err(Error::Usage(format!(
                "--remap-pool {pool} overlaps this cluster's {what} CIDR {own} (--{flag}): \
                 choose a CIDR apart from it"
            )));
        }
    }
    Ok(pool)
}

/// Checks `--external-cidr`: an IPv4 CIDR with room for the in-band hosts 1 and 2, apart
/// from this cluster's pod and Service CIDRs and its remap pool (peers address it as ours).
pub fn check_external_cidr(
    text: &str,
    pod: &[String],
    service: &[String],
    pool: Option<&str>,
) -> Result<String> {
    let external = check_cidr("external-cidr", text)?;
    let net: ipnet::Ipv4Net = external.parse().expect("invariant: just checked");
    if net.prefix_len() > 30 {
        return Err(Error::Usage(format!(
            "--external-cidr {external} is too small: it needs hosts 1 and 2 for the in-band \
             control plane; use a /30 or larger, e.g. {}",
            tether_api::names::in_band::DEFAULT_EXTERNAL_CIDR
        )));
    }
    for (what, flag, cidr) in pod
        .iter()
        .map(|c| ("pod", "pod-cidr", c.as_str()))
        .chain(
            service
                .iter()
                .map(|c| ("Service", "service-cidr", c.as_str())),
        )
        .chain(pool.map(|p| ("remap pool", "remap-pool", p)))
    {
        let Ok(own) = cidr.parse::<ipnet::Ipv4Net>() else {
            continue;
        };
        if net.contains(&own.network()) || own.contains(&net.network()) {
            return Err(Error::Usage(format!(
                "--external-cidr {external} overlaps this cluster's {what} {own} (--{flag}): \
                 choose an unused range, e.g. {}",
                tether_api::names::in_band::DEFAULT_EXTERNAL_CIDR
            )));
        }
    }
    Ok(external)
}

/// The cluster's CIDRs: the flags, else what an earlier install stored, else what kubeadm
/// recorded. Fails, saying which flag to pass, when none of them knows. The remap pool is the
/// flag, else the stored one, else none (the controller then uses RFC 1918).
pub async fn resolve_network(
    client: &kube::Client,
    pod_flag: Option<String>,
    service_flag: Option<String>,
    remap_flag: Option<String>,
    external_flag: Option<String>,
) -> Result<(NetworkCidrs, NetworkSource)> {
    let stored = Api::<ConfigMap>::namespaced(client.clone(), SYSTEM_NAMESPACE)
        .get_opt(objects::NETWORK_CONFIGMAP)
        .await
        .map_err(Error::api(format!(
            "reading ConfigMap {SYSTEM_NAMESPACE}/{}",
            objects::NETWORK_CONFIGMAP
        )))?
        .and_then(|cm| cm.data)
        .map(|d| {
            let list = |k: &str| -> Vec<String> {
                d.get(k)
                    .map(|v| {
                        v.split(',')
                            .map(str::trim)
                            .filter(|s| !s.is_empty())
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default()
            };
            (
                list(network::POD_CIDRS),
                list(network::SERVICE_CIDRS),
                list(network::REMAP_POOL).into_iter().next(),
                list(network::EXTERNAL_CIDR).into_iter().next(),
            )
        });
    let stored_external = stored.as_ref().and_then(|(_, _, _, e)| e.clone());
    let stored = stored.map(|(pod, service, pool, _)| (pod, service, pool));
    let stored_pool = stored.as_ref().and_then(|(_, _, pool)| pool.clone());
    let stored = stored.map(|(pod, service, _)| (pod, service));
    let kubeadm = match &stored {
        Some((pod, _)) if !pod.is_empty() => None,
        _ => kubeadm_networking(client).await?,
    };
    let (known_pod, known_service, source) = match (stored, kubeadm) {
        (Some((pod, service)), _) if !pod.is_empty() => (pod, service, NetworkSource::Stored),
        (_, Some((pod, service))) => (pod, service, NetworkSource::Kubeadm),
        _ => (Vec::new(), Vec::new(), NetworkSource::Flags),
    };
    let source = if pod_flag.is_some() {
        NetworkSource::Flags
    } else {
        source
    };
    let pod = pod_flag.map(|p| vec![p]).unwrap_or(known_pod);
    let service = service_flag.map(|s| vec![s]).unwrap_or(known_service);
    if pod.is_empty() {
        return Err(Error::Check(
            "cannot tell this cluster's pod CIDR (no kube-system/kubeadm-config ConfigMap and no \
             earlier install): pass --pod-cidr, e.g. --pod-cidr 10.244.0.0/16 (and --service-cidr)"
                .to_owned(),
        ));
    }
    // Checked against the CIDRs as resolved, which may be detected or stored rather than
    // given; a stored pool is checked too, since the pod CIDR may have changed under it.
    let remap_pool = remap_flag
        .or(stored_pool)
        .map(|p| check_remap_pool(&p, &pod, &service))
        .transpose()?;
    // Kept like the pod CIDR: changing it under running peerings would move their in-band
    // addresses.
    let external = external_flag
        .or(stored_external)
        .unwrap_or_else(|| tether_api::names::in_band::DEFAULT_EXTERNAL_CIDR.to_owned());
    let external = check_external_cidr(&external, &pod, &service, remap_pool.as_deref())?;
    Ok((
        NetworkCidrs {
            pod,
            service,
            remap_pool,
            external: Some(external),
        },
        source,
    ))
}

/// The `--resource-enforcement` of the installed controller, if there is one and it has
/// the flag, so that a re-install without the flag keeps it.
pub async fn stored_enforcement(
    client: &kube::Client,
) -> Result<Option<tether_resources::Enforcement>> {
    let deployment = Api::<Deployment>::namespaced(client.clone(), SYSTEM_NAMESPACE)
        .get_opt(objects::CONTROLLER)
        .await
        .map_err(Error::api(format!(
            "reading Deployment {SYSTEM_NAMESPACE}/{}",
            objects::CONTROLLER
        )))?;
    let args = deployment
        .and_then(|d| d.spec?.template.spec)
        .and_then(|s| s.containers.into_iter().next())
        .and_then(|c| c.args)
        .unwrap_or_default();
    Ok(args
        .iter()
        .find_map(|a| a.strip_prefix("--resource-enforcement="))
        .and_then(|m| m.parse().ok()))
}

/// `networking.podSubnet` and `serviceSubnet` of kubeadm's ClusterConfiguration, if the
/// cluster has one.
async fn kubeadm_networking(client: &kube::Client) -> Result<Option<(Vec<String>, Vec<String>)>> {
    let cm = match Api::<ConfigMap>::namespaced(client.clone(), "kube-system")
        .get_opt("kubeadm-config")
        .await
    {
        Ok(cm) => cm,
        // Not everyone may read kube-system; then there is nothing to detect.
        Err(kube::Error::Api(e)) if e.code == 403 => None,
        Err(e) => return Err(Error::api("reading kube-system/kubeadm-config")(e)),
    };
    let Some(text) = cm.and_then(|c| c.data?.get("ClusterConfiguration").cloned()) else {
        return Ok(None);
    };
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).map_err(|e| {
        Error::Check(format!(
            "kube-system/kubeadm-config holds an unreadable ClusterConfiguration: {e}"
        ))
    })?;
    let list = |key: &str| -> Vec<String> {
        doc.get("networking")
            .and_then(|n| n.get(key))
            .and_then(serde_yaml::Value::as_str)
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    // The networking module is IPv4; a dual-stack cluster lists IPv6 too.
                    .filter(|s| !s.is_empty() && !s.contains(':'))
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    };
    let pod = list("podSubnet");
    Ok((!pod.is_empty()).then(|| (pod, list("serviceSubnet"))))
}

/// One applied object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// `Kind namespace/name`.
    pub object: String,
    /// Its resourceVersion after the apply.
    pub resource_version: String,
    /// Whether the apply created or changed it.
    pub changed: bool,
}

fn api_resource_of<K: kube::Resource<DynamicType = ()>>(_: &K) -> ApiResource {
    ApiResource::erase::<K>(&())
}

fn dynamic_api(client: &kube::Client, m: &Manifest) -> Api<DynamicObject> {
    let ar = each_manifest!(m, o => api_resource_of(o));
    match m.namespace() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

/// Server-side applies one object (field manager `tether`, forced: Tether owns it).
pub async fn apply_one(client: &kube::Client, m: &Manifest) -> Result<Applied> {
    let api = dynamic_api(client, m);
    let before = api
        .get_metadata_opt(m.name())
        .await
        .map_err(Error::api(format!("reading {}", m.describe())))?
        .and_then(|o| o.metadata.resource_version);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let after = api
        .patch(m.name(), &params, &Patch::Apply(m.to_value()))
        .await
        .map_err(Error::api(format!("applying {}", m.describe())))?;
    let resource_version = after.metadata.resource_version.unwrap_or_default();
    Ok(Applied {
        object: m.describe(),
        changed: before.as_deref() != Some(resource_version.as_str()),
        resource_version,
    })
}

/// Applies every object in order, waiting for the CRDs to be Established before anything that
/// follows them. Reports one phase per group of objects.
pub async fn apply(
    client: &kube::Client,
    manifests: &[Manifest],
    timeout: Duration,
    progress: &mut Progress,
) -> Result<Vec<Applied>> {
    let deadline = Instant::now() + timeout;
    let mut applied = Vec::new();
    let mut i = 0;
    while i < manifests.len() {
        let group = group_of(&manifests[i]);
        let end = manifests[i..]
            .iter()
            .position(|m| group_of(m) != group)
            .map_or(manifests.len(), |n| i + n);
        let batch = &manifests[i..end];
        progress.phase(format!("applying {}", describe_batch(batch)));
        let mut changed = 0;
        for m in batch {
            let a = apply_one(client, m).await?;
            changed += usize::from(a.changed);
            applied.push(a);
        }
        let what = if changed == 0 {
            "unchanged".to_owned()
        } else {
            format!("{changed} created or changed")
        };
        progress.done(format!("{} ({what})", describe_batch(batch)));
        if group == "CRDs" {
            wait_established(client, batch, deadline, progress).await?;
        }
        i = end;
    }
    Ok(applied)
}

fn group_of(m: &Manifest) -> &'static str {
    match m {
        Manifest::Namespace(_) => "namespace",
        Manifest::CustomResourceDefinition(_) => "CRDs",
        Manifest::ServiceAccount(_)
        | Manifest::ClusterRole(_)
        | Manifest::ClusterRoleBinding(_)
        | Manifest::Role(_)
        | Manifest::RoleBinding(_) => "RBAC",
        Manifest::ConfigMap(_) => "configmap",
        Manifest::Deployment(_) => "deployment",
        Manifest::DaemonSet(_) => "daemonset",
        Manifest::Service(_) => "service",
        Manifest::MutatingWebhookConfiguration(_) => "webhook",
        Manifest::StorageClass(_) => "storageclass",
    }
}

fn describe_batch(batch: &[Manifest]) -> String {
    match batch {
        [one] => one.describe(),
        [first, ..] if group_of(first) == "CRDs" => format!("{} CRDs", batch.len()),
        [first, ..] if group_of(first) == "service" => format!(
            "{} Services ({})",
            batch.len(),
            batch
                .iter()
                .map(Manifest::name)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        _ => format!(
            "RBAC: {} objects (ServiceAccount, ClusterRoles, Roles and bindings)",
            batch.len()
        ),
    }
}

async fn wait_established(
    client: &kube::Client,
    crds: &[Manifest],
    deadline: Instant,
    progress: &mut Progress,
) -> Result<()> {
    progress.phase("waiting for the CRDs to be Established");
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    loop {
        let mut pending = Vec::new();
        for m in crds {
            let crd = api
                .get(m.name())
                .await
                .map_err(Error::api(format!("reading {}", m.describe())))?;
            let established = crd
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if !established {
                pending.push(m.name().to_owned());
            }
        }
        if pending.is_empty() {
            progress.done("CRDs Established");
            return Ok(());
        }
        progress.update(format!("{} not Established yet", pending.len()));
        if Instant::now() >= deadline {
            progress.failed("CRDs not Established");
            return Err(Error::Check(format!(
                "the API server did not establish the CRDs {} in time; check `kubectl get crd \
                 {}` for a NamesAccepted conflict, then run `tether install` again",
                pending.join(", "),
                pending[0]
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Whether the controller Deployment has rolled out: the newest generation observed, every
/// replica updated and available, no old replica left. Returns the progress line too.
pub fn rollout_status(d: &Deployment) -> (bool, String) {
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let Some(status) = &d.status else {
        return (false, format!("0/{want} replicas available"));
    };
    let observed = status.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0);
    let updated = status.updated_replicas.unwrap_or(0);
    let available = status.available_replicas.unwrap_or(0);
    let total = status.replicas.unwrap_or(0);
    let done = observed && updated >= want && available >= want && total <= updated;
    let mut line = format!("{available}/{want} replicas available, {updated}/{want} updated");
    if total > updated {
        line.push_str(&format!(", {} old replicas terminating", total - updated));
    }
    (done, line)
}

/// Waits until the controller Deployment is available and the public identity is published
/// for `cluster_id`; on a timeout explains why (pod status, last container state, events).
pub async fn wait_ready(
    client: &kube::Client,
    cluster_id: &ClusterId,
    timeout: Duration,
    progress: &mut Progress,
) -> Result<PublicIdentity> {
    let deadline = Instant::now() + timeout;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    progress.phase(format!(
        "waiting for Deployment {SYSTEM_NAMESPACE}/{} to be available",
        objects::CONTROLLER
    ));
    loop {
        let d = deployments
            .get_opt(objects::CONTROLLER)
            .await
            .map_err(Error::api(format!(
                "reading Deployment {SYSTEM_NAMESPACE}/{}",
                objects::CONTROLLER
            )))?;
        let Some(d) = d else {
            return Err(Error::Check(format!(
                "Deployment {SYSTEM_NAMESPACE}/{} does not exist; run `tether install` again",
                objects::CONTROLLER
            )));
        };
        let (done, line) = rollout_status(&d);
        if done {
            progress.done(format!("controller available ({line})"));
            break;
        }
        progress.update(line.clone());
        if Instant::now() >= deadline {
            progress.failed(format!("controller not available: {line}"));
            let why = diagnose_controller(client).await;
            return Err(Error::Check(format!(
                "the controller did not become available within {}: {line}\n{why}\nFix the \
                 cause, then run `tether install` again (it keeps the cluster ID).",
                crate::text::format_duration(timeout)
            )));
        }
        tokio::time::sleep(POLL).await;
    }
    progress.phase("waiting for the controller to publish the authentication URL and fingerprint");
    loop {
        let identity = cluster::public_identity(client).await?;
        let matches = identity.as_ref().is_some_and(|i| {
            i.cluster_id
                .as_deref()
                .is_none_or(|id| id == cluster_id.as_str())
        });
        if let Some(identity) = identity.filter(|i| i.is_complete() && matches) {
            progress.done("public identity published");
            return Ok(identity);
        }
        if Instant::now() >= deadline {
            progress.failed("public identity not published");
            let service = auth_service_hint(client).await;
            return Err(Error::Check(format!(
                "the controller is running but has not published authURL and authFingerprint in \
                 ConfigMap {SYSTEM_NAMESPACE}/{} within {}. {service}",
                objects::PUBLIC_IDENTITY_CONFIGMAP,
                crate::text::format_duration(timeout)
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}

async fn auth_service_hint(client: &kube::Client) -> String {
    let api: Api<Service> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let Ok(Some(svc)) = api.get_opt(objects::AUTH_SERVICE).await else {
        return format!(
            "Service {SYSTEM_NAMESPACE}/{} is missing; run `tether install` again.",
            objects::AUTH_SERVICE
        );
    };
    let type_ = svc
        .spec
        .as_ref()
        .and_then(|s| s.type_.clone())
        .unwrap_or_default();
    let has_ingress = svc
        .status
        .and_then(|s| s.load_balancer)
        .and_then(|lb| lb.ingress)
        .is_some_and(|i| !i.is_empty());
    if type_ == "LoadBalancer" && !has_ingress {
        format!(
            "Service {SYSTEM_NAMESPACE}/{} has no load-balancer address yet: the cluster may have \
             no load-balancer provider. Reinstall with `--auth-service-type NodePort`, or give \
             the address peers use with `--auth-url https://HOST:PORT`.",
            objects::AUTH_SERVICE
        )
    } else {
        format!(
            "Check the controller's logs: `kubectl -n {SYSTEM_NAMESPACE} logs deploy/{}`.",
            objects::CONTROLLER
        )
    }
}

/// Why the controller is not available: each pod's phase, unready conditions, container
/// states (current and last), its events and the tail of its log.
pub async fn diagnose_controller(client: &kube::Client) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let list = match pods
        .list(&ListParams::default().labels(&manifests::controller_selector()))
        .await
    {
        Ok(l) => l.items,
        Err(e) => return format!("(cannot list the controller's pods: {e})"),
    };
    let events: Vec<Event> = Api::<Event>::namespaced(client.clone(), SYSTEM_NAMESPACE)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let mut out = String::new();
    if list.is_empty() {
        out.push_str("No controller pod exists.");
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
        if let Ok(d) = deployments.get(objects::CONTROLLER).await {
            for c in d
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .filter(|c| c.status != "True")
            {
                out.push_str(&format!(
                    "\n  Deployment condition {} {}: {} {}",
                    c.type_,
                    c.status,
                    c.reason.as_deref().unwrap_or(""),
                    c.message.as_deref().unwrap_or("")
                ));
            }
        }
        for e in events
            .iter()
            .filter(|e| e.involved_object.kind.as_deref() == Some("ReplicaSet"))
        {
            out.push_str(&format!("\n  {}", event_line(e)));
        }
        return out;
    }
    for pod in &list {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let status = pod.status.clone().unwrap_or_default();
        out.push_str(&format!(
            "Pod {SYSTEM_NAMESPACE}/{name}: phase {}",
            status.phase.as_deref().unwrap_or("Unknown")
        ));
        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            out.push_str(&format!(" on node {node}"));
        }
        for c in status
            .conditions
            .unwrap_or_default()
            .iter()
            .filter(|c| c.status != "True")
        {
            out.push_str(&format!(
                "\n  condition {} {}: {} {}",
                c.type_,
                c.status,
                c.reason.as_deref().unwrap_or(""),
                c.message.as_deref().unwrap_or("")
            ));
        }
        let mut restarted = false;
        for cs in status.container_statuses.unwrap_or_default() {
            out.push_str(&format!(
                "\n  container {}: {}, ready {}, {} restarts",
                cs.name,
                state_line(cs.state.as_ref()),
                cs.ready,
                cs.restart_count
            ));
            if cs
                .last_state
                .as_ref()
                .is_some_and(|s| s.terminated.is_some())
            {
                restarted = true;
                out.push_str(&format!(
                    "\n    last state: {}",
                    state_line(cs.last_state.as_ref())
                ));
            }
        }
        for e in events.iter().filter(|e| {
            e.involved_object.kind.as_deref() == Some("Pod")
                && e.involved_object.name.as_deref() == Some(name.as_str())
        }) {
            out.push_str(&format!("\n  {}", event_line(e)));
        }
        let params = LogParams {
            container: Some(manifests::CONTAINER.to_owned()),
            tail_lines: Some(10),
            previous: restarted,
            ..Default::default()
        };
        if let Ok(log) = pods.logs(&name, &params).await
            && !log.trim().is_empty()
        {
            out.push_str("\n  last log lines:");
            for line in log.lines() {
                out.push_str(&format!("\n    {line}"));
            }
        }
        out.push('\n');
    }
    out.trim_end().to_owned()
}

fn state_line(state: Option<&k8s_openapi::api::core::v1::ContainerState>) -> String {
    let Some(state) = state else {
        return "no state".to_owned();
    };
    if let Some(w) = &state.waiting {
        return format!(
            "waiting ({}{})",
            w.reason.as_deref().unwrap_or("no reason"),
            w.message
                .as_deref()
                .map(|m| format!(": {m}"))
                .unwrap_or_default()
        );
    }
    if let Some(t) = &state.terminated {
        return format!(
            "terminated with exit code {} ({}{})",
            t.exit_code,
            t.reason.as_deref().unwrap_or("no reason"),
            t.message
                .as_deref()
                .map(|m| format!(": {m}"))
                .unwrap_or_default()
        );
    }
    "running".to_owned()
}

fn event_line(e: &Event) -> String {
    format!(
        "event {} {}: {}",
        e.type_.as_deref().unwrap_or("Normal"),
        e.reason.as_deref().unwrap_or(""),
        e.message.as_deref().unwrap_or("").trim()
    )
}

/// What `tether uninstall` does.
#[derive(Debug, Clone, Copy)]
pub struct UninstallOptions {
    /// Go on while peerings exist; remove finalizers that would block.
    pub force: bool,
    /// Keep the CRDs.
    pub keep_crds: bool,
    /// How long to wait until everything is gone.
    pub timeout: Duration,
}

/// One object uninstall deletes and waits for.
#[derive(Debug, Clone)]
struct Doomed {
    ar: ApiResource,
    namespace: Option<String>,
    name: String,
    describe: String,
}

impl Doomed {
    fn of<K: kube::Resource<DynamicType = ()>>(namespace: Option<&str>, name: &str) -> Self {
        let ar = ApiResource::erase::<K>(&());
        let describe = match namespace {
            Some(ns) => format!("{} {ns}/{name}", ar.kind),
            None => format!("{} {name}", ar.kind),
        };
        Self {
            ar,
            namespace: namespace.map(str::to_owned),
            name: name.to_owned(),
            describe,
        }
    }

    fn api(&self, client: &kube::Client) -> Api<DynamicObject> {
        match &self.namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &self.ar),
            None => Api::all_with(client.clone(), &self.ar),
        }
    }
}

/// Removes everything `tether install` created, Tether's tenant namespaces and token Secrets,
/// and (without `keep_crds`) the CRDs with every custom resource; waits until all are gone.
pub async fn uninstall(conn: &Conn, opts: UninstallOptions, progress: &mut Progress) -> Result<()> {
    let client = &conn.client;
    let deadline = Instant::now() + opts.timeout;
    let crd_api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let tether_crds: Vec<String> = tether_api::crds::all()
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    let mut present_crds = Vec::new();
    for name in &tether_crds {
        if crd_api
            .get_metadata_opt(name)
            .await
            .map_err(Error::api(format!("reading CRD {name}")))?
            .is_some()
        {
            present_crds.push(name.clone());
        }
    }
    let fc_crd = format!("foreignclusters.{}", "core.tether.dev");
    if present_crds.contains(&fc_crd) {
        let fcs = Api::<ForeignCluster>::all(client.clone())
            .list(&ListParams::default())
            .await
            .map_err(Error::api("listing ForeignClusters"))?;
        let names: Vec<String> = fcs
            .items
            .iter()
            .filter_map(|f| f.metadata.name.clone())
            .collect();
        if !names.is_empty() && !opts.force {
            return Err(Error::Check(format!(
                "this cluster still peers with {}: run `tether unpeer --remote-cluster-id ID` \
                 for each (on the consumer side), or pass --force to uninstall anyway (the \
                 peers keep stale ForeignClusters)",
                names.join(", ")
            )));
        }
        if !names.is_empty() {
            progress.note(format!(
                "--force: uninstalling although this cluster peers with {}",
                names.join(", ")
            ));
        }
    }

    progress.phase("stopping the controller");
    delete(
        client,
        &Doomed::of::<Deployment>(Some(SYSTEM_NAMESPACE), objects::CONTROLLER),
    )
    .await?;
    progress.done("controller Deployment deleted");
    progress.phase("stopping the fabric");
    delete(
        client,
        &Doomed::of::<DaemonSet>(Some(SYSTEM_NAMESPACE), objects::FABRIC),
    )
    .await?;
    progress.done("fabric DaemonSet deleted");

    if opts.force && !present_crds.is_empty() {
        progress.phase("removing finalizers of Tether objects");
        let mut cleared = 0;
        for crd in tether_api::crds::all() {
            let name = crd.metadata.name.clone().unwrap_or_default();
            if !present_crds.contains(&name) {
                continue;
            }
            let version = crd
                .spec
                .versions
                .first()
                .map(|v| v.name.clone())
                .unwrap_or_default();
            let ar = ApiResource {
                group: crd.spec.group.clone(),
                version: version.clone(),
                api_version: format!("{}/{version}", crd.spec.group),
                kind: crd.spec.names.kind.clone(),
                plural: crd.spec.names.plural.clone(),
            };
            let all: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
            let items = all
                .list(&ListParams::default())
                .await
                .map_err(Error::api(format!("listing {}", ar.plural)))?;
            let cluster_scoped = crd.spec.scope == "Cluster";
            for obj in items.items {
                let obj_name = obj.metadata.name.clone().unwrap_or_default();
                let api: Api<DynamicObject> = match &obj.metadata.namespace {
                    Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
                    None => Api::all_with(client.clone(), &ar),
                };
                if obj
                    .metadata
                    .finalizers
                    .as_ref()
                    .is_some_and(|f| !f.is_empty())
                {
                    let patch = serde_json::json!({"metadata": {"finalizers": null}});
                    match api
                        .patch(&obj_name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                    {
                        Ok(_) => cleared += 1,
                        Err(e) if is_not_found(&e) => {}
                        Err(e) => {
                            return Err(Error::api(format!(
                                "removing the finalizers of {} {obj_name}",
                                ar.kind
                            ))(e));
                        }
                    }
                }
                if cluster_scoped {
                    match api.delete(&obj_name, &DeleteParams::default()).await {
                        Ok(_) => {}
                        Err(e) if is_not_found(&e) => {}
                        Err(e) => {
                            return Err(Error::api(format!("deleting {} {obj_name}", ar.kind))(e));
                        }
                    }
                }
            }
        }
        progress.done(format!("finalizers removed from {cleared} objects"));
    }

    // The pod webhook first: once the controller is gone it would refuse every new pod of
    // an offloaded namespace.
    let mut doomed = vec![Doomed::of::<
        k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration,
    >(None, objects::POD_WEBHOOK)];
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let all_ns = namespaces
        .list(&ListParams::default())
        .await
        .map_err(Error::api("listing namespaces"))?;
    for ns in all_ns.items {
        let name = ns.metadata.name.clone().unwrap_or_default();
        let labelled = ns
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(labels::TENANT_NAMESPACE));
        // Twin namespaces hold consumers' pods, which must not outlive Tether.
        let twin = ns.metadata.labels.as_ref().is_some_and(|l| {
            l.contains_key(labels::ORIGIN_NAMESPACE)
                && l.get(labels::MANAGED_BY).map(String::as_str) == Some(labels::MANAGED_BY_VALUE)
        });
        if labelled || twin || name.starts_with(TENANT_NAMESPACE_PREFIX) {
            doomed.push(Doomed::of::<Namespace>(None, &name));
        }
    }
    for name in [
        objects::CONTROLLER,
        objects::CONTROLLER_TENANT_ROLE,
        objects::TENANT_ROLE,
        objects::TENANT_OFFLOADED_ROLE,
        objects::GATEWAY,
        objects::GATEWAY_NODES_ROLE,
        objects::FABRIC,
    ] {
        doomed.push(Doomed::of::<ClusterRole>(None, name));
    }
    for name in [objects::CONTROLLER, objects::FABRIC] {
        doomed.push(Doomed::of::<ClusterRoleBinding>(None, name));
    }
    doomed.push(Doomed::of::<k8s_openapi::api::storage::v1::StorageClass>(
        None,
        tether_api::names::storage::STORAGE_CLASS,
    ));
    for (namespace, name) in [
        ("default", manifests::APISERVER_ROLE),
        (manifests::NODE_LEASE_NAMESPACE, manifests::NODE_LEASE_ROLE),
        (manifests::CLIENT_CA_NAMESPACE, manifests::CLIENT_CA_ROLE),
    ] {
        doomed.push(Doomed::of::<Role>(Some(namespace), name));
        doomed.push(Doomed::of::<RoleBinding>(Some(namespace), name));
    }
    doomed.push(Doomed::of::<Namespace>(None, SYSTEM_NAMESPACE));
    if !opts.keep_crds {
        for name in &present_crds {
            doomed.push(Doomed::of::<CustomResourceDefinition>(None, name));
        }
    }

    progress.phase(format!("deleting {} objects", doomed.len()));
    for d in &doomed {
        delete(client, d).await?;
    }
    progress.done(format!("deleted {} objects", doomed.len()));

    progress.phase("waiting until everything is gone");
    loop {
        let mut left = Vec::new();
        for d in &doomed {
            match d.api(client).get_metadata_opt(&d.name).await {
                Ok(Some(_)) => left.push(d.describe.clone()),
                Ok(None) => {}
                Err(e) => return Err(Error::api(format!("reading {}", d.describe))(e)),
            }
        }
        if left.is_empty() {
            progress.done("Tether removed");
            return Ok(());
        }
        progress.update(format!("{} left: {}", left.len(), left.join(", ")));
        if Instant::now() >= deadline {
            progress.failed("not everything is gone");
            let hint = if opts.force {
                "something outside Tether holds them (check their finalizers with `kubectl get \
                 -o yaml`)"
            } else {
                "they may hold Tether objects with finalizers; run `tether uninstall --force`"
            };
            return Err(Error::Check(format!(
                "still present after {}: {}; {hint}",
                crate::text::format_duration(opts.timeout),
                left.join(", ")
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}

async fn delete(client: &kube::Client, d: &Doomed) -> Result<()> {
    match d
        .api(client)
        .delete(&d.name, &DeleteParams::background())
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(Error::api(format!("deleting {}", d.describe))(e)),
    }
}

/// The admission webhook's CA, if the controller made one already (kept across re-installs
/// so that the webhook configuration is never without it).
pub async fn webhook_ca(client: &kube::Client) -> Result<Option<String>> {
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let secret = match secrets.get_opt(objects::WEBHOOK_TLS_SECRET).await {
        Ok(s) => s,
        Err(e) if is_not_found(&e) => None,
        Err(e) => {
            return Err(Error::api(format!(
                "reading Secret {SYSTEM_NAMESPACE}/{}",
                objects::WEBHOOK_TLS_SECRET
            ))(e));
        }
    };
    Ok(secret
        .and_then(|s| s.data)
        .and_then(|d| d.get("ca.crt").cloned())
        .and_then(|b| String::from_utf8(b.0).ok()))
}

/// The admission webhook's CA, made (with its serving certificate, in a Secret the
/// controller reads) if there is none yet.
pub async fn ensure_webhook_tls(client: &kube::Client) -> Result<String> {
    tether_controllers::webhook::WebhookCert::load_or_create(client.clone(), SYSTEM_NAMESPACE)
        .await
        .map(|c| c.ca_pem)
        .map_err(|e| {
            Error::Check(format!(
                "preparing the admission webhook's certificate: {e}"
            ))
        })
}
