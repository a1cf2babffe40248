//! Tether's virtual kubelet: one virtual node's Node object and its liveness, run as a task
//! inside the consumer's controller. The task registers the Node, keeps its Lease renewed,
//! probes the provider's API server and reports what it finds as the Node's conditions; the
//! decisions live in the pure [`desired`] module.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub mod desired;
mod node_task;
mod probe;

pub use desired::{Health, Network, NodeSpec, ProviderHealth};

/// How often the virtual node probes, renews and refreshes.
#[derive(Clone, Debug)]
pub struct Timing {
    /// Time between two probes of the provider's API server.
    pub probe_interval: Duration,
    /// How long one probe may take.
    pub probe_timeout: Duration,
    /// How long the provider may go without answering before the node turns NotReady.
    pub unreachable_after: Duration,
    /// Time between two renewals of the node's Lease.
    pub lease_renew: Duration,
    /// The Lease's `leaseDurationSeconds`.
    pub lease_duration_seconds: i32,
    /// Time between two status writes when nothing changed.
    pub status_refresh: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            // Every probe crosses the link between the clusters, about 550 bytes with TCP's
            // and TLS's overhead: every 5 s that is 0.9 kbit/s per virtual node, most of an
            // idle peering's traffic. A provider silent for 8 s is unreachable: one lost
            // probe is forgiven (it times out after 2 s and is retried at once, so the next
            // answer comes about 7 s after the last), two are not; the node task wakes when
            // the 8 s end, so a frozen provider turns the node NotReady within ten.
            probe_interval: Duration::from_secs(5),
            probe_timeout: Duration::from_secs(2),
            unreachable_after: Duration::from_secs(8),
            lease_renew: Duration::from_secs(10),
            lease_duration_seconds: 40,
            status_refresh: Duration::from_secs(60),
        }
    }
}

impl Timing {
    /// The shortest period the task accepts: a zero interval would spin (or, for Tokio's
    /// interval, panic).
    const FLOOR: Duration = Duration::from_millis(10);

    fn floored(self) -> Self {
        Self {
            probe_interval: self.probe_interval.max(Self::FLOOR),
            probe_timeout: self.probe_timeout.max(Self::FLOOR),
            unreachable_after: self.unreachable_after,
            lease_renew: self.lease_renew.max(Self::FLOOR),
            lease_duration_seconds: self.lease_duration_seconds.max(1),
            status_refresh: self.status_refresh.max(Self::FLOOR),
        }
    }
}

/// Why stopping a virtual node failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The task ended abnormally (it panicked).
    #[error("the task of virtual node {name} ended abnormally")]
    Task {
        /// The Node's name.
        name: String,
        /// Why.
        #[source]
        source: tokio::task::JoinError,
    },
    /// The Node or its Lease could not be deleted.
    #[error("cannot delete the {kind} of virtual node {name}; retry the stop")]
    Delete {
        /// `Node` or `Lease`.
        kind: &'static str,
        /// The Node's name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The Node or its Lease was still there when the deletion gave up waiting (a finalizer
    /// someone else put there holds it).
    #[error(
        "the {kind} of virtual node {name} is still there {waited:?} after its deletion; check its finalizers"
    )]
    StillThere {
        /// `Node` or `Lease`.
        kind: &'static str,
        /// The Node's name.
        name: String,
        /// How long the stop waited.
        waited: Duration,
    },
}

/// How long [`VirtualNode::stop`] waits for the Node and Lease to go.
const DELETE_WAIT: Duration = Duration::from_secs(30);

/// One running virtual node. Dropping it stops the task (without deleting the Node).
pub struct VirtualNode {
    name: String,
    local: kube::Client,
    ready: Arc<AtomicBool>,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for VirtualNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VirtualNode")
            .field("name", &self.name)
            .field("ready", &self.ready())
            .finish_non_exhaustive()
    }
}

