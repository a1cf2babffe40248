//! What `tether install` creates, as typed Kubernetes objects in the order they are applied:
//! the namespace, the CRDs, the controller's ServiceAccount and least-privilege RBAC, the
//! cluster-ID ConfigMap, the controller Deployment and the authentication Service, and the
//! `tether` StorageClass whose claims the controller provisions at providers.
//!
//! Pure: no IO, no clock, no randomness. The same options always render the same objects.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    WebhookClientConfig,
};
use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec, Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapKeySelector, Container, ContainerPort, EnvVar, EnvVarSource,
    HTTPGetAction, Namespace, ObjectFieldSelector, PodSecurityContext, PodSpec, PodTemplateSpec,
    Probe, ResourceRequirements, SeccompProfile, SecurityContext, Service, ServiceAccount,
    ServicePort, ServiceSpec, Toleration,
};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;
use tether_api::ClusterId;
use tether_api::names::{SYSTEM_NAMESPACE, labels, network, objects, storage};
use tether_api::rbac;

/// The controller's admin port (`/metrics`, `/healthz`, `/readyz`).
pub const ADMIN_PORT: i32 = 9090;
/// The authentication service's container port.
pub const AUTH_PORT: i32 = 8443;
/// The admission webhook's container port.
pub const WEBHOOK_PORT: i32 = 9443;
/// The virtual nodes' kubelet API port (the controller's `--kubelet-listen` default).
pub const KUBELET_PORT: i32 = 10250;
/// The authentication Service's port.
pub const AUTH_SERVICE_PORT: i32 = 443;
/// The Role (and RoleBinding) in `default` that lets the controller read the API server's
/// EndpointSlice.
pub const APISERVER_ROLE: &str = "tether-controller-apiserver";
/// The Role (and RoleBinding) in `kube-node-lease` that lets the controller keep its
/// virtual nodes' Leases.
pub const NODE_LEASE_ROLE: &str = "tether-controller-node-leases";
/// The Role (and RoleBinding) in `kube-system` that lets the controller read the API
/// server's client CA, which callers of the virtual kubelet API must hold a certificate of.
pub const CLIENT_CA_ROLE: &str = "tether-controller-client-ca";
/// Where the API server publishes its client CA.
pub const CLIENT_CA_NAMESPACE: &str = "kube-system";
/// Where kubelets keep their node Leases.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
/// The controller's container name.
pub const CONTAINER: &str = "controller";
/// The label whose value names the controller's pods.
pub const NAME_LABEL: &str = "app.kubernetes.io/name";
/// The user the image runs as (the distroless convention for "nonroot").
pub const RUN_AS_USER: i64 = 65532;

/// The CLI's version, as it appears in the default image tag (`v0.1.0`).
pub fn cli_version() -> String {
    format!("v{}", env!("CARGO_PKG_VERSION"))
}

/// The image `tether install` deploys unless `--image` says otherwise.
pub fn default_image() -> String {
    format!("{}:{}", objects::IMAGE, cli_version())
}

/// The authentication Service's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize)]
pub enum AuthServiceType {
    /// A load balancer address (the default; needs a load-balancer provider).
    #[default]
    #[value(name = "LoadBalancer")]
    LoadBalancer,
    /// A port on every node.
    #[value(name = "NodePort")]
    NodePort,
}

impl AuthServiceType {
    /// The Service `spec.type`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LoadBalancer => "LoadBalancer",
            Self::NodePort => "NodePort",
        }
    }
}

