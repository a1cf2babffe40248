//! Snapshot, property and `nft -c` tests of the proxy planner.

use std::net::Ipv4Addr;

use expect_test::{Expect, expect};
use proptest::prelude::*;
use proptest::strategy::ValueTree as _;

use super::*;
use crate::proxy::model::{Endpoint, SlicePort};

const NODE: &str = "n1";

fn input(services: Vec<ServiceInfo>, slices: Vec<SliceInfo>) -> ProxyInput {
    ProxyInput {
        table: "simkube-proxy".to_owned(),
        node_name: NODE.to_owned(),
        cluster_cidr: "10.244.0.0/16".parse().expect("cidr"),
        service_cidr: Some("10.96.0.0/12".parse().expect("cidr")),
        masquerade_mark: DEFAULT_MASQUERADE_MARK,
        egress_masquerade: true,
        uplink: Some("eth0".to_owned()),
        services,
        slices,
    }
}

fn ip(s: &str) -> Ipv4Addr {
    s.parse().expect("ip")
}

fn service(ns: &str, name: &str, cluster_ip: &str, ports: &[(&str, Protocol, u16)]) -> ServiceInfo {
    ServiceInfo {
        namespace: ns.to_owned(),
        name: name.to_owned(),
        cluster_ips: vec![ip(cluster_ip)],
        ports: ports
            .iter()
            .map(|(n, p, port)| ServicePort {
                name: (*n).to_owned(),
                protocol: *p,
                port: *port,
                node_port: None,
            })
            .collect(),
        external_ips: Vec::new(),
        load_balancer_ips: Vec::new(),
        external_local: false,
        internal_local: false,
        affinity_timeout: None,
        source_ranges: Vec::new(),
    }
}

fn ready(addr: &str, node: &str) -> Endpoint {
    Endpoint {
        ip: ip(addr),
        ready: true,
        serving: true,
        terminating: false,
        node_name: Some(node.to_owned()),
    }
}

fn slice(
    ns: &str,
    svc: &str,
    ports: &[(&str, Protocol, u16)],
    endpoints: Vec<Endpoint>,
) -> SliceInfo {
    SliceInfo {
        namespace: ns.to_owned(),
        service: svc.to_owned(),
        ports: ports
            .iter()
            .map(|(n, p, port)| SlicePort {
                name: (*n).to_owned(),
                protocol: *p,
                port: *port,
            })
            .collect(),
        endpoints,
    }
}

/// The body of the table without the fixed part (base chains, helpers), so each snapshot
/// shows what the case changes; the fixed part has its own snapshot.
fn varying(plan: &Plan) -> String {
    let mut out = String::new();
    let mut skip = false;
    for line in plan.script.lines() {
        let fixed = [
            "\tchain filter-",
            "\tchain nat-",
            "\tchain services ",
            "\tchain nodeport-endpoints-check ",
            "\tchain service-endpoints-check ",
            "\tchain reject-chain ",
            "\tchain cluster-ips-check ",
            "\tchain firewall-check ",
            "\tchain mark-for-masquerade ",
            "\tchain masquerading ",
        ];
        if fixed.iter().any(|f| line.starts_with(f)) {
            skip = true;
        }
        if !skip && !line.starts_with("table ") && !line.starts_with("delete ") && line != "}" {
            // Without the table's indentation: a snapshot whose every line starts with a tab
            // would lose it to expect-test's dedent.
            out.push_str(line.strip_prefix('\t').unwrap_or(line));
            out.push('\n');
        }
        if skip && line == "\t}" {
            skip = false;
        }
    }
    for warning in &plan.warnings {
        out.push_str("warning: ");
        out.push_str(warning);
        out.push('\n');
    }
    out
}

fn check(input: &ProxyInput, expected: Expect) {
    expected.assert_eq(&varying(&plan(input)));
}

fn cases() -> Vec<(&'static str, ProxyInput)> {
    vec![
        ("empty", input(Vec::new(), Vec::new())),
        ("cluster_ip", cluster_ip_case()),
        ("no_endpoints", no_endpoints_case()),
        ("node_port_and_lb_local", external_local_case()),
        ("terminating_fallback", terminating_case()),
        ("affinity_and_itp_local", affinity_case()),
        ("conflicts_and_sctp", conflicts_case()),
    ]
}

