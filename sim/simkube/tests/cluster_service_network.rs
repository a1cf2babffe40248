//! The service network a cluster is built with: ClusterIPs come from the configured service
//! CIDR (the 422s name it), the `kubernetes` Service holds its first address, and its
//! Endpoints and EndpointSlice name the advertised API server address and are kept that way.

mod cluster_controllers_support;

use std::net::SocketAddr;

use cluster_controllers_support::eventually;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

fn service(name: &str, cluster_ip: Option<&str>) -> Service {
    let mut spec = json!({"ports": [{"port": 80}]});
    if let Some(ip) = cluster_ip {
        spec["clusterIP"] = json!(ip);
    }
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).expect("service")
}

/// (addresses, ports as name:port) of the `kubernetes` Endpoints and EndpointSlice.
async fn endpoints(client: &kube::Client) -> Option<(Vec<String>, Vec<String>, Vec<String>)> {
    let eps: Api<Endpoints> = Api::namespaced(client.clone(), "default");
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let ep = eps.get_opt("kubernetes").await.expect("get endpoints")?;
    let slice = slices.get_opt("kubernetes").await.expect("get slice")?;
    let subsets = ep.subsets.unwrap_or_default();
    let mut addresses: Vec<String> = subsets
        .iter()
        .flat_map(|s| s.addresses.clone().unwrap_or_default())
        .map(|a| a.ip)
        .collect();
    addresses.extend(
        slice
            .endpoints
            .iter()
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
            .flat_map(|e| e.addresses.clone()),
    );
    let mut ports: Vec<String> = subsets
        .iter()
        .flat_map(|s| s.ports.clone().unwrap_or_default())
        .map(|p| format!("{}:{}", p.name.unwrap_or_default(), p.port))
        .collect();
    ports.extend(
        slice
            .ports
            .unwrap_or_default()
            .into_iter()
            .map(|p| format!("{}:{}", p.name.unwrap_or_default(), p.port.unwrap_or(0))),
    );
    let labels = slice
        .metadata
        .labels
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .chain([slice.address_type])
        .collect();
    Some((addresses, ports, labels))
}

#[tokio::test]
async fn a_custom_service_cidr_and_advertised_address_shape_the_kubernetes_service() {
    let advertise: SocketAddr = "198.18.7.1:6443".parse().expect("addr");
    let cluster = simkube::Cluster::builder()
        .service_cidr("10.100.0.0/16".parse().expect("cidr"))
        .advertise(advertise)
        .start()
        .await
        .expect("start");
    let client = cluster.client();
    let services: Api<Service> = Api::default_namespaced(client.clone());

    let kubernetes = services
        .get("kubernetes")
        .await
        .expect("kubernetes service");
    let spec = kubernetes.spec.expect("spec");
    assert_eq!(spec.cluster_ip.as_deref(), Some("10.100.0.1"));
    let port = &spec.ports.expect("ports")[0];
    assert_eq!((port.name.as_deref(), port.port), (Some("https"), 443));
    assert_eq!(
        port.target_port,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(6443))
    );
    assert_eq!(
        endpoints(&client).await.expect("endpoints seeded"),
        (
            vec!["198.18.7.1".to_owned(), "198.18.7.1".to_owned()],
            vec!["https:6443".to_owned(), "https:6443".to_owned()],
            vec![
                "kubernetes.io/service-name=kubernetes".to_owned(),
                "IPv4".to_owned()
            ]
        )
    );

    for i in 0..20 {
        let created = services
            .create(&PostParams::default(), &service(&format!("s{i}"), None))
            .await
            .expect("create");
        let ip: std::net::Ipv4Addr = created
            .spec
            .and_then(|s| s.cluster_ip)
            .expect("ip")
            .parse()
            .expect("ipv4");
        assert_eq!(&ip.octets()[..2], [10, 100], "{ip} outside 10.100.0.0/16");
    }
    match services
        .create(&PostParams::default(), &service("far", Some("10.96.0.10")))
        .await
    {
        Err(kube::Error::Api(status)) => assert_eq!(
            (status.code, status.message.as_str()),
            (
                422,
                "Service \"far\" is invalid: spec.clusterIP: Invalid value: \"10.96.0.10\": \
                 provided IP is not in the valid range. The range of valid IPs is 10.100.0.0/16"
            )
        ),
        other => panic!("expected a 422, got {other:?}"),
    }
    services
        .create(&PostParams::default(), &service("near", Some("10.100.9.9")))
        .await
        .expect("an address of the range");
}

#[tokio::test]
async fn the_kubernetes_endpoints_follow_the_listener_and_are_repaired() {
    let cluster = simkube::Cluster::builder().start().await.expect("start");
    let client = cluster.client();
    let port = cluster.addr().port();
    let want = (
        vec!["127.0.0.1".to_owned(), "127.0.0.1".to_owned()],
        vec![format!("https:{port}"), format!("https:{port}")],
    );
    let got = endpoints(&client).await.expect("seeded");
    assert_eq!((got.0, got.1), want.clone());
    let services: Api<Service> = Api::default_namespaced(client.clone());
    let kubernetes = services.get("kubernetes").await.expect("service");
    assert_eq!(
        kubernetes.spec.expect("spec").cluster_ip.as_deref(),
        Some("10.96.0.1")
    );

    // A client rewrites the slice and deletes the Endpoints and the Service: the server puts
    // them back as they were (the Service keeps its first-address ClusterIP).
    let slices: Api<EndpointSlice> = Api::default_namespaced(client.clone());
    slices
        .patch(
            "kubernetes",
            &PatchParams::default(),
            &Patch::Merge(&json!({"endpoints": [{"addresses": ["192.0.2.1"]}]})),
        )
        .await
        .expect("patch slice");
    let eps: Api<Endpoints> = Api::default_namespaced(client.clone());
    eps.delete("kubernetes", &DeleteParams::default())
        .await
        .expect("delete endpoints");
    services
        .delete("kubernetes", &DeleteParams::default())
        .await
        .expect("delete service");
    eventually("the kubernetes endpoints to be repaired", || async {
        let got = endpoints(&client).await?;
        ((got.0, got.1) == want).then_some(())
    })
    .await;
    let back = eventually("the kubernetes Service to come back", || async {
        services.get_opt("kubernetes").await.expect("get")
    })
    .await;
    assert_eq!(
        back.spec.expect("spec").cluster_ip.as_deref(),
        Some("10.96.0.1")
    );
}

