//! The pure model from data: Kubernetes objects as JSON in, the fabric input (rendered as its
//! plan) and the notes out.

// Fixtures are literals and valid by construction; a panic is the test failing.
#![allow(clippy::unwrap_used)]

use expect_test::{Expect, expect};
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;
use tether_api::networking::{Configuration, Connection};
use tether_fabric::{Built, Settings, device_mtu, gateway_input, node_input};

fn gateway_pod(ns: &str, name: &str, cluster: &str, ip: &str, ready: bool, created: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {
            "name": name, "namespace": ns, "creationTimestamp": created,
            "labels": {"tether.dev/component": "gateway", "tether.dev/remote-cluster-id": cluster},
        },
        "status": {
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
        },
    }))
    .unwrap()
}

fn configuration(ns: &str, cluster: &str, pod: &[&str], external: &[&str]) -> Configuration {
    serde_json::from_value(json!({
        "apiVersion": "networking.tether.dev/v1alpha1", "kind": "Configuration",
        "metadata": {"name": cluster, "namespace": ns, "labels": {"tether.dev/remote-cluster-id": cluster}},
        "spec": {"remote": {"clusterID": cluster, "cidr": {"pod": ["10.0.0.0/16"]}}},
        "status": {"remote": {"clusterID": cluster, "cidr": {"pod": pod, "external": external}}},
    }))
    .unwrap()
}

fn connection(ns: &str, cluster: &str, mtu: u32) -> Connection {
    serde_json::from_value(json!({
        "apiVersion": "networking.tether.dev/v1alpha1", "kind": "Connection",
        "metadata": {"name": "gw", "namespace": ns, "labels": {"tether.dev/remote-cluster-id": cluster}},
        "spec": {"remoteClusterID": cluster, "type": "Server", "gatewayRef": {"name": "gw"}},
        "status": {"mtu": mtu},
    }))
    .unwrap()
}

fn node(name: &str, ip: &str, cidrs: &[&str]) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"podCIDR": cidrs.first(), "podCIDRs": cidrs},
        "status": {"addresses": [{"type": "Hostname", "address": name}, {"type": "InternalIP", "address": ip}]},
    }))
    .unwrap()
}

