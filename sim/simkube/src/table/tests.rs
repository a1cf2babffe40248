//! Tests of the Table printers: columns, cells and the CRD JSONPath columns, per kind.

use expect_test::{Expect, expect};

use super::*;
use crate::registry::Registry;

fn now() -> Timestamp {
    "2025-01-01T12:00:00Z".parse().expect("timestamp")
}

fn builtin(group: &str, kind: &str) -> ResourceType {
    let reg = Registry::with_builtins();
    reg.types
        .iter()
        .find(|t| t.group == group && t.kind == kind)
        .map(|t| (**t).clone())
        .expect("built-in type")
}

/// Renders a Table like kubectl's default (non-wide) output, for readable snapshots.
fn render(table: &Value, wide: bool) -> String {
    let defs = table["columnDefinitions"].as_array().expect("columns");
    let shown: Vec<usize> = (0..defs.len())
        .filter(|i| wide || defs[*i]["priority"].as_i64() == Some(0))
        .collect();
    let mut lines = vec![
        shown
            .iter()
            .map(|i| defs[*i]["name"].as_str().unwrap_or_default().to_uppercase())
            .collect::<Vec<_>>()
            .join(" | "),
    ];
    for row in table["rows"].as_array().expect("rows") {
        let cells = row["cells"].as_array().expect("cells");
        assert_eq!(cells.len(), defs.len(), "one cell per column");
        lines.push(
            shown
                .iter()
                .map(|i| match &cells[*i] {
                    Value::String(s) => s.clone(),
                    Value::Null => "<none>".to_owned(),
                    other => other.to_string(),
                })
                .collect::<Vec<_>>()
                .join(" | "),
        );
    }
    lines.join("\n")
}

fn check(rt: &ResourceType, objects: &[Value], wide: bool, expect: Expect) {
    let table = to_table_at(rt, objects, IncludeObject::Metadata, json!({}), now());
    expect.assert_eq(&render(&table, wide));
}

#[test]
fn human_durations_match_apimachinery() {
    let cases = [
        -5, -1, 0, 59, 119, 120, 150, 600, 10799, 10800, 12000, 28800, 172799, 172800, 180000,
        700000, 63072000, 63158400, 252288000,
    ];
    let out: Vec<String> = cases
        .iter()
        .map(|s| format!("{s}={}", human_duration(*s)))
        .collect();
    expect!["-5=<invalid> -1=0s 0=0s 59=59s 119=119s 120=2m 150=2m30s 600=10m 10799=179m 10800=3h 12000=3h20m 28800=8h 172799=47h 172800=2d 180000=2d2h 700000=8d 63072000=2y 63158400=2y1d 252288000=8y"]
        .assert_eq(&out.join(" "));
}