fn cluster_ip_case() -> ProxyInput {
    let tcp = Protocol::Tcp;
    let mut not_ready = ready("10.244.2.9", "n2");
    not_ready.ready = false;
    not_ready.serving = false;
    input(
        vec![
            service(
                "default",
                "web",
                "10.96.0.20",
                &[("http", tcp, 80), ("udp", Protocol::Udp, 53)],
            ),
            service("default", "kubernetes", "10.96.0.1", &[("https", tcp, 443)]),
        ],
        vec![
            // The named targetPort "web" resolved to 8080 by the slice's writer.
            slice(
                "default",
                "web",
                &[("http", tcp, 8080), ("udp", Protocol::Udp, 5353)],
                vec![ready("10.244.1.5", NODE), not_ready],
            ),
            slice(
                "default",
                "web",
                &[("http", tcp, 8080)],
                vec![ready("10.244.2.7", "n2")],
            ),
            slice(
                "default",
                "kubernetes",
                &[("https", tcp, 6443)],
                vec![Endpoint {
                    node_name: None,
                    ..ready("198.18.1.1", "")
                }],
            ),
        ],
    )
}

fn no_endpoints_case() -> ProxyInput {
    let mut svc = service("shop", "cart", "10.96.3.3", &[("", Protocol::Tcp, 80)]);
    svc.ports[0].node_port = Some(30080);
    svc.load_balancer_ips = vec![ip("198.19.1.10")];
    svc.source_ranges = vec!["198.18.0.0/15".parse().expect("cidr")];
    let mut not_ready = ready("10.244.1.8", NODE);
    not_ready.ready = false;
    not_ready.serving = false;
    input(
        vec![svc],
        vec![slice(
            "shop",
            "cart",
            &[("", Protocol::Tcp, 8080)],
            vec![not_ready],
        )],
    )
}

fn external_local_case() -> ProxyInput {
    let mut svc = service("edge", "gw", "10.96.5.5", &[("wg", Protocol::Udp, 51820)]);
    svc.ports[0].node_port = Some(31820);
    svc.load_balancer_ips = vec![ip("198.19.1.20")];
    svc.external_ips = vec![ip("198.18.9.9")];
    svc.external_local = true;
    input(
        vec![svc],
        vec![slice(
            "edge",
            "gw",
            &[("wg", Protocol::Udp, 51820)],
            vec![ready("10.244.1.2", NODE), ready("10.244.2.2", "n2")],
        )],
    )
}

fn terminating_case() -> ProxyInput {
    let terminating = |addr: &str, serving: bool| Endpoint {
        ip: ip(addr),
        ready: false,
        serving,
        terminating: true,
        node_name: Some(NODE.to_owned()),
    };
    input(
        vec![service(
            "default",
            "old",
            "10.96.7.7",
            &[("", Protocol::Tcp, 80)],
        )],
        vec![slice(
            "default",
            "old",
            &[("", Protocol::Tcp, 80)],
            vec![
                terminating("10.244.1.3", true),
                terminating("10.244.1.4", false),
            ],
        )],
    )
}

fn affinity_case() -> ProxyInput {
    let mut sticky = service("default", "sticky", "10.96.8.8", &[("", Protocol::Tcp, 80)]);
    sticky.affinity_timeout = Some(600);
    let mut local = service(
        "default",
        "node-local",
        "10.96.9.9",
        &[("", Protocol::Tcp, 80)],
    );
    local.internal_local = true;
    input(
        vec![sticky, local],
        vec![
            slice(
                "default",
                "sticky",
                &[("", Protocol::Tcp, 8080)],
                vec![ready("10.244.1.2", NODE), ready("10.244.2.2", "n2")],
            ),
            slice(
                "default",
                "node-local",
                &[("", Protocol::Tcp, 8080)],
                vec![ready("10.244.2.3", "n2")],
            ),
        ],
    )
}

fn conflicts_case() -> ProxyInput {
    let mut a = service("a", "one", "10.96.1.1", &[("", Protocol::Tcp, 80)]);
    a.external_ips = vec![ip("198.18.7.7")];
    a.ports[0].node_port = Some(30001);
    let mut b = service(
        "b",
        "two",
        "10.96.1.2",
        &[("", Protocol::Tcp, 80), ("s", Protocol::Sctp, 9)],
    );
    b.external_ips = vec![ip("198.18.7.7")];
    b.ports[0].node_port = Some(30001);
    input(
        vec![b, a],
        vec![
            slice(
                "a",
                "one",
                &[("", Protocol::Tcp, 80)],
                vec![ready("10.244.1.2", NODE)],
            ),
            slice(
                "b",
                "two",
                &[("", Protocol::Tcp, 80)],
                vec![ready("10.244.1.3", NODE)],
            ),
        ],
    )
}

