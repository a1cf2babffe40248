//! Snapshots of the desired Node and the rules around it (health, transitions, taints, drift).

use super::*;
use expect_test::{Expect, expect};

fn at(s: &str) -> Timestamp {
    s.parse().expect("timestamp")
}

fn spec() -> NodeSpec {
    NodeSpec {
        name: "tether-cluster-b".into(),
        provider: "cluster-b".into(),
        capacity: BTreeMap::from([
            ("cpu".into(), Quantity("4".into())),
            ("memory".into(), Quantity("8Gi".into())),
            ("pods".into(), Quantity("110".into())),
        ]),
        labels: BTreeMap::from([
            ("topology.kubernetes.io/region".into(), "eu-west".into()),
            // Must not win over the virtual node's own identity labels.
            (labels::TYPE.into(), "something-else".into()),
            (labels::REMOTE_CLUSTER_ID.into(), "cluster-x".into()),
        ]),
        taint: true,
        address: Some("10.244.0.7".into()),
        kubelet_port: Some(10250),
    }
}

fn yaml(node: &Node) -> String {
    serde_yaml::to_string(node).expect("yaml")
}

fn check(node: &Node, snapshot: Expect) {
    snapshot.assert_eq(&yaml(node));
}

fn healthy() -> Health {
    Health {
        provider: ProviderHealth::Reachable,
        network: Some(Ok(())),
    }
}

