//! Tests of the reflection plan: which objects are copied, how, and what changes in a twin.

use std::collections::{BTreeMap, BTreeSet};

use expect_test::expect;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::ObjectMeta;

use super::*;

const ME: &str = "consumer-1";

fn meta(name: &str, labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> ObjectMeta {
    let map = |kv: &[(&str, &str)]| {
        (!kv.is_empty()).then(|| {
            kv.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<BTreeMap<_, _>>()
        })
    };
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some("shop".to_owned()),
        labels: map(labels),
        annotations: map(annotations),
        resource_version: Some("7".to_owned()),
        uid: Some(format!("uid-{name}")),
        ..ObjectMeta::default()
    }
}

fn cm(name: &str, value: &str) -> ConfigMap {
    ConfigMap {
        metadata: meta(name, &[("app", "shop")], &[]),
        data: Some(BTreeMap::from([("k".to_owned(), value.to_owned())])),
        ..ConfigMap::default()
    }
}

/// What the provider would hold after applying `c`.
fn stored<K: Resource + Clone>(c: &K) -> K {
    let mut c = c.clone();
    c.meta_mut().namespace = Some("shop-consumer-1".to_owned());
    c.meta_mut().uid = Some("remote".to_owned());
    c
}

fn names<K: Resource>(ops: &[Op<K>]) -> Vec<String> {
    ops.iter()
        .map(|o| format!("{} {}", o.outcome(), o.name()))
        .collect()
}