/// Everything the rendered objects depend on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallOptions {
    /// The cluster's ID (stored in `tether-cluster-id`).
    pub cluster_id: ClusterId,
    /// The controller's image reference.
    pub image: String,
    /// How the authentication service is exposed.
    pub auth_service_type: AuthServiceType,
    /// Controller replicas (leader election makes more than one safe).
    pub replicas: i32,
    /// `--api-server-url` for the controller: the API server URL peers should use.
    pub api_server_url: Option<String>,
    /// `--auth-url` for the controller: the authentication URL peers should use.
    pub auth_url: Option<String>,
    /// `--identity-lifetime` for the controller (a duration such as `24h`).
    pub identity_lifetime: Option<String>,
    /// The cluster's CIDRs for the `tether-network` ConfigMap; left out when unknown.
    pub network: Option<NetworkCidrs>,
    /// The admission webhook's CA (PEM), when the controller already made one: kept in the
    /// webhook configuration so that a re-install never leaves it without one.
    pub webhook_ca: Option<String>,
    /// `--resource-enforcement` for the controller: how strictly consumers' offloaded pods
    /// are held to their grants here.
    pub resource_enforcement: tether_resources::Enforcement,
}

/// The cluster's own CIDRs, as the networking module needs them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkCidrs {
    /// Pod CIDRs.
    pub pod: Vec<String>,
    /// Service CIDRs.
    pub service: Vec<String>,
    /// The remap pool (`--remap-pool`); the controller uses RFC 1918 when absent.
    pub remap_pool: Option<String>,
    /// The external CIDR (`--external-cidr`).
    pub external: Option<String>,
}

impl InstallOptions {
    /// Defaults for everything but the cluster ID.
    pub fn new(cluster_id: ClusterId) -> Self {
        Self {
            cluster_id,
            image: default_image(),
            auth_service_type: AuthServiceType::default(),
            replicas: 1,
            api_server_url: None,
            auth_url: None,
            identity_lifetime: None,
            network: None,
            webhook_ca: None,
            resource_enforcement: tether_resources::Enforcement::Soft,
        }
    }
}

/// One object `tether install` applies.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)]
pub enum Manifest {
    /// `tether-system`.
    Namespace(Namespace),
    /// A Tether CRD.
    CustomResourceDefinition(CustomResourceDefinition),
    /// The controller's ServiceAccount.
    ServiceAccount(ServiceAccount),
    /// A ClusterRole.
    ClusterRole(ClusterRole),
    /// A ClusterRoleBinding.
    ClusterRoleBinding(ClusterRoleBinding),
    /// A Role.
    Role(Role),
    /// A RoleBinding.
    RoleBinding(RoleBinding),
    /// The cluster-ID ConfigMap.
    ConfigMap(ConfigMap),
    /// The controller.
    Deployment(Deployment),
    /// The fabric, one pod per node.
    DaemonSet(DaemonSet),
    /// The authentication and webhook Services.
    Service(Service),
    /// The pod admission webhook of offloaded namespaces.
    MutatingWebhookConfiguration(MutatingWebhookConfiguration),
    /// The `tether` StorageClass.
    StorageClass(StorageClass),
}

macro_rules! each_manifest {
    ($value:expr, $obj:ident => $body:expr) => {
        match $value {
            Manifest::Namespace($obj) => $body,
            Manifest::CustomResourceDefinition($obj) => $body,
            Manifest::ServiceAccount($obj) => $body,
            Manifest::ClusterRole($obj) => $body,
            Manifest::ClusterRoleBinding($obj) => $body,
            Manifest::Role($obj) => $body,
            Manifest::RoleBinding($obj) => $body,
            Manifest::ConfigMap($obj) => $body,
            Manifest::Deployment($obj) => $body,
            Manifest::DaemonSet($obj) => $body,
            Manifest::Service($obj) => $body,
            Manifest::MutatingWebhookConfiguration($obj) => $body,
            Manifest::StorageClass($obj) => $body,
        }
    };
}
pub(crate) use each_manifest;

impl Manifest {
    /// The object's metadata.
    pub fn metadata(&self) -> &ObjectMeta {
        each_manifest!(self, o => &o.metadata)
    }

    /// The object's name.
    pub fn name(&self) -> &str {
        self.metadata().name.as_deref().unwrap_or_default()
    }

    /// The object's namespace (`None` for cluster-scoped objects).
    pub fn namespace(&self) -> Option<&str> {
        self.metadata().namespace.as_deref()
    }

