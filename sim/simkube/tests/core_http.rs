//! Contract tests for the HTTP layer: raw requests for error Statuses (400, 401, 404, 413, 415),
//! discovery and content negotiation, plus the cluster controls (in-process service, TLS, RBAC,
//! fault injection, restarts, the request log).

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use simkube::{ApiError, Cluster};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A raw HTTP/1.1 exchange on a fresh connection: (status code, headers, body).
async fn raw(
    c: &Cluster,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    auth: bool,
) -> (u16, String, Vec<u8>) {
    let mut stream = tokio::net::TcpStream::connect(c.addr())
        .await
        .expect("connect");
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if auth {
        req.push_str(&format!("Authorization: Bearer {}\r\n", c.admin_token()));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes()).await.expect("write");
    stream.write_all(body).await.expect("write body");
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out)).await;
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("header end");
    let head = String::from_utf8_lossy(&out[..split]).into_owned();
    let code: u16 = head
        .split(' ')
        .nth(1)
        .expect("status")
        .parse()
        .expect("code");
    let mut body = out[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    (code, head, body)
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = data.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size =
            usize::from_str_radix(std::str::from_utf8(&data[..eol]).expect("hex").trim(), 16)
                .expect("size");
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&data[eol + 2..eol + 2 + size]);
        data = &data[eol + 2 + size + 2..];
    }
}

fn status(body: &[u8]) -> Value {
    let v: Value = serde_json::from_slice(body).expect("json body");
    assert_eq!(v["kind"], "Status", "{v}");
    v
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_bodies_and_unknown_paths_answer_statuses() {
    let c = Cluster::builder()
        .body_limit(64 * 1024)
        .start()
        .await
        .expect("start");
    let cms = "/api/v1/namespaces/default/configmaps";
    let json_ct = [("Content-Type", "application/json")];

    let (code, _, body) = raw(&c, "POST", cms, &json_ct, b"{not json", true).await;
    let s = status(&body);
    assert_eq!((code, s["reason"].as_str()), (400, Some("BadRequest")));

    let big = format!(
        "{{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"metadata\":{{\"name\":\"big\"}},\"data\":{{\"k\":\"{}\"}}}}",
        "x".repeat(100 * 1024)
    );
    let (code, _, body) = raw(&c, "POST", cms, &json_ct, big.as_bytes(), true).await;
    assert_eq!(code, 413);
    assert_eq!(status(&body)["reason"], "RequestEntityTooLarge");

    // A protobuf body that is not a Kubernetes object is a 400 naming the type it should be.
    let pb = [("Content-Type", "application/vnd.kubernetes.protobuf")];
    let (code, _, body) = raw(&c, "POST", cms, &pb, b"k8s\0\n\x0f", true).await;
    let s = status(&body);
    assert_eq!((code, s["reason"].as_str()), (400, Some("BadRequest")));
    assert!(
        s["message"]
            .as_str()
            .expect("msg")
            .starts_with("the object provided is unrecognized (must be of type ConfigMap): malformed protobuf envelope"),
        "{s}"
    );

    let (code, _, body) = raw(
        &c,
        "GET",
        "/api/v1/namespaces/default/widgets",
        &[],
        b"",
        true,
    )
    .await;
    let s = status(&body);
    assert_eq!(
        (code, s["message"].as_str()),
        (
            404,
            Some("the server could not find the requested resource")
        )
    );
    let (code, _, _) = raw(
        &c,
        "GET",
        "/apis/nope.example.com/v1/things",
        &[],
        b"",
        true,
    )
    .await;
    assert_eq!(code, 404);

    // Kind and name in the body must match the URL.
    let wrong =
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "a"}}).to_string();
    let (code, _, _) = raw(&c, "POST", cms, &json_ct, wrong.as_bytes(), true).await;
    assert_eq!(code, 400);
    let renamed =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "b"}}).to_string();
    let (code, _, body) = raw(
        &c,
        "PUT",
        &format!("{cms}/a"),
        &json_ct,
        renamed.as_bytes(),
        true,
    )
    .await;
    assert_eq!(code, 400);
    assert_eq!(
        status(&body)["message"],
        "the name of the object (b) does not match the name on the URL (a)"
    );

    // YAML bodies are accepted.
    let yaml = [("Content-Type", "application/yaml")];
    let (code, _, body) = raw(
        &c,
        "POST",
        cms,
        &yaml,
        b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: from-yaml\n",
        true,
    )
    .await;
    assert_eq!(code, 201, "{}", String::from_utf8_lossy(&body));

    // Setting resourceVersion on create is refused as the real server does (500).
    let with_rv = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "rv", "resourceVersion": "5"}}).to_string();
    let (code, _, body) = raw(&c, "POST", cms, &json_ct, with_rv.as_bytes(), true).await;
    assert_eq!(code, 500);
    assert_eq!(
        status(&body)["message"],
        "resourceVersion should not be set on objects to be created"
    );
    c.shutdown().await;
}

