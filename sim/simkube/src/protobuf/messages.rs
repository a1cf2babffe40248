//! The Kubernetes messages decoded from protobuf, each listed with all its fields (the
//! destructuring makes the compiler check the list): converted fields, with their JSON name
//! where it is not the protobuf name's camel case, and refused ones, which must be unset.

use k8s_pb::api::{
    apps::v1 as apps, authentication::v1 as authn, authorization::v1 as authz,
    certificates::v1 as certs, core::v1 as core, policy::v1 as policy, rbac::v1 as rbac,
};
use k8s_pb::apimachinery::pkg::api::resource::Quantity;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Map, Value};

use super::{ProtobufError, ToJson, json_name, parse, refuse_if_set, time_json};

/// Parses and converts one kind's message.
pub(super) type Decoder = fn(&[u8]) -> Result<Result<Value, ProtobufError>, prost::DecodeError>;

/// The decoder of a group/version and kind, for the kinds converted here.
pub(super) fn decoder(api_version: &str, kind: &str) -> Option<Decoder> {
    Some(match (api_version, kind) {
        ("v1", "Namespace") => parse::<core::Namespace>,
        ("v1", "ServiceAccount") => parse::<core::ServiceAccount>,
        ("v1", "ConfigMap") => parse::<core::ConfigMap>,
        ("v1", "Secret") => parse::<core::Secret>,
        ("apps/v1", "Deployment") => parse::<apps::Deployment>,
        ("rbac.authorization.k8s.io/v1", "Role") => parse::<rbac::Role>,
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => parse::<rbac::ClusterRole>,
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => parse::<rbac::RoleBinding>,
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => parse::<rbac::ClusterRoleBinding>,
        ("authentication.k8s.io/v1", "TokenRequest") => parse::<authn::TokenRequest>,
        ("authentication.k8s.io/v1", "TokenReview") => parse::<authn::TokenReview>,
        ("authentication.k8s.io/v1", "SelfSubjectReview") => parse::<authn::SelfSubjectReview>,
        ("authorization.k8s.io/v1", "SelfSubjectAccessReview") => {
            parse::<authz::SelfSubjectAccessReview>
        }
        ("authorization.k8s.io/v1", "SubjectAccessReview") => parse::<authz::SubjectAccessReview>,
        ("authorization.k8s.io/v1", "LocalSubjectAccessReview") => {
            parse::<authz::LocalSubjectAccessReview>
        }
        ("authorization.k8s.io/v1", "SelfSubjectRulesReview") => {
            parse::<authz::SelfSubjectRulesReview>
        }
        ("certificates.k8s.io/v1", "CertificateSigningRequest") => {
            parse::<certs::CertificateSigningRequest>
        }
        ("policy/v1", "Eviction") => parse::<policy::Eviction>,
        _ => return None,
    })
}

/// `message!(Type { converted, renamed as "jsonName" } kept_zero { pointers } refused {
/// unconverted })`. Converted numbers and booleans at zero are left out, as Go's `omitempty`
/// leaves out its non-pointer fields; `kept_zero` lists the Go pointers and the fields without
/// `omitempty`, whose zero is printed.
macro_rules! message {
    (
        $ty:path { $($field:ident $(as $json:literal)?),* $(,)? }
        $(kept_zero { $($kept:ident),* $(,)? })?
        $(refused { $($refused:ident),* $(,)? })?
    ) => {
        impl ToJson for $ty {
            fn element(&self) -> Result<Value, ProtobufError> {
                let $ty { $($field,)* $($($kept,)*)? $($($refused,)*)? } = self;
                $($( refuse_if_set(stringify!($ty), stringify!($refused), $refused)?; )*)?
                let mut object = Map::new();
                $(
                    if let Some(value) = $field.field()?.filter(|v| !is_zero_scalar(v)) {
                        object.insert(json_name(stringify!($field), None $(.or(Some($json)))?), value);
                    }
                )*
                $($(
                    if let Some(value) = $kept.field()? {
                        object.insert(json_name(stringify!($kept), None), value);
                    }
                )*)?
                Ok(Value::Object(object))
            }
        }
    };
}

/// A zero number or `false`: what Go's `omitempty` leaves out.
fn is_zero_scalar(value: &Value) -> bool {
    match value {
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        _ => false,
    }
}

// --- apimachinery ---------------------------------------------------------------------------

impl ToJson for meta::Time {
    fn element(&self) -> Result<Value, ProtobufError> {
        Ok(time_json(self.seconds, self.nanos))
    }
}

impl ToJson for IntOrString {
    fn element(&self) -> Result<Value, ProtobufError> {
        Ok(match self.r#type {
            Some(1) => Value::String(self.str_val.clone().unwrap_or_default()),
            _ => Value::from(self.int_val.unwrap_or_default()),
        })
    }
}

