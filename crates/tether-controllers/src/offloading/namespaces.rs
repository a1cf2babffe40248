//! The consumer's NamespaceOffloading reconciler: for the namespace it lives in, picks the
//! providers (virtual nodes whose labels match the cluster selector), asks each for a twin
//! namespace (a NamespaceOffloading request in the tenant namespace there, which the
//! provider's `twins` reconciler answers), labels the namespace for the pod webhook, and sums
//! the answers up. Unoffloading drains the namespace's pods from virtual nodes and withdraws
//! the requests, which removes the twins.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event, finalizer};
use tether_api::ClusterId;
use tether_api::conditions::{self, Condition, Status, Time, types};
use tether_api::names::{TENANT_NAMESPACE_PREFIX, finalizers, labels};
use tether_api::offloading::{
    NamespaceOffloading, NamespaceOffloadingSpec, NamespaceOffloadingStatus, PodOffloadingStrategy,
    VirtualNode,
};

use super::OffCtx;
use crate::Error;
use crate::context::FIELD_MANAGER;
use crate::providers::Remote;

/// The only name a NamespaceOffloading may have in the namespace it offloads.
pub const NAME: &str = "offloading";

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// Reconciles one consumer-side NamespaceOffloading (requests held in tenant namespaces are
/// the provider's, answered elsewhere).
pub async fn reconcile(no: Arc<NamespaceOffloading>, octx: Arc<OffCtx>) -> Result<Action, Error> {
    let started = Instant::now();
    let ns = no.namespace().unwrap_or_default();
    if ns.starts_with(TENANT_NAMESPACE_PREFIX) {
        return Ok(Action::await_change());
    }
    let api: Api<NamespaceOffloading> = Api::namespaced(octx.ctx.client.clone(), &ns);
    let result = finalizer(&api, finalizers::NAMESPACE_OFFLOADING, no, |event| async {
        match event {
            Event::Apply(n) => offload(&n, &octx).await,
            Event::Cleanup(n) => unoffload(&n, &octx).await,
        }
    })
    .await
    .map_err(Error::finalizer("NamespaceOffloading"));
    octx.ctx.metrics.reconciled(
        "namespaceoffloading",
        result.as_ref().err(),
        started.elapsed(),
    );
    match result {
        Err(e) if e.api_status() == Some(409) => Ok(Action::requeue(Duration::from_millis(200))),
        other => other,
    }
}

/// The providers whose virtual nodes match `selector` (every provider with a virtual node
/// when it is empty).
async fn selected_providers(
    client: &kube::Client,
    selector: &BTreeMap<String, String>,
) -> Result<BTreeSet<ClusterId>, Error> {
    let vns = Api::<VirtualNode>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("listing VirtualNodes"))?;
    let nodes: Api<Node> = Api::all(client.clone());
    let mut out = BTreeSet::new();
    for vn in vns.items {
        let Ok(provider) = ClusterId::new(&vn.spec.cluster_id) else {
            continue;
        };
        if out.contains(&provider) {
            continue;
        }
        let node_labels = nodes
            .get_opt(&vn.name_any())
            .await
            .map_err(Error::kube(format!("reading Node {}", vn.name_any())))?
            .map(|n| n.labels().clone())
            .unwrap_or_default();
        if selector.iter().all(|(k, v)| node_labels.get(k) == Some(v)) {
            out.insert(provider);
        }
    }
    Ok(out)
}

