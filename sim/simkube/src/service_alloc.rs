//! Service ClusterIP and NodePort allocation, as kube-apiserver does it synchronously when a
//! Service is created: a random free IP of the service CIDR (or the requested one, validated),
//! a random free port of 30000-32767 for each port of NodePort and LoadBalancer Services (or
//! the requested one), and the 422 messages of the real server when a request cannot be met.
//!
//! The allocator is pure: its state is rebuilt from the stored Services, so it survives
//! restarts and never drifts from what is stored.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::ops::RangeInclusive;

use ipnet::Ipv4Net;
use rand::Rng;
use serde_json::{Value, json};

/// The default service CIDR, 10.96.0.0/12 (kube-apiserver's `--service-cluster-ip-range` as
/// kubeadm sets it).
pub const DEFAULT_SERVICE_CIDR: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(10, 96, 0, 0), 12);
/// The default node port range.
pub const NODE_PORT_RANGE: RangeInclusive<u16> = 30000..=32767;

/// Why a Service's request cannot be met: the field, the offending value, and the real detail.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: Invalid value: {value}: {detail}")]
pub struct AllocError {
    /// JSON path of the field (`spec.clusterIP`, `spec.ports[0].nodePort`).
    pub field: String,
    /// The value as JSON.
    pub value: Value,
    /// The explanation, worded as kube-apiserver's.
    pub detail: String,
}

/// Which IPs and node ports are taken.
#[derive(Debug, Clone)]
pub struct ServiceAllocator {
    network: u32,
    prefix: u8,
    ips: BTreeSet<u32>,
    ports: BTreeSet<u16>,
}

impl Default for ServiceAllocator {
    fn default() -> Self {
        Self::new(DEFAULT_SERVICE_CIDR)
    }
}

impl ServiceAllocator {
    /// An empty allocator for `cidr` (host bits are ignored; ranges smaller than a /30 are
    /// treated as a /30, the smallest with a usable address).
    pub fn new(cidr: Ipv4Net) -> Self {
        let network = cidr.network();
        let prefix = cidr.prefix_len().min(30);
        let mask = if prefix == 0 {
            0
        } else {
            u32::MAX << (32 - prefix)
        };
        Self {
            network: u32::from(network) & mask,
            prefix,
            ips: BTreeSet::new(),
            ports: BTreeSet::new(),
        }
    }

