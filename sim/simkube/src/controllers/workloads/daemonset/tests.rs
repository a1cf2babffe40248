//! Table tests of eligibility, the rolling steps, the status and the pods' shape.

use expect_test::{Expect, expect};
use serde_json::{Value, json};

use super::*;

fn ds(extra: Value) -> DaemonSet {
    let mut base = json!({
        "metadata": {"name": "agent", "namespace": "kube-system", "uid": "u1", "generation": 2},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {"metadata": {"labels": {"app": "agent"}},
                "spec": {"containers": [{"name": "c", "image": "agent:1"}]}}
        }
    });
    json_patch::merge(&mut base, &extra);
    serde_json::from_value(base).expect("daemonset")
}

fn node(name: &str, extra: Value) -> Node {
    let mut base = json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}});
    json_patch::merge(&mut base, &extra);
    serde_json::from_value(base).expect("node")
}

/// A pod of the DaemonSet bound to `node` with template `hash`; `extra` is merged in.
fn pod(name: &str, node: &str, hash: &str, extra: Value) -> Pod {
    let mut base = json!({
        "metadata": {"name": name, "labels": {"app": "agent", REVISION_HASH: hash},
            "creationTimestamp": "2024-01-01T00:00:00Z"},
        "spec": {"nodeName": node, "containers": []},
        "status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "2024-01-01T00:00:10Z"}]}
    });
    json_patch::merge(&mut base, &extra);
    serde_json::from_value(base).expect("pod")
}

fn unready() -> Value {
    json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
}

fn now() -> Timestamp {
    "2024-01-01T00:01:00Z".parse().expect("time")
}

fn show(plan: &Plan) -> String {
    let s = &plan.status;
    format!(
        "create {:?}\ndelete {:?}\nforce {:?}\ndesired {} current {} misscheduled {} ready {} \
         updated {:?} available {:?} unavailable {:?} observed {:?}\n",
        plan.create,
        plan.delete,
        plan.force_delete,
        s.desired_number_scheduled,
        s.current_number_scheduled,
        s.number_misscheduled,
        s.number_ready,
        s.updated_number_scheduled,
        s.number_available,
        s.number_unavailable,
        s.observed_generation,
    )
}

fn check(ds: &DaemonSet, nodes: &[Node], pods: &[Pod], want: Expect) {
    want.assert_eq(&show(&plan(ds, nodes, pods, "new", now())));
}

