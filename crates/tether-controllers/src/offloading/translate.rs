//! Pure translation between a consumer's pod and the ShadowPod its provider runs: the spec
//! loses what only means something in the consumer (scheduling, the consumer's
//! ServiceAccount token volume, host namespaces), and the status comes back with the
//! provider's pod addresses rewritten into the consumer's view of the provider's pod CIDR.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::{PodIP, PodSpec, PodStatus};
use tether_api::names::taints;

/// The volumes the consumer's ServiceAccount admission injects are named
/// `kube-api-access-<suffix>`; the provider has neither the token nor the CA they carry.
const TOKEN_VOLUME_PREFIX: &str = "kube-api-access-";

/// The pod spec a provider runs for a consumer's pod.
pub fn shadow_spec(pod: &PodSpec) -> PodSpec {
    let mut spec = pod.clone();
    // The consumer's scheduler placed the pod on the virtual node; the provider schedules it
    // again among its own nodes, where none of these mean anything.
    spec.node_name = None;
    spec.node_selector = None;
    spec.affinity = None;
    spec.scheduler_name = None;
    spec.priority = None;
    spec.priority_class_name = None;
    spec.preemption_policy = None;
    spec.tolerations = pod.tolerations.as_ref().map(|ts| {
        ts.iter()
            .filter(|t| t.key.as_deref() != Some(taints::NOT_ALLOWED))
            .cloned()
            .collect()
    });
    if spec.tolerations.as_ref().is_some_and(Vec::is_empty) {
        spec.tolerations = None;
    }
    // A tenant must not reach into the provider's nodes.
    spec.host_network = None;
    spec.host_pid = None;
    spec.host_ipc = None;
    // The provider's `default` ServiceAccount, without a token: the consumer's identity is
    // not the provider's to hand out.
    spec.service_account_name = None;
    #[allow(deprecated)]
    {
        spec.service_account = None;
    }
    spec.automount_service_account_token = Some(false);
    if let Some(volumes) = spec.volumes.as_mut() {
        volumes.retain(|v| !v.name.starts_with(TOKEN_VOLUME_PREFIX));
    }
    if spec.volumes.as_ref().is_some_and(Vec::is_empty) {
        spec.volumes = None;
    }
    for c in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        if let Some(mounts) = c.volume_mounts.as_mut() {
            mounts.retain(|m| !m.name.starts_with(TOKEN_VOLUME_PREFIX));
        }
        if c.volume_mounts.as_ref().is_some_and(Vec::is_empty) {
            c.volume_mounts = None;
        }
    }
    spec
}

/// How the consumer addresses the provider's pods: pairs of (real CIDR, local view).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodView {
    pairs: Vec<(Ipv4Net, Ipv4Net)>,
}

impl PodView {
    /// From the Configuration's real pod CIDRs and their view, index-aligned; unparsable or
    /// mismatched entries are skipped.
    pub fn new(real: &[String], view: &[String]) -> Self {
        let pairs = real
            .iter()
            .zip(view)
            .filter_map(|(r, v)| {
                let r: Ipv4Net = r.parse().ok()?;
                let v: Ipv4Net = v.parse().ok()?;
                (r.prefix_len() == v.prefix_len()).then_some((r, v))
            })
            .collect();
        Self { pairs }
    }

    /// `ip` (a provider pod address) as the consumer reaches it; `None` outside the
    /// provider's pod CIDRs.
    pub fn translate(&self, ip: &str) -> Option<String> {
        let ip: Ipv4Addr = ip.parse().ok()?;
        let (real, view) = self.pairs.iter().find(|(r, _)| r.contains(&ip))?;
        let host = u32::from(ip) & !u32::from(real.netmask());
        Some(Ipv4Addr::from(u32::from(view.network()) | host).to_string())
    }
}

