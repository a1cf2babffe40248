//! Liqo's end-to-end "cruise" suites that `e2e_offloading` does not already cover,
//! re-expressed against Tether on one consumer peered with two providers (the cluster
//! selector needs a second provider to choose between): `clusterlabels` (provider labels on
//! the virtual nodes, `--selector` choosing a provider, a selector matching none),
//! `creationremotenamespace` (the twin's name under each mapping strategy, made at the
//! providers), `conflictremotenamespace` (a provider's own namespace of the same name is
//! reported per provider and left untouched), `resourceenforcement` (a pod beyond the grant
//! waits until the grant grows), `offloadingpolicies` (where Local and LocalAndRemote pods
//! land) and `unoffload` (nothing left at the providers, local pods keep running). Needs root
//! (the clusters' pods are processes in network namespaces); in CI it must run.

mod e2e;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use e2e::{Env, Sim};
use serde_json::Value;

const CONSUMER: &str = "alpha";
/// The provider every unselected namespace reaches, and the one holding the conflicting
/// namespace.
const SOUTH: &str = "beta";
/// The provider the cluster selector picks, and whose grant is grown.
const NORTH: &str = "gamma";
const REGION: &str = "topology.kubernetes.io/region";

#[test]
fn liqo_cruise_suites_on_a_consumer_of_two_providers() {
    let Some(mut env) = Env::new("cruise") else {
        return;
    };
    let a = env.up_nodes("a", 1, &[]);
    let south = env.up_nodes("s", 1, &[]);
    let north = env.up_nodes("n", 1, &[]);
    a.install(CONSUMER, &[]);
    south.install(SOUTH, &[]);
    north.install(NORTH, &[]);
    // Labels every node of a provider shares become its virtual node's labels when it grants.
    south
        .kubectl(&["label", "nodes", "--all", &format!("{REGION}=south")])
        .ok();
    north
        .kubectl(&["label", "nodes", "--all", &format!("{REGION}=north")])
        .ok();
    for (provider, id, cpu, memory, pods) in [
        (&south, SOUTH, "2", "4Gi", "20"),
        (&north, NORTH, "1", "2Gi", "10"),
    ] {
        let peer = a.tether(&[
            "peer",
            "--remote-kubeconfig",
            provider.kubeconfig(),
            "--cpu",
            cpu,
            "--memory",
            memory,
            "--pods",
            pods,
            "--timeout",
            "4m",
        ]);
        peer.ok();
        assert!(
            peer.stdout.contains(&format!("virtual node {id} is Ready")),
            "{}\n{}",
            peer.stdout,
            peer.stderr
        );
    }
    let real = real_node(&a);

    cluster_labels(&a);
    create_remote_namespaces(&a, &south, &north);
    conflicting_remote_namespace(&a, &south, &north);
    resource_enforcement(&a, &north);
    offloading_policies(&a, &south, &north, &real);
    unoffload(&a, &south, &north, &real);
}

/// Liqo `clusterlabels`: the providers' labels on their virtual nodes; a selector that
/// matches none of them is refused, and the NamespaceOffloading's status says so.
fn cluster_labels(a: &Sim) {
    for (node, region) in [(SOUTH, "south"), (NORTH, "north")] {
        assert_eq!(
            a.jsonpath(
                &["node", node],
                "{.metadata.labels.topology\\.kubernetes\\.io/region}"
            ),
            region,
            "virtual node {node}"
        );
        assert!(
            !a.jsonpath(&["node", node], "{.metadata.labels.kubernetes\\.io/arch}")
                .is_empty(),
            "virtual node {node} lacks its provider's architecture"
        );
    }

    a.kubectl(&["create", "namespace", "nowhere"]).ok();
    let selector = format!("{REGION}=mars");
    a.tether(&[
        "offload",
        "namespace",
        "nowhere",
        "--selector",
        &selector,
        "--timeout",
        "30s",
    ])
    .fails(
        4,
        &[
            "NoClusterSelected",
            "no virtual node matches the cluster selector",
        ],
    );
    a.wait(
        "the refused offloading put back",
        Duration::from_secs(20),
        || offloading(a, "nowhere") == Value::Null,
    );
    // Written by hand, the object itself carries the verdict.
    a.apply_as(
        Path::new(a.kubeconfig()),
        &format!(
            "apiVersion: offloading.tether.dev/v1alpha1
kind: NamespaceOffloading
metadata: {{name: offloading, namespace: nowhere}}
spec:
  clusterSelector: {{{REGION}: mars}}
"
        ),
    )
    .ok();
    a.wait(
        "NoClusterSelected in the status",
        Duration::from_secs(20),
        || offloading(a, "nowhere")["status"]["offloadingPhase"] == "NoClusterSelected",
    );
    let status = &offloading(a, "nowhere")["status"];
    let ready = condition(&status["conditions"], "Ready");
    assert_eq!(ready["status"], "False", "{status}");
    assert_eq!(ready["reason"], "NoClusterSelected", "{status}");
    assert!(
        ready["message"]
            .as_str()
            .is_some_and(|m| m.contains("no virtual node matches the cluster selector")),
        "{status}"
    );
    assert!(
        status["remoteNamespacesConditions"]
            .as_object()
            .is_none_or(|m| m.is_empty()),
        "no provider is asked: {status}"
    );
    a.kubectl(&[
        "delete",
        "namespaceoffloadings.offloading.tether.dev",
        "-n",
        "nowhere",
        "offloading",
        "--timeout=30s",
    ])
    .ok();
}

