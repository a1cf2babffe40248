//! The addressing plan of a simulated cluster, as pure functions of its name, index and node
//! count: namespace and interface names, addresses, CIDRs. No IO here.
//!
//! Cluster index X (1..=[`MAX_INDEX`]) owns 198.18.X.0/24 on bridge `skbrX` in the shared
//! underlay namespace (the gateway, API server and DNS at 198.18.X.1, node I at
//! 198.18.X.(10+I)) and the LoadBalancer pool 198.19.X.0/24. Node I lives in namespace
//! `sk.<name>.nI` with pod CIDR 10.244.I.0/24 (the same in every cluster, on purpose).

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddrV4};

use ipnet::Ipv4Net;

use crate::Error;

/// The largest cluster index (198.18.X.0/24 and 198.19.X.0/24 per index).
pub const MAX_INDEX: u8 = 200;
/// The most nodes a cluster may have (node addresses are 198.18.X.11..).
pub const MAX_NODES: u8 = 100;
/// Longest cluster name: node names (`<name>-node-100`) and sandbox namespace names
/// (`sk.<name>.n100.<pod uid>`) must stay within the kernel's and Kubernetes' limits.
pub const MAX_NAME_LEN: usize = 40;
/// Every namespace name of the simulation starts with this.
pub const NETNS_PREFIX: &str = "sk.";
/// The API server's port for nodes and pods.
pub const API_PORT: u16 = 6443;
/// The cluster DNS Service's ClusterIP.
pub const DNS_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
/// The `kubernetes` Service's ClusterIP.
pub const API_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 1);
/// The cluster DNS domain.
pub const CLUSTER_DOMAIN: &str = "cluster.local";

/// Checks that `name` can name a cluster: a DNS label (lower-case letters, digits, `-`, starting
/// with a letter, not ending with `-`) of at most [`MAX_NAME_LEN`] characters. Dots are
/// excluded so that `sk.<name>.` prefixes never overlap between clusters.
pub fn validate_name(name: &str) -> Result<(), Error> {
    let problem = if name.len() > MAX_NAME_LEN {
        Some("is longer than 40 characters")
    } else {
        simkube::names::dns1035_label_problem(name)
    };
    match problem {
        Some(problem) => Err(Error::Invalid(format!(
            "cluster name {name:?} {problem} (a DNS label such as c1 or west-2)"
        ))),
        None => Ok(()),
    }
}

/// Checks that an underlay namespace name is usable (`ip netns` file name, no clash with the
/// clusters' own `sk.` namespaces).
pub fn validate_underlay(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with(NETNS_PREFIX)
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "underlay namespace name {name:?} must be 1-64 letters, digits, '-' or '_', and not \
             start with {NETNS_PREFIX:?}"
        )))
    }
}

/// Checks the node count.
pub fn validate_nodes(nodes: u8) -> Result<(), Error> {
    if (1..=MAX_NODES).contains(&nodes) {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "--nodes {nodes}: a cluster has 1 to {MAX_NODES} nodes"
        )))
    }
}

/// The lowest index in 1..=[`MAX_INDEX`] not in `used`.
pub fn free_index(used: &BTreeSet<u8>) -> Result<u8, Error> {
    (1..=MAX_INDEX)
        .find(|i| !used.contains(i))
        .ok_or(Error::NoIndex { max: MAX_INDEX })
}

/// The prefix of every namespace of cluster `name` (nodes and pod sandboxes).
pub fn cluster_netns_prefix(name: &str) -> String {
    format!("{NETNS_PREFIX}{name}.")
}

/// Names and addresses of one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Cluster name.
    pub name: String,
    /// Cluster index X.
    pub index: u8,
    /// Node count N.
    pub nodes: u8,
    /// The cluster's pod CIDR (nodes get consecutive /24s of it).
    pub pod_cidr: Ipv4Net,
}

/// One node of a [`Plan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePlan {
    /// 1-based node number.
    pub number: u8,
    /// Node object name, `<cluster>-node-<I>`.
    pub name: String,
    /// Network namespace `sk.<cluster>.n<I>`.
    pub netns: String,
    /// Prefix of its pod sandboxes' namespaces, `sk.<cluster>.n<I>.`.
    pub sandbox_prefix: String,
    /// Interface in the underlay (bridge port) whose peer is the node's `eth0`.
    pub underlay_veth: String,
    /// The node's address (InternalIP) on the cluster bridge.
    pub ip: Ipv4Addr,
    /// The node's pod CIDR.
    pub pod_cidr: Ipv4Net,
}

