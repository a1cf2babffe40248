//! What Tether's identities may do, as RBAC rules: the controller (cluster-wide, in its own
//! namespace, and inside tenant namespaces), the gateway in its tenant namespace, the fabric
//! DaemonSet, and a consumer's identity inside its tenant namespace on the provider. `tether
//! install` renders these; the controller binds the tenant roles by name. No rule uses `*`.

use k8s_openapi::api::rbac::v1::PolicyRule;

const CORE: &str = "";
const TETHER_CORE: &str = "core.tether.dev";
const AUTHENTICATION: &str = "authentication.tether.dev";
const NETWORKING: &str = "networking.tether.dev";
const OFFLOADING: &str = "offloading.tether.dev";

const READ: &[&str] = &["get", "list", "watch"];
const MANAGE: &[&str] = &[
    "get", "list", "watch", "create", "update", "patch", "delete",
];

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(groups.iter().map(|s| (*s).to_owned()).collect()),
        resources: Some(resources.iter().map(|s| (*s).to_owned()).collect()),
        verbs: verbs.iter().map(|s| (*s).to_owned()).collect(),
        ..Default::default()
    }
}

fn named(groups: &[&str], resources: &[&str], names: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        resource_names: Some(names.iter().map(|s| (*s).to_owned()).collect()),
        ..rule(groups, resources, verbs)
    }
}

