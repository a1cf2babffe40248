//! Protobuf bodies built with the generated types, encoded as Go encodes them (non-pointer fields
//! present at their zero values), and decoded back to the JSON kube-apiserver would make of them.

use expect_test::{Expect, expect};
use k8s_pb::api::apps::v1 as apps;
use k8s_pb::api::authentication::v1 as authn;
use k8s_pb::api::authorization::v1 as authz;
use k8s_pb::api::core::v1 as core;
use k8s_pb::api::rbac::v1 as rbac;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::runtime::TypeMeta;
use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;
use proptest::prelude::*;
use serde_json::json;

use super::*;

const CONFIGMAP: DefaultKind<'static> = DefaultKind {
    api_version: "v1",
    kind: "ConfigMap",
};

/// The `k8s\0` envelope around an encoded object, as kubectl's protobuf serializer writes it.
fn envelope(api_version: &str, kind: &str, object: &impl Message) -> Vec<u8> {
    let unknown = Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some(api_version.to_owned()),
            kind: Some(kind.to_owned()),
        }),
        raw: Some(object.encode_to_vec()),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    [MAGIC, &unknown.encode_to_vec()].concat()
}

/// ObjectMeta as Go encodes an object that only has a name: every non-pointer field present at
/// its zero value, the creation timestamp as Go's zero time.
fn go_meta(name: &str) -> Option<meta::ObjectMeta> {
    let empty = || Some(String::new());
    Some(meta::ObjectMeta {
        name: Some(name.to_owned()),
        generate_name: empty(),
        namespace: empty(),
        self_link: empty(),
        uid: empty(),
        resource_version: empty(),
        generation: Some(0),
        creation_timestamp: Some(meta::Time {
            seconds: Some(-62_135_596_800),
            nanos: Some(0),
        }),
        ..Default::default()
    })
}

fn check(body: &[u8], expected: Expect) {
    let json = decode(body, CONFIGMAP).expect("decodes");
    expected.assert_eq(&serde_json::to_string_pretty(&json).expect("json"));
}