#[test]
fn config_maps_are_copied_with_our_marks_and_nothing_of_the_consumer() {
    let mut local = cm("settings", "v1");
    local.metadata.annotations = Some(BTreeMap::from([
        ("note".to_owned(), "kept".to_owned()),
        (LAST_APPLIED.to_owned(), "{...}".to_owned()),
    ]));
    local.binary_data = Some(BTreeMap::from([("b".to_owned(), ByteString(vec![0, 1]))]));
    local.immutable = Some(true);
    let copy = config_map(&local, ME).expect("reflected");
    expect![[r#"
        {
          "apiVersion": "v1",
          "kind": "ConfigMap",
          "binaryData": {
            "b": "AAE="
          },
          "data": {
            "k": "v1"
          },
          "immutable": true,
          "metadata": {
            "annotations": {
              "note": "kept"
            },
            "labels": {
              "app": "shop",
              "tether.dev/reflected": "true",
              "tether.dev/remote-cluster-id": "consumer-1"
            },
            "name": "settings"
          }
        }"#]]
    .assert_eq(&serde_json::to_string_pretty(&copy).unwrap());
}

#[test]
fn what_is_never_reflected() {
    assert!(config_map(&cm("kube-root-ca.crt", "ca"), ME).is_none());
    let mut skipped = cm("private", "x");
    skipped.metadata.annotations = Some(BTreeMap::from([(SKIP.to_owned(), "true".to_owned())]));
    assert!(config_map(&skipped, ME).is_none());
    skipped.metadata.annotations = Some(BTreeMap::from([(SKIP.to_owned(), "false".to_owned())]));
    assert!(config_map(&skipped, ME).is_some());
    let token = Secret {
        metadata: meta("default-token", &[], &[]),
        type_: Some("kubernetes.io/service-account-token".to_owned()),
        ..Secret::default()
    };
    assert!(secret(&token, ME).is_none());
    let opaque = Secret {
        metadata: meta("db", &[], &[]),
        type_: Some("Opaque".to_owned()),
        ..Secret::default()
    };
    assert!(secret(&opaque, ME).is_some());
}

#[test]
fn config_maps_follow_creation_change_and_deletion() {
    let a = cm("a", "1");
    let b = cm("b", "1");
    // Nothing there yet: both created.
    assert_eq!(
        names(&config_maps(&[a.clone(), b.clone()], &[], ME)),
        ["applied a", "applied b"]
    );
    // In step: nothing to do.
    let there = [
        stored(&config_map(&a, ME).unwrap()),
        stored(&config_map(&b, ME).unwrap()),
    ];
    assert!(config_maps(&[a.clone(), b.clone()], &there, ME).is_empty());
    // b changed, a deleted locally.
    let b2 = cm("b", "2");
    assert_eq!(
        names(&config_maps(std::slice::from_ref(&b2), &there, ME)),
        ["applied b", "deleted a"]
    );
    // A label the consumer removed goes from the copy too.
    let mut b3 = b;
    b3.metadata.labels = None;
    assert_eq!(names(&config_maps(&[a, b3], &there, ME)), ["applied b"]);
}

#[test]
fn only_our_copies_are_changed_or_deleted() {
    let theirs = ConfigMap {
        metadata: meta("settings", &[("app", "provider")], &[]),
        ..ConfigMap::default()
    };
    let mut other_consumer = stored(&config_map(&cm("other", "1"), "consumer-2").unwrap());
    other_consumer.metadata.name = Some("other".to_owned());
    let ops = config_maps(&[cm("settings", "1")], &[theirs, other_consumer], ME);
    assert_eq!(names(&ops), ["conflict settings"]);
}

#[test]
fn an_immutable_copy_is_recreated_and_a_secret_changing_type_too() {
    let mut c = cm("frozen", "1");
    c.immutable = Some(true);
    let there = [stored(&config_map(&c, ME).unwrap())];
    let mut c2 = cm("frozen", "2");
    c2.immutable = Some(true);
    assert_eq!(names(&config_maps(&[c2], &there, ME)), ["recreated frozen"]);

    let s = Secret {
        metadata: meta("tls", &[], &[]),
        type_: Some("Opaque".to_owned()),
        data: Some(BTreeMap::from([(
            "k".to_owned(),
            ByteString(b"x".to_vec()),
        )])),
        ..Secret::default()
    };
    let there = [stored(&secret(&s, ME).unwrap())];
    assert!(secrets(std::slice::from_ref(&s), &there, ME).is_empty());
    let mut data = s.clone();
    data.data = Some(BTreeMap::from([(
        "k".to_owned(),
        ByteString(b"y".to_vec()),
    )]));
    assert_eq!(names(&secrets(&[data], &there, ME)), ["applied tls"]);
    let mut tls = s;
    tls.type_ = Some("kubernetes.io/tls".to_owned());
    assert_eq!(names(&secrets(&[tls], &there, ME)), ["recreated tls"]);
}

fn svc(name: &str, type_: &str, annotations: &[(&str, &str)]) -> Service {
    Service {
        metadata: meta(name, &[], annotations),
        spec: Some(ServiceSpec {
            type_: Some(type_.to_owned()),
            cluster_ip: Some("10.96.0.10".to_owned()),
            cluster_ips: Some(vec!["10.96.0.10".to_owned()]),
            external_ips: Some(vec!["192.0.2.1".to_owned()]),
            ip_families: Some(vec!["IPv4".to_owned()]),
            selector: Some(BTreeMap::from([("app".to_owned(), name.to_owned())])),
            ports: Some(vec![ServicePort {
                name: Some("echo".to_owned()),
                port: 7000,
                target_port: Some(IntOrString::Int(7000)),
                protocol: Some("TCP".to_owned()),
                node_port: (type_ != "ClusterIP").then_some(30007),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

#[test]
fn a_service_copy_keeps_ports_and_selector_and_leaves_addresses_to_the_provider() {
    let copy = service(&svc("echo", "LoadBalancer", &[]), ME).unwrap();
    expect![[r#"
        {
          "apiVersion": "v1",
          "kind": "Service",
          "metadata": {
            "labels": {
              "tether.dev/reflected": "true",
              "tether.dev/remote-cluster-id": "consumer-1"
            },
            "name": "echo"
          },
          "spec": {
            "ports": [
              {
                "name": "echo",
                "port": 7000,
                "protocol": "TCP",
                "targetPort": 7000
              }
            ],
            "selector": {
              "app": "echo"
            },
            "type": "ClusterIP"
          }
        }"#]]
    .assert_eq(&serde_json::to_string_pretty(&copy).unwrap());
    let kept = service(
        &svc("echo", "LoadBalancer", &[(KEEP_LOAD_BALANCER, "true")]),
        ME,
    )
    .unwrap();
    assert_eq!(kept.spec.unwrap().type_.as_deref(), Some("LoadBalancer"));
    let node_port = service(&svc("echo", "NodePort", &[]), ME).unwrap();
    let spec = node_port.spec.unwrap();
    assert_eq!(spec.type_.as_deref(), Some("NodePort"));
    assert_eq!(spec.ports.unwrap()[0].node_port, None);
    let mut headless = svc("db", "ClusterIP", &[]);
    headless.spec.as_mut().unwrap().cluster_ip = Some("None".to_owned());
    let copy = service(&headless, ME).unwrap();
    assert_eq!(copy.spec.unwrap().cluster_ip.as_deref(), Some("None"));
}

#[test]
fn a_service_copy_with_the_providers_addresses_is_in_step() {
    let local = svc("echo", "NodePort", &[]);
    let mut there = stored(&service(&local, ME).unwrap());
    let spec = there.spec.as_mut().unwrap();
    spec.cluster_ip = Some("10.200.0.5".to_owned());
    spec.cluster_ips = Some(vec!["10.200.0.5".to_owned()]);
    spec.ports.as_mut().unwrap()[0].node_port = Some(31111);
    assert!(
        services(
            std::slice::from_ref(&local),
            std::slice::from_ref(&there),
            ME
        )
        .is_empty()
    );
    let mut moved = local.clone();
    moved.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 8000;
    assert_eq!(
        names(&services(&[moved], &[there.clone()], ME)),
        ["applied echo"]
    );
    let mut headless = local;
    headless.spec.as_mut().unwrap().cluster_ip = Some("None".to_owned());
    assert_eq!(
        names(&services(&[headless], &[there], ME)),
        ["recreated echo"]
    );
}

fn endpoint(ip: &str, node: &str, ready: bool) -> Endpoint {
    Endpoint {
        addresses: vec![ip.to_owned()],
        conditions: Some(EndpointConditions {
            ready: Some(ready),
            serving: Some(ready),
            terminating: Some(false),
        }),
        node_name: Some(node.to_owned()),
        ..Endpoint::default()
    }
}

fn local_slice(
    name: &str,
    service: &str,
    manager: &str,
    endpoints: Vec<Endpoint>,
) -> EndpointSlice {
    EndpointSlice {
        metadata: meta(
            name,
            &[(SERVICE_NAME, service), (SLICE_MANAGED_BY, manager)],
            &[],
        ),
        address_type: "IPv4".to_owned(),
        endpoints,
        ports: Some(vec![EndpointPort {
            name: Some("echo".to_owned()),
            port: Some(7000),
            protocol: Some("TCP".to_owned()),
            ..EndpointPort::default()
        }]),
    }
}

/// The provider sees this cluster's 10.1.0.0/16 as 10.71.0.0/16.
fn view() -> PodView {
    PodView::new(&["10.1.0.0/16".to_owned()], &["10.71.0.0/16".to_owned()])
}

#[test]
fn slices_list_local_ready_pods_in_the_providers_view() {
    let virtual_nodes = BTreeSet::from(["provider-1".to_owned()]);
    let local = [
        local_slice(
            "echo-abc",
            "echo",
            KUBE_SLICE_MANAGER,
            vec![
                endpoint("10.1.2.3", "node-a", true),
                // Runs at the provider: the copy of the Service selects it there.
                endpoint("10.80.0.9", "provider-1", true),
                endpoint("10.1.2.4", "node-a", false),
                // Not in this cluster's pod CIDR (host network): no address to give.
                endpoint("172.16.0.2", "node-a", true),
            ],
        ),
        // Someone else's slice of the same Service is not this cluster's to publish.
        local_slice(
            "echo-x",
            "echo",
            "someone",
            vec![endpoint("10.1.9.9", "node-a", true)],
        ),
        local_slice(
            "web-abc",
            "web",
            KUBE_SLICE_MANAGER,
            vec![endpoint("10.1.5.5", "node-b", true)],
        ),
    ];
    let out = endpoint_slices("echo", &local, &virtual_nodes, &view(), ME);
    expect![[r#"
        [
          {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "addressType": "IPv4",
            "endpoints": [
              {
                "addresses": [
                  "10.71.2.3"
                ],
                "conditions": {
                  "ready": true,
                  "serving": true,
                  "terminating": false
                }
              }
            ],
            "metadata": {
              "labels": {
                "endpointslice.kubernetes.io/managed-by": "tether",
                "kubernetes.io/service-name": "echo",
                "tether.dev/reflected": "true",
                "tether.dev/remote-cluster-id": "consumer-1"
              },
              "name": "echo-tether-0"
            },
            "ports": [
              {
                "name": "echo",
                "port": 7000,
                "protocol": "TCP"
              }
            ]
          }
        ]"#]]
    .assert_eq(&serde_json::to_string_pretty(&out).unwrap());
    // No local endpoint: no slice.
    let only_remote = [local_slice(
        "echo-abc",
        "echo",
        KUBE_SLICE_MANAGER,
        vec![endpoint("10.80.0.9", "provider-1", true)],
    )];
    assert!(endpoint_slices("echo", &only_remote, &virtual_nodes, &view(), ME).is_empty());
}

#[test]
fn slices_follow_their_services() {
    let virtual_nodes = BTreeSet::new();
    let services_here = [svc("echo", "ClusterIP", &[])];
    let local = [local_slice(
        "echo-abc",
        "echo",
        KUBE_SLICE_MANAGER,
        vec![endpoint("10.1.2.3", "node-a", true)],
    )];
    let ops = slices(&services_here, &local, &[], &virtual_nodes, &view(), ME);
    assert_eq!(names(&ops), ["applied echo-tether-0"]);
    let there: Vec<EndpointSlice> = ops
        .into_iter()
        .map(|o| match o {
            Op::Apply(s) => stored(&s),
            other => panic!("{other:?}"),
        })
        .collect();
    assert!(slices(&services_here, &local, &there, &virtual_nodes, &view(), ME).is_empty());
    // The pod moved: the address changes.
    let moved = [local_slice(
        "echo-abc",
        "echo",
        KUBE_SLICE_MANAGER,
        vec![endpoint("10.1.2.8", "node-a", true)],
    )];
    assert_eq!(
        names(&slices(
            &services_here,
            &moved,
            &there,
            &virtual_nodes,
            &view(),
            ME
        )),
        ["applied echo-tether-0"]
    );
    // The Service is gone (its slices linger locally for a moment): the copy goes.
    assert_eq!(
        names(&slices(&[], &local, &there, &virtual_nodes, &view(), ME)),
        ["deleted echo-tether-0"]
    );
    // The provider's own slices of the Service are never touched, though its EndpointSlice
    // controller copies the copy's labels, our marks included, onto them.
    let mut providers = stored(&local_slice(
        "echo-xyz",
        "echo",
        KUBE_SLICE_MANAGER,
        vec![endpoint("10.80.0.9", "p-node", true)],
    ));
    let marks = providers
        .metadata
        .labels
        .get_or_insert_with(Default::default);
    marks.insert(REFLECTED.to_owned(), "true".to_owned());
    marks.insert(REMOTE_CLUSTER_ID.to_owned(), ME.to_owned());
    let mut with_theirs = there;
    with_theirs.push(providers);
    assert!(
        slices(
            &services_here,
            &local,
            &with_theirs,
            &virtual_nodes,
            &view(),
            ME
        )
        .is_empty()
    );
}

#[test]
fn the_providers_warnings_about_offloaded_pods_come_back_about_the_pods_here() {
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::events::v1::Event;
    let event = |name: &str, kind: &str, about: &str| Event {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some("shop-consumer-1".to_owned()),
            ..ObjectMeta::default()
        },
        regarding: Some(ObjectReference {
            kind: Some(kind.to_owned()),
            name: Some(about.to_owned()),
            namespace: Some("shop-consumer-1".to_owned()),
            uid: Some("provider-uid".to_owned()),
            ..ObjectReference::default()
        }),
        reason: Some("BackOff".to_owned()),
        note: Some("Back-off restarting failed container app".to_owned()),
        type_: Some("Warning".to_owned()),
        reporting_controller: Some("kubelet".to_owned()),
        ..Event::default()
    };
    let normal = |name: &str, about: &str| Event {
        reason: Some("Scheduled".to_owned()),
        note: Some("Successfully assigned shop-consumer-1/web-1 to p-node-1".to_owned()),
        type_: Some("Normal".to_owned()),
        reporting_controller: Some("default-scheduler".to_owned()),
        ..event(name, "Pod", about)
    };
    // Only web-1 has a ShadowPod in the twin; db-0 runs here.
    let offloaded = BTreeMap::from([("web-1".to_owned(), "uid-web-1".to_owned())]);
    let remote = [
        event("web-1.1", "Pod", "web-1"),
        // Same name as a pod that runs here: not the provider's to report on.
        event("db-0.1", "Pod", "db-0"),
        event("web.1", "Service", "web-1"),
        event("gone.1", "Pod", "gone"),
        // The provider's scheduling, like any Normal Event, stays there.
        normal("web-1.2", "web-1"),
    ];
    let out = events(&remote, &offloaded, "shop", "provider-1");
    expect![[r#"
        [
          {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {
              "labels": {
                "tether.dev/reflected": "true"
              },
              "name": "web-1.1"
            },
            "note": "Back-off restarting failed container app",
            "reason": "BackOff",
            "regarding": {
              "apiVersion": "v1",
              "kind": "Pod",
              "name": "web-1",
              "namespace": "shop",
              "uid": "uid-web-1"
            },
            "reportingController": "tether.dev/reflection",
            "reportingInstance": "provider-1",
            "type": "Warning"
          }
        ]"#]]
    .assert_eq(&serde_json::to_string_pretty(&out).unwrap());
}
