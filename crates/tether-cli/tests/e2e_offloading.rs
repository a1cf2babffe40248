//! Issue #11's resource negotiation and virtual nodes end to end, on one pair of simulated
//! clusters: `tether peer --cpu/--memory/--pods` ends with a Ready virtual node carrying the
//! grant; a request beyond the provider's capacity is refused with the reason and leaves
//! nothing behind; a second request to the same provider is a second virtual node, and
//! withdrawing it removes it on both sides; with the provider's API server frozen the virtual
//! node turns NotReady within 10 s, offloaded pods keep serving, and once it is back it is Ready
//! again with no pod duplicated or lost; pods of an offloaded namespace bound
//! to the virtual node run in the provider's twin namespace, answer at their address in the
//! consumer's view, are replaced and deleted both ways, and stay Pending with the reason when
//! they exceed the grant (the consumer's scheduler) or the provider refuses them (its
//! enforcement); the pod webhook places pods of a Remote namespace there and no other pod goes
//! there; an offloaded pod reaches the consumer's API server with its own ServiceAccount and
//! the consumer's RBAC decides; unoffloading and unpeering remove every node, slice, lease,
//! twin and pod. Needs root (the clusters' pods are processes in network namespaces); in CI it
//! must run.

mod e2e;

use std::process::Command;
use std::time::{Duration, Instant};

use e2e::net::{nodes, remapped, talk, view_of};
use e2e::{Env, Sim};

const CONSUMER: &str = "alpha";
const PROVIDER: &str = "beta";

fn node_ready(sim: &Sim, node: &str) -> String {
    sim.jsonpath(
        &["node", node],
        "{.status.conditions[?(@.type==\"Ready\")].status}",
    )
}

/// A process stopped with SIGSTOP until dropped, so that a failing assertion never leaves a
/// cluster's daemon frozen (its clean-up could not run).
struct Frozen(u32);

impl Frozen {
    fn new(pid: u32) -> Frozen {
        signal(pid, "-STOP");
        Frozen(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        signal(self.0, "-CONT");
    }
}

fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill {sig} {pid}");
}

