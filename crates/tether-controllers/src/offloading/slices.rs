//! The ResourceSlice reconciler, for both ends of a slice. A consumer's slice (its
//! `consumerClusterID` is this cluster) is copied into the provider's tenant namespace and the
//! provider's answer copied back; an accepted one gets a VirtualNode. A provider's copy (its
//! `providerClusterID` is this cluster) is answered: granted in full when this cluster's
//! allocatable capacity, less what it already granted, covers it, or denied with why.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event, finalizer};
use kube::{Resource, ResourceExt};
use tether_api::ClusterId;
use tether_api::authentication::{ResourceSlice, ResourceSliceSpec, ResourceSliceStatus, Tenant};
use tether_api::conditions::{self, Status, Time, types};
use tether_api::core::{LocalObjectRef, ObjectRef};
use tether_api::names::{self, TENANT_NAMESPACE_PREFIX, finalizers, labels, objects};
use tether_api::offloading::{VirtualNode, VirtualNodeSpec};
use tether_resources::{Decision, NodeFacts, Resources};

use super::OffCtx;
use crate::Error;
use crate::context::FIELD_MANAGER;
use crate::providers::Remote;

/// How often a consumer re-reads its provider's answer once it has one: the answer changes
/// only when the consumer changes its request, which triggers a reconcile by itself.
const ANSWERED_POLL: Duration = Duration::from_secs(30);
/// How often while the provider has not answered yet (`tether peer` waits for it).
const PENDING_POLL: Duration = Duration::from_millis(500);

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// Reconciles one ResourceSlice.
pub async fn reconcile(slice: Arc<ResourceSlice>, octx: Arc<OffCtx>) -> Result<Action, Error> {
    let started = Instant::now();
    let ns = slice.namespace().unwrap_or_default();
    let this = octx.ctx.cluster_id().as_str().to_owned();
    let result = if !ns.starts_with(TENANT_NAMESPACE_PREFIX) {
        Ok(Action::await_change())
    } else if slice.spec.provider_cluster_id == this {
        answer(&slice, &octx).await
    } else if slice.spec.consumer_cluster_id == this {
        let api: Api<ResourceSlice> = Api::namespaced(octx.ctx.client.clone(), &ns);
        finalizer(&api, finalizers::RESOURCE_SLICE, slice, |event| async {
            match event {
                Event::Apply(s) => request(&s, &octx).await,
                Event::Cleanup(s) => withdraw(&s, &octx).await,
            }
        })
        .await
        .map_err(Error::finalizer("ResourceSlice"))
    } else {
        Ok(Action::await_change())
    };
    octx.ctx
        .metrics
        .reconciled("resourceslice", result.as_ref().err(), started.elapsed());
    match result {
        Err(e) if e.api_status() == Some(409) => Ok(Action::requeue(Duration::from_millis(200))),
        other => other,
    }
}

// ---- the consumer's side ----

/// The provider a consumer's slice asks, if the slice is well formed: in the tenant namespace
/// of that provider and named after it, so that the copies of two clusters that both consume
/// from each other never share a name in one namespace.
fn provider_of(slice: &ResourceSlice) -> Result<ClusterId, String> {
    let provider = ClusterId::new(&slice.spec.provider_cluster_id)
        .map_err(|e| format!("spec.providerClusterID: {e}"))?;
    let ns = slice.namespace().unwrap_or_default();
    let want = names::tenant_namespace(&provider);
    if ns != want {
        return Err(format!(
            "a slice for provider {provider} must live in namespace {want}, not {ns}"
        ));
    }
    let name = slice.name_any();
    let prefix = format!("{provider}-");
    if name != provider.as_str() && !name.starts_with(&prefix) {
        return Err(format!(
            "a slice for provider {provider} must be named {provider} or {provider}-<suffix>, not {name}"
        ));
    }
    Ok(provider)
}

