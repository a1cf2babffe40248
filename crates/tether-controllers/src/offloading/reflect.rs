//! Reflection of an offloaded namespace into its twins: the consumer's controller keeps, in the
//! twin at every provider where the namespace is Ready, copies of the namespace's ConfigMaps,
//! Secrets and Services, and EndpointSlices listing this cluster's own pods behind each
//! Service in the provider's view of this cluster's pod CIDR, so that one Service serves the
//! pods of both clusters from either side. `plan` decides; this module loads and applies,
//! with the tenant identity the provider issued.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tether_api::ClusterId;
use tether_api::names::TENANT_NAMESPACE_PREFIX;
use tether_api::networking::Configuration;
use tether_api::offloading::{NamespaceOffloading, ShadowPod};
use tokio_util::sync::CancellationToken;

use super::OffCtx;
use super::namespaces::NAME;
use super::pods::ORIGIN_UID;
use super::translate::PodView;
use super::watched::Watchable;
use crate::Error;
use crate::providers::Access;

pub mod plan;

use plan::Op;

/// The field manager of the copies.
const MANAGER: &str = "tether-reflection";
/// How often a Ready namespace is compared with its twins without a local change: the
/// provider's side is watched, so this is how soon a change there (an Event, a copy edited by
/// hand) shows here, at no cost to the link.
const RESYNC: Duration = Duration::from_secs(10);
/// How long one call to a provider may take.
const CALL: Duration = Duration::from_secs(5);

/// Runs the reflection until `stop`: one reconcile per offloaded namespace, on a change of its
/// NamespaceOffloading or of any reflected kind in it.
pub async fn run(octx: Arc<OffCtx>, stop: CancellationToken) {
    let client = octx.ctx.client.clone();
    fn to_namespace<K: Resource>(k: K) -> Option<ObjectRef<NamespaceOffloading>> {
        let ns = k.meta().namespace.clone()?;
        (!ns.starts_with(TENANT_NAMESPACE_PREFIX)).then(|| ObjectRef::new(NAME).within(&ns))
    }
    Controller::new(
        Api::<NamespaceOffloading>::all(client.clone()),
        watcher::Config::default(),
    )
    // Metadata is all a trigger needs: the contents of Secrets and ConfigMaps of namespaces
    // that are not offloaded never reach this controller, and those of offloaded ones are
    // read when reconciling, per namespace.
    .watches_stream(changes::<ConfigMap>(&client), to_namespace)
    .watches_stream(changes::<Secret>(&client), to_namespace)
    .watches_stream(changes::<Service>(&client), to_namespace)
    .watches_stream(changes::<EndpointSlice>(&client), to_namespace)
    .graceful_shutdown_on(stop.cancelled_owned())
    .run(reconcile, error_policy, octx)
    .for_each(|_| async {})
    .await;
}

/// The objects of kind `K` that change, anywhere, as metadata only.
fn changes<K>(
    client: &kube::Client,
) -> impl Stream<Item = Result<PartialObjectMeta<K>, watcher::Error>> + use<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default,
{
    let api = Api::<PartialObjectMeta<K>>::all(client.clone());
    watcher::watcher(api, watcher::Config::default()).touched_objects()
}

fn error_policy(no: Arc<NamespaceOffloading>, e: &Error, _: Arc<OffCtx>) -> Action {
    tracing::warn!(namespace = %no.namespace().unwrap_or_default(), error = %e, "reflecting into a twin failed; retrying");
    Action::requeue(Duration::from_secs(3))
}

async fn reconcile(no: Arc<NamespaceOffloading>, octx: Arc<OffCtx>) -> Result<Action, Error> {
    let ns = no.namespace().unwrap_or_default();
    // Requests in tenant namespaces are a provider's; a namespace being unoffloaded loses its
    // twins, copies included.
    if ns.starts_with(TENANT_NAMESPACE_PREFIX)
        || no.name_any() != NAME
        || no.metadata.deletion_timestamp.is_some()
    {
        return Ok(Action::await_change());
    }
    let started = Instant::now();
    let st = no.status.clone().unwrap_or_default();
    let Some(twin) = st.remote_namespace_name.clone() else {
        return Ok(Action::await_change());
    };
    let ready: Vec<ClusterId> = st
        .remote_namespaces_conditions
        .iter()
        .filter(|(_, cs)| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        .filter_map(|(p, _)| ClusterId::new(p).ok())
        .collect();
    let mut result = Ok(());
    for provider in &ready {
        if let Err(e) = reflect_into(&octx, &ns, &twin, provider).await {
            tracing::warn!(namespace = %ns, provider = %provider, error = %e, "reflection failed");
            result = Err(e);
        }
    }
    octx.ctx
        .metrics
        .reconciled("reflection", result.as_ref().err(), started.elapsed());
    result.map(|()| Action::requeue(RESYNC))
}

async fn list<K>(api: &Api<K>, what: &str) -> Result<Vec<K>, Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    match tokio::time::timeout(CALL, api.list(&ListParams::default())).await {
        Ok(r) => Ok(r.map_err(Error::kube(format!("listing {what}")))?.items),
        Err(_) => Err(Error::Timeout(format!("listing {what}"))),
    }
}

