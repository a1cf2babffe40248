//! Discovery, OpenAPI, Table output and CRDs through the real kube-rs client over HTTP: built-in
//! types are discoverable, a CRD becomes established and served, and custom resources are
//! pruned, defaulted and validated against the CRD's structural schema.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::core::Status;
use kube::discovery::{Discovery, Scope};
use kube::runtime::wait::{await_condition, conditions};
use serde_json::{Value, json};
use simkube::Cluster;

async fn cluster() -> Cluster {
    Cluster::builder()
        .name("discovery")
        .start()
        .await
        .expect("cluster starts")
}

fn widget_crd(versions: Value) -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "kind": "Widget", "shortNames": ["wd"]},
            "versions": versions,
        },
    }))
    .expect("CRD")
}

fn widget_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "required": ["color"],
                "properties": {
                    "color": {"type": "string", "enum": ["red", "green"]},
                    "replicas": {"type": "integer", "minimum": 1, "default": 1},
                },
            },
            "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}},
        },
    })
}

fn v1_version() -> Value {
    json!({
        "name": "v1", "served": true, "storage": true,
        "schema": {"openAPIV3Schema": widget_schema()},
        "subresources": {"status": {}},
        "additionalPrinterColumns": [
            {"name": "Color", "type": "string", "jsonPath": ".spec.color"},
            {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
        ],
        "selectableFields": [{"jsonPath": ".spec.color"}],
    })
}

/// Creates the CRD and waits, as kube-rs users do, until it is established.
async fn install_widgets(c: &Cluster, versions: Value) {
    let crds: Api<CustomResourceDefinition> = Api::all(c.client());
    crds.create(&PostParams::default(), &widget_crd(versions))
        .await
        .expect("create CRD");
    let established = await_condition(
        crds,
        "widgets.example.com",
        conditions::is_crd_established(),
    );
    tokio::time::timeout(Duration::from_secs(10), established)
        .await
        .expect("CRD established in time")
        .expect("watch works");
}

fn widgets(c: &Cluster) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("example.com", "v1", "Widget");
    Api::namespaced_with(c.client(), "default", &ApiResource::from_gvk(&gvk))
}

fn widget(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": name}, "spec": spec,
    }))
    .expect("widget")
}