async fn request(slice: &ResourceSlice, octx: &OffCtx) -> Result<Action, Error> {
    let ctx = &octx.ctx;
    let ns = slice.namespace().unwrap_or_default();
    let name = slice.name_any();
    let api: Api<ResourceSlice> = Api::namespaced(ctx.client.clone(), &ns);
    let mut status = slice.status.clone().unwrap_or_default();
    let generation = slice.metadata.generation;
    let provider = match provider_of(slice) {
        Ok(p) => p,
        Err(message) => {
            conditions::set(
                &mut status.conditions,
                types::RESOURCES,
                Status::False,
                "InvalidSlice",
                message,
                generation,
                now(),
            );
            write_status(&api, slice, &status).await?;
            return Ok(Action::await_change());
        }
    };
    if let Err(message) = Resources::from_quantities(&slice.spec.resources) {
        conditions::set(
            &mut status.conditions,
            types::RESOURCES,
            Status::False,
            "InvalidRequest",
            format!("spec.resources: {message}"),
            generation,
            now(),
        );
        write_status(&api, slice, &status).await?;
        return Ok(Action::await_change());
    }
    let Some(access) = octx.providers.access(&ctx.client, &provider).await? else {
        conditions::set(
            &mut status.conditions,
            types::RESOURCES,
            Status::Unknown,
            "NotAuthenticated",
            format!("waiting for an identity issued by {provider} (peer with it first)"),
            generation,
            now(),
        );
        write_status(&api, slice, &status).await?;
        return Ok(Action::requeue(Duration::from_secs(5)));
    };
    // The copy at the provider: the same name and request, in the namespace the identity is
    // confined to.
    let copy = ResourceSlice {
        metadata: kube::api::ObjectMeta {
            name: Some(name.clone()),
            labels: Some(BTreeMap::from([(
                labels::REMOTE_CLUSTER_ID.to_owned(),
                ctx.cluster_id().as_str().to_owned(),
            )])),
            ..Default::default()
        },
        spec: slice.spec.clone(),
        status: None,
    };
    // Through the watched copy: a request the provider already holds is not sent again.
    let remote = Remote::Watched {
        watched: &octx.watched,
        id: &provider,
        access: &access,
    };
    let answered = match tokio::time::timeout(
        Duration::from_secs(5),
        remote.apply::<ResourceSlice>(
            &access.namespace,
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &copy,
        ),
    )
    .await
    {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            return keep_last_answer(
                &api,
                slice,
                status,
                &provider,
                &format!("copying the request to {provider} failed: {e}"),
            )
            .await;
        }
        Err(_) => {
            return keep_last_answer(
                &api,
                slice,
                status,
                &provider,
                &format!("{provider}'s API server did not answer within 5 s"),
            )
            .await;
        }
    };
    let remote_status = answered.status.unwrap_or_default();
    let answer = conditions::find(&remote_status.conditions, types::RESOURCES)
        .filter(|c| c.observed_generation == answered.metadata.generation)
        .cloned();
    status.resources = remote_status.resources.clone();
    status.node_labels = remote_status.node_labels.clone();
    let requeue = match answer {
        Some(c) => {
            let s = match c.status.as_str() {
                "True" => Status::True,
                "False" => Status::False,
                _ => Status::Unknown,
            };
            conditions::set(
                &mut status.conditions,
                types::RESOURCES,
                s,
                &c.reason,
                format!("{provider}: {}", c.message),
                generation,
                now(),
            );
            ANSWERED_POLL
        }
        None => {
            conditions::set(
                &mut status.conditions,
                types::RESOURCES,
                Status::Unknown,
                "Pending",
                format!("waiting for {provider} to answer"),
                generation,
                now(),
            );
            PENDING_POLL
        }
    };
    write_status(&api, slice, &status).await?;
    apply_virtual_node(octx, slice, &provider, &status).await?;
    Ok(Action::requeue(requeue))
}

/// The provider cannot be reached: the last answer (and the virtual node built from it)
/// stays, so a blip never drains a node; the condition says what failed.
async fn keep_last_answer(
    api: &Api<ResourceSlice>,
    slice: &ResourceSlice,
    mut status: ResourceSliceStatus,
    provider: &ClusterId,
    message: &str,
) -> Result<Action, Error> {
    tracing::warn!(slice = %slice.name_any(), %provider, "{message}");
    if !conditions::is_true(&status.conditions, types::RESOURCES) {
        conditions::set(
            &mut status.conditions,
            types::RESOURCES,
            Status::Unknown,
            "ProviderUnreachable",
            format!("{message}; retrying"),
            slice.metadata.generation,
            now(),
        );
        write_status(api, slice, &status).await?;
    }
    Ok(Action::requeue(Duration::from_secs(5)))
}