/// Liqo `creationremotenamespace` (and `clusterlabels`' selection): the twin is named by the
/// mapping strategy and exists, bound to the consumer, at every selected provider and only
/// there.
fn create_remote_namespaces(a: &Sim, south: &Sim, north: &Sim) {
    for ns in ["spread", "same", "chosen"] {
        a.kubectl(&["create", "namespace", ns]).ok();
    }
    let default = a.tether(&["offload", "namespace", "spread", "--timeout", "90s"]);
    default.ok();
    let twin = format!("spread-{CONSUMER}");
    assert!(
        default
            .stdout
            .contains(&format!("offloaded to {SOUTH}, {NORTH} as {twin}")),
        "{}",
        default.stdout
    );
    a.tether(&[
        "offload",
        "namespace",
        "same",
        "--namespace-mapping-strategy",
        "EnforceSameName",
        "--pod-offloading-strategy",
        "Local",
        "--timeout",
        "90s",
    ])
    .ok();
    let selector = format!("{REGION}=north");
    let chosen = a.tether(&[
        "offload",
        "namespace",
        "chosen",
        "--namespace-mapping-strategy",
        "SelectedName",
        "--remote-namespace-name",
        "elsewhere",
        "--pod-offloading-strategy",
        "Remote",
        "--selector",
        &selector,
        "--timeout",
        "90s",
    ]);
    chosen.ok();
    assert!(
        chosen
            .stdout
            .contains(&format!("offloaded to {NORTH} as elsewhere")),
        "{}",
        chosen.stdout
    );

    for (origin, twin, at) in [
        (
            "spread",
            twin.as_str(),
            vec![(south, SOUTH), (north, NORTH)],
        ),
        ("same", "same", vec![(south, SOUTH), (north, NORTH)]),
        ("chosen", "elsewhere", vec![(north, NORTH)]),
    ] {
        let status = &offloading(a, origin)["status"];
        assert_eq!(status["remoteNamespaceName"], twin, "{origin}: {status}");
        assert_eq!(status["offloadingPhase"], "Ready", "{origin}: {status}");
        let providers: Vec<&str> = status["remoteNamespacesConditions"]
            .as_object()
            .map(|m| m.keys().map(String::as_str).collect())
            .unwrap_or_default();
        let wanted: Vec<&str> = at.iter().map(|(_, id)| *id).collect();
        assert_eq!(providers, wanted, "{origin} is offloaded to exactly these");
        for (p, _) in &at {
            let labels = |key: &str| {
                p.jsonpath(
                    &["namespace", twin],
                    &format!("{{.metadata.labels.{}}}", key.replace('.', "\\.")),
                )
            };
            assert_eq!(labels("tether.dev/remote-cluster-id"), CONSUMER, "{twin}");
            assert_eq!(labels("tether.dev/origin-namespace"), origin, "{twin}");
            assert!(
                !p.jsonpath(
                    &["rolebinding", "-n", twin, "tether-tenant"],
                    "{.subjects[0].name}"
                )
                .is_empty(),
                "the consumer is bound in {twin}"
            );
        }
    }
    // The provider the selector leaves out has no twin of `chosen` under any name.
    for name in ["elsewhere", "chosen", "chosen-alpha"] {
        assert_eq!(
            south.jsonpath(&["namespace", name], "{.metadata.name}"),
            "",
            "{SOUTH} was not selected"
        );
    }
}