#[test]
fn resources_are_negotiated_into_virtual_nodes_that_follow_the_provider() {
    let Some(mut env) = Env::new("off") else {
        return;
    };
    let a = env.up_nodes("a", 1, &[]);
    let b = env.up_nodes("b", 2, &[]);
    a.install(CONSUMER, &[]);
    b.install(PROVIDER, &[]);

    // What the provider can give: the allocatable CPU of its two nodes.
    let allocatable: Vec<String> = b
        .jsonpath(&["nodes"], "{.items[*].status.allocatable.cpu}")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert_eq!(allocatable.len(), 2, "two provider nodes: {allocatable:?}");

    let peer = a.tether(&[
        "peer",
        "--remote-kubeconfig",
        b.kubeconfig(),
        "--cpu",
        "1",
        "--memory",
        "2Gi",
        "--pods",
        "20",
        "--timeout",
        "4m",
    ]);
    peer.ok();
    assert!(
        peer.stdout
            .contains(&format!("virtual node {PROVIDER} is Ready")),
        "{}\n{}",
        peer.stdout,
        peer.stderr
    );

    // The virtual node: the grant as capacity, the provider's labels, the taint.
    let node = PROVIDER;
    assert_eq!(node_ready(&a, node), "True");
    assert_eq!(a.jsonpath(&["node", node], "{.status.capacity.cpu}"), "1");
    assert_eq!(
        a.jsonpath(&["node", node], "{.status.allocatable.memory}"),
        "2Gi"
    );
    assert_eq!(a.jsonpath(&["node", node], "{.status.capacity.pods}"), "20");
    assert_eq!(
        a.jsonpath(&["node", node], "{.metadata.labels.tether\\.dev/type}"),
        "virtual-node"
    );
    assert_eq!(
        a.jsonpath(
            &["node", node],
            "{.metadata.labels.tether\\.dev/remote-cluster-id}"
        ),
        PROVIDER
    );
    assert_eq!(
        a.jsonpath(&["node", node], "{.spec.taints[*].key}"),
        "virtual-node.tether.dev/not-allowed"
    );
    // Its address is the controller pod's, where its kubelet API will be served.
    let controller_ip = a.jsonpath(
        &[
            "pods",
            "-n",
            "tether-system",
            "-l",
            "app.kubernetes.io/name=tether-controller",
        ],
        "{.items[0].status.podIP}",
    );
    assert_eq!(
        a.jsonpath(
            &["node", node],
            "{.status.addresses[?(@.type==\"InternalIP\")].address}"
        ),
        controller_ip
    );
    // A kubelet's Lease in kube-node-lease, renewed.
    let renew = || {
        a.jsonpath(
            &["lease", "-n", "kube-node-lease", node],
            "{.spec.renewTime}",
        )
    };
    let first = renew();
    assert!(!first.is_empty(), "no Lease for the virtual node");
    a.wait(
        "the virtual node's Lease renewed",
        Duration::from_secs(30),
        || renew() != first,
    );
    // The provider holds the request and its answer.
    let tenant_ns = format!("tether-tenant-{CONSUMER}");
    assert_eq!(
        b.jsonpath(
            &["resourceslices", "-n", &tenant_ns, PROVIDER],
            "{.status.conditions[?(@.type==\"Resources\")].reason}"
        ),
        "Accepted"
    );

    // Beyond the provider's capacity: refused with the reason, and nothing left behind.
    let big = a.tether(&[
        "offload",
        "resources",
        "add",
        PROVIDER,
        "--name",
        "big",
        "--cpu",
        "1000",
        "--timeout",
        "60s",
    ]);
    big.fails(4, &["refused", "Insufficient", "cpu: asked 1k", "free"]);
    let big_name = format!("{PROVIDER}-big");
    let local_ns = format!("tether-tenant-{PROVIDER}");
    assert_eq!(
        a.jsonpath(
            &["resourceslices", "-n", &local_ns, &big_name],
            "{.metadata.name}"
        ),
        "",
        "the refused request stays"
    );
    a.wait(
        "the refused request gone from the provider",
        Duration::from_secs(30),
        || {
            b.jsonpath(
                &["resourceslices", "-n", &tenant_ns, &big_name],
                "{.metadata.name}",
            )
            .is_empty()
        },
    );
    assert_eq!(a.jsonpath(&["node", &big_name], "{.metadata.name}"), "");

    // A second request is a second virtual node; withdrawing it removes it everywhere.
    let extra = a.tether(&[
        "offload",
        "resources",
        "add",
        PROVIDER,
        "--name",
        "extra",
        "--cpu",
        "500m",
        "--pods",
        "5",
        "--timeout",
        "90s",
    ]);
    extra.ok();
    let extra_name = format!("{PROVIDER}-extra");
    assert_eq!(node_ready(&a, &extra_name), "True");
    assert_eq!(
        a.jsonpath(&["node", &extra_name], "{.status.capacity.cpu}"),
        "500m"
    );
    // Growing it within what is free is granted and shows on the node.
    a.tether(&[
        "offload",
        "resources",
        "add",
        PROVIDER,
        "--name",
        "extra",
        "--cpu",
        "700m",
        "--pods",
        "5",
        "--timeout",
        "90s",
    ])
    .ok();
    a.wait(
        "the grown grant on the node",
        Duration::from_secs(15),
        || a.jsonpath(&["node", &extra_name], "{.status.capacity.cpu}") == "700m",
    );
    a.tether(&[
        "offload",
        "resources",
        "remove",
        PROVIDER,
        "--name",
        "extra",
        "--timeout",
        "90s",
    ])
    .ok();
    assert_eq!(a.jsonpath(&["node", &extra_name], "{.metadata.name}"), "");
    assert_eq!(
        a.jsonpath(
            &["lease", "-n", "kube-node-lease", &extra_name],
            "{.metadata.name}"
        ),
        ""
    );
    a.wait(
        "the withdrawn request gone from the provider",
        Duration::from_secs(30),
        || {
            b.jsonpath(
                &["resourceslices", "-n", &tenant_ns, &extra_name],
                "{.metadata.name}",
            )
            .is_empty()
        },
    );
    // Removing what is not there names it.
    a.tether(&[
        "offload",
        "resources",
        "remove",
        PROVIDER,
        "--name",
        "extra",
    ])
    .fails(4, &["there is no request"]);

    // The provider's API server frozen: NotReady within 10 s, Ready again once it answers.
    let pid = env.daemon_pid(&b);
    let freeze = Frozen::new(pid);
    let frozen = Instant::now();
    let mut not_ready_after = None;
    while frozen.elapsed() < Duration::from_secs(30) {
        if node_ready(&a, node) == "False" {
            not_ready_after = Some(frozen.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let reason = a.jsonpath(
        &["node", node],
        "{.status.conditions[?(@.type==\"Ready\")].reason}",
    );
    drop(freeze);
    let not_ready_after = not_ready_after.expect("the virtual node never turned NotReady");
    println!("virtual node NotReady {not_ready_after:?} after the provider froze ({reason})");
    assert!(
        not_ready_after <= Duration::from_secs(10),
        "NotReady only after {not_ready_after:?}"
    );
    assert_eq!(reason, "ProviderUnreachable");
    let thawed = Instant::now();
    a.wait(
        "the virtual node Ready again",
        Duration::from_secs(30),
        || node_ready(&a, node) == "True",
    );
    println!(
        "virtual node Ready {:?} after the provider returned",
        thawed.elapsed()
    );

    offload_a_namespace(&a, &b, pid);

    // Unpeering withdraws the requests first: nothing of offloading is left on either side.
    a.tether(&[
        "unpeer",
        "--remote-kubeconfig",
        b.kubeconfig(),
        "--timeout",
        "3m",
    ])
    .ok();
    assert_eq!(a.jsonpath(&["node", node], "{.metadata.name}"), "");
    assert_eq!(
        a.jsonpath(
            &["lease", "-n", "kube-node-lease", node],
            "{.metadata.name}"
        ),
        ""
    );
    assert!(
        a.names(&["virtualnodes", "-A"]).is_empty(),
        "virtual nodes left"
    );
    assert!(
        a.names(&["resourceslices", "-A"]).is_empty(),
        "slices left on the consumer"
    );
    b.wait(
        "the provider's slices gone",
        Duration::from_secs(60),
        || b.names(&["resourceslices", "-A"]).is_empty(),
    );
}

fn pods_of(sim: &Sim, ns: &str, app: &str) -> Vec<String> {
    sim.names(&["pods", "-n", ns, "-l", &format!("app={app}")])
        .into_iter()
        .map(|p| p.trim_start_matches("pod/").to_owned())
        .collect()
}

fn offload_a_namespace(a: &Sim, b: &Sim, provider_pid: u32) {
    let kc = std::path::Path::new(a.kubeconfig());
    a.kubectl(&["create", "namespace", "shop"]).ok();
    let off = a.tether(&[
        "offload",
        "namespace",
        "shop",
        "--pod-offloading-strategy",
        "Remote",
        "--timeout",
        "90s",
    ]);
    off.ok();
    let twin = format!("shop-{CONSUMER}");
    assert!(off.stdout.contains(&twin), "{}", off.stdout);
    assert_eq!(
        b.jsonpath(
            &["namespace", &twin],
            "{.metadata.labels.tether\\.dev/remote-cluster-id}"
        ),
        CONSUMER
    );

    // Outside offloaded namespaces nothing tolerates the virtual node: none lands there.
    a.apply_as(kc, &e2e::echo_deployment("default", "stay", 3, None))
        .ok();
    a.wait("three local pods Running", Duration::from_secs(60), || {
        let pods = pods_of(a, "default", "stay");
        pods.len() == 3
            && pods
                .iter()
                .all(|p| a.jsonpath(&["pod", "-n", "default", p], "{.status.phase}") == "Running")
    });
    for p in pods_of(a, "default", "stay") {
        assert_ne!(
            a.jsonpath(&["pod", "-n", "default", &p], "{.spec.nodeName}"),
            PROVIDER,
            "pod {p} of a namespace that is not offloaded went to the virtual node"
        );
    }
    a.kubectl(&["delete", "deployment", "-n", "default", "stay"])
        .ok();

    // The webhook placed the pods of the Remote namespace on the virtual node (toleration and
    // affinity); they run at the provider and answer at their address in the consumer's view
    // of the provider's pod CIDR.
    a.apply_as(kc, &e2e::echo_deployment("shop", "echo", 2, Some("100m")))
        .ok();
    a.wait(
        "two offloaded echo pods Running",
        Duration::from_secs(90),
        || {
            let pods = pods_of(a, "shop", "echo");
            pods.len() == 2
                && pods
                    .iter()
                    .all(|p| a.jsonpath(&["pod", "-n", "shop", p], "{.status.phase}") == "Running")
        },
    );
    let remote = pods_of(b, &twin, "echo");
    assert_eq!(remote.len(), 2, "the provider runs both: {remote:?}");
    // Their status came back through the consumer's watch, which shows only the ShadowPods
    // the provider marked reported; the mark stays off the provider's Pods.
    assert_eq!(
        b.jsonpath(
            &["shadowpods", "-n", &twin],
            "{.items[*].metadata.labels.tether\\.dev/status-reported}"
        ),
        "true true"
    );
    assert_eq!(
        b.jsonpath(
            &["pods", "-n", &twin, "-l", "tether.dev/status-reported"],
            "{.items[*].metadata.name}"
        ),
        ""
    );
    a_pod_slow_at_the_provider_is_shown_waiting(a, b, &twin);
    labels_annotations_and_image_follow_an_offloaded_pod(
        a,
        b,
        &twin,
        &pods_of(a, "shop", "echo")[0],
    );
    kubelet_api_of_offloaded_pods(a, &pods_of(a, "shop", "echo")[0]);
    consumer_api_from_an_offloaded_pod(a, &pods_of(a, "shop", "echo")[0]);
    for p in pods_of(a, "shop", "echo") {
        assert_eq!(
            a.jsonpath(&["pod", "-n", "shop", &p], "{.spec.nodeName}"),
            PROVIDER
        );
    }
    let view = view_of(a, PROVIDER);
    let local_pod = &pods_of(a, "shop", "echo")[0];
    let local_ip: std::net::Ipv4Addr = a
        .jsonpath(&["pod", "-n", "shop", local_pod], "{.status.podIP}")
        .parse()
        .expect("offloaded pod IP");
    let remote_ip: std::net::Ipv4Addr = b
        .jsonpath(&["pod", "-n", &twin, local_pod], "{.status.podIP}")
        .parse()
        .expect("provider pod IP");
    assert_eq!(
        local_ip,
        remapped(&view, remote_ip),
        "the consumer's view of {remote_ip}"
    );
    let a_node = nodes(a)
        .into_iter()
        .find(|n| n != PROVIDER)
        .expect("a real node");
    let seen = talk(
        a,
        "to-offloaded",
        &a_node,
        "tcp",
        &format!("{local_ip}:7000"),
    );
    assert_eq!(seen.len(), 3, "the offloaded echo pod answered: {seen:?}");

    // The provider's API server frozen: the virtual node turns NotReady, the offloaded pods
    // keep serving through the tunnel, and once it is back nothing is duplicated or lost.
    let before_local = pods_of(a, "shop", "echo");
    {
        let _freeze = Frozen::new(provider_pid);
        a.wait("the virtual node NotReady", Duration::from_secs(15), || {
            node_ready(a, PROVIDER) == "False"
        });
        let during = talk(
            a,
            "during-outage",
            &a_node,
            "tcp",
            &format!("{local_ip}:7000"),
        );
        assert_eq!(
            during.len(),
            3,
            "the offloaded pod during the outage: {during:?}"
        );
    }
    a.wait(
        "the virtual node Ready again",
        Duration::from_secs(30),
        || node_ready(a, PROVIDER) == "True",
    );
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        pods_of(a, "shop", "echo"),
        before_local,
        "the consumer's pods changed"
    );
    let mut after_remote = pods_of(b, &twin, "echo");
    after_remote.sort();
    let mut expected = before_local;
    expected.sort();
    assert_eq!(
        after_remote, expected,
        "the provider's pods are exactly the consumer's"
    );

    // A ShadowPod's pod spec changed at the provider is put back from the pod here (the
    // consumer keeps only a digest of what the provider holds).
    let image = || {
        b.jsonpath(
            &["shadowpod", "-n", &twin, local_pod],
            "{.spec.pod.containers[0].image}",
        )
    };
    let original = image();
    assert!(!original.is_empty(), "the ShadowPod of {local_pod}");
    b.kubectl(&[
        "patch",
        "shadowpod",
        "-n",
        &twin,
        local_pod,
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/spec/pod/containers/0/image","value":"tampered:1"}]"#,
    ])
    .ok();
    b.wait(
        "the ShadowPod's spec put back",
        Duration::from_secs(30),
        || image() == original,
    );

    // A pod deleted here goes at the provider too and its replacement runs there.
    a.kubectl(&[
        "delete",
        "pod",
        "-n",
        "shop",
        local_pod,
        "--wait=true",
        "--timeout=60s",
    ])
    .ok();
    b.wait("the provider's pod gone", Duration::from_secs(30), || {
        b.jsonpath(&["pod", "-n", &twin, local_pod], "{.metadata.name}")
            .is_empty()
    });
    a.wait("the replacement Running", Duration::from_secs(90), || {
        let pods = pods_of(a, "shop", "echo");
        pods.len() == 2
            && !pods.contains(local_pod)
            && pods
                .iter()
                .all(|p| a.jsonpath(&["pod", "-n", "shop", p], "{.status.phase}") == "Running")
    });

    // Beyond the grant (1 CPU, 200m used): two of three 350m pods fit, the third stays
    // Pending on the scheduler's reason (Remote: no other node is allowed).
    a.apply_as(kc, &e2e::echo_deployment("shop", "big", 3, Some("350m")))
        .ok();
    a.wait(
        "two big pods Running, one Pending",
        Duration::from_secs(90),
        || {
            let pods = pods_of(a, "shop", "big");
            let phases: Vec<String> = pods
                .iter()
                .map(|p| a.jsonpath(&["pod", "-n", "shop", p], "{.status.phase}"))
                .collect();
            phases.iter().filter(|p| *p == "Running").count() == 2
                && phases.iter().filter(|p| *p == "Pending").count() == 1
        },
    );
    let pending = pods_of(a, "shop", "big")
        .into_iter()
        .find(|p| a.jsonpath(&["pod", "-n", "shop", p], "{.status.phase}") == "Pending")
        .expect("a pending pod");
    let why = a.jsonpath(
        &["pod", "-n", "shop", &pending],
        "{.status.conditions[?(@.type==\"PodScheduled\")].message}",
    );
    assert!(why.contains("Insufficient cpu"), "{why}");
    a.kubectl(&["delete", "deployment", "-n", "shop", "big"])
        .ok();

    // A pod without requests is refused by the provider's enforcement, with the reason.
    a.apply_as(kc, &e2e::echo_deployment("shop", "bare", 1, None))
        .ok();
    a.wait("the bare pod refused", Duration::from_secs(60), || {
        pods_of(a, "shop", "bare").first().is_some_and(|p| {
            a.jsonpath(&["pod", "-n", "shop", p], "{.status.reason}") == "MissingRequests"
        })
    });
    assert!(
        pods_of(b, &twin, "bare").is_empty(),
        "no pod at the provider"
    );
    a.kubectl(&["delete", "deployment", "-n", "shop", "bare"])
        .ok();

    reflect_into_the_twin(a, b, &twin);

    // Unoffloading: the pods leave the virtual node and the twin goes.
    a.kubectl(&["delete", "deployment", "-n", "shop", "echo"])
        .ok();
    a.tether(&["unoffload", "namespace", "shop", "--timeout", "90s"])
        .ok();
    b.wait("the twin namespace gone", Duration::from_secs(60), || {
        b.jsonpath(&["namespace", &twin], "{.metadata.name}")
            .is_empty()
    });
    assert!(
        a.names(&["pods", "-n", "shop"]).is_empty(),
        "pods left in shop: {:?}",
        a.names(&["pods", "-n", "shop"])
    );
    assert_eq!(
        a.jsonpath(
            &["namespace", "shop"],
            "{.metadata.labels.tether\\.dev/offloading-enabled}"
        ),
        ""
    );
}

/// A pod the provider runs but that does not get Ready (its readiness probe knocks on a
/// port nothing listens on) is not reported on for a while; meanwhile the consumer shows it
/// Pending, waiting for its provider, from a few seconds after its ShadowPod was written.
fn a_pod_slow_at_the_provider_is_shown_waiting(a: &Sim, b: &Sim, twin: &str) {
    let kc = std::path::Path::new(a.kubeconfig());
    a.apply_as(
        kc,
        "apiVersion: v1
kind: Pod
metadata: {name: slow, namespace: shop}
spec:
  containers:
  - name: echo
    image: simkube.dev/echo
    resources: {requests: {cpu: 10m, memory: 8Mi}}
    readinessProbe: {tcpSocket: {port: 9}, periodSeconds: 1}
",
    )
    .ok();
    let waiting = format!("waiting for {PROVIDER} to start the pod");
    a.wait(
        "the slow pod shown waiting for the provider",
        Duration::from_secs(25),
        || a.jsonpath(&["pod", "-n", "shop", "slow"], "{.status.message}") == waiting,
    );
    assert_eq!(
        a.jsonpath(&["pod", "-n", "shop", "slow"], "{.status.phase}"),
        "Pending"
    );
    b.wait(
        "the slow pod Running at the provider",
        Duration::from_secs(30),
        || b.jsonpath(&["pod", "-n", twin, "slow"], "{.status.phase}") == "Running",
    );
    assert_eq!(
        b.jsonpath(
            &["pod", "-n", twin, "slow"],
            "{.status.containerStatuses[0].ready}"
        ),
        "false"
    );
    a.kubectl(&["delete", "pod", "-n", "shop", "slow", "--timeout", "60s"])
        .ok();
    b.wait(
        "the slow pod gone from the provider",
        Duration::from_secs(30),
        || b.kubectl(&["get", "pod", "-n", twin, "slow"]).code != 0,
    );
}

/// The mark of a report cleared the ShadowPod's managed fields, which would otherwise cross
/// the link with every report; a label added to and then taken off the offloaded pod still
/// comes and goes on its ShadowPod, though the consumer's apply no longer owns the labels it
/// wrote before, and on the provider's running Pod, where a label added by someone there
/// stays. Annotations come and go the same way. A new image reaches the running Pod too.
fn labels_annotations_and_image_follow_an_offloaded_pod(a: &Sim, b: &Sim, twin: &str, pod: &str) {
    assert_eq!(
        b.jsonpath(&["shadowpod", "-n", twin, pod], "{.metadata.managedFields}"),
        "",
        "a reported ShadowPod keeps no managed fields"
    );
    let label = |kind: &str, key: &str| {
        b.jsonpath(
            &[kind, "-n", twin, pod],
            &format!("{{.metadata.labels.{key}}}"),
        )
    };
    b.kubectl(&["label", "pod", "-n", twin, pod, "audit=kept"])
        .ok();
    a.kubectl(&["label", "pod", "-n", "shop", pod, "tier=front"])
        .ok();
    a.wait(
        "the added label on the ShadowPod and its Pod",
        Duration::from_secs(30),
        || label("shadowpod", "tier") == "front" && label("pod", "tier") == "front",
    );
    a.kubectl(&["label", "pod", "-n", "shop", pod, "tier-"])
        .ok();
    a.wait(
        "the removed label gone from the ShadowPod and its Pod",
        Duration::from_secs(30),
        || label("shadowpod", "tier").is_empty() && label("pod", "tier").is_empty(),
    );
    assert_eq!(
        label("pod", "audit"),
        "kept",
        "a label added at the provider stays"
    );

    // Annotations go the same way: the pod's programs read them through the downward API.
    let annotation = |kind: &str, key: &str| {
        b.jsonpath(
            &[kind, "-n", twin, pod],
            &format!("{{.metadata.annotations.{key}}}"),
        )
    };
    b.kubectl(&["annotate", "pod", "-n", twin, pod, "audited=yes"])
        .ok();
    a.kubectl(&["annotate", "pod", "-n", "shop", pod, "owner=team-shop"])
        .ok();
    a.wait(
        "the added annotation on the ShadowPod and its Pod",
        Duration::from_secs(30),
        || {
            annotation("shadowpod", "owner") == "team-shop"
                && annotation("pod", "owner") == "team-shop"
        },
    );
    a.kubectl(&["annotate", "pod", "-n", "shop", pod, "owner-"])
        .ok();
    a.wait(
        "the removed annotation gone from the ShadowPod and its Pod",
        Duration::from_secs(30),
        || annotation("shadowpod", "owner").is_empty() && annotation("pod", "owner").is_empty(),
    );
    assert_eq!(
        annotation("pod", "audited"),
        "yes",
        "an annotation added at the provider stays"
    );

    a.kubectl(&[
        "set",
        "image",
        "-n",
        "shop",
        &format!("pod/{pod}"),
        "echo=simkube.dev/echo:2",
    ])
    .ok();
    a.wait(
        "the new image on the provider's Pod",
        Duration::from_secs(30),
        || {
            b.jsonpath(&["pod", "-n", twin, pod], "{.spec.containers[0].image}")
                == "simkube.dev/echo:2"
        },
    );
}

/// An offloaded pod reaches the consumer's API server as `kubernetes.default`, through the
/// tunnel to the address the consumer's gateway publishes, with a token of its own
/// ServiceAccount; the consumer's RBAC decides what it may do.
fn consumer_api_from_an_offloaded_pod(a: &Sim, pod: &str) {
    let kc = std::path::Path::new(a.kubeconfig());
    a.apply_as(
        kc,
        "apiVersion: v1
kind: ConfigMap
metadata: {name: greeting, namespace: shop}
data: {hello: world}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: read-config, namespace: shop}
rules:
- apiGroups: ['']
  resources: [configmaps]
  verbs: [get, list]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: default-reads-config, namespace: shop}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: read-config}
subjects:
- {kind: ServiceAccount, name: default, namespace: shop}
",
    )
    .ok();
    let call = |what: &str, format: &str| {
        let script = format!(
            "d=/var/run/secrets/kubernetes.io/serviceaccount; curl -sS --max-time 10 {format} \
             --cacert $d/ca.crt -H \"Authorization: Bearer $(cat $d/token)\" \
             https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/api/v1/namespaces/$(cat \
             $d/namespace)/{what}"
        );
        a.kubectl(&["exec", "-n", "shop", pod, "--", "sh", "-c", &script])
    };
    let host = a.kubectl(&[
        "exec",
        "-n",
        "shop",
        pod,
        "--",
        "sh",
        "-c",
        "echo $KUBERNETES_SERVICE_HOST",
    ]);
    assert_eq!(host.ok().stdout.trim(), "kubernetes.default");
    // The namespace is the consumer's (the twin has another name, and the provider's API
    // server would refuse the consumer's token), so an answer listing the ConfigMap comes
    // from the consumer's API server.
    let listed = call("configmaps", "");
    listed.ok();
    assert!(
        listed.stdout.contains("\"ConfigMapList\"") && listed.stdout.contains("\"greeting\""),
        "the offloaded pod lists its namespace's ConfigMaps at the consumer: {listed:?}"
    );
    let denied = call("secrets", "-o /dev/null -w %{http_code}");
    assert_eq!(
        denied.ok().stdout.trim(),
        "403",
        "its ServiceAccount may not list Secrets: {denied:?}"
    );
}

