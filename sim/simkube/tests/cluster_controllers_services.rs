//! Service IP and node port allocation in the API server's create path, through the real
//! kube-rs client: random free addresses from 10.96.0.0/12, requested ones honoured, and the
//! real 422 answers for taken or out-of-range values; released on delete.

mod cluster_controllers_support;

use cluster_controllers_support::cluster;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

fn service(name: &str, spec: Value) -> Service {
    let mut obj = json!({"metadata": {"name": name}, "spec": {"ports": [{"port": 80}]}});
    json_patch::merge(&mut obj, &json!({"spec": spec}));
    serde_json::from_value(obj).expect("service")
}

async fn rejection(api: &Api<Service>, svc: &Service) -> (u16, String) {
    match api.create(&PostParams::default(), svc).await {
        Err(kube::Error::Api(status)) => (status.code, status.message),
        other => panic!("expected a 422, got {other:?}"),
    }
}

#[tokio::test]
async fn cluster_ips_and_node_ports_are_allocated_and_validated() {
    let (_cluster, client) = cluster().await;
    let api: Api<Service> = Api::default_namespaced(client.clone());
    let plain = api
        .create(&PostParams::default(), &service("plain", json!({})))
        .await
        .expect("create");
    let spec = plain.spec.expect("spec");
    let ip: std::net::Ipv4Addr = spec.cluster_ip.clone().expect("ip").parse().expect("ipv4");
    assert_eq!(ip.octets()[0], 10);
    assert!(
        (96..112).contains(&ip.octets()[1]),
        "{ip} outside 10.96.0.0/12"
    );
    assert_eq!(spec.cluster_ips, Some(vec![ip.to_string()]));

    let fixed = api
        .create(
            &PostParams::default(),
            &service("fixed", json!({"clusterIP": "10.96.0.10"})),
        )
        .await
        .expect("requested IP");
    assert_eq!(
        fixed.spec.and_then(|s| s.cluster_ip).as_deref(),
        Some("10.96.0.10")
    );
    assert_eq!(
        rejection(&api, &service("dup", json!({"clusterIP": "10.96.0.10"}))).await,
        (
            422,
            "Service \"dup\" is invalid: spec.clusterIP: Invalid value: \"10.96.0.10\": \
             provided IP is already allocated"
                .into()
        )
    );
    assert_eq!(
        rejection(&api, &service("far", json!({"clusterIP": "192.168.1.1"}))).await,
        (
            422,
            "Service \"far\" is invalid: spec.clusterIP: Invalid value: \"192.168.1.1\": \
             provided IP is not in the valid range. The range of valid IPs is 10.96.0.0/12"
                .into()
        )
    );
    // The default `kubernetes` Service holds 10.96.0.1.
    assert_eq!(
        rejection(&api, &service("api", json!({"clusterIP": "10.96.0.1"})))
            .await
            .0,
        422
    );

    let np = api
        .create(
            &PostParams::default(),
            &service("np", json!({"type": "NodePort"})),
        )
        .await
        .expect("node port");
    let port = np.spec.expect("spec").ports.expect("ports")[0]
        .node_port
        .expect("allocated node port");
    assert!((30000..=32767).contains(&port), "{port}");
    let taken = service(
        "np2",
        json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": port}]}),
    );
    assert_eq!(
        rejection(&api, &taken).await,
        (
            422,
            format!(
                "Service \"np2\" is invalid: spec.ports[0].nodePort: Invalid value: {port}: \
                 provided port is already allocated"
            )
        )
    );
    let low = service(
        "low",
        json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 80}]}),
    );
    assert_eq!(rejection(&api, &low).await.0, 422);
    let headless = api
        .create(
            &PostParams::default(),
            &service("headless", json!({"clusterIP": "None"})),
        )
        .await
        .expect("headless");
    assert_eq!(
        headless.spec.and_then(|s| s.cluster_ip).as_deref(),
        Some("None")
    );

    // Deleting releases both.
    api.delete("fixed", &DeleteParams::default())
        .await
        .expect("delete");
    api.delete("np", &DeleteParams::default())
        .await
        .expect("delete");
    api.create(
        &PostParams::default(),
        &service("again", json!({"clusterIP": "10.96.0.10"})),
    )
    .await
    .expect("IP reused after delete");
    api.create(&PostParams::default(), &taken)
        .await
        .expect("port reused after delete");
}

fn load_balancer(name: &str) -> Service {
    service(name, json!({"type": "LoadBalancer"}))
}

async fn ingress(api: &Api<Service>, name: &str) -> Vec<String> {
    let svc = api.get(name).await.expect("get");
    simkube::controllers::loadbalancer::ingress_ips(&svc)
}

#[tokio::test]
async fn load_balancers_get_pool_addresses_and_give_them_back() {
    let pool = [
        std::net::Ipv4Addr::new(198, 18, 0, 10),
        std::net::Ipv4Addr::new(198, 18, 0, 11),
    ];
    let cluster = simkube::Cluster::builder()
        .controllers(simkube::controllers::Controllers::all())
        .load_balancer_pool(pool)
        .start()
        .await
        .expect("start");
    let api: Api<Service> = Api::default_namespaced(cluster.client());
    for name in ["a", "b", "c"] {
        let created = api
            .create(&PostParams::default(), &load_balancer(name))
            .await
            .expect("create");
        let ports = created.spec.expect("spec").ports.expect("ports");
        assert!(
            ports[0].node_port.is_some(),
            "LoadBalancer services get node ports"
        );
        if name != "c" {
            let got = cluster_controllers_support::eventually("ingress", || async {
                let ips = ingress(&api, name).await;
                (!ips.is_empty()).then_some(ips)
            })
            .await;
            let want = if name == "a" {
                "198.18.0.10"
            } else {
                "198.18.0.11"
            };
            assert_eq!(got, [want]);
        }
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        ingress(&api, "c").await.is_empty(),
        "pool exhausted: c stays pending"
    );

    // `a` stops being a LoadBalancer: its address goes back and `c` gets it.
    // The node port carried over is dropped with the type, as the real server does.
    let patch = json!({"spec": {"type": "ClusterIP"}});
    api.patch(
        "a",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .expect("to ClusterIP");
    let a = api.get("a").await.expect("get");
    assert_eq!(
        a.spec.expect("spec").ports.expect("ports")[0].node_port,
        None
    );
    cluster_controllers_support::eventually("c gets a's address", || async {
        (ingress(&api, "c").await == ["198.18.0.10"] && ingress(&api, "a").await.is_empty())
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn without_a_pool_load_balancers_stay_pending() {
    let (_cluster, client) = cluster().await;
    let api: Api<Service> = Api::default_namespaced(client);
    api.create(&PostParams::default(), &load_balancer("lb"))
        .await
        .expect("create");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(ingress(&api, "lb").await.is_empty());
}
