//! The Kubernetes objects behind a gateway (pure): its ServiceAccount and role bindings, its
//! Deployment and, for a server, its UDP Service. The reconciler applies them as rendered.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, EnvVarSource, ObjectFieldSelector, PodSpec, PodTemplateSpec,
    SecurityContext, Service, ServiceAccount, ServicePort, ServiceSpec,
};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::ObjectMeta;
use tether_api::names::{labels, objects};
use tether_api::networking::ServiceType;

/// Which end of the tunnel, with what the server needs to be exposed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// The listening end.
    Server {
        /// UDP port of the Service and the pod.
        port: u16,
        /// How the Service is exposed.
        service_type: ServiceType,
        /// A fixed node port.
        node_port: Option<u16>,
    },
    /// The dialling end.
    Client,
}

/// Everything the objects of one gateway depend on.
#[derive(Debug, Clone)]
pub struct Gateway<'a> {
    /// The tenant namespace.
    pub namespace: &'a str,
    /// The remote cluster's ID.
    pub remote: &'a str,
    /// Server or client.
    pub end: End,
    /// The `tetherd` image.
    pub image: &'a str,
    /// The GatewayServer or GatewayClient, which owns the Deployment and Service.
    pub owner: OwnerReference,
    /// Local addresses the gateway publishes to the peer under addresses of the external
    /// CIDR, `(external, real)`: the control plane of an in-band peering. Each is one
    /// `--publish EXTERNAL=REAL` argument, so `kubectl get deploy -o yaml` shows them.
    pub publish: Vec<(std::net::Ipv4Addr, std::net::Ipv4Addr)>,
}

/// Port of the gateway's admin server (`/metrics`, `/healthz`, `/readyz`).
pub const ADMIN_PORT: u16 = 9102;