fn api_error(err: kube::Error) -> Status {
    match err {
        kube::Error::Api(status) => *status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

async fn raw(c: &Cluster, path: &str, accept: &str) -> (http::HeaderMap, Value) {
    let req = http::Request::get(path)
        .header(http::header::ACCEPT, accept)
        .body(Vec::new())
        .expect("request");
    let resp = c
        .client()
        .send(req.map(kube::client::Body::from))
        .await
        .expect("response");
    let headers = resp.headers().clone();
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .expect("body")
        .to_bytes();
    (headers, serde_json::from_slice(&body).expect("JSON body"))
}

#[tokio::test(flavor = "multi_thread")]
async fn legacy_and_aggregated_discovery_find_the_builtins() {
    let c = cluster().await;
    for aggregated in [false, true] {
        let discovery = Discovery::new(c.client());
        let discovery = if aggregated {
            discovery.run_aggregated().await
        } else {
            discovery.run().await
        }
        .expect("discovery runs");
        let core = discovery.get("").expect("core group");
        let (pods, caps) = core
            .recommended_resources()
            .into_iter()
            .find(|(r, _)| r.plural == "pods")
            .expect("pods discovered");
        assert_eq!(
            (pods.kind.as_str(), caps.scope.clone()),
            ("Pod", Scope::Namespaced)
        );
        assert!(
            caps.subresources.iter().any(|(r, _)| r.plural == "status"),
            "pods/status"
        );
        let (nodes, caps) = core.recommended_kind("Node").expect("nodes");
        assert_eq!(
            (nodes.plural.as_str(), caps.scope),
            ("nodes", Scope::Cluster)
        );
        for group in [
            "apps",
            "coordination.k8s.io",
            "discovery.k8s.io",
            "events.k8s.io",
            "rbac.authorization.k8s.io",
            "certificates.k8s.io",
            "apiextensions.k8s.io",
            "authorization.k8s.io",
        ] {
            assert!(
                discovery.get(group).is_some(),
                "{group} discovered (aggregated={aggregated})"
            );
        }
        let (deploy, caps) = discovery
            .get("apps")
            .and_then(|g| g.recommended_kind("Deployment"))
            .expect("deployments");
        assert_eq!(deploy.plural, "deployments");
        assert!(
            caps.subresources.iter().any(|(r, _)| r.plural == "scale"),
            "deployments/scale"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn aggregated_discovery_is_answered_with_its_content_type() {
    let c = cluster().await;
    let kubectl_accept = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
    let (headers, body) = raw(&c, "/apis", kubectl_accept).await;
    assert_eq!(
        headers[http::header::CONTENT_TYPE],
        simkube::discovery::AGGREGATED_CONTENT_TYPE
    );
    assert_eq!(body["kind"], "APIGroupDiscoveryList");
    let (headers, body) = raw(&c, "/api", kubectl_accept).await;
    assert_eq!(
        headers[http::header::CONTENT_TYPE],
        simkube::discovery::AGGREGATED_CONTENT_TYPE
    );
    assert_eq!(body["items"][0]["versions"][0]["version"], "v1");
    // Plain JSON clients still get the legacy documents.
    let (_, body) = raw(&c, "/apis", "application/json").await;
    assert_eq!(body["kind"], "APIGroupList");
    let (_, body) = raw(&c, "/api", "application/json").await;
    assert_eq!(body["kind"], "APIVersions");
    let version = c.client().apiserver_version().await.expect("version");
    assert_eq!(
        (version.major.as_str(), version.minor.as_str()),
        ("1", "33")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crd_becomes_established_discoverable_and_served() {
    let c = cluster().await;
    install_widgets(
        &c,
        json!([
            {"name": "v1alpha1", "served": true, "storage": false,
             "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}},
            v1_version(),
        ]),
    )
    .await;
    let crd = Api::<CustomResourceDefinition>::all(c.client())
        .get("widgets.example.com")
        .await
        .expect("CRD");
    let status = crd.status.expect("status");
    assert_eq!(status.stored_versions, Some(vec!["v1".to_owned()]));
    let accepted = status.accepted_names.expect("acceptedNames");
    assert_eq!(accepted.kind, "Widget");
    assert_eq!(accepted.list_kind.as_deref(), Some("WidgetList"));

    for aggregated in [false, true] {
        let discovery = Discovery::new(c.client());
        let discovery = if aggregated {
            discovery.run_aggregated().await
        } else {
            discovery.run().await
        }
        .expect("discovery runs");
        let group = discovery.get("example.com").expect("CRD group discovered");
        assert_eq!(
            group.preferred_version_or_latest(),
            "v1",
            "GA preferred over alpha"
        );
        let versions: Vec<&str> = group.versions().collect();
        assert_eq!(versions, ["v1", "v1alpha1"]);
        let (ar, caps) = group.recommended_kind("Widget").expect("Widget");
        assert_eq!((ar.plural.as_str(), ar.version.as_str()), ("widgets", "v1"));
        assert_eq!(caps.scope, Scope::Namespaced);
    }

    let api = widgets(&c);
    let created = api
        .create(
            &PostParams::default(),
            &widget("w1", json!({"color": "red"})),
        )
        .await
        .expect("create CR");
    assert_eq!(
        created.data["spec"]["replicas"], 1,
        "schema default applied"
    );
    let listed = api.list(&ListParams::default()).await.expect("list CRs");
    assert_eq!(listed.items.len(), 1);

    // The OpenAPI v3 root now lists the group-version, with a document kubectl can use.
    let (_, root) = raw(&c, "/openapi/v3", "application/json").await;
    let url = root["paths"]["apis/example.com/v1"]["serverRelativeURL"]
        .as_str()
        .expect("CRD listed")
        .to_owned();
    let (_, doc) = raw(&c, &url, "application/json").await;
    assert_eq!(
        doc["components"]["schemas"]["com.example.v1.Widget"]["properties"]["spec"]["properties"]["color"]
            ["enum"],
        json!(["red", "green"])
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn custom_resources_are_pruned_defaulted_and_validated() {
    let c = cluster().await;
    install_widgets(&c, json!([v1_version()])).await;
    let api = widgets(&c);

    let mut w = widget("pruned", json!({"color": "green", "unknown": {"deep": 1}}));
    w.data["extraTopLevel"] = json!("x");
    let created = api
        .create(&PostParams::default(), &w)
        .await
        .expect("create");
    assert_eq!(
        created.data["spec"],
        json!({"color": "green", "replicas": 1})
    );
    assert!(
        created.data.get("extraTopLevel").is_none(),
        "unknown top-level field pruned"
    );
    let fetched = api.get("pruned").await.expect("get");
    assert_eq!(
        fetched.data["spec"],
        json!({"color": "green", "replicas": 1}),
        "stored pruned"
    );

    let err = api_error(
        api.create(
            &PostParams::default(),
            &widget("bad", json!({"color": "red", "replicas": "string"})),
        )
        .await
        .expect_err("invalid type"),
    );
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        err.message,
        "Widget.example.com \"bad\" is invalid: spec.replicas: Invalid value: \"string\": spec.replicas in body must be of type integer: \"string\""
    );
    let causes = err.details.expect("details").causes;
    assert_eq!(causes[0].field, "spec.replicas");
    assert_eq!(causes[0].reason, "FieldValueInvalid");

    let err = api_error(
        api.create(
            &PostParams::default(),
            &widget("bad", json!({"replicas": 0})),
        )
        .await
        .expect_err("invalid"),
    );
    assert_eq!(
        err.message,
        "Widget.example.com \"bad\" is invalid: [spec.color: Required value, spec.replicas: Invalid value: 0: spec.replicas in body should be greater than or equal to 1]"
    );
    assert!(
        api.get_opt("bad").await.expect("get").is_none(),
        "nothing half-created"
    );

    // Updates are validated too.
    let mut current = api.get("pruned").await.expect("get");
    current.data["spec"]["color"] = json!("purple");
    let err = api_error(
        api.replace("pruned", &PostParams::default(), &current)
            .await
            .expect_err("invalid enum"),
    );
    assert_eq!(err.code, 422);
    assert!(
        err.message.contains(
            "spec.color: Unsupported value: \"purple\": supported values: \"red\", \"green\""
        ),
        "{}",
        err.message
    );

    // selectableFields make spec.color usable in field selectors.
    api.create(
        &PostParams::default(),
        &widget("red", json!({"color": "red"})),
    )
    .await
    .expect("create");
    let reds = api
        .list(&ListParams::default().fields("spec.color=red"))
        .await
        .expect("field selector");
    let names: Vec<_> = reds
        .items
        .iter()
        .filter_map(|w| w.metadata.name.clone())
        .collect();
    assert_eq!(names, ["red"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_crds_are_rejected_with_causes() {
    let c = cluster().await;
    let crds: Api<CustomResourceDefinition> = Api::all(c.client());
    let mut bad = widget_crd(json!([v1_version()]));
    bad.metadata.name = Some("widget.example.com".into());
    let err = api_error(
        crds.create(&PostParams::default(), &bad)
            .await
            .expect_err("bad name"),
    );
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));
    assert!(
        err.message.contains("metadata.name: Invalid value: \"widget.example.com\": must be spec.names.plural+\".\"+spec.group"),
        "{}",
        err.message
    );
    let two_storage = widget_crd(
        json!([v1_version(), {"name": "v2", "served": true, "storage": true,
        "schema": {"openAPIV3Schema": {"type": "object"}}}]),
    );
    let err = api_error(
        crds.create(&PostParams::default(), &two_storage)
            .await
            .expect_err("two storage versions"),
    );
    assert!(
        err.message
            .contains("must have exactly one version marked as storage version"),
        "{}",
        err.message
    );
    let unstructural = widget_crd(json!([{"name": "v1", "served": true, "storage": true,
        "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"properties": {}}}}}}]));
    let err = api_error(
        crds.create(&PostParams::default(), &unstructural)
            .await
            .expect_err("not structural"),
    );
    assert!(
        err.message.contains(
            "spec.versions[0].schema.openAPIV3Schema.properties[spec].type: Required value"
        ),
        "{}",
        err.message
    );
    assert!(
        Discovery::new(c.client())
            .run()
            .await
            .expect("discovery")
            .get("example.com")
            .is_none()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn tables_carry_the_real_columns_for_lists_and_single_objects() {
    let c = cluster().await;
    let pods: Api<Pod> = Api::default_namespaced(c.client());
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"containers": [{"name": "a", "image": "nginx"}]},
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    let accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
    let (_, table) = raw(&c, "/api/v1/namespaces/default/pods?limit=500", accept).await;
    assert_eq!(table["kind"], "Table");
    let names: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .expect("columns")
        .iter()
        .filter(|d| d["priority"] == 0)
        .filter_map(|d| d["name"].as_str())
        .collect();
    assert_eq!(names, ["Name", "Ready", "Status", "Restarts", "Age"]);
    assert_eq!(table["rows"][0]["cells"][0], "web");
    assert_eq!(table["rows"][0]["cells"][1], "0/1");
    assert_eq!(table["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    assert!(
        table["metadata"]["resourceVersion"]
            .as_str()
            .is_some_and(|rv| !rv.is_empty())
    );

    let (_, one) = raw(&c, "/api/v1/namespaces/default/pods/web", accept).await;
    assert_eq!(one["kind"], "Table");
    assert_eq!(one["rows"].as_array().map(Vec::len), Some(1));

    install_widgets(&c, json!([v1_version()])).await;
    widgets(&c)
        .create(
            &PostParams::default(),
            &widget("w1", json!({"color": "red", "replicas": 3})),
        )
        .await
        .expect("create");
    let (_, table) = raw(
        &c,
        "/apis/example.com/v1/namespaces/default/widgets",
        accept,
    )
    .await;
    let names: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .expect("columns")
        .iter()
        .filter_map(|d| d["name"].as_str())
        .collect();
    assert_eq!(names, ["Name", "Color", "Replicas"]);
    assert_eq!(table["rows"][0]["cells"], json!(["w1", "red", 3]));
}

/// A CRD the way Tether defines its own: generated by kube-derive from Rust types.
mod derived {
    use std::collections::BTreeMap;

    use kube::CustomResource;
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(CustomResource, Serialize, Deserialize, Clone, Debug, JsonSchema, PartialEq)]
    #[kube(
        group = "core.example.dev",
        version = "v1alpha1",
        kind = "Peer",
        namespaced,
        status = "PeerStatus",
        shortname = "pr",
        category = "example",
        selectable = ".spec.clusterId",
        printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.clusterId"}"#,
        printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#
    )]
    #[serde(rename_all = "camelCase")]
    pub(crate) struct PeerSpec {
        /// The peer's cluster ID.
        pub cluster_id: String,
        /// Optional endpoint.
        pub endpoint: Option<String>,
        /// Networks to exchange.
        #[serde(default)]
        pub cidrs: Vec<Cidr>,
        /// Free-form labels.
        #[serde(default)]
        pub labels: BTreeMap<String, String>,
        /// Which modules are on.
        pub mode: Mode,
        /// How to reach the peer.
        pub transport: Option<Transport>,
        /// Replica count.
        pub replicas: Option<i32>,
    }

    #[derive(Serialize, Deserialize, Clone, Debug, JsonSchema, PartialEq)]
    #[serde(rename_all = "camelCase")]
    pub(crate) struct Cidr {
        pub name: String,
        pub prefix: String,
    }

    #[derive(Serialize, Deserialize, Clone, Debug, JsonSchema, PartialEq)]
    pub(crate) enum Mode {
        Full,
        NetworkOnly,
    }

    #[derive(Serialize, Deserialize, Clone, Debug, JsonSchema, PartialEq)]
    #[serde(rename_all = "camelCase")]
    pub(crate) enum Transport {
        Direct { address: String },
        Tunnel { gateway: String, port: u16 },
    }

    #[derive(Serialize, Deserialize, Clone, Debug, JsonSchema, PartialEq, Default)]
    pub(crate) struct PeerStatus {
        pub phase: Option<String>,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn kube_derive_crds_are_accepted_and_round_trip() {
    use derived::{Cidr, Mode, Peer, PeerSpec, Transport};
    use kube::CustomResourceExt;

    let c = cluster().await;
    let crds: Api<CustomResourceDefinition> = Api::all(c.client());
    crds.create(&PostParams::default(), &Peer::crd())
        .await
        .expect("derived CRD accepted");
    let established = await_condition(
        crds,
        "peers.core.example.dev",
        conditions::is_crd_established(),
    );
    tokio::time::timeout(Duration::from_secs(10), established)
        .await
        .expect("established in time")
        .expect("watch works");

    let peers: Api<Peer> = Api::default_namespaced(c.client());
    let mut peer = Peer::new(
        "remote",
        PeerSpec {
            cluster_id: "cluster-b".into(),
            endpoint: None,
            cidrs: vec![Cidr {
                name: "pods".into(),
                prefix: "10.0.0.0/16".into(),
            }],
            labels: [("zone".to_owned(), "a".to_owned())].into(),
            mode: Mode::NetworkOnly,
            transport: Some(Transport::Tunnel {
                gateway: "gw".into(),
                port: 51820,
            }),
            replicas: Some(2),
        },
    );
    let created = peers
        .create(&PostParams::default(), &peer)
        .await
        .expect("create typed CR");
    assert_eq!(
        created.spec, peer.spec,
        "nothing pruned from a well-typed object"
    );
    peer.spec.transport = Some(Transport::Direct {
        address: "198.18.0.1".into(),
    });
    let mut replaced = created.clone();
    replaced.spec = peer.spec.clone();
    let replaced = peers
        .replace("remote", &PostParams::default(), &replaced)
        .await
        .expect("replace");
    assert_eq!(replaced.spec.transport, peer.spec.transport);

    let by_field = peers
        .list(&ListParams::default().fields("spec.clusterId=cluster-b"))
        .await
        .expect("selectable field");
    assert_eq!(by_field.items.len(), 1);

    // An enum value outside the schema is rejected by the server, not by the client.
    let raw: Api<DynamicObject> = Api::namespaced_with(
        c.client(),
        "default",
        &ApiResource::from_gvk(&GroupVersionKind::gvk(
            "core.example.dev",
            "v1alpha1",
            "Peer",
        )),
    );
    let bad: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "core.example.dev/v1alpha1", "kind": "Peer", "metadata": {"name": "bad"},
        "spec": {"clusterId": "x", "mode": "Sometimes"},
    }))
    .expect("object");
    let err = api_error(
        raw.create(&PostParams::default(), &bad)
            .await
            .expect_err("bad enum"),
    );
    assert_eq!(err.code, 422);
    assert!(
        err.message
            .contains("spec.mode: Unsupported value: \"Sometimes\""),
        "{}",
        err.message
    );
}