/// Brings the twin `twin` at `provider` in step with namespace `ns`.
async fn reflect_into(
    octx: &OffCtx,
    ns: &str,
    twin: &str,
    provider: &ClusterId,
) -> Result<(), Error> {
    let ctx = &octx.ctx;
    let Some(access) = octx.providers.access(&ctx.client, provider).await? else {
        return Ok(());
    };
    let consumer = ctx.cluster_id().as_str();
    let here = |what: &str| format!("{what} in {ns}");

    let cms = list(
        &Api::<ConfigMap>::namespaced(ctx.client.clone(), ns),
        &here("ConfigMaps"),
    )
    .await?;
    let remote = Api::<ConfigMap>::namespaced(access.client.clone(), twin);
    let ops = plan::config_maps(
        &cms,
        &watched(octx, provider, &access, twin).await?,
        consumer,
    );
    apply(octx, &remote, ops, "ConfigMap", twin).await?;

    let secrets = list(
        &Api::<Secret>::namespaced(ctx.client.clone(), ns),
        &here("Secrets"),
    )
    .await?;
    let remote = Api::<Secret>::namespaced(access.client.clone(), twin);
    let ops = plan::secrets(
        &secrets,
        &watched(octx, provider, &access, twin).await?,
        consumer,
    );
    apply(octx, &remote, ops, "Secret", twin).await?;

    let services = list(
        &Api::<Service>::namespaced(ctx.client.clone(), ns),
        &here("Services"),
    )
    .await?;
    let remote = Api::<Service>::namespaced(access.client.clone(), twin);
    let ops = plan::services(
        &services,
        &watched(octx, provider, &access, twin).await?,
        consumer,
    );
    apply(octx, &remote, ops, "Service", twin).await?;

    let virtual_nodes = super::virtual_node_names(&ctx.client).await?;
    // Events only inform: their failure does not hold back the Services' endpoints.
    if let Err(e) = copy_events(octx, ns, twin, provider, &access).await {
        tracing::warn!(namespace = %ns, provider = %provider, error = %e, "copying Events back failed");
    }

    let Some(view) = provider_view(octx, &access, provider).await? else {
        // Without the provider's view of our pod CIDR no address can be written correctly;
        // the copies already there stay until it is known.
        tracing::info!(namespace = %ns, %provider, "EndpointSlices wait for the provider's view of this cluster's pod CIDR");
        return Ok(());
    };
    let slices = list(
        &Api::<EndpointSlice>::namespaced(ctx.client.clone(), ns),
        &here("EndpointSlices"),
    )
    .await?;
    let remote = Api::<EndpointSlice>::namespaced(access.client.clone(), twin);
    let ops = plan::slices(
        &services,
        &slices,
        &watched(octx, provider, &access, twin).await?,
        &virtual_nodes,
        &view,
        consumer,
    );
    apply(octx, &remote, ops, "EndpointSlice", twin).await
}

/// Every `K` in `ns` at `provider`, from the watch (owned copies, as the plans take them).
async fn watched<K: Watchable>(
    octx: &OffCtx,
    provider: &ClusterId,
    access: &Access,
    ns: &str,
) -> Result<Vec<K>, Error> {
    let all = octx.watched.list::<K>(provider, access, ns).await?;
    Ok(all.iter().map(|k| (**k).clone()).collect())
}

/// How `provider` addresses this cluster's pods: the status of the Configuration this cluster
/// keeps in its tenant namespace there, which the provider's Configuration reconciler fills
/// with its remaps. `None` until the provider chose them.
async fn provider_view(
    octx: &OffCtx,
    access: &Access,
    provider: &ClusterId,
) -> Result<Option<PodView>, Error> {
    let own = octx.ctx.cluster_id().as_str();
    let conf = octx
        .watched
        .get::<Configuration>(provider, access, &access.namespace, own)
        .await?;
    Ok(conf.and_then(|c| {
        let view = c.status.as_ref()?.remote.as_ref()?.cidr.pod.clone();
        Some(PodView::new(&c.spec.remote.cidr.pod, &view))
    }))
}

