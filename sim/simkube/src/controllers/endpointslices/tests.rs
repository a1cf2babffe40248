//! Table tests of the slices and Endpoints a Service gets for its pods.

use k8s_openapi::api::core::v1::{Pod, Service};
use serde_json::{Value, json};

use super::*;

fn service(extra: Value) -> Service {
    let mut base = json!({
        "metadata": {"name": "web", "namespace": "default", "uid": "s1", "labels": {"team": "a"}},
        "spec": {"selector": {"app": "web"}, "ports": [
            {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"},
            {"name": "metrics", "port": 9090, "targetPort": 9100, "protocol": "TCP"}
        ]}
    });
    json_patch::merge(&mut base, &extra);
    serde_json::from_value(base).expect("service")
}

fn pod(name: &str, ip: Option<&str>, ready: bool, extra: Value) -> Pod {
    let mut base = json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
            "labels": {"app": "web"}},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i",
            "ports": [{"name": "http", "containerPort": 8080}]}]},
        "status": {"phase": "Running", "podIP": ip,
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
    });
    json_patch::merge(&mut base, &extra);
    serde_json::from_value(base).expect("pod")
}

/// Ports (name, number) and endpoints (address, ready, serving, terminating) of one slice.
type SliceSummary = (Vec<(String, i32)>, Vec<(String, bool, bool, bool)>);

fn summary(slices: &[EndpointSlice]) -> Vec<SliceSummary> {
    slices
        .iter()
        .map(|s| {
            let ports = s
                .ports
                .iter()
                .flatten()
                .map(|p| (p.name.clone().unwrap_or_default(), p.port.unwrap_or(0)))
                .collect();
            let endpoints = s
                .endpoints
                .iter()
                .map(|e| {
                    let c = e.conditions.clone().expect("conditions");
                    (
                        e.addresses[0].clone(),
                        c.ready == Some(true),
                        c.serving == Some(true),
                        c.terminating == Some(true),
                    )
                })
                .collect();
            (ports, endpoints)
        })
        .collect()
}

#[test]
fn slices_list_selected_pods_with_ip_and_readiness() {
    let pods = [
        pod("b", Some("10.0.0.2"), false, json!({})),
        pod("a", Some("10.0.0.1"), true, json!({})),
        pod("no-ip", None, true, json!({})),
        pod(
            "other",
            Some("10.0.0.9"),
            true,
            json!({"metadata": {"labels": {"app": "db"}}}),
        ),
        pod(
            "done",
            Some("10.0.0.8"),
            true,
            json!({"status": {"phase": "Succeeded"}}),
        ),
        pod(
            "going",
            Some("10.0.0.3"),
            true,
            json!({"metadata": {"deletionTimestamp": "2024-01-01T00:00:00Z"}}),
        ),
    ];
    let slices = desired_slices(&service(json!({})), &pods);
    assert_eq!(
        summary(&slices),
        [(
            vec![("http".into(), 8080), ("metrics".into(), 9100)],
            vec![
                ("10.0.0.1".into(), true, true, false),
                ("10.0.0.2".into(), false, false, false),
                ("10.0.0.3".into(), false, true, true),
            ]
        )]
    );
    let slice = &slices[0];
    let labels = slice.metadata.labels.clone().expect("labels");
    assert_eq!(labels[SERVICE_NAME_LABEL], "web");
    assert_eq!(labels[MANAGED_BY_LABEL], MANAGED_BY);
    assert_eq!(labels["team"], "a");
    assert_eq!(slice.metadata.generate_name.as_deref(), Some("web-"));
    assert_eq!(slice.address_type, "IPv4");
    let owner = &slice.metadata.owner_references.clone().expect("owner")[0];
    assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("Service", "s1"));
    let first = &slice.endpoints[0];
    assert_eq!(first.node_name.as_deref(), Some("n1"));
    assert_eq!(
        first.target_ref.as_ref().and_then(|r| r.name.as_deref()),
        Some("a")
    );
}

#[test]
fn pods_resolving_ports_differently_get_separate_slices() {
    let other_port = json!({"spec": {"containers": [{"name": "c", "image": "i",
        "ports": [{"name": "http", "containerPort": 9000}]}]}});
    let no_port = json!({"spec": {"containers": [{"name": "c", "image": "i"}]}});
    let pods = [
        pod("a", Some("10.0.0.1"), true, json!({})),
        pod("b", Some("10.0.0.2"), true, other_port),
        pod("c", Some("10.0.0.3"), true, no_port),
    ];
    let mut ports: Vec<Vec<(String, i32)>> = summary(&desired_slices(&service(json!({})), &pods))
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    ports.sort();
    assert_eq!(
        ports,
        [
            vec![("http".into(), 8080), ("metrics".into(), 9100)],
            vec![("http".into(), 9000), ("metrics".into(), 9100)],
            vec![("metrics".into(), 9100)],
        ]
    );
}

#[test]
fn a_hundred_endpoints_per_slice_and_a_placeholder_when_empty() {
    let pods: Vec<Pod> = (0..250)
        .map(|i| {
            pod(
                &format!("p{i:03}"),
                Some(&format!("10.0.{}.{}", i / 200, i % 200 + 1)),
                true,
                json!({}),
            )
        })
        .collect();
    let sizes: Vec<usize> = desired_slices(&service(json!({})), &pods)
        .iter()
        .map(|s| s.endpoints.len())
        .collect();
    assert_eq!(sizes, [100, 100, 50]);
    let empty = desired_slices(&service(json!({})), &[]);
    assert_eq!(empty.len(), 1);
    assert!(empty[0].endpoints.is_empty());
    assert!(empty[0].ports.is_none());
}

#[test]
fn publish_not_ready_addresses_marks_everything_ready() {
    let svc = service(json!({"spec": {"publishNotReadyAddresses": true}}));
    let slices = desired_slices(&svc, &[pod("a", Some("10.0.0.1"), false, json!({}))]);
    assert_eq!(
        summary(&slices)[0].1,
        [("10.0.0.1".into(), true, true, false)]
    );
}

#[test]
fn legacy_endpoints_split_ready_and_not_ready() {
    let pods = [
        pod("a", Some("10.0.0.1"), true, json!({})),
        pod("b", Some("10.0.0.2"), false, json!({})),
        pod(
            "c",
            Some("10.0.0.3"),
            true,
            json!({"metadata": {"deletionTimestamp": "2024-01-01T00:00:00Z"}}),
        ),
    ];
    let endpoints = desired_endpoints(&service(json!({})), &pods);
    assert_eq!(endpoints.metadata.name.as_deref(), Some("web"));
    let subsets = endpoints.subsets.expect("subsets");
    assert_eq!(subsets.len(), 1);
    let ips = |list: &Option<Vec<EndpointAddress>>| -> Vec<String> {
        list.iter().flatten().map(|a| a.ip.clone()).collect()
    };
    assert_eq!(ips(&subsets[0].addresses), ["10.0.0.1"]);
    assert_eq!(ips(&subsets[0].not_ready_addresses), ["10.0.0.2"]);
    let ports: Vec<(Option<String>, i32)> = subsets[0]
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.clone(), p.port))
        .collect();
    assert_eq!(
        ports,
        [(Some("http".into()), 8080), (Some("metrics".into()), 9100)]
    );
    assert!(
        desired_endpoints(&service(json!({})), &[])
            .subsets
            .is_none()
    );
}
