//! Pure translation between a consumer's pod and the ShadowPod its provider runs: the spec
//! loses what only means something in the consumer (scheduling, host namespaces) and its
//! ServiceAccount token volume reads the token the consumer reflected instead, and the status
//! comes back with the provider's pod addresses rewritten into the consumer's view of the
//! provider's pod CIDR.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::{PodIP, PodSpec, PodStatus, SecretVolumeSource, Volume};
use tether_api::names::taints;

/// The volumes the consumer's ServiceAccount admission injects are named
/// `kube-api-access-<suffix>`; the provider has neither the token nor the CA they carry.
const TOKEN_VOLUME_PREFIX: &str = "kube-api-access-";

/// The keys of a reflected ServiceAccount token Secret, which are the file names the
/// projected token volume has in the consumer: a pod's client finds them where it looks.
pub const TOKEN_KEY: &str = "token";
/// See [`TOKEN_KEY`].
pub const CA_KEY: &str = "ca.crt";
/// See [`TOKEN_KEY`].
pub const NAMESPACE_KEY: &str = "namespace";

/// Whether `spec` mounts the ServiceAccount token the consumer's admission injected (so its
/// offloaded copy needs one reflected).
pub fn mounts_token(spec: &PodSpec) -> bool {
    spec.volumes.iter().flatten().any(is_token_volume)
}

fn is_token_volume(v: &Volume) -> bool {
    v.name.starts_with(TOKEN_VOLUME_PREFIX)
        && v.projected.as_ref().is_some_and(|p| {
            p.sources
                .iter()
                .flatten()
                .any(|s| s.service_account_token.is_some())
        })
}

