//! Offloading from the command line: resource requests to providers (`tether offload
//! resources add|remove` and the request `tether peer --cpu/--memory/--pods` makes), and
//! namespaces extended into them (`tether offload|unoffload namespace`). A request is a ResourceSlice in the consumer;
//! its controller carries it to the provider, and a grant becomes a virtual node. A command
//! reports success only once the virtual node is Ready and free of the taints that keep
//! pods off a node not yet Ready, and a refused or failed request is
//! rolled back to what was there before.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use tether_api::ClusterId;
use tether_api::authentication::ResourceSlice;
use tether_api::conditions::{self, types};
use tether_api::names;
use tether_api::offloading::{
    NamespaceMappingStrategy, NamespaceOffloading, NamespaceOffloadingSpec,
    NamespaceOffloadingStatus, PodOffloadingStrategy,
};
use tether_resources::{Amount, Resources};

use crate::cluster::{Conn, UNDO_PATIENCE, gone_within};
use crate::error::{Error, Result, is_not_found};
use crate::install::FIELD_MANAGER;
use crate::progress::Progress;

const POLL: Duration = Duration::from_millis(250);
/// The one name a NamespaceOffloading has in the namespace it offloads.
const OFFLOADING: &str = "offloading";

/// One request: the slice's name, class and amounts.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The ResourceSlice's name, and the virtual node's: the provider's ID, or
    /// `<provider>-<suffix>` for further slices.
    pub name: String,
    /// The class of resources.
    pub class: String,
    /// The amounts, by resource name.
    pub resources: BTreeMap<String, Quantity>,
}

/// The amounts a user gave on the command line, as flag values.
#[derive(Debug, Clone, Default)]
pub struct Amounts<'a> {
    /// `--cpu`.
    pub cpu: Option<&'a str>,
    /// `--memory`.
    pub memory: Option<&'a str>,
    /// `--pods`.
    pub pods: Option<&'a str>,
}

impl Amounts<'_> {
    /// Whether any amount was given.
    pub fn any(&self) -> bool {
        self.cpu.is_some() || self.memory.is_some() || self.pods.is_some()
    }
}

/// The slice name for `provider` with an optional suffix.
pub fn slice_name(provider: &ClusterId, suffix: Option<&str>) -> Result<String> {
    let Some(suffix) = suffix else {
        return Ok(provider.as_str().to_owned());
    };
    let name = format!("{provider}-{suffix}");
    let valid = !suffix.is_empty()
        && name.len() <= 63
        && suffix
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !suffix.ends_with('-');
    if !valid {
        return Err(Error::Usage(format!(
            "--name {suffix:?}: the virtual node is named {provider}-<name>, so the name must be \
             lower-case letters, digits and '-', not end with '-', and keep the whole name within \
             63 characters"
        )));
    }
    Ok(name)
}

/// Validates the flags into a request; `None` when no amount was given.
pub fn request(
    provider: &ClusterId,
    suffix: Option<&str>,
    amounts: &Amounts<'_>,
    class: &str,
) -> Result<Option<Request>> {
    if !amounts.any() {
        return Ok(None);
    }
    let mut resources = BTreeMap::new();
    for (flag, resource, value) in [
        ("cpu", "cpu", amounts.cpu),
        ("memory", "memory", amounts.memory),
        ("pods", "pods", amounts.pods),
    ] {
        let Some(value) = value else { continue };
        let amount = Amount::parse(value).map_err(|e| Error::Usage(format!("--{flag}: {e}")))?;
        if amount <= Amount(0) {
            return Err(Error::Usage(format!(
                "--{flag} {value:?} must be more than 0; leave the flag out to ask for none"
            )));
        }
        if resource == "pods" && amount.0 % 1000 != 0 {
            return Err(Error::Usage(format!(
                "--pods {value:?} must be a whole number of pods"
            )));
        }
        resources.insert(resource.to_owned(), Quantity(amount.render()));
    }
    if class.is_empty()
        || class.len() > 63
        || !class
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        return Err(Error::Usage(format!(
            "--resource-class {class:?} must be a DNS label (lower-case letters, digits, '-')"
        )));
    }
    Ok(Some(Request {
        name: slice_name(provider, suffix)?,
        class: class.to_owned(),
        resources,
    }))
}

