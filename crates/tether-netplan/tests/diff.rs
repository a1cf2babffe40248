//! Reconciliation tests: snapshots of the ops `diff` and `teardown` emit for typical drift, and
//! a property test that applying the ops to an in-memory kernel converges in one round.

mod fixtures;

use std::collections::BTreeSet;

use expect_test::expect;
use fixtures::{net, scenarios};
use proptest::prelude::*;
use tether_netplan::{
    Address, GatewayInput, LOCAL_TABLE, Observed, Op, Plan, Route, RouteKind, Rule, Sysctl, diff,
    plan, teardown,
};

fn scenario(name: &str) -> GatewayInput {
    scenarios()
        .into_iter()
        .find(|(n, _)| *n == name)
        .expect("scenario exists")
        .1
}

fn ops_text(ops: &[Op]) -> String {
    ops.iter().map(|op| format!("{op}\n")).collect()
}

/// What a kernel holding exactly `plan` reports back.
fn observed_from(plan: &Plan) -> Observed {
    Observed {
        routes: plan.routes.clone(),
        rules: plan.rules.clone(),
        ruleset_fingerprint: Some(plan.nft.fingerprint()),
        sysctls: plan.sysctls.clone(),
        addresses: plan.addresses.clone(),
        local_rule_hidden: plan.rules.iter().any(|r| r.table == LOCAL_TABLE),
    }
}