/// The VirtualNode of an answered slice: the grant as its capacity. A slice without a grant
/// has none (a denied first request); a denied change keeps the earlier grant.
async fn apply_virtual_node(
    octx: &OffCtx,
    slice: &ResourceSlice,
    provider: &ClusterId,
    status: &ResourceSliceStatus,
) -> Result<(), Error> {
    let ns = slice.namespace().unwrap_or_default();
    let name = slice.name_any();
    let api: Api<VirtualNode> = Api::namespaced(octx.ctx.client.clone(), &ns);
    if status.resources.is_empty() {
        return match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(Error::kube(format!("deleting VirtualNode {ns}/{name}"))(e)),
        };
    }
    let vn = VirtualNode {
        metadata: kube::api::ObjectMeta {
            name: Some(name.clone()),
            labels: Some(labels::managed()),
            owner_references: slice.meta().uid.clone().map(|uid| {
                vec![OwnerReference {
                    api_version: "authentication.tether.dev/v1alpha1".into(),
                    kind: "ResourceSlice".into(),
                    name: name.clone(),
                    uid,
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                }]
            }),
            ..Default::default()
        },
        spec: VirtualNodeSpec {
            cluster_id: provider.as_str().to_owned(),
            resource_slice_ref: Some(LocalObjectRef { name: name.clone() }),
            resources: status.resources.clone(),
            labels: status.node_labels.clone(),
            create_taint: true,
            kubeconfig_secret_ref: Some(ObjectRef {
                namespace: ns.clone(),
                name: objects::PROVIDER_KUBECONFIG_SECRET.to_owned(),
            }),
        },
        status: None,
    };
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&vn),
    )
    .await
    .map_err(Error::kube(format!("applying VirtualNode {ns}/{name}")))?;
    Ok(())
}

/// A consumer's slice is going: its virtual node first (the Node drains with it), then the
/// copy at the provider, which releases the grant there.
async fn withdraw(slice: &ResourceSlice, octx: &OffCtx) -> Result<Action, Error> {
    let ctx = &octx.ctx;
    let ns = slice.namespace().unwrap_or_default();
    let name = slice.name_any();
    // The finalizer goes as soon as this returns Ok: every wait happens here, and one that
    // runs out is an error, which is retried.
    let vns: Api<VirtualNode> = Api::namespaced(ctx.client.clone(), &ns);
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        match vns.get_opt(&name).await {
            Ok(Some(vn)) => {
                if vn.metadata.deletion_timestamp.is_none() {
                    match vns.delete(&name, &DeleteParams::default()).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(e)) if e.code == 404 => {}
                        Err(e) => {
                            return Err(Error::kube(format!("deleting VirtualNode {ns}/{name}"))(
                                e,
                            ));
                        }
                    }
                }
                if Instant::now() >= until {
                    return Err(Error::Timeout(format!(
                        "removing VirtualNode {ns}/{name} before withdrawing its slice"
                    )));
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Ok(None) => break,
            // The tenant namespace is going and the controller's rights in it with it.
            Err(kube::Error::Api(e)) if e.code == 403 => break,
            Err(e) => return Err(Error::kube(format!("reading VirtualNode {ns}/{name}"))(e)),
        }
    }
    let Ok(provider) = ClusterId::new(&slice.spec.provider_cluster_id) else {
        return Ok(Action::await_change());
    };
    // Without an identity (unpeered) the provider deletes the whole tenant namespace, copy
    // included, when it revokes the tenant.
    if let Some(access) = octx.providers.access(&ctx.client, &provider).await? {
        let remote: Api<ResourceSlice> = Api::namespaced(access.client, &access.namespace);
        let failed = match tokio::time::timeout(
            Duration::from_secs(5),
            remote.delete(&name, &DeleteParams::default()),
        )
        .await
        {
            Ok(Ok(_)) => None,
            Ok(Err(kube::Error::Api(e))) if e.code == 404 || e.code == 403 => None,
            Ok(Err(e)) => Some(format!("deleting ResourceSlice {name} at {provider}: {e}")),
            Err(_) => Some(format!(
                "deleting ResourceSlice {name} at {provider}: no answer within 5 s"
            )),
        };
        if let Some(message) = failed {
            // A tenant namespace being deleted here means the peering is being removed by
            // force: the provider drops the copy with the tenant, so do not hold the
            // namespace hostage to an unreachable provider.
            if !namespace_terminating(&ctx.client, &ns).await? {
                return Err(Error::Invalid(format!("{message}; retrying")));
            }
            tracing::warn!(slice = %name, %provider, "{message}; the local tenant namespace is being deleted, so the copy is left to the provider");
        }
    }
    tracing::info!(slice = %name, %provider, "resource slice withdrawn");
    Ok(Action::await_change())
}