#[test]
fn ready_node_for_a_typical_spec() {
    let node = node(&spec(), &healthy(), None, at("2026-11-27T09:00:00Z"));
    check(
        &node,
        expect![[r#"
            apiVersion: v1
            kind: Node
            metadata:
              labels:
                kubernetes.io/arch: amd64
                kubernetes.io/hostname: tether-cluster-b
                kubernetes.io/os: linux
                kubernetes.io/role: agent
                node.kubernetes.io/instance-type: virtual-node
                tether.dev/remote-cluster-id: cluster-b
                tether.dev/type: virtual-node
                topology.kubernetes.io/region: eu-west
                type: virtual-kubelet
              name: tether-cluster-b
            spec:
              taints:
              - effect: NoExecute
                key: virtual-node.tether.dev/not-allowed
                value: 'true'
            status:
              addresses:
              - address: 10.244.0.7
                type: InternalIP
              - address: tether-cluster-b
                type: Hostname
              allocatable:
                cpu: '4'
                memory: 8Gi
                pods: '110'
              capacity:
                cpu: '4'
                memory: 8Gi
                pods: '110'
              conditions:
              - lastHeartbeatTime: 2026-11-27T09:00:00Z
                lastTransitionTime: 2026-11-27T09:00:00Z
                message: the tunnel to the provider cluster cluster-b is up
                reason: TunnelUp
                status: 'False'
                type: NetworkUnavailable
              - lastHeartbeatTime: 2026-11-27T09:00:00Z
                lastTransitionTime: 2026-11-27T09:00:00Z
                message: 'the virtual node has sufficient memory available: the provider cluster cluster-b enforces its own limits'
                reason: TetherHasSufficientMemory
                status: 'False'
                type: MemoryPressure
              - lastHeartbeatTime: 2026-11-27T09:00:00Z
                lastTransitionTime: 2026-11-27T09:00:00Z
                message: 'the virtual node has sufficient disk available: the provider cluster cluster-b enforces its own limits'
                reason: TetherHasNoDiskPressure
                status: 'False'
                type: DiskPressure
              - lastHeartbeatTime: 2026-11-27T09:00:00Z
                lastTransitionTime: 2026-11-27T09:00:00Z
                message: 'the virtual node has sufficient PID available: the provider cluster cluster-b enforces its own limits'
                reason: TetherHasSufficientPID
                status: 'False'
                type: PIDPressure
              - lastHeartbeatTime: 2026-11-27T09:00:00Z
                lastTransitionTime: 2026-11-27T09:00:00Z
                message: the provider cluster cluster-b answers and grants resources
                reason: TetherVirtualNodeReady
                status: 'True'
                type: Ready
              daemonEndpoints:
                kubeletEndpoint:
                  Port: 10250
              nodeInfo:
                architecture: amd64
                bootID: ''
                containerRuntimeVersion: tether://cluster-b
                kernelVersion: ''
                kubeProxyVersion: ''
                kubeletVersion: v1.33.0-tether
                machineID: ''
                operatingSystem: linux
                osImage: Tether virtual node
                systemUUID: ''
        "#]],
    );
    assert!(is_ready(&node));
}

/// Only the conditions, one line each, for the cases where nothing else changes.
fn conditions_text(node: &Node) -> String {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .map(|c| {
            format!(
                "{} {} {} since {}: {}\n",
                c.type_,
                c.status,
                c.reason.as_deref().unwrap_or_default(),
                c.last_transition_time
                    .as_ref()
                    .map(|t| t.0.to_string())
                    .unwrap_or_default(),
                c.message.as_deref().unwrap_or_default()
            )
        })
        .collect()
}

#[test]
fn unreachable_provider_makes_the_node_not_ready_and_keeps_other_transitions() {
    let ready = node(&spec(), &healthy(), None, at("2026-11-27T09:00:00Z"));
    let probes = Probes {
        client_since: Some(at("2026-11-27T08:00:00Z")),
        last_answer: Some(at("2026-11-27T09:04:55Z")),
        last_error: Some("no answer within 2000ms".into()),
    };
    let now = at("2026-11-27T09:05:00Z");
    let health = Health {
        provider: probes.health(now, Duration::from_secs(4)),
        network: Some(Ok(())),
    };
    let down = node(&spec(), &health, Some(&ready), now);
    expect![[r#"
        NetworkUnavailable False TunnelUp since 2026-11-27T09:00:00Z: the tunnel to the provider cluster cluster-b is up
        MemoryPressure False TetherHasSufficientMemory since 2026-11-27T09:00:00Z: the virtual node has sufficient memory available: the provider cluster cluster-b enforces its own limits
        DiskPressure False TetherHasNoDiskPressure since 2026-11-27T09:00:00Z: the virtual node has sufficient disk available: the provider cluster cluster-b enforces its own limits
        PIDPressure False TetherHasSufficientPID since 2026-11-27T09:00:00Z: the virtual node has sufficient PID available: the provider cluster cluster-b enforces its own limits
        Ready False ProviderUnreachable since 2026-11-27T09:05:00Z: the API server of the provider cluster cluster-b has not answered since 2026-11-27T09:04:55Z: no answer within 2000ms
    "#]]
    .assert_eq(&conditions_text(&down));
    assert!(!is_ready(&down));
    // Heartbeats move on every write; the status only changed because of Ready.
    assert!(status_changed(
        ready.status.as_ref(),
        down.status.as_ref().expect("status")
    ));
    // The same health later keeps the transition time and is no change worth a write.
    let later = node(&spec(), &health, Some(&down), at("2026-11-27T09:06:00Z"));
    assert!(!status_changed(
        down.status.as_ref(),
        later.status.as_ref().expect("status")
    ));
    assert_eq!(conditions_text(&later), conditions_text(&down));
}

#[test]
fn tunnel_down_no_client_and_no_resources_are_named() {
    let now = at("2026-11-27T09:00:00Z");
    let mut empty = spec();
    empty.capacity.clear();
    let health = Health {
        provider: ProviderHealth::NoClient,
        network: Some(Err("no handshake for 3m".into())),
    };
    let n = node(&empty, &health, None, now);
    expect![[r#"
        NetworkUnavailable True TunnelDown since 2026-11-27T09:00:00Z: the tunnel to the provider cluster cluster-b is down: no handshake for 3m
        MemoryPressure False TetherHasSufficientMemory since 2026-11-27T09:00:00Z: the virtual node has sufficient memory available: the provider cluster cluster-b enforces its own limits
        DiskPressure False TetherHasNoDiskPressure since 2026-11-27T09:00:00Z: the virtual node has sufficient disk available: the provider cluster cluster-b enforces its own limits
        PIDPressure False TetherHasSufficientPID since 2026-11-27T09:00:00Z: the virtual node has sufficient PID available: the provider cluster cluster-b enforces its own limits
        Ready False ProviderUnknown since 2026-11-27T09:00:00Z: no credentials for the provider cluster cluster-b yet: waiting for the authentication module to issue this cluster's identity there; the tunnel to the provider cluster cluster-b is down: no handshake for 3m; the provider cluster cluster-b grants no resources (empty capacity)
    "#]]
    .assert_eq(&conditions_text(&n));

    let tunnel_only = Health {
        provider: ProviderHealth::Reachable,
        network: Some(Err("no handshake for 3m".into())),
    };
    let n = node(&spec(), &tunnel_only, None, now);
    assert_eq!(ready_reason(&n).0, reasons::TUNNEL_DOWN);
    let off = Health {
        provider: ProviderHealth::Reachable,
        network: None,
    };
    let n = node(&spec(), &off, None, now);
    assert!(is_ready(&n));
    assert!(conditions_text(&n).starts_with("NetworkUnavailable False NetworkingOff"));
}

#[test]
fn provider_health_follows_the_probe_record() {
    let now = at("2026-11-27T09:00:10Z");
    let after = Duration::from_secs(4);
    assert_eq!(
        Probes::default().health(now, after),
        ProviderHealth::NoClient
    );
    let fresh = Probes {
        client_since: Some(at("2026-11-27T09:00:08Z")),
        ..Probes::default()
    };
    assert_eq!(fresh.health(now, after), ProviderHealth::Unknown);
    // Never answered and the wait is over: unreachable since probing began.
    let silent = Probes {
        client_since: Some(at("2026-11-27T09:00:00Z")),
        ..Probes::default()
    };
    assert_eq!(
        silent.health(now, after),
        ProviderHealth::Unreachable {
            since: at("2026-11-27T09:00:00Z"),
            error: "no answer for more than 4s".into()
        }
    );
    // A failed probe is tolerated while the last answer is recent enough.
    let blip = Probes {
        client_since: Some(at("2026-11-27T09:00:00Z")),
        last_answer: Some(at("2026-11-27T09:00:06Z")),
        last_error: Some("connection refused".into()),
    };
    assert_eq!(blip.health(now, after), ProviderHealth::Reachable);
    assert_eq!(
        blip.health(at("2026-11-27T09:00:11Z"), after),
        ProviderHealth::Unreachable {
            since: at("2026-11-27T09:00:06Z"),
            error: "connection refused".into()
        }
    );
}

#[test]
fn the_turn_to_unreachable_is_foreseen() {
    let now = at("2026-11-27T09:00:10Z");
    let after = Duration::from_secs(9);
    let answered = Probes {
        client_since: Some(at("2026-11-27T09:00:00Z")),
        last_answer: Some(at("2026-11-27T09:00:07Z")),
        last_error: Some("no answer within 2000ms".into()),
    };
    let left = answered.unreachable_in(now, after).expect("pending");
    assert_eq!(left, Duration::from_millis(6001));
    // At that moment, and not a millisecond before, the health has turned.
    let turn = now + k8s_openapi::jiff::SignedDuration::try_from(left).expect("duration");
    let before = turn - k8s_openapi::jiff::SignedDuration::from_millis(1);
    assert_eq!(answered.health(before, after), ProviderHealth::Reachable);
    assert!(matches!(
        answered.health(turn, after),
        ProviderHealth::Unreachable { .. }
    ));
    // Already unreachable, never answered after an error, or no client: nothing to foresee.
    assert_eq!(
        answered.unreachable_in(at("2026-11-27T09:00:17Z"), after),
        None
    );
    let failed_first = Probes {
        client_since: Some(at("2026-11-27T09:00:08Z")),
        last_answer: None,
        last_error: Some("connection refused".into()),
    };
    assert_eq!(failed_first.unreachable_in(now, after), None);
    assert_eq!(Probes::default().unreachable_in(now, after), None);
    // A new client not yet answered turns when its grace ends.
    let fresh = Probes {
        client_since: Some(at("2026-11-27T09:00:08Z")),
        ..Probes::default()
    };
    assert_eq!(
        fresh.unreachable_in(now, after),
        Some(Duration::from_millis(7001))
    );
}

#[test]
fn labels_taints_and_drift() {
    let mut s = spec();
    let now = at("2026-11-27T09:00:00Z");
    let mut current = node(&s, &healthy(), None, now);
    // The node-lifecycle controller's taint is kept, ours replaced in place.
    current
        .spec
        .as_mut()
        .and_then(|sp| sp.taints.as_mut())
        .expect("taints")
        .insert(
            0,
            Taint {
                key: "node.kubernetes.io/not-ready".into(),
                effect: "NoSchedule".into(),
                ..Taint::default()
            },
        );
    let keys = |taints: Vec<Taint>| -> Vec<String> {
        taints
            .into_iter()
            .map(|t| format!("{}:{}", t.key, t.effect))
            .collect()
    };
    assert_eq!(
        keys(node_taints(&s, Some(&current))),
        [
            "node.kubernetes.io/not-ready:NoSchedule",
            "virtual-node.tether.dev/not-allowed:NoExecute"
        ]
    );
    let desired = node(&s, &healthy(), Some(&current), now);
    assert!(
        !spec_drift(&desired, &current),
        "others' taints are no drift"
    );
    s.taint = false;
    let untainted = node(&s, &healthy(), Some(&current), now);
    assert_eq!(
        keys(
            untainted
                .spec
                .clone()
                .and_then(|sp| sp.taints)
                .unwrap_or_default()
        ),
        ["node.kubernetes.io/not-ready:NoSchedule"]
    );
    assert!(spec_drift(&untainted, &current), "our taint must go");
    // A label someone removed is drift; a label someone added is not.
    let mut edited = desired.clone();
    let labels = edited.metadata.labels.as_mut().expect("labels");
    labels.remove("kubernetes.io/role");
    labels.insert("team".into(), "a".into());
    assert!(spec_drift(&desired, &edited));
    edited
        .metadata
        .labels
        .as_mut()
        .expect("labels")
        .insert("kubernetes.io/role".into(), "agent".into());
    assert!(!spec_drift(&desired, &edited));
}

#[test]
fn lease_is_held_by_and_owned_by_the_node() {
    let lease = lease("tether-cluster-b", "uid-1", 40, at("2026-11-27T09:00:00Z"));
    expect![[r#"
        apiVersion: coordination.k8s.io/v1
        kind: Lease
        metadata:
          name: tether-cluster-b
          namespace: kube-node-lease
          ownerReferences:
          - apiVersion: v1
            kind: Node
            name: tether-cluster-b
            uid: uid-1
        spec:
          holderIdentity: tether-cluster-b
          leaseDurationSeconds: 40
          renewTime: 2026-11-27T09:00:00.000000Z
    "#]]
    .assert_eq(&serde_yaml::to_string(&lease).expect("yaml"));
}

#[test]
fn no_verdict_yet_keeps_what_the_node_reports() {
    let now = at("2026-11-27T09:00:00Z");
    let later = at("2026-11-27T09:10:00Z");
    let waiting = Health {
        provider: ProviderHealth::Unknown,
        network: Some(Ok(())),
    };
    // A new Node waits NotReady for the first answer.
    let fresh = node(&spec(), &waiting, None, now);
    assert_eq!(ready_reason(&fresh).0, reasons::PROVIDER_UNKNOWN);
    // A Node adopted Ready stays Ready, with its transition time, until the probe says more.
    let was_ready = node(&spec(), &healthy(), None, now);
    let adopted = node(&spec(), &waiting, Some(&was_ready), later);
    assert!(!status_changed(
        was_ready.status.as_ref(),
        adopted.status.as_ref().expect("status")
    ));
    // One adopted unreachable stays unreachable, with the same message.
    let unreachable = Health {
        provider: ProviderHealth::Unreachable {
            since: now,
            error: "connection refused".into(),
        },
        network: Some(Ok(())),
    };
    let was_down = node(&spec(), &unreachable, None, now);
    let adopted = node(&spec(), &waiting, Some(&was_down), later);
    assert_eq!(ready_reason(&adopted), ready_reason(&was_down));
    // The tunnel still counts.
    let tunnel_down = Health {
        provider: ProviderHealth::Unknown,
        network: Some(Err("down".into())),
    };
    let adopted = node(&spec(), &tunnel_down, Some(&was_ready), later);
    assert_eq!(ready_reason(&adopted).0, reasons::TUNNEL_DOWN);
}