/// Liqo `conflictremotenamespace`: EnforceSameName where one provider already has a
/// namespace of that name of its own. The refusal is reported for that provider alone, the
/// other provider serves the namespace, and the provider's namespace and its objects are
/// never touched, not even by unoffloading.
fn conflicting_remote_namespace(a: &Sim, south: &Sim, north: &Sim) {
    south.kubectl(&["create", "namespace", "clash"]).ok();
    south
        .kubectl(&["label", "namespace", "clash", "team=theirs"])
        .ok();
    south
        .kubectl(&[
            "create",
            "configmap",
            "-n",
            "clash",
            "theirs",
            "--from-literal=owner=south",
        ])
        .ok();
    let theirs = || {
        (
            south.jsonpath(
                &["namespace", "clash"],
                "{.metadata.uid} {.metadata.resourceVersion} {.metadata.labels}",
            ),
            south.jsonpath(
                &["configmaps", "-n", "clash"],
                "{range .items[*]}{.metadata.name}@{.metadata.resourceVersion} {end}",
            ),
            south.jsonpath(
                &["rolebindings", "-n", "clash"],
                "{.items[*].metadata.name}",
            ),
        )
    };
    let before = theirs();
    assert!(before.1.contains("theirs@"), "{before:?}");

    a.kubectl(&["create", "namespace", "clash"]).ok();
    let run = a.tether(&[
        "offload",
        "namespace",
        "clash",
        "--namespace-mapping-strategy",
        "EnforceSameName",
        "--timeout",
        "60s",
    ]);
    run.fails(
        4,
        &[
            "SomeFailed",
            &format!("{SOUTH}: NamespaceTaken: namespace clash already exists"),
            "SelectedName",
        ],
    );
    assert!(
        !run.stderr.contains(&format!("{SOUTH}: {SOUTH}:"))
            && !run.stderr.contains(&format!("NamespaceTaken: {SOUTH}")),
        "the refusal names its provider once: {}",
        run.stderr
    );
    a.wait(
        "the refused offloading put back",
        Duration::from_secs(45),
        || offloading(a, "clash") == Value::Null,
    );
    let request = format!("tether-tenant-{CONSUMER}");
    north.wait(
        "the put-back offloading withdrawn from both providers",
        Duration::from_secs(30),
        || {
            north
                .jsonpath(&["namespace", "clash"], "{.metadata.name}")
                .is_empty()
                && south
                    .jsonpath(
                        &["namespaceoffloadings", "-n", &request, "clash"],
                        "{.metadata.name}",
                    )
                    .is_empty()
        },
    );
    assert_eq!(
        theirs(),
        before,
        "unoffloading touched the provider's namespace"
    );

    // Kept in place (written by hand), the per-provider verdicts stay in the status.
    a.apply_as(
        Path::new(a.kubeconfig()),
        "apiVersion: offloading.tether.dev/v1alpha1
kind: NamespaceOffloading
metadata: {name: offloading, namespace: clash}
spec: {namespaceMappingStrategy: EnforceSameName}
",
    )
    .ok();
    // SomeFailed shows as soon as one provider refuses; the other may still be making its twin.
    a.wait(
        "SomeFailed, with the other provider's twin made",
        Duration::from_secs(30),
        || {
            let status = &offloading(a, "clash")["status"];
            status["offloadingPhase"] == "SomeFailed"
                && condition(&status["remoteNamespacesConditions"][NORTH], "Ready")["status"]
                    == "True"
        },
    );
    let status = offloading(a, "clash")["status"].clone();
    let per = &status["remoteNamespacesConditions"];
    let refused = condition(&per[SOUTH], "Ready");
    assert_eq!(refused["status"], "False", "{status}");
    assert_eq!(refused["reason"], "NamespaceTaken", "{status}");
    let message = refused["message"].as_str().unwrap_or_default();
    assert!(
        !message.starts_with(SOUTH)
            && message.contains("namespace clash already exists")
            && message.contains(&format!("not the twin of {CONSUMER}'s namespace clash"))
            && message.contains("SelectedName"),
        "{message}"
    );
    assert_eq!(
        condition(&per[NORTH], "Ready")["status"],
        "True",
        "{status}"
    );
    assert_eq!(
        condition(&status["conditions"], "Ready")["reason"],
        "SomeFailed",
        "{status}"
    );
    assert_eq!(
        north.jsonpath(
            &["namespace", "clash"],
            "{.metadata.labels.tether\\.dev/remote-cluster-id}"
        ),
        CONSUMER
    );

    // Reflection reaches the provider that made the twin, never the one that refused.
    a.kubectl(&[
        "create",
        "configmap",
        "-n",
        "clash",
        "ours",
        "--from-literal=owner=alpha",
    ])
    .ok();
    north.wait(
        "the ConfigMap reflected where the twin is",
        Duration::from_secs(30),
        || north.jsonpath(&["configmap", "-n", "clash", "ours"], "{.data.owner}") == "alpha",
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(theirs(), before, "the provider's own namespace changed");

    // Once the provider's admin frees the name, the refused twin is made after all: the
    // refusal is looked at again although nothing about the request changed.
    south
        .kubectl(&["delete", "namespace", "clash", "--timeout=60s"])
        .ok();
    a.wait(
        "the offloading Ready at both providers",
        Duration::from_secs(45),
        || offloading(a, "clash")["status"]["offloadingPhase"] == "Ready",
    );
    assert_eq!(
        south.jsonpath(
            &["namespace", "clash"],
            "{.metadata.labels.tether\\.dev/remote-cluster-id}"
        ),
        CONSUMER
    );
    south.wait(
        "the ConfigMap reflected into the new twin",
        Duration::from_secs(30),
        || south.jsonpath(&["configmap", "-n", "clash", "ours"], "{.data.owner}") == "alpha",
    );
    a.tether(&["unoffload", "namespace", "clash", "--timeout", "90s"])
        .ok();
    for p in [south, north] {
        assert_eq!(
            p.jsonpath(&["namespace", "clash"], "{.metadata.name}"),
            "",
            "the twin at {} goes",
            p.name
        );
    }
}

/// Liqo `resourceenforcement`: pods within the grant run; one beyond it stays Pending with
/// the reason, and runs once `tether offload resources add` grows the grant. `chosen` is
/// Remote and selects the north provider only, whose grant (1 CPU) nothing else uses yet.
fn resource_enforcement(a: &Sim, north: &Sim) {
    let kc = Path::new(a.kubeconfig());
    a.apply_as(kc, &e2e::echo_deployment("chosen", "work", 3, Some("300m")))
        .ok();
    a.wait(
        "three pods Running at north",
        Duration::from_secs(90),
        || {
            let p = pods(a, "chosen", "work");
            p.len() == 3 && p.iter().all(|p| p.phase == "Running" && p.node == NORTH)
        },
    );
    assert_eq!(pods(north, "elsewhere", "work").len(), 3);

    a.kubectl(&[
        "scale",
        "deployment",
        "-n",
        "chosen",
        "work",
        "--replicas=4",
    ])
    .ok();
    let mut pending = String::new();
    a.wait(
        "the fourth pod Pending on the grant",
        Duration::from_secs(30),
        || {
            let p = pods(a, "chosen", "work");
            match p.iter().find(|p| p.phase == "Pending") {
                Some(w) if p.len() == 4 => {
                    pending.clone_from(&w.name);
                    true
                }
                _ => false,
            }
        },
    );
    let why = || {
        a.jsonpath(
            &["pod", "-n", "chosen", &pending],
            "{.status.conditions[?(@.type==\"PodScheduled\")].message}",
        )
    };
    a.wait("the scheduler's reason", Duration::from_secs(15), || {
        why().contains("Insufficient cpu")
    });
    // It stays so: no other node may take it, and nothing of it reaches the provider.
    std::thread::sleep(Duration::from_secs(3));
    let p = pods(a, "chosen", "work");
    let waiting = p.iter().find(|p| p.name == pending).expect("still there");
    assert_eq!(
        (waiting.phase.as_str(), waiting.node.as_str()),
        ("Pending", "")
    );
    assert_eq!(pods(north, "elsewhere", "work").len(), 3);

    a.tether(&[
        "offload",
        "resources",
        "add",
        NORTH,
        "--cpu",
        "2",
        "--memory",
        "2Gi",
        "--pods",
        "10",
        "--timeout",
        "90s",
    ])
    .ok();
    assert_eq!(a.jsonpath(&["node", NORTH], "{.status.capacity.cpu}"), "2");
    a.wait(
        "the waiting pod Running at north",
        Duration::from_secs(60),
        || {
            pods(a, "chosen", "work")
                .iter()
                .any(|p| p.name == pending && p.phase == "Running" && p.node == NORTH)
        },
    );
    assert!(
        pods(north, "elsewhere", "work")
            .iter()
            .any(|p| p.name == pending && p.phase == "Running"),
        "the provider runs {pending}"
    );
    a.kubectl(&["delete", "deployment", "-n", "chosen", "work"])
        .ok();
}

/// Liqo `offloadingpolicies`: a Local namespace's pods never go to a virtual node although
/// it has twins; a LocalAndRemote namespace's Deployment spreads over the real node and the
/// virtual nodes, and each pod on a virtual node runs at that node's provider.
fn offloading_policies(a: &Sim, south: &Sim, north: &Sim, real: &str) {
    let kc = Path::new(a.kubeconfig());
    a.apply_as(kc, &e2e::echo_deployment("same", "local", 3, None))
        .ok();
    a.apply_as(kc, &e2e::echo_deployment("spread", "web", 6, Some("250m")))
        .ok();
    a.wait("the Local pods Running", Duration::from_secs(90), || {
        let p = pods(a, "same", "local");
        p.len() == 3 && p.iter().all(|p| p.phase == "Running")
    });
    for p in pods(a, "same", "local") {
        assert_eq!(p.node, real, "Local pod {} left the real node", p.name);
    }
    assert_eq!(
        a.jsonpath(
            &["namespace", "same"],
            "{.metadata.labels.tether\\.dev/offloading-enabled}"
        ),
        "",
        "the pod webhook leaves a Local namespace alone"
    );
    for p in [south, north] {
        assert!(pods(p, "same", "local").is_empty(), "{}", p.name);
    }

    a.wait(
        "the LocalAndRemote pods Running",
        Duration::from_secs(120),
        || {
            let p = pods(a, "spread", "web");
            p.len() == 6 && p.iter().all(|p| p.phase == "Running")
        },
    );
    let placed = pods(a, "spread", "web");
    let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
    for p in &placed {
        *per_node.entry(p.node.as_str()).or_default() += 1;
    }
    println!("LocalAndRemote Deployment of 6: {per_node:?}");
    assert!(
        per_node.contains_key(real),
        "none on the real node: {per_node:?}"
    );
    assert!(
        per_node.contains_key(SOUTH) || per_node.contains_key(NORTH),
        "none on a virtual node: {per_node:?}"
    );
    let twin = format!("spread-{CONSUMER}");
    for (provider, id) in [(south, SOUTH), (north, NORTH)] {
        let mut there: Vec<String> = pods(provider, &twin, "web")
            .into_iter()
            .map(|p| p.name)
            .collect();
        there.sort();
        let mut expected: Vec<String> = placed
            .iter()
            .filter(|p| p.node == id)
            .map(|p| p.name.clone())
            .collect();
        expected.sort();
        assert_eq!(there, expected, "the pods {id} runs");
    }
}

/// Liqo `unoffload`: after `tether unoffload namespace`, the providers hold nothing of the
/// namespace (twin, reflected ConfigMap, Secret and Service, pods), the pods on the real
/// node kept running untouched, and the offloaded ones came back here.
fn unoffload(a: &Sim, south: &Sim, north: &Sim, real: &str) {
    let kc = Path::new(a.kubeconfig());
    a.kubectl(&[
        "create",
        "configmap",
        "-n",
        "spread",
        "settings",
        "--from-literal=mode=one",
    ])
    .ok();
    a.kubectl(&[
        "create",
        "secret",
        "generic",
        "-n",
        "spread",
        "creds",
        "--from-literal=pw=s3",
    ])
    .ok();
    a.apply_as(
        kc,
        "apiVersion: v1
kind: Service
metadata: {name: web, namespace: spread}
spec:
  selector: {app: web}
  ports:
  - {name: echo, port: 7000, targetPort: 7000}
",
    )
    .ok();
    let twin = format!("spread-{CONSUMER}");
    let reflected = |p: &Sim| {
        p.jsonpath(&["configmap", "-n", &twin, "settings"], "{.data.mode}") == "one"
            && !p
                .jsonpath(&["secret", "-n", &twin, "creds"], "{.metadata.name}")
                .is_empty()
            && !p
                .jsonpath(&["service", "-n", &twin, "web"], "{.spec.clusterIP}")
                .is_empty()
    };
    a.wait(
        "ConfigMap, Secret and Service in both twins",
        Duration::from_secs(30),
        || reflected(south) && reflected(north),
    );
    let before = pods(a, "spread", "web");
    let stayed: BTreeMap<String, String> = before
        .iter()
        .filter(|p| p.node == real)
        .map(|p| (p.name.clone(), p.uid.clone()))
        .collect();
    let offloaded: Vec<String> = before
        .iter()
        .filter(|p| p.node != real)
        .map(|p| p.name.clone())
        .collect();

    let run = a.tether(&["unoffload", "namespace", "spread", "--timeout", "90s"]);
    run.ok();
    for p in [south, north] {
        assert_eq!(
            p.jsonpath(&["namespace", &twin], "{.metadata.name}"),
            "",
            "the twin at {}",
            p.name
        );
        let left = p.jsonpath(
            &["pods,shadowpods,configmaps,secrets,services", "-A"],
            "{range .items[*]}{.metadata.namespace}/{.metadata.name} {end}",
        );
        for obj in left.split_whitespace() {
            let (ns, name) = obj.split_once('/').unwrap_or_default();
            assert!(
                ns != twin
                    && !offloaded.iter().any(|o| o == name)
                    && !["settings", "creds", "web"].contains(&name),
                "{obj} is left at {}",
                p.name
            );
        }
    }
    // Here: the pods on the real node are the very same, still Running; the Deployment is
    // whole again on this cluster's node; what reflection copied is still here.
    let after = pods(a, "spread", "web");
    for (name, uid) in &stayed {
        let p = after
            .iter()
            .find(|p| &p.name == name)
            .unwrap_or_else(|| panic!("local pod {name} went: {after:?}"));
        assert_eq!(
            (&p.uid, p.phase.as_str()),
            (uid, "Running"),
            "local pod {name}"
        );
    }
    a.wait(
        "the Deployment whole on the real node",
        Duration::from_secs(90),
        || {
            let p = pods(a, "spread", "web");
            p.len() == 6 && p.iter().all(|p| p.phase == "Running" && p.node == real)
        },
    );
    assert_eq!(
        a.jsonpath(
            &["namespace", "spread"],
            "{.metadata.labels.tether\\.dev/offloading-enabled}"
        ),
        ""
    );
    assert_eq!(
        a.jsonpath(&["configmap", "-n", "spread", "settings"], "{.data.mode}"),
        "one"
    );
    assert!(
        !a.jsonpath(&["service", "-n", "spread", "web"], "{.spec.clusterIP}")
            .is_empty()
    );
}

/// A pod as seen by `kubectl get`: where it is and how it is.
#[derive(Debug, Clone)]
struct Placed {
    name: String,
    node: String,
    phase: String,
    uid: String,
}

/// The pods labelled `app=<app>` in `ns`, those being deleted left out.
fn pods(sim: &Sim, ns: &str, app: &str) -> Vec<Placed> {
    sim.jsonpath(
        &["pods", "-n", ns, "-l", &format!("app={app}")],
        r#"{range .items[*]}{.metadata.name}|{.spec.nodeName}|{.status.phase}|{.metadata.uid}|{.metadata.deletionTimestamp}{"\n"}{end}"#,
    )
    .lines()
    .filter_map(|l| {
        let f: Vec<&str> = l.split('|').collect();
        (f.len() == 5 && f[4].is_empty()).then(|| Placed {
            name: f[0].to_owned(),
            node: f[1].to_owned(),
            phase: f[2].to_owned(),
            uid: f[3].to_owned(),
        })
    })
    .collect()
}

/// The NamespaceOffloading of `ns` as JSON; `Null` when there is none.
fn offloading(sim: &Sim, ns: &str) -> Value {
    let run = sim.kubectl(&[
        "get",
        "namespaceoffloadings.offloading.tether.dev",
        "-n",
        ns,
        "offloading",
        "-o",
        "json",
        "--ignore-not-found",
    ]);
    run.ok();
    if run.stdout.trim().is_empty() {
        return Value::Null;
    }
    serde_json::from_str(&run.stdout).expect("NamespaceOffloading as JSON")
}

/// The condition of `type_` in a list of conditions (`Null` when absent).
fn condition<'a>(list: &'a Value, type_: &str) -> &'a Value {
    list.as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .unwrap_or(&Value::Null)
}

/// The consumer's one real node.
fn real_node(a: &Sim) -> String {
    let real: Vec<String> = e2e::net::nodes(a)
        .into_iter()
        .filter(|n| n != SOUTH && n != NORTH)
        .collect();
    assert_eq!(real.len(), 1, "one real node: {real:?}");
    real[0].clone()
}