#[test]
fn a_configmap_keeps_its_data_and_drops_go_zero_values() {
    let cm = core::ConfigMap {
        metadata: go_meta("settings"),
        data: [
            ("mode".into(), "fast".into()),
            ("empty".into(), String::new()),
        ]
        .into(),
        binary_data: [("blob".into(), vec![0, 1, 2, 255])].into(),
        immutable: None,
    };
    check(
        &envelope("v1", "ConfigMap", &cm),
        expect![[r#"
            {
              "apiVersion": "v1",
              "kind": "ConfigMap",
              "metadata": {
                "name": "settings",
                "creationTimestamp": null
              },
              "data": {
                "empty": "",
                "mode": "fast"
              },
              "binaryData": {
                "blob": "AAEC/w=="
              }
            }"#]],
    );
}

/// What `kubectl create deployment web --image=nginx --replicas=0 --port=80` sends, roughly.
fn deployment() -> apps::Deployment {
    let container = core::Container {
        name: Some("web".into()),
        image: Some("nginx".into()),
        ports: vec![core::ContainerPort {
            container_port: Some(80),
            host_port: Some(0),
            host_ip: Some(String::new()),
            ..Default::default()
        }],
        resources: Some(core::ResourceRequirements::default()),
        termination_message_path: Some(String::new()),
        stdin: Some(false),
        ..Default::default()
    };
    let surge = IntOrString {
        r#type: Some(1),
        str_val: Some("25%".into()),
        int_val: Some(0),
    };
    apps::Deployment {
        metadata: go_meta("web"),
        spec: Some(apps::DeploymentSpec {
            replicas: Some(0),
            selector: Some(meta::LabelSelector {
                match_labels: [("app".into(), "web".into())].into(),
                match_expressions: vec![],
            }),
            template: Some(core::PodTemplateSpec {
                metadata: go_meta(""),
                spec: Some(core::PodSpec {
                    containers: vec![container],
                    host_network: Some(false),
                    ..Default::default()
                }),
            }),
            strategy: Some(apps::DeploymentStrategy {
                r#type: Some(String::new()),
                rolling_update: Some(apps::RollingUpdateDeployment {
                    max_surge: Some(surge),
                    max_unavailable: Some(IntOrString {
                        r#type: Some(0),
                        int_val: Some(1),
                        str_val: Some(String::new()),
                    }),
                }),
            }),
            ..Default::default()
        }),
        status: Some(apps::DeploymentStatus {
            replicas: Some(0),
            ..Default::default()
        }),
    }
}

#[test]
fn a_deployment_keeps_pointer_zeros_and_empty_messages() {
    check(
        &envelope("apps/v1", "Deployment", &deployment()),
        expect![[r#"
            {
              "apiVersion": "apps/v1",
              "kind": "Deployment",
              "metadata": {
                "name": "web",
                "creationTimestamp": null
              },
              "spec": {
                "selector": {
                  "matchLabels": {
                    "app": "web"
                  }
                },
                "template": {
                  "metadata": {
                    "creationTimestamp": null
                  },
                  "spec": {
                    "containers": [
                      {
                        "name": "web",
                        "image": "nginx",
                        "ports": [
                          {
                            "containerPort": 80
                          }
                        ],
                        "resources": {}
                      }
                    ]
                  }
                },
                "strategy": {
                  "rollingUpdate": {
                    "maxUnavailable": 1,
                    "maxSurge": "25%"
                  }
                },
                "replicas": 0
              },
              "status": {}
            }"#]],
    );
}

#[test]
fn fields_not_converted_are_refused_when_set_and_ignored_at_zero() {
    fn pod(d: &mut apps::Deployment) -> &mut core::PodSpec {
        d.spec
            .as_mut()
            .and_then(|s| s.template.as_mut())
            .and_then(|t| t.spec.as_mut())
            .expect("pod spec")
    }
    let mut with_probe = deployment();
    // A zero-valued security context (Go's non-pointer struct) says nothing: accepted.
    pod(&mut with_probe).security_context = Some(core::PodSecurityContext::default());
    assert!(decode(&envelope("apps/v1", "Deployment", &with_probe), CONFIGMAP).is_ok());
    pod(&mut with_probe).containers[0].liveness_probe = Some(core::Probe {
        period_seconds: Some(5),
        ..Default::default()
    });
    let error =
        decode(&envelope("apps/v1", "Deployment", &with_probe), CONFIGMAP).expect_err("refused");
    assert_eq!(
        error.to_string(),
        "the protobuf field core::Container.livenessProbe is not decoded by this server; send the object as JSON"
    );
}

#[test]
fn rbac_lists_keep_the_empty_core_group() {
    let role = rbac::Role {
        metadata: go_meta("reader"),
        rules: vec![rbac::PolicyRule {
            verbs: vec!["get".into(), "list".into()],
            api_groups: vec![String::new()],
            resources: vec!["configmaps".into()],
            ..Default::default()
        }],
    };
    let json = decode(
        &envelope("rbac.authorization.k8s.io/v1", "Role", &role),
        CONFIGMAP,
    )
    .expect("decodes");
    assert_eq!(
        json["rules"],
        json!([{"verbs": ["get", "list"], "apiGroups": [""], "resources": ["configmaps"]}])
    );
    let rule = rbac::PolicyRule {
        verbs: vec!["get".into()],
        non_resource_ur_ls: vec!["/healthz".into()],
        ..Default::default()
    };
    assert_eq!(
        rule.element().expect("json"),
        json!({"verbs": ["get"], "nonResourceURLs": ["/healthz"]})
    );
}

#[test]
fn reviews_and_token_requests_decode_with_named_slices_and_times() {
    let review = authz::SubjectAccessReview {
        metadata: go_meta(""),
        spec: Some(authz::SubjectAccessReviewSpec {
            resource_attributes: Some(authz::ResourceAttributes {
                namespace: Some("tenant-a".into()),
                verb: Some("list".into()),
                resource: Some("configmaps".into()),
                ..Default::default()
            }),
            user: Some("alice".into()),
            extra: [(
                "scopes".into(),
                authz::ExtraValue {
                    items: vec!["a".into(), "b".into()],
                },
            )]
            .into(),
            ..Default::default()
        }),
        status: Some(authz::SubjectAccessReviewStatus {
            allowed: Some(false),
            ..Default::default()
        }),
    };
    let json = decode(
        &envelope("authorization.k8s.io/v1", "SubjectAccessReview", &review),
        CONFIGMAP,
    )
    .expect("decodes");
    assert_eq!(
        json["spec"],
        json!({"resourceAttributes": {"namespace": "tenant-a", "verb": "list", "resource": "configmaps"}, "user": "alice", "extra": {"scopes": ["a", "b"]}})
    );

    let request = authn::TokenRequest {
        metadata: go_meta("robot"),
        spec: Some(authn::TokenRequestSpec {
            audiences: vec!["vault".into()],
            expiration_seconds: Some(1200),
            bound_object_ref: Some(authn::BoundObjectReference {
                kind: Some("Pod".into()),
                name: Some("web".into()),
                u_id: Some("1234".into()),
                ..Default::default()
            }),
        }),
        status: Some(authn::TokenRequestStatus {
            token: Some(String::new()),
            expiration_timestamp: Some(meta::Time {
                seconds: Some(1_747_303_200),
                nanos: Some(0),
            }),
        }),
    };
    let json = decode(
        &envelope("authentication.k8s.io/v1", "TokenRequest", &request),
        CONFIGMAP,
    )
    .expect("decodes");
    assert_eq!(
        (&json["spec"], &json["status"]),
        (
            &json!({"audiences": ["vault"], "expirationSeconds": 1200, "boundObjectRef": {"kind": "Pod", "name": "web", "uid": "1234"}}),
            &json!({"expirationTimestamp": "2025-05-15T10:00:00Z"})
        )
    );
}

#[test]
fn an_envelope_without_a_type_takes_the_urls() {
    let ns = core::Namespace {
        metadata: go_meta("team-a"),
        ..Default::default()
    };
    let unknown = Unknown {
        raw: Some(ns.encode_to_vec()),
        ..Default::default()
    };
    let body = [MAGIC, &unknown.encode_to_vec()].concat();
    let json = decode(
        &body,
        DefaultKind {
            api_version: "v1",
            kind: "Namespace",
        },
    )
    .expect("decodes");
    assert_eq!(
        (
            &json["apiVersion"],
            &json["kind"],
            &json["metadata"]["name"]
        ),
        (&json!("v1"), &json!("Namespace"), &json!("team-a"))
    );
}

/// A ConfigMap whose metadata field claims five bytes and has two.
fn truncated_configmap() -> Vec<u8> {
    let unknown = Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some("v1".into()),
            kind: Some("ConfigMap".into()),
        }),
        raw: Some(b"\x0a\x05ab".to_vec()),
        ..Default::default()
    };
    [MAGIC, &unknown.encode_to_vec()].concat()
}

#[test]
fn bad_bodies_name_what_is_wrong() {
    let errors: Vec<String> = [
        &b"{}"[..],
        b"k8s\0\x0a\xff",
        &envelope("v1", "Widget", &core::ConfigMap::default()),
        &envelope("v1", "Pod", &core::ConfigMap::default()),
        &truncated_configmap(),
    ]
    .iter()
    .map(|body| decode(body, CONFIGMAP).expect_err("refused").to_string())
    .collect();
    expect![[r#"
        [
            "the body does not start with the Kubernetes protobuf prefix \"k8s\\x00\"",
            "malformed protobuf envelope",
            "no kind \"Widget\" is registered for version \"v1\"",
            "protobuf bodies of Pod (v1) are not decoded by this server; send JSON",
            "malformed protobuf ConfigMap",
        ]
    "#]]
    .assert_debug_eq(&errors);
}

#[test]
fn json_names_undo_the_snake_case() {
    let names: Vec<String> = [
        ("working_dir", None),
        ("r#type", None),
        ("fields_v1", None),
        ("host_ip", Some("hostIP")),
    ]
    .into_iter()
    .map(|(rust, explicit)| json_name(rust, explicit))
    .collect();
    assert_eq!(names, ["workingDir", "type", "fieldsV1", "hostIP"]);
}

proptest! {
    #[test]
    fn arbitrary_bytes_after_the_prefix_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode(&[MAGIC, &tail].concat(), CONFIGMAP);
    }

    #[test]
    fn arbitrary_objects_in_a_valid_envelope_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..256)) {
        let unknown = Unknown {
            type_meta: Some(TypeMeta {
                api_version: Some("apps/v1".into()),
                kind: Some("Deployment".into()),
            }),
            raw: Some(raw),
            ..Default::default()
        };
        let _ = decode(&[MAGIC, &unknown.encode_to_vec()].concat(), CONFIGMAP);
    }
}