/// What a granted request became.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Granted {
    /// The virtual node's name.
    pub node: String,
    /// The grant, rendered (`cpu=2, memory=4Gi, pods=10`).
    pub resources: String,
}

fn slice_object(consumer: &ClusterId, provider: &ClusterId, req: &Request) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "authentication.tether.dev/v1alpha1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": req.name,
            "labels": names::labels::managed(),
        },
        "spec": {
            "consumerClusterID": consumer.as_str(),
            "providerClusterID": provider.as_str(),
            "class": req.class,
            "resources": req.resources,
        },
    })
}

/// Asks `provider` for the resources of `req` and waits until its virtual node is Ready. A
/// denial or a failure puts back what was there before (no slice, or the earlier request).
pub async fn ask(
    consumer: &Conn,
    consumer_id: &ClusterId,
    provider: &ClusterId,
    req: &Request,
    deadline: Instant,
    progress: &mut Progress,
) -> Result<Granted> {
    let ns = names::tenant_namespace(provider);
    let exists = Api::<Namespace>::all(consumer.client.clone())
        .get_opt(&ns)
        .await
        .map_err(Error::api(format!("reading namespace {ns}")))?
        .is_some_and(|n| n.metadata.deletion_timestamp.is_none());
    if !exists {
        return Err(Error::Check(format!(
            "this cluster is not peered with {provider} (no namespace {ns}); run `tether peer` first"
        )));
    }
    let api: Api<ResourceSlice> = Api::namespaced(consumer.client.clone(), &ns);
    let before = api.get_opt(&req.name).await.map_err(Error::api(format!(
        "reading ResourceSlice {ns}/{}",
        req.name
    )))?;
    let asked = Resources::from_quantities(&req.resources)
        .map(|r| r.to_string())
        .unwrap_or_default();
    progress.phase(format!("asking {provider} for {asked}"));
    let written = api
        .patch(
            &req.name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&slice_object(consumer_id, provider, req)),
        )
        .await
        .map_err(Error::api(format!(
            "writing ResourceSlice {ns}/{}",
            req.name
        )))?;
    let result = wait_granted(
        consumer,
        &api,
        provider,
        req,
        written.metadata.generation,
        deadline,
        progress,
    )
    .await;
    if result.is_err() {
        progress.phase(format!("putting back ResourceSlice {ns}/{}", req.name));
        let undone = match &before {
            // The controller withdraws the request at the provider before the slice goes: the
            // run ends once it is gone, so a refused request leaves nothing behind.
            None => match api.delete(&req.name, &DeleteParams::default()).await {
                Ok(_) if gone_within(&api, &req.name, UNDO_PATIENCE).await => {
                    Ok("deleted the new request".to_owned())
                }
                Ok(_) => Ok(format!(
                    "deleted the new request, but the controller had not released it after {} \
                     s (`kubectl get resourceslices -n {ns} {}` shows why)",
                    UNDO_PATIENCE.as_secs(),
                    req.name
                )),
                Err(e) => Err(e),
            },
            Some(old) => {
                let previous = Request {
                    name: req.name.clone(),
                    class: old.spec.class.clone(),
                    resources: old.spec.resources.clone(),
                };
                api.patch(
                    &req.name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&slice_object(consumer_id, provider, &previous)),
                )
                .await
                .map(|_| "restored the earlier request".to_owned())
            }
        };
        match undone {
            Ok(what) => progress.done(what),
            Err(e) => progress.failed(format!("could not put it back: {e}")),
        }
    }
    result
}