#[test]
fn eligibility_follows_selectors_affinity_and_taints() {
    let tainted = |effect: &str| {
        node(
            "t",
            json!({"spec": {"taints": [{"key": "dedicated", "value": "gw", "effect": effect}]}}),
        )
    };
    let tolerate = json!({"spec": {"template": {"spec": {"tolerations": [
        {"key": "dedicated", "operator": "Equal", "value": "gw"}]}}}});
    let cases = [
        ("plain node", ds(json!({})), node("n", json!({}))),
        (
            "nodeSelector misses",
            ds(json!({"spec": {"template": {"spec": {"nodeSelector": {"role": "edge"}}}}})),
            node("n", json!({})),
        ),
        (
            "nodeSelector matches",
            ds(json!({"spec": {"template": {"spec": {"nodeSelector": {"role": "edge"}}}}})),
            node("n", json!({"metadata": {"labels": {"role": "edge"}}})),
        ),
        (
            "affinity NotIn",
            ds(
                json!({"spec": {"template": {"spec": {"affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "kubernetes.io/hostname",
                        "operator": "NotIn", "values": ["n"]}]}]}}}}}}}),
            ),
            node("n", json!({})),
        ),
        (
            "NoSchedule untolerated",
            ds(json!({})),
            tainted("NoSchedule"),
        ),
        ("NoExecute untolerated", ds(json!({})), tainted("NoExecute")),
        ("NoExecute tolerated", ds(tolerate), tainted("NoExecute")),
        (
            "cordoned and not-ready",
            ds(json!({})),
            node(
                "n",
                json!({"spec": {"unschedulable": true, "taints": [
                {"key": TAINT_UNSCHEDULABLE, "effect": "NoSchedule"},
                {"key": TAINT_NOT_READY, "effect": "NoExecute"}]}}),
            ),
        ),
        (
            "network-unavailable, pod network",
            ds(json!({})),
            node(
                "n",
                json!({"spec": {"taints": [
                {"key": "node.kubernetes.io/network-unavailable", "effect": "NoSchedule"}]}}),
            ),
        ),
        (
            "network-unavailable, host network",
            ds(json!({"spec": {"template": {"spec": {"hostNetwork": true}}}})),
            node(
                "n",
                json!({"spec": {"taints": [
                {"key": "node.kubernetes.io/network-unavailable", "effect": "NoSchedule"}]}}),
            ),
        ),
    ];
    let table: String = cases
        .iter()
        .map(|(what, ds, node)| {
            let (run, stay) = node_should_run(ds, node);
            format!("{what}: run {run} stay {stay}\n")
        })
        .collect();
    expect![[r#"
        plain node: run true stay true
        nodeSelector misses: run false stay false
        nodeSelector matches: run true stay true
        affinity NotIn: run false stay false
        NoSchedule untolerated: run false stay true
        NoExecute untolerated: run false stay false
        NoExecute tolerated: run true stay true
        cordoned and not-ready: run true stay true
        network-unavailable, pod network: run false stay true
        network-unavailable, host network: run true stay true
    "#]]
    .assert_eq(&table);
}

#[test]
fn one_pod_per_eligible_node() {
    let nodes = [
        node("a", json!({})),
        node("b", json!({})),
        node(
            "t",
            json!({"spec": {"taints": [{"key": "x", "effect": "NoExecute"}]}}),
        ),
    ];
    // a has one pod, b none, the tainted node one (it must go), and a pod is bound to a node
    // that no longer exists.
    let pods = [
        pod("p-a", "a", "new", json!({})),
        pod("p-t", "t", "new", json!({})),
        pod("p-gone", "gone", "new", json!({})),
    ];
    check(
        &ds(json!({})),
        &nodes,
        &pods,
        expect![[r#"
            create ["b"]
            delete ["p-t"]
            force ["p-gone"]
            desired 2 current 1 misscheduled 1 ready 1 updated Some(1) available Some(1) unavailable Some(1) observed Some(2)
        "#]],
    );
}

#[test]
fn duplicates_failed_and_unbound_pods_are_cleaned_up() {
    let nodes = [node("a", json!({})), node("b", json!({}))];
    let pods = [
        pod("old-a", "a", "new", json!({})),
        pod(
            "dup-a",
            "a",
            "new",
            json!({"metadata": {"creationTimestamp": "2024-01-01T00:00:30Z"}}),
        ),
        pod(
            "failed-b",
            "b",
            "new",
            json!({"status": {"phase": "Failed"}}),
        ),
        // Pinned through affinity, not yet bound: it counts for its node.
        pod(
            "pinned-b",
            "",
            "new",
            json!({"spec": {"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]}]}}}}}),
        ),
    ];
    check(
        &ds(json!({})),
        &nodes,
        &pods,
        expect![[r#"
            create []
            delete ["dup-a", "failed-b"]
            force []
            desired 2 current 2 misscheduled 0 ready 2 updated Some(2) available Some(2) unavailable Some(0) observed Some(2)
        "#]],
    );
}

#[test]
fn rolling_update_replaces_one_node_at_a_time() {
    let nodes = [
        node("a", json!({})),
        node("b", json!({})),
        node("c", json!({})),
    ];
    let all_old = [
        pod("a1", "a", "old", json!({})),
        pod("b1", "b", "old", json!({})),
        pod("c1", "c", "old", json!({})),
    ];
    check(
        &ds(json!({})),
        &nodes,
        &all_old,
        expect![[r#"
            create []
            delete ["a1"]
            force []
            desired 3 current 3 misscheduled 0 ready 3 updated Some(0) available Some(3) unavailable Some(0) observed Some(2)
        "#]],
    );
    // a1 is terminating: a's new pod is created, nothing else moves yet.
    let terminating = json!({"metadata": {"deletionTimestamp": "2024-01-01T00:00:50Z"}});
    let step2 = [
        pod("a1", "a", "old", terminating),
        pod("b1", "b", "old", json!({})),
        pod("c1", "c", "old", json!({})),
    ];
    check(
        &ds(json!({})),
        &nodes,
        &step2,
        expect![[r#"
            create ["a"]
            delete []
            force []
            desired 3 current 3 misscheduled 0 ready 3 updated Some(0) available Some(3) unavailable Some(0) observed Some(2)
        "#]],
    );
    // a1 is gone before a's new pod is seen: an empty node counts as unavailable, so nothing
    // else goes.
    check(
        &ds(json!({})),
        &nodes,
        &step2[1..],
        expect![[r#"
            create ["a"]
            delete []
            force []
            desired 3 current 2 misscheduled 0 ready 2 updated Some(0) available Some(2) unavailable Some(1) observed Some(2)
        "#]],
    );
    // a's new pod exists but is not ready: the budget is spent.
    let step3 = [
        pod("a2", "a", "new", unready()),
        pod("b1", "b", "old", json!({})),
        pod("c1", "c", "old", json!({})),
    ];
    check(
        &ds(json!({})),
        &nodes,
        &step3,
        expect![[r#"
            create []
            delete []
            force []
            desired 3 current 3 misscheduled 0 ready 2 updated Some(1) available Some(2) unavailable Some(1) observed Some(2)
        "#]],
    );
    // a's new pod is available: the next node goes; an unavailable old pod goes regardless.
    let step4 = [
        pod("a2", "a", "new", json!({})),
        pod("b1", "b", "old", json!({})),
        pod("c1", "c", "old", unready()),
    ];
    check(
        &ds(json!({})),
        &nodes,
        &step4,
        expect![[r#"
            create []
            delete ["b1", "c1"]
            force []
            desired 3 current 3 misscheduled 0 ready 2 updated Some(1) available Some(2) unavailable Some(1) observed Some(2)
        "#]],
    );
    // OnDelete: old pods stay until someone deletes them.
    check(
        &ds(json!({"spec": {"updateStrategy": {"type": "OnDelete", "rollingUpdate": null}}})),
        &nodes,
        &all_old,
        expect![[r#"
            create []
            delete []
            force []
            desired 3 current 3 misscheduled 0 ready 3 updated Some(0) available Some(3) unavailable Some(0) observed Some(2)
        "#]],
    );
}

#[test]
fn max_unavailable_percentages_round_up() {
    let nodes: Vec<Node> = (0..5).map(|i| node(&format!("n{i}"), json!({}))).collect();
    let pods: Vec<Pod> = (0..5)
        .map(|i| pod(&format!("p{i}"), &format!("n{i}"), "old", json!({})))
        .collect();
    let set = ds(json!({"spec": {"updateStrategy": {"rollingUpdate": {"maxUnavailable": "30%"}}}}));
    let p = plan(&set, &nodes, &pods, "new", now());
    assert_eq!(p.delete, ["p0", "p1"]);
}

#[test]
fn pods_are_pinned_owned_labeled_and_tolerant() {
    let set = ds(json!({"spec": {"template": {"spec": {"hostNetwork": true,
        "tolerations": [{"key": TAINT_UNSCHEDULABLE, "operator": "Exists",
            "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "role", "operator": "Exists"}]}]}}}}}}}));
    let p = pod_for_node(&set, "n7", "h4sh");
    assert_eq!(target_node(&p).as_deref(), Some("n7"));
    let mut value = serde_json::to_value(&p).expect("json");
    // Containers are the template's; the rest is what the controller adds.
    value["spec"]["containers"] = json!("...");
    expect![[r#"
        {
          "apiVersion": "v1",
          "kind": "Pod",
          "metadata": {
            "generateName": "agent-",
            "labels": {
              "app": "agent",
              "controller-revision-hash": "h4sh",
              "pod-template-generation": "2"
            },
            "namespace": "kube-system",
            "ownerReferences": [
              {
                "apiVersion": "apps/v1",
                "blockOwnerDeletion": true,
                "controller": true,
                "kind": "DaemonSet",
                "name": "agent",
                "uid": "u1"
              }
            ]
          },
          "spec": {
            "affinity": {
              "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                  "nodeSelectorTerms": [
                    {
                      "matchExpressions": [
                        {
                          "key": "role",
                          "operator": "Exists"
                        }
                      ],
                      "matchFields": [
                        {
                          "key": "metadata.name",
                          "operator": "In",
                          "values": [
                            "n7"
                          ]
                        }
                      ]
                    }
                  ]
                }
              }
            },
            "containers": "...",
            "hostNetwork": true,
            "tolerations": [
              {
                "effect": "NoSchedule",
                "key": "node.kubernetes.io/unschedulable",
                "operator": "Exists"
              },
              {
                "effect": "NoExecute",
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists"
              },
              {
                "effect": "NoExecute",
                "key": "node.kubernetes.io/unreachable",
                "operator": "Exists"
              },
              {
                "effect": "NoSchedule",
                "key": "node.kubernetes.io/disk-pressure",
                "operator": "Exists"
              },
              {
                "effect": "NoSchedule",
                "key": "node.kubernetes.io/memory-pressure",
                "operator": "Exists"
              },
              {
                "effect": "NoSchedule",
                "key": "node.kubernetes.io/pid-pressure",
                "operator": "Exists"
              },
              {
                "effect": "NoSchedule",
                "key": "node.kubernetes.io/network-unavailable",
                "operator": "Exists"
              }
            ]
          }
        }"#]]
    .assert_eq(&serde_json::to_string_pretty(&value).expect("pretty"));
}