    /// The object's kind.
    pub fn kind(&self) -> &'static str {
        each_manifest!(self, o => kind_of(o))
    }

    /// `Kind namespace/name` (or `Kind name`), for messages.
    pub fn describe(&self) -> String {
        match self.namespace() {
            Some(ns) => format!("{} {ns}/{}", self.kind(), self.name()),
            None => format!("{} {}", self.kind(), self.name()),
        }
    }

    /// The object as JSON, with `apiVersion` and `kind`.
    pub fn to_value(&self) -> serde_json::Value {
        each_manifest!(self, o => serde_json::to_value(o))
            .expect("invariant: Kubernetes objects always serialise")
    }
}

fn kind_of<K: k8s_openapi::Resource>(_: &K) -> &'static str {
    K::KIND
}

/// Every object `tether install` applies, in dependency order: namespace, CRDs,
/// ServiceAccount, ClusterRoles, ClusterRoleBindings, Roles, RoleBindings, ConfigMap,
/// Deployment, Service, webhook, StorageClass.
pub fn render(opts: &InstallOptions) -> Vec<Manifest> {
    let mut out = vec![Manifest::Namespace(Namespace {
        metadata: meta(SYSTEM_NAMESPACE, None),
        ..Default::default()
    })];
    out.extend(
        tether_api::crds::all()
            .into_iter()
            .map(Manifest::CustomResourceDefinition),
    );
    for name in [objects::CONTROLLER, objects::FABRIC] {
        out.push(Manifest::ServiceAccount(ServiceAccount {
            metadata: meta(name, Some(SYSTEM_NAMESPACE)),
            ..Default::default()
        }));
    }
    for (name, rules) in [
        (objects::CONTROLLER, rbac::controller_cluster_rules()),
        (
            objects::CONTROLLER_TENANT_ROLE,
            rbac::controller_tenant_rules(),
        ),
        (objects::TENANT_ROLE, rbac::tenant_rules()),
        (
            objects::TENANT_OFFLOADED_ROLE,
            rbac::tenant_offloaded_rules(),
        ),
        (objects::GATEWAY, rbac::gateway_namespace_rules()),
        (objects::GATEWAY_NODES_ROLE, rbac::gateway_node_rules()),
        (objects::FABRIC, rbac::fabric_rules()),
    ] {
        out.push(Manifest::ClusterRole(ClusterRole {
            metadata: meta(name, None),
            rules: Some(rules),
            ..Default::default()
        }));
    }
    out.push(Manifest::ClusterRoleBinding(ClusterRoleBinding {
        metadata: meta(objects::CONTROLLER, None),
        role_ref: role_ref("ClusterRole", objects::CONTROLLER),
        subjects: Some(vec![controller_subject()]),
    }));
    out.push(Manifest::ClusterRoleBinding(ClusterRoleBinding {
        metadata: meta(objects::FABRIC, None),
        role_ref: role_ref("ClusterRole", objects::FABRIC),
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".to_owned(),
            name: objects::FABRIC.to_owned(),
            namespace: Some(SYSTEM_NAMESPACE.to_owned()),
            api_group: None,
        }]),
    }));
    out.push(Manifest::Role(Role {
        metadata: meta(objects::CONTROLLER, Some(SYSTEM_NAMESPACE)),
        rules: Some(rbac::controller_namespace_rules()),
    }));
    out.push(Manifest::Role(Role {
        metadata: meta(APISERVER_ROLE, Some("default")),
        rules: Some(rbac::controller_apiserver_rules()),
    }));
    out.push(Manifest::Role(Role {
        metadata: meta(NODE_LEASE_ROLE, Some(NODE_LEASE_NAMESPACE)),
        rules: Some(rbac::controller_node_lease_rules()),
    }));
    out.push(Manifest::Role(Role {
        metadata: meta(CLIENT_CA_ROLE, Some(CLIENT_CA_NAMESPACE)),
        rules: Some(rbac::controller_client_ca_rules()),
    }));
    for (name, namespace) in [
        (objects::CONTROLLER, SYSTEM_NAMESPACE),
        (APISERVER_ROLE, "default"),
        (NODE_LEASE_ROLE, NODE_LEASE_NAMESPACE),
        (CLIENT_CA_ROLE, CLIENT_CA_NAMESPACE),
    ] {
        out.push(Manifest::RoleBinding(RoleBinding {
            metadata: meta(name, Some(namespace)),
            role_ref: role_ref("Role", name),
            subjects: Some(vec![controller_subject()]),
        }));
    }
    out.push(Manifest::ConfigMap(ConfigMap {
        metadata: meta(objects::CLUSTER_ID_CONFIGMAP, Some(SYSTEM_NAMESPACE)),
        data: Some(BTreeMap::from([(
            objects::CLUSTER_ID_KEY.to_owned(),
            opts.cluster_id.to_string(),
        )])),
        ..Default::default()
    }));
    if let Some(n) = &opts.network {
        out.push(Manifest::ConfigMap(ConfigMap {
            metadata: meta(objects::NETWORK_CONFIGMAP, Some(SYSTEM_NAMESPACE)),
            data: Some(
                [
                    (network::POD_CIDRS.to_owned(), n.pod.join(",")),
                    (network::SERVICE_CIDRS.to_owned(), n.service.join(",")),
                ]
                .into_iter()
                // Absent rather than empty, so the ConfigMap of an install without the flag
                // stays as it always was.
                .chain(
                    n.remap_pool
                        .iter()
                        .map(|p| (network::REMAP_POOL.to_owned(), p.clone())),
                )
                .chain(
                    n.external
                        .iter()
                        .map(|e| (network::EXTERNAL_CIDR.to_owned(), e.clone())),
                )
                .collect(),
            ),
            ..Default::default()
        }));
    }
    out.push(Manifest::Deployment(deployment(opts)));
    out.push(Manifest::DaemonSet(fabric(opts)));
    out.push(Manifest::Service(auth_service(opts)));
    out.push(Manifest::Service(webhook_service()));
    out.push(Manifest::MutatingWebhookConfiguration(pod_webhook(opts)));
    out.push(Manifest::StorageClass(storage_class()));
    out
}