#[test]
fn fixed_part_of_the_table() {
    let plan = plan(&input(Vec::new(), Vec::new()));
    expect![[r#"
        table ip simkube-proxy {}
        delete table ip simkube-proxy
        table ip simkube-proxy {
        	comment "service proxy of node n1"
        	set cluster-ips {
        		type ipv4_addr
        	}
        	map service-ips {
        		type ipv4_addr . inet_proto . inet_service : verdict
        	}
        	map service-nodeports {
        		type inet_proto . inet_service : verdict
        	}
        	map no-endpoint-services {
        		type ipv4_addr . inet_proto . inet_service : verdict
        	}
        	map no-endpoint-nodeports {
        		type inet_proto . inet_service : verdict
        	}
        	map firewall-ips {
        		type ipv4_addr . inet_proto . inet_service : verdict
        	}
        	chain filter-prerouting {
        		type filter hook prerouting priority -110; policy accept;
        		ct state new jump firewall-check
        	}
        	chain filter-input {
        		type filter hook input priority -110; policy accept;
        		ct state new jump nodeport-endpoints-check
        		ct state new jump service-endpoints-check
        	}
        	chain filter-forward {
        		type filter hook forward priority -110; policy accept;
        		ct state new jump service-endpoints-check
        		ct state new jump cluster-ips-check
        	}
        	chain filter-output {
        		type filter hook output priority -110; policy accept;
        		ct state new jump service-endpoints-check
        		ct state new jump firewall-check
        	}
        	chain filter-output-post-dnat {
        		type filter hook output priority -90; policy accept;
        		ct state new jump cluster-ips-check
        	}
        	chain nat-prerouting {
        		type nat hook prerouting priority dstnat; policy accept;
        		jump services
        	}
        	chain nat-output {
        		type nat hook output priority -100; policy accept;
        		jump services
        	}
        	chain nat-postrouting {
        		type nat hook postrouting priority srcnat; policy accept;
        		jump masquerading
        		oifname "eth0" ip saddr 10.244.0.0/16 ip daddr != 10.244.0.0/16 masquerade
        	}
        	chain services {
        		ip daddr . meta l4proto . th dport vmap @service-ips
        		fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports
        	}
        	chain nodeport-endpoints-check {
        		fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @no-endpoint-nodeports
        	}
        	chain service-endpoints-check {
        		ip daddr . meta l4proto . th dport vmap @no-endpoint-services
        	}
        	chain firewall-check {
        		ip daddr . meta l4proto . th dport vmap @firewall-ips
        	}
        	chain cluster-ips-check {
        		ip daddr @cluster-ips goto reject-chain
        		ip daddr 10.96.0.0/12 drop
        	}
        	chain reject-chain {
        		meta l4proto tcp reject with tcp reset
        		reject
        	}
        	chain mark-for-masquerade {
        		meta mark set meta mark | 0x4000
        	}
        	chain masquerading {
        		meta mark & 0x4000 == 0 return
        		meta mark set meta mark ^ 0x4000
        		masquerade fully-random
        	}
        }
    "#]].assert_eq(&plan.script);
    assert_eq!(plan.service_ports, 0);
    assert_eq!(plan.endpoints, 0);
}

#[test]
fn cluster_ip_service_balances_over_ready_endpoints() {
    let case = cluster_ip_case();
    let p = plan(&case);
    assert_eq!((p.service_ports, p.endpoints), (3, 4));
    check(
        &case,
        expect![[r#"
            comment "service proxy of node n1"
            set cluster-ips {
            	type ipv4_addr
            	elements = { 10.96.0.1, 10.96.0.20 }
            }
            map service-ips {
            	type ipv4_addr . inet_proto . inet_service : verdict
            	elements = {
            		10.96.0.1 . tcp . 443 comment "default/kubernetes:https" : goto service-ZDDBX44F-default/kubernetes/tcp/https,
            		10.96.0.20 . tcp . 80 comment "default/web:http" : goto service-UARQTUAX-default/web/tcp/http,
            		10.96.0.20 . udp . 53 comment "default/web:udp" : goto service-LDEH6GMI-default/web/udp/udp
            	}
            }
            map service-nodeports {
            	type inet_proto . inet_service : verdict
            }
            map no-endpoint-services {
            	type ipv4_addr . inet_proto . inet_service : verdict
            }
            map no-endpoint-nodeports {
            	type inet_proto . inet_service : verdict
            }
            map firewall-ips {
            	type ipv4_addr . inet_proto . inet_service : verdict
            }
            chain cluster-LDEH6GMI-default/web/udp/udp {
            	goto endpoint-NJKJCXOP-default/web/udp/udp__10.244.1.5/5353
            }
            chain cluster-UARQTUAX-default/web/tcp/http {
            	numgen random mod 2 vmap { 0 : goto endpoint-YX4ZGP7G-default/web/tcp/http__10.244.1.5/8080, 1 : goto endpoint-5ML4MARR-default/web/tcp/http__10.244.2.7/8080 }
            }
            chain cluster-ZDDBX44F-default/kubernetes/tcp/https {
            	goto endpoint-IUCJYZRA-default/kubernetes/tcp/https__198.18.1.1/6443
            }
            chain endpoint-5ML4MARR-default/web/tcp/http__10.244.2.7/8080 {
            	ip saddr 10.244.2.7 jump mark-for-masquerade
            	meta l4proto tcp dnat to 10.244.2.7:8080
            }
            chain endpoint-IUCJYZRA-default/kubernetes/tcp/https__198.18.1.1/6443 {
            	ip saddr 198.18.1.1 jump mark-for-masquerade
            	meta l4proto tcp dnat to 198.18.1.1:6443
            }
            chain endpoint-NJKJCXOP-default/web/udp/udp__10.244.1.5/5353 {
            	ip saddr 10.244.1.5 jump mark-for-masquerade
            	meta l4proto udp dnat to 10.244.1.5:5353
            }
            chain endpoint-YX4ZGP7G-default/web/tcp/http__10.244.1.5/8080 {
            	ip saddr 10.244.1.5 jump mark-for-masquerade
            	meta l4proto tcp dnat to 10.244.1.5:8080
            }
            chain service-LDEH6GMI-default/web/udp/udp {
            	ip saddr != 10.244.0.0/16 jump mark-for-masquerade
            	goto cluster-LDEH6GMI-default/web/udp/udp
            }
            chain service-UARQTUAX-default/web/tcp/http {
            	ip saddr != 10.244.0.0/16 jump mark-for-masquerade
            	goto cluster-UARQTUAX-default/web/tcp/http
            }
            chain service-ZDDBX44F-default/kubernetes/tcp/https {
            	ip saddr != 10.244.0.0/16 jump mark-for-masquerade
            	goto cluster-ZDDBX44F-default/kubernetes/tcp/https
            }
        "#]],
    );
}

#[test]
fn service_without_ready_endpoints_is_refused() {
    check(
        &no_endpoints_case(),
        expect![[r#"
            comment "service proxy of node n1"
            set cluster-ips {
            	type ipv4_addr
            	elements = { 10.96.3.3 }
            }
            map service-ips {
            	type ipv4_addr . inet_proto . inet_service : verdict
            }
            map service-nodeports {
            	type inet_proto . inet_service : verdict
            }
            map no-endpoint-services {
            	type ipv4_addr . inet_proto . inet_service : verdict
            	elements = {
            		10.96.3.3 . tcp . 80 comment "shop/cart" : goto reject-chain,
            		198.19.1.10 . tcp . 80 comment "shop/cart" : goto reject-chain
            	}
            }
            map no-endpoint-nodeports {
            	type inet_proto . inet_service : verdict
            	elements = {
            		tcp . 30080 comment "shop/cart" : goto reject-chain
            	}
            }
            map firewall-ips {
            	type ipv4_addr . inet_proto . inet_service : verdict
            	elements = {
            		198.19.1.10 . tcp . 80 comment "shop/cart" : goto firewall-574JDAYF-shop/cart/tcp/
            	}
            }
            chain firewall-574JDAYF-shop/cart/tcp/ {
            	ip saddr != { 198.18.0.0/15 } drop
            }
        "#]],
    );
}

#[test]
fn external_traffic_policy_local_keeps_external_traffic_on_local_endpoints() {
    check(
        &external_local_case(),
        expect![[r#"
            comment "service proxy of node n1"
            set cluster-ips {
            	type ipv4_addr
            	elements = { 10.96.5.5 }
            }
            map service-ips {
            	type ipv4_addr . inet_proto . inet_service : verdict
            	elements = {
            		10.96.5.5 . udp . 51820 comment "edge/gw:wg" : goto service-CZ2JBLK4-edge/gw/udp/wg,
            		198.18.9.9 . udp . 51820 comment "edge/gw:wg" : goto external-CZ2JBLK4-edge/gw/udp/wg,
            		198.19.1.20 . udp . 51820 comment "edge/gw:wg" : goto external-CZ2JBLK4-edge/gw/udp/wg
            	}
            }
            map service-nodeports {
            	type inet_proto . inet_service : verdict
            	elements = {
            		udp . 31820 comment "edge/gw:wg" : goto external-CZ2JBLK4-edge/gw/udp/wg
            	}
            }
            map no-endpoint-services {
            	type ipv4_addr . inet_proto . inet_service : verdict
            }
            map no-endpoint-nodeports {
            	type inet_proto . inet_service : verdict
            }
            map firewall-ips {
            	type ipv4_addr . inet_proto . inet_service : verdict
            }
            chain cluster-CZ2JBLK4-edge/gw/udp/wg {
            	numgen random mod 2 vmap { 0 : goto endpoint-DDBWVPU7-edge/gw/udp/wg__10.244.1.2/51820, 1 : goto endpoint-SB3TSFOG-edge/gw/udp/wg__10.244.2.2/51820 }
            }
            chain endpoint-DDBWVPU7-edge/gw/udp/wg__10.244.1.2/51820 {
            	ip saddr 10.244.1.2 jump mark-for-masquerade
            	meta l4proto udp dnat to 10.244.1.2:51820
            }
            chain endpoint-SB3TSFOG-edge/gw/udp/wg__10.244.2.2/51820 {
            	ip saddr 10.244.2.2 jump mark-for-masquerade
            	meta l4proto udp dnat to 10.244.2.2:51820
            }
            chain external-CZ2JBLK4-edge/gw/udp/wg {
            	ip saddr 10.244.0.0/16 goto cluster-CZ2JBLK4-edge/gw/udp/wg
            	fib saddr type local jump mark-for-masquerade
            	fib saddr type local goto cluster-CZ2JBLK4-edge/gw/udp/wg
            	goto local-CZ2JBLK4-edge/gw/udp/wg
            }
            chain local-CZ2JBLK4-edge/gw/udp/wg {
            	goto endpoint-DDBWVPU7-edge/gw/udp/wg__10.244.1.2/51820
            }
            chain service-CZ2JBLK4-edge/gw/udp/wg {
            	ip saddr != 10.244.0.0/16 jump mark-for-masquerade
            	goto cluster-CZ2JBLK4-edge/gw/udp/wg
            }
        "#]],
    );
}

#[test]
fn terminating_but_serving_endpoints_are_used_when_none_is_ready() {
    check(
        &terminating_case(),
        expect![[r#"
            comment "service proxy of node n1"
            set cluster-ips {
            	type ipv4_addr
            	elements = { 10.96.7.7 }
            }
            map service-ips {
            	type ipv4_addr . inet_proto . inet_service : verdict
            	elements = {
            		10.96.7.7 . tcp . 80 comment "default/old" : goto service-J4BJXQXN-default/old/tcp/
            	}
            }
            map service-nodeports {
            	type inet_proto . inet_service : verdict
            }
            map no-endpoint-services {
            	type ipv4_addr . inet_proto . inet_service : verdict
            }
            map no-endpoint-nodeports {
            	type inet_proto . inet_service : verdict
            }
            map firewall-ips {
            	type ipv4_addr . inet_proto . inet_service : verdict
            }
            chain cluster-J4BJXQXN-default/old/tcp/ {
            	goto endpoint-ZAGE623T-default/old/tcp/__10.244.1.3/80
            }
            chain endpoint-ZAGE623T-default/old/tcp/__10.244.1.3/80 {
            	ip saddr 10.244.1.3 jump mark-for-masquerade
            	meta l4proto tcp dnat to 10.244.1.3:80
            }
            chain service-J4BJXQXN-default/old/tcp/ {
            	ip saddr != 10.244.0.0/16 jump mark-for-masquerade
            	goto cluster-J4BJXQXN-default/old/tcp/
            }
        "#]],
    );
}

#[test]
fn client_ip_affinity_and_internal_traffic_policy_local() {
    check(
        &affinity_case(),
        expect![[r#"
            comment "service proxy of node n1"
            set cluster-ips {
            	type ipv4_addr
            	elements = { 10.96.8.8, 10.96.9.9 }
            }
            set affinity-3LQHYTGG-default/sticky/tcp/__10.244.2.2/8080 {
            	type ipv4_addr
            	flags dynamic,timeout
            	timeout 600s
            }
            set affinity-YHJ2X64O-default/sticky/tcp/__10.244.1.2/8080 {
            	type ipv4_addr
            	flags dynamic,timeout
            	timeout 600s
            }
            map service-ips {
            	type ipv4_addr . inet_proto . inet_service : verdict
            	elements = {
            		10.96.8.8 . tcp . 80 comment "default/sticky" : goto service-B3YODSRX-default/sticky/tcp/,
            		10.96.9.9 . tcp . 80 comment "default/node-local" : goto service-KIQJKTN7-default/node-local/tcp/
            	}
            }
            map service-nodeports {
            	type inet_proto . inet_service : verdict
            }
            map no-endpoint-services {
            	type ipv4_addr . inet_proto . inet_service : verdict
            }
            map no-endpoint-nodeports {
            	type inet_proto . inet_service : verdict
            }
            map firewall-ips {
            	type ipv4_addr . inet_proto . inet_service : verdict
            }
            chain cluster-B3YODSRX-default/sticky/tcp/ {
            	ip saddr @affinity-YHJ2X64O-default/sticky/tcp/__10.244.1.2/8080 goto endpoint-YHJ2X64O-default/sticky/tcp/__10.244.1.2/8080
            	ip saddr @affinity-3LQHYTGG-default/sticky/tcp/__10.244.2.2/8080 goto endpoint-3LQHYTGG-default/sticky/tcp/__10.244.2.2/8080
            	numgen random mod 2 vmap { 0 : goto endpoint-YHJ2X64O-default/sticky/tcp/__10.244.1.2/8080, 1 : goto endpoint-3LQHYTGG-default/sticky/tcp/__10.244.2.2/8080 }
            }
            chain endpoint-3LQHYTGG-default/sticky/tcp/__10.244.2.2/8080 {
            	ip saddr 10.244.2.2 jump mark-for-masquerade
            	update @affinity-3LQHYTGG-default/sticky/tcp/__10.244.2.2/8080 { ip saddr }
            	meta l4proto tcp dnat to 10.244.2.2:8080
            }
            chain endpoint-YHJ2X64O-default/sticky/tcp/__10.244.1.2/8080 {
            	ip saddr 10.244.1.2 jump mark-for-masquerade
            	update @affinity-YHJ2X64O-default/sticky/tcp/__10.244.1.2/8080 { ip saddr }
            	meta l4proto tcp dnat to 10.244.1.2:8080
            }
            chain local-KIQJKTN7-default/node-local/tcp/ {
            	drop
            }
            chain service-B3YODSRX-default/sticky/tcp/ {
            	ip saddr != 10.244.0.0/16 jump mark-for-masquerade
            	goto cluster-B3YODSRX-default/sticky/tcp/
            }
            chain service-KIQJKTN7-default/node-local/tcp/ {
            	ip saddr != 10.244.0.0/16 jump mark-for-masquerade
            	goto local-KIQJKTN7-default/node-local/tcp/
            }
        "#]],
    );
}

#[test]
fn conflicting_addresses_and_sctp_are_reported() {
    check(
        &conflicts_case(),
        expect![[r#"
            comment "service proxy of node n1"
            set cluster-ips {
            	type ipv4_addr
            	elements = { 10.96.1.1, 10.96.1.2 }
            }
            map service-ips {
            	type ipv4_addr . inet_proto . inet_service : verdict
            	elements = {
            		10.96.1.1 . tcp . 80 comment "a/one" : goto service-MK3GGTGU-a/one/tcp/,
            		10.96.1.2 . tcp . 80 comment "b/two" : goto service-RFGCZIEI-b/two/tcp/,
            		198.18.7.7 . tcp . 80 comment "a/one" : goto external-MK3GGTGU-a/one/tcp/
            	}
            }
            map service-nodeports {
            	type inet_proto . inet_service : verdict
            	elements = {
            		tcp . 30001 comment "a/one" : goto external-MK3GGTGU-a/one/tcp/
            	}
            }
            map no-endpoint-services {
            	type ipv4_addr . inet_proto . inet_service : verdict
            }
            map no-endpoint-nodeports {
            	type inet_proto . inet_service : verdict
            }
            map firewall-ips {
            	type ipv4_addr . inet_proto . inet_service : verdict
            }
            chain cluster-MK3GGTGU-a/one/tcp/ {
            	goto endpoint-LGMVDOVN-a/one/tcp/__10.244.1.2/80
            }
            chain cluster-RFGCZIEI-b/two/tcp/ {
            	goto endpoint-B643VXFV-b/two/tcp/__10.244.1.3/80
            }
            chain endpoint-B643VXFV-b/two/tcp/__10.244.1.3/80 {
            	ip saddr 10.244.1.3 jump mark-for-masquerade
            	meta l4proto tcp dnat to 10.244.1.3:80
            }
            chain endpoint-LGMVDOVN-a/one/tcp/__10.244.1.2/80 {
            	ip saddr 10.244.1.2 jump mark-for-masquerade
            	meta l4proto tcp dnat to 10.244.1.2:80
            }
            chain external-MK3GGTGU-a/one/tcp/ {
            	jump mark-for-masquerade
            	goto cluster-MK3GGTGU-a/one/tcp/
            }
            chain external-RFGCZIEI-b/two/tcp/ {
            	jump mark-for-masquerade
            	goto cluster-RFGCZIEI-b/two/tcp/
            }
            chain service-MK3GGTGU-a/one/tcp/ {
            	ip saddr != 10.244.0.0/16 jump mark-for-masquerade
            	goto cluster-MK3GGTGU-a/one/tcp/
            }
            chain service-RFGCZIEI-b/two/tcp/ {
            	ip saddr != 10.244.0.0/16 jump mark-for-masquerade
            	goto cluster-RFGCZIEI-b/two/tcp/
            }
            warning: b/two: 198.18.7.7 . tcp . 80 is already served for a/one; ignored
            warning: b/two: tcp . 30001 is already served for a/one; ignored
            warning: b/two:s: SCTP port 9 is not proxied (only TCP and UDP are)
        "#]],
    );
}

#[test]
fn egress_masquerade_and_service_cidr_are_optional() {
    let mut case = input(Vec::new(), Vec::new());
    case.egress_masquerade = false;
    case.service_cidr = None;
    case.masquerade_mark = 0x10;
    let script = plan(&case).script;
    assert!(!script.contains(" masquerade\n"), "{script}");
    assert!(!script.contains("10.96.0.0/12"), "{script}");
    assert!(script.contains("meta mark & 0x10 == 0 return"), "{script}");
}

#[test]
fn egress_is_masqueraded_out_of_the_uplink_only() {
    let mut case = input(Vec::new(), Vec::new());
    let egress = |script: &str| {
        script
            .lines()
            .filter(|l| l.contains("ip daddr != 10.244.0.0/16 masquerade"))
            .map(str::trim)
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(
        egress(&plan(&case).script),
        "oifname \"eth0\" ip saddr 10.244.0.0/16 ip daddr != 10.244.0.0/16 masquerade"
    );
    case.uplink = None;
    assert_eq!(
        egress(&plan(&case).script),
        "ip saddr 10.244.0.0/16 ip daddr != 10.244.0.0/16 masquerade"
    );
}

#[test]
fn routes_go_to_other_nodes_only() {
    let node = |name: &str, cidr: Option<&str>, via: Option<&str>| NodeInfo {
        name: name.to_owned(),
        pod_cidr: cidr.map(|c| c.parse().expect("cidr")),
        internal_ip: via.map(ip),
    };
    let nodes = vec![
        node("n3", Some("10.244.3.0/24"), Some("198.18.1.13")),
        node("n1", Some("10.244.1.0/24"), Some("198.18.1.11")),
        node("n2", Some("10.244.2.0/24"), Some("198.18.1.12")),
        node("n4", Some("10.244.2.0/24"), Some("198.18.1.14")),
        node("n5", None, Some("198.18.1.15")),
        node("n6", Some("10.244.6.0/24"), None),
        node("n7", Some("10.244.0.0/16"), Some("198.18.1.17")),
    ];
    let (routes, warnings) =
        plan_routes("n1", Some("10.244.1.0/24".parse().expect("cidr")), &nodes);
    expect![[r#"
        (
            [
                PodRoute {
                    cidr: 10.244.2.0/24,
                    via: 198.18.1.12,
                },
                PodRoute {
                    cidr: 10.244.3.0/24,
                    via: 198.18.1.13,
                },
            ],
            [
                "node n4: pod CIDR 10.244.2.0/24 is already routed to node n2; ignored",
                "node n7: pod CIDR 10.244.0.0/16 overlaps this node's 10.244.1.0/24; not routed",
            ],
        )
    "#]]
    .assert_debug_eq(&(routes, warnings));
}

/// Every snapshot case is a script the kernel accepts (`nft -c`: checked, not applied), inside
/// a namespace of our own.
#[test]
fn every_case_passes_nft_check() {
    if !tether_testkit::require_root_or_skip() {
        return;
    }
    let ns = tether_testkit::Netns::new("skp-nftc").expect("namespace");
    let mut all: Vec<(String, ProxyInput)> = cases()
        .into_iter()
        .map(|(n, c)| (n.to_owned(), c))
        .collect();
    // Random clusters too (duplicate node ports, affinity, both policies, empty slices).
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    for i in 0..24 {
        let case = arb_case()
            .new_tree(&mut runner)
            .expect("generate a case")
            .current();
        all.push((format!("random #{i}"), case));
    }
    for (name, case) in all {
        let script = plan(&case).script;
        let mut command = ns.command("nft").expect("nft command");
        command.args(["-c", "-f", "-"]);
        let mut child = command
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run nft");
        {
            use std::io::Write as _;
            let mut stdin = child.stdin.take().expect("stdin");
            stdin.write_all(script.as_bytes()).expect("write script");
        }
        let output = child.wait_with_output().expect("nft exits");
        assert!(
            output.status.success(),
            "case {name}: nft -c rejected the script: {}\n{script}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

fn arb_case() -> impl Strategy<Value = ProxyInput> {
    let endpoint = (1u8..20, any::<bool>(), any::<bool>(), any::<bool>(), 0u8..3).prop_map(
        |(host, ready, serving, terminating, node)| Endpoint {
            ip: Ipv4Addr::new(10, 244, node, host),
            ready,
            serving,
            terminating,
            node_name: Some(format!("n{node}")),
        },
    );
    let service = (
        0u8..6,
        prop::collection::vec(
            (0u8..3, any::<bool>(), prop::option::of(30000u16..30010)),
            1..3,
        ),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        prop::option::of(0u8..4),
    )
        .prop_map(
            |(n, ports, ext_local, int_local, affinity, lb)| ServiceInfo {
                namespace: format!("ns{}", n % 2),
                name: format!("svc{n}"),
                cluster_ips: vec![Ipv4Addr::new(10, 96, 0, n + 1)],
                ports: ports
                    .into_iter()
                    .map(|(p, udp, node_port)| ServicePort {
                        name: format!("p{p}"),
                        protocol: if udp { Protocol::Udp } else { Protocol::Tcp },
                        port: 80 + u16::from(p),
                        node_port,
                    })
                    .collect(),
                external_ips: Vec::new(),
                load_balancer_ips: lb
                    .map(|l| Ipv4Addr::new(198, 19, 0, l))
                    .into_iter()
                    .collect(),
                external_local: ext_local,
                internal_local: int_local,
                affinity_timeout: affinity.then_some(60),
                source_ranges: if ext_local {
                    vec!["198.18.0.0/15".parse().expect("cidr")]
                } else {
                    Vec::new()
                },
            },
        );
    let slice = (0u8..6, prop::collection::vec(endpoint, 0..5), any::<bool>()).prop_map(
        |(n, endpoints, udp)| SliceInfo {
            namespace: format!("ns{}", n % 2),
            service: format!("svc{n}"),
            ports: (0u16..3)
                .map(|p| SlicePort {
                    name: format!("p{p}"),
                    protocol: if udp { Protocol::Udp } else { Protocol::Tcp },
                    port: 8000 + p,
                })
                .collect(),
            endpoints,
        },
    );
    (
        prop::collection::vec(service, 0..6),
        prop::collection::vec(slice, 0..8),
    )
        .prop_map(|(mut services, slices)| {
            // A store holds one object per name.
            services.sort_by(|a, b| a.name.cmp(&b.name));
            services.dedup_by(|a, b| a.name == b.name);
            input(services, slices)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn plan_is_independent_of_input_order(
        case in arb_case(),
        seed in any::<u64>(),
    ) {
        let mut shuffled = case.clone();
        let mut rng = seed;
        let mut next = move |n: usize| {
            rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            usize::try_from(rng >> 33).unwrap_or(0) % n.max(1)
        };
        shuffle(&mut shuffled.services, &mut next);
        shuffle(&mut shuffled.slices, &mut next);
        for slice in &mut shuffled.slices {
            shuffle(&mut slice.endpoints, &mut next);
            shuffle(&mut slice.ports, &mut next);
        }
        for service in &mut shuffled.services {
            shuffle(&mut service.ports, &mut next);
        }
        let a = plan(&case);
        let b = plan(&shuffled);
        prop_assert_eq!(&a, &b);
        // And deterministic: planning again gives the same bytes.
        prop_assert_eq!(&a, &plan(&case));
    }

    #[test]
    fn splitting_a_slice_does_not_change_the_plan(case in arb_case(), at in 0usize..5) {
        let mut split = case.clone();
        let mut extra = Vec::new();
        for slice in &mut split.slices {
            if slice.endpoints.len() > at {
                let rest = slice.endpoints.split_off(at);
                extra.push(SliceInfo { endpoints: rest, ..slice.clone() });
            }
        }
        split.slices.extend(extra);
        prop_assert_eq!(plan(&case), plan(&split));
    }
}

fn shuffle<T>(items: &mut [T], next: &mut impl FnMut(usize) -> usize) {
    for i in (1..items.len()).rev() {
        let j = next(i + 1);
        items.swap(i, j);
    }
}
