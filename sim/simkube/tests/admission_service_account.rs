//! Contract test of the ServiceAccount admission: a pod created through the API comes back with
//! the ServiceAccount defaulted and, when its account exists and allows automounting, the
//! projected `kube-api-access-*` volume and mounts exactly as kube-apiserver writes them.

use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};
use simkube::Cluster;
use simkube::admission::{TOKEN_MOUNT_PATH, VOLUME_PREFIX, api_access_volume};

fn pod(name: &str, extra: Value) -> Pod {
    let mut spec = json!({
        "containers": [{"name": "app", "image": "busybox:1"}],
        "initContainers": [{"name": "init", "image": "busybox:1"}]
    });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).expect("pod")
}

async fn create(pods: &Api<Pod>, pod: Pod) -> Value {
    let created = pods
        .create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    let name = created.metadata.name.clone().expect("name");
    let fetched = pods.get(&name).await.expect("get pod");
    assert_eq!(
        fetched, created,
        "the stored pod is the one create answered"
    );
    serde_json::to_value(fetched).expect("json")
}

#[tokio::test]
async fn pods_get_the_service_account_token_volume_like_upstream() {
    let cluster = Cluster::builder().start().await.expect("cluster");
    let client = cluster.client();
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    for (name, automount) in [("default", None), ("quiet", Some(false))] {
        let mut sa = json!({"metadata": {"name": name}});
        if let Some(a) = automount {
            sa["automountServiceAccountToken"] = json!(a);
        }
        accounts
            .create(
                &PostParams::default(),
                &serde_json::from_value(sa).expect("sa"),
            )
            .await
            .expect("create service account");
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");

    let injected = create(&pods, pod("injected", json!({}))).await;
    let spec = &injected["spec"];
    assert_eq!(spec["serviceAccountName"], "default");
    assert_eq!(spec["serviceAccount"], "default");
    let volumes = spec["volumes"].as_array().expect("volumes");
    assert_eq!(volumes.len(), 1, "{volumes:?}");
    let name = volumes[0]["name"].as_str().expect("volume name");
    let suffix = name.strip_prefix(VOLUME_PREFIX).expect("kube-api-access-*");
    assert_eq!(suffix.len(), 5);
    assert!(
        suffix
            .bytes()
            .all(|b| b"bcdfghjklmnpqrstvwxz2456789".contains(&b)),
        "{suffix}"
    );
    assert_eq!(
        volumes[0],
        api_access_volume(name),
        "the volume is upstream's"
    );
    for list in ["containers", "initContainers"] {
        assert_eq!(
            spec[list][0]["volumeMounts"],
            json!([{"name": name, "readOnly": true, "mountPath": TOKEN_MOUNT_PATH}]),
            "{list}"
        );
    }

    // The pod's own setting, the account's, and an own mount at the path all keep it out.
    let opted_out = create(
        &pods,
        pod("opted-out", json!({"automountServiceAccountToken": false})),
    )
    .await;
    assert!(opted_out["spec"].get("volumes").is_none(), "{opted_out}");
    let quiet = create(&pods, pod("quiet", json!({"serviceAccountName": "quiet"}))).await;
    assert!(quiet["spec"].get("volumes").is_none(), "{quiet}");
    assert_eq!(quiet["spec"]["serviceAccount"], "quiet");
    let own = create(
        &pods,
        pod(
            "own",
            json!({
                "containers": [{"name": "app", "image": "busybox:1",
                    "volumeMounts": [{"name": "mine", "mountPath": TOKEN_MOUNT_PATH}]}],
                "initContainers": [],
                "volumes": [{"name": "mine", "emptyDir": {}}]
            }),
        ),
    )
    .await;
    assert_eq!(own["spec"]["volumes"].as_array().map(Vec::len), Some(1));

    // Without the ServiceAccount the pod is admitted (upstream would refuse it) but gets no
    // token it could never fetch.
    let orphan = create(&pods, pod("orphan", json!({"serviceAccountName": "ghost"}))).await;
    assert_eq!(orphan["spec"]["serviceAccountName"], "ghost");
    assert!(orphan["spec"].get("volumes").is_none(), "{orphan}");
    cluster.shutdown().await;
}
