//! A pod's `/etc/resolv.conf` and `/etc/hosts` (pure), with the kubelet's rules: `dnsPolicy`
//! (`ClusterFirst`, `ClusterFirstWithHostNet`, `Default`, `None`), `dnsConfig` merged in,
//! host-network pods on the host's resolver, and a managed hosts file naming the pod.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;

/// At most this many nameservers count (glibc's limit; the kubelet trims too).
pub const MAX_NAMESERVERS: usize = 3;
/// At most this many search domains (the kubelet's limit).
pub const MAX_SEARCHES: usize = 32;

/// The parts of a resolv.conf.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResolvConf {
    /// `nameserver` lines.
    pub nameservers: Vec<String>,
    /// The `search` list.
    pub searches: Vec<String>,
    /// `options` (`ndots:5`, `edns0`, ...).
    pub options: Vec<String>,
}

impl ResolvConf {
    /// Parses a resolv.conf (comments and unknown lines ignored; the last `search` wins).
    pub fn parse(text: &str) -> Self {
        let mut conf = Self::default();
        for line in text.lines() {
            let line = line.split(['#', ';']).next().unwrap_or_default();
            let mut words = line.split_whitespace();
            match words.next() {
                Some("nameserver") => conf.nameservers.extend(words.next().map(str::to_owned)),
                Some("search" | "domain") => conf.searches = words.map(str::to_owned).collect(),
                Some("options") => conf.options.extend(words.map(str::to_owned)),
                _ => {}
            }
        }
        conf
    }

    /// The file's text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for ns in &self.nameservers {
            out.push_str(&format!("nameserver {ns}\n"));
        }
        if !self.searches.is_empty() {
            out.push_str(&format!("search {}\n", self.searches.join(" ")));
        }
        if !self.options.is_empty() {
            out.push_str(&format!("options {}\n", self.options.join(" ")));
        }
        out
    }
}

/// The node's DNS settings.
#[derive(Debug, Clone)]
pub struct ClusterDns<'a> {
    /// The cluster DNS servers (empty: pods use the host's resolver).
    pub servers: &'a [IpAddr],
    /// The cluster domain (`cluster.local`).
    pub domain: &'a str,
    /// The host's resolv.conf text.
    pub host_resolv: &'a str,
}

/// The pod's resolv.conf, or `None` when the pod keeps the host's file unchanged.
pub fn resolv_conf(pod: &Pod, dns: &ClusterDns<'_>) -> Option<String> {
    let spec = pod.spec.as_ref();
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    let policy = spec
        .and_then(|s| s.dns_policy.as_deref())
        .unwrap_or("ClusterFirst");
    let config = spec.and_then(|s| s.dns_config.as_ref());
    let cluster = match policy {
        "None" => None,
        "Default" => Some(false),
        "ClusterFirstWithHostNet" => Some(true),
        // ClusterFirst: host-network pods resolve like the host.
        _ => Some(!host_network),
    };
    // Without cluster DNS servers the kubelet falls back to the host's resolver.
    let cluster = cluster.map(|c| c && !dns.servers.is_empty());
    let mut conf = match cluster {
        None => ResolvConf::default(),
        Some(false) => {
            // Without a dnsConfig to merge, the host's file is used as it is.
            config?;
            ResolvConf::parse(dns.host_resolv)
        }
        Some(true) => {
            let host = ResolvConf::parse(dns.host_resolv);
            let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
            let mut searches = vec![
                format!("{namespace}.svc.{}", dns.domain),
                format!("svc.{}", dns.domain),
                dns.domain.to_owned(),
            ];
            // The kubelet keeps the host's search domains after the cluster's.
            searches.extend(host.searches);
            ResolvConf {
                nameservers: dns.servers.iter().map(ToString::to_string).collect(),
                searches,
                options: vec!["ndots:5".to_owned()],
            }
        }
    };
    if let Some(config) = config {
        conf.nameservers
            .extend(config.nameservers.iter().flatten().cloned());
        conf.searches
            .extend(config.searches.iter().flatten().cloned());
        for option in config.options.iter().flatten() {
            let name = option.name.clone().unwrap_or_default();
            conf.options
                .retain(|o| o.split(':').next() != Some(name.as_str()));
            conf.options.push(match &option.value {
                Some(v) => format!("{name}:{v}"),
                None => name,
            });
        }
    }
    dedup(&mut conf.nameservers);
    dedup(&mut conf.searches);
    conf.nameservers.truncate(MAX_NAMESERVERS);
    conf.searches.truncate(MAX_SEARCHES);
    Some(conf.render())
}

fn dedup(list: &mut Vec<String>) {
    let mut seen = std::collections::HashSet::new();
    list.retain(|item| seen.insert(item.clone()));
}