/// kube-apiserver's decoder takes a missing kind and apiVersion of a built-in from the URL (the
/// official Python client sends bodies without them); a body of another kind is still refused
/// with the decoder's message.
#[tokio::test(flavor = "multi_thread")]
async fn bodies_without_kind_or_api_version_take_them_from_the_url() {
    let c = Cluster::builder().start().await.expect("start");
    let json_ct = [("Content-Type", "application/json")];
    let cms = "/api/v1/namespaces/default/configmaps";
    let bare = json!({"metadata": {"name": "bare"}, "data": {"a": "1"}}).to_string();
    let (code, _, body) = raw(&c, "POST", cms, &json_ct, bare.as_bytes(), true).await;
    let created: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(code, 201, "{created}");
    assert_eq!(
        (&created["apiVersion"], &created["kind"]),
        (&json!("v1"), &json!("ConfigMap"))
    );
    let kind_only = json!({"kind": "ConfigMap", "metadata": {"name": "bare"}, "data": {"a": "2"}});
    let (code, _, body) = raw(
        &c,
        "PUT",
        &format!("{cms}/bare"),
        &json_ct,
        kind_only.to_string().as_bytes(),
        true,
    )
    .await;
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    let deployments = "/apis/apps/v1/namespaces/default/deployments";
    let deployment = json!({"metadata": {"name": "web"}, "spec": {
        "selector": {"matchLabels": {"app": "web"}},
        "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}});
    let (code, _, body) = raw(
        &c,
        "POST",
        deployments,
        &json_ct,
        deployment.to_string().as_bytes(),
        true,
    )
    .await;
    let created: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(
        (code, &created["apiVersion"]),
        (201, &json!("apps/v1")),
        "{created}"
    );

    let refused = [
        (
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "a"}}),
            "Secret in version \"v1\" cannot be handled as a ConfigMap: converting (v1.Secret) to (core.ConfigMap): unknown conversion",
        ),
        (
            json!({"kind": "Widget", "metadata": {"name": "a"}}),
            "Widget in version \"v1\" cannot be handled as a ConfigMap: no kind \"Widget\" is registered for version \"v1\" in scheme \"pkg/api/legacyscheme/scheme.go:30\"",
        ),
        (
            json!({"apiVersion": "apps/v1", "kind": "ConfigMap", "metadata": {"name": "a"}}),
            "the API version in the data (apps/v1) does not match the expected API version (v1)",
        ),
    ];
    for (body, message) in refused {
        let (code, _, answer) =
            raw(&c, "POST", cms, &json_ct, body.to_string().as_bytes(), true).await;
        let s = status(&answer);
        assert_eq!(
            (code, s["reason"].as_str(), s["message"].as_str()),
            (400, Some("BadRequest"), Some(message))
        );
    }
    let (code, _, answer) = raw(
        &c,
        "PUT",
        &format!("{cms}/bare"),
        &json_ct,
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "bare"}})
            .to_string()
            .as_bytes(),
        true,
    )
    .await;
    assert_eq!(
        (code, status(&answer)["message"].as_str()),
        (
            400,
            Some(
                "Deployment in version \"v1\" cannot be handled as a ConfigMap: converting (v1.Deployment) to (core.ConfigMap): unknown conversion"
            )
        )
    );

    // kube-rs sends a DynamicObject without a TypeMeta as just metadata and data.
    let resource = kube::discovery::ApiResource::erase::<ConfigMap>(&());
    let dynamic: Api<kube::api::DynamicObject> =
        Api::default_namespaced_with(c.client(), &resource);
    let mut untyped = kube::api::DynamicObject::new("untyped", &resource);
    untyped.types = None;
    untyped.data = json!({"data": {"k": "v"}});
    let created = dynamic
        .create(&PostParams::default(), &untyped)
        .await
        .expect("created without a TypeMeta");
    assert_eq!(created.types.as_ref().expect("types").kind, "ConfigMap");
    let mut replaced = created.clone();
    replaced.types = None;
    replaced.data = json!({"data": {"k": "w"}});
    let replaced = dynamic
        .replace("untyped", &PostParams::default(), &replaced)
        .await
        .expect("replaced without a TypeMeta");
    assert_eq!(replaced.data["data"], json!({"k": "w"}));
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn credentials_are_required_except_for_health_and_version() {
    // Plain HTTP without RBAC serves requests without credentials as the admin (kubectl sends
    // no bearer token over plain HTTP); wrong credentials are still refused.
    let open = Cluster::builder().start().await.expect("start");
    let (code, _, _) = raw(&open, "GET", "/api/v1/namespaces", &[], b"", false).await;
    assert_eq!(code, 200);
    let bad = [("Authorization", "Bearer wrong")];
    let (code, _, _) = raw(&open, "GET", "/api/v1/namespaces", &bad, b"", false).await;
    assert_eq!(code, 401);
    open.shutdown().await;

    let c = Cluster::builder().rbac(true).start().await.expect("start");
    let (code, _, body) = raw(&c, "GET", "/api/v1/namespaces", &[], b"", false).await;
    assert_eq!(code, 401);
    assert_eq!(status(&body)["reason"], "Unauthorized");
    let bad = [("Authorization", "Bearer wrong")];
    let (code, _, _) = raw(&c, "GET", "/api/v1/namespaces", &bad, b"", false).await;
    assert_eq!(code, 401);
    for path in ["/healthz", "/livez", "/readyz"] {
        let (code, _, body) = raw(&c, "GET", path, &[], b"", false).await;
        assert_eq!((code, body.as_slice()), (200, b"ok".as_slice()), "{path}");
    }
    let (code, _, body) = raw(&c, "GET", "/version", &[], b"", false).await;
    assert_eq!(code, 200);
    let v: Value = serde_json::from_slice(&body).expect("version");
    assert_eq!(
        (v["major"].as_str(), v["minor"].as_str()),
        (Some("1"), Some("33"))
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn discovery_legacy_and_aggregated() {
    let c = Cluster::builder().start().await.expect("start");
    let client = c.client();
    let info = client.apiserver_version().await.expect("version");
    assert_eq!(info.minor, "33");
    let groups = client.list_api_groups().await.expect("/apis");
    assert!(groups.groups.iter().any(|g| g.name == "apps"));
    let core = client.list_core_api_resources("v1").await.expect("/api/v1");
    assert!(
        core.resources
            .iter()
            .any(|r| r.name == "configmaps" && r.namespaced)
    );
    let discovery = kube::Discovery::new(client.clone())
        .run_aggregated()
        .await
        .expect("aggregated");
    assert!(discovery.has_group("apps"));
    let accept = [(
        "Accept",
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json",
    )];
    let (code, head, _) = raw(&c, "GET", "/apis", &accept, b"", true).await;
    assert_eq!(code, 200);
    assert!(
        head.to_ascii_lowercase().contains(
            "content-type: application/json;g=apidiscovery.k8s.io;v=v2;as=apigroupdiscoverylist"
        ),
        "{head}"
    );
    let (code, _, body) = raw(&c, "GET", "/openapi/v3", &[], b"", true).await;
    assert_eq!(code, 200);
    let root: Value = serde_json::from_slice(&body).expect("openapi");
    assert!(
        root["paths"]["api/v1"]["serverRelativeURL"].is_string(),
        "{root}"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn table_and_partial_metadata_negotiation() {
    let c = Cluster::builder().start().await.expect("start");
    let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "t"}, "data": {"a": "1", "b": "2"}}))
            .expect("cm");
    cms.create(&PostParams::default(), &cm)
        .await
        .expect("create");
    let table = [(
        "Accept",
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
    )];
    let (code, _, body) = raw(
        &c,
        "GET",
        "/api/v1/namespaces/default/configmaps?limit=500",
        &table,
        b"",
        true,
    )
    .await;
    assert_eq!(code, 200);
    let t: Value = serde_json::from_slice(&body).expect("table");
    assert_eq!(t["kind"], "Table");
    assert!(t["metadata"]["resourceVersion"].is_string());
    assert_eq!(t["rows"][0]["cells"][0], "t");
    let meta = [(
        "Accept",
        "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
    )];
    let (_, _, body) = raw(
        &c,
        "GET",
        "/api/v1/namespaces/default/configmaps",
        &meta,
        b"",
        true,
    )
    .await;
    let l: Value = serde_json::from_slice(&body).expect("list");
    assert_eq!(l["kind"], "PartialObjectMetadataList");
    assert_eq!(l["items"][0]["kind"], "PartialObjectMetadata");
    assert!(l["items"][0].get("data").is_none());
    // A Table watch (kubectl get -w) sends one-row Tables per event.
    let rv = t["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_owned();
    let watch = format!(
        "/api/v1/namespaces/default/configmaps?resourceVersion={rv}&watch=true&timeoutSeconds=1"
    );
    let writer = {
        let cms = cms.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let cm: ConfigMap =
                serde_json::from_value(json!({"metadata": {"name": "t2"}})).expect("cm");
            cms.create(&PostParams::default(), &cm)
                .await
                .expect("create");
        })
    };
    let (code, _, body) = raw(&c, "GET", &watch, &table, b"", true).await;
    writer.await.expect("writer");
    assert_eq!(code, 200);
    let first = String::from_utf8_lossy(&body)
        .lines()
        .next()
        .expect("an event")
        .to_owned();
    let ev: Value = serde_json::from_str(&first).expect("event");
    assert_eq!(ev["type"], "ADDED");
    assert_eq!(ev["object"]["kind"], "Table");
    assert_eq!(ev["object"]["rows"][0]["cells"][0], "t2");
    c.shutdown().await;
}