/// `kubectl logs`, `exec`, `attach` and `port-forward` on an offloaded pod: the consumer's API
/// server calls the virtual node's kubelet (the controller), which re-issues each to the
/// provider in the twin namespace and relays the streams.
fn kubelet_api_of_offloaded_pods(a: &Sim, pod: &str) {
    use std::io::{BufRead as _, BufReader, Read as _, Write as _};
    use std::process::Stdio;

    let logs = a.kubectl(&["logs", "-n", "shop", pod]);
    logs.ok();
    assert!(
        logs.stdout.contains(&format!("echo {pod} serving")),
        "logs of {pod}: {}",
        logs.stdout
    );
    let tail = a.kubectl(&["logs", "-n", "shop", pod, "--tail", "1"]);
    tail.ok();
    assert_eq!(tail.stdout.lines().count(), 1, "--tail 1: {}", tail.stdout);

    let started = Instant::now();
    let exec = a.kubectl(&[
        "exec",
        "-n",
        "shop",
        pod,
        "--",
        "sh",
        "-c",
        "echo exec-$HOSTNAME-$((6*7)); exit 3",
    ]);
    let took = started.elapsed();
    assert_eq!(exec.code, 3, "exec's exit code: {exec:?}");
    assert!(
        exec.stdout.contains(&format!("exec-{pod}-42")),
        "exec ran in the provider's pod: {exec:?}"
    );
    println!("kubectl exec round trip on an offloaded pod: {took:?}");
    a.kubectl(&["exec", "-n", "shop", pod, "--", "true"]).ok();

    // Port-forward (SPDY through the consumer's API server to the virtual kubelet) to the
    // echo's HTTP and TCP ports.
    let mut forward = Command::new("kubectl")
        .args(["--kubeconfig", a.kubeconfig(), "port-forward", "-n", "shop"])
        .arg(format!("pod/{pod}"))
        .args([":8080", ":7000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl port-forward runs");
    let mut out = BufReader::new(forward.stdout.take().expect("stdout"));
    let mut local = Vec::new();
    while local.len() < 2 {
        let mut line = String::new();
        if out.read_line(&mut line).expect("port-forward output") == 0 {
            let mut err = String::new();
            let _ = forward
                .stderr
                .take()
                .expect("stderr")
                .read_to_string(&mut err);
            panic!("kubectl port-forward ended: {err}");
        }
        // "Forwarding from 127.0.0.1:PORT -> 8080"
        if let Some(port) = line
            .strip_prefix("Forwarding from 127.0.0.1:")
            .and_then(|r| r.split_whitespace().next())
        {
            local.push(port.parse::<u16>().expect("local port"));
        }
    }
    let mut http = std::net::TcpStream::connect(("127.0.0.1", local[0])).expect("connect");
    http.set_read_timeout(Some(Duration::from_secs(10))).ok();
    http.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .expect("request");
    let mut answer = String::new();
    let _ = http.read_to_string(&mut answer);
    assert!(
        answer.contains(&format!("pod={pod}")),
        "HTTP through port-forward: {answer:?}"
    );

    // Attach sees what the echo writes from now on: a TCP connection through the forward.
    let mut attach = Command::new("kubectl")
        .args(["--kubeconfig", a.kubeconfig(), "attach", "-n", "shop", pod])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl attach runs");
    let lines = BufReader::new(attach.stdout.take().expect("stdout"));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in lines.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut seen = Vec::new();
    let found = loop {
        let mut tcp = std::net::TcpStream::connect(("127.0.0.1", local[1])).expect("connect");
        tcp.set_read_timeout(Some(Duration::from_secs(5))).ok();
        let _ = tcp.write_all(b"attach\n");
        let mut reply = String::new();
        let _ = BufReader::new(&tcp).read_line(&mut reply);
        if let Ok(line) = rx.recv_timeout(Duration::from_secs(1)) {
            seen.push(line);
        }
        seen.extend(rx.try_iter());
        if seen.iter().any(|l| l.contains("tcp connection from")) {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
    };
    let _ = attach.kill();
    let _ = attach.wait();
    let _ = forward.kill();
    let _ = forward.wait();
    assert!(found, "kubectl attach showed no new output: {seen:?}");
}

/// Reflection into the twin of `shop` (the `echo` Deployment runs there, offloaded): a
/// ConfigMap and a Secret follow creation, an edit and a deletion; the Service `echo` gets a
/// copy whose address is the provider's; from a pod here, the Service answers from the
/// offloaded pods; from the provider, a Service that selects only a pod here answers through
/// the reflected EndpointSlice.
fn reflect_into_the_twin(a: &Sim, b: &Sim, twin: &str) {
    let kc = std::path::Path::new(a.kubeconfig());
    let remote = |args: &[&str], path: &str| {
        let mut full = args.to_vec();
        full.extend(["-n", twin]);
        b.jsonpath(&full, path)
    };
    a.kubectl(&[
        "create",
        "configmap",
        "-n",
        "shop",
        "settings",
        "--from-literal=mode=one",
    ])
    .ok();
    a.kubectl(&[
        "create",
        "secret",
        "generic",
        "-n",
        "shop",
        "creds",
        "--from-literal=pw=s3",
    ])
    .ok();
    b.wait(
        "the ConfigMap and Secret in the twin",
        Duration::from_secs(20),
        || {
            remote(&["configmap", "settings"], "{.data.mode}") == "one"
                && remote(&["secret", "creds"], "{.data.pw}") == "czM="
        },
    );
    assert_eq!(
        remote(
            &["configmap", "settings"],
            "{.metadata.labels.tether\\.dev/remote-cluster-id}"
        ),
        CONSUMER
    );
    a.kubectl(&[
        "patch",
        "configmap",
        "-n",
        "shop",
        "settings",
        "-p",
        r#"{"data":{"mode":"two"}}"#,
    ])
    .ok();
    a.kubectl(&["delete", "secret", "-n", "shop", "creds"]).ok();
    b.wait(
        "the edit and the deletion followed",
        Duration::from_secs(20),
        || {
            remote(&["configmap", "settings"], "{.data.mode}") == "two"
                && remote(&["secret", "creds"], "{.metadata.name}").is_empty()
        },
    );

    // One Service here for the offloaded echo pods, one for a pod that runs here.
    let a_node = nodes(a)
        .into_iter()
        .find(|n| n != PROVIDER)
        .expect("a real node");
    let service = |name: &str| {
        format!(
            "apiVersion: v1
kind: Service
metadata:
  name: {name}
  namespace: shop
spec:
  selector: {{app: {name}}}
  ports:
  - {{name: echo, port: 7000, targetPort: 7000}}
"
        )
    };
    a.apply_as(kc, &service("echo")).ok();
    a.apply_as(kc, &service("here")).ok();
    // Bound to a real node by name, so the pod webhook leaves it here.
    a.apply_as(
        kc,
        &format!(
            "apiVersion: v1
kind: Pod
metadata:
  name: here
  namespace: shop
  labels: {{app: here}}
spec:
  nodeName: {a_node}
  containers:
  - name: echo
    image: simkube.dev/echo
"
        ),
    )
    .ok();
    b.wait("the Services in the twin", Duration::from_secs(20), || {
        remote(&["service", "echo"], "{.spec.selector.app}") == "echo"
            && !remote(&["service", "here"], "{.spec.clusterIP}").is_empty()
    });
    let cluster_ip = a.jsonpath(&["service", "-n", "shop", "echo"], "{.spec.clusterIP}");
    assert_ne!(
        remote(&["service", "echo"], "{.spec.clusterIP}"),
        cluster_ip,
        "the copy has the provider's address"
    );

    // The consumer's Service lists the offloaded pods (in its view) by itself.
    let offloaded = pods_of(a, "shop", "echo");
    let seen = e2e::net::answering_pods(
        a,
        "to-echo-service",
        &a_node,
        "tcp",
        &format!("{cluster_ip}:7000"),
    );
    assert_eq!(seen.len(), 3, "the Service answered: {seen:?}");
    for pod in &seen {
        assert!(offloaded.contains(pod), "{pod} is not one of {offloaded:?}");
    }

    // At the provider, `here` has no pod of its own: its endpoint is the pod here, in the
    // provider's view of this cluster's pod CIDR.
    let here_ip: std::net::Ipv4Addr = {
        let mut ip = String::new();
        a.wait("the local pod Running", Duration::from_secs(30), || {
            ip = a.jsonpath(&["pod", "-n", "shop", "here"], "{.status.podIP}");
            !ip.is_empty()
                && a.jsonpath(&["pod", "-n", "shop", "here"], "{.status.phase}") == "Running"
        });
        ip.parse().expect("pod IP")
    };
    let seen_by_provider = remapped(&view_of(b, CONSUMER), here_ip).to_string();
    // Reflection re-checks every 10 s besides its watches; a loaded machine needs a few rounds.
    let deadline = Instant::now() + Duration::from_secs(45);
    loop {
        // Tether's slice: the provider's EndpointSlice controller keeps its own, empty one.
        let seen = remote(
            &[
                "endpointslices",
                "-l",
                "kubernetes.io/service-name=here,endpointslice.kubernetes.io/managed-by=tether",
            ],
            "{.items[*].endpoints[*].addresses[0]}",
        );
        if seen == seen_by_provider {
            break;
        }
        if Instant::now() > deadline {
            let all = b.kubectl(&["get", "endpointslices", "-n", twin, "-o", "yaml"]);
            let local = a.kubectl(&["get", "endpointslices", "-n", "shop", "-o", "yaml"]);
            panic!(
                "the reflected EndpointSlice of `here` at the provider lists {seen:?}, not \
                 {seen_by_provider} (pod {here_ip} in the provider's view), after 45 s; \
                 the provider has:\n{}\nthe consumer has:\n{}",
                all.stdout, local.stdout
            );
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    let b_node = nodes(b).into_iter().next().expect("a provider node");
    let remote_ip = remote(&["service", "here"], "{.spec.clusterIP}");
    let seen = e2e::net::answering_pods(
        b,
        "to-consumer",
        &b_node,
        "tcp",
        &format!("{remote_ip}:7000"),
    );
    assert_eq!(seen, ["here", "here", "here"]);
    // The provider's Warnings about the offloaded pods come back about the pods here, and its
    // Normal Events (the pods' scheduling there, at least) stay there: a container that exits
    // at once crash-loops at the provider.
    a.apply_as(
        kc,
        "apiVersion: v1
kind: Pod
metadata: {name: crashing, namespace: shop}
spec:
  containers:
  - name: app
    image: simkube.dev/sleeper
    command: [/bin/false]
    resources: {requests: {cpu: 10m, memory: 16Mi}}
",
    )
    .ok();
    let reflected = || {
        a.jsonpath(
            &["events.events.k8s.io", "-n", "shop"],
            "{range .items[?(@.reportingController==\"tether.dev/reflection\")]}{.regarding.name}/{.type}/{.reason} {end}",
        )
    };
    a.wait(
        "the provider's BackOff here",
        Duration::from_secs(60),
        || {
            reflected()
                .split_whitespace()
                .any(|e| e == "crashing/Warning/BackOff")
        },
    );
    let reflected = reflected();
    assert!(
        reflected
            .split_whitespace()
            .all(|e| e.contains("/Warning/")),
        "only Warnings come back: {reflected}"
    );
    assert!(
        !b.jsonpath(
            &["events.events.k8s.io", "-n", twin],
            "{range .items[?(@.reason==\"Scheduled\")]}{.regarding.name} {end}"
        )
        .is_empty(),
        "the provider has Normal Events of its own to keep"
    );
    assert!(
        a.controller_metrics()
            .contains("tether_reflected_objects_total{kind=\"ConfigMap\",outcome=\"applied\"}"),
        "the reflection metrics"
    );
    for what in [
        ["service", "echo"],
        ["service", "here"],
        ["pod", "here"],
        ["pod", "crashing"],
    ] {
        a.kubectl(&["delete", what[0], "-n", "shop", what[1], "--wait=false"])
            .ok();
    }
    a.kubectl(&["delete", "configmap", "-n", "shop", "settings"])
        .ok();
}
