//! The CRDs: generated YAML under `deploy/crds/` matches the types (drift check), every field
//! is documented for `kubectl explain`, every kind has a status subresource, a short name and
//! printer columns, and the schemas carry the validation the API server enforces.

use std::path::PathBuf;

use serde_json::Value;
use tether_api::crds;

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds")
}

#[test]
fn deploy_crds_match_the_types() {
    let dir = deploy_dir();
    let update = std::env::var_os("UPDATE_EXPECT").is_some();
    let mut expected_files = Vec::new();
    let mut stale = Vec::new();
    for crd in crds::all() {
        let name = crds::file_name(&crd);
        let yaml = crds::to_yaml(&crd).expect("CRDs serialise");
        let path = dir.join(&name);
        if update {
            std::fs::create_dir_all(&dir).expect("create deploy/crds");
            std::fs::write(&path, &yaml).expect("write CRD");
        } else if std::fs::read_to_string(&path).ok().as_deref() != Some(yaml.as_str()) {
            stale.push(name.clone());
        }
        expected_files.push(name);
    }
    let mut extra: Vec<String> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".yaml") && !expected_files.contains(n))
                .collect()
        })
        .unwrap_or_default();
    extra.sort();
    if update {
        for name in &extra {
            std::fs::remove_file(dir.join(name)).expect("remove stale CRD");
        }
        return;
    }
    assert!(
        stale.is_empty() && extra.is_empty(),
        "deploy/crds is out of date (differs: {stale:?}, not generated: {extra:?}); run \
         `UPDATE_EXPECT=1 cargo test -p tether-api --test crds` and commit the result"
    );
}

fn schema_of(crd: &Value) -> &Value {
    &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
}

/// Walks a schema and collects the paths of properties without a description.
fn undocumented(schema: &Value, path: &str, out: &mut Vec<String>) {
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, sub) in props {
            let p = format!("{path}.{name}");
            let top_level_meta =
                path.is_empty() && (name == "apiVersion" || name == "kind" || name == "metadata");
            if !top_level_meta
                && sub
                    .get("description")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
            {
                out.push(p.clone());
            }
            undocumented(sub, &p, out);
        }
    }
    if let Some(items) = schema.get("items") {
        undocumented(items, &format!("{path}[]"), out);
    }
    if let Some(extra) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        undocumented(extra, &format!("{path}{{}}"), out);
    }
}

#[test]
fn every_field_is_documented_for_kubectl_explain() {
    for crd in crds::all() {
        let crd = serde_json::to_value(&crd).expect("json");
        let mut missing = Vec::new();
        undocumented(schema_of(&crd), "", &mut missing);
        assert!(
            missing.is_empty(),
            "{}: fields without a description: {missing:?}",
            crd["metadata"]["name"]
        );
    }
}

#[test]
fn every_kind_has_status_short_name_columns_and_the_tether_category() {
    let mut names = Vec::new();
    for crd in crds::all() {
        let v = serde_json::to_value(&crd).expect("json");
        let name = v["metadata"]["name"].as_str().expect("name").to_owned();
        let version = &v["spec"]["versions"][0];
        assert_eq!(version["name"], "v1alpha1", "{name}");
        assert!(
            version["subresources"]["status"].is_object(),
            "{name}: status subresource"
        );
        let columns = version["additionalPrinterColumns"]
            .as_array()
            .expect("columns");
        assert!(columns.len() >= 3, "{name}: printer columns");
        assert!(
            v["spec"]["names"]["shortNames"]
                .as_array()
                .is_some_and(|s| !s.is_empty()),
            "{name}: short name"
        );
        assert_eq!(v["spec"]["names"]["categories"][0], "tether", "{name}");
        let status = &schema_of(&v)["properties"]["status"];
        let conditions = &status["properties"]["conditions"];
        assert_eq!(conditions["type"], "array", "{name}: status.conditions");
        let condition = &conditions["items"]["properties"];
        for field in [
            "type",
            "status",
            "reason",
            "message",
            "lastTransitionTime",
            "observedGeneration",
        ] {
            assert!(
                condition[field].is_object(),
                "{name}: condition field {field}"
            );
        }
        names.push(name);
    }
    expect_test::expect![[r#"
        [
            "foreignclusters.core.tether.dev",
            "tenants.authentication.tether.dev",
            "resourceslices.authentication.tether.dev",
            "configurations.networking.tether.dev",
            "gatewayservers.networking.tether.dev",
            "gatewayclients.networking.tether.dev",
            "connections.networking.tether.dev",
            "ips.networking.tether.dev",
            "virtualnodes.offloading.tether.dev",
            "namespaceoffloadings.offloading.tether.dev",
            "shadowpods.offloading.tether.dev",
        ]
    "#]]
    .assert_debug_eq(&names);
}

#[test]
fn foreign_cluster_columns_and_validation() {
    let crd = serde_json::to_value(
        <tether_api::core::ForeignCluster as kube_core::CustomResourceExt>::crd(),
    )
    .expect("json");
    let version = &crd["spec"]["versions"][0];
    let columns: Vec<&str> = version["additionalPrinterColumns"]
        .as_array()
        .expect("columns")
        .iter()
        .map(|c| c["name"].as_str().expect("name"))
        .collect();
    assert_eq!(
        columns,
        [
            "Cluster ID",
            "Role",
            "Phase",
            "Authentication",
            "Networking",
            "Offloading",
            "API Server",
            "Age"
        ]
    );
    assert_eq!(crd["spec"]["names"]["shortNames"][0], "fc");
    assert_eq!(crd["spec"]["scope"], "Cluster");
    let spec = &schema_of(&crd)["properties"]["spec"]["properties"];
    assert_eq!(
        spec["clusterID"]["pattern"],
        tether_api::cluster_id::PATTERN
    );
    assert_eq!(spec["clusterID"]["maxLength"], 49);
    let provider = &spec["provider"]["properties"];
    assert_eq!(
        provider["caFingerprint"]["pattern"],
        "^sha256:[0-9a-f]{64}$"
    );
    assert!(
        provider["authURL"]["pattern"]
            .as_str()
            .expect("pattern")
            .starts_with("^https://")
    );
    let phase = &schema_of(&crd)["properties"]["status"]["properties"]["phase"];
    let phases: Vec<&str> = phase["enum"]
        .as_array()
        .expect("enum")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        phases,
        [
            "Pending",
            "Authenticating",
            "Connecting",
            "Established",
            "Failed",
            "Unpeering"
        ]
    );
}

#[test]
fn an_ips_address_is_immutable_for_api_servers_that_evaluate_cel() {
    let crd =
        serde_json::to_value(<tether_api::networking::IP as kube_core::CustomResourceExt>::crd())
            .expect("json");
    let rules =
        &schema_of(&crd)["properties"]["spec"]["properties"]["ip"]["x-kubernetes-validations"];
    assert_eq!(rules[0]["rule"], "self == oldSelf", "{rules}");
    let message = rules[0]["message"].as_str().expect("message");
    assert!(
        message.contains("immutable") && message.contains("delete this IP and create it again"),
        "{message}"
    );
}