/// The consumer's pod status from the provider's: addresses translated (an address outside
/// the known CIDRs, such as a host-network one, is dropped rather than shown wrong), the host
/// address being the virtual node's.
pub fn local_status(remote: &PodStatus, view: &PodView, host_ip: Option<&str>) -> PodStatus {
    let mut st = remote.clone();
    st.pod_ip = remote.pod_ip.as_deref().and_then(|ip| view.translate(ip));
    st.pod_ips = remote.pod_ips.as_ref().map(|ips| {
        ips.iter()
            .filter_map(|p| view.translate(&p.ip))
            .map(|ip| PodIP { ip })
            .collect()
    });
    if st.pod_ips.as_ref().is_some_and(Vec::is_empty) {
        st.pod_ips = None;
    }
    st.host_ip = host_ip.map(str::to_owned);
    st.host_ips = host_ip.map(|ip| vec![k8s_openapi::api::core::v1::HostIP { ip: ip.to_owned() }]);
    st.nominated_node_name = None;
    st
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;
    use k8s_openapi::api::core::v1::{Container, Toleration, Volume, VolumeMount};

    fn consumer_pod() -> PodSpec {
        PodSpec {
            node_name: Some("beta".into()),
            node_selector: Some([("tether.dev/type".to_owned(), "virtual-node".to_owned())].into()),
            service_account_name: Some("app".into()),
            host_network: Some(true),
            tolerations: Some(vec![
                Toleration {
                    key: Some(taints::NOT_ALLOWED.into()),
                    operator: Some("Exists".into()),
                    effect: Some("NoExecute".into()),
                    ..Default::default()
                },
                Toleration {
                    key: Some("dedicated".into()),
                    operator: Some("Equal".into()),
                    value: Some("gpu".into()),
                    ..Default::default()
                },
            ]),
            volumes: Some(vec![
                Volume {
                    name: "kube-api-access-x7k2p".into(),
                    ..Default::default()
                },
                Volume {
                    name: "data".into(),
                    ..Default::default()
                },
            ]),
            containers: vec![Container {
                name: "app".into(),
                image: Some("busybox".into()),
                volume_mounts: Some(vec![
                    VolumeMount {
                        name: "kube-api-access-x7k2p".into(),
                        mount_path: "/var/run/secrets/kubernetes.io/serviceaccount".into(),
                        ..Default::default()
                    },
                    VolumeMount {
                        name: "data".into(),
                        mount_path: "/data".into(),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn the_shadow_spec_keeps_the_workload_and_drops_the_consumers_placement_and_identity() {
        let s = shadow_spec(&consumer_pod());
        let json = serde_json::to_string_pretty(&s).expect("json");
        expect![[r#"
            {
              "automountServiceAccountToken": false,
              "containers": [
                {
                  "image": "busybox",
                  "name": "app",
                  "volumeMounts": [
                    {
                      "mountPath": "/data",
                      "name": "data"
                    }
                  ]
                }
              ],
              "tolerations": [
                {
                  "key": "dedicated",
                  "operator": "Equal",
                  "value": "gpu"
                }
              ],
              "volumes": [
                {
                  "name": "data"
                }
              ]
            }"#]]
        .assert_eq(&json);
    }

    #[test]
    fn addresses_come_back_in_the_consumers_view() {
        let view = PodView::new(&["10.244.0.0/16".into()], &["10.0.0.0/16".into()]);
        assert_eq!(view.translate("10.244.1.5").as_deref(), Some("10.0.1.5"));
        assert_eq!(view.translate("192.168.1.5"), None);
        let remote = PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some("10.244.1.5".into()),
            pod_ips: Some(vec![PodIP {
                ip: "10.244.1.5".into(),
            }]),
            host_ip: Some("198.18.2.11".into()),
            ..Default::default()
        };
        let local = local_status(&remote, &view, Some("10.244.0.9"));
        assert_eq!(local.pod_ip.as_deref(), Some("10.0.1.5"));
        assert_eq!(
            local.pod_ips.as_ref().map(|v| v[0].ip.as_str()),
            Some("10.0.1.5")
        );
        assert_eq!(local.host_ip.as_deref(), Some("10.244.0.9"));
        assert_eq!(local.phase.as_deref(), Some("Running"));
        // Not remapped (disjoint CIDRs): the view is the identity.
        let same = PodView::new(&["10.245.0.0/16".into()], &["10.245.0.0/16".into()]);
        assert_eq!(same.translate("10.245.3.4").as_deref(), Some("10.245.3.4"));
    }

    proptest::proptest! {
        #[test]
        fn translation_keeps_the_host_part(host in 0u32..65536) {
            let view = PodView::new(&["10.244.0.0/16".into()], &["10.7.0.0/16".into()]);
            let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 244, 0, 0)) | host);
            let out: Ipv4Addr = view.translate(&ip.to_string()).unwrap().parse().unwrap();
            proptest::prop_assert_eq!(u32::from(out) & 0xffff, host);
            proptest::prop_assert_eq!(u32::from(out) >> 16, (10 << 8) | 7);
        }
    }
}
