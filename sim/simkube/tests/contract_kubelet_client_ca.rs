//! What a kubelet-like endpoint in the cluster relies on to authenticate the API server, as
//! on a kubeadm cluster: the client CA in ConfigMap `kube-system/extension-apiserver-
//! authentication` (key `client-ca-file`), a kubelet client certificate that chains to it, and
//! a SubjectAccessReview that allows that certificate's user `nodes/proxy`.

use std::sync::{Arc, Mutex};

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Api, LogParams, Patch, PatchParams, PostParams};
use serde_json::json;
use simkube::kubelet_proxy::{KUBELET_CLIENT_GROUP, KUBELET_CLIENT_USER};
use tokio::net::TcpListener;

fn object<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).expect("object")
}

/// A kubelet that requires a client certificate of `client_ca_pem` and answers `/containerLogs`
/// with the certificate's subject; returns its port and the subjects it saw.
async fn strict_kubelet(client_ca_pem: &str) -> (u16, Arc<Mutex<Vec<String>>>) {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut client_ca_pem.as_bytes()) {
        roots.add(cert.expect("PEM")).expect("CA");
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .expect("verifier");
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .expect("params")
        .self_signed(&key)
        .expect("serving certificate");
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .expect("tls config");
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let Ok(tls) = acceptor.accept(tcp).await else {
                continue;
            };
            let subject = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| {
                    x509_parser::parse_x509_certificate(c)
                        .ok()
                        .map(|(_, x)| x.subject().to_string())
                })
                .unwrap_or_default();
            record.lock().expect("lock").push(subject.clone());
            let app = Router::new().fallback(move || async move { subject });
            tokio::spawn(async move {
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), TowerToHyperService::new(app))
                    .await;
            });
        }
    });
    (port, seen)
}

#[tokio::test]
async fn a_kubelet_trusting_the_published_client_ca_accepts_and_authorises_the_api_server() {
    let cluster = simkube::Cluster::builder()
        .name("client-ca")
        .tls(true)
        .rbac(true)
        .start()
        .await
        .expect("cluster");
    let admin = cluster.client();
    let published = Api::<ConfigMap>::namespaced(admin.clone(), "kube-system")
        .get(simkube::cluster::CLIENT_CA_CONFIGMAP)
        .await
        .expect("the client CA ConfigMap");
    let client_ca = published
        .data
        .as_ref()
        .and_then(|d| d.get(simkube::cluster::CLIENT_CA_KEY))
        .expect("client-ca-file")
        .clone();
    assert_eq!(Some(&client_ca), cluster.ca_pem().as_ref());

    let (port, seen) = strict_kubelet(&client_ca).await;
    let nodes: Api<Node> = Api::all(admin.clone());
    nodes
        .create(
            &PostParams::default(),
            &object(json!({"metadata": {"name": "n1"}})),
        )
        .await
        .expect("node");
    let status = json!({"status": {
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
    }});
    nodes
        .patch_status("n1", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("node status");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    pods.create(
        &PostParams::default(),
        &object(json!({"metadata": {"name": "web"}, "spec": {
            "nodeName": "n1", "containers": [{"name": "app", "image": "busybox"}]}})),
    )
    .await
    .expect("pod");
    let answer = pods
        .logs("web", &LogParams::default())
        .await
        .expect("the kubelet accepts the API server's certificate");
    assert!(
        answer.contains(&format!("CN={KUBELET_CLIENT_USER}"))
            && answer.contains(&format!("O={KUBELET_CLIENT_GROUP}")),
        "{answer}"
    );
    assert_eq!(seen.lock().expect("lock").len(), 1);

    // What such a kubelet asks next: may that user use the node's kubelet API?
    let review = |user: &str, groups: &[&str]| {
        object::<SubjectAccessReview>(json!({"spec": {
            "user": user, "groups": groups,
            "resourceAttributes": {"verb": "create", "resource": "nodes",
                                   "subresource": "proxy", "name": "n1"}}}))
    };
    let sars: Api<SubjectAccessReview> = Api::all(admin.clone());
    let allowed = |sar: SubjectAccessReview| sar.status.is_some_and(|s| s.allowed);
    let apiserver = sars
        .create(
            &PostParams::default(),
            &review(
                KUBELET_CLIENT_USER,
                &[KUBELET_CLIENT_GROUP, "system:authenticated"],
            ),
        )
        .await
        .expect("review");
    assert!(allowed(apiserver));
    let stranger = sars
        .create(
            &PostParams::default(),
            &review("alice", &["system:authenticated"]),
        )
        .await
        .expect("review");
    assert!(!allowed(stranger));
    cluster.shutdown().await;
}