    /// An allocator holding what `services` (stored Service objects) already use.
    pub fn from_services<'a>(cidr: Ipv4Net, services: impl IntoIterator<Item = &'a Value>) -> Self {
        let mut out = Self::new(cidr);
        for svc in services {
            out.hold(svc);
        }
        out
    }

    /// Marks a stored Service's IP and node ports as taken.
    pub fn hold(&mut self, svc: &Value) {
        if let Some(ip) = svc["spec"]["clusterIP"]
            .as_str()
            .and_then(|s| s.parse::<Ipv4Addr>().ok())
        {
            self.ips.insert(u32::from(ip));
        }
        for p in svc["spec"]["ports"].as_array().into_iter().flatten() {
            if let Some(n) = p["nodePort"].as_u64().and_then(|n| u16::try_from(n).ok()) {
                self.ports.insert(n);
            }
        }
    }

    fn cidr(&self) -> String {
        format!("{}/{}", Ipv4Addr::from(self.network), self.prefix)
    }

    fn size(&self) -> u32 {
        1u32 << (32 - self.prefix)
    }

    /// Whether `ip` is a usable address of the range (not the network or broadcast address).
    pub fn in_range(&self, ip: Ipv4Addr) -> bool {
        let n = u32::from(ip);
        n > self.network && n < self.network + self.size() - 1
    }

    /// Takes `requested`, or a random free IP.
    pub fn allocate_ip(
        &mut self,
        requested: Option<Ipv4Addr>,
        rng: &mut impl Rng,
    ) -> Result<Ipv4Addr, AllocError> {
        let fail = |value: String, detail: String| AllocError {
            field: "spec.clusterIP".into(),
            value: json!(value),
            detail,
        };
        if let Some(ip) = requested {
            if !self.in_range(ip) {
                return Err(fail(
                    ip.to_string(),
                    format!(
                        "provided IP is not in the valid range. The range of valid IPs is {}",
                        self.cidr()
                    ),
                ));
            }
            if !self.ips.insert(u32::from(ip)) {
                return Err(fail(
                    ip.to_string(),
                    "provided IP is already allocated".into(),
                ));
            }
            return Ok(ip);
        }
        let usable = self.size() - 2;
        let free = usable
            - u32::try_from(self.ips.len())
                .unwrap_or(u32::MAX)
                .min(usable);
        if free == 0 {
            return Err(fail(
                String::new(),
                format!(
                    "failed to allocate a serviceIP: range is full ({})",
                    self.cidr()
                ),
            ));
        }
        // Random probe, then a scan from there, so a nearly full range still finishes.
        let start = rng.random_range(1..=usable);
        for offset in 0..usable {
            let candidate = self.network + 1 + (start - 1 + offset) % usable;
            if self.ips.insert(candidate) {
                return Ok(Ipv4Addr::from(candidate));
            }
        }
        Err(fail(
            String::new(),
            "failed to allocate a serviceIP: range is full".into(),
        ))
    }

    /// Gives an IP back.
    pub fn release_ip(&mut self, ip: Ipv4Addr) {
        self.ips.remove(&u32::from(ip));
    }

    /// Takes `requested`, or a random free node port; `index` names the port in errors.
    pub fn allocate_port(
        &mut self,
        index: usize,
        requested: Option<i64>,
        rng: &mut impl Rng,
    ) -> Result<u16, AllocError> {
        let field = format!("spec.ports[{index}].nodePort");
        if let Some(n) = requested {
            let fail = |detail: String| AllocError {
                field: field.clone(),
                value: json!(n),
                detail,
            };
            let port = u16::try_from(n)
                .ok()
                .filter(|p| NODE_PORT_RANGE.contains(p));
            let Some(port) = port else {
                return Err(fail(format!(
                    "provided port is not in the valid range. The range of valid ports is {}-{}",
                    NODE_PORT_RANGE.start(),
                    NODE_PORT_RANGE.end()
                )));
            };
            if !self.ports.insert(port) {
                return Err(fail("provided port is already allocated".into()));
            }
            return Ok(port);
        }
        let span = u32::from(*NODE_PORT_RANGE.end() - *NODE_PORT_RANGE.start()) + 1;
        let start = rng.random_range(0..span);
        for offset in 0..span {
            let candidate = *NODE_PORT_RANGE.start()
                + u16::try_from((start + offset) % span).expect("invariant: below the span");
            if self.ports.insert(candidate) {
                return Ok(candidate);
            }
        }
        Err(AllocError {
            field,
            value: json!(0),
            detail: "failed to allocate a nodePort: range is full".into(),
        })
    }

    /// Gives a node port back.
    pub fn release_port(&mut self, port: u16) {
        self.ports.remove(&port);
    }

    /// Fills in a new Service's `clusterIP`/`clusterIPs` and node ports, validating requested
    /// ones. Nothing is written to `svc` unless every allocation succeeds.
    pub fn assign(&mut self, svc: &mut Value, rng: &mut impl Rng) -> Result<(), Vec<AllocError>> {
        self.assign_with(svc, None, rng)
    }

    /// The same for an update of `old` to `svc`, with `self` holding what every OTHER Service
    /// uses: the IP and node ports `old` already had stay its own, new ones are allocated (a
    /// Service turning NodePort or LoadBalancer gets a node port for each port, one coming back
    /// from ExternalName a ClusterIP) and requested new ones validated with the real 422s.
    /// Ports it no longer carries are free once the update is stored.
    pub fn assign_update(
        &mut self,
        old: &Value,
        svc: &mut Value,
        rng: &mut impl Rng,
    ) -> Result<(), Vec<AllocError>> {
        self.assign_with(svc, Some(old), rng)
    }

    fn assign_with(
        &mut self,
        svc: &mut Value,
        old: Option<&Value>,
        rng: &mut impl Rng,
    ) -> Result<(), Vec<AllocError>> {
        let old_ip = old
            .and_then(|o| o["spec"]["clusterIP"].as_str())
            .and_then(|s| s.parse::<Ipv4Addr>().ok());
        let old_ports: BTreeSet<i64> = old
            .and_then(|o| o["spec"]["ports"].as_array())
            .into_iter()
            .flatten()
            .filter_map(|p| p["nodePort"].as_i64())
            .collect();
        let spec = &svc["spec"];
        let kind = spec["type"].as_str().unwrap_or("ClusterIP").to_owned();
        if kind == "ExternalName" {
            return Ok(());
        }
        let mut errors = Vec::new();
        let requested_ip = spec["clusterIP"].as_str().unwrap_or_default().to_owned();
        let ip = match requested_ip.as_str() {
            "None" => None,
            "" => match self.allocate_ip(None, rng) {
                Ok(ip) => Some(ip),
                Err(e) => {
                    errors.push(e);
                    None
                }
            },
            text => match text.parse::<Ipv4Addr>() {
                Ok(kept) if Some(kept) == old_ip => {
                    self.ips.insert(u32::from(kept));
                    Some(kept)
                }
                Ok(requested) => match self.allocate_ip(Some(requested), rng) {
                    Ok(ip) => Some(ip),
                    Err(e) => {
                        errors.push(e);
                        None
                    }
                },
                Err(_) => {
                    errors.push(AllocError {
                        field: "spec.clusterIPs[0]".into(),
                        value: json!(text),
                        detail: "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"
                            .into(),
                    });
                    None
                }
            },
        };
        let mut ports = Vec::new();
        if matches!(kind.as_str(), "NodePort" | "LoadBalancer") {
            for (i, p) in spec["ports"].as_array().into_iter().flatten().enumerate() {
                let requested = p["nodePort"].as_i64().filter(|n| *n != 0);
                let kept = requested
                    .filter(|n| old_ports.contains(n))
                    .and_then(|n| u16::try_from(n).ok());
                if let Some(port) = kept
                    && self.ports.insert(port)
                {
                    ports.push(port);
                    continue;
                }
                match self.allocate_port(i, requested, rng) {
                    Ok(port) => ports.push(port),
                    Err(e) => errors.push(e),
                }
            }
        } else if let Some((i, p)) = spec["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
            .find(|(_, p)| p["nodePort"].as_i64().is_some_and(|n| n != 0))
        {
            errors.push(AllocError {
                field: format!("spec.ports[{i}].nodePort"),
                value: p["nodePort"].clone(),
                detail: "may not be used when `type` is 'ClusterIP'".into(),
            });
        }
        if !errors.is_empty() {
            if let Some(ip) = ip {
                self.release_ip(ip);
            }
            for port in ports {
                self.release_port(port);
            }
            return Err(errors);
        }
        let spec = &mut svc["spec"];
        if let Some(ip) = ip {
            spec["clusterIP"] = json!(ip.to_string());
            spec["clusterIPs"] = json!([ip.to_string()]);
        } else {
            spec["clusterIPs"] = json!(["None"]);
        }
        if let Some(list) = spec["ports"].as_array_mut() {
            for (p, port) in list.iter_mut().zip(ports) {
                p["nodePort"] = json!(port);
            }
        }
        Ok(())
    }
}