/// Carries out `ops` in the twin; every op is counted by kind and outcome.
async fn apply<K>(
    octx: &OffCtx,
    api: &Api<K>,
    ops: Vec<Op<K>>,
    kind: &'static str,
    twin: &str,
) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + Debug,
{
    let metrics = &octx.ctx.metrics;
    let mut first_error = None;
    for op in ops {
        let name = op.name();
        let outcome = op.outcome();
        let done = match &op {
            // Metadata back only: the answer is not read, and it would cross the link.
            Op::Apply(k) => api
                .patch_metadata(
                    &name,
                    &PatchParams::apply(MANAGER).force(),
                    &Patch::Apply(k),
                )
                .await
                .map(|_| ()),
            Op::Recreate(k) => match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) | Err(kube::Error::Api(_)) => {
                    api.create(&PostParams::default(), k).await.map(|_| ())
                }
                Err(e) => Err(e),
            },
            Op::Delete(_) => match api.delete(&name, &DeleteParams::default()).await {
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                other => other.map(|_| ()),
            },
            Op::Conflict(_) => {
                tracing::debug!(kind, name = %name, twin, "an object of this name in the twin is not a reflected copy; left alone");
                Ok(())
            }
        };
        match done {
            Ok(()) => {
                metrics.reflected(kind, outcome);
                if !matches!(op, Op::Conflict(_)) {
                    tracing::debug!(kind, name = %name, twin, outcome, "reflected");
                }
            }
            Err(e) => {
                metrics.reflected(kind, "error");
                if first_error.is_none() {
                    first_error = Some(Error::kube(format!(
                        "reflecting {kind} {name} into {twin} ({outcome})"
                    ))(e));
                }
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// The provider's Events already copied back, by namespace here and Event name: what each said
/// when it was. An Event is copied again only when it changes at the provider.
type Dealt = std::collections::HashMap<String, std::collections::HashMap<String, String>>;
static COPIED: std::sync::LazyLock<std::sync::Mutex<Dealt>> =
    std::sync::LazyLock::new(Default::default);

/// What an Event of the provider says, as far as its copy here goes.
fn fingerprint(e: &Event) -> String {
    format!(
        "{:?}/{:?}/{:?}",
        e.series.as_ref().map(|s| s.count),
        e.event_time,
        e.regarding.as_ref().and_then(|r| r.uid.as_deref())
    )
}

fn dealt() -> std::sync::MutexGuard<'static, Dealt> {
    COPIED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Copies the provider's Events about the pods it runs for `ns` back to `ns`.
async fn copy_events(
    octx: &OffCtx,
    ns: &str,
    twin: &str,
    provider: &ClusterId,
    access: &Access,
) -> Result<(), Error> {
    let ctx = &octx.ctx;
    let remote = octx.watched.list::<Event>(provider, access, twin).await?;
    // Only what changed since it was last copied is planned.
    let fresh: std::collections::HashMap<&str, (&Event, String)> = {
        let mut all = dealt();
        let seen = all.entry(ns.to_owned()).or_default();
        let names: BTreeSet<&str> = remote
            .iter()
            .filter_map(|e| e.metadata.name.as_deref())
            .collect();
        // Events expire at the provider; so does what is remembered of them.
        seen.retain(|name, _| names.contains(name.as_str()));
        remote
            .iter()
            .filter_map(|e| Some((e.metadata.name.as_deref()?, (&**e, fingerprint(e)))))
            .filter(|(name, (_, f))| seen.get(*name) != Some(f))
            .collect()
    };
    if fresh.is_empty() {
        return Ok(());
    }
    // The pods offloaded from here are those with a ShadowPod in the twin, named after them:
    // the watched copies say so without listing this namespace's pods (during a burst of a
    // thousand pods, that was a list of all of them about every pass).
    let offloaded: BTreeMap<String, String> = octx
        .watched
        .list::<ShadowPod>(provider, access, twin)
        .await?
        .iter()
        .filter_map(|sp| {
            let uid = sp.metadata.annotations.as_ref()?.get(ORIGIN_UID)?;
            Some((sp.metadata.name.clone()?, uid.clone()))
        })
        .collect();
    let wanted = plan::events(
        fresh.values().map(|(e, _)| *e),
        &offloaded,
        ns,
        provider.as_str(),
    );
    let remember = |name: &str| {
        if let Some((_, f)) = fresh.get(name) {
            dealt()
                .entry(ns.to_owned())
                .or_default()
                .insert(name.to_owned(), f.clone());
        }
    };
    // Those about no pod offloaded from here are looked at again on the next pass, in memory:
    // their pod's ShadowPod may not have reached its watch yet.
    let local = Api::<Event>::namespaced(ctx.client.clone(), ns);
    for e in &wanted {
        let name = e.name_any();
        let written = match local.create(&PostParams::default(), e).await {
            Err(kube::Error::Api(err)) if err.code == 409 => {
                let patch = serde_json::json!({
                    "series": e.series,
                    "note": e.note,
                    "regarding": e.regarding,
                });
                local
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map(|_| ())
            }
            other => other.map(|_| ()),
        };
        match written {
            Ok(()) => {
                ctx.metrics.reflected("Event", "applied");
                remember(&name);
            }
            Err(err) => {
                ctx.metrics.reflected("Event", "error");
                tracing::debug!(namespace = %ns, event = %name, error = %err, "copying an Event back failed");
            }
        }
    }
    Ok(())
}
