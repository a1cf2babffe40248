//! The VirtualNode reconciler: one virtual kubelet task per VirtualNode, fed the node's
//! desired shape, the client for its provider and the state of the tunnel to it. The tasks
//! live only on the leader; a new leader starts its own and takes the Nodes over.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event, finalizer};
use tether_api::ClusterId;
use tether_api::authentication::ResourceSlice;
use tether_api::conditions::{self, Status, Time, types};
use tether_api::core::ForeignCluster;
use tether_api::names::{TENANT_NAMESPACE_PREFIX, finalizers, labels};
use tether_api::offloading::{VirtualNode, VirtualNodeStatus};
use tether_virtual_kubelet as vk;
use tokio::sync::watch;

use super::OffCtx;
use crate::Error;

/// How often a VirtualNode is looked at again: its provider's client and the tunnel's state
/// are fed to the task from here.
const REFRESH: Duration = Duration::from_secs(3);

/// The namespace the kubelet keeps node Leases in.
const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

struct Running {
    spec: watch::Sender<vk::NodeSpec>,
    provider: watch::Sender<Option<kube::Client>>,
    network: watch::Sender<vk::Network>,
    node: vk::VirtualNode,
    pods: super::pods::Reflector,
}

/// The running virtual kubelets, by `namespace/name` of their VirtualNode.
#[derive(Default)]
pub struct Tasks {
    running: Mutex<HashMap<String, Running>>,
}

impl Tasks {
    fn take(&self, key: &str) -> Option<Running> {
        self.running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key)
    }

    /// Number of running virtual nodes.
    pub fn len(&self) -> usize {
        self.running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether none runs.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stops every task without deleting its Node: leadership moves, and the next leader
    /// carries on with the same Nodes.
    pub async fn stop_all(&self) {
        let all: Vec<Running> = self
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
            .map(|(_, r)| r)
            .collect();
        for r in all {
            r.pods.stop();
            if let Err(e) = r.node.stop(false).await {
                tracing::warn!(error = %e, "stopping a virtual node");
            }
        }
    }
}

/// Reconciles one VirtualNode.
pub async fn reconcile(vn: Arc<VirtualNode>, octx: Arc<OffCtx>) -> Result<Action, Error> {
    let started = Instant::now();
    let ns = vn.namespace().unwrap_or_default();
    if !ns.starts_with(TENANT_NAMESPACE_PREFIX) {
        return Ok(Action::await_change());
    }
    let api: Api<VirtualNode> = Api::namespaced(octx.ctx.client.clone(), &ns);
    let result = finalizer(&api, finalizers::VIRTUAL_NODE, vn, |event| async {
        match event {
            Event::Apply(v) => run(&v, &octx).await,
            Event::Cleanup(v) => remove(&v, &octx).await,
        }
    })
    .await
    .map_err(Error::finalizer("VirtualNode"));
    octx.ctx
        .metrics
        .reconciled("virtualnode", result.as_ref().err(), started.elapsed());
    octx.ctx.metrics.set_virtual_nodes(octx.nodes.len());
    match result {
        Err(e) if e.api_status() == Some(409) => Ok(Action::requeue(Duration::from_millis(200))),
        other => other,
    }
}

fn key(vn: &VirtualNode) -> String {
    format!("{}/{}", vn.namespace().unwrap_or_default(), vn.name_any())
}

async fn run(vn: &VirtualNode, octx: &Arc<OffCtx>) -> Result<Action, Error> {
    let ctx = &octx.ctx;
    let ns = vn.namespace().unwrap_or_default();
    let name = vn.name_any();
    let provider = match ClusterId::new(&vn.spec.cluster_id) {
        Ok(p) => p,
        Err(e) => {
            return report(
                octx,
                vn,
                Status::False,
                "InvalidSpec",
                format!("spec.clusterID: {e}"),
            )
            .await;
        }
    };
    // A Node of that name that is not a virtual node is someone else's: never take it over.
    if let Some(existing) = Api::<Node>::all(ctx.client.clone())
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!("reading Node {name}")))?
        && existing.labels().get(labels::TYPE).map(String::as_str)
            != Some(labels::TYPE_VIRTUAL_NODE)
    {
        return report(
            octx,
            vn,
            Status::False,
            "NodeNameTaken",
            format!(
                "a Node named {name} exists and is not a virtual node; remove the ResourceSlice and ask again under another name"
            ),
        )
        .await;
    }
    let mut capacity = vn.spec.resources.clone();
    if capacity.is_empty()
        && let Some(r) = &vn.spec.resource_slice_ref
    {
        let slice = Api::<ResourceSlice>::namespaced(ctx.client.clone(), &ns)
            .get_opt(&r.name)
            .await
            .map_err(Error::kube(format!(
                "reading ResourceSlice {ns}/{}",
                r.name
            )))?;
        capacity = slice
            .and_then(|s| s.status)
            .map(|s| s.resources)
            .unwrap_or_default();
    }
    let spec = vk::NodeSpec {
        name: name.clone(),
        provider: provider.as_str().to_owned(),
        capacity,
        labels: vn.spec.labels.clone(),
        taint: vn.spec.create_taint,
        address: ctx.settings.pod_ip.clone(),
        kubelet_port: ctx.settings.kubelet_listen.map(|a| a.port()),
    };
    let client = octx
        .providers
        .access(&ctx.client, &provider)
        .await?
        .map(|a| a.client);
    let network = network_of(ctx, &provider).await?;
    let k = key(vn);
    let ready = {
        let mut running = octx
            .nodes
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match running.get(&k) {
            Some(r) => {
                r.spec.send_if_modified(|s| replace(s, spec));
                r.provider.send_if_modified(|c| {
                    // Clients do not compare; a new one comes with a renewed identity.
                    let changed = c.is_some() != client.is_some();
                    if changed || client.is_some() {
                        *c = client;
                    }
                    changed
                });
                r.network.send_if_modified(|n| replace(n, network));
                r.node.ready()
            }
            None => {
                let (spec_tx, spec_rx) = watch::channel(spec);
                let (provider_tx, provider_rx) = watch::channel(client);
                let (network_tx, network_rx) = watch::channel(network);
                let node = vk::VirtualNode::spawn(
                    ctx.client.clone(),
                    spec_rx,
                    provider_rx,
                    network_rx,
                    vk::Timing::default(),
                );
                let pods = super::pods::Reflector::spawn(octx.clone(), &name, provider.clone());
                tracing::info!(node = %name, %provider, "virtual node started");
                running.insert(
                    k,
                    Running {
                        spec: spec_tx,
                        provider: provider_tx,
                        network: network_tx,
                        node,
                        pods,
                    },
                );
                false
            }
        }
    };
    let (status, reason, message) = if ready {
        (
            Status::True,
            "NodeReady",
            format!("Node {name} is Ready with the resources {provider} granted"),
        )
    } else {
        (
            Status::False,
            "NodeNotReady",
            format!("Node {name} is not Ready; `kubectl describe node {name}` says why"),
        )
    };
    report(octx, vn, status, reason, message).await?;
    Ok(Action::requeue(REFRESH))
}