async fn offload(no: &NamespaceOffloading, octx: &OffCtx) -> Result<Action, Error> {
    let ctx = &octx.ctx;
    let ns = no.namespace().unwrap_or_default();
    let generation = no.metadata.generation;
    let mut status = no.status.clone().unwrap_or_default();
    if no.name_any() != NAME {
        conditions::set(
            &mut status.conditions,
            types::READY,
            Status::False,
            "InvalidName",
            format!(
                "a NamespaceOffloading must be named {NAME:?}; `tether offload namespace {ns}` creates it"
            ),
            generation,
            now(),
        );
        write_status(ctx, no, status).await?;
        return Ok(Action::await_change());
    }
    label_namespace(
        &ctx.client,
        &ns,
        no.spec.pod_offloading_strategy != PodOffloadingStrategy::Local,
    )
    .await?;
    let providers = selected_providers(&ctx.client, &no.spec.cluster_selector).await?;
    let mut per_provider: BTreeMap<String, Vec<Condition>> = BTreeMap::new();
    let mut remote_names = BTreeSet::new();
    let (mut ready, mut failed) = (0usize, 0usize);
    for provider in &providers {
        let (cond, remote_name) = request_twin(octx, &ns, &no.spec, provider).await;
        match cond.status.as_str() {
            "True" => ready += 1,
            "False" if cond.reason != "Pending" && cond.reason != "Unreachable" => failed += 1,
            _ => {}
        }
        if let Some(n) = remote_name {
            remote_names.insert(n);
        }
        per_provider.insert(provider.as_str().to_owned(), vec![cond]);
    }
    // Providers no longer selected give their twins back.
    for gone in status
        .remote_namespaces_conditions
        .keys()
        .filter(|p| !per_provider.contains_key(*p))
        .filter_map(|p| ClusterId::new(p).ok())
        .collect::<Vec<_>>()
    {
        withdraw_twin(octx, &ns, &gone).await?;
    }
    let total = providers.len();
    let phase = if total == 0 {
        "NoClusterSelected"
    } else if ready == total {
        "Ready"
    } else if failed == total {
        "AllFailed"
    } else if failed > 0 {
        "SomeFailed"
    } else {
        "InProgress"
    };
    let (s, reason, message) = summary(
        &ns,
        phase,
        no.spec.cluster_selector.is_empty(),
        &per_provider,
    );
    status.offloading_phase = Some(phase.to_owned());
    status.remote_namespace_name = remote_names.into_iter().next();
    status.remote_namespaces_conditions = per_provider;
    conditions::set(
        &mut status.conditions,
        types::READY,
        s,
        reason,
        message,
        generation,
        now(),
    );
    write_status(ctx, no, status).await?;
    Ok(Action::requeue(if phase == "Ready" {
        Duration::from_secs(30)
    } else {
        Duration::from_secs(2)
    }))
}

/// The `Ready` condition of the offloading of `ns` in `phase`, from the providers' own
/// conditions: a phase short of Ready names each provider that is not ready and why, so
/// `kubectl get namespaceoffloading` says which provider to look at.
pub fn summary(
    ns: &str,
    phase: &str,
    no_selector: bool,
    per_provider: &BTreeMap<String, Vec<Condition>>,
) -> (Status, &'static str, String) {
    let total = per_provider.len();
    match phase {
        "Ready" => (
            Status::True,
            "Ready",
            format!("namespace {ns} extends into {total} provider(s)"),
        ),
        "NoClusterSelected" => (
            Status::False,
            "NoClusterSelected",
            if no_selector {
                "no provider has granted this cluster a virtual node yet; `tether offload \
                 resources add` asks one"
                    .to_owned()
            } else {
                "no virtual node matches the cluster selector".to_owned()
            },
        ),
        _ => {
            let not_ready: Vec<String> = per_provider
                .iter()
                .filter_map(|(p, cs)| {
                    let c = cs.iter().find(|c| c.type_ == types::READY)?;
                    (c.status != "True").then(|| format!("{p} {}", c.reason))
                })
                .collect();
            let reason = match phase {
                "AllFailed" => "AllFailed",
                "SomeFailed" => "SomeFailed",
                _ => "InProgress",
            };
            let ready = total - not_ready.len();
            (
                Status::False,
                reason,
                format!(
                    "{ready} of {total} provider(s) ready; not ready: {}; \
                     status.remoteNamespacesConditions says why",
                    not_ready.join(", ")
                ),
            )
        }
    }
}

/// Asks `provider` for the twin of `ns`; the condition to show for it, and the twin's name
/// once known.
async fn request_twin(
    octx: &OffCtx,
    ns: &str,
    spec: &NamespaceOffloadingSpec,
    provider: &ClusterId,
) -> (Condition, Option<String>) {
    let cond = |status: Status, reason: &str, message: String| Condition {
        type_: types::READY.to_owned(),
        status: status.as_str().to_owned(),
        reason: reason.to_owned(),
        message,
        observed_generation: None,
        last_transition_time: now(),
    };
    let access = match octx.providers.access(&octx.ctx.client, provider).await {
        Ok(Some(a)) => a,
        Ok(None) => {
            return (
                cond(
                    Status::False,
                    "Unreachable",
                    "no identity issued by this provider yet (is it peered?)".to_owned(),
                ),
                None,
            );
        }
        Err(e) => return (cond(Status::False, "Unreachable", e.to_string()), None),
    };
    let request = NamespaceOffloading {
        metadata: kube::api::ObjectMeta {
            name: Some(ns.to_owned()),
            labels: Some(BTreeMap::from([(
                labels::ORIGIN_NAMESPACE.to_owned(),
                ns.to_owned(),
            )])),
            ..Default::default()
        },
        spec: NamespaceOffloadingSpec {
            pod_offloading_strategy: spec.pod_offloading_strategy,
            namespace_mapping_strategy: spec.namespace_mapping_strategy,
            remote_namespace_name: spec.remote_namespace_name.clone(),
            cluster_selector: BTreeMap::new(),
        },
        status: None,
    };
    // Through the watched copy: a request the provider already holds is not sent again.
    let remote = Remote::Watched {
        watched: &octx.watched,
        id: provider,
        access: &access,
    };
    let answered = match tokio::time::timeout(
        Duration::from_secs(5),
        remote.apply::<NamespaceOffloading>(
            &access.namespace,
            ns,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &request,
        ),
    )
    .await
    {
        Ok(Ok(a)) => a,
        Ok(Err(e)) => {
            return (
                cond(
                    Status::False,
                    "Unreachable",
                    format!("asking for a twin namespace: {e}"),
                ),
                None,
            );
        }
        Err(_) => {
            return (
                cond(
                    Status::False,
                    "Unreachable",
                    "no answer within 5 s".to_owned(),
                ),
                None,
            );
        }
    };
    let st = answered.status.unwrap_or_default();
    let (status, reason, message) = provider_answer(conditions::find(&st.conditions, types::READY));
    (cond(status, reason, message), st.remote_namespace_name)
}

