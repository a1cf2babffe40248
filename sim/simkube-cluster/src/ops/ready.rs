//! Waiting until a new cluster works: its API server, its nodes.

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;

use crate::Error;
use crate::state::{ClusterRecord, StateDir};

use super::up::{UpOptions, UpSummary};

pub(super) fn wait_ready(
    state: &StateDir,
    record: &ClusterRecord,
    mut child: Child,
    options: &UpOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<UpSummary, Error> {
    let logs = state.cluster_dir(&record.name);
    let deadline = Instant::now() + options.timeout;
    let not_ready = |message: String| Error::NotReady {
        message,
        logs: logs.clone(),
    };
    let check_daemon = |child: &mut Child| -> Result<(), Error> {
        match child.try_wait() {
            Ok(Some(status)) => Err(not_ready(format!(
                "the cluster daemon exited ({status}): {}",
                tail(&state.file(&record.name, "daemon.log"), 5)
            ))),
            _ => Ok(()),
        }
    };
    let daemon = loop {
        check_daemon(&mut child)?;
        if let Some(daemon) = state.read_daemon(&record.name)? {
            break daemon;
        }
        if Instant::now() > deadline {
            return Err(not_ready(format!(
                "the API server did not start within {} s",
                options.timeout.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let url = format!("https://127.0.0.1:{}", daemon.host_port);
    progress(&format!(
        "API server up: {url} (nodes and pods: https://{})",
        record.plan().api_addr()
    ));
    let kubeconfig_path = state.file(&record.name, "admin.kubeconfig");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Error::io("starting the async runtime"))?;
    let client = runtime.block_on(client_from(&kubeconfig_path))?;
    let api: kube::Api<Node> = kube::Api::all(client);
    let mut reported_registered = std::collections::BTreeSet::new();
    let mut reported_ready = std::collections::BTreeSet::new();
    let expected: Vec<String> = record
        .plan()
        .node_plans()
        .into_iter()
        .map(|n| n.name)
        .collect();
    loop {
        check_daemon(&mut child)?;
        if let Ok(list) = runtime.block_on(api.list(&Default::default())) {
            for node in &list.items {
                let name = node.metadata.name.clone().unwrap_or_default();
                if !expected.contains(&name) {
                    continue;
                }
                if reported_registered.insert(name.clone()) {
                    progress(&format!(
                        "node {name} registered ({}/{})",
                        reported_registered.len(),
                        expected.len()
                    ));
                }
                if node_ready(node) && reported_ready.insert(name.clone()) {
                    progress(&format!(
                        "node {name} Ready ({}/{})",
                        reported_ready.len(),
                        expected.len()
                    ));
                }
            }
        }
        if reported_ready.len() == expected.len() {
            break;
        }
        if Instant::now() > deadline {
            let missing: Vec<&String> = expected
                .iter()
                .filter(|n| !reported_ready.contains(*n))
                .collect();
            return Err(not_ready(format!(
                "nodes {missing:?} not Ready within {} s",
                options.timeout.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let kubeconfig = std::fs::read(&kubeconfig_path).map_err(|source| Error::State {
        action: "reading",
        path: kubeconfig_path.clone(),
        source,
    })?;
    crate::state::write_atomic(&options.kubeconfig_out, &kubeconfig, 0o600)?;
    Ok(UpSummary {
        record: record.clone(),
        url,
        nodes: expected,
        metrics_url: daemon
            .metrics_port
            .map(|port| format!("http://127.0.0.1:{port}")),
        kubeconfig: options.kubeconfig_out.clone(),
    })
}

/// A client from a kubeconfig file.
pub async fn client_from(path: &Path) -> Result<kube::Client, Error> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path)
        .map_err(|e| Error::Invalid(format!("kubeconfig {}: {e}", path.display())))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|e| Error::Invalid(format!("kubeconfig {}: {e}", path.display())))?;
    kube::Client::try_from(config).map_err(Error::api("building the API client"))
}

/// Whether the Node's Ready condition is True.
pub fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The last `lines` lines of a file, joined by " | ".
fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    all[all.len().saturating_sub(lines)..].join(" | ")
}
