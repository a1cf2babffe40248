//! Data-driven snapshots of complete plans (sysctls, addresses, routes, rules and the rendered
//! nft script) and of the errors bad input produces. `UPDATE_EXPECT=1` rewrites them.

mod fixtures;

use expect_test::{Expect, expect};
use fixtures::{gateway, net, peer, scenarios};
use tether_netplan::{
    CidrMapping, GatewayInput, IpMapping, LocalNetworks, PeerInput, Route, RouteKind, plan,
};

fn addr(text: &str) -> std::net::Ipv4Addr {
    text.parse().expect("address literal")
}

fn check_scenario(name: &str, expect: Expect) {
    let (_, input) = scenarios()
        .into_iter()
        .find(|(n, _)| *n == name)
        .expect("scenario exists");
    let plan = plan(&input).expect("scenario is valid");
    expect.assert_eq(&plan.to_string());
}

#[test]
fn one_peer_without_remap_routes_real_cidr_and_needs_no_nat() {
    check_scenario(
        "one_peer_no_remap",
        expect![[r#"
            sysctl net.ipv4.conf.all.rp_filter=0
            sysctl net.ipv4.conf.eth0.rp_filter=2
            sysctl net.ipv4.conf.tether-b.accept_local=1
            sysctl net.ipv4.conf.tether-b.rp_filter=0
            sysctl net.ipv4.ip_forward=1
            addr 169.254.18.1/30 dev tether-b
            route unreachable default table 7700 metric 4294967295
            route 10.1.0.0/16 dev tether-b src 169.254.18.1 table 7700
            rule pref 7700 fwmark 0x7700/0xffff lookup 7700
            rule pref 7701 lookup 255
            table ip tether
            delete table ip tether
            table ip tether {
            	comment "tether:95686cfe4d29e25e"
            	chain zone {
            		type filter hook prerouting priority raw; policy accept;
            		iifname "tether-b" ct zone set 1 comment "peer cluster-b: own conntrack zone"
            		iifname "eth0" ip daddr 10.1.0.0/16 ct zone set 1 comment "peer cluster-b: own conntrack zone"
            	}
            	chain prerouting {
            		type filter hook prerouting priority mangle; policy accept;
            		iifname "tether-b" ip saddr != { 10.1.0.0/16, 169.254.18.0/30 } counter drop comment "peer cluster-b: source outside its CIDRs"
            		iifname "tether-b" ip daddr != { 10.0.0.0/16, 169.254.18.1/32 } counter drop comment "peer cluster-b: destination outside local CIDRs"
            		iifname "tether-b" ct mark set ct mark and 0xffff0000 or 0x7700 comment "peer cluster-b: remember the peer of this connection"
            		iifname "eth0" ct mark and 0xffff == 0x7700 meta mark set meta mark and 0xffff0000 or 0x7700 comment "peer cluster-b: replies follow their connection"
            		iifname "eth0" ip daddr 10.1.0.0/16 meta mark set meta mark and 0xffff0000 or 0x7700 ct mark set ct mark and 0xffff0000 or 0x7700 comment "peer cluster-b: to the peer"
            	}
            	chain forward {
            		type filter hook forward priority filter; policy accept;
            		iifname "tether-b" tcp flags & (syn | rst) == syn tcp option maxseg size > 1380 tcp option maxseg size set 1380 comment "clamp MSS to the tunnel MTU"
            		oifname "tether-b" tcp flags & (syn | rst) == syn tcp option maxseg size > 1380 tcp option maxseg size set 1380 comment "clamp MSS to the tunnel MTU"
            	}
            }
        "#]],
    );
}

#[test]
fn one_peer_with_remapped_pod_cidr_translates_both_directions() {
    check_scenario(
        "one_peer_remapped",
        expect![[r#"
            sysctl net.ipv4.conf.all.rp_filter=0
            sysctl net.ipv4.conf.eth0.rp_filter=2
            sysctl net.ipv4.conf.tether-b.accept_local=1
            sysctl net.ipv4.conf.tether-b.rp_filter=0
            sysctl net.ipv4.ip_forward=1
            route unreachable default table 7700 metric 4294967295
            route 10.0.0.0/16 dev tether-b table 7700
            rule pref 7700 fwmark 0x7700/0xffff lookup 7700
            rule pref 7701 lookup 255
            table ip tether
            delete table ip tether
            table ip tether {
            	comment "tether:c5310e39713d8011"
            	chain zone {
            		type filter hook prerouting priority raw; policy accept;
            		iifname "tether-b" ct zone set 1 comment "peer cluster-b: own conntrack zone"
            		iifname "eth0" ip daddr 10.71.0.0/16 ct zone set 1 comment "peer cluster-b: own conntrack zone"
            	}
            	chain prerouting {
            		type filter hook prerouting priority mangle; policy accept;
            		iifname "tether-b" ip saddr != 10.0.0.0/16 counter drop comment "peer cluster-b: source outside its CIDRs"
            		iifname "tether-b" ip daddr != 10.0.0.0/16 counter drop comment "peer cluster-b: destination outside local CIDRs"
            		iifname "tether-b" ct mark set ct mark and 0xffff0000 or 0x7700 comment "peer cluster-b: remember the peer of this connection"
            		iifname "eth0" ct mark and 0xffff == 0x7700 meta mark set meta mark and 0xffff0000 or 0x7700 comment "peer cluster-b: replies follow their connection"
            		iifname "eth0" ip daddr 10.71.0.0/16 meta mark set meta mark and 0xffff0000 or 0x7700 ct mark set ct mark and 0xffff0000 or 0x7700 comment "peer cluster-b: to the peer"
            	}
            	chain dstnat {
            		type nat hook prerouting priority dstnat; policy accept;
            		meta mark and 0xffff == 0x7700 ip daddr 10.71.0.0/16 dnat ip prefix to ip daddr map { 10.71.0.0/16 : 10.0.0.0/16 } comment "peer cluster-b: local view to real"
            	}
            	chain forward {
            		type filter hook forward priority filter; policy accept;
            		iifname "tether-b" tcp flags & (syn | rst) == syn tcp option maxseg size > 1380 tcp option maxseg size set 1380 comment "clamp MSS to the tunnel MTU"
            		oifname "tether-b" tcp flags & (syn | rst) == syn tcp option maxseg size > 1380 tcp option maxseg size set 1380 comment "clamp MSS to the tunnel MTU"
            	}
            	chain srcnat {
            		type nat hook postrouting priority srcnat; policy accept;
            		iifname "tether-b" ip saddr 10.0.0.0/16 snat ip prefix to ip saddr map { 10.0.0.0/16 : 10.71.0.0/16 } comment "peer cluster-b: real to local view"
            	}
            }
        "#]],
    );
}

#[test]
fn two_peers_with_the_same_real_cidr_get_separate_marks_and_tables() {
    check_scenario(
        "two_peers_same_real",
        expect![[r#"
            sysctl net.ipv4.conf.all.rp_filter=0
            sysctl net.ipv4.conf.tether-b.accept_local=1
            sysctl net.ipv4.conf.tether-b.rp_filter=0
            sysctl net.ipv4.conf.tether-c.accept_local=1
            sysctl net.ipv4.conf.tether-c.rp_filter=0
            sysctl net.ipv4.ip_forward=1
            addr 169.254.18.1/30 dev tether-b
            addr 169.254.18.5/30 dev tether-c
            route unreachable default table 7700 metric 4294967295
            route 10.0.0.0/16 dev tether-b src 169.254.18.1 table 7700
            route unreachable default table 7701 metric 4294967295
            route 10.0.0.0/16 dev tether-c src 169.254.18.5 table 7701
            rule pref 7700 fwmark 0x7700/0xffff lookup 7700
            rule pref 7700 fwmark 0x7701/0xffff lookup 7701
            rule pref 7701 lookup 255
            table ip tether
            delete table ip tether
            table ip tether {
            	comment "tether:a227382abfc6f370"
            	chain zone {
            		type filter hook prerouting priority raw; policy accept;
            		iifname "tether-b" ct zone set 1 comment "peer cluster-b: own conntrack zone"
            		iifname != { "tether-b", "tether-c" } ip daddr 10.71.0.0/16 ct zone set 1 comment "peer cluster-b: own conntrack zone"
            		iifname "tether-c" ct zone set 2 comment "peer cluster-c: own conntrack zone"
            		iifname != { "tether-b", "tether-c" } ip daddr 10.72.0.0/16 ct zone set 2 comment "peer cluster-c: own conntrack zone"
            	}
            	chain prerouting {
            		type filter hook prerouting priority mangle; policy accept;
            		iifname "tether-b" ip saddr != { 10.0.0.0/16, 169.254.18.0/30 } counter drop comment "peer cluster-b: source outside its CIDRs"
            		iifname "tether-b" ip daddr != { 10.0.0.0/16, 169.254.18.1/32 } counter drop comment "peer cluster-b: destination outside local CIDRs"
            		iifname "tether-b" ct mark set ct mark and 0xffff0000 or 0x7700 comment "peer cluster-b: remember the peer of this connection"
            		iifname "tether-c" ip saddr != { 10.0.0.0/16, 169.254.18.4/30 } counter drop comment "peer cluster-c: source outside its CIDRs"
            		iifname "tether-c" ip daddr != { 10.0.0.0/16, 169.254.18.5/32 } counter drop comment "peer cluster-c: destination outside local CIDRs"
            		iifname "tether-c" ct mark set ct mark and 0xffff0000 or 0x7701 comment "peer cluster-c: remember the peer of this connection"
            		iifname != { "tether-b", "tether-c" } ct mark and 0xffff == 0x7700 meta mark set meta mark and 0xffff0000 or 0x7700 comment "peer cluster-b: replies follow their connection"
            		iifname != { "tether-b", "tether-c" } ct mark and 0xffff == 0x7701 meta mark set meta mark and 0xffff0000 or 0x7701 comment "peer cluster-c: replies follow their connection"
            		iifname != { "tether-b", "tether-c" } ip daddr 10.71.0.0/16 meta mark set meta mark and 0xffff0000 or 0x7700 ct mark set ct mark and 0xffff0000 or 0x7700 comment "peer cluster-b: to the peer"
            		iifname != { "tether-b", "tether-c" } ip daddr 10.72.0.0/16 meta mark set meta mark and 0xffff0000 or 0x7701 ct mark set ct mark and 0xffff0000 or 0x7701 comment "peer cluster-c: to the peer"
            	}
            	chain dstnat {
            		type nat hook prerouting priority dstnat; policy accept;
            		meta mark and 0xffff == 0x7700 ip daddr 10.71.0.0/16 dnat ip prefix to ip daddr map { 10.71.0.0/16 : 10.0.0.0/16 } comment "peer cluster-b: local view to real"
            		meta mark and 0xffff == 0x7701 ip daddr 10.72.0.0/16 dnat ip prefix to ip daddr map { 10.72.0.0/16 : 10.0.0.0/16 } comment "peer cluster-c: local view to real"
            	}
            	chain forward {
            		type filter hook forward priority filter; policy accept;
            		iifname { "tether-b", "tether-c" } tcp flags & (syn | rst) == syn tcp option maxseg size > 1380 tcp option maxseg size set 1380 comment "clamp MSS to the tunnel MTU"
            		oifname { "tether-b", "tether-c" } tcp flags & (syn | rst) == syn tcp option maxseg size > 1380 tcp option maxseg size set 1380 comment "clamp MSS to the tunnel MTU"
            	}
            	chain srcnat {
            		type nat hook postrouting priority srcnat; policy accept;
            		iifname "tether-b" ip saddr 10.0.0.0/16 snat ip prefix to ip saddr map { 10.0.0.0/16 : 10.71.0.0/16 } comment "peer cluster-b: real to local view"
            		iifname "tether-c" ip saddr 10.0.0.0/16 snat ip prefix to ip saddr map { 10.0.0.0/16 : 10.72.0.0/16 } comment "peer cluster-c: real to local view"
            	}
            }
        "#]],
    );
}

#[test]
fn remapped_external_cidr_is_translated_like_the_pod_cidr() {
    check_scenario(
        "external_remap",
        expect![[r#"
            sysctl net.ipv4.conf.all.rp_filter=0
            sysctl net.ipv4.conf.eth0.rp_filter=2
            sysctl net.ipv4.conf.tether-b.accept_local=1
            sysctl net.ipv4.conf.tether-b.rp_filter=0
            sysctl net.ipv4.ip_forward=1
            route unreachable default table 7700 metric 4294967295
            route 10.0.0.0/16 dev tether-b table 7700
            route 10.70.0.0/16 dev tether-b table 7700
            rule pref 7700 fwmark 0x7700/0xffff lookup 7700
            rule pref 7701 lookup 255
            table ip tether
            delete table ip tether
            table ip tether {
            	comment "tether:1a187a542d9d48bd"
            	chain zone {
            		type filter hook prerouting priority raw; policy accept;
            		iifname "tether-b" ct zone set 1 comment "peer cluster-b: own conntrack zone"
            		iifname "eth0" ip daddr { 10.71.0.0/16, 10.81.0.0/16 } ct zone set 1 comment "peer cluster-b: own conntrack zone"
            	}
            	chain prerouting {
            		type filter hook prerouting priority mangle; policy accept;
            		iifname "tether-b" ip saddr != { 10.0.0.0/16, 10.70.0.0/16 } counter drop comment "peer cluster-b: source outside its CIDRs"
            		iifname "tether-b" ip daddr != { 10.0.0.0/16, 10.70.0.0/16 } counter drop comment "peer cluster-b: destination outside local CIDRs"
            		iifname "tether-b" ct mark set ct mark and 0xffff0000 or 0x7700 comment "peer cluster-b: remember the peer of this connection"
            		iifname "eth0" ct mark and 0xffff == 0x7700 meta mark set meta mark and 0xffff0000 or 0x7700 comment "peer cluster-b: replies follow their connection"
            		iifname "eth0" ip daddr { 10.71.0.0/16, 10.81.0.0/16 } meta mark set meta mark and 0xffff0000 or 0x7700 ct mark set ct mark and 0xffff0000 or 0x7700 comment "peer cluster-b: to the peer"
            	}
            	chain dstnat {
            		type nat hook prerouting priority dstnat; policy accept;
            		meta mark and 0xffff == 0x7700 ip daddr 10.71.0.0/16 dnat ip prefix to ip daddr map { 10.71.0.0/16 : 10.0.0.0/16 } comment "peer cluster-b: local view to real"
            		meta mark and 0xffff == 0x7700 ip daddr 10.81.0.0/16 dnat ip prefix to ip daddr map { 10.81.0.0/16 : 10.70.0.0/16 } comment "peer cluster-b: local view to real"
            	}
            	chain forward {
            		type filter hook forward priority filter; policy accept;
            		iifname "tether-b" tcp flags & (syn | rst) == syn tcp option maxseg size > 1380 tcp option maxseg size set 1380 comment "clamp MSS to the tunnel MTU"
            		oifname "tether-b" tcp flags & (syn | rst) == syn tcp option maxseg size > 1380 tcp option maxseg size set 1380 comment "clamp MSS to the tunnel MTU"
            	}
            	chain srcnat {
            		type nat hook postrouting priority srcnat; policy accept;
            		iifname "tether-b" ip saddr 10.0.0.0/16 snat ip prefix to ip saddr map { 10.0.0.0/16 : 10.71.0.0/16 } comment "peer cluster-b: real to local view"
            		iifname "tether-b" ip saddr 10.70.0.0/16 snat ip prefix to ip saddr map { 10.70.0.0/16 : 10.81.0.0/16 } comment "peer cluster-b: real to local view"
            		iifname "eth0" oifname "tether-b" ip saddr != { 10.0.0.0/16, 10.70.0.0/16 } snat ip to 10.70.0.0 comment "other local sources to the unknown-source address"
            	}
            }
        "#]],
    );
}

#[test]
fn ip_mappings_publish_local_addresses_under_the_external_cidr() {
    check_scenario(
        "ip_mappings",
        expect![[r#"
            sysctl net.ipv4.conf.all.rp_filter=0
            sysctl net.ipv4.conf.eth0.rp_filter=2
            sysctl net.ipv4.conf.tether-b.accept_local=1
            sysctl net.ipv4.conf.tether-b.rp_filter=0
            sysctl net.ipv4.ip_forward=1
            route unreachable default table 7700 metric 4294967295
            route 10.0.0.0/16 dev tether-b table 7700
            route 10.70.0.0/16 dev tether-b table 7700
            rule pref 7700 fwmark 0x7700/0xffff lookup 7700
            rule pref 7701 lookup 255
            table ip tether
            delete table ip tether
            table ip tether {
            	comment "tether:b4affdc6d1b22051"
            	chain zone {
            		type filter hook prerouting priority raw; policy accept;
            		iifname "eth0" ip saddr { 192.168.1.10, 10.96.0.1 } return comment "published address: its own connections in the default zone"
            		iifname "tether-b" ip daddr { 10.70.0.1, 10.70.0.5 } ct original zone set 1 return comment "peer cluster-b: to a published address, own zone one way"
            		iifname "tether-b" ct zone set 1 comment "peer cluster-b: own conntrack zone"
            		iifname "eth0" ip daddr { 10.71.0.0/16, 10.81.0.0/16 } ct zone set 1 comment "peer cluster-b: own conntrack zone"
            	}
            	chain prerouting {
            		type filter hook prerouting priority mangle; policy accept;
            		iifname "tether-b" ip saddr != { 10.0.0.0/16, 10.70.0.0/16 } counter drop comment "peer cluster-b: source outside its CIDRs"
            		iifname "tether-b" ip daddr != { 10.0.0.0/16, 10.70.0.0/16 } counter drop comment "peer cluster-b: destination outside local CIDRs"
            		iifname "tether-b" ct mark set ct mark and 0xffff0000 or 0x7700 comment "peer cluster-b: remember the peer of this connection"
            		iifname "eth0" ct mark and 0xffff == 0x7700 meta mark set meta mark and 0xffff0000 or 0x7700 comment "peer cluster-b: replies follow their connection"
            		iifname "eth0" ip daddr { 10.71.0.0/16, 10.81.0.0/16 } meta mark set meta mark and 0xffff0000 or 0x7700 ct mark set ct mark and 0xffff0000 or 0x7700 comment "peer cluster-b: to the peer"
            	}
            	chain dstnat {
            		type nat hook prerouting priority dstnat; policy accept;
            		meta mark and 0xffff == 0x7700 ip daddr 10.71.0.0/16 dnat ip prefix to ip daddr map { 10.71.0.0/16 : 10.0.0.0/16 } comment "peer cluster-b: local view to real"
            		meta mark and 0xffff == 0x7700 ip daddr 10.81.0.0/16 dnat ip prefix to ip daddr map { 10.81.0.0/16 : 10.70.0.0/16 } comment "peer cluster-b: local view to real"
            		iifname "tether-b" ip daddr { 10.70.0.1, 10.70.0.5 } dnat ip to ip daddr map { 10.70.0.1 : 192.168.1.10, 10.70.0.5 : 10.96.0.1 } comment "external IP to local address"
            	}
            	chain forward {
            		type filter hook forward priority filter; policy accept;
            		iifname "tether-b" tcp flags & (syn | rst) == syn tcp option maxseg size > 1380 tcp option maxseg size set 1380 comment "clamp MSS to the tunnel MTU"
            		oifname "tether-b" tcp flags & (syn | rst) == syn tcp option maxseg size > 1380 tcp option maxseg size set 1380 comment "clamp MSS to the tunnel MTU"
            	}
            	chain srcnat {
            		type nat hook postrouting priority srcnat; policy accept;
            		iifname "tether-b" ip daddr { 192.168.1.10, 10.96.0.1 } ct status dnat masquerade comment "published address: replies return through the gateway"
            		iifname "tether-b" ip saddr 10.0.0.0/16 snat ip prefix to ip saddr map { 10.0.0.0/16 : 10.71.0.0/16 } comment "peer cluster-b: real to local view"
            		iifname "tether-b" ip saddr 10.70.0.0/16 snat ip prefix to ip saddr map { 10.70.0.0/16 : 10.81.0.0/16 } comment "peer cluster-b: real to local view"
            		oifname "tether-b" ip saddr { 192.168.1.10, 10.96.0.1 } snat ip to ip saddr map { 192.168.1.10 : 10.70.0.1, 10.96.0.1 : 10.70.0.5 } comment "local address to external IP"
            		iifname "eth0" oifname "tether-b" ip saddr != { 10.0.0.0/16, 10.70.0.0/16 } snat ip to 10.70.0.0 comment "other local sources to the unknown-source address"
            	}
            }
        "#]],
    );
}

#[test]
fn mss_clamp_follows_the_mtu() {
    check_scenario(
        "jumbo_mtu",
        expect![[r#"
            sysctl net.ipv4.conf.all.rp_filter=0
            sysctl net.ipv4.conf.eth0.rp_filter=2
            sysctl net.ipv4.conf.tether-b.accept_local=1
            sysctl net.ipv4.conf.tether-b.rp_filter=0
            sysctl net.ipv4.ip_forward=1
            route unreachable default table 7700 metric 4294967295
            route 10.0.0.0/16 dev tether-b table 7700
            rule pref 7700 fwmark 0x7700/0xffff lookup 7700
            rule pref 7701 lookup 255
            table ip tether
            delete table ip tether
            table ip tether {
            	comment "tether:2b59b4a9dcc181f1"
            	chain zone {
            		type filter hook prerouting priority raw; policy accept;
            		iifname "tether-b" ct zone set 1 comment "peer cluster-b: own conntrack zone"
            		iifname "eth0" ip daddr 10.71.0.0/16 ct zone set 1 comment "peer cluster-b: own conntrack zone"
            	}
            	chain prerouting {
            		type filter hook prerouting priority mangle; policy accept;
            		iifname "tether-b" ip saddr != 10.0.0.0/16 counter drop comment "peer cluster-b: source outside its CIDRs"
            		iifname "tether-b" ip daddr != 10.0.0.0/16 counter drop comment "peer cluster-b: destination outside local CIDRs"
            		iifname "tether-b" ct mark set ct mark and 0xffff0000 or 0x7700 comment "peer cluster-b: remember the peer of this connection"
            		iifname "eth0" ct mark and 0xffff == 0x7700 meta mark set meta mark and 0xffff0000 or 0x7700 comment "peer cluster-b: replies follow their connection"
            		iifname "eth0" ip daddr 10.71.0.0/16 meta mark set meta mark and 0xffff0000 or 0x7700 ct mark set ct mark and 0xffff0000 or 0x7700 comment "peer cluster-b: to the peer"
            	}
            	chain dstnat {
            		type nat hook prerouting priority dstnat; policy accept;
            		meta mark and 0xffff == 0x7700 ip daddr 10.71.0.0/16 dnat ip prefix to ip daddr map { 10.71.0.0/16 : 10.0.0.0/16 } comment "peer cluster-b: local view to real"
            	}
            	chain forward {
            		type filter hook forward priority filter; policy accept;
            		iifname "tether-b" tcp flags & (syn | rst) == syn tcp option maxseg size > 8880 tcp option maxseg size set 8880 comment "clamp MSS to the tunnel MTU"
            		oifname "tether-b" tcp flags & (syn | rst) == syn tcp option maxseg size > 8880 tcp option maxseg size set 8880 comment "clamp MSS to the tunnel MTU"
            	}
            	chain srcnat {
            		type nat hook postrouting priority srcnat; policy accept;
            		iifname "tether-b" ip saddr 10.0.0.0/16 snat ip prefix to ip saddr map { 10.0.0.0/16 : 10.71.0.0/16 } comment "peer cluster-b: real to local view"
            	}
            }
        "#]],
    );
    check_scenario(
        "minimum_mtu",
        expect![[r#"
            sysctl net.ipv4.conf.all.rp_filter=0
            sysctl net.ipv4.conf.eth0.rp_filter=2
            sysctl net.ipv4.conf.tether-b.accept_local=1
            sysctl net.ipv4.conf.tether-b.rp_filter=0
            sysctl net.ipv4.ip_forward=1
            route unreachable default table 7700 metric 4294967295
            route 10.0.0.0/16 dev tether-b table 7700
            rule pref 7700 fwmark 0x7700/0xffff lookup 7700
            rule pref 7701 lookup 255
            table ip tether
            delete table ip tether
            table ip tether {
            	comment "tether:52aea4ea2190f4c5"
            	chain zone {
            		type filter hook prerouting priority raw; policy accept;
            		iifname "tether-b" ct zone set 1 comment "peer cluster-b: own conntrack zone"
            		iifname "eth0" ip daddr 10.71.0.0/16 ct zone set 1 comment "peer cluster-b: own conntrack zone"
            	}
            	chain prerouting {
            		type filter hook prerouting priority mangle; policy accept;
            		iifname "tether-b" ip saddr != 10.0.0.0/16 counter drop comment "peer cluster-b: source outside its CIDRs"
            		iifname "tether-b" ip daddr != 10.0.0.0/16 counter drop comment "peer cluster-b: destination outside local CIDRs"
            		iifname "tether-b" ct mark set ct mark and 0xffff0000 or 0x7700 comment "peer cluster-b: remember the peer of this connection"
            		iifname "eth0" ct mark and 0xffff == 0x7700 meta mark set meta mark and 0xffff0000 or 0x7700 comment "peer cluster-b: replies follow their connection"
            		iifname "eth0" ip daddr 10.71.0.0/16 meta mark set meta mark and 0xffff0000 or 0x7700 ct mark set ct mark and 0xffff0000 or 0x7700 comment "peer cluster-b: to the peer"
            	}
            	chain dstnat {
            		type nat hook prerouting priority dstnat; policy accept;
            		meta mark and 0xffff == 0x7700 ip daddr 10.71.0.0/16 dnat ip prefix to ip daddr map { 10.71.0.0/16 : 10.0.0.0/16 } comment "peer cluster-b: local view to real"
            	}
            	chain forward {
            		type filter hook forward priority filter; policy accept;
            		iifname "tether-b" tcp flags & (syn | rst) == syn tcp option maxseg size > 536 tcp option maxseg size set 536 comment "clamp MSS to the tunnel MTU"
            		oifname "tether-b" tcp flags & (syn | rst) == syn tcp option maxseg size > 536 tcp option maxseg size set 536 comment "clamp MSS to the tunnel MTU"
            	}
            	chain srcnat {
            		type nat hook postrouting priority srcnat; policy accept;
            		iifname "tether-b" ip saddr 10.0.0.0/16 snat ip prefix to ip saddr map { 10.0.0.0/16 : 10.71.0.0/16 } comment "peer cluster-b: real to local view"
            	}
            }
        "#]],
    );
}

#[test]
fn no_peers_leaves_an_empty_table() {
    check_scenario(
        "no_peers",
        expect![[r#"
            sysctl net.ipv4.conf.all.rp_filter=0
            sysctl net.ipv4.conf.eth0.rp_filter=2
            sysctl net.ipv4.ip_forward=1
            table ip tether
            delete table ip tether
            table ip tether {
            	comment "tether:d65da930045ec989"
            }
        "#]],
    );
}

/// Plans each broken input and lists the error messages, one per line.
fn errors(cases: Vec<(&str, GatewayInput)>) -> String {
    cases
        .into_iter()
        .map(|(name, input)| match plan(&input) {
            Ok(_) => format!("{name}: accepted\n"),
            Err(error) => format!("{name}: {error}\n"),
        })
        .collect()
}

#[test]
fn invalid_input_is_rejected_with_a_message_naming_it() {
    let base = || {
        gateway(vec![peer(
            "cluster-b",
            "tether-b",
            "10.0.0.0/16",
            "10.71.0.0/16",
        )])
    };
    let with_peer = |extra: PeerInput| {
        let mut input = base();
        input.peers.push(extra);
        input
    };
    let cases = vec![
        ("valid", base()),
        (
            "table name",
            GatewayInput {
                table: "te ther".to_owned(),
                ..base()
            },
        ),
        ("mtu low", GatewayInput { mtu: 575, ..base() }),
        (
            "mtu high",
            GatewayInput {
                mtu: 9001,
                ..base()
            },
        ),
        (
            "rule priority",
            GatewayInput {
                rule_priority: 32766,
                ..base()
            },
        ),
        (
            "marks outside mask",
            GatewayInput {
                fwmark_base: 0x1_0000,
                ..base()
            },
        ),
        (
            "zero mark",
            GatewayInput {
                fwmark_base: 0,
                ..base()
            },
        ),
        (
            "main table",
            GatewayInput {
                route_table_base: 254,
                ..base()
            },
        ),
        (
            "long interface",
            with_peer(peer(
                "cluster-c",
                "tether-cluster-c",
                "10.9.0.0/16",
                "10.9.0.0/16",
            )),
        ),
        (
            "quote in interface",
            with_peer(peer("cluster-c", "t\"c", "10.9.0.0/16", "10.9.0.0/16")),
        ),
        (
            "bad peer id",
            with_peer(peer("cluster c", "tether-c", "10.9.0.0/16", "10.9.0.0/16")),
        ),
        (
            "duplicate id",
            with_peer(peer("cluster-b", "tether-c", "10.9.0.0/16", "10.9.0.0/16")),
        ),
        (
            "duplicate interface",
            with_peer(peer("cluster-c", "tether-b", "10.9.0.0/16", "10.9.0.0/16")),
        ),
        (
            "pod interface as tunnel",
            with_peer(peer("cluster-c", "eth0", "10.9.0.0/16", "10.9.0.0/16")),
        ),
        (
            "host bits",
            with_peer(peer("cluster-c", "tether-c", "10.9.0.1/16", "10.9.0.0/16")),
        ),
        (
            "prefix mismatch",
            with_peer(peer("cluster-c", "tether-c", "10.0.0.0/16", "10.72.0.0/24")),
        ),
        (
            "view overlaps local",
            with_peer(peer("cluster-c", "tether-c", "10.0.0.0/16", "10.0.0.0/16")),
        ),
        (
            "views overlap",
            with_peer(peer("cluster-c", "tether-c", "10.0.0.0/16", "10.71.0.0/16")),
        ),
        (
            "peer cidrs overlap",
            with_peer(PeerInput {
                external: Some(CidrMapping::identity(net("10.9.128.0/17"))),
                ..peer("cluster-c", "tether-c", "10.9.0.0/16", "10.9.0.0/16")
            }),
        ),
        (
            "tunnel networks overlap",
            GatewayInput {
                peers: vec![
                    PeerInput {
                        tunnel_address: Some(net("169.254.18.1/30")),
                        ..peer("cluster-b", "tether-b", "10.0.0.0/16", "10.71.0.0/16")
                    },
                    PeerInput {
                        tunnel_address: Some(net("169.254.18.2/30")),
                        ..peer("cluster-c", "tether-c", "10.0.0.0/16", "10.72.0.0/16")
                    },
                ],
                ..base()
            },
        ),
        (
            "ip mapping outside external CIDR",
            GatewayInput {
                ip_mappings: vec![IpMapping {
                    external: addr("10.70.0.5"),
                    real: addr("10.96.0.1"),
                }],
                ..base()
            },
        ),
        (
            "ip mapping to a pod",
            GatewayInput {
                ip_mappings: vec![IpMapping {
                    external: addr("10.70.0.5"),
                    real: addr("10.0.3.4"),
                }],
                local: LocalNetworks {
                    external_cidr: Some(net("10.70.0.0/16")),
                    ..base().local
                },
                ..base()
            },
        ),
        (
            "duplicate ip mapping",
            GatewayInput {
                ip_mappings: vec![
                    IpMapping {
                        external: addr("10.70.0.5"),
                        real: addr("10.96.0.1"),
                    },
                    IpMapping {
                        external: addr("10.70.0.6"),
                        real: addr("10.96.0.1"),
                    },
                ],
                local: LocalNetworks {
                    external_cidr: Some(net("10.70.0.0/16")),
                    ..base().local
                },
                ..base()
            },
        ),
        (
            "no local pods",
            GatewayInput {
                local: Default::default(),
                ..base()
            },
        ),
    ];
    expect![[r#"
        valid: accepted
        table name: invalid nftables table name "te ther": use 1 to 64 ASCII letters, digits or '_', starting with a letter
        mtu low: tunnel mtu 575 is out of range: use 576..=9000
        mtu high: tunnel mtu 9001 is out of range: use 576..=9000
        rule priority: rule priority 32766 is reserved: use 1..=32764 (the next priority holds the local lookup)
        marks outside mask: fwmark base 0x10000 with mask 0xffff cannot hold 1 peer marks: every base+i must be non-zero and inside the mask
        zero mark: fwmark base 0x0 with mask 0xffff cannot hold 1 peer marks: every base+i must be non-zero and inside the mask
        main table: route tables 254..255 are unusable: keep clear of 0 and 253..=255 (and of u32::MAX)
        long interface: invalid interface name "tether-cluster-c": use 1 to 15 ASCII letters, digits or '-', '_', '.'
        quote in interface: invalid interface name "t\"c": use 1 to 15 ASCII letters, digits or '-', '_', '.'
        bad peer id: invalid peer id "cluster c": use 1 to 63 ASCII letters, digits or '-', '_', '.'
        duplicate id: peer id "cluster-b" appears more than once
        duplicate interface: interface "tether-b" is used more than once (each peer needs its own tunnel interface)
        pod interface as tunnel: interface "eth0" is used more than once (each peer needs its own tunnel interface)
        host bits: peer "cluster-c" real pod CIDR 10.9.0.1/16 has host bits set: did you mean 10.9.0.0/16?
        prefix mismatch: peer "cluster-c": pod local view 10.72.0.0/24 must have the prefix length of its real CIDR 10.0.0.0/16
        view overlaps local: local pod CIDR 10.0.0.0/16 overlaps peer "cluster-c" pod local view 10.0.0.0/16
        views overlap: peer "cluster-b" pod local view 10.71.0.0/16 overlaps peer "cluster-c" pod local view 10.71.0.0/16
        peer cidrs overlap: peer "cluster-c": real pod CIDR 10.9.0.0/16 overlaps real external CIDR 10.9.128.0/17
        tunnel networks overlap: peer "cluster-b" tunnel network 169.254.18.0/30 overlaps peer "cluster-c" tunnel network 169.254.18.0/30
        ip mapping outside external CIDR: ip mapping 10.70.0.5 is outside the local external CIDR (none configured): pick an address inside it
        ip mapping to a pod: ip mapping to 10.0.3.4 points into the local pod CIDRs: peers reach pods directly
        duplicate ip mapping: address 10.96.0.1 appears in more than one ip mapping
        no local pods: local pod CIDRs are empty: the gateway must know them to accept traffic from peers
    "#]].assert_eq(&errors(cases));
}

#[test]
fn sysctl_keys_keep_dots_of_interface_names() {
    let mut input = gateway(vec![peer(
        "cluster-b",
        "tether-b",
        "10.0.0.0/16",
        "10.71.0.0/16",
    )]);
    input.pod_interfaces = vec!["eth0.100".to_owned()];
    let plan = plan(&input).expect("valid");
    let pod_sysctl = plan
        .sysctls
        .iter()
        .find(|sysctl| sysctl.key.contains("eth0.100"))
        .expect("pod interface sysctl");
    assert_eq!(pod_sysctl.key, "net/ipv4/conf/eth0.100/rp_filter");
    assert_eq!(pod_sysctl.to_string(), "net.ipv4.conf.eth0/100.rp_filter=2");
}

#[test]
fn routes_print_in_ip_route_syntax_for_every_kind() {
    let unicast = Route {
        table: 7700,
        dst: net("10.0.0.0/16"),
        kind: RouteKind::Unicast,
        dev: Some("tether-b".to_owned()),
        src: Some(addr("169.254.18.1")),
        metric: 0,
    };
    let catch_all = |kind| Route {
        table: 7700,
        dst: net("0.0.0.0/0"),
        kind,
        dev: None,
        src: None,
        metric: tether_netplan::CATCH_ALL_METRIC,
    };
    let text: Vec<String> = [
        unicast,
        catch_all(RouteKind::Unreachable),
        catch_all(RouteKind::Blackhole),
    ]
    .iter()
    .map(ToString::to_string)
    .collect();
    expect![[r#"
        10.0.0.0/16 dev tether-b src 169.254.18.1 table 7700
        unreachable default table 7700 metric 4294967295
        blackhole default table 7700 metric 4294967295"#]]
    .assert_eq(&text.join("\n"));
}