async fn namespace_terminating(client: &kube::Client, name: &str) -> Result<bool, Error> {
    let ns = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .get_opt(name)
        .await
        .map_err(Error::kube(format!("reading namespace {name}")))?;
    Ok(ns.is_none_or(|n| n.metadata.deletion_timestamp.is_some()))
}

// ---- the provider's side ----

/// Answers a consumer's request held here. Decisions are serialised so that two requests
/// never both take the last free capacity.
async fn answer(slice: &ResourceSlice, octx: &OffCtx) -> Result<Action, Error> {
    if slice.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ctx = &octx.ctx;
    let ns = slice.namespace().unwrap_or_default();
    let name = slice.name_any();
    let api: Api<ResourceSlice> = Api::namespaced(ctx.client.clone(), &ns);
    let _decisions = octx.grant_lock.lock().await;
    // Re-read under the lock: the cached object may predate a decision just written.
    let Some(slice) = api
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!("reading ResourceSlice {ns}/{name}")))?
    else {
        return Ok(Action::await_change());
    };
    let generation = slice.metadata.generation;
    let mut status = slice.status.clone().unwrap_or_default();
    if conditions::find(&status.conditions, types::RESOURCES)
        .is_some_and(|c| c.observed_generation == generation)
    {
        // This request was answered; a grant, once given, is not taken back.
        return Ok(Action::await_change());
    }
    let (state, reason, message) = match decide(ctx, &slice, &ns).await? {
        Ok(Decision::Accept { grant }) => {
            let message = format!("granted {grant}");
            status.resources = grant.to_quantities();
            status.node_labels = provider_labels(ctx).await?;
            (Status::True, "Accepted", message)
        }
        Ok(Decision::Deny { reason, message }) => {
            let message = if status.resources.is_empty() {
                message
            } else {
                let kept = Resources::from_quantities(&status.resources)
                    .map(|r| r.to_string())
                    .unwrap_or_default();
                format!("{message}; the earlier grant ({kept}) stays")
            };
            (Status::False, reason.as_str(), message)
        }
        Err((reason, message)) => (Status::False, reason, message),
    };
    ctx.metrics.slice_answered(reason);
    tracing::info!(slice = %name, namespace = %ns, %reason, %message, "resource request answered");
    conditions::set(
        &mut status.conditions,
        types::RESOURCES,
        state,
        reason,
        message,
        generation,
        now(),
    );
    write_status(&api, &slice, &status).await?;
    Ok(Action::await_change())
}

