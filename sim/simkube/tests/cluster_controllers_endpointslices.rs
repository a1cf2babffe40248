//! EndpointSlices and Endpoints against a running simkube with every controller, through the
//! real kube-rs client: slices follow pod readiness, named target ports resolve, and the
//! slices belong to (and go away with) their Service.

mod cluster_controllers_support;

use cluster_controllers_support::{cluster, create_node, eventually, node, pod, set_pod_ready};
use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt as _};
use serde_json::json;

async fn slices(client: &Client, service: &str) -> Vec<EndpointSlice> {
    Api::<EndpointSlice>::default_namespaced(client.clone())
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={service}")))
        .await
        .expect("list slices")
        .items
}

/// (address, ready) of every endpoint of the Service's slices, sorted.
async fn endpoints(client: &Client, service: &str) -> Vec<(String, bool)> {
    let mut out: Vec<(String, bool)> = slices(client, service)
        .await
        .iter()
        .flat_map(|s| s.endpoints.iter())
        .map(|e| {
            (
                e.addresses[0].clone(),
                e.conditions.as_ref().and_then(|c| c.ready) == Some(true),
            )
        })
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn slices_follow_pod_readiness() {
    let (cluster, client) = cluster().await;
    create_node(&client, &node("n1", "4", "8Gi", json!({}))).await;
    let services: Api<Service> = Api::default_namespaced(client.clone());
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}
    }))
    .expect("service");
    services
        .create(&PostParams::default(), &svc)
        .await
        .expect("create service");
    // A Service selecting nothing yet has one empty slice.
    let empty = eventually("placeholder slice", || async {
        let s = slices(&client, "web").await;
        (s.len() == 1).then_some(s)
    })
    .await;
    assert!(empty[0].endpoints.is_empty());
    let labels = empty[0].labels();
    assert_eq!(
        labels["endpointslice.kubernetes.io/managed-by"],
        "endpointslice-controller.k8s.io"
    );
    assert_eq!(empty[0].owner_references()[0].kind, "Service");

    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let with_port = json!({"containers": [{"name": "c", "image": "nginx", "ports": [{"name": "http", "containerPort": 8080}]}]});
    for name in ["a", "b"] {
        pods.create(&PostParams::default(), &pod(name, with_port.clone()))
            .await
            .expect("create pod");
    }
    eventually("pods bound", || async {
        let list = pods.list(&ListParams::default()).await.ok()?;
        list.items
            .iter()
            .all(|p| cluster_controllers_support::node_of(p).is_some())
            .then_some(())
    })
    .await;
    set_pod_ready(&client, "default", "a", "10.244.0.10", true).await;
    set_pod_ready(&client, "default", "b", "10.244.0.11", true).await;
    eventually("both endpoints ready", || async {
        (endpoints(&client, "web").await
            == [("10.244.0.10".into(), true), ("10.244.0.11".into(), true)])
        .then_some(())
    })
    .await;
    let slice = &slices(&client, "web").await[0];
    let port = &slice.ports.as_ref().expect("ports")[0];
    assert_eq!(
        (port.name.as_deref(), port.port),
        (Some("http"), Some(8080))
    );
    let a = slice
        .endpoints
        .iter()
        .find(|e| e.addresses[0] == "10.244.0.10")
        .expect("a");
    assert_eq!(a.node_name.as_deref(), Some("n1"));
    assert_eq!(
        a.target_ref.as_ref().and_then(|r| r.name.as_deref()),
        Some("a")
    );

    // The pod becoming unready leaves the ready endpoints (it stays listed, not ready).
    set_pod_ready(&client, "default", "a", "10.244.0.10", false).await;
    eventually("a not ready", || async {
        (endpoints(&client, "web").await
            == [("10.244.0.10".into(), false), ("10.244.0.11".into(), true)])
        .then_some(())
    })
    .await;
    let legacy = eventually("legacy endpoints", || async {
        let e = Api::<Endpoints>::default_namespaced(client.clone())
            .get("web")
            .await
            .ok()?;
        let subset = e.subsets?.into_iter().next()?;
        let ready: Vec<String> = subset.addresses?.into_iter().map(|a| a.ip).collect();
        let not_ready: Vec<String> = subset
            .not_ready_addresses?
            .into_iter()
            .map(|a| a.ip)
            .collect();
        Some((ready, not_ready))
    })
    .await;
    assert_eq!(
        legacy,
        (
            vec!["10.244.0.11".to_owned()],
            vec!["10.244.0.10".to_owned()]
        )
    );

    // Settled: the controller does not keep rewriting what it wrote.
    cluster.clear_requests();
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let writes: Vec<String> = cluster
        .requests()
        .into_iter()
        .filter(|r| {
            r.path.contains("endpoints") && !matches!(r.verb.as_str(), "get" | "list" | "watch")
        })
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert!(
        writes.is_empty(),
        "writes while nothing changed: {writes:?}"
    );

    // A deleted pod (completed by force, as the kubelet would) leaves the slice.
    pods.delete(
        "b",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .expect("delete");
    eventually("b gone", || async {
        (endpoints(&client, "web").await == [("10.244.0.10".into(), false)]).then_some(())
    })
    .await;

    // Slices belong to the Service: the garbage collector removes them with it.
    services
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete service");
    eventually("slices collected", || async {
        slices(&client, "web").await.is_empty().then_some(())
    })
    .await;
}
