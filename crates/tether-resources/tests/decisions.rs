//! Snapshots of the provider's answers (`UPDATE_EXPECT=1` rewrites): capacity from node facts,
//! `decide` on requests, a pod's effective requests and `admit` under each enforcement mode.

use std::collections::BTreeMap;

use expect_test::expect;
use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use tether_resources::{
    Admission, Amount, Decision, Enforcement, NodeFacts, Resources, admit, capacity, decide,
    pod_requests,
};

/// `"cpu=2 memory=4Gi"` as a Kubernetes resource list.
fn list(spec: &str) -> BTreeMap<String, Quantity> {
    spec.split_whitespace()
        .map(|pair| {
            let (name, value) = pair.split_once('=').expect("name=value");
            (name.to_owned(), Quantity(value.to_owned()))
        })
        .collect()
}

fn res(spec: &str) -> Resources {
    Resources::from_quantities(&list(spec)).expect("valid quantities")
}

fn node(name: &str, allocatable: &str) -> NodeFacts {
    NodeFacts {
        name: name.to_owned(),
        allocatable: list(allocatable),
        ready: true,
        unschedulable: false,
        virtual_node: false,
    }
}

/// A container with `requests` and `limits` given as `list` specs; `-` means the map is unset.
fn container(name: &str, requests: &str, limits: &str) -> Container {
    let map = |spec: &str| (spec != "-").then(|| list(spec));
    Container {
        name: name.to_owned(),
        resources: Some(ResourceRequirements {
            requests: map(requests),
            limits: map(limits),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn sidecar(name: &str, requests: &str, limits: &str) -> Container {
    Container {
        restart_policy: Some("Always".to_owned()),
        ..container(name, requests, limits)
    }
}

fn pod(containers: Vec<Container>, init: Vec<Container>) -> PodSpec {
    PodSpec {
        containers,
        init_containers: (!init.is_empty()).then_some(init),
        ..Default::default()
    }
}

fn show_decision(decision: &Decision) -> String {
    match decision {
        Decision::Accept { grant } => format!("Accept {grant}"),
        Decision::Deny { reason, message } => format!("Deny {}: {message}", reason.as_str()),
    }
}

fn show_admission(admission: &Admission) -> String {
    match admission {
        Admission::Allow => "Allow".to_owned(),
        Admission::Deny { reason, message } => format!("Deny {reason}: {message}"),
    }
}

#[test]
fn capacity_counts_only_ready_schedulable_physical_nodes() {
    let mut nodes = vec![
        node("a", "cpu=4 memory=8Gi pods=110"),
        node("b", "cpu=3500m memory=4Gi pods=110 nvidia.com/gpu=1"),
        NodeFacts {
            ready: false,
            ..node("not-ready", "cpu=64 memory=1Ti pods=110")
        },
        NodeFacts {
            unschedulable: true,
            ..node("cordoned", "cpu=64 memory=1Ti pods=110")
        },
        NodeFacts {
            virtual_node: true,
            ..node("tether-peer", "cpu=64 memory=1Ti pods=110")
        },
    ];
    let total = capacity(&nodes).expect("all quantities valid");
    expect!["cpu=7500m, memory=12Gi, nvidia.com/gpu=1, pods=220"].assert_eq(&total.to_string());

    // A bad quantity on an excluded node does not matter; on a counted one it is named.
    nodes[2].allocatable = list("cpu=lots");
    assert_eq!(capacity(&nodes), Ok(total));
    nodes[1].allocatable = list("cpu=4 memory=4GB");
    let error = capacity(&nodes).expect_err("bad memory on a counted node");
    expect![[r#"node "b": allocatable "memory": "4GB" is not a quantity: unknown suffix "GB"; use a number with a suffix such as 500m, 2, 4Gi; fix the node status or cordon the node"#]]
        .assert_eq(&error.to_string());
}

#[test]
fn resources_round_trip_canonically_and_name_bad_entries() {
    let r = res("cpu=1000m memory=4096Mi pods=110 ephemeral-storage=10G");
    expect![[r#"{"cpu": Quantity("1"), "ephemeral-storage": Quantity("10G"), "memory": Quantity("4Gi"), "pods": Quantity("110")}"#]]
        .assert_eq(&format!("{:?}", r.to_quantities()));
    assert_eq!(
        Resources::from_quantities(&r.to_quantities()),
        Ok(r.clone())
    );
    assert_eq!(r.get("memory"), Amount(4 * 1024 * 1024 * 1024 * 1000));
    assert_eq!(r.get("nvidia.com/gpu"), Amount(0));
    assert!(!r.is_empty());
    assert!(res("cpu=0 memory=-1").is_empty());
    assert!(Resources::default().is_empty());
    expect!["none"].assert_eq(&Resources::default().to_string());

    let mut total = res("cpu=1 memory=1Gi");
    total.add(&res("cpu=500m pods=2"));
    expect!["cpu=1500m, memory=1Gi, pods=2"].assert_eq(&total.to_string());

    let error = Resources::from_quantities(&list("cpu=1 memory=lots")).expect_err("bad memory");
    expect![[r#"resource "memory": "lots" is not a quantity: it does not start with a number; use a number with a suffix such as 500m, 2, 4Gi"#]]
        .assert_eq(&error.to_string());
}

#[test]
fn decide_grants_all_or_nothing_and_explains_denials() {
    let capacity = res("cpu=4 memory=8Gi pods=110");
    let others = res("cpu=500m memory=6Gi");
    let cases = [
        "cpu=2 memory=1Gi",
        "cpu=3500m memory=2Gi pods=110",
        "cpu=2 memory=0 pods=0",
        "",
        "cpu=0 memory=0",
        "cpu=-1 memory=1Gi pods=-2",
        "cpu=-1",
        "cpu=1 nvidia.com/gpu=1 example.com/fpga=2",
        "cpu=8",
        "cpu=8 memory=4Gi pods=111",
        "cpu=3501m",
    ];
    let table: String = cases
        .iter()
        .map(|case| {
            format!(
                "{case:?}: {}\n",
                show_decision(&decide(&res(case), &capacity, &others))
            )
        })
        .collect();
    expect![[r#"
        "cpu=2 memory=1Gi": Accept cpu=2, memory=1Gi
        "cpu=3500m memory=2Gi pods=110": Accept cpu=3500m, memory=2Gi, pods=110
        "cpu=2 memory=0 pods=0": Accept cpu=2
        "": Deny EmptyRequest: the request asks for nothing; ask for at least one of cpu, memory, pods
        "cpu=0 memory=0": Deny EmptyRequest: the request asks for nothing; ask for at least one of cpu, memory, pods
        "cpu=-1 memory=1Gi pods=-2": Deny InvalidRequest: the request has negative amounts (cpu=-1, pods=-2); ask for positive amounts only
        "cpu=-1": Deny InvalidRequest: the request has negative amounts (cpu=-1); ask for positive amounts only
        "cpu=1 nvidia.com/gpu=1 example.com/fpga=2": Deny UnknownResource: the provider has no example.com/fpga, nvidia.com/gpu; it offers cpu, memory, pods
        "cpu=8": Deny Insufficient: cpu: asked 8, free 3500m (allocatable 4, granted to other consumers 500m)
        "cpu=8 memory=4Gi pods=111": Deny Insufficient: cpu: asked 8, free 3500m (allocatable 4, granted to other consumers 500m); memory: asked 4Gi, free 2Gi (allocatable 8Gi, granted to other consumers 6Gi); pods: asked 111, free 110 (allocatable 110, granted to other consumers 0)
        "cpu=3501m": Deny Insufficient: cpu: asked 3501m, free 3500m (allocatable 4, granted to other consumers 500m)
    "#]]
    .assert_eq(&table);

    // Over-granted (capacity shrank below the grants): free is zero, never negative.
    let shrunk = decide(&res("cpu=1"), &res("cpu=2"), &res("cpu=3"));
    expect![
        "Deny Insufficient: cpu: asked 1, free 0 (allocatable 2, granted to other consumers 3)"
    ]
    .assert_eq(&show_decision(&shrunk));
    let nothing = decide(&res("cpu=1"), &Resources::default(), &Resources::default());
    expect!["Deny UnknownResource: the provider has no cpu; it offers nothing"]
        .assert_eq(&show_decision(&nothing));
}

#[test]
fn pod_requests_follow_the_scheduler() {
    let cases = [
        (
            "no resources",
            pod(vec![container("app", "-", "-")], vec![]),
        ),
        (
            "containers add up",
            pod(
                vec![
                    container("app", "cpu=500m memory=1Gi", "-"),
                    container("log", "cpu=100m memory=128Mi", "-"),
                ],
                vec![],
            ),
        ),
        (
            "a limit without a request counts as the request",
            pod(
                vec![container("app", "cpu=250m", "cpu=1 memory=512Mi")],
                vec![],
            ),
        ),
        (
            "a large init container sets the floor",
            pod(
                vec![container("app", "cpu=500m memory=1Gi", "-")],
                vec![
                    container("migrate", "cpu=2 memory=256Mi", "-"),
                    container("warm", "cpu=1 memory=3Gi", "-"),
                ],
            ),
        ),
        (
            "sidecars run with the app and with later init containers",
            pod(
                vec![container("app", "cpu=1 memory=1Gi", "-")],
                vec![
                    container("before", "cpu=2", "-"),
                    sidecar("proxy", "cpu=500m memory=64Mi", "-"),
                    container("after", "cpu=2 memory=128Mi", "-"),
                ],
            ),
        ),
        (
            "overhead on top",
            PodSpec {
                overhead: Some(list("cpu=250m memory=120Mi")),
                ..pod(vec![container("app", "cpu=1 memory=1Gi", "-")], vec![])
            },
        ),
    ];
    let table: String = cases
        .iter()
        .map(|(name, spec)| {
            format!(
                "{name}: {}\n",
                pod_requests(spec).expect("valid quantities")
            )
        })
        .collect();
    expect![[r#"
        no resources: pods=1
        containers add up: cpu=600m, memory=1152Mi, pods=1
        a limit without a request counts as the request: cpu=250m, memory=512Mi, pods=1
        a large init container sets the floor: cpu=2, memory=3Gi, pods=1
        sidecars run with the app and with later init containers: cpu=2500m, memory=1088Mi, pods=1
        overhead on top: cpu=1250m, memory=1144Mi, pods=1
    "#]]
    .assert_eq(&table);

    let bad = pod(
        vec![container("app", "cpu=1", "-")],
        vec![container("setup", "cpu=1", "memory=1GB")],
    );
    expect![[r#"init container "setup" limits["memory"]: "1GB" is not a quantity: unknown suffix "GB"; use a number with a suffix such as 500m, 2, 4Gi"#]]
        .assert_eq(&pod_requests(&bad).expect_err("bad limit").to_string());
}

#[test]
fn admit_under_each_enforcement_mode() {
    let grant = res("cpu=2 memory=4Gi pods=10");
    let in_use = res("cpu=1500m memory=1Gi pods=3");
    let cases = [
        (
            "fits, limits equal",
            pod(
                vec![container(
                    "app",
                    "cpu=500m memory=1Gi",
                    "cpu=500m memory=1Gi",
                )],
                vec![],
            ),
        ),
        (
            "fits, limits only (requests defaulted from them)",
            pod(vec![container("app", "-", "cpu=0.5 memory=1024Mi")], vec![]),
        ),
        (
            "fits, no limits",
            pod(vec![container("app", "cpu=500m memory=1Gi", "-")], vec![]),
        ),
        (
            "limits above requests",
            pod(
                vec![container("app", "cpu=100m memory=1Gi", "cpu=1 memory=2Gi")],
                vec![],
            ),
        ),
        (
            "missing requests",
            pod(
                vec![
                    container("app", "cpu=100m", "-"),
                    container("log", "-", "-"),
                ],
                vec![container("setup", "memory=1Mi", "memory=1Mi")],
            ),
        ),
        (
            "over the grant",
            pod(
                vec![container(
                    "app",
                    "cpu=600m memory=4Gi",
                    "cpu=600m memory=4Gi",
                )],
                vec![],
            ),
        ),
        (
            "an extended resource outside the grant is not counted",
            pod(
                vec![container(
                    "app",
                    "cpu=100m memory=1Gi example.com/fpga=1",
                    "cpu=100m memory=1Gi",
                )],
                vec![],
            ),
        ),
        (
            "unreadable quantity",
            pod(vec![container("app", "cpu=1x memory=1Gi", "-")], vec![]),
        ),
    ];
    let mut table = String::new();
    for (name, spec) in &cases {
        table.push_str(&format!("{name}:\n"));
        for mode in [Enforcement::None, Enforcement::Soft, Enforcement::Hard] {
            let answer = admit(spec, &in_use, &grant, mode);
            table.push_str(&format!("  {mode}: {}\n", show_admission(&answer)));
        }
    }
    expect![[r#"
        fits, limits equal:
          none: Allow
          soft: Allow
          hard: Allow
        fits, limits only (requests defaulted from them):
          none: Allow
          soft: Allow
          hard: Allow
        fits, no limits:
          none: Allow
          soft: Allow
          hard: Deny LimitsNotEqualRequests: container "app": cpu limit unset (request 500m), memory limit unset (request 1Gi); with hard enforcement every container's limits must equal its requests for cpu and memory
        limits above requests:
          none: Allow
          soft: Allow
          hard: Deny LimitsNotEqualRequests: container "app": cpu limit 1 != request 100m, memory limit 2Gi != request 1Gi; with hard enforcement every container's limits must equal its requests for cpu and memory
        missing requests:
          none: Allow
          soft: Deny MissingRequests: init container "setup" does not request cpu; container "app" does not request memory; container "log" does not request cpu, memory; with soft enforcement every container must set resources.requests for cpu and memory
          hard: Deny MissingRequests: init container "setup" does not request cpu; container "app" does not request memory; container "log" does not request cpu, memory; with hard enforcement every container must set resources.requests for cpu and memory
        over the grant:
          none: Allow
          soft: Deny QuotaExceeded: cpu: asked 600m, in use 1500m, granted 2; memory: asked 4Gi, in use 1Gi, granted 4Gi; wait for the consumer's pods to finish or ask the provider for a larger grant
          hard: Deny QuotaExceeded: cpu: asked 600m, in use 1500m, granted 2; memory: asked 4Gi, in use 1Gi, granted 4Gi; wait for the consumer's pods to finish or ask the provider for a larger grant
        an extended resource outside the grant is not counted:
          none: Allow
          soft: Allow
          hard: Allow
        unreadable quantity:
          none: Allow
          soft: Deny InvalidQuantity: container "app" requests["cpu"]: "1x" is not a quantity: unknown suffix "x"; use a number with a suffix such as 500m, 2, 4Gi; fix the pod's resources
          hard: Deny InvalidQuantity: container "app" requests["cpu"]: "1x" is not a quantity: unknown suffix "x"; use a number with a suffix such as 500m, 2, 4Gi; fix the pod's resources
    "#]]
    .assert_eq(&table);

    // The pod count is part of the quota: the eleventh pod is refused even when it is tiny.
    let full = res("cpu=100m memory=100Mi pods=10");
    let tiny = pod(
        vec![container("app", "cpu=1m memory=1Mi", "cpu=1m memory=1Mi")],
        vec![],
    );
    expect!["Deny QuotaExceeded: pods: asked 1, in use 10, granted 10; wait for the consumer's pods to finish or ask the provider for a larger grant"]
        .assert_eq(&show_admission(&admit(&tiny, &full, &grant, Enforcement::Hard)));
    // Exactly filling the grant is allowed.
    let edge = res("cpu=1500m memory=3Gi pods=9");
    let rest = pod(
        vec![container(
            "app",
            "cpu=500m memory=1Gi",
            "cpu=500m memory=1Gi",
        )],
        vec![],
    );
    assert_eq!(
        admit(&rest, &edge, &grant, Enforcement::Hard),
        Admission::Allow
    );
}

#[test]
fn enforcement_parses_case_insensitively_and_lists_the_choices() {
    for (text, mode) in [
        ("none", Enforcement::None),
        ("Soft", Enforcement::Soft),
        ("HARD", Enforcement::Hard),
    ] {
        assert_eq!(text.parse::<Enforcement>(), Ok(mode));
        assert_eq!(mode.to_string(), text.to_ascii_lowercase());
    }
    assert_eq!(Enforcement::default(), Enforcement::None);
    expect![[r#""strict" is not a resource enforcement mode; use one of none, soft, hard"#]]
        .assert_eq(
            &"strict"
                .parse::<Enforcement>()
                .expect_err("unknown")
                .to_string(),
        );
}