async fn wait_granted(
    consumer: &Conn,
    api: &Api<ResourceSlice>,
    provider: &ClusterId,
    req: &Request,
    generation: Option<i64>,
    deadline: Instant,
    progress: &mut Progress,
) -> Result<Granted> {
    let mut last = String::new();
    let granted = loop {
        let slice = api
            .get_opt(&req.name)
            .await
            .map_err(Error::api(format!("reading ResourceSlice {}", req.name)))?
            .ok_or_else(|| {
                Error::Check(format!(
                    "ResourceSlice {} disappeared while waiting for {provider}'s answer",
                    req.name
                ))
            })?;
        let status = slice.status.unwrap_or_default();
        let answer = conditions::find(&status.conditions, types::RESOURCES)
            .filter(|c| c.observed_generation == generation);
        if let Some(c) = answer {
            if c.message != last {
                progress.note(&c.message);
                last.clone_from(&c.message);
            }
            match (c.status.as_str(), c.reason.as_str()) {
                ("True", _) => break status.resources,
                ("False", reason) => {
                    progress.failed("refused");
                    return Err(Error::Check(format!(
                        "{provider} refused the request ({reason}): {}",
                        c.message
                    )));
                }
                _ => {}
            }
        }
        if Instant::now() >= deadline {
            progress.failed("timed out");
            return Err(Error::Check(format!(
                "{provider} did not answer the request in time; last state: {}",
                if last.is_empty() { "no answer" } else { &last }
            )));
        }
        tokio::time::sleep(POLL).await;
    };
    let shown = Resources::from_quantities(&granted)
        .map(|r| r.to_string())
        .unwrap_or_default();
    progress.done(format!("{provider} granted {shown}"));
    progress.phase(format!("waiting for virtual node {} to be Ready", req.name));
    let nodes: Api<Node> = Api::all(consumer.client.clone());
    let mut last = String::new();
    loop {
        let node = nodes
            .get_opt(&req.name)
            .await
            .map_err(Error::api(format!("reading Node {}", req.name)))?;
        let Some(line) = not_schedulable(node.as_ref()) else {
            break;
        };
        if line != last {
            progress.note(&line);
            last = line;
        }
        if Instant::now() >= deadline {
            progress.failed("timed out");
            return Err(Error::Check(format!(
                "virtual node {} did not become Ready in time; last state: {last}. `kubectl \
                 describe node {}` says more",
                req.name, req.name
            )));
        }
        tokio::time::sleep(POLL).await;
    }
    progress.done(format!("virtual node {} Ready", req.name));
    Ok(Granted {
        node: req.name.clone(),
        resources: shown,
    })
}

/// What still keeps pods off `node`, or `None` once the scheduler would place pods there.
/// Ready is not enough: the node lifecycle controller taints a node it saw NotReady, even
/// for a moment (a virtual node whose provider is slow to answer its first probe starts
/// NotReady), and lifts the taint only on a later pass, seconds after Ready. Until then pods scheduled at
/// once would all stay in the consumer.
pub fn not_schedulable(node: Option<&Node>) -> Option<String> {
    const LIFECYCLE_TAINTS: [&str; 2] = [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ];
    let Some(node) = node else {
        return Some("not registered".to_owned());
    };
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    match ready {
        None => return Some("registered, no Ready condition yet".to_owned()),
        Some(c) if c.status != "True" => {
            let message = c.message.as_deref().unwrap_or_default();
            return Some(if message.is_empty() {
                format!("Ready={}", c.status)
            } else {
                message.to_owned()
            });
        }
        Some(_) => {}
    }
    let held: Vec<String> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| LIFECYCLE_TAINTS.contains(&t.key.as_str()) && t.effect == "NoSchedule")
        .map(|t| format!("{}:{}", t.key, t.effect))
        .collect();
    (!held.is_empty()).then(|| {
        format!(
            "Ready, still tainted {} until the node lifecycle controller's next pass",
            held.join(", ")
        )
    })
}

/// Withdraws the request `name` from `provider` and waits until its virtual node is gone.
pub async fn withdraw(
    consumer: &Conn,
    provider: &ClusterId,
    name: &str,
    deadline: Instant,
    progress: &mut Progress,
) -> Result<()> {
    let ns = names::tenant_namespace(provider);
    let api: Api<ResourceSlice> = Api::namespaced(consumer.client.clone(), &ns);
    progress.phase(format!("withdrawing ResourceSlice {ns}/{name}"));
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(e) if is_not_found(&e) => {
            progress.failed("not found");
            return Err(Error::Check(format!(
                "there is no request {name} to {provider}; `kubectl get resourceslices -n {ns}` \
                 lists them"
            )));
        }
        Err(e) => return Err(Error::api(format!("deleting ResourceSlice {ns}/{name}"))(e)),
    }
    let nodes: Api<Node> = Api::all(consumer.client.clone());
    loop {
        let slice_left = api
            .get_opt(name)
            .await
            .map_err(Error::api(format!("reading ResourceSlice {ns}/{name}")))?
            .is_some();
        let node_left = nodes
            .get_opt(name)
            .await
            .map_err(Error::api(format!("reading Node {name}")))?
            .is_some();
        if !slice_left && !node_left {
            break;
        }
        if Instant::now() >= deadline {
            progress.failed("timed out");
            return Err(Error::Check(format!(
                "the request {name} to {provider} is still being withdrawn ({}); the controller \
                 keeps trying: check `tether status` and its logs",
                if node_left {
                    "its virtual node is still there"
                } else {
                    "the provider has not released it yet"
                }
            )));
        }
        tokio::time::sleep(POLL).await;
    }
    progress.done(format!(
        "request {name} withdrawn and virtual node {name} removed"
    ));
    Ok(())
}

