//! What the daemon sets up in a new cluster besides the API server: the objects a kubeadm
//! cluster starts with, and the cluster DNS.

use std::net::{IpAddr, SocketAddr};

use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::topology::{self, Plan};

/// The `ClusterConfiguration` document kubeadm stores in `kube-system/kubeadm-config`, with the
/// keys in kubeadm's order, so installers read the pod and service CIDRs as on kubeadm clusters.
pub(super) fn kubeadm_cluster_configuration(plan: &Plan, service_cidr: Ipv4Net) -> String {
    format!(
        "apiServer: {{}}\n\
         apiVersion: kubeadm.k8s.io/v1beta3\n\
         clusterName: {name}\n\
         controlPlaneEndpoint: {endpoint}\n\
         kind: ClusterConfiguration\n\
         kubernetesVersion: {version}\n\
         networking:\n\
         \x20 dnsDomain: {domain}\n\
         \x20 podSubnet: {pods}\n\
         \x20 serviceSubnet: {services}\n",
        name = plan.name,
        endpoint = plan.api_addr(),
        version = simkube::discovery::KUBERNETES_VERSION,
        domain = topology::CLUSTER_DOMAIN,
        pods = plan.pod_cidr,
        services = service_cidr,
    )
}

/// The cluster objects a kubeadm cluster starts with that the API server does not seed: the
/// nodes' permissions, the `kubeadm-config` ConfigMap, the default StorageClass `standard` and
/// the DNS Service with its (selector-less) endpoints.
pub(super) async fn bootstrap(
    client: &kube::Client,
    plan: &Plan,
    service_cidr: Ipv4Net,
) -> Result<(), Error> {
    let pp = PostParams::default();
    let kubeadm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "kubeadm-config", "namespace": "kube-system"},
        "data": {"ClusterConfiguration": kubeadm_cluster_configuration(plan, service_cidr)},
    }))
    .expect("invariant: a valid ConfigMap");
    Api::<ConfigMap>::namespaced(client.clone(), "kube-system")
        .create(&pp, &kubeadm)
        .await
        .map_err(Error::api("creating the kubeadm-config ConfigMap"))?;
    // The nodes authenticate with certificates (system:node:<name>, group system:nodes). The
    // API server has no Node authorizer, so the group gets what a kubelet may do by binding it
    // to cluster-admin.
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "simkube:nodes"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}],
    }))
    .expect("invariant: a valid ClusterRoleBinding");
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&pp, &binding)
        .await
        .map_err(Error::api("creating the nodes' ClusterRoleBinding"))?;
    // kind and most installers ship a default class; this one is served by the
    // persistent-volume controller's host-path provisioner.
    Api::<StorageClass>::all(client.clone())
        .create(
            &pp,
            &simkube::controllers::persistent_volumes::default_storage_class(),
        )
        .await
        .map_err(Error::api("creating the default StorageClass"))?;
    let dns_ip = topology::DNS_SERVICE_IP.to_string();
    let gateway = plan.gateway().to_string();
    let labels = json!({"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS", "kubernetes.io/cluster-service": "true"});
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": labels},
        "spec": {"clusterIP": dns_ip, "ports": [
            {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
            {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
        ]},
    }))
    .expect("invariant: a valid Service");
    Api::<Service>::namespaced(client.clone(), "kube-system")
        .create(&pp, &service)
        .await
        .map_err(Error::api("creating the kube-dns Service"))?;
    let endpoints: Endpoints = serde_json::from_value(json!({
        "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": labels},
        "subsets": [{"addresses": [{"ip": gateway}], "ports": [
            {"name": "dns", "port": 53, "protocol": "UDP"},
            {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
        ]}],
    }))
    .expect("invariant: valid Endpoints");
    Api::<Endpoints>::namespaced(client.clone(), "kube-system")
        .create(&pp, &endpoints)
        .await
        .map_err(Error::api("creating the kube-dns Endpoints"))?;
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": "kube-dns-simkube", "namespace": "kube-system", "labels": {
            "kubernetes.io/service-name": "kube-dns",
            "endpointslice.kubernetes.io/managed-by": "simkube-cluster",
        }},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [gateway], "conditions": {"ready": true, "serving": true, "terminating": false}}],
        "ports": [
            {"name": "dns", "port": 53, "protocol": "UDP"},
            {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
        ],
    }))
    .expect("invariant: a valid EndpointSlice");
    Api::<EndpointSlice>::namespaced(client.clone(), "kube-system")
        .create(&pp, &slice)
        .await
        .map_err(Error::api("creating the kube-dns EndpointSlice"))?;
    Ok(())
}

/// Binds 198.18.X.1:53 (UDP and TCP) and serves the cluster DNS there.
pub(super) async fn start_dns(
    client: kube::Client,
    plan: &Plan,
    metrics: simkube_dns::Metrics,
    shutdown: CancellationToken,
) -> Result<tokio::task::JoinHandle<Result<(), simkube_dns::DnsError>>, Error> {
    let addr = SocketAddr::new(IpAddr::V4(plan.gateway()), 53);
    let udp = tokio::net::UdpSocket::bind(addr)
        .await
        .map_err(Error::io(format!("binding the DNS server to {addr}/udp")))?;
    let tcp = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(Error::io(format!("binding the DNS server to {addr}/tcp")))?;
    let config = simkube_dns::DnsConfig {
        domain: topology::CLUSTER_DOMAIN.to_owned(),
        metrics,
        ..simkube_dns::DnsConfig::default()
    };
    tracing::info!(%addr, "cluster DNS listening");
    Ok(tokio::spawn(simkube_dns::serve(
        client, config, udp, tcp, shutdown,
    )))
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    #[test]
    fn kubeadm_config_names_the_networking_as_kubeadm_does() {
        let plan = Plan::new("east", 3, 2);
        let text = kubeadm_cluster_configuration(&plan, "10.96.0.0/12".parse().expect("cidr"));
        expect![[r#"
            apiServer: {}
            apiVersion: kubeadm.k8s.io/v1beta3
            clusterName: east
            controlPlaneEndpoint: 198.18.3.1:6443
            kind: ClusterConfiguration
            kubernetesVersion: v1.33.1
            networking:
              dnsDomain: cluster.local
              podSubnet: 10.244.0.0/16
              serviceSubnet: 10.96.0.0/12
        "#]]
        .assert_eq(&text);
    }
}