/// The pod's managed `/etc/hosts`, or `None` for host-network pods (they see the node's).
pub fn hosts_file(pod: &Pod, pod_ip: IpAddr, cluster_domain: &str) -> Option<String> {
    let spec = pod.spec.as_ref();
    if spec.and_then(|s| s.host_network).unwrap_or(false) {
        return None;
    }
    let mut out = String::from(
        "# Kubernetes-managed hosts file.\n\
         127.0.0.1\tlocalhost\n\
         ::1\tlocalhost ip6-localhost ip6-loopback\n\
         fe00::0\tip6-localnet\n\
         fe00::0\tip6-mcastprefix\n\
         fe00::1\tip6-allnodes\n\
         fe00::2\tip6-allrouters\n",
    );
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let hostname = spec
        .and_then(|s| s.hostname.as_deref())
        .filter(|h| !h.is_empty())
        .unwrap_or(name);
    // Hostnames are DNS labels: the kubelet cuts longer pod names at 63 characters.
    let hostname: String = hostname
        .chars()
        .take(63)
        .collect::<String>()
        .trim_end_matches(['-', '.'])
        .to_owned();
    match spec
        .and_then(|s| s.subdomain.as_deref())
        .filter(|s| !s.is_empty())
    {
        Some(subdomain) => {
            let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
            out.push_str(&format!(
                "{pod_ip}\t{hostname}.{subdomain}.{namespace}.svc.{cluster_domain}\t{hostname}\n"
            ));
        }
        None => out.push_str(&format!("{pod_ip}\t{hostname}\n")),
    }
    let aliases = spec.and_then(|s| s.host_aliases.as_ref());
    if let Some(aliases) = aliases.filter(|a| !a.is_empty()) {
        out.push_str("\n# Entries added by HostAliases.\n");
        for alias in aliases {
            let names = alias.hostnames.clone().unwrap_or_default().join("\t");
            out.push_str(&format!("{}\t{names}\n", alias.ip));
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        let mut spec = spec;
        spec["containers"] = serde_json::json!([{"name": "c"}]);
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-1", "namespace": "shop"}, "spec": spec
        }))
        .expect("pod")
    }

    #[test]
    fn resolv_conf_by_policy() {
        let servers: Vec<IpAddr> = vec!["10.96.0.10".parse().expect("ip")];
        let host = "# host\nnameserver 192.0.2.53\nsearch corp.example\noptions edns0\n";
        let dns = ClusterDns {
            servers: &servers,
            domain: "cluster.local",
            host_resolv: host,
        };
        let no_cluster = ClusterDns {
            servers: &[],
            ..dns.clone()
        };
        let cases = [
            ("default policy", pod(serde_json::json!({})), &dns),
            (
                "ClusterFirst without cluster DNS",
                pod(serde_json::json!({})),
                &no_cluster,
            ),
            (
                "hostNetwork ClusterFirst",
                pod(serde_json::json!({"hostNetwork": true})),
                &dns,
            ),
            (
                "hostNetwork ClusterFirstWithHostNet",
                pod(
                    serde_json::json!({"hostNetwork": true, "dnsPolicy": "ClusterFirstWithHostNet"}),
                ),
                &dns,
            ),
            (
                "Default",
                pod(serde_json::json!({"dnsPolicy": "Default"})),
                &dns,
            ),
            (
                "Default with dnsConfig",
                pod(
                    serde_json::json!({"dnsPolicy": "Default", "dnsConfig": {"options": [{"name": "edns0"}, {"name": "ndots", "value": "2"}]}}),
                ),
                &dns,
            ),
            (
                "None",
                pod(
                    serde_json::json!({"dnsPolicy": "None", "dnsConfig": {"nameservers": ["1.2.3.4", "1.2.3.4"], "searches": ["a.example"]}}),
                ),
                &dns,
            ),
            (
                "ClusterFirst with dnsConfig",
                pod(
                    serde_json::json!({"dnsConfig": {"nameservers": ["1.2.3.4"], "options": [{"name": "ndots", "value": "1"}]}}),
                ),
                &dns,
            ),
        ];
        let out: String = cases
            .into_iter()
            .map(|(name, pod, dns)| {
                format!(
                    "## {name}\n{}",
                    resolv_conf(&pod, dns).unwrap_or_else(|| "(host file)\n".into())
                )
            })
            .collect();
        expect_test::expect![[r#"
            ## default policy
            nameserver 10.96.0.10
            search shop.svc.cluster.local svc.cluster.local cluster.local corp.example
            options ndots:5
            ## ClusterFirst without cluster DNS
            (host file)
            ## hostNetwork ClusterFirst
            (host file)
            ## hostNetwork ClusterFirstWithHostNet
            nameserver 10.96.0.10
            search shop.svc.cluster.local svc.cluster.local cluster.local corp.example
            options ndots:5
            ## Default
            (host file)
            ## Default with dnsConfig
            nameserver 192.0.2.53
            search corp.example
            options edns0 ndots:2
            ## None
            nameserver 1.2.3.4
            search a.example
            ## ClusterFirst with dnsConfig
            nameserver 10.96.0.10
            nameserver 1.2.3.4
            search shop.svc.cluster.local svc.cluster.local cluster.local corp.example
            options ndots:1
        "#]]
        .assert_eq(&out);
    }

    #[test]
    fn hosts_file_names_the_pod() {
        let ip: IpAddr = "10.244.1.5".parse().expect("ip");
        let plain = hosts_file(&pod(serde_json::json!({})), ip, "cluster.local").expect("hosts");
        assert!(plain.ends_with("10.244.1.5\tweb-1\n"), "{plain}");
        assert!(plain.contains("127.0.0.1\tlocalhost\n"));
        let sub = hosts_file(
            &pod(serde_json::json!({"hostname": "db-0", "subdomain": "db",
                "hostAliases": [{"ip": "192.0.2.1", "hostnames": ["a", "b"]}]})),
            ip,
            "cluster.local",
        )
        .expect("hosts");
        expect_test::expect![[r#"
            # Kubernetes-managed hosts file.
            127.0.0.1	localhost
            ::1	localhost ip6-localhost ip6-loopback
            fe00::0	ip6-localnet
            fe00::0	ip6-mcastprefix
            fe00::1	ip6-allnodes
            fe00::2	ip6-allrouters
            10.244.1.5	db-0.db.shop.svc.cluster.local	db-0

            # Entries added by HostAliases.
            192.0.2.1	a	b
        "#]]
        .assert_eq(&sub);
        assert_eq!(
            hosts_file(&pod(serde_json::json!({"hostNetwork": true})), ip, "c"),
            None
        );
    }
}