impl Drop for VirtualNode {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl VirtualNode {
    /// Starts the task: registers the Node, keeps its Lease and status.
    /// `provider` is the client for the provider's API server (None while not known: the node
    /// is then NotReady with a reason saying so); the task probes it every probe_interval.
    ///
    /// The Node's name is `spec.name` at spawn; a later change of the name is ignored (with a
    /// warning): stop this node and spawn another instead. Must be called inside a Tokio
    /// runtime.
    pub fn spawn(
        local: kube::Client,
        spec: watch::Receiver<NodeSpec>,
        provider: watch::Receiver<Option<kube::Client>>,
        network: watch::Receiver<Network>,
        timing: Timing,
    ) -> VirtualNode {
        let name = spec.borrow().name.clone();
        let timing = timing.floored();
        let ready = Arc::new(AtomicBool::new(false));
        let stop = CancellationToken::new();
        // Seeded from the client at hand: the node task may read the record before the probe
        // task first runs, and a given client must not read as "no credentials" (a restarted
        // controller would then turn an adopted Ready node NotReady for one write).
        let seed = desired::Probes {
            client_since: provider.borrow().is_some().then(Timestamp::now),
            ..desired::Probes::default()
        };
        let (probes_tx, probes_rx) = watch::channel(seed);
        let probe = tokio::spawn(probe::run(
            name.clone(),
            provider,
            probes_tx,
            timing.clone(),
            stop.clone(),
        ));
        let node = tokio::spawn(node_task::run(node_task::Inputs {
            client: local.clone(),
            name: name.clone(),
            spec,
            network,
            probes: probes_rx,
            timing,
            ready: ready.clone(),
            stop: stop.clone(),
        }));
        VirtualNode {
            name,
            local,
            ready,
            stop,
            tasks: vec![node, probe],
        }
    }

    /// The Node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the provider answered recently (what Ready reflects), for metrics/status.
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// Stops the task; with `delete`, deletes the Node and its Lease first and waits for that.
    ///
    /// The task stops before the deletion, so nothing re-creates the Node behind it.
    pub async fn stop(mut self, delete: bool) -> Result<(), Error> {
        self.stop.cancel();
        let mut failed = None;
        for task in std::mem::take(&mut self.tasks) {
            if let Err(source) = task.await
                && failed.is_none()
            {
                failed = Some(source);
            }
        }
        if delete {
            // The loop checks its deadline between calls; this bounds a call that hangs.
            let bound = DELETE_WAIT + Duration::from_secs(5);
            tokio::time::timeout(bound, delete_and_wait(&self.local, &self.name))
                .await
                .map_err(|_| Error::StillThere {
                    kind: "Node",
                    name: self.name.clone(),
                    waited: bound,
                })??;
        }
        match failed {
            Some(source) => Err(Error::Task {
                name: self.name.clone(),
                source,
            }),
            None => Ok(()),
        }
    }
}

/// Deletes the Node and its Lease, retrying transient errors, and waits until both are gone.
async fn delete_and_wait(client: &kube::Client, name: &str) -> Result<(), Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), desired::LEASE_NAMESPACE);
    let started = tokio::time::Instant::now();
    let mut backoff = node_task::Backoff::default();
    loop {
        let node = gone(
            nodes
                .delete(name, &DeleteParams::default())
                .await
                .map(|_| ()),
        );
        let lease = gone(
            leases
                .delete(name, &DeleteParams::default())
                .await
                .map(|_| ()),
        );
        let node_left = match node {
            Ok(()) => exists(&nodes, name).await,
            Err(e) => Err(e),
        };
        let lease_left = match lease {
            Ok(()) => exists(&leases, name).await,
            Err(e) => Err(e),
        };
        let out_of_time = started.elapsed() >= DELETE_WAIT;
        match (node_left, lease_left) {
            (Ok(false), Ok(false)) => return Ok(()),
            (Err(source), _) if out_of_time => {
                return Err(Error::Delete {
                    kind: "Node",
                    name: name.to_owned(),
                    source,
                });
            }
            (_, Err(source)) if out_of_time => {
                return Err(Error::Delete {
                    kind: "Lease",
                    name: name.to_owned(),
                    source,
                });
            }
            (node_left, _) if out_of_time => {
                return Err(Error::StillThere {
                    kind: if matches!(node_left, Ok(true)) {
                        "Node"
                    } else {
                        "Lease"
                    },
                    name: name.to_owned(),
                    waited: DELETE_WAIT,
                });
            }
            (node_left, lease_left) => {
                if let (Err(error), _) | (_, Err(error)) = (&node_left, &lease_left) {
                    tracing::warn!(node = %name, %error, "deleting the virtual node; retrying");
                }
                tokio::time::sleep(backoff.next_delay().min(Duration::from_secs(1))).await;
            }
        }
    }
}

/// A deletion whose object is already gone succeeded.
fn gone(result: Result<(), kube::Error>) -> Result<(), kube::Error> {
    match result {
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        other => other,
    }
}

async fn exists<K>(api: &Api<K>, name: &str) -> Result<bool, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name).await.map(|o| o.is_some())
}