fn render(built: &Built) -> String {
    let plan = tether_netplan::plan_fabric(&built.input).unwrap();
    let mut out: String = built.notes.iter().map(|n| format!("note: {n}\n")).collect();
    for line in plan
        .to_string()
        .lines()
        .take_while(|l| !l.starts_with("table "))
    {
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn settings() -> Settings {
    Settings::new("198.18.0.11".parse().unwrap(), device_mtu(1500))
}

fn check(built: &Built, expect: Expect) {
    expect.assert_eq(&render(built));
}

#[test]
fn a_node_routes_each_remote_cluster_to_its_ready_gateway_pod() {
    let pods = [
        gateway_pod(
            "tether-tenant-b",
            "gw-b-old",
            "b",
            "10.244.1.7",
            true,
            "2026-01-01T00:00:00Z",
        ),
        // A rollout: the newer Ready pod is the one that stays.
        gateway_pod(
            "tether-tenant-b",
            "gw-b-new",
            "b",
            "10.244.2.8",
            true,
            "2026-01-02T00:00:00Z",
        ),
        // Not Ready: cluster c has no gateway.
        gateway_pod(
            "tether-tenant-c",
            "gw-c",
            "c",
            "10.244.1.9",
            false,
            "2026-01-01T00:00:00Z",
        ),
        // The right label in the wrong namespace serves nobody.
        gateway_pod(
            "default",
            "impostor",
            "c",
            "10.244.3.3",
            true,
            "2026-01-01T00:00:00Z",
        ),
    ];
    let configurations = [
        configuration("tether-tenant-b", "b", &["10.71.0.0/16"], &["10.81.0.0/16"]),
        configuration("tether-tenant-c", "c", &["10.72.0.0/16"], &[]),
    ];
    let connections = [connection("tether-tenant-b", "b", 1420)];
    let built = node_input(&settings(), &pods, &configurations, &connections);
    check(
        &built,
        expect![[r#"
            note: remote cluster c: no Ready gateway pod; its CIDRs are unreachable
            link tether-fabric address 02:74:c6:12:00:0b mtu 1450 type vxlan id 7700 dstport 4789 local 198.18.0.11 nolearning
            fdb 02:74:0a:f4:02:08 dst 10.244.2.8 dev tether-fabric
            neigh 10.244.2.8 lladdr 02:74:0a:f4:02:08 permanent dev tether-fabric
            route 10.71.0.0/16 via 10.244.2.8 onlink mtu 1420 dev tether-fabric
            route unreachable 10.72.0.0/16
            route 10.81.0.0/16 via 10.244.2.8 onlink mtu 1420 dev tether-fabric
        "#]],
    );
    // Any order of the same objects gives the same input.
    let mut reversed_pods = pods.to_vec();
    reversed_pods.reverse();
    let mut reversed_configurations = configurations.to_vec();
    reversed_configurations.reverse();
    let again = node_input(
        &settings(),
        &reversed_pods,
        &reversed_configurations,
        &connections,
    );
    assert_eq!(again, built);
}

#[test]
fn a_node_leaves_out_what_it_cannot_route_and_says_why() {
    let pods = [gateway_pod(
        "tether-tenant-b",
        "gw",
        "b",
        "10.244.1.7",
        true,
        "2026-01-01T00:00:00Z",
    )];
    let mut pending = configuration("tether-tenant-d", "d", &[], &[]);
    pending.status = None;
    let configurations = [
        configuration(
            "tether-tenant-b",
            "b",
            &["10.71.0.0/16", "10.71.0.1/16", "nonsense"],
            &[],
        ),
        // Overlaps b's view (the IPAM should prevent it; the fabric must not break on it).
        configuration(
            "tether-tenant-c",
            "c",
            &["10.71.128.0/17", "198.18.0.0/24"],
            &[],
        ),
        pending,
    ];
    let built = node_input(&settings(), &pods, &configurations, &[]);
    check(
        &built,
        expect![[r#"
            note: configuration tether-tenant-b/b: CIDR 10.71.0.1/16 has host bits set; left out
            note: configuration tether-tenant-b/b: "nonsense" is not an IPv4 CIDR; left out
            note: configuration tether-tenant-d/d: no local view of the remote CIDRs yet
            note: remote cluster c: CIDR 10.71.128.0/17 overlaps one of remote cluster b; left out
            note: remote cluster c: CIDR 198.18.0.0/24 contains the underlay address 198.18.0.11; left out
            note: remote cluster c: no Ready gateway pod; its CIDRs are unreachable
            link tether-fabric address 02:74:c6:12:00:0b mtu 1450 type vxlan id 7700 dstport 4789 local 198.18.0.11 nolearning
            fdb 02:74:0a:f4:01:07 dst 10.244.1.7 dev tether-fabric
            neigh 10.244.1.7 lladdr 02:74:0a:f4:01:07 permanent dev tether-fabric
            route 10.71.0.0/16 via 10.244.1.7 onlink dev tether-fabric
        "#]],
    );
}

#[test]
fn a_gateway_pod_routes_every_nodes_pod_cidrs_to_it() {
    let nodes = [
        node("node-b", "198.18.0.12", &["10.0.2.0/24", "fd00:2::/64"]),
        node("node-a", "198.18.0.11", &["10.0.1.0/24"]),
        node("node-c", "198.18.0.13", &[]),
    ];
    let gateway = Settings::new("10.0.1.7".parse().unwrap(), device_mtu(1500));
    check(
        &gateway_input(&gateway, &nodes),
        expect![[r#"
            note: node node-c: no IPv4 pod CIDR; left out
            link tether-fabric address 02:74:0a:00:01:07 mtu 1450 type vxlan id 7700 dstport 4789 local 10.0.1.7 nolearning
            fdb 02:74:c6:12:00:0b dst 198.18.0.11 dev tether-fabric
            fdb 02:74:c6:12:00:0c dst 198.18.0.12 dev tether-fabric
            neigh 198.18.0.11 lladdr 02:74:c6:12:00:0b permanent dev tether-fabric
            neigh 198.18.0.12 lladdr 02:74:c6:12:00:0c permanent dev tether-fabric
            route 10.0.1.0/24 via 198.18.0.11 onlink dev tether-fabric
            route 10.0.2.0/24 via 198.18.0.12 onlink dev tether-fabric
        "#]],
    );
}

#[test]
fn the_device_mtu_leaves_room_for_vxlan() {
    assert_eq!(device_mtu(1500), 1450);
    assert_eq!(device_mtu(9000), 8950);
}