impl Plan {
    /// A plan for `name` at `index` with `nodes` nodes and the default pod CIDR.
    pub fn new(name: &str, index: u8, nodes: u8) -> Self {
        Self {
            name: name.to_owned(),
            index,
            nodes,
            pod_cidr: "10.244.0.0/16".parse().expect("invariant: a valid CIDR"),
        }
    }

    /// Checks that the pod CIDR can give every node a /24.
    pub fn validate(&self) -> Result<(), Error> {
        validate_name(&self.name)?;
        validate_nodes(self.nodes)?;
        if self.index == 0 || self.index > MAX_INDEX {
            return Err(Error::Invalid(format!(
                "cluster index {} outside 1..={MAX_INDEX}",
                self.index
            )));
        }
        let per_node = self
            .pod_cidr
            .subnets(24)
            .map(|s| s.count())
            .unwrap_or_default();
        if self.pod_cidr.prefix_len() > 23 || per_node <= usize::from(self.nodes) {
            return Err(Error::Invalid(format!(
                "--pod-cidr {}: too small to give {} nodes a /24 each (node I gets the I-th /24)",
                self.pod_cidr, self.nodes
            )));
        }
        Ok(())
    }

    /// The cluster bridge in the underlay.
    pub fn bridge(&self) -> String {
        format!("skbr{}", self.index)
    }

    /// The bridge network 198.18.X.0/24.
    pub fn bridge_net(&self) -> Ipv4Net {
        Ipv4Net::new(Ipv4Addr::new(198, 18, self.index, 0), 24).expect("invariant: /24 is valid")
    }

    /// The gateway, API server and DNS address 198.18.X.1.
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, self.index, 1)
    }

    /// Where nodes and pods reach the API server.
    pub fn api_addr(&self) -> SocketAddrV4 {
        SocketAddrV4::new(self.gateway(), API_PORT)
    }

    /// The LoadBalancer pool 198.19.X.0/24.
    pub fn lb_net(&self) -> Ipv4Net {
        Ipv4Net::new(Ipv4Addr::new(198, 19, self.index, 0), 24).expect("invariant: /24 is valid")
    }

    /// The addresses the load-balancer controller hands out (198.19.X.1 to .254).
    pub fn lb_pool(&self) -> Vec<Ipv4Addr> {
        (1..=254)
            .map(|i| Ipv4Addr::new(198, 19, self.index, i))
            .collect()
    }

    /// Names the serving certificate must carry.
    pub fn tls_hosts(&self) -> Vec<String> {
        let mut hosts = vec![
            "127.0.0.1".to_owned(),
            self.gateway().to_string(),
            API_SERVICE_IP.to_string(),
            "kubernetes".to_owned(),
            "kubernetes.default".to_owned(),
            "kubernetes.default.svc".to_owned(),
        ];
        hosts.push(format!("kubernetes.default.svc.{CLUSTER_DOMAIN}"));
        hosts
    }

    /// The nodes, first to last.
    pub fn node_plans(&self) -> Vec<NodePlan> {
        (1..=self.nodes).map(|i| self.node(i)).collect()
    }

    /// Node `number` (1-based).
    pub fn node(&self, number: u8) -> NodePlan {
        let netns = format!("{NETNS_PREFIX}{}.n{number}", self.name);
        let pod_cidr = self
            .pod_cidr
            .subnets(24)
            .ok()
            .and_then(|mut s| s.nth(usize::from(number)))
            .unwrap_or(self.pod_cidr);
        NodePlan {
            number,
            name: format!("{}-node-{number}", self.name),
            sandbox_prefix: format!("{netns}."),
            netns,
            underlay_veth: format!("sk{}v{number}", self.index),
            ip: Ipv4Addr::new(198, 18, self.index, 10 + number),
            pod_cidr,
        }
    }
}

/// The router namespace of a `--behind-nat` cluster, between its bridge and the underlay.
pub fn router_netns(name: &str) -> String {
    format!("{NETNS_PREFIX}{name}.rtr")
}

/// The router's veth in the underlay, `skr<X>` (its peer in the router is `uplink`).
pub fn router_veth(index: u8) -> String {
    format!("skr{index}")
}

/// The /31 joining a `--behind-nat` cluster's router to the underlay: 198.18.254.0/23 split
/// by index, (underlay side, router side).
pub fn router_transit(index: u8) -> (Ipv4Addr, Ipv4Addr) {
    let base = u32::from(Ipv4Addr::new(198, 18, 254, 0)) + 2 * u32::from(index);
    (Ipv4Addr::from(base), Ipv4Addr::from(base + 1))
}

