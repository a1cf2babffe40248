//! Table tests of the scheduler's pure decisions: quantities, filters, scoring and the
//! unschedulable message.

use expect_test::expect;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};

use super::*;

fn node(name: &str, extra: Value) -> Node {
    let mut base = json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {},
        "status": {
            "allocatable": {"cpu": "2", "memory": "4Gi", "pods": "110", "ephemeral-storage": "10Gi"},
            "conditions": [{"type": "Ready", "status": "True"}]
        }
    });
    json_patch::merge(&mut base, &extra);
    serde_json::from_value(base).expect("node")
}

fn pod(spec: Value) -> Pod {
    let mut base = json!({"metadata": {"name": "p", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "i"}]}});
    json_patch::merge(&mut base, &json!({"spec": spec}));
    serde_json::from_value(base).expect("pod")
}

fn requests(cpu: &str, memory: &str) -> Value {
    json!({"containers": [{"name": "c", "image": "i",
        "resources": {"requests": {"cpu": cpu, "memory": memory}}}]})
}

#[test]
fn quantities_parse_to_thousandths() {
    let cases = [
        ("100m", Some(100)),
        ("1", Some(1000)),
        ("1.5", Some(1500)),
        ("0.1", Some(100)),
        ("128Mi", Some(128 * 1024 * 1024 * 1000)),
        ("1G", Some(1_000_000_000_000)),
        ("2k", Some(2_000_000)),
        ("1e3", Some(1_000_000)),
        ("1n", Some(1)),
        ("", None),
        ("abc", None),
        ("1Xi", None),
    ];
    for (text, want) in cases {
        assert_eq!(parse_quantity(text), want, "{text}");
    }
}

#[test]
fn requests_sum_containers_and_cover_init_containers() {
    let p = pod(json!({
        "containers": [
            {"name": "a", "image": "i", "resources": {"requests": {"cpu": "100m"}}},
            {"name": "b", "image": "i", "resources": {"limits": {"cpu": "200m", "memory": "1Gi"}}}
        ],
        "initContainers": [{"name": "i", "image": "i", "resources": {"requests": {"cpu": "1"}}}],
        "overhead": {"cpu": "10m"}
    }));
    let r = pod_requests(&p, false);
    assert_eq!(r["cpu"], 1010);
    assert_eq!(r["memory"], 1000 << 30);
    let r = pod_requests(&pod(json!({})), true);
    assert_eq!(r["cpu"], 100);
}

#[test]
fn filters_follow_the_real_plugins() {
    let tolerate_gpu = json!({"tolerations": [{"key": "gpu", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}]});
    let cases: Vec<(&str, Value, Value, Vec<Unfit>)> = vec![
        ("plain pod on a ready node", json!({}), json!({}), vec![]),
        (
            "cordoned",
            json!({"spec": {"unschedulable": true}}),
            json!({}),
            vec![Unfit::Unschedulable],
        ),
        (
            "cordon tolerated",
            json!({"spec": {"unschedulable": true}}),
            json!({"tolerations": [{"key": TAINT_UNSCHEDULABLE, "operator": "Exists"}]}),
            vec![],
        ),
        (
            "other node named",
            json!({}),
            json!({"nodeName": "elsewhere"}),
            vec![Unfit::NodeName],
        ),
        (
            "untolerated taint",
            json!({"spec": {"taints": [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]}}),
            json!({}),
            vec![Unfit::Taint {
                key: "gpu".into(),
                value: "yes".into(),
            }],
        ),
        (
            "tolerated taint",
            json!({"spec": {"taints": [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]}}),
            tolerate_gpu.clone(),
            vec![],
        ),
        (
            "toleration with another value",
            json!({"spec": {"taints": [{"key": "gpu", "value": "no", "effect": "NoSchedule"}]}}),
            tolerate_gpu,
            vec![Unfit::Taint {
                key: "gpu".into(),
                value: "no".into(),
            }],
        ),
        (
            "NoExecute taint",
            json!({"spec": {"taints": [{"key": "k", "effect": "NoExecute"}]}}),
            json!({}),
            vec![Unfit::Taint {
                key: "k".into(),
                value: String::new(),
            }],
        ),
        (
            "PreferNoSchedule does not filter",
            json!({"spec": {"taints": [{"key": "k", "effect": "PreferNoSchedule"}]}}),
            json!({}),
            vec![],
        ),
        (
            "wildcard toleration",
            json!({"spec": {"taints": [{"key": "k", "effect": "NoExecute"}]}}),
            json!({"tolerations": [{"operator": "Exists"}]}),
            vec![],
        ),
        (
            "not ready node",
            json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
            json!({}),
            vec![Unfit::Taint {
                key: TAINT_NOT_READY.into(),
                value: String::new(),
            }],
        ),
        (
            "node without a Ready condition",
            json!({"status": {"conditions": []}}),
            json!({}),
            vec![Unfit::Taint {
                key: TAINT_UNREACHABLE.into(),
                value: String::new(),
            }],
        ),
        (
            "node selector matches",
            json!({"metadata": {"labels": {"zone": "a"}}}),
            json!({"nodeSelector": {"zone": "a"}}),
            vec![],
        ),
        (
            "node selector misses",
            json!({}),
            json!({"nodeSelector": {"zone": "a"}}),
            vec![Unfit::Affinity],
        ),
        (
            "affinity In/Gt match",
            json!({"metadata": {"labels": {"zone": "a", "gen": "5"}}}),
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}, {"key": "gen", "operator": "Gt", "values": ["3"]}]}
            ]}}}}),
            vec![],
        ),
        (
            "affinity Lt/DoesNotExist miss, second term by name matches",
            json!({"metadata": {"labels": {"gen": "5"}}}),
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "gen", "operator": "Lt", "values": ["3"]}]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
            ]}}}}),
            vec![],
        ),
        (
            "affinity NotIn/Exists miss",
            json!({"metadata": {"labels": {"zone": "a"}}}),
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]},
                {"matchExpressions": [{"key": "ssd", "operator": "Exists"}]},
                {}
            ]}}}}),
            vec![Unfit::Affinity],
        ),
        ("requests fit", json!({}), requests("2", "4Gi"), vec![]),
        (
            "requests too large",
            json!({}),
            requests("2100m", "5Gi"),
            vec![
                Unfit::Insufficient("cpu".into()),
                Unfit::Insufficient("memory".into()),
            ],
        ),
        (
            "extended resource missing",
            json!({}),
            json!({"containers": [{"name": "c", "image": "i", "resources": {"limits": {"example.com/gpu": "1"}}}]}),
            vec![Unfit::Insufficient("example.com/gpu".into())],
        ),
        (
            "extended resource present",
            json!({"status": {"allocatable": {"example.com/gpu": "2"}}}),
            json!({"containers": [{"name": "c", "image": "i", "resources": {"limits": {"example.com/gpu": "2"}}}]}),
            vec![],
        ),
        (
            "no pod slots",
            json!({"status": {"allocatable": {"pods": "0"}}}),
            json!({}),
            vec![Unfit::TooManyPods],
        ),
    ];
    for (what, node_extra, pod_spec, want) in cases {
        let n = node("n1", node_extra);
        let p = pod(pod_spec);
        assert_eq!(filter(&p, &NodeUsage::new(&n)), want, "{what}");
    }
}

