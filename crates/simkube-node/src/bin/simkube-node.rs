//! The `simkube-node` command: run a simulated node agent, or one of its built-in workloads.

fn main() {}
