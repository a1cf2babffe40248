//! Issue #11's reflection of PersistentVolumeClaims end to end, on one pair of simulated
//! clusters (consumer `alpha`, provider `beta`, namespace `vault` offloaded with the Remote
//! strategy): a claim of the `tether` StorageClass used by an offloaded pod is bound here to a
//! volume pinned to the virtual node and served at the provider by a twin claim of the
//! provider's default class; what one pod writes there the next pod of the claim reads; and
//! resizing the claim with kubectl is refused by the provider while its class does not allow
//! expansion (an Event here says so, nothing changes) and goes through, twin claim first,
//! once it does; a shrink is refused with kube-apiserver's message; and deleting the claim
//! removes the volume here and the twin claim there. Needs root (the clusters' pods are
//! processes in network namespaces); in CI it must run.

mod e2e;

use std::path::Path;
use std::time::{Duration, Instant};

use e2e::{Env, Sim};

const CONSUMER: &str = "alpha";
const PROVIDER: &str = "beta";
const NS: &str = "vault";
const CLAIM: &str = "data";

fn pod(name: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {NS}}}
spec:
  containers:
  - name: app
    image: simkube.dev/echo
    resources: {{requests: {{cpu: 100m, memory: 32Mi}}}}
    volumeMounts: [{{name: data, mountPath: /data}}]
  volumes:
  - name: data
    persistentVolumeClaim: {{claimName: {CLAIM}}}
"
    )
}

fn phase(sim: &Sim, pod: &str) -> String {
    sim.jsonpath(&["pod", "-n", NS, pod], "{.status.phase}")
}

