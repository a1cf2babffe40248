//! The kubeconfig of an in-band peering reaches the provider's API server at an address its
//! certificate need not carry: the client verifies the certificate against the kubeconfig's
//! `tls-server-name`, which this test shows against a real TLS server.

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::ListParams;
use tether_controllers::kubeconfig::rewrite_server;

async fn list_with(kubeconfig: &str) -> Result<(), String> {
    let parsed = kube::config::Kubeconfig::from_yaml(kubeconfig).map_err(|e| e.to_string())?;
    // What the controller does with the kubeconfig it stores for a provider.
    let config =
        kube::Config::from_custom_kubeconfig(parsed, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| e.to_string())?;
    let client = kube::Client::try_from(config).map_err(|e| e.to_string())?;
    Api::<Namespace>::all(client)
        .list(&ListParams::default().limit(1))
        .await
        .map(|_| ())
        .map_err(|e| format!("{e:?}"))
}

#[tokio::test]
async fn the_certificate_is_verified_against_the_tls_server_name() {
    let cluster = simkube::Cluster::builder()
        .name("in-band-tls")
        .tls(true)
        .start()
        .await
        .expect("cluster");
    let server = cluster.url();
    let original = cluster.kubeconfig();
    list_with(&original)
        .await
        .expect("the plain kubeconfig works");

    // Same address, the name every API server certificate carries: accepted.
    let in_band = rewrite_server(&original, &server, "kubernetes.default.svc").expect("rewrite");
    list_with(&in_band)
        .await
        .expect("kubernetes.default.svc is in the certificate");

    // Same address again (which the certificate does carry), but a name it does not: refused,
    // so the name, not the address, is what the client verifies.
    let wrong = rewrite_server(&original, &server, "elsewhere.example").expect("rewrite");
    let err = list_with(&wrong)
        .await
        .expect_err("a name outside the certificate is refused");
    assert!(
        err.contains("NotValidForName") || err.to_lowercase().contains("certificate"),
        "the refusal is the certificate check: {err}"
    );
    cluster.shutdown().await;
}
