//! Pod traffic across peered simulated clusters: echo and traffic pods pinned to nodes, the
//! remapped address of a remote pod, and the caller address a receiver reports.

use std::net::Ipv4Addr;
use std::time::Duration;

use super::Sim;

/// An echo pod pinned to `node`.
pub fn echo_pod(name: &str, node: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: default
spec:
  nodeName: {node}
  containers:
  - name: echo
    image: simkube.dev/echo
"
    )
}

/// A one-shot traffic pod on `node` that talks `proto` to `target` three times.
pub fn traffic_pod(name: &str, node: &str, proto: &str, target: &str) -> String {
    traffic_pod_yaml("default", name, Some(node), proto, target, false)
}

/// A one-shot traffic pod in namespace `ns`, bound to `node` or, with `None`, placed by the
/// scheduler (and, in an offloaded namespace, the pod webhook). It requests a little cpu and
/// memory, which a provider enforcing grants requires of an offloaded pod.
pub fn traffic_pod_in(
    ns: &str,
    name: &str,
    node: Option<&str>,
    proto: &str,
    target: &str,
) -> String {
    traffic_pod_yaml(ns, name, node, proto, target, true)
}

fn traffic_pod_yaml(
    ns: &str,
    name: &str,
    node: Option<&str>,
    proto: &str,
    target: &str,
    requests: bool,
) -> String {
    let node = node.map_or(String::new(), |n| format!("\n  nodeName: {n}"));
    let requests = if requests {
        "\n    resources:\n      requests: {cpu: 10m, memory: 16Mi}"
    } else {
        ""
    };
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {ns}
spec:{node}
  restartPolicy: Never
  containers:
  - name: traffic
    image: simkube.dev/traffic
    args: [--target, \"{target}\", --proto, {proto}, --count, \"3\", --interval-ms, \"200\"]{requests}
"
    )
}

pub fn nodes(sim: &Sim) -> Vec<String> {
    let mut n: Vec<String> = sim
        .names(&["nodes"])
        .into_iter()
        .map(|n| n.trim_start_matches("node/").to_owned())
        .collect();
    n.sort();
    n
}

pub fn pod_ip(sim: &Sim, pod: &str) -> Ipv4Addr {
    let mut ip = String::new();
    sim.wait(
        &format!("pod {pod} running with an IP"),
        Duration::from_secs(60),
        || {
            ip = sim.jsonpath(&["pod", pod], "{.status.podIP}");
            !ip.is_empty() && sim.jsonpath(&["pod", pod], "{.status.phase}") == "Running"
        },
    );
    ip.parse().expect("pod IP")
}

/// `addr` of the peer's pod CIDR as this cluster addresses it: the remap's prefix with the
/// address's host bits.
pub fn remapped(view: &str, addr: Ipv4Addr) -> Ipv4Addr {
    let view: ipnet::Ipv4Net = view.parse().expect("remapped CIDR");
    let host = u32::from(addr) & !u32::from(view.netmask());
    Ipv4Addr::from(u32::from(view.network()) | host)
}

/// How `sim` addresses the pods of peer `remote_id`.
pub fn view_of(sim: &Sim, remote_id: &str) -> String {
    sim.jsonpath(
        &[
            "configurations.networking.tether.dev",
            "-n",
            &format!("tether-tenant-{remote_id}"),
            remote_id,
        ],
        "{.status.remote.cidr.pod[0]}",
    )
}

/// Runs a traffic pod in `from` and returns the peer addresses the echo reported.
pub fn talk(from: &Sim, name: &str, node: &str, proto: &str, target: &str) -> Vec<String> {
    answers(from, "default", name, Some(node), proto, target, "peer=")
}

/// Like [`talk`], from a pod in namespace `ns` (placed by the scheduler when `node` is `None`);
/// returns every answer line whole.
pub fn talk_in(
    from: &Sim,
    ns: &str,
    name: &str,
    node: Option<&str>,
    proto: &str,
    target: &str,
) -> Vec<String> {
    answers(from, ns, name, node, proto, target, "")
}

/// Runs a traffic pod in `from` and returns the names of the echo pods that answered.
pub fn answering_pods(
    from: &Sim,
    name: &str,
    node: &str,
    proto: &str,
    target: &str,
) -> Vec<String> {
    answers(from, "default", name, Some(node), proto, target, "pod=")
}

/// Runs a traffic pod in `from` and returns the `field` of every answer line (with an empty
/// `field`, the answer lines whole).
fn answers(
    from: &Sim,
    ns: &str,
    name: &str,
    node: Option<&str>,
    proto: &str,
    target: &str,
    field: &str,
) -> Vec<String> {
    from.apply_as(
        std::path::Path::new(from.kubeconfig()),
        &traffic_pod_yaml(ns, name, node, proto, target, ns != "default"),
    )
    .ok();
    from.wait(&format!("{name} finished"), Duration::from_secs(60), || {
        matches!(
            from.jsonpath(&["pod", "-n", ns, name], "{.status.phase}")
                .as_str(),
            "Succeeded" | "Failed"
        )
    });
    let phase = from.jsonpath(&["pod", "-n", ns, name], "{.status.phase}");
    let logs = from.kubectl(&["logs", "-n", ns, name]).stdout;
    from.kubectl(&["delete", "pod", "-n", ns, name, "--wait=false"]);
    assert_eq!(
        phase, "Succeeded",
        "{name} ({proto} to {target}) failed:\n{logs}"
    );
    if field.is_empty() {
        return logs
            .lines()
            .filter(|l| l.contains("peer="))
            .map(str::to_owned)
            .collect();
    }
    logs.lines()
        .filter_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix(field)))
        .map(|p| match field {
            "peer=" => p.rsplit_once(':').map_or(p, |(ip, _)| ip).to_owned(),
            _ => p.to_owned(),
        })
        .collect()
}