impl Gateway<'_> {
    /// The labels of the gateway's pods (and the Service's selector).
    pub fn pod_labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (
                labels::COMPONENT.to_owned(),
                labels::COMPONENT_GATEWAY.to_owned(),
            ),
            (labels::REMOTE_CLUSTER_ID.to_owned(), self.remote.to_owned()),
        ])
    }

    fn labels(&self) -> BTreeMap<String, String> {
        let mut l = labels::managed();
        l.extend(self.pod_labels());
        l
    }

    fn meta(&self, name: &str, owned: bool) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(self.namespace.to_owned()),
            labels: Some(self.labels()),
            owner_references: owned.then(|| vec![self.owner.clone()]),
            ..Default::default()
        }
    }

    /// The gateway's ServiceAccount.
    pub fn service_account(&self) -> ServiceAccount {
        ServiceAccount {
            metadata: self.meta(objects::GATEWAY, false),
            ..Default::default()
        }
    }

    fn subject(&self) -> Subject {
        Subject {
            kind: "ServiceAccount".to_owned(),
            name: objects::GATEWAY.to_owned(),
            namespace: Some(self.namespace.to_owned()),
            api_group: None,
        }
    }

    /// What the gateway may do in its namespace (ClusterRole `tether-gateway`).
    pub fn role_binding(&self) -> RoleBinding {
        RoleBinding {
            metadata: self.meta(objects::GATEWAY, false),
            role_ref: cluster_role(objects::GATEWAY),
            subjects: Some(vec![self.subject()]),
        }
    }

    /// The name of the binding that lets the gateway read Nodes.
    pub fn node_binding_name(&self) -> String {
        format!("{}-{}", objects::GATEWAY_NODES_ROLE, self.remote)
    }

    /// Lets the gateway read Nodes (cluster-scoped), owned by the tenant namespace so that it
    /// goes with it.
    pub fn node_binding(&self, namespace_owner: OwnerReference) -> ClusterRoleBinding {
        let mut metadata = self.meta(&self.node_binding_name(), false);
        metadata.namespace = None;
        metadata.owner_references = Some(vec![namespace_owner]);
        ClusterRoleBinding {
            metadata,
            role_ref: cluster_role(objects::GATEWAY_NODES_ROLE),
            subjects: Some(vec![self.subject()]),
        }
    }

    /// The gateway Deployment: one replica, replaced with `Recreate` so that two pods never
    /// hold the same key and fight over the peer's endpoint.
    pub fn deployment(&self) -> Deployment {
        let (flag, mut ports) = match &self.end {
            End::Server { port, .. } => (
                "--gateway-server",
                vec![ContainerPort {
                    name: Some("wireguard".to_owned()),
                    container_port: i32::from(*port),
                    protocol: Some("UDP".to_owned()),
                    ..Default::default()
                }],
            ),
            End::Client => ("--gateway-client", Vec::new()),
        };
        ports.push(ContainerPort {
            name: Some("admin".to_owned()),
            container_port: i32::from(ADMIN_PORT),
            protocol: Some("TCP".to_owned()),
            ..Default::default()
        });
        let field = |name: &str, path: &str| EnvVar {
            name: name.to_owned(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: path.to_owned(),
                    api_version: None,
                }),
                ..Default::default()
            }),
            value: None,
        };
        let container = Container {
            name: "gateway".to_owned(),
            image: Some(self.image.to_owned()),
            args: Some(
                [
                    "gateway",
                    "--namespace",
                    self.namespace,
                    flag,
                    objects::GATEWAY,
                    &format!("--metrics-addr=0.0.0.0:{ADMIN_PORT}"),
                ]
                .map(str::to_owned)
                .into_iter()
                .chain(
                    self.publish
                        .iter()
                        .map(|(external, real)| format!("--publish={external}={real}")),
                )
                .collect(),
            ),
            env: Some(vec![
                field("POD_NAME", "metadata.name"),
                field("POD_IP", "status.podIP"),
                field("NODE_NAME", "spec.nodeName"),
            ]),
            ports: Some(ports),
            // A TUN device, routes and nftables in the pod's own network namespace.
            security_context: Some(SecurityContext {
                privileged: Some(true),
                run_as_user: Some(0),
                ..Default::default()
            }),
            ..Default::default()
        };
        Deployment {
            metadata: self.meta(objects::GATEWAY, true),
            spec: Some(DeploymentSpec {
                replicas: Some(1),
                selector: LabelSelector {
                    match_labels: Some(self.pod_labels()),
                    ..Default::default()
                },
                strategy: Some(DeploymentStrategy {
                    type_: Some("Recreate".to_owned()),
                    rolling_update: None,
                }),
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(self.labels()),
                        ..Default::default()
                    }),
                    spec: Some(PodSpec {
                        service_account_name: Some(objects::GATEWAY.to_owned()),
                        containers: vec![container],
                        termination_grace_period_seconds: Some(10),
                        ..Default::default()
                    }),
                },
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The server's UDP Service; `None` for a client.
    pub fn service(&self) -> Option<Service> {
        let End::Server {
            port,
            service_type,
            node_port,
        } = &self.end
        else {
            return None;
        };
        let type_ = match service_type {
            ServiceType::LoadBalancer => "LoadBalancer",
            ServiceType::NodePort => "NodePort",
            ServiceType::ClusterIP => "ClusterIP",
        };
        Some(Service {
            metadata: self.meta(objects::GATEWAY, true),
            spec: Some(ServiceSpec {
                type_: Some(type_.to_owned()),
                selector: Some(self.pod_labels()),
                ports: Some(vec![ServicePort {
                    name: Some("wireguard".to_owned()),
                    protocol: Some("UDP".to_owned()),
                    port: i32::from(*port),
                    target_port: Some(IntOrString::Int(i32::from(*port))),
                    node_port: node_port
                        .filter(|_| *service_type != ServiceType::ClusterIP)
                        .map(i32::from),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        })
    }
}

fn cluster_role(name: &str) -> RoleRef {
    RoleRef {
        api_group: "rbac.authorization.k8s.io".to_owned(),
        kind: "ClusterRole".to_owned(),
        name: name.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    fn gateway(end: End) -> Gateway<'static> {
        Gateway {
            namespace: "tether-tenant-c2",
            remote: "c2",
            end,
            image: "ghcr.io/tether-dev/tetherd:test",
            owner: OwnerReference {
                api_version: "networking.tether.dev/v1alpha1".into(),
                kind: "GatewayServer".into(),
                name: "tether-gateway".into(),
                uid: "u-1".into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            },
            publish: Vec::new(),
        }
    }

    #[test]
    fn a_server_is_a_deployment_behind_a_udp_service() {
        let g = gateway(End::Server {
            port: 51840,
            service_type: ServiceType::NodePort,
            node_port: Some(31840),
        });
        let text = serde_yaml::to_string(&(g.deployment(), g.service())).unwrap();
        expect![[r#"
            - apiVersion: apps/v1
              kind: Deployment
              metadata:
                labels:
                  app.kubernetes.io/managed-by: tether
                  app.kubernetes.io/part-of: tether
                  tether.dev/component: gateway
                  tether.dev/remote-cluster-id: c2
                name: tether-gateway
                namespace: tether-tenant-c2
                ownerReferences:
                - apiVersion: networking.tether.dev/v1alpha1
                  blockOwnerDeletion: true
                  controller: true
                  kind: GatewayServer
                  name: tether-gateway
                  uid: u-1
              spec:
                replicas: 1
                selector:
                  matchLabels:
                    tether.dev/component: gateway
                    tether.dev/remote-cluster-id: c2
                strategy:
                  type: Recreate
                template:
                  metadata:
                    labels:
                      app.kubernetes.io/managed-by: tether
                      app.kubernetes.io/part-of: tether
                      tether.dev/component: gateway
                      tether.dev/remote-cluster-id: c2
                  spec:
                    containers:
                    - args:
                      - gateway
                      - --namespace
                      - tether-tenant-c2
                      - --gateway-server
                      - tether-gateway
                      - --metrics-addr=0.0.0.0:9102
                      env:
                      - name: POD_NAME
                        valueFrom:
                          fieldRef:
                            fieldPath: metadata.name
                      - name: POD_IP
                        valueFrom:
                          fieldRef:
                            fieldPath: status.podIP
                      - name: NODE_NAME
                        valueFrom:
                          fieldRef:
                            fieldPath: spec.nodeName
                      image: ghcr.io/tether-dev/tetherd:test
                      name: gateway
                      ports:
                      - containerPort: 51840
                        name: wireguard
                        protocol: UDP
                      - containerPort: 9102
                        name: admin
                        protocol: TCP
                      securityContext:
                        privileged: true
                        runAsUser: 0
                    serviceAccountName: tether-gateway
                    terminationGracePeriodSeconds: 10
            - apiVersion: v1
              kind: Service
              metadata:
                labels:
                  app.kubernetes.io/managed-by: tether
                  app.kubernetes.io/part-of: tether
                  tether.dev/component: gateway
                  tether.dev/remote-cluster-id: c2
                name: tether-gateway
                namespace: tether-tenant-c2
                ownerReferences:
                - apiVersion: networking.tether.dev/v1alpha1
                  blockOwnerDeletion: true
                  controller: true
                  kind: GatewayServer
                  name: tether-gateway
                  uid: u-1
              spec:
                ports:
                - name: wireguard
                  nodePort: 31840
                  port: 51840
                  protocol: UDP
                  targetPort: 51840
                selector:
                  tether.dev/component: gateway
                  tether.dev/remote-cluster-id: c2
                type: NodePort
        "#]]
        .assert_eq(&text);
    }

    #[test]
    fn a_client_has_no_service_and_dials_out() {
        let g = gateway(End::Client);
        assert!(g.service().is_none());
        let args = g
            .deployment()
            .spec
            .unwrap()
            .template
            .spec
            .unwrap()
            .containers[0]
            .args
            .clone()
            .unwrap();
        assert!(args.contains(&"--gateway-client".to_owned()), "{args:?}");
        assert_eq!(g.node_binding_name(), "tether-gateway-nodes-c2");
    }

    #[test]
    fn an_in_band_gateway_publishes_its_control_plane_in_its_arguments() {
        let mut g = gateway(End::Client);
        g.publish = vec![
            ("10.70.0.1".parse().unwrap(), "10.96.0.1".parse().unwrap()),
            ("10.70.0.2".parse().unwrap(), "10.96.0.20".parse().unwrap()),
        ];
        let args = g
            .deployment()
            .spec
            .unwrap()
            .template
            .spec
            .unwrap()
            .containers[0]
            .args
            .clone()
            .unwrap();
        let publish: Vec<&String> = args.iter().filter(|a| a.starts_with("--publish")).collect();
        assert_eq!(
            publish,
            [
                "--publish=10.70.0.1=10.96.0.1",
                "--publish=10.70.0.2=10.96.0.20"
            ]
        );
    }
}