/// The class of claims served by the provider that runs the pod using them. Binding waits
/// for the pod's node, since only a virtual node says which provider that is; a claim of a
/// pod on a real node is not this class's to serve. Expansion is allowed here because the
/// controller resizes these claims; whether the twin claim can grow is the provider's class's
/// to say, and a refusal there comes back as an Event on the claim.
fn storage_class() -> StorageClass {
    StorageClass {
        metadata: meta(storage::STORAGE_CLASS, None),
        provisioner: storage::PROVISIONER.to_owned(),
        reclaim_policy: Some("Delete".to_owned()),
        volume_binding_mode: Some("WaitForFirstConsumer".to_owned()),
        allow_volume_expansion: Some(true),
        ..Default::default()
    }
}

/// The Service in front of every controller replica's admission webhook.
fn webhook_service() -> Service {
    Service {
        metadata: ObjectMeta {
            labels: Some({
                let mut l = common_labels();
                l.insert(labels::COMPONENT.to_owned(), "webhook".to_owned());
                l
            }),
            ..meta(objects::WEBHOOK_SERVICE, Some(SYSTEM_NAMESPACE))
        },
        spec: Some(ServiceSpec {
            selector: Some(BTreeMap::from([(
                NAME_LABEL.to_owned(),
                objects::CONTROLLER.to_owned(),
            )])),
            ports: Some(vec![ServicePort {
                name: Some("webhook".to_owned()),
                port: 443,
                target_port: Some(IntOrString::Int(WEBHOOK_PORT)),
                protocol: Some("TCP".to_owned()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

/// The webhook that places new pods of offloaded namespaces (those labelled
/// `tether.dev/offloading-enabled=true` by the controller). It fails closed: a pod that must
/// run remotely is never silently created where it must not be; only offloaded namespaces
/// depend on the controller for that.
fn pod_webhook(opts: &InstallOptions) -> MutatingWebhookConfiguration {
    MutatingWebhookConfiguration {
        metadata: meta(objects::POD_WEBHOOK, None),
        webhooks: Some(vec![MutatingWebhook {
            name: objects::POD_WEBHOOK_NAME.to_owned(),
            admission_review_versions: vec!["v1".to_owned()],
            client_config: WebhookClientConfig {
                service: Some(ServiceReference {
                    namespace: SYSTEM_NAMESPACE.to_owned(),
                    name: objects::WEBHOOK_SERVICE.to_owned(),
                    path: Some(objects::POD_WEBHOOK_PATH.to_owned()),
                    port: Some(443),
                }),
                ca_bundle: opts
                    .webhook_ca
                    .as_ref()
                    .map(|pem| ByteString(pem.clone().into_bytes())),
                url: None,
            },
            failure_policy: Some("Fail".to_owned()),
            match_policy: Some("Equivalent".to_owned()),
            namespace_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    labels::OFFLOADING_ENABLED.to_owned(),
                    "true".to_owned(),
                )])),
                ..Default::default()
            }),
            object_selector: Some(LabelSelector::default()),
            reinvocation_policy: Some("Never".to_owned()),
            rules: Some(vec![RuleWithOperations {
                api_groups: Some(vec![String::new()]),
                api_versions: Some(vec!["v1".to_owned()]),
                operations: Some(vec!["CREATE".to_owned()]),
                resources: Some(vec!["pods".to_owned()]),
                scope: Some("Namespaced".to_owned()),
            }]),
            side_effects: "None".to_owned(),
            timeout_seconds: Some(5),
            match_conditions: None,
        }]),
    }
}

/// The admin port of the fabric's pods, on each node's own network.
pub const FABRIC_ADMIN_PORT: i32 = 9103;

/// The labels of the fabric's pods.
pub fn fabric_labels() -> BTreeMap<String, String> {
    let mut l = common_labels();
    l.insert(NAME_LABEL.to_owned(), objects::FABRIC.to_owned());
    l.insert(
        labels::COMPONENT.to_owned(),
        labels::COMPONENT_FABRIC.to_owned(),
    );
    l
}

/// `tetherd fabric` on every node: host network, since it programs the node's own routes and
/// VXLAN device; privileged for the same reason; tolerating every taint, since pods on any
/// node must reach the remote clusters.
fn fabric(opts: &InstallOptions) -> DaemonSet {
    let selector = BTreeMap::from([(NAME_LABEL.to_owned(), objects::FABRIC.to_owned())]);
    let probe = |path: &str, period: i32, failures: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_owned()),
            port: IntOrString::Int(FABRIC_ADMIN_PORT),
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Default::default()
    };
    let container = Container {
        name: "fabric".to_owned(),
        image: Some(opts.image.clone()),
        args: Some(vec![
            "fabric".to_owned(),
            format!("--admin-addr=0.0.0.0:{FABRIC_ADMIN_PORT}"),
            "--log-format=json".to_owned(),
        ]),
        env: Some(vec![EnvVar {
            name: "NODE_NAME".to_owned(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "spec.nodeName".to_owned(),
                    api_version: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        readiness_probe: Some(probe("/readyz", 2, 3)),
        liveness_probe: Some(probe("/healthz", 10, 6)),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_owned(), Quantity("5m".to_owned())),
                ("memory".to_owned(), Quantity("16Mi".to_owned())),
            ])),
            limits: Some(BTreeMap::from([(
                "memory".to_owned(),
                Quantity("64Mi".to_owned()),
            )])),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            privileged: Some(true),
            run_as_user: Some(0),
            ..Default::default()
        }),
        ..Default::default()
    };
    DaemonSet {
        metadata: ObjectMeta {
            labels: Some(fabric_labels()),
            ..meta(objects::FABRIC, Some(SYSTEM_NAMESPACE))
        },
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(selector),
                match_expressions: None,
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(fabric_labels()),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(objects::FABRIC.to_owned()),
                    host_network: Some(true),
                    dns_policy: Some("ClusterFirstWithHostNet".to_owned()),
                    containers: vec![container],
                    tolerations: Some(vec![Toleration {
                        operator: Some("Exists".to_owned()),
                        ..Default::default()
                    }]),
                    // Tolerating every taint would take in virtual nodes too, where a fabric
                    // has nothing to route and its pod would wait for ever.
                    affinity: Some(not_on_virtual_nodes()),
                    termination_grace_period_seconds: Some(10),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    }
}