/// Waits until `pod` runs, saying where it is stuck if it does not.
fn running(a: &Sim, b: &Sim, pod: &str, twin: &str) {
    let deadline = std::time::Instant::now() + tether_testkit::patience(Duration::from_secs(90));
    while std::time::Instant::now() < deadline {
        if phase(a, pod) == "Running" {
            return;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    let here = a.kubectl(&["get", "pod,pvc,events", "-n", NS, "-o", "wide"]);
    let pvs = a.kubectl(&["get", "pv", "-o", "yaml"]);
    let there = b.kubectl(&["get", "pod,pvc,pv,events", "-n", twin, "-o", "wide"]);
    panic!(
        "pod {pod} not Running within 90 s\nconsumer:\n{}{}\n{}\nprovider:\n{}{}",
        here.stdout, here.stderr, pvs.stdout, there.stdout, there.stderr
    );
}

#[test]
fn a_claim_of_an_offloaded_pod_is_served_by_the_provider_and_outlives_the_pod() {
    let Some(mut env) = Env::new("stor") else {
        return;
    };
    let a = env.up_nodes("a", 1, &[]);
    let b = env.up_nodes("b", 1, &[]);
    a.install(CONSUMER, &[]);
    b.install(PROVIDER, &[]);
    assert_eq!(
        a.jsonpath(&["storageclass", "tether"], "{.provisioner}"),
        "tether.dev/remote"
    );
    a.peer_and_offload_remote(&b, NS);
    let twin = format!("{NS}-{CONSUMER}");
    let kc = Path::new(a.kubeconfig());
    let started = Instant::now();
    a.apply_as(
        kc,
        &format!(
            "apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: {CLAIM}, namespace: {NS}}}
spec:
  storageClassName: tether
  accessModes: [ReadWriteOnce]
  resources: {{requests: {{storage: 64Mi}}}}
---
{}",
            pod("writer")
        ),
    )
    .ok();
    running(&a, &b, "writer", &twin);
    println!(
        "claim provisioned at the provider and its first pod Running after {:?}",
        started.elapsed()
    );
    a.kubectl(&[
        "exec",
        "-n",
        NS,
        "writer",
        "--",
        "sh",
        "-c",
        "echo kept-$((6*7)) > /data/note",
    ])
    .ok();

    // Here: the claim is bound to a volume of the provisioner, pinned to the virtual node.
    let claim = |path: &str| a.jsonpath(&["pvc", "-n", NS, CLAIM], path);
    assert_eq!(claim("{.status.phase}"), "Bound");
    let pv = claim("{.spec.volumeName}");
    assert_eq!(pv, format!("pvc-{}", claim("{.metadata.uid}")));
    let volume = |path: &str| a.jsonpath(&["pv", &pv], path);
    assert_eq!(volume("{.spec.csi.driver}"), "tether.dev/remote");
    assert_eq!(
        volume("{.spec.csi.volumeHandle}"),
        format!("{PROVIDER}/{twin}/{CLAIM}")
    );
    assert_eq!(
        volume("{.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}"),
        PROVIDER
    );
    assert_eq!(volume("{.spec.capacity.storage}"), "64Mi");
    assert_eq!(
        a.jsonpath(&["pod", "-n", NS, "writer"], "{.spec.nodeName}"),
        PROVIDER
    );
    // There: the twin claim, bound by the provider's default class.
    let there = |path: &str| b.jsonpath(&["pvc", "-n", &twin, CLAIM], path);
    b.wait("the twin claim Bound", Duration::from_secs(30), || {
        there("{.status.phase}") == "Bound"
    });
    assert_eq!(there("{.spec.storageClassName}"), "standard");
    assert_eq!(
        there("{.metadata.labels.tether\\.dev/remote-cluster-id}"),
        CONSUMER
    );

    // The data outlives the pod: the next pod of the claim reads it.
    a.kubectl(&["delete", "pod", "-n", NS, "writer", "--timeout", "60s"])
        .ok();
    b.wait(
        "the writer gone at the provider",
        Duration::from_secs(30),
        || {
            b.jsonpath(&["pod", "-n", &twin, "writer"], "{.metadata.name}")
                .is_empty()
        },
    );
    let started = Instant::now();
    a.apply_as(kc, &pod("reader")).ok();
    running(&a, &b, "reader", &twin);
    println!("the claim's next pod Running after {:?}", started.elapsed());
    let read = a.kubectl(&["exec", "-n", NS, "reader", "--", "cat", "/data/note"]);
    assert_eq!(read.ok().stdout.trim(), "kept-42");
    assert!(
        a.controller_metrics().contains(
            "tether_reflected_objects_total{kind=\"PersistentVolumeClaim\",outcome=\"applied\"}"
        ),
        "the provisioner's metrics"
    );

    // Resizing: the provider's default class, like kind's, does not allow expansion, so the
    // twin claim cannot grow; the claim here says so and nothing is half done.
    let request = |size: &str| {
        a.kubectl(&[
            "patch",
            "pvc",
            "-n",
            NS,
            CLAIM,
            "-p",
            &format!(r#"{{"spec":{{"resources":{{"requests":{{"storage":"{size}"}}}}}}}}"#),
        ])
    };
    let events = |reason: &str| {
        a.jsonpath(
            &["events", "-n", NS],
            &format!(
                r#"{{range .items[?(@.involvedObject.name=="{CLAIM}")]}}{{.reason}}={{.message}}{{"\n"}}{{end}}"#
            ),
        )
        .lines()
        .filter(|l| l.starts_with(&format!("{reason}=")))
        .map(str::to_owned)
        .collect::<Vec<_>>()
    };
    let started = Instant::now();
    request("128Mi").ok();
    a.wait(
        "VolumeResizeFailed on the claim",
        Duration::from_secs(30),
        || !events("VolumeResizeFailed").is_empty(),
    );
    let failed = events("VolumeResizeFailed").join("\n");
    assert!(
        failed.contains(
            "only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize"
        ) && failed.contains("allowVolumeExpansion: true"),
        "{failed}"
    );
    println!(
        "the provider's refusal reported after {:?}",
        started.elapsed()
    );
    assert_eq!(there("{.spec.resources.requests.storage}"), "64Mi");
    assert_eq!(volume("{.spec.capacity.storage}"), "64Mi");
    assert_eq!(claim("{.status.capacity.storage}"), "64Mi");
    assert_eq!(claim("{.status.conditions}"), "", "not marked as resizing");

    // The provider's administrator allows it; the retry goes through.
    b.kubectl(&[
        "patch",
        "storageclass",
        "standard",
        "-p",
        r#"{"allowVolumeExpansion":true}"#,
    ])
    .ok();
    let started = Instant::now();
    a.wait(
        "the claim's capacity 128Mi",
        Duration::from_secs(120),
        || claim("{.status.capacity.storage}") == "128Mi",
    );
    println!(
        "claim resized {:?} after the provider allowed expansion",
        started.elapsed()
    );
    assert_eq!(there("{.spec.resources.requests.storage}"), "128Mi");
    assert_eq!(there("{.status.capacity.storage}"), "128Mi");
    let provider_pv = there("{.spec.volumeName}");
    assert_eq!(
        b.jsonpath(&["pv", &provider_pv], "{.spec.capacity.storage}"),
        "128Mi"
    );
    assert_eq!(volume("{.spec.capacity.storage}"), "128Mi");
    assert_eq!(claim("{.status.allocatedResources.storage}"), "128Mi");
    assert_eq!(
        claim("{.status.conditions}"),
        "",
        "the Resizing condition gone"
    );
    a.wait(
        "VolumeResizeSuccessful on the claim",
        Duration::from_secs(10),
        || !events("VolumeResizeSuccessful").is_empty(),
    );
    assert!(!events("Resizing").is_empty(), "the Resizing event");
    // Shrinking is refused as kube-apiserver refuses it, and changes nothing.
    request("64Mi").fails(
        1,
        &[
            r#"The PersistentVolumeClaim "data" is invalid: spec.resources.requests.storage: Forbidden: field can not be less than status.capacity"#,
        ],
    );
    assert_eq!(claim("{.spec.resources.requests.storage}"), "128Mi");
    // The data is still there.
    let read = a.kubectl(&["exec", "-n", NS, "reader", "--", "cat", "/data/note"]);
    assert_eq!(read.ok().stdout.trim(), "kept-42");

    // Deleting the claim removes the volume here and the twin claim there.
    a.kubectl(&["delete", "pod", "-n", NS, "reader", "--timeout", "60s"])
        .ok();
    let started = Instant::now();
    a.kubectl(&["delete", "pvc", "-n", NS, CLAIM, "--wait=false"])
        .ok();
    a.wait("the volume gone", Duration::from_secs(30), || {
        a.jsonpath(&["pv", &pv], "{.metadata.name}").is_empty()
    });
    b.wait("the twin claim gone", Duration::from_secs(30), || {
        there("{.metadata.name}").is_empty()
    });
    b.wait(
        "the provider's volume gone",
        Duration::from_secs(30),
        || b.jsonpath(&["pv"], "{.items[*].metadata.name}").is_empty(),
    );
    println!(
        "volume, twin claim and the provider's volume gone {:?} after the claim's deletion",
        started.elapsed()
    );
}