/// On update, a Service leaving NodePort/LoadBalancer drops the node ports it carried over
/// unchanged from the old object, and one turning ExternalName its carried-over ClusterIP (the
/// real server's `dropTypeDependentFields`), so they are released; values the client set anew
/// are kept and then validated.
pub fn drop_type_dependent_fields(old: &Value, new: &mut Value) {
    let external = |v: &Value| v["spec"]["type"].as_str() == Some("ExternalName");
    if external(new) && !external(old) {
        for key in ["clusterIP", "clusterIPs"] {
            if new["spec"][key] == old["spec"][key]
                && let Some(spec) = new["spec"].as_object_mut()
            {
                spec.remove(key);
            }
        }
    }
    let uses_node_ports = |v: &Value| {
        matches!(
            v["spec"]["type"].as_str(),
            Some("NodePort" | "LoadBalancer")
        )
    };
    if !uses_node_ports(old) || uses_node_ports(new) {
        return;
    }
    let old_ports = old["spec"]["ports"].as_array().cloned().unwrap_or_default();
    if let Some(ports) = new["spec"]["ports"].as_array_mut() {
        for (i, p) in ports.iter_mut().enumerate() {
            let carried = old_ports
                .get(i)
                .is_some_and(|o| o["nodePort"] == p["nodePort"]);
            if carried && let Some(map) = p.as_object_mut() {
                map.remove("nodePort");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    fn rng() -> StdRng {
        StdRng::seed_from_u64(7)
    }

    #[test]
    fn requested_ips_and_ports_are_validated_with_the_real_messages() {
        let mut a = ServiceAllocator::default();
        let mut r = rng();
        let cases: Vec<(Value, Vec<String>)> = vec![
            (json!({"spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80}]}}), vec![]),
            (
                json!({"spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80}]}}),
                vec!["spec.clusterIP: Invalid value: \"10.96.0.10\": provided IP is already allocated".into()],
            ),
            (
                json!({"spec": {"clusterIP": "192.168.0.1", "ports": [{"port": 80}]}}),
                vec!["spec.clusterIP: Invalid value: \"192.168.0.1\": provided IP is not in the valid range. The range of valid IPs is 10.96.0.0/12".into()],
            ),
            (
                json!({"spec": {"clusterIP": "nope", "ports": [{"port": 80}]}}),
                vec!["spec.clusterIPs[0]: Invalid value: \"nope\": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)".into()],
            ),
            (json!({"spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": 30000}]}}), vec![]),
            (
                json!({"spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": 30000}]}}),
                vec!["spec.ports[0].nodePort: Invalid value: 30000: provided port is already allocated".into()],
            ),
            (
                json!({"spec": {"type": "LoadBalancer", "ports": [{"port": 80}, {"port": 81, "nodePort": 80}]}}),
                vec!["spec.ports[1].nodePort: Invalid value: 80: provided port is not in the valid range. The range of valid ports is 30000-32767".into()],
            ),
            (
                json!({"spec": {"ports": [{"port": 80, "nodePort": 30001}]}}),
                vec!["spec.ports[0].nodePort: Invalid value: 30001: may not be used when `type` is 'ClusterIP'".into()],
            ),
        ];
        for (mut svc, want) in cases {
            let got: Vec<String> = match a.assign(&mut svc, &mut r) {
                Ok(()) => Vec::new(),
                Err(errors) => errors.iter().map(ToString::to_string).collect(),
            };
            assert_eq!(got, want, "{svc}");
        }
    }

    #[test]
    fn leaving_node_port_drops_carried_over_ports() {
        let old = json!({"spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": 30080}]}});
        let mut new =
            json!({"spec": {"type": "ClusterIP", "ports": [{"port": 80, "nodePort": 30080}]}});
        drop_type_dependent_fields(&old, &mut new);
        assert!(new["spec"]["ports"][0].get("nodePort").is_none());
        let mut still =
            json!({"spec": {"type": "LoadBalancer", "ports": [{"port": 80, "nodePort": 30080}]}});
        drop_type_dependent_fields(&old, &mut still);
        assert_eq!(still["spec"]["ports"][0]["nodePort"], 30080);
    }

    #[test]
    fn an_update_keeps_its_own_allocations_and_validates_new_ones() {
        let mut r = rng();
        let others = [
            json!({"spec": {"clusterIP": "10.96.0.5", "type": "NodePort",
            "ports": [{"port": 80, "nodePort": 30005}]}}),
        ];
        let old = json!({"spec": {"clusterIP": "10.96.0.9", "type": "NodePort",
            "ports": [{"port": 80, "nodePort": 30009}]}});
        let update = |new: Value| {
            let mut a = ServiceAllocator::from_services(DEFAULT_SERVICE_CIDR, &others);
            let mut new = new;
            a.assign_update(&old, &mut new, &mut rng())
                .map(|()| new)
                .map_err(|errors| errors.iter().map(ToString::to_string).collect::<Vec<_>>())
        };
        // Its own IP and node port stay; a second port gets a fresh node port.
        let kept = update(
            json!({"spec": {"clusterIP": "10.96.0.9", "type": "NodePort",
            "ports": [{"port": 80, "nodePort": 30009}, {"port": 81}]}}),
        )
        .expect("kept");
        assert_eq!(kept["spec"]["ports"][0]["nodePort"], 30009);
        let fresh = kept["spec"]["ports"][1]["nodePort"]
            .as_u64()
            .expect("allocated");
        assert!(NODE_PORT_RANGE.contains(&u16::try_from(fresh).expect("u16")));
        assert_ne!(fresh, 30005);
        // A node port another Service holds, or one out of range, is refused.
        assert_eq!(
            update(
                json!({"spec": {"clusterIP": "10.96.0.9", "type": "NodePort",
                "ports": [{"port": 80, "nodePort": 30005}]}})
            ),
            Err(vec![
                "spec.ports[0].nodePort: Invalid value: 30005: provided port is already allocated"
                    .to_owned()
            ])
        );
        assert_eq!(
            update(json!({"spec": {"clusterIP": "10.96.0.9", "type": "LoadBalancer",
                "ports": [{"port": 80, "nodePort": 29999}]}})),
            Err(vec!["spec.ports[0].nodePort: Invalid value: 29999: provided port is not in the valid range. The range of valid ports is 30000-32767".to_owned()])
        );
        // Coming back from ExternalName allocates a ClusterIP.
        let external = json!({"spec": {"type": "ExternalName", "externalName": "example.com"}});
        let mut a = ServiceAllocator::from_services(DEFAULT_SERVICE_CIDR, &others);
        let mut back = json!({"spec": {"type": "ClusterIP", "ports": [{"port": 80}]}});
        a.assign_update(&external, &mut back, &mut r)
            .expect("ClusterIP again");
        assert!(
            a.in_range(
                back["spec"]["clusterIP"]
                    .as_str()
                    .expect("ip")
                    .parse()
                    .expect("v4")
            )
        );
    }

    #[test]
    fn turning_external_name_drops_the_carried_over_cluster_ip() {
        let old = json!({"spec": {"type": "ClusterIP", "clusterIP": "10.96.0.7",
            "clusterIPs": ["10.96.0.7"], "ports": [{"port": 80}]}});
        let mut new = json!({"spec": {"type": "ExternalName", "externalName": "example.com",
            "clusterIP": "10.96.0.7", "clusterIPs": ["10.96.0.7"], "ports": [{"port": 80}]}});
        drop_type_dependent_fields(&old, &mut new);
        assert!(new["spec"].get("clusterIP").is_none() && new["spec"].get("clusterIPs").is_none());
        let mut stays = json!({"spec": {"type": "ClusterIP", "clusterIP": "10.96.0.7"}});
        drop_type_dependent_fields(&old, &mut stays);
        assert_eq!(stays["spec"]["clusterIP"], "10.96.0.7");
    }

    #[test]
    fn headless_and_external_name_services_get_no_ip() {
        let mut a = ServiceAllocator::default();
        let mut svc = json!({"spec": {"clusterIP": "None"}});
        a.assign(&mut svc, &mut rng()).expect("headless");
        assert_eq!(svc["spec"]["clusterIP"], "None");
        assert_eq!(svc["spec"]["clusterIPs"], json!(["None"]));
        let mut svc = json!({"spec": {"type": "ExternalName", "externalName": "example.com"}});
        a.assign(&mut svc, &mut rng()).expect("external");
        assert!(svc["spec"].get("clusterIP").is_none());
    }

    #[test]
    fn a_failed_assign_leaves_nothing_taken() {
        let mut a = ServiceAllocator::default();
        let mut svc = json!({"spec": {"type": "NodePort", "ports": [
            {"port": 80, "nodePort": 31000}, {"port": 81, "nodePort": 5}]}});
        assert!(a.assign(&mut svc, &mut rng()).is_err());
        assert!(svc["spec"].get("clusterIP").is_none());
        let mut again =
            json!({"spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": 31000}]}});
        a.assign(&mut again, &mut rng())
            .expect("31000 was given back");
    }

    #[test]
    fn state_is_rebuilt_from_stored_services() {
        let stored = [
            json!({"spec": {"clusterIP": "10.96.0.1"}}),
            json!({"spec": {"clusterIP": "10.96.3.4", "ports": [{"nodePort": 30080}]}}),
        ];
        let mut a = ServiceAllocator::from_services(DEFAULT_SERVICE_CIDR, &stored);
        let mut r = rng();
        assert!(
            a.allocate_ip(Some(Ipv4Addr::new(10, 96, 3, 4)), &mut r)
                .is_err()
        );
        assert!(a.allocate_port(0, Some(30080), &mut r).is_err());
        assert!(a.allocate_port(0, Some(30081), &mut r).is_ok());
    }

    #[test]
    fn a_small_range_fills_up_then_reuses_released_addresses() {
        let mut a = ServiceAllocator::new("10.0.0.0/29".parse().expect("cidr"));
        let mut r = rng();
        let got: BTreeSet<Ipv4Addr> = (0..6)
            .map(|_| a.allocate_ip(None, &mut r).expect("free"))
            .collect();
        assert_eq!(got.len(), 6);
        assert!(got.iter().all(|ip| a.in_range(*ip)));
        let full = a.allocate_ip(None, &mut r).expect_err("full");
        assert_eq!(
            full.detail,
            "failed to allocate a serviceIP: range is full (10.0.0.0/29)"
        );
        a.release_ip(Ipv4Addr::new(10, 0, 0, 3));
        assert_eq!(
            a.allocate_ip(None, &mut r).expect("reuse"),
            Ipv4Addr::new(10, 0, 0, 3)
        );
    }

    proptest! {
        #[test]
        fn never_hands_out_a_duplicate(seed in any::<u64>(), ops in proptest::collection::vec((any::<bool>(), 0usize..40), 1..200)) {
            let mut a = ServiceAllocator::new("10.1.0.0/26".parse().expect("cidr"));
            let mut r = StdRng::seed_from_u64(seed);
            let mut ips: Vec<Ipv4Addr> = Vec::new();
            let mut ports: Vec<u16> = Vec::new();
            for (take, pick) in ops {
                if take {
                    if let Ok(ip) = a.allocate_ip(None, &mut r) {
                        prop_assert!(!ips.contains(&ip));
                        prop_assert!(a.in_range(ip));
                        ips.push(ip);
                    }
                    let port = a.allocate_port(0, None, &mut r).expect("ports left");
                    prop_assert!(!ports.contains(&port));
                    prop_assert!(NODE_PORT_RANGE.contains(&port));
                    ports.push(port);
                } else {
                    if !ips.is_empty() {
                        let ip = ips.remove(pick % ips.len());
                        a.release_ip(ip);
                    }
                    if !ports.is_empty() {
                        let port = ports.remove(pick % ports.len());
                        a.release_port(port);
                    }
                }
            }
            prop_assert!(ips.len() <= 62);
        }
    }
}