/// The router's rules: what leaves through `uplink` is masqueraded to the router's address;
/// nothing arriving on `uplink` opens a connection (forwarded or to the router itself), while
/// replies to the cluster's own connections (TCP and UDP, by conntrack) come back.
pub fn router_rules() -> String {
    "table ip sk-router {}\n\
     delete table ip sk-router\n\
     table ip sk-router {\n\
     \tchain postrouting {\n\
     \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
     \t\toifname \"uplink\" masquerade\n\
     \t}\n\
     \tchain forward {\n\
     \t\ttype filter hook forward priority filter; policy accept;\n\
     \t\tiifname \"uplink\" ct state established,related accept\n\
     \t\tiifname \"uplink\" drop\n\
     \t}\n\
     \tchain input {\n\
     \t\ttype filter hook input priority filter; policy accept;\n\
     \t\tiifname \"uplink\" ct state established,related accept\n\
     \t\tiifname \"uplink\" drop\n\
     \t}\n\
     }\n"
    .to_owned()
}

/// The nftables table (family `ip`, in the underlay) that closes a `--private-api` cluster.
pub fn firewall_table(name: &str) -> String {
    format!("skfw-{name}")
}

/// The script that makes cluster `plan` private: nothing outside its bridge opens a TCP
/// connection to its API server address or through the bridge (to node addresses, NodePorts,
/// LoadBalancer IPs); UDP stays open, and replies to the cluster's own connections pass. One
/// transaction, replacing any earlier version of the table.
pub fn private_api_rules(plan: &Plan) -> String {
    let table = firewall_table(&plan.name);
    let bridge = plan.bridge();
    let gateway = plan.gateway();
    format!(
        "table ip {table} {{}}\n\
         delete table ip {table}\n\
         table ip {table} {{\n\
         \tchain input {{\n\
         \t\ttype filter hook input priority filter; policy accept;\n\
         \t\tiifname != \"{bridge}\" iifname != \"lo\" ip daddr {gateway} tcp dport {API_PORT} ct state new drop\n\
         \t}}\n\
         \tchain forward {{\n\
         \t\ttype filter hook forward priority filter; policy accept;\n\
         \t\tiifname != \"{bridge}\" oifname \"{bridge}\" meta l4proto tcp ct state new drop\n\
         \t}}\n\
         }}\n"
    )
}