/// kube-apiserver answers writes in the negotiated representation too: a server-side apply
/// with `as=PartialObjectMetadata` (kube's `patch_metadata`) stores the whole object and sends
/// back its metadata only. Clients that do not read the answer save its bytes this way.
#[tokio::test(flavor = "multi_thread")]
async fn writes_answer_in_partial_object_metadata_when_asked() {
    let c = Cluster::builder().start().await.expect("start");
    let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
    let cm: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "meta-only", "labels": {"a": "b"}},
        "data": {"big": "x".repeat(4096)},
    }))
    .expect("cm");
    let params = PatchParams::apply("contract").force();
    let answer = cms
        .patch_metadata("meta-only", &params, &Patch::Apply(&cm))
        .await
        .expect("apply, metadata back");
    assert_eq!(answer.metadata.name.as_deref(), Some("meta-only"));
    assert_eq!(answer.metadata.labels, cm.metadata.labels);
    assert!(answer.metadata.uid.is_some() && answer.metadata.resource_version.is_some());
    let managers: Vec<_> = answer
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.as_deref())
        .collect();
    assert_eq!(managers, ["contract"]);
    let stored = cms.get("meta-only").await.expect("get");
    assert_eq!(stored.data, cm.data, "the whole object is stored");
    assert_eq!(
        stored.metadata.resource_version,
        answer.metadata.resource_version
    );
    // On the wire: the answer is a PartialObjectMetadata without the data.
    let body = serde_json::to_vec(&json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "meta-only"}, "data": {"big": "y"},
    }))
    .expect("body");
    let (code, _, answer) = raw(
        &c,
        "PATCH",
        "/api/v1/namespaces/default/configmaps/meta-only?fieldManager=contract&force=true",
        &[
            ("Content-Type", "application/apply-patch+yaml"),
            (
                "Accept",
                "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
            ),
        ],
        &body,
        true,
    )
    .await;
    assert_eq!(code, 200);
    let answer: Value = serde_json::from_slice(&answer).expect("json");
    assert_eq!(answer["kind"], "PartialObjectMetadata");
    assert_eq!(answer["apiVersion"], "meta.k8s.io/v1");
    assert!(answer.get("data").is_none(), "{answer}");
    let stored = cms.get("meta-only").await.expect("get");
    assert_eq!(stored.data.expect("data")["big"], "y");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn in_process_service_is_admin() {
    let c = Cluster::builder().start().await.expect("start");
    let client = kube::Client::new(c.service(), "default");
    let nss: Api<Namespace> = Api::all(client);
    let list = nss.list(&ListParams::default()).await.expect("list");
    let names: Vec<_> = list
        .items
        .iter()
        .filter_map(|n| n.metadata.name.as_deref())
        .collect();
    assert_eq!(
        names,
        ["default", "kube-node-lease", "kube-public", "kube-system"]
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_cluster_with_rbac() {
    let c = Cluster::builder()
        .name("secure")
        .tls(true)
        .rbac(true)
        .start()
        .await
        .expect("start");
    assert!(c.url().starts_with("https://"));
    assert!(c.kubeconfig().contains("certificate-authority-data"));
    let admin = c.client();
    let sas: Api<ServiceAccount> = Api::default_namespaced(admin.clone());
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "bot"}})).expect("sa");
    sas.create(&PostParams::default(), &sa).await.expect("sa");
    let tr = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}});
    let req = http::Request::post("/api/v1/namespaces/default/serviceaccounts/bot/token")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&tr).expect("json"))
        .expect("request");
    let resp: Value = admin.request(req).await.expect("token request");
    let token = resp["status"]["token"].as_str().expect("token").to_owned();
    let bot = c.client_with_token(&token).expect("bot client");
    let bot_cms: Api<ConfigMap> = Api::default_namespaced(bot.clone());
    let err = bot_cms
        .list(&ListParams::default())
        .await
        .expect_err("forbidden");
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 403),
        "{err:?}"
    );

    let role: Role = serde_json::from_value(json!({"metadata": {"name": "read-cm"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}]}))
    .expect("role");
    Api::<Role>::default_namespaced(admin.clone())
        .create(&PostParams::default(), &role)
        .await
        .expect("role");
    let rb: RoleBinding = serde_json::from_value(json!({"metadata": {"name": "bot-read"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-cm"},
        "subjects": [{"kind": "ServiceAccount", "name": "bot", "namespace": "default"}]}))
    .expect("rb");
    Api::<RoleBinding>::default_namespaced(admin.clone())
        .create(&PostParams::default(), &rb)
        .await
        .expect("rb");
    bot_cms
        .list(&ListParams::default())
        .await
        .expect("allowed now");
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "x"}})).expect("cm");
    let err = bot_cms
        .create(&PostParams::default(), &cm)
        .await
        .expect_err("create still forbidden");
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 403),
        "{err:?}"
    );

    // Escalation prevention: allowed to write Roles, the bot still cannot grant what it lacks.
    let role_admin: Role = serde_json::from_value(json!({"metadata": {"name": "role-writer"},
        "rules": [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["create"]}]}))
    .expect("role");
    Api::<Role>::default_namespaced(admin.clone())
        .create(&PostParams::default(), &role_admin)
        .await
        .expect("role");
    let rb2: RoleBinding = serde_json::from_value(json!({"metadata": {"name": "bot-roles"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "role-writer"},
        "subjects": [{"kind": "ServiceAccount", "name": "bot", "namespace": "default"}]}))
    .expect("rb");
    Api::<RoleBinding>::default_namespaced(admin.clone())
        .create(&PostParams::default(), &rb2)
        .await
        .expect("rb");
    let bot_roles: Api<Role> = Api::default_namespaced(bot.clone());
    let modest: Role = serde_json::from_value(json!({"metadata": {"name": "modest"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]}))
    .expect("role");
    bot_roles
        .create(&PostParams::default(), &modest)
        .await
        .expect("within its own rights");
    let greedy: Role = serde_json::from_value(json!({"metadata": {"name": "greedy"},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]}))
    .expect("role");
    let err = bot_roles
        .create(&PostParams::default(), &greedy)
        .await
        .expect_err("escalation");
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 403),
        "{err:?}"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn fault_injection_latency_and_request_log() {
    let c = Cluster::builder().start().await.expect("start");
    let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
    // 500s reach the caller; kube-rs retries 429/503/504 by itself.
    c.fail_next("list", "configmaps", 2, ApiError::internal("injected"));
    for _ in 0..2 {
        let err = cms
            .list(&ListParams::default())
            .await
            .expect_err("injected");
        assert!(
            matches!(&err, kube::Error::Api(s) if s.code == 500 && s.message == "injected"),
            "{err:?}"
        );
    }
    cms.list(&ListParams::default())
        .await
        .expect("third succeeds");
    c.fail_next(
        "*",
        "configmaps",
        1,
        ApiError::new(503, "ServiceUnavailable", "busy"),
    );
    cms.list(&ListParams::default())
        .await
        .expect("the client retried the 503");
    c.set_latency(Duration::from_millis(150));
    let t = std::time::Instant::now();
    cms.list(&ListParams::default()).await.expect("slow list");
    assert!(t.elapsed() >= Duration::from_millis(150));
    c.set_latency(Duration::ZERO);
    let log = c.requests();
    let lists: Vec<_> = log
        .iter()
        .filter(|r| r.verb == "list" && r.path.ends_with("/configmaps"))
        .collect();
    assert_eq!(
        lists.iter().map(|r| r.code).collect::<Vec<_>>(),
        [500, 500, 200, 503, 200, 200]
    );
    assert!(lists.iter().all(|r| r.user == "admin" && r.method == "GET"));
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn restart_keeps_or_loses_state_on_the_same_port() {
    let c = Cluster::builder().start().await.expect("start");
    let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "keep"}})).expect("cm");
    cms.create(&PostParams::default(), &cm)
        .await
        .expect("create");
    let url = c.url();
    // A new client after each restart: a pooled connection from before it was cut by the
    // restart, and what is under test is the server's state, not the client's reconnects.
    c.restart(true).await;
    assert_eq!(c.url(), url);
    let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
    assert!(cms.get_opt("keep").await.expect("after restart").is_some());
    c.restart(false).await;
    let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
    assert!(cms.get_opt("keep").await.expect("after wipe").is_none());
    let nss: Api<Namespace> = Api::all(c.client());
    assert!(
        nss.get_opt("default").await.expect("ns").is_some(),
        "defaults are re-seeded"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_headers_arrive_before_any_event() {
    let c = Cluster::builder().start().await.expect("start");
    let mut tcp = tokio::net::TcpStream::connect(c.addr())
        .await
        .expect("connect");
    let req = format!(
        "GET /api/v1/namespaces/default/configmaps?watch=true&resourceVersion={} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\r\n",
        c.state().store.current_rv(),
        c.admin_token()
    );
    tcp.write_all(req.as_bytes()).await.expect("write");
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    let read = tokio::time::timeout(Duration::from_secs(2), async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = tcp.read(&mut buf).await.expect("read");
            assert!(n > 0, "connection closed early");
            head.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    assert!(read.is_ok(), "no headers while the watch is idle");
    let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(text.starts_with("http/1.1 200"), "{text}");
    assert!(text.contains("transfer-encoding: chunked"), "{text}");
    c.shutdown().await;
}