/// What `tether offload namespace` asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct NamespaceRequest {
    /// The namespace.
    pub namespace: String,
    /// The NamespaceOffloading's spec.
    pub spec: NamespaceOffloadingSpec,
}

/// Validates the flags of `tether offload namespace`.
pub fn namespace_request(
    namespace: &str,
    pods: PodOffloadingStrategy,
    mapping: NamespaceMappingStrategy,
    remote_name: Option<&str>,
    selector: &[String],
) -> Result<NamespaceRequest> {
    let label = |s: &str| {
        !s.is_empty()
            && s.len() <= 63
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !s.starts_with('-')
            && !s.ends_with('-')
    };
    if !label(namespace) {
        return Err(Error::Usage(format!(
            "{namespace:?} is not a namespace name (a DNS label: lower-case letters, digits, '-')"
        )));
    }
    match (mapping, remote_name) {
        (NamespaceMappingStrategy::SelectedName, None) => {
            return Err(Error::Usage(
                "--namespace-mapping-strategy SelectedName needs --remote-namespace-name NAME"
                    .to_owned(),
            ));
        }
        (NamespaceMappingStrategy::SelectedName, Some(n)) if !label(n) => {
            return Err(Error::Usage(format!(
                "--remote-namespace-name {n:?} is not a namespace name (a DNS label)"
            )));
        }
        (NamespaceMappingStrategy::SelectedName, Some(_)) => {}
        (_, Some(_)) => {
            return Err(Error::Usage(
                "--remote-namespace-name is used only with --namespace-mapping-strategy \
                 SelectedName"
                    .to_owned(),
            ));
        }
        (_, None) => {}
    }
    let mut cluster_selector = BTreeMap::new();
    for pair in selector.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        let Some((k, v)) = pair.split_once('=') else {
            return Err(Error::Usage(format!(
                "--selector {pair:?} must be key=value (for example topology.kubernetes.io/region=eu)"
            )));
        };
        if k.is_empty() {
            return Err(Error::Usage(format!(
                "--selector {pair:?} has an empty key"
            )));
        }
        cluster_selector.insert(k.to_owned(), v.to_owned());
    }
    Ok(NamespaceRequest {
        namespace: namespace.to_owned(),
        spec: NamespaceOffloadingSpec {
            pod_offloading_strategy: pods,
            namespace_mapping_strategy: mapping,
            remote_namespace_name: remote_name.map(str::to_owned),
            cluster_selector,
        },
    })
}

