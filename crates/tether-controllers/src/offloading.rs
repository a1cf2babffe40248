//! The offloading module: resource negotiation over ResourceSlices (a consumer asks, its
//! provider grants what it can really give, all or nothing) and the virtual nodes that show
//! a grant as a Node of the consumer, each run by a task of this process, with the pod
//! reflection that runs a virtual node's pods at its provider, and the namespaces offloaded
//! to providers; and, on the provider, the twin namespaces consumers ask for and the
//! ShadowPods they hold there.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use tether_api::ClusterId;
use tether_api::authentication::ResourceSlice;
use tether_api::names::{self, labels};
use tether_api::offloading::{NamespaceOffloading, VirtualNode};
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::context::Ctx;
use crate::providers::ProviderClients;

pub mod kubelet;
pub mod listed;
pub mod local;
pub mod namespaces;
pub mod placement;
pub mod pods;
pub mod reflect;
pub mod shadow_pods;
pub mod slices;
pub mod tokens;
pub mod translate;
pub mod twins;
pub mod virtual_nodes;
pub mod volumes;
pub mod watched;

/// How long the ShadowPod reconciler gathers changes of one ShadowPod and its Pod before it
/// acts on them.
const DEBOUNCE: Duration = Duration::from_millis(250);

/// State of the offloading reconcilers.
pub struct OffCtx {
    /// Shared controller state.
    pub ctx: Arc<Ctx>,
    /// Provider API clients, shared with the peering reconciler.
    pub providers: Arc<ProviderClients>,
    /// Serialises a provider's answers, so two requests never share the last capacity.
    grant_lock: tokio::sync::Mutex<()>,
    /// The provider's ShadowPods and their Pods, as the ShadowPod reconciler's watches see
    /// them, and what each consumer's admitted pods hold.
    shadow_pods: shadow_pods::Stores,
    /// This cluster's objects that reflection reads on every pass, watched.
    pub local: local::Local,
    /// The running virtual kubelets.
    pub nodes: virtual_nodes::Tasks,
    /// When the ServiceAccount tokens reflected for offloaded pods expire.
    pub tokens: tokens::Minted,
    /// What providers hold in twin namespaces, watched.
    pub watched: Arc<watched::Watched>,
}

impl OffCtx {
    /// State for one leader term.
    pub fn new(
        ctx: Arc<Ctx>,
        providers: Arc<ProviderClients>,
        watched: Arc<watched::Watched>,
    ) -> Self {
        Self {
            local: local::Local::new(ctx.client.clone()),
            ctx,
            providers,
            grant_lock: tokio::sync::Mutex::new(()),
            shadow_pods: shadow_pods::Stores::default(),
            nodes: virtual_nodes::Tasks::default(),
            tokens: tokens::Minted::default(),
            watched,
        }
    }
}

/// Runs the ResourceSlice and VirtualNode reconcilers until `stop`; then stops the virtual
/// kubelets, leaving their Nodes to the next leader.
pub async fn run(octx: Arc<OffCtx>, stop: CancellationToken) {
    let client = octx.ctx.client.clone();
    let slices = Controller::new(
        Api::<ResourceSlice>::all(client.clone()),
        watcher::Config::default(),
    )
    .graceful_shutdown_on(stop.clone().cancelled_owned())
    .run(slices::reconcile, error_policy, octx.clone())
    .for_each(|_| async {});
    let nodes = Controller::new(
        Api::<VirtualNode>::all(client.clone()),
        watcher::Config::default(),
    )
    .graceful_shutdown_on(stop.clone().cancelled_owned())
    .run(virtual_nodes::reconcile, error_policy, octx.clone())
    .for_each(|_| async {});
    let offloaded = Controller::new(
        Api::<NamespaceOffloading>::all(client.clone()),
        watcher::Config::default(),
    )
    .graceful_shutdown_on(stop.clone().cancelled_owned())
    .run(namespaces::reconcile, error_policy, octx.clone())
    .for_each(|_| async {});
    // A twin namespace that goes (by hand) brings its request back to be made again.
    let twins = Controller::new(
        Api::<NamespaceOffloading>::all(client.clone()),
        watcher::Config::default(),
    )
    .watches(
        Api::<Namespace>::all(client.clone()),
        watcher::Config::default().labels(labels::ORIGIN_NAMESPACE),
        |ns: Namespace| {
            let consumer = ClusterId::new(ns.labels().get(labels::REMOTE_CLUSTER_ID)?).ok()?;
            let origin = ns.labels().get(labels::ORIGIN_NAMESPACE)?;
            Some(ObjectRef::new(origin).within(&names::tenant_namespace(&consumer)))
        },
    )
    .graceful_shutdown_on(stop.clone().cancelled_owned())
    .run(twins::reconcile, error_policy, octx.clone())
    .for_each(|_| async {});
    let selector = format!("{}={}", labels::TETHER_MANAGED_BY, labels::SHADOW_POD);
    let Some((shadows, pods)) = octx.shadow_pods.streams(&client, &selector) else {
        tracing::error!(
            "the ShadowPod watches of this term were already started; not reconciling ShadowPods"
        );
        return;
    };
    let shadow_pods = Controller::for_stream(shadows, octx.shadow_pods.shadow_pods.clone())
        .owns_stream(pods)
        // A new Pod's status changes several times within a second; one write of the
        // ShadowPod's status for them all spares the consumer's watch the rest.
        .with_config(kube::runtime::controller::Config::default().debounce(DEBOUNCE))
    .graceful_shutdown_on(stop.clone().cancelled_owned())
    .run(shadow_pods::reconcile, error_policy, octx.clone())
    .for_each(|_| async {});
    let reflection = reflect::run(octx.clone(), stop.clone());
    let volumes = volumes::run(octx.clone(), stop.clone());
    tokio::join!(
        slices,
        nodes,
        offloaded,
        twins,
        shadow_pods,
        reflection,
        volumes
    );
    octx.nodes.stop_all().await;
}

/// The names of this cluster's virtual nodes (Nodes labelled as such).
pub async fn virtual_node_names(
    client: &kube::Client,
) -> Result<std::collections::BTreeSet<String>, Error> {
    Ok(Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .list(&kube::api::ListParams::default().labels(&format!(
            "{}={}",
            tether_api::names::labels::TYPE,
            tether_api::names::labels::TYPE_VIRTUAL_NODE
        )))
        .await
        .map_err(Error::kube("listing virtual nodes"))?
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect())
}

fn error_policy<K: kube::Resource<DynamicType = ()>>(
    k: Arc<K>,
    e: &Error,
    _: Arc<OffCtx>,
) -> Action {
    tracing::warn!(kind = %K::kind(&()), name = %k.name_any(), error = %e, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(3))
}
