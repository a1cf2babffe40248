//! The node agent of simulated clusters (`simkube node`): it registers a Node with an API server,
//! renews its heartbeat Lease, and runs the pods bound to it as ordinary processes, each pod in
//! its own network namespace with a veth to the node and an address from the node's pod CIDR.
//!
//! Pure decisions live in their own modules ([`ipam`], [`backoff`], [`images`], [`env`],
//! [`node_status`], [`pod_status`], [`probes`], [`volumes`], [`pod_dns`]); the IO is in
//! [`agent`] (life cycle, one worker per pod, one supervisor per container), [`sandbox`]
//! (namespaces, veths, routes), [`process`] (container processes, each in its own mount
//! namespace with the pod's volumes, resolv.conf and hosts bound in), [`pod_volumes`] and
//! [`atomic_writer`] (volume contents, kept current), [`prober`] (probe attempts and the
//! kubelet's events) and [`kubelet`] (the HTTPS endpoint for `kubectl logs`, `exec` and `attach`,
//! and `/metrics` from [`metrics`]). Container output goes through [`container_log`] (CRI-format
//! log files with a time per line). [`proxy`] is the node's service proxy (an nftables table
//! for Services, plus routes to the other nodes' pod CIDRs). [`builtin`] holds the built-in
//! workloads that the node binary runs as `__builtin <name>`. [`status`] is the agent's report
//! to its supervisor (the proxy's health, or why the agent could not run).
//!
//! The namespace the agent runs in *is* the node: run it inside a node's network namespace
//! (`--netns`, or from a thread that entered one) and the pods hang off that namespace.
//!
//! ```no_run
//! # async fn demo(client: kube::Client) -> Result<(), simkube_node::Error> {
//! use simkube_node::images::ImageTable;
//! use simkube_node::node_status::NodeIdentity;
//! use simkube_node::{Agent, AgentConfig};
//!
//! let identity = NodeIdentity {
//!     name: "node-a".into(),
//!     pod_cidr: "10.244.1.0/24".parse().expect("a CIDR"),
//!     internal_ip: "198.18.0.2".parse().expect("an IP"),
//!     kubelet_port: 10250,
//!     cpu: "4".into(),
//!     memory: "8Gi".into(),
//!     max_pods: 110,
//!     labels: Default::default(),
//! };
//! let images = ImageTable::new(std::env::current_exe().expect("own path"));
//! let config = AgentConfig::new(identity, images, "/var/lib/simkube-node".into());
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! Agent::new(client, config)?.run(shutdown).await
//! # }
//! ```

pub mod agent;
pub mod atomic_writer;
pub mod backoff;
pub mod builtin;
pub mod cli;
pub mod container_log;
pub mod containers;
pub mod env;
mod error;
pub mod images;
pub mod ipam;
pub mod kubelet;
pub mod metrics;
pub mod node_status;
pub mod pod_dns;
pub mod pod_status;
pub mod pod_volumes;
pub mod prober;
pub mod probes;
pub mod process;
pub mod proxy;
pub mod sandbox;
pub mod status;
pub mod volumes;

pub use agent::{Agent, AgentConfig};
pub use error::Error;