/// The condition to keep for a provider from the Ready condition of its answer. Per-provider
/// messages never name the provider: they are filed under its name, and whoever shows them
/// (the CLI, `kubectl get -o yaml`) names it once.
fn provider_answer(ready: Option<&Condition>) -> (Status, &str, String) {
    match ready {
        Some(c) => {
            let status = match c.status.as_str() {
                "True" => Status::True,
                "False" => Status::False,
                _ => Status::Unknown,
            };
            (status, &c.reason, c.message.clone())
        }
        None => (
            Status::Unknown,
            "Pending",
            "waiting for the provider to make the twin namespace".to_owned(),
        ),
    }
}

/// Withdraws the twin request at `provider` and waits (briefly) until the provider removed
/// it, twin namespace included.
async fn withdraw_twin(octx: &OffCtx, ns: &str, provider: &ClusterId) -> Result<(), Error> {
    let Some(access) = octx.providers.access(&octx.ctx.client, provider).await? else {
        return Ok(());
    };
    let remote: Api<NamespaceOffloading> = Api::namespaced(access.client, &access.namespace);
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let deleted = tokio::time::timeout(
            Duration::from_secs(5),
            remote.delete(ns, &DeleteParams::default()),
        )
        .await;
        match deleted {
            Ok(Err(kube::Error::Api(e))) if e.code == 404 || e.code == 403 => return Ok(()),
            Ok(Err(e)) => {
                return Err(Error::kube(format!(
                    "withdrawing the twin of {ns} from {provider}"
                ))(e));
            }
            Ok(Ok(_)) | Err(_) => {}
        }
        if Instant::now() >= until {
            return Err(Error::Timeout(format!(
                "waiting for {provider} to remove the twin of {ns}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Unoffloading: pods of the namespace leave the virtual nodes (their controllers recreate
/// them locally), then every provider's twin is withdrawn.
async fn unoffload(no: &NamespaceOffloading, octx: &OffCtx) -> Result<Action, Error> {
    let ctx = &octx.ctx;
    let ns = no.namespace().unwrap_or_default();
    label_namespace(&ctx.client, &ns, false).await?;
    let virtual_nodes = super::virtual_node_names(&ctx.client).await?;
    // The pods there now are deleted, and waited for; ones their controllers make meanwhile
    // are no longer offloaded (their reflection holds them back) and are not waited for.
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let on_virtual_nodes = |p: &Pod| {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_some_and(|n| virtual_nodes.contains(n))
    };
    let leaving: BTreeSet<String> = pods
        .list(&ListParams::default())
        .await
        .map_err(Error::kube(format!("listing pods in {ns}")))?
        .items
        .iter()
        .filter(|p| on_virtual_nodes(p))
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let left: Vec<Pod> = pods
            .list(&ListParams::default())
            .await
            .map_err(Error::kube(format!("listing pods in {ns}")))?
            .items
            .into_iter()
            .filter(|p| p.metadata.uid.as_ref().is_some_and(|u| leaving.contains(u)))
            .collect();
        if left.is_empty() {
            break;
        }
        for p in &left {
            if p.metadata.deletion_timestamp.is_none() {
                match pods.delete(&p.name_any(), &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => {
                        return Err(Error::kube(format!("deleting pod {ns}/{}", p.name_any()))(
                            e,
                        ));
                    }
                }
            }
        }
        if Instant::now() >= until {
            return Err(Error::Timeout(format!(
                "waiting for {} offloaded pod(s) of {ns} to leave the virtual nodes",
                left.len()
            )));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let providers: Vec<ClusterId> = no
        .status
        .as_ref()
        .map(|s| {
            s.remote_namespaces_conditions
                .keys()
                .filter_map(|p| ClusterId::new(p).ok())
                .collect()
        })
        .unwrap_or_default();
    for p in providers {
        withdraw_twin(octx, &ns, &p).await?;
    }
    tracing::info!(namespace = %ns, "namespace unoffloaded");
    Ok(Action::await_change())
}

/// Sets or removes the label the pod webhook selects namespaces by.
async fn label_namespace(client: &kube::Client, ns: &str, on: bool) -> Result<(), Error> {
    let api: Api<Namespace> = Api::all(client.clone());
    let Some(current) = api
        .get_opt(ns)
        .await
        .map_err(Error::kube(format!("reading namespace {ns}")))?
    else {
        return Ok(());
    };
    let has = current
        .labels()
        .get(labels::OFFLOADING_ENABLED)
        .map(String::as_str)
        == Some("true");
    if has == on {
        return Ok(());
    }
    let value = if on {
        serde_json::Value::String("true".into())
    } else {
        serde_json::Value::Null
    };
    let patch =
        serde_json::json!({ "metadata": { "labels": { labels::OFFLOADING_ENABLED: value } } });
    api.patch(ns, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(Error::kube(format!("labelling namespace {ns}")))?;
    Ok(())
}

async fn write_status(
    ctx: &crate::context::Ctx,
    no: &NamespaceOffloading,
    mut status: NamespaceOffloadingStatus,
) -> Result<(), Error> {
    // Keep the per-provider transition times when nothing changed there.
    if let Some(old) = &no.status {
        for (p, conds) in status.remote_namespaces_conditions.iter_mut() {
            if let Some(prev) = old.remote_namespaces_conditions.get(p) {
                for c in conds.iter_mut() {
                    if let Some(o) = prev
                        .iter()
                        .find(|o| o.type_ == c.type_ && o.status == c.status)
                    {
                        c.last_transition_time = o.last_transition_time.clone();
                    }
                }
            }
        }
    }
    if no.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let ns = no.namespace().unwrap_or_default();
    let api: Api<NamespaceOffloading> = Api::namespaced(ctx.client.clone(), &ns);
    let mut obj = no.clone();
    obj.status = Some(status);
    api.replace_status(&no.name_any(), &PostParams::default(), &obj)
        .await
        .map_err(Error::kube(format!(
            "writing the status of NamespaceOffloading {ns}/{}",
            no.name_any()
        )))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(status: &str, reason: &str) -> Vec<Condition> {
        vec![Condition {
            type_: types::READY.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: now(),
        }]
    }

    #[test]
    fn a_providers_answer_is_kept_without_naming_the_provider_again() {
        let mut refused = cond("False", "NamespaceTaken").remove(0);
        refused.message = "namespace shop already exists on this cluster".to_owned();
        let (s, reason, message) = provider_answer(Some(&refused));
        assert_eq!((s, reason), (Status::False, "NamespaceTaken"));
        assert_eq!(message, "namespace shop already exists on this cluster");
        let (s, reason, message) = provider_answer(None);
        assert_eq!((s, reason), (Status::Unknown, "Pending"));
        assert_eq!(
            message,
            "waiting for the provider to make the twin namespace"
        );
    }

    #[test]
    fn the_summary_names_the_providers_not_ready() {
        let per = BTreeMap::from([
            ("beta".to_owned(), cond("False", "NamespaceTaken")),
            ("gamma".to_owned(), cond("True", "TwinReady")),
            ("delta".to_owned(), cond("Unknown", "Pending")),
        ]);
        let (s, reason, message) = summary("shop", "SomeFailed", true, &per);
        assert_eq!((s, reason), (Status::False, "SomeFailed"));
        assert!(
            message.starts_with(
                "1 of 3 provider(s) ready; not ready: beta NamespaceTaken, delta Pending;"
            ),
            "{message}"
        );
        assert!(!message.contains("gamma"), "{message}");

        let ready = BTreeMap::from([("gamma".to_owned(), cond("True", "TwinReady"))]);
        let (s, reason, message) = summary("shop", "Ready", true, &ready);
        assert_eq!((s, reason), (Status::True, "Ready"));
        assert_eq!(message, "namespace shop extends into 1 provider(s)");

        let none = BTreeMap::new();
        assert!(
            summary("shop", "NoClusterSelected", false, &none)
                .2
                .contains("no virtual node matches the cluster selector")
        );
        assert!(
            summary("shop", "NoClusterSelected", true, &none)
                .2
                .contains("tether offload resources add")
        );
    }
}