async fn node_ports(api: &Api<Service>, name: &str) -> Vec<Option<i32>> {
    api.get(name)
        .await
        .expect("get")
        .spec
        .and_then(|s| s.ports)
        .unwrap_or_default()
        .iter()
        .map(|p| p.node_port)
        .collect()
}

async fn merge(
    api: &Api<Service>,
    name: &str,
    patch: serde_json::Value,
) -> Result<Service, (u16, String)> {
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| match e {
            kube::Error::Api(status) => (status.code, status.message),
            other => panic!("unexpected error {other:?}"),
        })
}

#[tokio::test]
async fn changing_the_type_allocates_validates_and_releases_node_ports() {
    let cluster = simkube::Cluster::builder().start().await.expect("start");
    let api: Api<Service> = Api::default_namespaced(cluster.client());
    api.create(&PostParams::default(), &service("web", None))
        .await
        .expect("create");
    api.create(&PostParams::default(), &service("other", None))
        .await
        .expect("create");
    let ip = api
        .get("web")
        .await
        .expect("get")
        .spec
        .and_then(|s| s.cluster_ip);

    // ClusterIP -> NodePort: a node port is allocated, the ClusterIP stays.
    merge(&api, "web", json!({"spec": {"type": "NodePort"}}))
        .await
        .expect("to NodePort");
    let ports = node_ports(&api, "web").await;
    let port = ports[0].expect("a node port");
    assert!((30000..=32767).contains(&port), "{port}");
    assert_eq!(
        api.get("web")
            .await
            .expect("get")
            .spec
            .and_then(|s| s.cluster_ip),
        ip
    );
    // An unrelated update keeps it.
    merge(&api, "web", json!({"metadata": {"labels": {"x": "y"}}}))
        .await
        .expect("label");
    assert_eq!(node_ports(&api, "web").await, [Some(port)]);

    // Another Service may not take it, nor one outside the range.
    assert_eq!(
        merge(
            &api,
            "other",
            json!({"spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": port}]}})
        )
        .await
        .map(|_| ()),
        Err((
            422,
            format!(
                "Service \"other\" is invalid: spec.ports[0].nodePort: Invalid value: {port}: \
                 provided port is already allocated"
            )
        ))
    );
    assert_eq!(
        merge(
            &api,
            "other",
            json!({"spec": {"type": "LoadBalancer", "ports": [{"port": 80, "nodePort": 80}]}})
        )
        .await
        .map(|_| ()),
        Err((
            422,
            "Service \"other\" is invalid: spec.ports[0].nodePort: Invalid value: 80: provided \
             port is not in the valid range. The range of valid ports is 30000-32767"
                .to_owned()
        ))
    );
    assert_eq!(
        node_ports(&api, "other").await,
        [None],
        "nothing half-applied"
    );

    // Back to ClusterIP: the port is dropped and free for `other`.
    merge(&api, "web", json!({"spec": {"type": "ClusterIP"}}))
        .await
        .expect("to ClusterIP");
    assert_eq!(node_ports(&api, "web").await, [None]);
    merge(
        &api,
        "other",
        json!({"spec": {"type": "LoadBalancer", "ports": [{"port": 80, "nodePort": port}]}}),
    )
    .await
    .expect("the released port");
    assert_eq!(node_ports(&api, "other").await, [Some(port)]);
}

#[tokio::test]
async fn external_name_gives_its_cluster_ip_back_and_returning_gets_one() {
    let cluster = simkube::Cluster::builder().start().await.expect("start");
    let api: Api<Service> = Api::default_namespaced(cluster.client());
    api.create(&PostParams::default(), &service("db", Some("10.96.0.77")))
        .await
        .expect("create");
    let external = merge(
        &api,
        "db",
        json!({"spec": {"type": "ExternalName", "externalName": "db.example.com"}}),
    )
    .await
    .expect("to ExternalName");
    assert_eq!(external.spec.expect("spec").cluster_ip, None);
    // The address is free again.
    api.create(
        &PostParams::default(),
        &service("reuse", Some("10.96.0.77")),
    )
    .await
    .expect("10.96.0.77 released");
    let back = merge(
        &api,
        "db",
        json!({"spec": {"type": "ClusterIP", "externalName": null}}),
    )
    .await
    .expect("back to ClusterIP");
    let ip = back
        .spec
        .expect("spec")
        .cluster_ip
        .expect("a ClusterIP again");
    assert_ne!(ip, "10.96.0.77");
    assert!(ip.starts_with("10."), "{ip}");
}
