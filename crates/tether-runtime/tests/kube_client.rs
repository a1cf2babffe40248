//! `kube_client` against a real (simulated) API server over HTTPS: the kubeconfig it names is
//! used with its CA and token, `--context` selects a context, and failures name the source.

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::ListParams;
use tether_runtime::{KubeArgs, RuntimeError, kube_client};

#[tokio::test]
async fn a_kubeconfig_and_its_context_reach_the_server() {
    let cluster = simkube::Cluster::builder()
        .name("runtime-kc")
        .tls(true)
        .start()
        .await
        .expect("cluster");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("kubeconfig");
    cluster.write_kubeconfig(&path).expect("kubeconfig");

    for context in [None, Some("runtime-kc")] {
        let args = KubeArgs {
            kubeconfig: Some(path.clone()),
            context: context.map(str::to_owned),
        };
        let client = kube_client(&args).await.expect("client");
        let namespaces = Api::<Namespace>::all(client)
            .list(&ListParams::default())
            .await
            .expect("list over TLS with the kubeconfig's token");
        assert!(
            namespaces
                .items
                .iter()
                .any(|n| n.metadata.name.as_deref() == Some("default")),
            "the server's own namespaces are listed"
        );
    }

    let args = KubeArgs {
        kubeconfig: Some(path.clone()),
        context: Some("elsewhere".to_owned()),
    };
    let err = kube_client(&args).await.err().expect("unknown context");
    assert!(matches!(err, RuntimeError::Kubeconfig { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains(&path.display().to_string()) && text.contains("\"elsewhere\""),
        "{text}"
    );
    cluster.shutdown().await;
}