#[test]
fn pods_print_ready_status_restarts_and_wide_columns() {
    let running = json!({
        "metadata": {"name": "web", "creationTimestamp": "2025-01-01T11:55:00Z"},
        "spec": {"nodeName": "n1", "containers": [{"name": "a"}, {"name": "b"}]},
        "status": {"phase": "Running", "podIP": "10.0.0.5", "containerStatuses": [
            {"name": "a", "ready": true, "restartCount": 2, "state": {"running": {}},
             "lastState": {"terminated": {"finishedAt": "2025-01-01T11:59:00Z"}}},
            {"name": "b", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]},
    });
    let pending = json!({
        "metadata": {"name": "new", "creationTimestamp": "2025-01-01T11:59:30Z"},
        "spec": {"containers": [{"name": "a"}]},
        "status": {"phase": "Pending"},
    });
    let init = json!({
        "metadata": {"name": "init", "creationTimestamp": "2025-01-01T10:00:00Z"},
        "spec": {"initContainers": [{"name": "i1"}, {"name": "i2"}], "containers": [{"name": "a"}]},
        "status": {"phase": "Pending", "initContainerStatuses": [
            {"name": "i1", "state": {"terminated": {"exitCode": 0}}},
            {"name": "i2", "state": {"running": {}}}]},
    });
    let deleting = json!({
        "metadata": {"name": "old", "creationTimestamp": "2024-12-01T00:00:00Z", "deletionTimestamp": "2025-01-01T12:00:30Z"},
        "spec": {"containers": [{"name": "a"}], "readinessGates": [{"conditionType": "x/ok"}]},
        "status": {"phase": "Running", "conditions": [{"type": "x/ok", "status": "True"}],
                   "containerStatuses": [{"name": "a", "ready": true, "state": {"running": {}}}]},
    });
    let done = json!({
        "metadata": {"name": "job", "creationTimestamp": "2025-01-01T11:00:00Z"},
        "spec": {"containers": [{"name": "a"}]},
        "status": {"phase": "Succeeded", "containerStatuses": [
            {"name": "a", "ready": false, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]},
    });
    let pods = [running, pending, init, deleting, done];
    let rt = builtin("", "Pod");
    check(
        &rt,
        &pods,
        false,
        expect![[r#"
        NAME | READY | STATUS | RESTARTS | AGE
        web | 1/2 | CrashLoopBackOff | 2 (60s ago) | 5m
        new | 0/1 | Pending | 0 | 30s
        init | 0/1 | Init:1/2 | 0 | 120m
        old | 1/1 | Terminating | 0 | 31d
        job | 0/1 | Completed | 0 | 60m"#]],
    );
    check(
        &rt,
        &pods[..1],
        true,
        expect![[r#"
        NAME | READY | STATUS | RESTARTS | AGE | IP | NODE | NOMINATED NODE | READINESS GATES
        web | 1/2 | CrashLoopBackOff | 2 (60s ago) | 5m | 10.0.0.5 | n1 | <none> | <none>"#]],
    );
    check(
        &rt,
        &pods[3..4],
        true,
        expect![[r#"
        NAME | READY | STATUS | RESTARTS | AGE | IP | NODE | NOMINATED NODE | READINESS GATES
        old | 1/1 | Terminating | 0 | 31d | <none> | <none> | <none> | 1/1"#]],
    );
}

#[test]
fn services_nodes_deployments_and_friends_print_like_kubectl() {
    let t = "2025-01-01T11:00:00Z";
    check(
        &builtin("", "Service"),
        &[
            json!({"metadata": {"name": "kubernetes", "creationTimestamp": t},
               "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.1", "ports": [{"port": 443, "protocol": "TCP"}]}}),
            json!({"metadata": {"name": "lb", "creationTimestamp": t},
               "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.9", "selector": {"b": "2", "a": "1"},
                        "ports": [{"port": 80, "nodePort": 30080}, {"port": 53, "protocol": "UDP", "nodePort": 30053}]},
               "status": {"loadBalancer": {}}}),
            json!({"metadata": {"name": "ext", "creationTimestamp": t},
               "spec": {"type": "ExternalName", "externalName": "example.org"}}),
        ],
        true,
        expect![[r#"
        NAME | TYPE | CLUSTER-IP | EXTERNAL-IP | PORT(S) | AGE | SELECTOR
        kubernetes | ClusterIP | 10.96.0.1 | <none> | 443/TCP | 60m | <none>
        lb | LoadBalancer | 10.96.0.9 | <pending> | 80:30080/TCP,53:30053/UDP | 60m | a=1,b=2
        ext | ExternalName | <none> | example.org | <none> | 60m | <none>"#]],
    );
    check(
        &builtin("", "Node"),
        &[json!({
            "metadata": {"name": "vk-remote", "creationTimestamp": t, "labels": {"node-role.kubernetes.io/agent": "", "type": "virtual"}},
            "spec": {"unschedulable": true},
            "status": {"conditions": [{"type": "Ready", "status": "True"}], "nodeInfo": {"kubeletVersion": "v1.33.1"},
                       "addresses": [{"type": "InternalIP", "address": "198.18.0.2"}]},
        })],
        true,
        expect![[r#"
        NAME | STATUS | ROLES | AGE | VERSION | INTERNAL-IP | EXTERNAL-IP | OS-IMAGE | KERNEL-VERSION | CONTAINER-RUNTIME
        vk-remote | Ready,SchedulingDisabled | agent | 60m | v1.33.1 | 198.18.0.2 | <none> | <unknown> | <unknown> | <unknown>"#]],
    );
    check(
        &builtin("apps", "Deployment"),
        &[json!({
            "metadata": {"name": "web", "creationTimestamp": t},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"spec": {"containers": [{"name": "nginx", "image": "nginx:1"}, {"name": "sc", "image": "busybox"}]}}},
            "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2},
        })],
        true,
        expect![[r#"
        NAME | READY | UP-TO-DATE | AVAILABLE | AGE | CONTAINERS | IMAGES | SELECTOR
        web | 2/3 | 3 | 2 | 60m | nginx,sc | nginx:1,busybox | app=web"#]],
    );
    check(
        &builtin("", "ConfigMap"),
        &[
            json!({"metadata": {"name": "c", "creationTimestamp": t}, "data": {"a": "1", "b": "2"}, "binaryData": {"c": "AA=="}}),
        ],
        false,
        expect![[r#"
            NAME | DATA | AGE
            c | 3 | 60m"#]],
    );
    check(
        &builtin("", "Secret"),
        &[
            json!({"metadata": {"name": "s", "creationTimestamp": t}, "type": "Opaque", "data": {"a": "MQ=="}}),
        ],
        false,
        expect![[r#"
            NAME | TYPE | DATA | AGE
            s | Opaque | 1 | 60m"#]],
    );
    check(
        &builtin("", "Namespace"),
        &[
            json!({"metadata": {"name": "default", "creationTimestamp": t}, "status": {"phase": "Active"}}),
        ],
        false,
        expect![[r#"
            NAME | STATUS | AGE
            default | Active | 60m"#]],
    );
    check(
        &builtin("coordination.k8s.io", "Lease"),
        &[
            json!({"metadata": {"name": "n1", "creationTimestamp": t}, "spec": {"holderIdentity": "n1"}}),
        ],
        false,
        expect![[r#"
            NAME | HOLDER | AGE
            n1 | n1 | 60m"#]],
    );
    check(
        &builtin("certificates.k8s.io", "CertificateSigningRequest"),
        &[json!({
            "metadata": {"name": "peer", "creationTimestamp": t},
            "spec": {"signerName": "kubernetes.io/kube-apiserver-client", "username": "admin", "expirationSeconds": 86400},
            "status": {"conditions": [{"type": "Approved", "status": "True"}], "certificate": "LS0t"},
        })],
        false,
        expect![[r#"
        NAME | AGE | SIGNERNAME | REQUESTOR | REQUESTEDDURATION | CONDITION
        peer | 60m | kubernetes.io/kube-apiserver-client | admin | 24h | Approved,Issued"#]],
    );
    check(
        &builtin("rbac.authorization.k8s.io", "ClusterRole"),
        &[json!({"metadata": {"name": "view", "creationTimestamp": t}})],
        false,
        expect![[r#"
            NAME | CREATED AT
            view | 2025-01-01T11:00:00Z"#]],
    );
    check(
        &builtin("apiextensions.k8s.io", "CustomResourceDefinition"),
        &[json!({"metadata": {"name": "widgets.example.com", "creationTimestamp": t}})],
        false,
        expect![[r#"
            NAME | CREATED AT
            widgets.example.com | 2025-01-01T11:00:00Z"#]],
    );
    check(
        &builtin("", "Endpoints"),
        &[
            json!({"metadata": {"name": "e", "creationTimestamp": t}, "subsets": [
        {"addresses": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}], "ports": [{"port": 80}, {"port": 443}]}]}),
        ],
        false,
        expect![[r#"
            NAME | ENDPOINTS | AGE
            e | 10.0.0.1:80,10.0.0.1:443,10.0.0.2:80 + 1 more... | 60m"#]],
    );
}

#[test]
fn workloads_storage_and_policy_kinds_print_like_kubectl() {
    let t = "2025-01-01T11:00:00Z";
    check(
        &builtin("apps", "DaemonSet"),
        &[json!({
            "metadata": {"name": "fabric", "creationTimestamp": t},
            "spec": {"selector": {"matchLabels": {"app": "fabric"}},
                     "template": {"spec": {"nodeSelector": {"kubernetes.io/os": "linux"}, "containers": [{"name": "f", "image": "tether"}]}}},
            "status": {"desiredNumberScheduled": 3, "currentNumberScheduled": 3, "numberReady": 2, "updatedNumberScheduled": 3, "numberAvailable": 2},
        })],
        true,
        expect![[r#"
        NAME | DESIRED | CURRENT | READY | UP-TO-DATE | AVAILABLE | NODE SELECTOR | AGE | CONTAINERS | IMAGES | SELECTOR
        fabric | 3 | 3 | 2 | 3 | 2 | kubernetes.io/os=linux | 60m | f | tether | app=fabric"#]],
    );
    check(
        &builtin("apps", "StatefulSet"),
        &[json!({
            "metadata": {"name": "db", "creationTimestamp": t},
            "spec": {"replicas": 3, "template": {"spec": {"containers": [{"name": "pg", "image": "postgres"}]}}},
            "status": {"readyReplicas": 1},
        })],
        true,
        expect![[r#"
        NAME | READY | AGE | CONTAINERS | IMAGES
        db | 1/3 | 60m | pg | postgres"#]],
    );
    check(
        &builtin("batch", "Job"),
        &[
            json!({"metadata": {"name": "done", "creationTimestamp": t},
               "spec": {"completions": 1, "template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}},
               "status": {"succeeded": 1, "startTime": "2025-01-01T11:00:00Z", "completionTime": "2025-01-01T11:00:42Z",
                          "conditions": [{"type": "Complete", "status": "True"}]}}),
            json!({"metadata": {"name": "busy", "creationTimestamp": t},
               "spec": {"parallelism": 3}, "status": {"startTime": "2025-01-01T11:57:00Z"}}),
        ],
        false,
        expect![[r#"
        NAME | STATUS | COMPLETIONS | DURATION | AGE
        done | Complete | 1/1 | 42s | 60m
        busy | Running | 0/1 of 3 | 3m | 60m"#]],
    );
    check(
        &builtin("batch", "CronJob"),
        &[json!({
            "metadata": {"name": "nightly", "creationTimestamp": t},
            "spec": {"schedule": "0 3 * * *", "suspend": false},
            "status": {"active": [{"name": "nightly-1"}], "lastScheduleTime": "2025-01-01T11:50:00Z"},
        })],
        false,
        expect![[r#"
        NAME | SCHEDULE | TIMEZONE | SUSPEND | ACTIVE | LAST SCHEDULE | AGE
        nightly | 0 3 * * * | <none> | False | 1 | 10m | 60m"#]],
    );
    check(
        &builtin("", "PersistentVolumeClaim"),
        &[json!({
            "metadata": {"name": "data", "creationTimestamp": t},
            "spec": {"volumeName": "pv-1", "storageClassName": "standard", "resources": {"requests": {"storage": "1Gi"}}},
            "status": {"phase": "Bound", "capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteOnce", "ReadOnlyMany"]},
        })],
        true,
        expect![[r#"
        NAME | STATUS | VOLUME | CAPACITY | ACCESS MODES | STORAGECLASS | VOLUMEATTRIBUTESCLASS | AGE | VOLUMEMODE
        data | Bound | pv-1 | 2Gi | RWO,ROX | standard | <unset> | 60m | <unset>"#]],
    );
    check(
        &builtin("", "PersistentVolume"),
        &[json!({
            "metadata": {"name": "pv-1", "creationTimestamp": t},
            "spec": {"capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteOnce"], "persistentVolumeReclaimPolicy": "Retain",
                     "claimRef": {"namespace": "default", "name": "data"}, "storageClassName": "standard"},
            "status": {"phase": "Bound"},
        })],
        false,
        expect![[r#"
        NAME | CAPACITY | ACCESS MODES | RECLAIM POLICY | STATUS | CLAIM | STORAGECLASS | VOLUMEATTRIBUTESCLASS | REASON | AGE
        pv-1 | 2Gi | RWO | Retain | Bound | default/data | standard | <unset> |  | 60m"#]],
    );
    check(
        &builtin("", "ResourceQuota"),
        &[json!({
            "metadata": {"name": "tenant", "creationTimestamp": t},
            "status": {"hard": {"requests.cpu": "4", "limits.memory": "8Gi", "pods": "10"}, "used": {"requests.cpu": "500m", "pods": "2"}},
        })],
        false,
        expect![[r#"
        NAME | AGE | REQUEST | LIMIT
        tenant | 60m | pods: 2/10, requests.cpu: 500m/4 | limits.memory: 0/8Gi"#]],
    );
    check(
        &builtin("networking.k8s.io", "NetworkPolicy"),
        &[
            json!({"metadata": {"name": "all", "creationTimestamp": t}, "spec": {"podSelector": {}}}),
            json!({"metadata": {"name": "web", "creationTimestamp": t}, "spec": {"podSelector": {"matchLabels": {"app": "web"}}}}),
        ],
        false,
        expect![[r#"
        NAME | POD-SELECTOR | AGE
        all | <none> | 60m
        web | app=web | 60m"#]],
    );
    check(
        &builtin("networking.k8s.io", "Ingress"),
        &[json!({
            "metadata": {"name": "site", "creationTimestamp": t},
            "spec": {"ingressClassName": "nginx", "rules": [{"host": "a.example"}, {}], "tls": [{"hosts": ["a.example"]}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.18.0.10"}]}},
        })],
        false,
        expect![[r#"
        NAME | CLASS | HOSTS | ADDRESS | PORTS | AGE
        site | nginx | a.example,* | 198.18.0.10 | 80, 443 | 60m"#]],
    );
    check(
        &builtin("storage.k8s.io", "StorageClass"),
        &[json!({
            "metadata": {"name": "standard", "creationTimestamp": t, "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
            "provisioner": "rancher.io/local-path", "volumeBindingMode": "WaitForFirstConsumer",
        })],
        false,
        expect![[r#"
        NAME | PROVISIONER | RECLAIMPOLICY | VOLUMEBINDINGMODE | ALLOWVOLUMEEXPANSION | AGE
        standard (default) | rancher.io/local-path | Delete | WaitForFirstConsumer | false | 60m"#]],
    );
    check(
        &builtin("scheduling.k8s.io", "PriorityClass"),
        &[json!({
            "metadata": {"name": "system-node-critical", "creationTimestamp": t}, "value": 2000001000,
        })],
        false,
        expect![[r#"
        NAME | VALUE | GLOBAL-DEFAULT | AGE | PREEMPTIONPOLICY
        system-node-critical | 2000001000 | false | 60m | PreemptLowerPriority"#]],
    );
    check(
        &builtin("policy", "PodDisruptionBudget"),
        &[json!({
            "metadata": {"name": "pdb", "creationTimestamp": t}, "spec": {"minAvailable": "50%"}, "status": {"disruptionsAllowed": 1},
        })],
        false,
        expect![[r#"
        NAME | MIN AVAILABLE | MAX UNAVAILABLE | ALLOWED DISRUPTIONS | AGE
        pdb | 50% | N/A | 1 | 60m"#]],
    );
    check(
        &builtin(
            "admissionregistration.k8s.io",
            "ValidatingWebhookConfiguration",
        ),
        &[json!({
            "metadata": {"name": "shadowpods", "creationTimestamp": t}, "webhooks": [{"name": "a"}, {"name": "b"}],
        })],
        false,
        expect![[r#"
        NAME | WEBHOOKS | AGE
        shadowpods | 2 | 60m"#]],
    );
    check(
        &builtin("", "LimitRange"),
        &[json!({"metadata": {"name": "limits", "creationTimestamp": t}})],
        false,
        expect![[r#"
            NAME | CREATED AT
            limits | 2025-01-01T11:00:00Z"#]],
    );
}

#[test]
fn events_put_name_last_and_print_the_involved_object() {
    let core = json!({
        "metadata": {"name": "web.17f", "creationTimestamp": "2025-01-01T11:00:00Z"},
        "involvedObject": {"kind": "Pod", "name": "web", "fieldPath": "spec.containers{a}"},
        "reason": "Pulled", "type": "Normal", "message": "pulled image \n",
        "firstTimestamp": "2025-01-01T11:00:00Z", "lastTimestamp": "2025-01-01T11:58:00Z", "count": 3,
        "source": {"component": "kubelet", "host": "n1"},
    });
    check(
        &builtin("", "Event"),
        std::slice::from_ref(&core),
        true,
        expect![[r#"
        LAST SEEN | TYPE | REASON | OBJECT | SUBOBJECT | SOURCE | MESSAGE | FIRST SEEN | COUNT | NAME
        2m | Normal | Pulled | pod/web | spec.containers{a} | kubelet, n1 | pulled image | 60m | 3 | web.17f"#]],
    );
    let new = json!({
        "metadata": {"name": "r.1", "creationTimestamp": "2025-01-01T11:59:00Z"},
        "regarding": {"kind": "Widget", "name": "w1"}, "reason": "Synced", "type": "Normal",
        "note": "ok", "eventTime": "2025-01-01T11:59:00.000000Z", "reportingController": "tether",
    });
    check(
        &builtin("events.k8s.io", "Event"),
        &[new],
        false,
        expect![[r#"
        LAST SEEN | TYPE | REASON | OBJECT | MESSAGE
        60s | Normal | Synced | widget/w1 | ok"#]],
    );
}

#[test]
fn crd_columns_follow_jsonpath_and_show_dates_as_ages() {
    let mut rt = builtin("", "ConfigMap");
    rt.origin = Origin::Crd {
        name: "widgets.example.com".into(),
    };
    let c = |name: &str, type_: &str, path: &str, priority| PrinterColumn {
        name: name.into(),
        type_: type_.into(),
        format: String::new(),
        description: String::new(),
        priority,
        json_path: path.into(),
    };
    rt.printer_columns = vec![
        c(
            "Ready",
            "string",
            r#".status.conditions[?(@.type=="Ready")].status"#,
            0,
        ),
        c("Size", "integer", ".spec.size", 0),
        c("Ratio", "number", ".spec.ratio", 0),
        c("Paused", "boolean", ".spec.paused", 0),
        c("First", "string", ".spec.items[0].name", 0),
        c("Tags", "string", ".spec.tags", 1),
        c(
            "Dotted",
            "string",
            ".metadata.labels['app.kubernetes.io/name']",
            1,
        ),
        c("Age", "date", ".metadata.creationTimestamp", 0),
    ];
    let w = json!({
        "metadata": {"name": "w1", "creationTimestamp": "2025-01-01T11:30:00Z", "labels": {"app.kubernetes.io/name": "demo"}},
        "spec": {"size": 3.0, "ratio": 2, "paused": false, "items": [{"name": "x"}], "tags": ["a", "b"]},
        "status": {"conditions": [{"type": "Synced", "status": "False"}, {"type": "Ready", "status": "True"}]},
    });
    let empty = json!({"metadata": {"name": "w2"}});
    check(
        &rt,
        &[w, empty],
        true,
        expect![[r#"
        NAME | READY | SIZE | RATIO | PAUSED | FIRST | TAGS | DOTTED | AGE
        w1 | True | 3 | 2.0 | false | x | ["a","b"] | demo | 30m
        w2 | <none> | <none> | <none> | <none> | <none> | <none> | <none> | <none>"#]],
    );
}

#[test]
fn include_object_selects_what_rows_carry() {
    assert_eq!(IncludeObject::parse(None), IncludeObject::Metadata);
    assert_eq!(IncludeObject::parse(Some("None")), IncludeObject::None);
    assert_eq!(IncludeObject::parse(Some("Object")), IncludeObject::Object);
    let rt = builtin("", "ConfigMap");
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "resourceVersion": "7", "labels": {"a": "b"}}, "data": {"k": "v"}});
    let meta = to_table_at(
        &rt,
        std::slice::from_ref(&cm),
        IncludeObject::Metadata,
        json!({"resourceVersion": "9"}),
        now(),
    );
    assert_eq!(
        meta["rows"][0]["object"],
        json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": cm["metadata"]})
    );
    assert_eq!(meta["metadata"]["resourceVersion"], "9");
    let full = to_table_at(
        &rt,
        std::slice::from_ref(&cm),
        IncludeObject::Object,
        json!({}),
        now(),
    );
    assert_eq!(full["rows"][0]["object"], cm);
    let none = to_table_at(
        &rt,
        std::slice::from_ref(&cm),
        IncludeObject::None,
        json!({}),
        now(),
    );
    assert!(none["rows"][0].get("object").is_none());
    let one = row_at(&rt, &cm, IncludeObject::Metadata, now());
    assert_eq!(one["kind"], "Table");
    assert_eq!(one["metadata"]["resourceVersion"], "7");
    assert_eq!(one["rows"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        one["columnDefinitions"][0],
        json!({"name": "Name", "type": "string", "format": "name", "description": NAME_DESCRIPTION, "priority": 0})
    );
}

/// Arbitrary JSON biased to the fields the printers read, so odd shapes reach them.
fn arb_object() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    let key = prop_oneof![
        Just("metadata"),
        Just("spec"),
        Just("status"),
        Just("containers"),
        Just("containerStatuses"),
        Just("initContainerStatuses"),
        Just("initContainers"),
        Just("state"),
        Just("waiting"),
        Just("terminated"),
        Just("reason"),
        Just("ports"),
        Just("port"),
        Just("nodePort"),
        Just("conditions"),
        Just("type"),
        Just("creationTimestamp"),
        Just("deletionTimestamp"),
        Just("labels"),
        Just("selector"),
        Just("matchExpressions"),
        Just("values"),
        Just("subsets"),
        Just("addresses"),
        Just("endpoints"),
        Just("involvedObject"),
        Just("series"),
        Just("hard"),
        Just("used"),
        Just("replicas"),
        Just("rules"),
        Just("template"),
        Just("data"),
        Just("phase"),
    ]
    .prop_map(str::to_owned);
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        prop_oneof![
            Just("2025-01-01T11:00:00Z".to_owned()),
            Just("Always".to_owned()),
            "[a-z]{0,3}"
        ]
        .prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 64, 6, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map(key.clone(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest::proptest! {
    #[test]
    fn every_printer_yields_one_cell_per_column_for_any_object(obj in arb_object()) {
        let reg = Registry::with_builtins();
        for rt in &reg.types {
            let table = to_table_at(rt, std::slice::from_ref(&obj), IncludeObject::Metadata, json!({}), now());
            let columns = table["columnDefinitions"].as_array().map_or(0, Vec::len);
            let cells = table["rows"][0]["cells"].as_array().map_or(0, Vec::len);
            proptest::prop_assert_eq!(columns, cells, "{}", rt.kind);
        }
    }
}

#[test]
fn jsonpath_subset() {
    let obj = json!({"a": {"b": [{"k": "x", "v": 1}, {"k": "y", "v": 2}], "c.d": "dot"}});
    let cases = [
        (".a.b[1].v", Some(json!(2))),
        ("{.a.b[0].k}", Some(json!("x"))),
        (r#".a.b[?(@.k=="y")].v"#, Some(json!(2))),
        (r#".a.b[?(@.k!="x")].k"#, Some(json!("y"))),
        (".a.b[*].k", Some(json!("x"))),
        (".a['c.d']", Some(json!("dot"))),
        (".a.missing", None),
        (".a.b[9]", None),
        ("a.b[0].v", Some(json!(1))),
    ];
    for (path, want) in cases {
        assert_eq!(jsonpath_first(&obj, path), want, "{path}");
    }
}