/// Offloads a namespace and waits until every selected provider made its twin; a failure
/// puts back what was there before.
pub async fn offload_namespace(
    conn: &Conn,
    req: &NamespaceRequest,
    deadline: Instant,
    progress: &mut Progress,
) -> Result<NamespaceOffloadingStatus> {
    let ns = &req.namespace;
    let exists = Api::<Namespace>::all(conn.client.clone())
        .get_opt(ns)
        .await
        .map_err(Error::api(format!("reading namespace {ns}")))?
        .is_some_and(|n| n.metadata.deletion_timestamp.is_none());
    if !exists {
        return Err(Error::Check(format!(
            "namespace {ns} does not exist; create it first (`kubectl create namespace {ns}`)"
        )));
    }
    let api: Api<NamespaceOffloading> = Api::namespaced(conn.client.clone(), ns);
    let before = api.get_opt(OFFLOADING).await.map_err(Error::api(format!(
        "reading NamespaceOffloading {ns}/{OFFLOADING}"
    )))?;
    progress.phase(format!("offloading namespace {ns}"));
    let object = serde_json::json!({
        "apiVersion": "offloading.tether.dev/v1alpha1",
        "kind": "NamespaceOffloading",
        "metadata": { "name": OFFLOADING, "labels": names::labels::managed() },
        "spec": req.spec,
    });
    let written = api
        .patch(
            OFFLOADING,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&object),
        )
        .await
        .map_err(Error::api(format!(
            "writing NamespaceOffloading {ns}/{OFFLOADING}"
        )))?;
    let generation = written.metadata.generation;
    let mut last = String::new();
    let result = loop {
        let current = api.get_opt(OFFLOADING).await.map_err(Error::api(format!(
            "reading NamespaceOffloading {ns}/{OFFLOADING}"
        )))?;
        let status = current.and_then(|n| n.status).unwrap_or_default();
        let ready = conditions::find(&status.conditions, types::READY)
            .filter(|c| c.observed_generation == generation);
        if let Some(c) = ready {
            if c.message != last {
                progress.note(&c.message);
                last.clone_from(&c.message);
            }
            let phase = status.offloading_phase.clone().unwrap_or_default();
            match phase.as_str() {
                "Ready" => break Ok(status),
                "NoClusterSelected" | "AllFailed" | "SomeFailed" => {
                    let details = refusals(&status);
                    progress.failed(phase.clone());
                    break Err(Error::Check(format!(
                        "offloading namespace {ns} failed ({phase}): {}",
                        if details.is_empty() {
                            c.message.clone()
                        } else {
                            details.join("; ")
                        }
                    )));
                }
                _ => {}
            }
        }
        if Instant::now() >= deadline {
            progress.failed("timed out");
            break Err(Error::Check(format!(
                "namespace {ns} was not offloaded in time; last state: {}",
                if last.is_empty() { "no answer" } else { &last }
            )));
        }
        tokio::time::sleep(POLL).await;
    };
    match &result {
        Ok(status) => progress.done(format!(
            "namespace {ns} offloaded to {} provider(s) as {}",
            status.remote_namespaces_conditions.len(),
            status.remote_namespace_name.as_deref().unwrap_or("-")
        )),
        Err(_) => {
            progress.phase(format!(
                "putting back NamespaceOffloading {ns}/{OFFLOADING}"
            ));
            let undone = match &before {
                None => api
                    .delete(OFFLOADING, &DeleteParams::default())
                    .await
                    .map(|_| "removed the new NamespaceOffloading".to_owned()),
                Some(old) => {
                    let object = serde_json::json!({
                        "apiVersion": "offloading.tether.dev/v1alpha1",
                        "kind": "NamespaceOffloading",
                        "metadata": { "name": OFFLOADING },
                        "spec": old.spec,
                    });
                    api.patch(
                        OFFLOADING,
                        &PatchParams::apply(FIELD_MANAGER).force(),
                        &Patch::Apply(&object),
                    )
                    .await
                    .map(|_| "restored the earlier NamespaceOffloading".to_owned())
                }
            };
            match undone {
                Ok(what) => progress.done(what),
                Err(e) => progress.failed(format!("could not put it back: {e}")),
            }
        }
    }
    result
}

/// Unoffloads a namespace and waits until its pods left the virtual nodes and the twins are
/// gone.
pub async fn unoffload_namespace(
    conn: &Conn,
    ns: &str,
    deadline: Instant,
    progress: &mut Progress,
) -> Result<()> {
    let api: Api<NamespaceOffloading> = Api::namespaced(conn.client.clone(), ns);
    progress.phase(format!("unoffloading namespace {ns}"));
    match api.delete(OFFLOADING, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(e) if is_not_found(&e) => {
            progress.failed("not offloaded");
            return Err(Error::Check(format!("namespace {ns} is not offloaded")));
        }
        Err(e) => {
            return Err(Error::api(format!(
                "deleting NamespaceOffloading {ns}/{OFFLOADING}"
            ))(e));
        }
    }
    loop {
        if api
            .get_opt(OFFLOADING)
            .await
            .map_err(Error::api(format!(
                "reading NamespaceOffloading {ns}/{OFFLOADING}"
            )))?
            .is_none()
        {
            break;
        }
        if Instant::now() >= deadline {
            progress.failed("timed out");
            return Err(Error::Check(format!(
                "namespace {ns} is still being unoffloaded (its pods leave the virtual nodes and \
                 the providers remove the twins); the controller keeps trying: check `kubectl get \
                 namespaceoffloading -n {ns} -o yaml` and the controller's logs"
            )));
        }
        tokio::time::sleep(POLL).await;
    }
    progress.done(format!(
        "namespace {ns} unoffloaded: its pods run here and the twins are gone"
    ));
    Ok(())
}