/// Tether's kinds that live in tenant namespaces, by group.
fn tenant_kinds() -> [(&'static str, &'static [&'static str]); 3] {
    [
        (AUTHENTICATION, &["resourceslices"]),
        (
            NETWORKING,
            &[
                "configurations",
                "gatewayservers",
                "gatewayclients",
                "connections",
            ],
        ),
        (OFFLOADING, &["shadowpods", "namespaceoffloadings"]),
    ]
}

/// The controller's cluster-wide rules (ClusterRole `tether-controller`).
pub fn controller_cluster_rules() -> Vec<PolicyRule> {
    vec![
        rule(&[TETHER_CORE], &["foreignclusters"], MANAGE),
        rule(
            &[TETHER_CORE],
            &["foreignclusters/status"],
            &["get", "update", "patch"],
        ),
        rule(&[TETHER_CORE], &["foreignclusters/finalizers"], &["update"]),
        rule(&[AUTHENTICATION], &["tenants"], MANAGE),
        rule(
            &[AUTHENTICATION],
            &["tenants/status"],
            &["get", "update", "patch"],
        ),
        rule(&[AUTHENTICATION], &["tenants/finalizers"], &["update"]),
        rule(
            &[CORE],
            &["namespaces"],
            &["get", "list", "watch", "create", "patch", "delete"],
        ),
        // Virtual nodes: the Nodes the controller's virtual kubelets register and keep.
        rule(&[CORE], &["nodes"], MANAGE),
        rule(&[CORE], &["nodes/status"], &["get", "update", "patch"]),
        rule(&["rbac.authorization.k8s.io"], &["rolebindings"], MANAGE),
        // Per peer, the binding that lets its gateway read Nodes.
        rule(
            &["rbac.authorization.k8s.io"],
            &["clusterrolebindings"],
            &["get", "create", "patch", "delete"],
        ),
        named(
            &["rbac.authorization.k8s.io"],
            &["clusterroles"],
            &[
                crate::names::objects::TENANT_ROLE,
                crate::names::objects::TENANT_OFFLOADED_ROLE,
                crate::names::objects::CONTROLLER_TENANT_ROLE,
                crate::names::objects::GATEWAY,
                crate::names::objects::GATEWAY_NODES_ROLE,
            ],
            &["bind"],
        ),
        // The networking and offloading reconcilers watch these in every tenant namespace.
        rule(
            &[NETWORKING],
            &["configurations", "gatewayservers", "gatewayclients"],
            READ,
        ),
        // IPs (ExternalIPRemapping) live in any namespace: the controller gives each a host
        // of the external CIDR in its status.
        rule(&[NETWORKING], &["ips"], READ),
        rule(&[NETWORKING], &["ips/status"], &["get", "update", "patch"]),
        // Cluster-wide and with update, so that their finalizers can still be removed when
        // a tenant namespace (and the binding inside it) is being deleted.
        rule(
            &[AUTHENTICATION],
            &["resourceslices"],
            &["get", "list", "watch", "update", "patch"],
        ),
        rule(
            &[OFFLOADING],
            &["virtualnodes"],
            &["get", "list", "watch", "update", "patch", "delete"],
        ),
        // The provider's side of offloading: requests for twin namespaces in tenant namespaces
        // (their finalizer outlives the tenant binding) and ShadowPods in twin namespaces,
        // which have no controller binding of their own.
        rule(
            &[OFFLOADING],
            &["namespaceoffloadings", "shadowpods"],
            &["get", "list", "watch", "update", "patch"],
        ),
        rule(
            &[OFFLOADING],
            &["namespaceoffloadings/status", "shadowpods/status"],
            &["get", "update", "patch"],
        ),
        // The Pods of ShadowPods. Twin namespaces are created on demand and named by
        // consumers, so a Role per twin would have to be bound before the first Pod anyway;
        // the controller holds the same right cluster-wide instead, and only ever writes Pods
        // owned by a ShadowPod.
        rule(
            &[CORE],
            &["pods"],
            &["get", "list", "watch", "create", "delete", "patch"],
        ),
        // The consumer's side: a virtual node's kubelet reports the status of the pods bound
        // to it, wherever their namespace.
        rule(&[CORE], &["pods/status"], &["get", "update", "patch"]),
        // The consumer's side: reflection copies what an offloaded namespace holds into its
        // twins; any namespace may be offloaded, so it reads these kinds cluster-wide.
        rule(&[CORE], &["configmaps", "secrets", "services"], READ),
        rule(&["discovery.k8s.io"], &["endpointslices"], READ),
        // The consumer's side: an offloaded pod authenticates to this API server as its own
        // ServiceAccount, with a token the controller mints for it (as the kubelet would).
        rule(&[CORE], &["serviceaccounts/token"], &["create"]),
        // The consumer's side: the provisioner of the `tether` StorageClass binds a claim of a
        // pod on a virtual node to a volume it makes here, and removes that volume once
        // released. As the class's resizer it grows that volume and reports the claim's new
        // capacity in the claim's status once the provider has grown the twin claim.
        rule(
            &[CORE],
            &["persistentvolumes"],
            &["get", "list", "watch", "create", "patch", "delete"],
        ),
        rule(
            &[CORE],
            &["persistentvolumeclaims"],
            &["get", "list", "watch", "update", "patch"],
        ),
        rule(
            &[CORE],
            &["persistentvolumeclaims/status"],
            &["get", "update", "patch"],
        ),
        rule(&["storage.k8s.io"], &["storageclasses"], READ),
        // The pod webhook's configuration, whose caBundle the controller keeps.
        named(
            &["admissionregistration.k8s.io"],
            &["mutatingwebhookconfigurations"],
            &[crate::names::objects::POD_WEBHOOK],
            &["get", "update"],
        ),
        rule(
            &["certificates.k8s.io"],
            &["certificatesigningrequests"],
            &["get", "list", "watch", "create", "delete"],
        ),
        rule(
            &["certificates.k8s.io"],
            &["certificatesigningrequests/approval"],
            &["update", "patch"],
        ),
        named(
            &["certificates.k8s.io"],
            &["signers"],
            &["kubernetes.io/kube-apiserver-client"],
            &["approve"],
        ),
        rule(
            &[CORE, "events.k8s.io"],
            &["events"],
            &["create", "patch", "update"],
        ),
        // The virtual kubelet API asks whether a caller may use a node's kubelet API, as a
        // kubelet with webhook authorisation does.
        rule(
            &["authorization.k8s.io"],
            &["subjectaccessreviews"],
            &["create"],
        ),
    ]
}

/// What the controller reads in `kube-system` (Role `tether-controller-client-ca`): the
/// API server's client CA, which callers of the virtual kubelet API must hold a certificate
/// of.
pub fn controller_client_ca_rules() -> Vec<PolicyRule> {
    vec![named(
        &[CORE],
        &["configmaps"],
        &["extension-apiserver-authentication"],
        &["get"],
    )]
}

/// The controller's rules in its own namespace (Role `tether-controller` in `tether-system`).
pub fn controller_namespace_rules() -> Vec<PolicyRule> {
    vec![
        rule(&[CORE], &["secrets", "configmaps"], MANAGE),
        rule(
            &["coordination.k8s.io"],
            &["leases"],
            &["get", "list", "watch", "create", "update", "patch"],
        ),
        rule(&[CORE], &["services"], READ),
        rule(&[CORE], &["pods"], &["get", "list"]),
    ]
}

/// What the controller reads in `default` (Role `tether-controller-apiserver`): the
/// `kubernetes` EndpointSlice, to learn the API server address peers use.
pub fn controller_apiserver_rules() -> Vec<PolicyRule> {
    vec![named(
        &["discovery.k8s.io"],
        &["endpointslices"],
        &["kubernetes"],
        &["get"],
    )]
}

/// What the controller's virtual kubelets do in `kube-node-lease` (Role
/// `tether-controller-node-leases`): keep one Lease per virtual node, as a kubelet does.
pub fn controller_node_lease_rules() -> Vec<PolicyRule> {
    vec![rule(
        &["coordination.k8s.io"],
        &["leases"],
        &[
            "get", "list", "watch", "create", "update", "patch", "delete",
        ],
    )]
}

/// The controller's rules inside each tenant namespace (ClusterRole
/// `tether-controller-tenant`, bound per namespace by the controller).
pub fn controller_tenant_rules() -> Vec<PolicyRule> {
    let mut rules = vec![
        rule(&[CORE], &["secrets", "services", "serviceaccounts"], MANAGE),
        rule(&["apps"], &["deployments"], MANAGE),
        rule(&[CORE], &["pods"], READ),
        // A consumer's virtual nodes live in its tenant namespace for the provider; the
        // consumer's identity at a provider never needs them, so they are not a tenant kind.
        rule(&[OFFLOADING], &["virtualnodes"], MANAGE),
        rule(
            &[OFFLOADING],
            &["virtualnodes/status"],
            &["get", "update", "patch"],
        ),
    ];
    for (group, kinds) in tenant_kinds() {
        rules.push(rule(&[group], kinds, MANAGE));
        let status: Vec<String> = kinds.iter().map(|k| format!("{k}/status")).collect();
        let status: Vec<&str> = status.iter().map(String::as_str).collect();
        rules.push(rule(&[group], &status, &["get", "update", "patch"]));
    }
    rules
}

/// What a consumer's identity may do in its tenant namespace on the provider (ClusterRole
/// `tether-tenant`, bound per namespace to the consumer's username): manage the Tether kinds
/// it owns there and read their status. Nothing else.
pub fn tenant_rules() -> Vec<PolicyRule> {
    let mut rules = Vec::new();
    for (group, kinds) in tenant_kinds() {
        rules.push(rule(&[group], kinds, MANAGE));
        let status: Vec<String> = kinds.iter().map(|k| format!("{k}/status")).collect();
        let status: Vec<&str> = status.iter().map(String::as_str).collect();
        rules.push(rule(&[group], &status, &["get"]));
    }
    rules
}

/// What a consumer's identity may do in each of its twin namespaces on the provider
/// (ClusterRole `tether-tenant-offloaded`, bound there to the consumer's username): hold its
/// pods as ShadowPods, read the Pods made from them (logs, exec, attach, port-forward), and
/// keep what they use (ConfigMaps, Secrets, Services, EndpointSlices, claims). Nothing outside
/// the twin namespace.
pub fn tenant_offloaded_rules() -> Vec<PolicyRule> {
    vec![
        rule(&[OFFLOADING], &["shadowpods"], MANAGE),
        rule(&[OFFLOADING], &["shadowpods/status"], &["get"]),
        rule(&[CORE], &["pods"], READ),
        rule(&[CORE], &["pods/log"], &["get"]),
        rule(
            &[CORE],
            &["pods/exec", "pods/attach", "pods/portforward"],
            &["create", "get"],
        ),
        rule(
            &[CORE],
            &[
                "configmaps",
                "secrets",
                "services",
                "persistentvolumeclaims",
            ],
            MANAGE,
        ),
        rule(&["discovery.k8s.io"], &["endpointslices"], MANAGE),
        rule(&[CORE, "events.k8s.io"], &["events"], READ),
    ]
}

/// What a gateway (`tetherd gateway --namespace`) may do in its tenant namespace (ClusterRole
/// `tether-gateway`, bound there by a RoleBinding): read its GatewayServer or GatewayClient, the
/// Configuration and its key Secret; create and update the Connection it reports on.
///
/// The key Secret is named: the tenant namespace also holds the provider's kubeconfig, which a
/// gateway must not read. The last rule, listing Nodes for the fabric, is cluster-scoped: a
/// RoleBinding cannot grant it, so it needs a ClusterRoleBinding; since such a binding would
/// grant the namespaced rules in every namespace too, bind [`gateway_namespace_rules`] per
/// namespace and [`gateway_node_rules`] cluster-wide as two ClusterRoles.
pub fn gateway_rules() -> Vec<PolicyRule> {
    let mut rules = gateway_namespace_rules();
    rules.extend(gateway_node_rules());
    rules
}

/// The namespaced part of [`gateway_rules`], for a Role or a RoleBinding of the ClusterRole.
pub fn gateway_namespace_rules() -> Vec<PolicyRule> {
    vec![
        rule(
            &[NETWORKING],
            &["gatewayservers", "gatewayclients", "configurations"],
            READ,
        ),
        named(
            &[CORE],
            &["secrets"],
            &[crate::names::objects::GATEWAY_KEY_SECRET],
            READ,
        ),
        rule(
            &[NETWORKING],
            &["connections"],
            &["get", "list", "watch", "create", "update", "patch"],
        ),
        rule(
            &[NETWORKING],
            &["connections/status"],
            &["get", "update", "patch"],
        ),
    ]
}

/// The cluster-scoped part of [`gateway_rules`]: the Nodes the fabric routes to. Only a
/// ClusterRoleBinding grants it.
pub fn gateway_node_rules() -> Vec<PolicyRule> {
    vec![rule(&[CORE], &["nodes"], &["list", "watch"])]
}

/// What `tetherd fabric` reads, cluster-wide (ClusterRole `tether-fabric`): the gateway pods
/// and the nodes (their addresses and pod CIDRs), and the networking Configurations and
/// Connections of every tenant namespace (the remote CIDRs and tunnel MTUs). It writes nothing.
pub fn fabric_rules() -> Vec<PolicyRule> {
    vec![
        rule(&[CORE], &["pods", "nodes"], READ),
        rule(&[NETWORKING], &["configurations", "connections"], READ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_rule_uses_a_wildcard() {
        for rules in [
            controller_cluster_rules(),
            controller_namespace_rules(),
            controller_apiserver_rules(),
            controller_client_ca_rules(),
            controller_node_lease_rules(),
            controller_tenant_rules(),
            tenant_rules(),
            tenant_offloaded_rules(),
            gateway_rules(),
            fabric_rules(),
        ] {
            for r in rules {
                let all = r
                    .api_groups
                    .iter()
                    .flatten()
                    .chain(r.resources.iter().flatten())
                    .chain(r.verbs.iter());
                for s in all {
                    assert!(!s.contains('*'), "{r:?}");
                }
            }
        }
    }

    #[test]
    fn the_fabric_only_reads() {
        for r in fabric_rules() {
            for verb in &r.verbs {
                assert!(READ.contains(&verb.as_str()), "{r:?}");
            }
        }
    }

    #[test]
    fn the_tenant_role_grants_nothing_outside_tether_kinds() {
        for r in tenant_rules() {
            for g in r.api_groups.iter().flatten() {
                assert!(g.ends_with(".tether.dev"), "{r:?}");
            }
        }
    }

    #[test]
    fn an_offloaded_consumer_makes_pods_only_through_shadow_pods() {
        // A Pod written directly would skip the provider's admission within the grant.
        for r in tenant_offloaded_rules() {
            if r.resources.iter().flatten().any(|x| x == "pods") {
                for verb in &r.verbs {
                    assert!(READ.contains(&verb.as_str()), "{r:?}");
                }
            }
            for x in r.resources.iter().flatten() {
                assert!(
                    !["nodes", "namespaces", "rolebindings", "resourcequotas"]
                        .contains(&x.as_str()),
                    "{r:?}"
                );
            }
        }
        assert!(tenant_rules().iter().any(|r| {
            r.resources
                .iter()
                .flatten()
                .any(|x| x == "namespaceoffloadings")
                && r.verbs.iter().any(|v| v == "create")
        }));
    }

    #[test]
    fn the_gateway_reads_only_its_key_secret_and_nodes_only_cluster_wide() {
        for r in gateway_rules() {
            let resources = r.resources.clone().unwrap_or_default();
            if resources.iter().any(|x| x == "secrets") {
                assert_eq!(
                    r.resource_names.as_deref(),
                    Some(&[crate::names::objects::GATEWAY_KEY_SECRET.to_owned()][..]),
                    "{r:?}"
                );
            }
        }
        let namespaced = gateway_namespace_rules();
        assert!(
            namespaced
                .iter()
                .all(|r| !r.resources.iter().flatten().any(|x| x == "nodes")),
            "nodes are cluster-scoped: a Role cannot grant them"
        );
        assert_eq!(
            gateway_rules().len(),
            namespaced.len() + gateway_node_rules().len()
        );
    }
}
