//! Who the virtual kubelet API serves, in process against a simkube API server with TLS and
//! RBAC: no client certificate, or one from another CA, gets the kubelet's 401; a certificate
//! of the cluster's client CA whose user RBAC does not allow `nodes/proxy` gets 403 until it
//! does and the remembered refusal expires; and the API server itself, forwarding `kubectl
//! logs` with its kubelet client certificate, gets through to the pod lookup.

mod support;

use std::sync::Arc;

use base64::Engine as _;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, LogParams, Patch, PatchParams, PostParams};
use prometheus_client::registry::Registry;
use serde_json::json;
use simkube::Cluster;
use tether_api::ClusterId;
use tether_controllers::context::Ctx;
use tether_controllers::identity::{Identity, Keys};
use tether_controllers::metrics::Metrics;
use tether_controllers::offloading::kubelet;
use tether_controllers::providers::ProviderClients;
use tokio_util::sync::CancellationToken;

/// A client of the kubelet API at `port`, presenting `identity` (certificate and key PEM).
fn kubelet_client(port: u16, identity: Option<(&str, &str)>) -> kube::Client {
    let mut config = kube::Config::new(
        format!("https://127.0.0.1:{port}")
            .parse()
            .expect("kubelet URL"),
    );
    // The serving certificate is self-signed, as kube-apiserver accepts without
    // --kubelet-certificate-authority.
    config.accept_invalid_certs = true;
    if let Some((cert, key)) = identity {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        config.auth_info.client_certificate_data = Some(b64(cert));
        config.auth_info.client_key_data = Some(b64(key).into());
    }
    kube::Client::try_from(config).expect("client")
}

/// The code and text of the kubelet's answer to `GET path`.
async fn get(client: &kube::Client, path: &str) -> (u16, String) {
    let request = http::Request::get(path).body(Vec::new()).expect("request");
    match client.request_text(request).await {
        Ok(body) => (200, body),
        Err(kube::Error::Api(status)) => (status.code, status.message),
        Err(e) => panic!("GET {path}: {e}"),
    }
}

fn object<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).expect("object")
}

#[tokio::test]
async fn only_certificates_of_the_client_ca_that_rbac_allows_reach_the_kubelet_api() {
    let cluster = Cluster::builder()
        .name("kubelet-callers")
        .tls(true)
        .rbac(true)
        .start()
        .await
        .expect("cluster");
    let admin = cluster.client();
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    for crd in tether_api::crds::all() {
        crds.create(&PostParams::default(), &crd)
            .await
            .expect("CRD");
    }
    let identity = Identity {
        cluster_id: ClusterId::new("c1").expect("id"),
        keys: Keys::generate().expect("keys"),
    };
    let ctx = Arc::new(Ctx::new(
        admin.clone(),
        Arc::new(identity),
        support::settings("tether-system", cluster.url()),
        String::new(),
        Metrics::register(&mut Registry::default()),
    ));
    let stop = CancellationToken::new();
    let (addr, serving) = kubelet::serve(
        ctx,
        Arc::new(ProviderClients::default()),
        "127.0.0.1:0".parse().expect("addr"),
        // Refusals remembered two seconds rather than the kubelet's 30, so the grant below
        // is seen soon.
        kubelet::callers::Decisions::with_ttls(
            kubelet::callers::ALLOWED_TTL,
            std::time::Duration::from_secs(2),
        ),
        stop.clone(),
    )
    .await
    .expect("kubelet API");
    let serving = tokio::spawn(serving);

    // Node `vn` is served by this kubelet API; pod `web` is bound to it, but `vn` is no
    // VirtualNode, so a caller let through learns that and no more.
    let nodes: Api<Node> = Api::all(admin.clone());
    nodes
        .create(
            &PostParams::default(),
            &object(json!({"metadata": {"name": "vn"}})),
        )
        .await
        .expect("node");
    let status = json!({"status": {
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": addr.port()}},
    }});
    nodes
        .patch_status("vn", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("node status");
    Api::<Pod>::namespaced(admin.clone(), "default")
        .create(
            &PostParams::default(),
            &object(json!({"metadata": {"name": "web"}, "spec": {
                "nodeName": "vn", "containers": [{"name": "app", "image": "busybox"}]}})),
        )
        .await
        .expect("pod");
    let path = "/containerLogs/default/web/app";
    let not_bound = "pod default/web is not bound to a virtual node of this cluster";

    // No client certificate: the kubelet's 401, which says nothing about the pod.
    let (code, text) = get(&kubelet_client(addr.port(), None), path).await;
    assert_eq!((code, text.as_str()), (401, "Unauthorized"));
    let (code, _) = get(&kubelet_client(addr.port(), None), "/containerLogs/x/y/z").await;
    assert_eq!(code, 401);

    // A certificate for the same user from another CA: 401 too.
    let other_ca = simkube::tls::CertAuthority::generate("elsewhere").expect("CA");
    let (cert, key) = other_ca
        .issue_client_cert(
            simkube::kubelet_proxy::KUBELET_CLIENT_USER,
            &["system:masters".to_owned()],
            std::time::Duration::from_secs(600),
        )
        .expect("foreign certificate");
    let (code, text) = get(&kubelet_client(addr.port(), Some((&cert, &key))), path).await;
    assert_eq!((code, text.as_str()), (401, "Unauthorized"));

    // The cluster's CA, but a user RBAC does not let at nodes/proxy: the kubelet's 403.
    let ca = cluster.ca().expect("TLS");
    let (cert, key) = ca
        .issue_client_cert("alice", &[], std::time::Duration::from_secs(600))
        .expect("certificate");
    let alice = kubelet_client(addr.port(), Some((&cert, &key)));
    let (code, text) = get(&alice, path).await;
    assert_eq!(
        (code, text.as_str()),
        (
            403,
            "Forbidden (user=alice, verb=get, resource=nodes, subresource(s)=[proxy])"
        )
    );
    // Allowed `get` on nodes/proxy of `vn`, she gets through to the pod lookup.
    Api::<ClusterRole>::all(admin.clone())
        .create(
            &PostParams::default(),
            &object(json!({"metadata": {"name": "vn-proxy"}, "rules": [{
                "apiGroups": [""], "resources": ["nodes/proxy"], "resourceNames": ["vn"],
                "verbs": ["get"]}]})),
        )
        .await
        .expect("role");
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(
            &PostParams::default(),
            &object(json!({"metadata": {"name": "alice-vn-proxy"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": "vn-proxy"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                              "name": "alice"}]})),
        )
        .await
        .expect("binding");
    // The refusal is remembered for its TTL, as a kubelet remembers it: no review is sent.
    let (code, _) = get(&alice, path).await;
    assert_eq!(code, 403, "the refusal is still remembered");
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    let (code, text) = get(&alice, path).await;
    assert_eq!((code, text.as_str()), (404, not_bound));

    // The API server forwards `kubectl logs` with its kubelet client certificate.
    let err = Api::<Pod>::namespaced(admin.clone(), "default")
        .logs(
            "web",
            &LogParams {
                container: Some("app".to_owned()),
                ..LogParams::default()
            },
        )
        .await
        .expect_err("web is on no virtual node");
    match err {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 404, "{status:?}");
            assert!(status.message.contains(not_bound), "{status:?}");
        }
        other => panic!("logs through the API server: {other}"),
    }

    stop.cancel();
    let _ = serving.await;
    cluster.shutdown().await;
}