/// Required node affinity that keeps a pod off Tether's virtual nodes.
fn not_on_virtual_nodes() -> k8s_openapi::api::core::v1::Affinity {
    use k8s_openapi::api::core::v1::{
        Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    };
    Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(vec![NodeSelectorRequirement {
                        key: tether_api::names::labels::TYPE.to_owned(),
                        operator: "NotIn".to_owned(),
                        values: Some(vec![
                            tether_api::names::labels::TYPE_VIRTUAL_NODE.to_owned(),
                        ]),
                    }]),
                    match_fields: None,
                }],
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The labels on everything `tether install` creates.
pub fn common_labels() -> BTreeMap<String, String> {
    BTreeMap::from([(
        labels::PART_OF.to_owned(),
        labels::MANAGED_BY_VALUE.to_owned(),
    )])
}

/// The labels of the controller's pods (also the Deployment's and the selector's superset).
pub fn controller_labels() -> BTreeMap<String, String> {
    let mut l = common_labels();
    l.insert(NAME_LABEL.to_owned(), objects::CONTROLLER.to_owned());
    l.insert(labels::COMPONENT.to_owned(), "controller".to_owned());
    l
}

/// The label selector of the controller's pods, as a string for list calls.
pub fn controller_selector() -> String {
    format!("{NAME_LABEL}={}", objects::CONTROLLER)
}

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: namespace.map(str::to_owned),
        labels: Some(common_labels()),
        ..Default::default()
    }
}