fn replace<T: PartialEq>(slot: &mut T, value: T) -> bool {
    if *slot == value {
        false
    } else {
        *slot = value;
        true
    }
}

/// The tunnel to `provider` as the ForeignCluster reports it: `None` when the networking
/// module is off.
async fn network_of(ctx: &crate::context::Ctx, provider: &ClusterId) -> Result<vk::Network, Error> {
    let fc = Api::<ForeignCluster>::all(ctx.client.clone())
        .get_opt(provider.as_str())
        .await
        .map_err(Error::kube(format!("reading ForeignCluster {provider}")))?;
    let Some(fc) = fc else {
        return Ok(Some(Err(format!("there is no peering with {provider}"))));
    };
    if !fc.spec.modules.networking.enabled {
        return Ok(None);
    }
    let conds = fc
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    Ok(Some(match conditions::find(conds, types::NETWORKING) {
        Some(c) if c.status == "True" => Ok(()),
        Some(c) => Err(format!("the tunnel to {provider} is down: {}", c.message)),
        None => Err(format!("the tunnel to {provider} is not up yet")),
    }))
}

async fn report(
    octx: &OffCtx,
    vn: &VirtualNode,
    status: Status,
    reason: &str,
    message: String,
) -> Result<Action, Error> {
    let mut next = vn.status.clone().unwrap_or_default();
    next.node_name = Some(vn.name_any());
    conditions::set(
        &mut next.conditions,
        types::READY,
        status,
        reason,
        message,
        vn.metadata.generation,
        now(),
    );
    if vn.status.as_ref() != Some(&next) {
        write_status(octx, vn, next).await?;
    }
    Ok(Action::requeue(REFRESH))
}

async fn write_status(
    octx: &OffCtx,
    vn: &VirtualNode,
    status: VirtualNodeStatus,
) -> Result<(), Error> {
    let ns = vn.namespace().unwrap_or_default();
    let api: Api<VirtualNode> = Api::namespaced(octx.ctx.client.clone(), &ns);
    let mut obj = vn.clone();
    obj.status = Some(status);
    api.replace_status(&vn.name_any(), &PostParams::default(), &obj)
        .await
        .map_err(Error::kube(format!(
            "writing the status of VirtualNode {ns}/{}",
            vn.name_any()
        )))?;
    Ok(())
}

/// A VirtualNode is going: its task stops, and its Node and Lease are deleted (also when no
/// task ran here, as after a restart).
async fn remove(vn: &VirtualNode, octx: &OffCtx) -> Result<Action, Error> {
    let name = vn.name_any();
    if let Some(r) = octx.nodes.take(&key(vn)) {
        r.pods.stop();
        if let Err(e) = r.node.stop(false).await {
            tracing::warn!(node = %name, error = %e, "stopping the virtual node");
        }
    }
    let client = &octx.ctx.client;
    let nodes: Api<Node> = Api::all(client.clone());
    match nodes.get_opt(&name).await {
        Ok(Some(n))
            if n.labels().get(labels::TYPE).map(String::as_str)
                == Some(labels::TYPE_VIRTUAL_NODE) =>
        {
            match nodes.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(Error::kube(format!("deleting Node {name}"))(e)),
            }
        }
        Ok(_) => {}
        Err(e) => return Err(Error::kube(format!("reading Node {name}"))(e)),
    }
    match Api::<Lease>::namespaced(client.clone(), NODE_LEASE_NAMESPACE)
        .delete(&name, &DeleteParams::default())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => {
            return Err(Error::kube(format!(
                "deleting Lease {NODE_LEASE_NAMESPACE}/{name}"
            ))(e));
        }
    }
    octx.ctx.metrics.set_virtual_nodes(octx.nodes.len());
    tracing::info!(node = %name, "virtual node removed");
    Ok(Action::await_change())
}
