//! Start-up pieces: the listener, the admin token, resourceVersion offsets, and the objects a fresh cluster has and keeps (system namespaces, the `kubernetes` Service and its endpoints, the default RBAC policy, the client CA in `kube-system/extension-apiserver-authentication`).

#[allow(clippy::wildcard_imports)]
use super::*;

/// Random across processes and a billion apart within one, so clusters side by side never hand
/// out the same resourceVersion (a random multiple of 1000 alone collides one time in 999).
pub(super) fn default_rv_offset() -> u64 {
    static STARTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nth = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    nth * 1_000_000_000 + rand::rng().random_range(1..1000) * 1000
}

pub(super) fn random_token() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut rng = rand::rng();
    (0..48)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

pub(super) async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, Error> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .map_err(|source| Error::Bind { addr, source })?;
    socket
        .set_reuseaddr(true)
        .map_err(|source| Error::Bind { addr, source })?;
    socket
        .bind(addr)
        .map_err(|source| Error::Bind { addr, source })?;
    socket
        .listen(1024)
        .map_err(|source| Error::Bind { addr, source })
}

/// Where kube-apiserver publishes the CA its clients' certificates are verified against, for
/// in-cluster components that authenticate callers the same way (extension API servers,
/// kubelet-like endpoints).
pub const CLIENT_CA_CONFIGMAP: &str = "extension-apiserver-authentication";
/// The key of that ConfigMap holding the PEM client CA.
pub const CLIENT_CA_KEY: &str = "client-ca-file";

/// The objects a fresh cluster has: system namespaces, the `kubernetes` Service with its
/// endpoints, the default RBAC policy and, with TLS, the client CA ConfigMap.
pub(super) fn seed(state: &ServerState, advertise: SocketAddr, ca: Option<&CertAuthority>) {
    let registry = state.registry();
    let mut objects: Vec<(&str, &str, Value)> = Vec::new();
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        objects.push((
            "",
            "namespaces",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        ));
    }
    for role in auth::default_cluster_roles() {
        objects.push((auth::RBAC_GROUP, "clusterroles", role));
    }
    for binding in auth::default_cluster_role_bindings() {
        objects.push((auth::RBAC_GROUP, "clusterrolebindings", binding));
    }
    if let Some(ca) = ca {
        // kube-apiserver adds the request-header keys when a front proxy is configured;
        // simulated clusters have none.
        objects.push((
            "",
            "configmaps",
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": CLIENT_CA_CONFIGMAP, "namespace": "kube-system"},
                   "data": {CLIENT_CA_KEY: ca.ca_pem()}}),
        ));
    }
    state.store.transact(|txn| {
        for (group, plural, mut obj) in objects {
            let Some(rt) = registry
                .types
                .iter()
                .find(|t| t.group == group && t.plural == plural)
            else {
                continue;
            };
            if strategy::prepare_create(rt, &mut obj).is_ok() {
                txn.put(&TypeKey::new(group, plural), obj);
            }
        }
    });
    reconcile_kubernetes_service(state, advertise);
}

/// How often the server re-asserts the `kubernetes` Service and its endpoints (kube-apiserver
/// does every 10 s; in-process this costs three map lookups, so repairs show sooner).
pub(super) const KUBERNETES_SERVICE_INTERVAL: Duration = Duration::from_secs(1);

/// kube-apiserver's bootstrap controller and endpoint reconciler: the `kubernetes` Service in
/// `default` exists with its https port, and its Endpoints and EndpointSlice name the
/// advertised address, whatever clients did to them.
pub(super) async fn keep_kubernetes_service(
    state: Arc<ServerState>,
    advertise: SocketAddr,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(KUBERNETES_SERVICE_INTERVAL) => {}
        }
        reconcile_kubernetes_service(&state, advertise);
    }
}

/// What the `kubernetes` Service, Endpoints and EndpointSlice must say (the Service's
/// ClusterIP, the first address of the service range, is set only at creation).
pub(super) fn kubernetes_service_objects(
    cidr: ipnet::Ipv4Net,
    advertise: SocketAddr,
) -> [(&'static str, &'static str, Value); 3] {
    let cluster_ip = std::net::Ipv4Addr::from(u32::from(cidr.network()).saturating_add(1));
    let port = json!({"name": "https", "port": advertise.port(), "protocol": "TCP"});
    let address_type = if advertise.is_ipv4() { "IPv4" } else { "IPv6" };
    let ip = advertise.ip().to_string();
    [
        (
            "",
            "services",
            json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "kubernetes", "namespace": "default",
                    "labels": {"component": "apiserver", "provider": "kubernetes"}},
                "spec": {"clusterIP": cluster_ip.to_string(), "clusterIPs": [cluster_ip.to_string()],
                    "type": "ClusterIP", "sessionAffinity": "None",
                    "ports": [{"name": "https", "port": 443, "protocol": "TCP",
                        "targetPort": advertise.port()}]}}),
        ),
        (
            "",
            "endpoints",
            json!({"apiVersion": "v1", "kind": "Endpoints",
                "metadata": {"name": "kubernetes", "namespace": "default",
                    "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}},
                "subsets": [{"addresses": [{"ip": ip}], "ports": [port]}]}),
        ),
        (
            "discovery.k8s.io",
            "endpointslices",
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": "kubernetes", "namespace": "default",
                    "labels": {"kubernetes.io/service-name": "kubernetes"}},
                "addressType": address_type,
                "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}],
                "ports": [port]}),
        ),
    ]
}

/// Creates whichever of the three objects is missing and puts back the fields the server
/// owns (the Service's ports, the endpoints' addresses and ports) where they were changed.
pub(super) fn reconcile_kubernetes_service(state: &ServerState, advertise: SocketAddr) {
    let registry = state.registry();
    let objects = kubernetes_service_objects(state.config.service_cidr, advertise);
    state.store.transact(|txn| {
        if txn
            .get(&TypeKey::new("", "namespaces"), "", "default")
            .is_none()
        {
            return;
        }
        for (group, plural, want) in objects {
            let Some(rt) = registry
                .types
                .iter()
                .find(|t| t.group == group && t.plural == plural)
            else {
                continue;
            };
            let key = TypeKey::new(group, plural);
            match txn.get(&key, "default", "kubernetes") {
                None => {
                    let mut obj = want;
                    // Recreating the Service needs its address back; like the real bootstrap
                    // controller, wait (and retry) while another Service holds it.
                    let ip = &obj["spec"]["clusterIP"];
                    if plural == "services"
                        && txn
                            .list(&key, None)
                            .iter()
                            .any(|s| &s["spec"]["clusterIP"] == ip)
                    {
                        tracing::warn!(%ip, "the kubernetes Service's address is taken");
                        continue;
                    }
                    if strategy::prepare_create(rt, &mut obj).is_ok() {
                        txn.put(&key, obj);
                    }
                }
                Some(have) => {
                    let mut fixed = (*have).clone();
                    if plural == "services" {
                        if fixed["spec"].is_object() {
                            fixed["spec"]["ports"] = want["spec"]["ports"].clone();
                        }
                    } else {
                        for field in ["subsets", "addressType", "endpoints", "ports"] {
                            if let Some(value) = want.get(field) {
                                fixed[field] = value.clone();
                            }
                        }
                    }
                    // `put` leaves an object that comes out unchanged alone.
                    if strategy::prepare_update(rt, &have, &mut fixed, None).is_ok() {
                        txn.put(&key, fixed);
                    }
                }
            }
        }
    });
}
