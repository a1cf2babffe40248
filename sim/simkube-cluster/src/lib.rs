//! Whole simulated Kubernetes clusters on one machine, brought up and down by the `simkube`
//! command (`simkube cluster up|down|list|stop-node|start-node`).
//!
//! A cluster is a detached daemon ([`daemon`]) running the simkube API server with its
//! controllers and the cluster DNS inside a shared underlay network namespace, plus one node
//! agent per node namespace, wired as [`topology`] lays out: bridge `skbrX` with 198.18.X.1
//! in the underlay, node I in `sk.<name>.nI` at 198.18.X.(10+I) with pod CIDR 10.244.I.0/24,
//! LoadBalancer addresses from 198.19.X.0/24. [`ops`] creates and removes all of it (also after
//! a crash), [`net`] is the iproute2 plumbing, [`state`] the state directory that records what
//! exists, [`proc`] finds and stops recorded processes.

pub mod daemon;
mod error;
pub mod metrics;
pub mod net;
pub mod ops;
pub mod probe;
pub mod proc;
pub mod state;
pub mod topology;

pub use error::Error;