fn role_ref(kind: &str, name: &str) -> RoleRef {
    RoleRef {
        api_group: "rbac.authorization.k8s.io".to_owned(),
        kind: kind.to_owned(),
        name: name.to_owned(),
    }
}

fn controller_subject() -> Subject {
    Subject {
        kind: "ServiceAccount".to_owned(),
        name: objects::CONTROLLER.to_owned(),
        namespace: Some(SYSTEM_NAMESPACE.to_owned()),
        api_group: None,
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

fn deployment(opts: &InstallOptions) -> Deployment {
    let mut args = strings(&[
        "controller",
        "--auth-listen=0.0.0.0:8443",
        "--admin-addr=0.0.0.0:9090",
        "--log-format=json",
    ]);
    args.push(format!("--gateway-image={}", opts.image));
    if let Some(url) = &opts.api_server_url {
        args.push(format!("--api-server-url={url}"));
    }
    if let Some(url) = &opts.auth_url {
        args.push(format!("--auth-url={url}"));
    }
    if let Some(lifetime) = &opts.identity_lifetime {
        args.push(format!("--identity-lifetime={lifetime}"));
    }
    // Always written, so that a re-install reads it back from the Deployment and keeps it.
    args.push(format!(
        "--resource-enforcement={}",
        opts.resource_enforcement
    ));
    let field_env = |name: &str, path: &str| EnvVar {
        name: name.to_owned(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.to_owned(),
                api_version: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let probe = |path: &str, period: i32, failures: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_owned()),
            port: IntOrString::Int(ADMIN_PORT),
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Default::default()
    };
    let container = Container {
        name: CONTAINER.to_owned(),
        image: Some(opts.image.clone()),
        args: Some(args),
        env: Some(vec![
            EnvVar {
                name: "TETHER_CLUSTER_ID".to_owned(),
                value_from: Some(EnvVarSource {
                    config_map_key_ref: Some(ConfigMapKeySelector {
                        name: objects::CLUSTER_ID_CONFIGMAP.to_owned(),
                        key: objects::CLUSTER_ID_KEY.to_owned(),
                        optional: None,
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            },
            field_env("POD_NAME", "metadata.name"),
            field_env("POD_NAMESPACE", "metadata.namespace"),
            field_env("POD_IP", "status.podIP"),
        ]),
        ports: Some(vec![
            ContainerPort {
                name: Some("admin".to_owned()),
                container_port: ADMIN_PORT,
                protocol: Some("TCP".to_owned()),
                ..Default::default()
            },
            ContainerPort {
                name: Some("https".to_owned()),
                container_port: AUTH_PORT,
                protocol: Some("TCP".to_owned()),
                ..Default::default()
            },
            ContainerPort {
                name: Some("webhook".to_owned()),
                container_port: WEBHOOK_PORT,
                protocol: Some("TCP".to_owned()),
                ..Default::default()
            },
            ContainerPort {
                name: Some("kubelet".to_owned()),
                container_port: KUBELET_PORT,
                protocol: Some("TCP".to_owned()),
                ..Default::default()
            },
        ]),
        // Readiness is checked often so that install and rollouts see a ready controller within
        // seconds; liveness is lenient, since a restart loses the reconcilers' caches.
        readiness_probe: Some(probe("/readyz", 2, 3)),
        liveness_probe: Some(probe("/healthz", 10, 6)),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_owned(), Quantity("10m".to_owned())),
                ("memory".to_owned(), Quantity("32Mi".to_owned())),
            ])),
            limits: Some(BTreeMap::from([(
                "memory".to_owned(),
                Quantity("128Mi".to_owned()),
            )])),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(strings(&["ALL"])),
                add: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let selector = BTreeMap::from([(NAME_LABEL.to_owned(), objects::CONTROLLER.to_owned())]);
    Deployment {
        metadata: ObjectMeta {
            labels: Some(controller_labels()),
            ..meta(objects::CONTROLLER, Some(SYSTEM_NAMESPACE))
        },
        spec: Some(DeploymentSpec {
            replicas: Some(opts.replicas),
            selector: LabelSelector {
                match_labels: Some(selector),
                match_expressions: None,
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(controller_labels()),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(objects::CONTROLLER.to_owned()),
                    containers: vec![container],
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        run_as_user: Some(RUN_AS_USER),
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".to_owned(),
                            localhost_profile: None,
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    }
}

fn auth_service(opts: &InstallOptions) -> Service {
    Service {
        metadata: ObjectMeta {
            labels: Some({
                let mut l = common_labels();
                l.insert(labels::COMPONENT.to_owned(), "auth".to_owned());
                l
            }),
            ..meta(objects::AUTH_SERVICE, Some(SYSTEM_NAMESPACE))
        },
        spec: Some(ServiceSpec {
            type_: Some(opts.auth_service_type.as_str().to_owned()),
            selector: Some(BTreeMap::from([(
                NAME_LABEL.to_owned(),
                objects::CONTROLLER.to_owned(),
            )])),
            ports: Some(vec![ServicePort {
                name: Some("https".to_owned()),
                port: AUTH_SERVICE_PORT,
                target_port: Some(IntOrString::Int(AUTH_PORT)),
                protocol: Some("TCP".to_owned()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

/// The objects as a multi-document YAML stream (`kubectl apply -f -` reads it).
pub fn to_yaml(manifests: &[Manifest]) -> String {
    let mut out = String::new();
    for m in manifests {
        out.push_str("---\n");
        out.push_str(
            &serde_yaml::to_string(&m.to_value())
                .expect("invariant: JSON values always serialise as YAML"),
        );
    }
    out
}

/// The objects as one `v1 List` in JSON (`kubectl apply -f -` reads it too).
pub fn to_json(manifests: &[Manifest]) -> String {
    let list = serde_json::json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": manifests.iter().map(Manifest::to_value).collect::<Vec<_>>(),
    });
    let mut s =
        serde_json::to_string_pretty(&list).expect("invariant: JSON values always serialise");
    s.push('\n');
    s
}

/// A readable listing of every RBAC rule in `manifests`: per role, who it is bound to and
/// one line per resource: `apiGroup  resource  verbs  [names]`.
pub fn rbac_listing(manifests: &[Manifest]) -> String {
    let mut out = String::new();
    for m in manifests {
        let (kind, name, namespace, rules) = match m {
            Manifest::ClusterRole(r) => (
                "ClusterRole",
                m.name(),
                None,
                r.rules.as_deref().unwrap_or_default(),
            ),
            Manifest::Role(r) => (
                "Role",
                m.name(),
                m.namespace(),
                r.rules.as_deref().unwrap_or_default(),
            ),
            _ => continue,
        };
        let where_ = namespace.map(|ns| format!(" in {ns}")).unwrap_or_default();
        let _ = writeln!(out, "{kind} {name}{where_}");
        let bound: Vec<String> = manifests
            .iter()
            .filter_map(|b| binding_of(b, kind, name, namespace))
            .collect();
        if bound.is_empty() {
            let _ = writeln!(
                out,
                "  bound by the controller at run time (not by tether install)"
            );
        }
        for b in bound {
            let _ = writeln!(out, "  bound to {b}");
        }
        for r in rules {
            let groups = r
                .api_groups
                .as_deref()
                .unwrap_or_default()
                .iter()
                .map(|g| if g.is_empty() { "\"\"" } else { g.as_str() })
                .collect::<Vec<_>>()
                .join(",");
            let names = r
                .resource_names
                .as_deref()
                .map(|n| format!("  names={}", n.join(",")))
                .unwrap_or_default();
            for resource in r.resources.as_deref().unwrap_or_default() {
                let _ = writeln!(
                    out,
                    "  {groups:<27} {resource:<36} {}{names}",
                    r.verbs.join(" ")
                );
            }
        }
    }
    out
}

fn binding_of(m: &Manifest, kind: &str, name: &str, namespace: Option<&str>) -> Option<String> {
    let (role_ref, subjects, scope) = match m {
        Manifest::ClusterRoleBinding(b) => (&b.role_ref, &b.subjects, "cluster-wide".to_owned()),
        Manifest::RoleBinding(b) => (
            &b.role_ref,
            &b.subjects,
            format!("in {}", m.namespace().unwrap_or_default()),
        ),
        _ => return None,
    };
    let same_scope = match m {
        Manifest::RoleBinding(_) if kind == "Role" => m.namespace() == namespace,
        _ => true,
    };
    if role_ref.kind != kind || role_ref.name != name || !same_scope {
        return None;
    }
    let who = subjects
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|s| match &s.namespace {
            Some(ns) => format!("{} {ns}/{}", s.kind, s.name),
            None => format!("{} {}", s.kind, s.name),
        })
        .collect::<Vec<_>>()
        .join(", ");
    Some(format!("{who} {scope} ({} {})", m.kind(), m.name()))
}

/// Every wildcard (`*`) in a verb, resource, API group or resource name of any role in
/// `manifests`, as `Kind name: field`.
pub fn wildcards(manifests: &[Manifest]) -> Vec<String> {
    let mut found = Vec::new();
    for m in manifests {
        let rules = match m {
            Manifest::ClusterRole(r) => r.rules.as_deref().unwrap_or_default(),
            Manifest::Role(r) => r.rules.as_deref().unwrap_or_default(),
            _ => continue,
        };
        for r in rules {
            let fields: [(&str, &[String]); 4] = [
                ("verbs", &r.verbs),
                ("resources", r.resources.as_deref().unwrap_or_default()),
                ("apiGroups", r.api_groups.as_deref().unwrap_or_default()),
                (
                    "resourceNames",
                    r.resource_names.as_deref().unwrap_or_default(),
                ),
            ];
            for (field, values) in fields {
                if values.iter().any(|v| v.contains('*')) {
                    found.push(format!("{}: {field} {values:?}", m.describe()));
                }
            }
            if r.non_resource_urls.is_some() {
                found.push(format!("{}: nonResourceURLs", m.describe()));
            }
        }
        if let Manifest::ClusterRole(r) = m
            && r.aggregation_rule.is_some()
        {
            found.push(format!("{}: aggregationRule", m.describe()));
        }
    }
    found
}