/// The decision on one request, or a refusal before any arithmetic (an unknown consumer, an
/// unreadable request).
async fn decide(
    ctx: &crate::context::Ctx,
    slice: &ResourceSlice,
    ns: &str,
) -> Result<Result<Decision, (&'static str, String)>, Error> {
    let consumer = &slice.spec.consumer_cluster_id;
    let tenant = match ClusterId::new(consumer) {
        Ok(c) if names::tenant_namespace(&c) == ns => Api::<Tenant>::all(ctx.client.clone())
            .get_opt(c.as_str())
            .await
            .map_err(Error::kube(format!("reading Tenant {c}")))?,
        _ => None,
    };
    if tenant.is_none_or(|t| t.metadata.deletion_timestamp.is_some()) {
        return Ok(Err((
            "UnknownConsumer",
            format!(
                "namespace {ns} does not belong to an active tenant {consumer}; peer again to ask for resources"
            ),
        )));
    }
    let request = match Resources::from_quantities(&slice.spec.resources) {
        Ok(r) => r,
        Err(e) => return Ok(Err(("InvalidRequest", format!("spec.resources: {e}")))),
    };
    let nodes = Api::<Node>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("listing Nodes"))?;
    let facts: Vec<NodeFacts> = nodes.items.iter().map(node_facts).collect();
    let capacity = match tether_resources::capacity(&facts) {
        Ok(c) => c,
        Err(e) => return Ok(Err(("CapacityUnknown", e.to_string()))),
    };
    let slices = Api::<ResourceSlice>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("listing ResourceSlices"))?;
    let this = ctx.cluster_id().as_str();
    let uid = slice.metadata.uid.as_deref();
    let mut others = Vec::new();
    for s in &slices.items {
        if s.spec.provider_cluster_id != this
            || s.metadata.uid.as_deref() == uid
            || s.metadata.deletion_timestamp.is_some()
        {
            continue;
        }
        if let Some(st) = &s.status
            && let Ok(granted) = Resources::from_quantities(&st.resources)
        {
            others.push(granted);
        }
    }
    let others = Resources::sum(&others);
    Ok(Ok(tether_resources::decide(&request, &capacity, &others)))
}

/// What the provider's capacity calculation needs to know of a Node.
pub fn node_facts(n: &Node) -> NodeFacts {
    let status = n.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True");
    NodeFacts {
        name: n.name_any(),
        allocatable: status
            .and_then(|s| s.allocatable.clone())
            .unwrap_or_default(),
        ready,
        unschedulable: n
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false),
        virtual_node: n.labels().get(labels::TYPE).map(String::as_str)
            == Some(labels::TYPE_VIRTUAL_NODE),
    }
}

/// Labels of this cluster a consumer's virtual node carries: the topology labels every one
/// of its real nodes agrees on.
async fn provider_labels(ctx: &crate::context::Ctx) -> Result<BTreeMap<String, String>, Error> {
    const SHARED: [&str; 3] = [
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
        "kubernetes.io/arch",
    ];
    let nodes = Api::<Node>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("listing Nodes"))?;
    let real: Vec<&Node> = nodes
        .items
        .iter()
        .filter(|n| {
            n.labels().get(labels::TYPE).map(String::as_str) != Some(labels::TYPE_VIRTUAL_NODE)
        })
        .collect();
    let mut out = BTreeMap::new();
    for key in SHARED {
        let mut values = real.iter().map(|n| n.labels().get(key));
        if let Some(Some(first)) = values.next()
            && values.all(|v| v == Some(first))
        {
            out.insert(key.to_owned(), first.clone());
        }
    }
    Ok(out)
}

/// Writes the whole status (a replace, so that resources dropped from a grant go too); a
/// conflict is retried by the caller's requeue.
async fn write_status(
    api: &Api<ResourceSlice>,
    slice: &ResourceSlice,
    new: &ResourceSliceStatus,
) -> Result<(), Error> {
    if slice.status.as_ref() == Some(new) {
        return Ok(());
    }
    let mut next = slice.clone();
    next.status = Some(new.clone());
    api.replace_status(&slice.name_any(), &PostParams::default(), &next)
        .await
        .map_err(Error::kube(format!(
            "writing the status of ResourceSlice {}",
            slice.name_any()
        )))?;
    Ok(())
}

/// The request as the CLI writes it.
pub fn slice(
    consumer: &ClusterId,
    provider: &ClusterId,
    name: &str,
    class: &str,
    resources: BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
) -> ResourceSlice {
    ResourceSlice {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(names::tenant_namespace(provider)),
            labels: Some(labels::managed()),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            consumer_cluster_id: consumer.as_str().to_owned(),
            provider_cluster_id: provider.as_str().to_owned(),
            class: class.to_owned(),
            resources,
        },
        status: None,
    }
}