/// Kept off a ShadowPod: it describes the consumer's object, not the pod that runs, and is
/// the largest annotation there is.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The annotations of a consumer's pod that its ShadowPod carries to the provider's Pod (what
/// the pod's own programs read through the downward API, what agents at the provider act
/// on): all but [`LAST_APPLIED`] and Tether's own (`tether.dev` and its subdomains), which
/// mean something only where they were written.
pub fn shadow_annotations(pod: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    pod.iter()
        .filter(|(k, _)| *k != LAST_APPLIED && !is_tethers(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Whether an annotation or label key is in Tether's domain.
pub fn is_tethers(key: &str) -> bool {
    key.split_once('/')
        .is_some_and(|(prefix, _)| prefix == "tether.dev" || prefix.ends_with(".tether.dev"))
}

/// The pod's ServiceAccount, as its admission defaulted it.
pub fn service_account(spec: &PodSpec) -> &str {
    spec.service_account_name
        .as_deref()
        .filter(|n| !n.is_empty())
        .unwrap_or("default")
}

/// The pod spec a provider runs for a consumer's pod. `token_secret` is the Secret in the twin
/// namespace holding the pod's ServiceAccount token, CA and namespace of the consumer: the
/// token volume reads it under the same name and mounts, so the pod authenticates to the
/// consumer's API server as itself. Without one the token volume is dropped. Values the
/// provider's API server gives the Pod anyway (see [`drop_defaults`]) are left out.
pub fn shadow_spec(pod: &PodSpec, token_secret: Option<&str>) -> PodSpec {
    let mut spec = translated(pod, token_secret);
    drop_defaults(&mut spec);
    spec
}

/// The taints the DefaultTolerationSeconds admission lets every pod tolerate for
/// [`DEFAULT_TOLERATION_SECONDS`].
const DEFAULT_TOLERATED: [&str; 2] = [
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
];
/// How long DefaultTolerationSeconds tolerates [`DEFAULT_TOLERATED`].
const DEFAULT_TOLERATION_SECONDS: i64 = 300;

/// Removes what the consumer's API server defaulted and the provider's defaults to the same
/// value when it creates the Pod. Each ShadowPod crosses the link three times (the apply, its
/// watch's ADDED and the MODIFIED with its status), so these few hundred bytes count; a value
/// that differs from the default is the user's and stays.
pub fn drop_defaults(spec: &mut PodSpec) {
    fn unless<T: PartialEq>(field: &mut Option<T>, default: &T) {
        if field.as_ref() == Some(default) {
            *field = None;
        }
    }
    unless(&mut spec.dns_policy, &"ClusterFirst".to_owned());
    unless(&mut spec.restart_policy, &"Always".to_owned());
    unless(&mut spec.enable_service_links, &true);
    unless(&mut spec.termination_grace_period_seconds, &30);
    unless(&mut spec.security_context, &Default::default());
    if let Some(ts) = spec.tolerations.as_mut() {
        ts.retain(|t| {
            !(t.key
                .as_deref()
                .is_some_and(|k| DEFAULT_TOLERATED.contains(&k))
                && t.operator.as_deref() == Some("Exists")
                && t.effect.as_deref() == Some("NoExecute")
                && t.value.is_none()
                && t.toleration_seconds == Some(DEFAULT_TOLERATION_SECONDS))
        });
    }
    if spec.tolerations.as_ref().is_some_and(Vec::is_empty) {
        spec.tolerations = None;
    }
    for c in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        unless(
            &mut c.termination_message_path,
            &"/dev/termination-log".to_owned(),
        );
        unless(&mut c.termination_message_policy, &"File".to_owned());
        if let Some(image) = c.image.as_deref() {
            let default = default_pull_policy(image).to_owned();
            unless(&mut c.image_pull_policy, &default);
        }
        for port in c.ports.iter_mut().flatten() {
            unless(&mut port.protocol, &"TCP".to_owned());
        }
    }
}

/// The `imagePullPolicy` Kubernetes gives a container without one: `Always` for the `latest`
/// tag, or no tag and no digest; else `IfNotPresent`.
pub fn default_pull_policy(image: &str) -> &'static str {
    let (name, digest) = match image.split_once('@') {
        Some((name, _)) => (name, true),
        None => (image, false),
    };
    let last = name.rsplit('/').next().unwrap_or(name);
    match last.split_once(':') {
        Some((_, "latest")) => "Always",
        Some(_) => "IfNotPresent",
        None if digest => "IfNotPresent",
        None => "Always",
    }
}

fn translated(pod: &PodSpec, token_secret: Option<&str>) -> PodSpec {
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
        match token_secret {
            Some(secret) => {
                for v in volumes.iter_mut().filter(|v| is_token_volume(v)) {
                    let mode = v.projected.as_ref().and_then(|p| p.default_mode);
                    *v = Volume {
                        name: v.name.clone(),
                        secret: Some(SecretVolumeSource {
                            secret_name: Some(secret.to_owned()),
                            default_mode: mode,
                            ..Default::default()
                        }),
                        ..Default::default()
                    };
                }
                return spec;
            }
            None => volumes.retain(|v| !v.name.starts_with(TOKEN_VOLUME_PREFIX)),
        }
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

/// The names a pod's client may use for its API server; every kube-apiserver certificate
/// carries them, so TLS holds when they resolve to the consumer's published address.
pub const API_SERVER_NAMES: [&str; 4] = [
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];

/// Points an offloaded pod at its consumer's API server, which the provider reaches at `ip`
/// (the consumer's published address in the provider's view) and port 443: the API server's
/// names resolve there (host aliases, ahead of the provider's DNS), and the variables a
/// kubelet sets name it by the name its certificate carries rather than an address it does
/// not. A variable the pod sets itself is left alone.
pub fn point_at_consumer_api(spec: &mut PodSpec, ip: Ipv4Addr) {
    let host = API_SERVER_NAMES[1];
    let url = format!("tcp://{ip}:443");
    let vars = [
        ("KUBERNETES_SERVICE_HOST", host.to_owned()),
        ("KUBERNETES_SERVICE_PORT", "443".to_owned()),
        ("KUBERNETES_SERVICE_PORT_HTTPS", "443".to_owned()),
        ("KUBERNETES_PORT", url.clone()),
        ("KUBERNETES_PORT_443_TCP", url),
        ("KUBERNETES_PORT_443_TCP_PROTO", "tcp".to_owned()),
        ("KUBERNETES_PORT_443_TCP_PORT", "443".to_owned()),
        ("KUBERNETES_PORT_443_TCP_ADDR", ip.to_string()),
    ];
    for c in spec
        .init_containers
        .iter_mut()
        .flatten()
        .chain(spec.containers.iter_mut())
    {
        let env = c.env.get_or_insert_with(Vec::new);
        for (name, value) in &vars {
            if !env.iter().any(|e| e.name == *name) {
                env.push(k8s_openapi::api::core::v1::EnvVar {
                    name: (*name).to_owned(),
                    value: Some(value.clone()),
                    value_from: None,
                });
            }
        }
    }
    let aliases = spec.host_aliases.get_or_insert_with(Vec::new);
    aliases.retain(|a| {
        !a.hostnames
            .iter()
            .flatten()
            .any(|h| API_SERVER_NAMES.contains(&h.as_str()))
    });
    aliases.push(k8s_openapi::api::core::v1::HostAlias {
        ip: ip.to_string(),
        hostnames: Some(API_SERVER_NAMES.iter().map(|&h| h.to_owned()).collect()),
    });
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
    fn a_shadow_pod_carries_the_pods_annotations_but_last_applied_and_tethers() {
        let pod: BTreeMap<String, String> = [
            ("prometheus.io/scrape", "true"),
            (LAST_APPLIED, "{}"),
            ("tether.dev/stored-pod-spec", "{}"),
            ("offloading.tether.dev/x", "y"),
            ("nottether.dev/kept", "1"),
            ("plain", "2"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let carried: Vec<_> = shadow_annotations(&pod).into_keys().collect();
        assert_eq!(
            carried,
            ["nottether.dev/kept", "plain", "prometheus.io/scrape"]
        );
    }

    #[test]
    fn the_shadow_spec_keeps_the_workload_and_drops_the_consumers_placement_and_identity() {
        let s = shadow_spec(&consumer_pod(), None);
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
    fn what_the_providers_api_server_defaults_anyway_is_left_out() {
        let defaulted: PodSpec = serde_json::from_value(serde_json::json!({
            "containers": [
                {"name": "a", "image": "sleeper", "imagePullPolicy": "Always",
                 "terminationMessagePath": "/dev/termination-log",
                 "terminationMessagePolicy": "File",
                 "ports": [{"containerPort": 80, "protocol": "TCP"}, {"containerPort": 53, "protocol": "UDP"}]},
                {"name": "b", "image": "registry:5000/app:1.2", "imagePullPolicy": "IfNotPresent",
                 "terminationMessagePath": "/tmp/why", "terminationMessagePolicy": "FallbackToLogsOnError"},
                {"name": "c", "image": "app:latest", "imagePullPolicy": "IfNotPresent"},
                {"name": "d", "image": "app@sha256:00", "imagePullPolicy": "Never"}
            ],
            "dnsPolicy": "ClusterFirst", "restartPolicy": "Always", "enableServiceLinks": true,
            "terminationGracePeriodSeconds": 30, "securityContext": {},
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60}
            ]
        }))
        .expect("spec");
        let s = shadow_spec(&defaulted, None);
        let json = serde_json::to_string_pretty(&s).expect("json");
        expect![[r#"
            {
              "automountServiceAccountToken": false,
              "containers": [
                {
                  "image": "sleeper",
                  "name": "a",
                  "ports": [
                    {
                      "containerPort": 80
                    },
                    {
                      "containerPort": 53,
                      "protocol": "UDP"
                    }
                  ]
                },
                {
                  "image": "registry:5000/app:1.2",
                  "name": "b",
                  "terminationMessagePath": "/tmp/why",
                  "terminationMessagePolicy": "FallbackToLogsOnError"
                },
                {
                  "image": "app:latest",
                  "imagePullPolicy": "IfNotPresent",
                  "name": "c"
                },
                {
                  "image": "app@sha256:00",
                  "imagePullPolicy": "Never",
                  "name": "d"
                }
              ],
              "tolerations": [
                {
                  "effect": "NoExecute",
                  "key": "node.kubernetes.io/unreachable",
                  "operator": "Exists",
                  "tolerationSeconds": 60
                }
              ]
            }"#]]
        .assert_eq(&json);
        // A user's own choices stay even where they look like defaults elsewhere.
        let mut own = defaulted;
        own.restart_policy = Some("OnFailure".into());
        own.termination_grace_period_seconds = Some(1);
        let s = shadow_spec(&own, None);
        assert_eq!(s.restart_policy.as_deref(), Some("OnFailure"));
        assert_eq!(s.termination_grace_period_seconds, Some(1));
    }

    #[test]
    fn pull_policies_default_by_tag() {
        for (image, policy) in [
            ("busybox", "Always"),
            ("busybox:latest", "Always"),
            ("busybox:1.36", "IfNotPresent"),
            ("localhost:5000/busybox", "Always"),
            ("localhost:5000/busybox:1", "IfNotPresent"),
            ("busybox@sha256:abc", "IfNotPresent"),
            ("busybox:latest@sha256:abc", "Always"),
            ("busybox:1@sha256:abc", "IfNotPresent"),
        ] {
            assert_eq!(default_pull_policy(image), policy, "{image}");
        }
    }

    fn token_volume() -> Volume {
        serde_json::from_value(serde_json::json!({
            "name": "kube-api-access-x7k2p",
            "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
            ]}
        }))
        .expect("a projected token volume")
    }

    #[test]
    fn a_reflected_token_takes_the_place_of_the_projected_one_under_the_same_mounts() {
        let mut pod = consumer_pod();
        pod.volumes.as_mut().expect("volumes")[0] = token_volume();
        assert!(mounts_token(&pod));
        assert_eq!(service_account(&pod), "app");
        let s = shadow_spec(&pod, Some("tether-token-app"));
        let json = serde_json::to_value(&s).expect("json");
        assert_eq!(
            json["volumes"][0],
            serde_json::json!({
                "name": "kube-api-access-x7k2p",
                "secret": {"defaultMode": 420, "secretName": "tether-token-app"}
            })
        );
        assert_eq!(
            json["containers"][0]["volumeMounts"][0]["mountPath"],
            "/var/run/secrets/kubernetes.io/serviceaccount"
        );
        // Still not the provider's to give a token of its own.
        assert_eq!(json["automountServiceAccountToken"], false);
        assert!(json.get("serviceAccountName").is_none());
        // A volume merely named like one is not a token volume.
        assert!(!mounts_token(&consumer_pod()));
        let none = PodSpec {
            service_account_name: Some(String::new()),
            ..Default::default()
        };
        assert_eq!(service_account(&none), "default");
    }

    #[test]
    fn an_offloaded_pod_finds_its_consumers_api_server_by_name() {
        let mut spec = consumer_pod();
        spec.containers[0].env = Some(vec![k8s_openapi::api::core::v1::EnvVar {
            name: "KUBERNETES_SERVICE_PORT".into(),
            value: Some("6443".into()),
            value_from: None,
        }]);
        spec.host_aliases = Some(vec![
            k8s_openapi::api::core::v1::HostAlias {
                ip: "192.0.2.9".into(),
                hostnames: Some(vec!["kubernetes.default".into()]),
            },
            k8s_openapi::api::core::v1::HostAlias {
                ip: "192.0.2.10".into(),
                hostnames: Some(vec!["db".into()]),
            },
        ]);
        point_at_consumer_api(&mut spec, Ipv4Addr::new(10, 71, 0, 1));
        let env: Vec<String> = spec.containers[0]
            .env
            .iter()
            .flatten()
            .map(|e| format!("{}={}", e.name, e.value.as_deref().unwrap_or_default()))
            .collect();
        expect![[r#"
            [
                "KUBERNETES_SERVICE_PORT=6443",
                "KUBERNETES_SERVICE_HOST=kubernetes.default",
                "KUBERNETES_SERVICE_PORT_HTTPS=443",
                "KUBERNETES_PORT=tcp://10.71.0.1:443",
                "KUBERNETES_PORT_443_TCP=tcp://10.71.0.1:443",
                "KUBERNETES_PORT_443_TCP_PROTO=tcp",
                "KUBERNETES_PORT_443_TCP_PORT=443",
                "KUBERNETES_PORT_443_TCP_ADDR=10.71.0.1",
            ]
        "#]]
        .assert_debug_eq(&env);
        let aliases = serde_json::to_string(&spec.host_aliases).expect("json");
        assert_eq!(
            aliases,
            r#"[{"hostnames":["db"],"ip":"192.0.2.10"},{"hostnames":["kubernetes","kubernetes.default","kubernetes.default.svc","kubernetes.default.svc.cluster.local"],"ip":"10.71.0.1"}]"#
        );
        // Idempotent: a second pass changes nothing.
        let once = spec.clone();
        point_at_consumer_api(&mut spec, Ipv4Addr::new(10, 71, 0, 1));
        assert_eq!(spec, once);
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