/// One line per provider condition that is not True: `provider: Reason: message`. Older
/// controllers filed the provider's own message with its name in front, which is dropped here
/// so the provider reads once.
fn refusals(status: &NamespaceOffloadingStatus) -> Vec<String> {
    status
        .remote_namespaces_conditions
        .iter()
        .flat_map(|(p, cs)| {
            cs.iter().filter(|c| c.status != "True").map(move |c| {
                let message = c
                    .message
                    .strip_prefix(p.as_str())
                    .and_then(|m| m.strip_prefix(": "))
                    .unwrap_or(&c.message);
                format!("{p}: {}: {message}", c.reason)
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_api::conditions::Condition;

    fn ready(status: &str, reason: &str, message: &str) -> Vec<Condition> {
        vec![Condition {
            type_: types::READY.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message: message.to_owned(),
            observed_generation: None,
            last_transition_time: conditions::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        }]
    }

    #[test]
    fn each_refusal_names_its_provider_once() {
        let status = NamespaceOffloadingStatus {
            remote_namespaces_conditions: BTreeMap::from([
                (
                    "beta".to_owned(),
                    ready("False", "NamespaceTaken", "namespace shop already exists"),
                ),
                // As an older controller filed it.
                (
                    "delta".to_owned(),
                    ready(
                        "False",
                        "NamespaceTaken",
                        "delta: namespace shop already exists",
                    ),
                ),
                ("gamma".to_owned(), ready("True", "TwinReady", "ready")),
                // A name at the start that is not the old prefix stays.
                (
                    "epsilon".to_owned(),
                    ready("False", "Unreachable", "epsilon-2 is not this provider"),
                ),
            ]),
            ..Default::default()
        };
        assert_eq!(
            refusals(&status),
            [
                "beta: NamespaceTaken: namespace shop already exists",
                "delta: NamespaceTaken: namespace shop already exists",
                "epsilon: Unreachable: epsilon-2 is not this provider",
            ]
        );
    }

    fn node(ready: Option<(&str, &str)>, taints: &[(&str, &str)]) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "beta"},
            "spec": {"taints": taints.iter().map(|(k, e)| serde_json::json!({"key": k, "effect": e})).collect::<Vec<_>>()},
            "status": {"conditions": ready.map(|(status, message)| vec![serde_json::json!({
                "type": "Ready", "status": status, "message": message})]).unwrap_or_default()},
        }))
        .expect("a valid Node")
    }

    #[test]
    fn a_virtual_node_is_usable_once_ready_and_rid_of_lifecycle_taints() {
        let own = (names::taints::NOT_ALLOWED, "NoExecute");
        assert_eq!(not_schedulable(None).as_deref(), Some("not registered"));
        assert_eq!(
            not_schedulable(Some(&node(None, &[own]))).as_deref(),
            Some("registered, no Ready condition yet")
        );
        assert_eq!(
            not_schedulable(Some(&node(Some(("False", "waiting for beta")), &[own]))).as_deref(),
            Some("waiting for beta")
        );
        assert_eq!(
            not_schedulable(Some(&node(Some(("Unknown", "")), &[]))).as_deref(),
            Some("Ready=Unknown")
        );
        // Ready, but tainted by a pass of the lifecycle controller that saw it NotReady.
        let tainted = node(
            Some(("True", "")),
            &[
                own,
                ("node.kubernetes.io/not-ready", "NoSchedule"),
                ("node.kubernetes.io/not-ready", "NoExecute"),
            ],
        );
        assert_eq!(
            not_schedulable(Some(&tainted)).as_deref(),
            Some(
                "Ready, still tainted node.kubernetes.io/not-ready:NoSchedule until the node \
                 lifecycle controller's next pass"
            )
        );
        // Tether's own taint is what offloadable pods tolerate; it does not hold the wait.
        assert_eq!(
            not_schedulable(Some(&node(Some(("True", "")), &[own]))),
            None
        );
    }
}