#[cfg(test)]
mod tests {
    use expect_test::expect;
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn plan_of_a_two_node_cluster() {
        let plan = Plan::new("c1", 3, 2);
        plan.validate().expect("valid");
        let rendered: Vec<String> = plan
            .node_plans()
            .iter()
            .map(|n| {
                format!(
                    "{} {} {} {} {} {}",
                    n.name, n.netns, n.sandbox_prefix, n.underlay_veth, n.ip, n.pod_cidr
                )
            })
            .collect();
        expect![[r#"
            [
                "c1-node-1 sk.c1.n1 sk.c1.n1. sk3v1 198.18.3.11 10.244.1.0/24",
                "c1-node-2 sk.c1.n2 sk.c1.n2. sk3v2 198.18.3.12 10.244.2.0/24",
            ]
        "#]]
        .assert_debug_eq(&rendered);
        assert_eq!(plan.bridge(), "skbr3");
        assert_eq!(plan.api_addr().to_string(), "198.18.3.1:6443");
        assert_eq!(plan.lb_net().to_string(), "198.19.3.0/24");
        assert_eq!(plan.lb_pool().len(), 254);
        assert_eq!(cluster_netns_prefix("c1"), "sk.c1.");
    }

    #[test]
    fn names_are_checked() {
        let verdicts: Vec<String> = ["c1", "", "C1", "1c", "c-", "c.1", "c_1", &"a".repeat(41)]
            .iter()
            .map(|n| match validate_name(n) {
                Ok(()) => format!("{n}: ok"),
                Err(e) => e.to_string(),
            })
            .collect();
        expect![[r#"
            [
                "c1: ok",
                "cluster name \"\" is empty (a DNS label such as c1 or west-2)",
                "cluster name \"C1\" must start with a lower-case letter (a DNS label such as c1 or west-2)",
                "cluster name \"1c\" must start with a lower-case letter (a DNS label such as c1 or west-2)",
                "cluster name \"c-\" must not end with '-' (a DNS label such as c1 or west-2)",
                "cluster name \"c.1\" may only contain lower-case letters, digits and '-' (a DNS label such as c1 or west-2)",
                "cluster name \"c_1\" may only contain lower-case letters, digits and '-' (a DNS label such as c1 or west-2)",
                "cluster name \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\" is longer than 40 characters (a DNS label such as c1 or west-2)",
            ]
        "#]]
        .assert_debug_eq(&verdicts);
        assert!(validate_underlay("sk-underlay").is_ok());
        assert!(validate_underlay("sk.x").is_err());
        assert!(validate_underlay("a/b").is_err());
        assert!(validate_nodes(0).is_err());
        assert!(validate_nodes(MAX_NODES + 1).is_err());
    }

    #[test]
    fn a_small_pod_cidr_is_refused() {
        let mut plan = Plan::new("c1", 1, 4);
        plan.pod_cidr = "10.0.0.0/22".parse().expect("cidr");
        let error = plan.validate().expect_err("too small");
        assert!(
            error.to_string().contains("--pod-cidr 10.0.0.0/22"),
            "{error}"
        );
        plan.nodes = 3;
        plan.validate().expect("3 nodes fit: /24 number 1..=3 of 4");
    }

    #[test]
    fn index_allocation_takes_the_lowest_free() {
        assert_eq!(free_index(&BTreeSet::new()).expect("free"), 1);
        assert_eq!(free_index(&[1, 2, 4].into()).expect("free"), 3);
        let full: BTreeSet<u8> = (1..=MAX_INDEX).collect();
        assert!(matches!(free_index(&full), Err(Error::NoIndex { .. })));
    }

    proptest! {
        #[test]
        fn nodes_never_share_names_or_addresses(index in 1..=MAX_INDEX, nodes in 1..=MAX_NODES) {
            let plan = Plan::new("c", index, nodes);
            prop_assert!(plan.validate().is_ok());
            let nodes = plan.node_plans();
            let ips: BTreeSet<_> = nodes.iter().map(|n| n.ip).collect();
            let cidrs: BTreeSet<_> = nodes.iter().map(|n| n.pod_cidr).collect();
            let veths: BTreeSet<_> = nodes.iter().map(|n| n.underlay_veth.clone()).collect();
            prop_assert_eq!(ips.len(), nodes.len());
            prop_assert_eq!(cidrs.len(), nodes.len());
            prop_assert_eq!(veths.len(), nodes.len());
            for node in &nodes {
                prop_assert!(plan.bridge_net().contains(&node.ip));
                prop_assert_ne!(node.ip, plan.gateway());
                prop_assert!(node.underlay_veth.len() <= 15);
                prop_assert!(plan.pod_cidr.contains(&node.pod_cidr));
                prop_assert!(node.netns.starts_with(&cluster_netns_prefix("c")));
            }
        }

        #[test]
        fn allocation_never_reuses(used in proptest::collection::btree_set(1..=MAX_INDEX, 0..50)) {
            let index = free_index(&used).expect("room left");
            prop_assert!(!used.contains(&index));
            prop_assert!((1..index).all(|i| used.contains(&i)));
        }
    }

    #[test]
    fn private_api_rules_close_tcp_from_outside_the_bridge() {
        let plan = Plan::new("east", 3, 2);
        expect_test::expect![[r#"
            table ip skfw-east {}
            delete table ip skfw-east
            table ip skfw-east {
            	chain input {
            		type filter hook input priority filter; policy accept;
            		iifname != "skbr3" iifname != "lo" ip daddr 198.18.3.1 tcp dport 6443 ct state new drop
            	}
            	chain forward {
            		type filter hook forward priority filter; policy accept;
            		iifname != "skbr3" oifname "skbr3" meta l4proto tcp ct state new drop
            	}
            }
        "#]]
        .assert_eq(&private_api_rules(&plan));
    }

    #[test]
    fn routers_get_their_own_transit_inside_the_reserved_block() {
        let block: Ipv4Net = "198.18.254.0/23".parse().expect("cidr");
        let mut seen = BTreeSet::new();
        for index in 1..=MAX_INDEX {
            let (outer, inner) = router_transit(index);
            assert!(block.contains(&outer) && block.contains(&inner), "{index}");
            assert!(seen.insert(outer) && seen.insert(inner), "{index} overlaps");
        }
        assert_eq!(
            router_transit(1),
            (
                "198.18.254.2".parse().expect("ip"),
                "198.18.254.3".parse().expect("ip")
            )
        );
        assert_eq!(router_netns("east"), "sk.east.rtr");
        assert_eq!(router_veth(7), "skr7");
    }
}