#[test]
fn usage_counts_against_allocatable() {
    let n = node("n1", json!({"status": {"allocatable": {"pods": "2"}}}));
    let mut usage = NodeUsage::new(&n);
    usage.add(&pod(requests("1500m", "1Gi")));
    assert_eq!(
        filter(&pod(requests("600m", "1Gi")), &usage),
        vec![Unfit::Insufficient("cpu".into())]
    );
    assert!(filter(&pod(requests("500m", "1Gi")), &usage).is_empty());
    usage.add(&pod(json!({})));
    assert_eq!(filter(&pod(json!({})), &usage), vec![Unfit::TooManyPods]);
}

#[test]
fn least_allocated_spreads() {
    let (a, b) = (node("a", json!({})), node("b", json!({})));
    let mut usage = vec![NodeUsage::new(&a), NodeUsage::new(&b)];
    let p = pod(requests("500m", "512Mi"));
    let mut placed = Vec::new();
    for _ in 0..3 {
        let Decision::Bind(name) = schedule(&p, &usage) else {
            panic!("should fit");
        };
        let i = usize::from(name == "b");
        usage[i].add(&p);
        placed.push(name);
    }
    assert_eq!(placed, ["a", "b", "a"]);
}

#[test]
fn ties_go_to_the_chosen_one_of_the_best_nodes_in_name_order() {
    let (c, a, b) = (
        node("c", json!({})),
        node("a", json!({})),
        node("b", json!({"status": {"allocatable": {"cpu": "100m"}}})),
    );
    let usage = vec![NodeUsage::new(&c), NodeUsage::new(&a), NodeUsage::new(&b)];
    let p = pod(json!({}));
    let mut offered = Vec::new();
    let picked: Vec<Decision> = (0..3)
        .map(|i| {
            schedule_with(&p, &usage, |n| {
                offered.push(n);
                i
            })
        })
        .collect();
    // "b" scores lower (its small cpu), so only "a" and "c" tie; an out-of-range pick is clamped.
    assert_eq!(offered, [2, 2, 2]);
    assert_eq!(
        picked,
        [
            Decision::Bind("a".into()),
            Decision::Bind("c".into()),
            Decision::Bind("c".into())
        ]
    );
}

#[test]
fn unschedulable_message_is_worded_as_the_real_scheduler() {
    let tainted = node(
        "a",
        json!({"spec": {"taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]}}),
    );
    let small = node("b", json!({"status": {"allocatable": {"cpu": "100m"}}}));
    let usage = vec![NodeUsage::new(&tainted), NodeUsage::new(&small)];
    let Decision::Unschedulable(message) = schedule(&pod(requests("1", "1Mi")), &usage) else {
        panic!("nothing fits");
    };
    expect![[r#"0/2 nodes are available: 1 Insufficient cpu, 1 node(s) had untolerated taint {dedicated: db}. preemption: 0/2 nodes are available: 1 No preemption victims found for incoming pod, 1 Preemption is not helpful for scheduling."#]]
    .assert_eq(&message);
    assert_eq!(
        schedule(&pod(json!({})), &[]),
        Decision::Unschedulable("no nodes available to schedule pods".into())
    );
}

#[test]
fn only_unbound_default_scheduler_pods_are_scheduled() {
    assert!(wants_scheduling(&pod(json!({}))));
    assert!(!wants_scheduling(&pod(json!({"nodeName": "a"}))));
    assert!(!wants_scheduling(&pod(json!({"schedulerName": "other"}))));
    assert!(wants_scheduling(&pod(
        json!({"schedulerName": DEFAULT_SCHEDULER})
    )));
}