impl ToJson for Quantity {
    fn element(&self) -> Result<Value, ProtobufError> {
        Ok(Value::String(self.string.clone().unwrap_or_default()))
    }
}

/// Managed fields travel as the raw JSON of the field set.
impl ToJson for meta::FieldsV1 {
    fn element(&self) -> Result<Value, ProtobufError> {
        match self.raw.as_deref() {
            None | Some([]) => Ok(Value::Null),
            Some(raw) => serde_json::from_slice(raw).map_err(|source| ProtobufError::RawJson {
                field: "FieldsV1",
                source,
            }),
        }
    }
}

/// Go's named slices (`type ExtraValue []string`) are messages in protobuf, lists in JSON.
macro_rules! named_slice {
    ($($ty:path),*) => {
        $(impl ToJson for $ty {
            fn element(&self) -> Result<Value, ProtobufError> {
                self.items.element()
            }

            fn field(&self) -> Result<Option<Value>, ProtobufError> {
                self.items.field()
            }
        })*
    };
}
named_slice!(authn::ExtraValue, authz::ExtraValue, certs::ExtraValue);

message!(meta::ObjectMeta {
    name, generate_name, namespace, self_link, uid, resource_version, generation,
    creation_timestamp, deletion_timestamp, labels, annotations, owner_references, finalizers,
    managed_fields,
} kept_zero { deletion_grace_period_seconds });
message!(meta::OwnerReference { api_version, kind, name, uid }
    kept_zero { controller, block_owner_deletion });
message!(meta::ManagedFieldsEntry {
    manager,
    operation,
    api_version,
    time,
    fields_type,
    fields_v1,
    subresource,
});
message!(meta::LabelSelector {
    match_labels,
    match_expressions
});
message!(meta::LabelSelectorRequirement {
    key,
    operator,
    values
});
message!(meta::FieldSelectorRequirement {
    key,
    operator,
    values
});
message!(meta::DeleteOptions { preconditions, propagation_policy, dry_run } kept_zero {
    grace_period_seconds, orphan_dependents, ignore_store_read_error_with_cluster_breaking_potential,
});
message!(meta::Preconditions {
    uid,
    resource_version
});

// --- core/v1 --------------------------------------------------------------------------------

message!(core::Namespace {
    metadata,
    spec,
    status
});
message!(core::NamespaceSpec { finalizers });
message!(core::NamespaceStatus { phase, conditions });
message!(core::NamespaceCondition {
    r#type,
    status,
    last_transition_time,
    reason,
    message
});
message!(core::ServiceAccount { metadata, secrets, image_pull_secrets }
    kept_zero { automount_service_account_token });
