//! The fabric's peers from the cluster's Nodes: each node's InternalIP and the pod CIDRs routed
//! to it. Pure; the gateway keeps a Node reflector and hands this list to the fabric device.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::Node;

/// `(node InternalIP, its IPv4 spec.podCIDRs)`, sorted by address, CIDRs sorted too. Nodes
/// without an IPv4 InternalIP or without IPv4 pod CIDRs are skipped: nothing routes to them
/// yet. Unparseable CIDRs are skipped (the API server validated them; a broken one must not
/// take the other nodes' routes down).
pub fn fabric_peers(nodes: &[Node]) -> Vec<(Ipv4Addr, Vec<Ipv4Net>)> {
    let mut peers: Vec<(Ipv4Addr, Vec<Ipv4Net>)> = nodes
        .iter()
        .filter_map(|n| {
            let ip = n
                .status
                .as_ref()?
                .addresses
                .as_ref()?
                .iter()
                .filter(|a| a.type_ == "InternalIP")
                .find_map(|a| a.address.parse::<Ipv4Addr>().ok())?;
            let spec = n.spec.as_ref()?;
            let listed = spec.pod_cidrs.clone().unwrap_or_default();
            let cidrs = if listed.is_empty() {
                spec.pod_cidr.iter().cloned().collect()
            } else {
                listed
            };
            let mut cidrs: Vec<Ipv4Net> = cidrs
                .iter()
                .filter_map(|c| c.parse::<Ipv4Net>().ok())
                .map(|c| c.trunc())
                .collect();
            cidrs.sort();
            cidrs.dedup();
            (!cidrs.is_empty()).then_some((ip, cidrs))
        })
        .collect();
    peers.sort();
    peers.dedup_by(|a, b| a.0 == b.0);
    peers
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    fn node(name: &str, ips: &[(&str, &str)], cidrs: serde_json::Value) -> Node {
        let addresses: Vec<_> = ips
            .iter()
            .map(|(t, a)| serde_json::json!({"type": t, "address": a}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": cidrs,
            "status": {"addresses": addresses},
        }))
        .expect("node")
    }

    #[test]
    fn nodes_become_sorted_fabric_peers() {
        let nodes = [
            node(
                "b",
                &[("InternalIP", "172.18.0.3")],
                serde_json::json!({"podCIDRs": ["10.0.2.0/24", "10.0.1.0/24", "fd00::/64"]}),
            ),
            node(
                "a",
                &[
                    ("Hostname", "a"),
                    ("InternalIP", "fd00::1"),
                    ("InternalIP", "172.18.0.2"),
                ],
                serde_json::json!({"podCIDR": "10.0.0.0/24"}),
            ),
            node(
                "no-cidrs",
                &[("InternalIP", "172.18.0.4")],
                serde_json::json!({}),
            ),
            node(
                "no-ip",
                &[("ExternalIP", "203.0.113.1")],
                serde_json::json!({"podCIDRs": ["10.0.5.0/24"]}),
            ),
            node(
                "only-v6",
                &[("InternalIP", "172.18.0.6")],
                serde_json::json!({"podCIDRs": ["fd00:1::/64"]}),
            ),
        ];
        let text: String = fabric_peers(&nodes)
            .iter()
            .map(|(ip, cidrs)| format!("{ip} {cidrs:?}\n"))
            .collect();
        expect![[r#"
            172.18.0.2 [10.0.0.0/24]
            172.18.0.3 [10.0.1.0/24, 10.0.2.0/24]
        "#]]
        .assert_eq(&text);
        assert!(fabric_peers(&[]).is_empty());
    }
}