#[test]
fn empty_kernel_gets_everything_added_in_apply_order() {
    let desired = plan(&scenario("two_peers_same_real")).expect("valid");
    expect![[r#"
        sysctl -w net.ipv4.conf.all.rp_filter=0
        sysctl -w net.ipv4.conf.tether-b.accept_local=1
        sysctl -w net.ipv4.conf.tether-b.rp_filter=0
        sysctl -w net.ipv4.conf.tether-c.accept_local=1
        sysctl -w net.ipv4.conf.tether-c.rp_filter=0
        sysctl -w net.ipv4.ip_forward=1
        ip addr add 169.254.18.1/30 dev tether-b
        ip addr add 169.254.18.5/30 dev tether-c
        ip route add unreachable default table 7700 metric 4294967295
        ip route add 10.0.0.0/16 dev tether-b src 169.254.18.1 table 7700
        ip route add unreachable default table 7701 metric 4294967295
        ip route add 10.0.0.0/16 dev tether-c src 169.254.18.5 table 7701
        ip rule add pref 7700 fwmark 0x7700/0xffff lookup 7700
        ip rule add pref 7700 fwmark 0x7701/0xffff lookup 7701
        ip rule add pref 7701 lookup 255
        ip rule del pref 0 lookup local
        nft replace table ip tether (a227382abfc6f370)
    "#]]
    .assert_eq(&ops_text(&diff(&desired, &Observed::default())));
}

#[test]
fn kernel_matching_the_plan_needs_nothing() {
    for (name, input) in scenarios() {
        let desired = plan(&input).expect("valid");
        assert_eq!(
            diff(&desired, &observed_from(&desired)),
            Vec::new(),
            "{name}"
        );
    }
}

#[test]
fn drift_is_repaired_with_deletes_before_adds() {
    let desired = plan(&scenario("two_peers_same_real")).expect("valid");
    let mut observed = observed_from(&desired);
    // A peer that went away left its rule and route behind (table 7702), peer c's route points
    // at the wrong device, ip_forward was reset, and the table holds an older ruleset.
    observed.rules.push(Rule {
        priority: 7700,
        fwmark: Some((0x7702, 0xffff)),
        iif: None,
        dst: None,
        table: 7702,
    });
    observed.routes.push(Route {
        table: 7702,
        dst: net("10.5.0.0/16"),
        kind: RouteKind::Unicast,
        dev: Some("tether-d".to_owned()),
        src: None,
        metric: 0,
    });
    observed.routes.retain(|route| route.table != 7701);
    observed.routes.push(Route {
        table: 7701,
        dst: net("10.0.0.0/16"),
        kind: RouteKind::Unicast,
        dev: Some("tether-b".to_owned()),
        src: None,
        metric: 0,
    });
    observed
        .sysctls
        .retain(|sysctl| sysctl.key != "net/ipv4/ip_forward");
    observed
        .sysctls
        .push(Sysctl::new("net/ipv4/ip_forward", "0\n"));
    observed.addresses.push(Address {
        dev: "tether-c".to_owned(),
        addr: net("169.254.99.1/30"),
    });
    observed.ruleset_fingerprint = Some("0000000000000000".to_owned());
    expect![[r#"
        ip rule del pref 7700 fwmark 0x7702/0xffff lookup 7702
        ip route del 10.0.0.0/16 dev tether-b table 7701
        ip route del 10.5.0.0/16 dev tether-d table 7702
        ip addr del 169.254.99.1/30 dev tether-c
        sysctl -w net.ipv4.ip_forward=1
        ip route add unreachable default table 7701 metric 4294967295
        ip route add 10.0.0.0/16 dev tether-c src 169.254.18.5 table 7701
        nft replace table ip tether (a227382abfc6f370)
    "#]]
    .assert_eq(&ops_text(&diff(&desired, &observed)));
}

#[test]
fn foreign_rules_and_routes_are_ignored() {
    let desired = plan(&scenario("two_peers_same_real")).expect("valid");
    let mut observed = observed_from(&desired);
    // Someone else's rule at another priority, and a route in main and in a table past ours.
    observed.rules.push(Rule {
        priority: 100,
        fwmark: None,
        iif: None,
        dst: None,
        table: 7700,
    });
    observed.rules.push(Rule {
        priority: 7702,
        fwmark: Some((0x7700, 0xffff)),
        iif: None,
        dst: None,
        table: 7700,
    });
    for table in [254, 7700 + 256] {
        observed.routes.push(Route {
            table,
            dst: net("10.0.0.0/8"),
            kind: RouteKind::Unicast,
            dev: Some("eth0".to_owned()),
            src: None,
            metric: 0,
        });
    }
    assert_eq!(diff(&desired, &observed), Vec::new());
}

#[test]
fn sysctl_values_are_compared_ignoring_trailing_newlines() {
    let desired = plan(&scenario("one_peer_remapped")).expect("valid");
    let mut observed = observed_from(&desired);
    for sysctl in &mut observed.sysctls {
        sysctl.value.push('\n');
    }
    assert_eq!(diff(&desired, &observed), Vec::new());
}

#[test]
fn missing_or_foreign_table_is_replaced() {
    let desired = plan(&scenario("one_peer_remapped")).expect("valid");
    for fingerprint in [None, Some(String::new())] {
        let observed = Observed {
            ruleset_fingerprint: fingerprint,
            ..observed_from(&desired)
        };
        assert_eq!(
            diff(&desired, &observed),
            vec![Op::ReplaceRuleset(desired.nft.clone())]
        );
    }
}

#[test]
fn teardown_removes_only_what_was_observed() {
    let desired = plan(&scenario("two_peers_same_real")).expect("valid");
    expect![[r#"
        ip rule add pref 0 lookup local
        nft delete table ip tether
        ip rule del pref 7700 fwmark 0x7700/0xffff lookup 7700
        ip rule del pref 7700 fwmark 0x7701/0xffff lookup 7701
        ip rule del pref 7701 lookup 255
        ip route del unreachable default table 7700 metric 4294967295
        ip route del 10.0.0.0/16 dev tether-b src 169.254.18.1 table 7700
        ip route del unreachable default table 7701 metric 4294967295
        ip route del 10.0.0.0/16 dev tether-c src 169.254.18.5 table 7701
        ip addr del 169.254.18.1/30 dev tether-b
        ip addr del 169.254.18.5/30 dev tether-c
    "#]]
    .assert_eq(&ops_text(&teardown("tether", &observed_from(&desired))));
    let nothing = Observed::default();
    assert_eq!(teardown("tether", &nothing), Vec::new());
}

/// A tiny in-memory kernel: just enough state to apply ops the way `tether-kernel` does.
#[derive(Debug, Clone, Default)]
struct FakeKernel {
    routes: BTreeSet<Route>,
    rules: BTreeSet<Rule>,
    addresses: BTreeSet<Address>,
    sysctls: Vec<Sysctl>,
    table: Option<String>,
    /// The kernel's `pref 0 lookup local` rule is gone.
    local_hidden: bool,
}

impl FakeKernel {
    fn apply(&mut self, op: &Op) {
        match op {
            Op::AddRoute(route) => {
                // The kernel refuses a second route to the same destination and metric in one
                // table.
                let clash = self.routes.iter().any(|r| {
                    r.table == route.table && r.dst == route.dst && r.metric == route.metric
                });
                assert!(!clash, "route add would fail with EEXIST: {route}");
                self.routes.insert(route.clone());
            }
            Op::DelRoute(route) => assert!(self.routes.remove(route), "no such route {route}"),
            Op::AddRule(rule) => assert!(self.rules.insert(rule.clone()), "duplicate rule {rule}"),
            Op::DelRule(rule) => assert!(self.rules.remove(rule), "no such rule {rule}"),
            Op::AddAddress(address) => {
                assert!(
                    self.addresses.insert(address.clone()),
                    "duplicate {address}"
                );
            }
            Op::DelAddress(address) => assert!(self.addresses.remove(address), "no {address}"),
            Op::SetSysctl(sysctl) => {
                self.sysctls.retain(|s| s.key != sysctl.key);
                self.sysctls.push(sysctl.clone());
            }
            Op::ReplaceRuleset(ruleset) => self.table = Some(ruleset.fingerprint()),
            Op::DeleteRuleset(_) => self.table = None,
            Op::HideLocalRule => self.local_hidden = true,
            Op::RestoreLocalRule => self.local_hidden = false,
        }
        // Between any two ops some rule must still look up the local table, or the namespace
        // stops receiving its own traffic.
        assert!(
            !self.local_hidden || self.rules.iter().any(|r| r.table == LOCAL_TABLE),
            "after {op} no rule looks up the local table"
        );
    }

    fn observe(&self) -> Observed {
        Observed {
            routes: self.routes.iter().cloned().collect(),
            rules: self.rules.iter().cloned().collect(),
            ruleset_fingerprint: self.table.clone(),
            sysctls: self.sysctls.clone(),
            addresses: self.addresses.iter().cloned().collect(),
            local_rule_hidden: self.local_hidden,
        }
    }
}

/// A kernel that holds a random mix: some of `desired`'s objects, plus stale ones of our own.
fn drifted_kernel(desired: &Plan, keep: &[bool], stale_tables: &[u32]) -> FakeKernel {
    let mut kernel = FakeKernel::default();
    let mut keep = keep.iter().cycle();
    let mut next = || *keep.next().expect("cycle of a non-empty slice");
    for route in &desired.routes {
        if next() {
            kernel.routes.insert(route.clone());
        }
    }
    for rule in &desired.rules {
        if next() {
            kernel.rules.insert(rule.clone());
        }
    }
    for address in &desired.addresses {
        if next() {
            kernel.addresses.insert(address.clone());
        }
    }
    for sysctl in &desired.sysctls {
        if next() {
            kernel.sysctls.push(sysctl.clone());
        } else {
            kernel.sysctls.push(Sysctl::new(sysctl.key.clone(), "0"));
        }
    }
    for (i, table) in stale_tables.iter().enumerate() {
        let dst = net(&format!("10.{}.0.0/16", 100 + i));
        kernel.routes.insert(Route {
            table: *table,
            dst,
            kind: RouteKind::Unicast,
            dev: Some("old".to_owned()),
            src: None,
            metric: 0,
        });
        kernel.rules.insert(Rule {
            priority: 7700,
            fwmark: Some((*table, 0xffff)),
            iif: None,
            dst: None,
            table: *table,
        });
    }
    kernel.local_hidden = next() && kernel.rules.iter().any(|r| r.table == LOCAL_TABLE);
    if next() {
        kernel.table = Some(desired.nft.fingerprint());
    } else if next() {
        kernel.table = Some("stale".to_owned());
    }
    kernel
}

proptest! {
    #[test]
    fn one_round_of_diff_converges(
        index in 0usize..8,
        reverse in any::<bool>(),
        keep in proptest::collection::vec(any::<bool>(), 1..16),
        stale_tables in proptest::collection::vec(7700u32..7710, 0..4),
    ) {
        let (_, mut input) = scenarios().swap_remove(index);
        if reverse {
            input.peers.reverse();
        }
        let desired = plan(&input).expect("valid");
        let mut kernel = drifted_kernel(&desired, &keep, &stale_tables);
        let ops = diff(&desired, &kernel.observe());
        for op in &ops {
            kernel.apply(op);
        }
        prop_assert_eq!(diff(&desired, &kernel.observe()), Vec::<Op>::new());
        // Teardown leaves nothing of ours.
        for op in teardown(&input.table, &kernel.observe()) {
            kernel.apply(&op);
        }
        let left = kernel.observe();
        prop_assert!(left.routes.is_empty() && left.rules.is_empty() && left.addresses.is_empty());
        prop_assert_eq!(left.ruleset_fingerprint, None);
        prop_assert!(!left.local_rule_hidden, "teardown must give the kernel its local rule back");
    }

    #[test]
    fn a_marked_lookup_never_leaves_its_table_even_without_the_tunnel(
        index in 0usize..8,
        tunnel_up in any::<bool>(),
        destination in any::<u32>(),
    ) {
        let (_, input) = scenarios().swap_remove(index);
        let desired = plan(&input).expect("valid");
        for (peer_index, peer) in input.peers.iter().enumerate() {
            let table = input.peer_table(peer_index);
            prop_assert!(desired.rules.iter().any(|rule| rule.table == table));
            // The kernel drops a device's routes with the device; what is left must still
            // answer every destination, or policy routing falls through to the main table.
            let live: Vec<&Route> = desired
                .routes
                .iter()
                .filter(|route| route.table == table)
                .filter(|route| tunnel_up || route.dev.as_deref() != Some(peer.interface.as_str()))
                .collect();
            let destination = std::net::Ipv4Addr::from(destination);
            let best = live
                .iter()
                .filter(|route| route.dst.contains(&destination))
                .max_by_key(|route| (route.dst.prefix_len(), std::cmp::Reverse(route.metric)));
            let best = best.expect("the peer table answers every destination");
            match best.kind {
                RouteKind::Unicast => {
                    prop_assert!(tunnel_up);
                    prop_assert_eq!(best.dev.as_deref(), Some(peer.interface.as_str()));
                }
                RouteKind::Unreachable => prop_assert!(best.dev.is_none()),
                RouteKind::Blackhole => prop_assert!(false, "the plan chose unreachable"),
            }
            if !tunnel_up {
                prop_assert_eq!(best.kind, RouteKind::Unreachable);
            }
        }
    }

    #[test]
    fn plan_does_not_depend_on_pod_interface_order(index in 0usize..8) {
        let (_, mut input) = scenarios().swap_remove(index);
        input.pod_interfaces = vec!["eth1".to_owned(), "eth0".to_owned()];
        let forward = plan(&input).expect("valid");
        input.pod_interfaces.reverse();
        prop_assert_eq!(plan(&input).expect("valid"), forward);
    }
}

#[test]
fn peer_order_decides_marks_and_tables_so_callers_sort_by_id() {
    let mut input = scenario("two_peers_same_real");
    let sorted = plan(&input).expect("valid");
    input.peers.reverse();
    let reversed = plan(&input).expect("valid");
    // Same objects, but the marks/tables swap owners: the reason the gateway must keep a stable
    // order. Planning the sorted input again gives the identical plan.
    assert_ne!(sorted.nft.fingerprint(), reversed.nft.fingerprint());
    input.peers.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(plan(&input).expect("valid"), sorted);
}