message!(core::ObjectReference {
    kind,
    namespace,
    name,
    uid,
    api_version,
    resource_version,
    field_path,
});
message!(core::LocalObjectReference { name });
message!(core::ConfigMap { metadata, data, binary_data } kept_zero { immutable });
message!(core::Secret { metadata, data, string_data, r#type } kept_zero { immutable });
message!(core::PodTemplateSpec { metadata, spec });
message!(core::PodSpec {
    init_containers, containers, restart_policy, dns_policy, node_selector, service_account_name,
    service_account, node_name, host_network, host_pid as "hostPID", host_ipc as "hostIPC",
    image_pull_secrets, hostname, subdomain, scheduler_name, tolerations, priority_class_name,
    runtime_class_name, preemption_policy,
} kept_zero {
    termination_grace_period_seconds, active_deadline_seconds, automount_service_account_token,
    share_process_namespace, priority, enable_service_links, set_hostname_as_fqdn, host_users,
} refused {
    volumes, ephemeral_containers, security_context, affinity, host_aliases, dns_config,
    readiness_gates, overhead, topology_spread_constraints, os, scheduling_gates,
    resource_claims, resources, hostname_override, workload_ref,
});
message!(core::Container {
    name, image, command, args, working_dir, ports, env, resources, restart_policy,
    termination_message_path, termination_message_policy, image_pull_policy, stdin, stdin_once,
    tty,
} refused {
    env_from, resize_policy, restart_policy_rules, volume_mounts, volume_devices, liveness_probe,
    readiness_probe, startup_probe, lifecycle, security_context,
});
message!(core::ContainerPort { name, host_port, protocol, host_ip as "hostIP" }
    kept_zero { container_port });
message!(core::EnvVar { name, value } refused { value_from });
message!(core::ResourceRequirements { limits, requests } refused { claims });
message!(core::Toleration { key, operator, value, effect } kept_zero { toleration_seconds });

// --- apps/v1 --------------------------------------------------------------------------------

message!(apps::Deployment {
    metadata,
    spec,
    status
});
message!(apps::DeploymentSpec { selector, template, strategy, min_ready_seconds, paused }
    kept_zero { replicas, revision_history_limit, progress_deadline_seconds });
message!(apps::DeploymentStrategy {
    r#type,
    rolling_update
});
message!(apps::RollingUpdateDeployment {
    max_unavailable,
    max_surge
});
message!(apps::DeploymentStatus {
    observed_generation, replicas, updated_replicas, ready_replicas, available_replicas,
    unavailable_replicas, conditions,
} kept_zero { collision_count } refused { terminating_replicas });
message!(apps::DeploymentCondition {
    r#type,
    status,
    last_update_time,
    last_transition_time,
    reason,
    message,
});

// --- rbac.authorization.k8s.io/v1 -----------------------------------------------------------

message!(rbac::Role { metadata, rules });
message!(rbac::ClusterRole {
    metadata,
    rules,
    aggregation_rule
});
message!(rbac::AggregationRule {
    cluster_role_selectors
});
message!(rbac::PolicyRule {
    verbs, api_groups, resources, resource_names, non_resource_ur_ls as "nonResourceURLs",
});
message!(rbac::RoleBinding {
    metadata,
    subjects,
    role_ref
});
message!(rbac::ClusterRoleBinding {
    metadata,
    subjects,
    role_ref
});
message!(rbac::RoleRef {
    api_group,
    kind,
    name
});
message!(rbac::Subject {
    kind,
    api_group,
    name,
    namespace
});

// --- authentication.k8s.io/v1 ---------------------------------------------------------------

message!(authn::TokenRequest {
    metadata,
    spec,
    status
});
message!(authn::TokenRequestSpec { audiences, bound_object_ref } kept_zero { expiration_seconds });
message!(authn::BoundObjectReference { kind, api_version, name, u_id as "uid" });
message!(authn::TokenRequestStatus {
    token,
    expiration_timestamp
});
message!(authn::TokenReview {
    metadata,
    spec,
    status
});
message!(authn::TokenReviewSpec { token, audiences });
message!(authn::TokenReviewStatus {
    authenticated,
    user,
    audiences,
    error
});
message!(authn::UserInfo {
    username,
    uid,
    groups,
    extra
});
message!(authn::SelfSubjectReview { metadata, status });
message!(authn::SelfSubjectReviewStatus { user_info });

// --- authorization.k8s.io/v1 ----------------------------------------------------------------

message!(authz::SelfSubjectAccessReview {
    metadata,
    spec,
    status
});
message!(authz::SelfSubjectAccessReviewSpec {
    resource_attributes,
    non_resource_attributes
});
message!(authz::SubjectAccessReview {
    metadata,
    spec,
    status
});
message!(authz::LocalSubjectAccessReview {
    metadata,
    spec,
    status
});
message!(authz::SubjectAccessReviewSpec {
    resource_attributes,
    non_resource_attributes,
    user,
    groups,
    extra,
    uid,
});
message!(authz::ResourceAttributes {
    namespace,
    verb,
    group,
    version,
    resource,
    subresource,
    name,
    field_selector,
    label_selector,
});
message!(authz::FieldSelectorAttributes {
    raw_selector,
    requirements
});
message!(authz::LabelSelectorAttributes {
    raw_selector,
    requirements
});
message!(authz::NonResourceAttributes { path, verb });
message!(authz::SubjectAccessReviewStatus { denied, reason, evaluation_error }
    kept_zero { allowed });
message!(authz::SelfSubjectRulesReview {
    metadata,
    spec,
    status
});
message!(authz::SelfSubjectRulesReviewSpec { namespace });
message!(authz::SubjectRulesReviewStatus { resource_rules, non_resource_rules, evaluation_error }
    kept_zero { incomplete });
message!(authz::ResourceRule {
    verbs,
    api_groups,
    resources,
    resource_names
});
message!(authz::NonResourceRule { verbs, non_resource_ur_ls as "nonResourceURLs" });

// --- certificates.k8s.io/v1 and policy/v1 ---------------------------------------------------

message!(certs::CertificateSigningRequest {
    metadata,
    spec,
    status
});
message!(certs::CertificateSigningRequestSpec {
    request, signer_name, usages, username, uid, groups, extra,
} kept_zero { expiration_seconds });
message!(certs::CertificateSigningRequestStatus {
    conditions,
    certificate
});
message!(certs::CertificateSigningRequestCondition {
    r#type,
    status,
    reason,
    message,
    last_update_time,
    last_transition_time,
});
message!(policy::Eviction {
    metadata,
    delete_options
});
