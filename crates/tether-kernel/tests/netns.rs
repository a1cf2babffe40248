//! The kernel adapter against a real kernel: every test programs its own fresh network namespace
//! (root required; skipped with a message locally, mandatory when `CI` is set).

// Helpers shared by the tests fail the test on setup errors, like the tests themselves.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use ipnet::Ipv4Net;
use tether_kernel::{Kernel, KernelConfig, KernelError, LinkSettings, ReconcileReport};
use tether_netplan::{CidrMapping, GatewayInput, LocalNetworks, Op, PeerInput, Plan};
use tether_testkit::{Netns, require_root_or_skip};

fn net(text: &str) -> Ipv4Net {
    text.parse().expect("test CIDR literal")
}

fn peer(id: &str, interface: &str, view: &str, tunnel: &str) -> PeerInput {
    PeerInput {
        id: id.to_owned(),
        interface: interface.to_owned(),
        tunnel_address: Some(net(tunnel)),
        pod: CidrMapping::remapped(net("10.0.0.0/16"), net(view)),
        external: None,
    }
}

/// Two peers that both use our own pod CIDR (the overlapping case), remapped to 10.71/16 and
/// 10.72/16.
fn input(peers: Vec<PeerInput>) -> GatewayInput {
    GatewayInput {
        pod_interfaces: vec!["pods0".to_owned()],
        local: LocalNetworks {
            pod_cidrs: vec![net("10.0.0.0/16")],
            external_cidr: None,
        },
        peers,
        ..GatewayInput::default()
    }
}

fn two_peers() -> GatewayInput {
    input(vec![
        peer("cluster-b", "tether-b", "10.71.0.0/16", "169.254.18.1/30"),
        peer("cluster-c", "tether-c", "10.72.0.0/16", "169.254.18.5/30"),
    ])
}

fn plan(input: &GatewayInput) -> Plan {
    tether_netplan::plan(input).expect("valid test input")
}

fn kernel(input: &GatewayInput) -> Kernel {
    Kernel::new(KernelConfig::new(input.ownership())).expect("rtnetlink socket")
}

/// A namespace with the pod-facing interface and the peers' TUN devices (up, no process).
fn gateway_ns(label: &str, tunnels: &[&str]) -> Netns {
    let ns = Netns::new(label).expect("namespace");
    // No dummy module on every machine: a veth pair inside the namespace stands in for the
    // pod-facing link.
    ns.ip(&[
        "link", "add", "pods0", "type", "veth", "peer", "name", "pods1",
    ])
    .unwrap();
    ns.ip(&["link", "set", "pods0", "up"]).unwrap();
    ns.ip(&["link", "set", "pods1", "up"]).unwrap();
    for tunnel in tunnels {
        ns.ip(&["tuntap", "add", "dev", tunnel, "mode", "tun"])
            .unwrap();
        ns.ip(&["link", "set", tunnel, "up"]).unwrap();
    }
    ns
}

fn lines(ns: &Netns, args: &[&str]) -> Vec<String> {
    ns.ip(args).unwrap().lines().map(str::to_owned).collect()
}

fn our_rules(ns: &Netns) -> Vec<String> {
    lines(ns, &["rule", "show"])
        .into_iter()
        .filter(|l| l.contains("proto 116"))
        .collect()
}

/// Where the namespace looks up its local table: the kernel's `pref 0` rule, or our copy.
fn local_lookups(ns: &Netns) -> Vec<String> {
    lines(ns, &["rule", "show"])
        .into_iter()
        .filter(|l| l.contains("lookup local"))
        .collect()
}

fn routes_in(ns: &Netns, table: &str) -> Vec<String> {
    lines(ns, &["route", "show", "table", table])
}

fn nft_table(ns: &Netns, table: &str) -> Option<String> {
    let output = ns.exec(&["nft", "list", "table", "ip", table]).unwrap();
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}

fn assert_clean(report: &ReconcileReport) {
    assert!(report.is_success(), "failures: {:#?}", report.failed);
}

fn has_op(report: &ReconcileReport, pred: impl Fn(&Op) -> bool) -> bool {
    report.applied.iter().any(pred)
}

#[test]
fn reconcile_applies_the_plan_once_and_restarts_create_no_duplicates() {
    if !require_root_or_skip() {
        return;
    }
    let ns = gateway_ns("k-apply", &["tether-b", "tether-c"]);
    let input = two_peers();
    let desired = plan(&input);
    ns.run_async(|| async {
        let mut kernel = kernel(&input);
        let first = kernel.reconcile(&desired).await.unwrap();
        assert_clean(&first);
        assert!(!first.drift_detected, "a first apply is not drift");
        assert!(has_op(&first, |op| matches!(op, Op::ReplaceRuleset(_))));
        let second = kernel.reconcile(&desired).await.unwrap();
        assert!(
            second.is_noop(),
            "second reconcile did {:?}",
            second.applied
        );
        // A restarted gateway (new adapter, same plan) finds everything in place.
        drop(kernel);
        let third = kernel_reconcile(&input, &desired).await;
        assert!(third.is_noop(), "restart did {:?}", third.applied);
    });

    let rules = our_rules(&ns);
    assert_eq!(rules.len(), 3, "{rules:#?}");
    // The local lookup moved behind the fwmark rules, so a reply whose translated destination
    // is one of the gateway's own addresses still follows its mark into the tunnel.
    assert_eq!(
        local_lookups(&ns),
        vec!["7701:\tfrom all lookup local proto 116".to_owned()]
    );
    assert!(
        rules
            .iter()
            .any(|r| r.contains("fwmark 0x7700/0xffff lookup 7700")),
        "{rules:#?}"
    );
    assert!(
        rules
            .iter()
            .any(|r| r.contains("fwmark 0x7701/0xffff lookup 7701")),
        "{rules:#?}"
    );
    // The tunnel route, and the catch-all that keeps the marked lookup in this table.
    let table_b = routes_in(&ns, "7700");
    assert_eq!(table_b.len(), 2, "{table_b:#?}");
    assert!(
        table_b[0].starts_with("unreachable default proto 116 metric 4294967295"),
        "{table_b:#?}"
    );
    assert!(
        table_b[1].starts_with("10.0.0.0/16 dev tether-b proto 116"),
        "{table_b:#?}"
    );
    assert!(table_b[1].contains("src 169.254.18.1"), "{table_b:#?}");
    assert_eq!(routes_in(&ns, "7701").len(), 2);
    let addrs = ns.ip(&["-4", "addr", "show", "dev", "tether-b"]).unwrap();
    assert!(addrs.contains("inet 169.254.18.1/30"), "{addrs}");
    let table = nft_table(&ns, "tether").expect("our nft table exists");
    assert!(
        table.contains(&format!("comment \"tether:{}\"", desired.nft.fingerprint())),
        "{table}"
    );
    assert!(
        table.contains("dnat ip prefix to ip daddr map { 10.71.0.0/16 : 10.0.0.0/16 }"),
        "{table}"
    );
    assert_eq!(ns.sysctl("net.ipv4.ip_forward").unwrap(), "1");
    // Every sysctl holds the plan's value (netplan decides the values, e.g. rp_filter).
    assert!(
        desired
            .sysctls
            .iter()
            .any(|s| s.key == "net/ipv4/conf/tether-b/rp_filter")
    );
    for sysctl in &desired.sysctls {
        assert_eq!(ns.sysctl(&sysctl.key).unwrap(), sysctl.value, "{sysctl}");
    }
}

async fn kernel_reconcile(input: &GatewayInput, desired: &Plan) -> ReconcileReport {
    let mut kernel = kernel(input);
    kernel.reconcile(desired).await.unwrap()
}

#[test]
fn foreign_objects_survive_reconcile_and_teardown() {
    if !require_root_or_skip() {
        return;
    }
    let ns = gateway_ns("k-foreign", &["tether-b", "tether-c"]);
    // Someone else's objects, including some at our priority, in our table range and on our
    // tunnel device, all without our tag.
    ns.ip(&[
        "rule", "add", "pref", "7700", "fwmark", "0x99", "lookup", "100",
    ])
    .unwrap();
    ns.ip(&[
        "rule",
        "add",
        "pref",
        "100",
        "to",
        "10.99.0.0/16",
        "lookup",
        "100",
    ])
    .unwrap();
    ns.ip(&["route", "add", "10.99.0.0/16", "dev", "pods0"])
        .unwrap();
    ns.ip(&[
        "route",
        "add",
        "10.98.0.0/16",
        "dev",
        "pods0",
        "table",
        "7700",
    ])
    .unwrap();
    ns.ip(&[
        "route",
        "add",
        "10.97.0.0/16",
        "dev",
        "pods0",
        "table",
        "100",
    ])
    .unwrap();
    ns.ip(&["addr", "add", "192.0.2.1/32", "dev", "tether-b"])
        .unwrap();
    ns.nft(concat!(
        "table ip other { chain forward_in { ",
        "type filter hook forward priority 0; policy accept; counter; }; }",
    ))
    .unwrap();
    let snapshot = |ns: &Netns| {
        (
            lines(ns, &["rule", "show"])
                .into_iter()
                .filter(|l| !l.contains("proto 116") && !l.contains("lookup local"))
                .count(),
            lines(ns, &["route", "show", "table", "all"])
                .into_iter()
                .filter(|l| l.contains("10.9"))
                .collect::<Vec<_>>(),
            nft_table(ns, "other"),
        )
    };
    let before = snapshot(&ns);

    let input = two_peers();
    let desired = plan(&input);
    ns.run_async(|| async {
        let mut kernel = kernel(&input);
        assert_clean(&kernel.reconcile(&desired).await.unwrap());
        let observed = kernel.observe(Some(&desired)).await.unwrap();
        assert_eq!(
            observed.rules, desired.rules,
            "foreign rules are not observed"
        );
        assert_eq!(
            observed.routes, desired.routes,
            "foreign routes are not observed"
        );
        assert_eq!(
            observed.addresses, desired.addresses,
            "foreign addresses are not observed"
        );
    });
    assert_eq!(snapshot(&ns), before, "reconcile touched foreign objects");
    assert_eq!(our_rules(&ns).len(), 3);

    ns.run_async(|| async {
        let mut kernel = kernel(&input);
        let report = kernel.teardown().await.unwrap();
        assert_clean(&report);
        assert!(!report.is_noop());
    });
    assert_eq!(snapshot(&ns), before, "teardown touched foreign objects");
    assert!(our_rules(&ns).is_empty(), "{:#?}", our_rules(&ns));
    assert_eq!(
        local_lookups(&ns),
        vec!["0:\tfrom all lookup local".to_owned()],
        "teardown gives the kernel's local rule back"
    );
    assert_eq!(routes_in(&ns, "7701"), Vec::<String>::new());
    assert_eq!(
        routes_in(&ns, "7700").len(),
        1,
        "only the foreign route stays in 7700"
    );
    assert!(nft_table(&ns, "tether").is_none(), "our table is gone");
    let addrs = ns.ip(&["-4", "addr", "show", "dev", "tether-b"]).unwrap();
    assert!(
        addrs.contains("192.0.2.1/32") && !addrs.contains("169.254.18.1"),
        "{addrs}"
    );
}

#[test]
fn drift_is_detected_and_repaired() {
    if !require_root_or_skip() {
        return;
    }
    let ns = gateway_ns("k-drift", &["tether-b", "tether-c"]);
    let input = two_peers();
    let desired = plan(&input);
    ns.run_async(|| async {
        let mut kernel = kernel(&input);
        assert_clean(&kernel.reconcile(&desired).await.unwrap());

        // A route of ours disappears.
        ns.ip(&["route", "del", "10.0.0.0/16", "table", "7701"])
            .unwrap();
        let report = kernel.reconcile(&desired).await.unwrap();
        assert!(report.drift_detected);
        assert_eq!(report.applied.len(), 1, "{:?}", report.applied);
        assert!(matches!(&report.applied[0], Op::AddRoute(r) if r.table == 7701));

        // Our nft table is deleted.
        ns.exec_ok(&["nft", "delete", "table", "ip", "tether"])
            .unwrap();
        let report = kernel.reconcile(&desired).await.unwrap();
        assert!(report.drift_detected);
        assert!(
            matches!(report.applied.as_slice(), [Op::ReplaceRuleset(_)]),
            "{:?}",
            report.applied
        );

        // Our table is edited without touching its comment: caught by comparing listings.
        ns.exec_ok(&["nft", "flush", "chain", "ip", "tether", "forward"])
            .unwrap();
        let report = kernel.reconcile(&desired).await.unwrap();
        assert!(report.drift_detected);
        assert!(
            matches!(report.applied.as_slice(), [Op::ReplaceRuleset(_)]),
            "{:?}",
            report.applied
        );

        // A rule, an address and a sysctl are reverted.
        ns.ip(&[
            "rule",
            "del",
            "pref",
            "7700",
            "fwmark",
            "0x7700/0xffff",
            "lookup",
            "7700",
        ])
        .unwrap();
        ns.ip(&["addr", "del", "169.254.18.5/30", "dev", "tether-c"])
            .unwrap();
        ns.set_sysctl("net.ipv4.ip_forward", "0").unwrap();
        let report = kernel.reconcile(&desired).await.unwrap();
        assert!(report.drift_detected);
        assert_clean(&report);
        // The address came back, and with it the kernel's prefix route; our table route stays.
        assert!(has_op(
            &report,
            |op| matches!(op, Op::AddRule(r) if r.table == 7700)
        ));
        assert!(has_op(
            &report,
            |op| matches!(op, Op::AddAddress(a) if a.dev == "tether-c")
        ));
        assert!(has_op(
            &report,
            |op| matches!(op, Op::SetSysctl(s) if s.key == "net/ipv4/ip_forward")
        ));

        let settled = kernel.reconcile(&desired).await.unwrap();
        assert!(
            settled.is_noop() && !settled.drift_detected,
            "{:?}",
            settled.applied
        );
    });
    assert_eq!(our_rules(&ns).len(), 3);
    assert_eq!(ns.sysctl("net.ipv4.ip_forward").unwrap(), "1");
}

#[test]
fn a_changed_plan_removes_what_it_no_longer_wants() {
    if !require_root_or_skip() {
        return;
    }
    let ns = gateway_ns("k-change", &["tether-b", "tether-c"]);
    let both = two_peers();
    let only_b = input(vec![peer(
        "cluster-b",
        "tether-b",
        "10.71.0.0/16",
        "169.254.18.1/30",
    )]);
    ns.run_async(|| async {
        let mut kernel = kernel(&both);
        assert_clean(&kernel.reconcile(&plan(&both)).await.unwrap());
        let report = kernel.reconcile(&plan(&only_b)).await.unwrap();
        assert_clean(&report);
        assert!(!report.drift_detected, "a new plan is not drift");
        assert!(has_op(
            &report,
            |op| matches!(op, Op::DelRule(r) if r.table == 7701)
        ));
        assert!(has_op(
            &report,
            |op| matches!(op, Op::DelRoute(r) if r.dev.as_deref() == Some("tether-c"))
        ));
        assert!(has_op(
            &report,
            |op| matches!(op, Op::DelAddress(a) if a.dev == "tether-c")
        ));
        assert!(has_op(&report, |op| matches!(op, Op::ReplaceRuleset(_))));
    });
    assert_eq!(
        our_rules(&ns).len(),
        2,
        "the fwmark rule of b and the local lookup"
    );
    assert!(routes_in(&ns, "7701").is_empty());
    let table = nft_table(&ns, "tether").unwrap();
    assert!(!table.contains("10.72.0.0/16"), "{table}");
}

#[test]
fn a_failing_route_is_named_and_retried() {
    if !require_root_or_skip() {
        return;
    }
    // tether-c does not exist yet: its gateway process has not created the TUN device.
    let ns = gateway_ns("k-retry", &["tether-b"]);
    let input = two_peers();
    let desired = plan(&input);
    ns.run_async(|| async {
        let mut kernel = kernel(&input);
        let report = kernel.reconcile(&desired).await.unwrap();
        assert!(!report.is_success());
        let failed: Vec<String> = report.failed.iter().map(|f| f.error.to_string()).collect();
        assert!(
            report.failed.iter().any(|f| matches!(
                (&f.op, &f.error),
                (Op::AddRoute(r), KernelError::NoSuchLink { interface, .. })
                    if r.dev.as_deref() == Some("tether-c") && interface == "tether-c"
            )),
            "{failed:#?}"
        );
        assert!(
            failed
                .iter()
                .any(|e| e.contains("10.0.0.0/16 dev tether-c")),
            "{failed:#?}"
        );
        // Peer b is not held back by peer c's missing device.
        assert!(has_op(
            &report,
            |op| matches!(op, Op::AddRoute(r) if r.dev.as_deref() == Some("tether-b"))
        ));
        assert!(has_op(&report, |op| matches!(op, Op::ReplaceRuleset(_))));

        ns.ip(&["tuntap", "add", "dev", "tether-c", "mode", "tun"])
            .unwrap();
        ns.ip(&["link", "set", "tether-c", "up"]).unwrap();
        let retry = kernel.reconcile(&desired).await.unwrap();
        assert_clean(&retry);
        assert!(
            !retry.drift_detected,
            "finishing a failed apply is not drift"
        );
        assert!(has_op(
            &retry,
            |op| matches!(op, Op::AddRoute(r) if r.dev.as_deref() == Some("tether-c"))
        ));
        assert!(kernel.reconcile(&desired).await.unwrap().is_noop());

        // The device goes away again: the kernel drops its route, the catch-all stays, and
        // reconciling neither duplicates it nor deletes it, only retries the device route.
        ns.ip(&["link", "del", "tether-c"]).unwrap();
        let table_c = routes_in(&ns, "7701");
        assert_eq!(table_c.len(), 1, "{table_c:#?}");
        assert!(
            table_c[0].starts_with("unreachable default"),
            "{table_c:#?}"
        );
        let report = kernel.reconcile(&desired).await.unwrap();
        assert!(report.applied.is_empty(), "{:?}", report.applied);
        // Only tether-c's own objects fail: its route, address and rp_filter sysctl.
        assert!(
            report
                .failed
                .iter()
                .all(|f| f.op.to_string().contains("tether-c")),
            "{:#?}",
            report.failed
        );
        assert!(
            report
                .failed
                .iter()
                .any(|f| matches!(&f.op, Op::AddRoute(r) if r.dev.as_deref() == Some("tether-c"))),
            "{:#?}",
            report.failed
        );
        assert_eq!(routes_in(&ns, "7701"), table_c);
        ns.ip(&["tuntap", "add", "dev", "tether-c", "mode", "tun"])
            .unwrap();
        ns.ip(&["link", "set", "tether-c", "up"]).unwrap();
        assert_clean(&kernel.reconcile(&desired).await.unwrap());
        assert!(kernel.reconcile(&desired).await.unwrap().is_noop());
    });
    assert_eq!(routes_in(&ns, "7701").len(), 2);
}

#[test]
fn a_plan_outside_our_ownership_changes_nothing() {
    if !require_root_or_skip() {
        return;
    }
    let ns = gateway_ns("k-owner", &["tether-b", "tether-c"]);
    let input = two_peers();
    let mut desired = plan(&input);
    desired.nft.table = "not_ours".to_owned();
    let mut foreign_rule = plan(&input);
    foreign_rule.rules[0].priority = 100;
    ns.run_async(|| async {
        let mut kernel = kernel(&input);
        let error = kernel.reconcile(&desired).await.unwrap_err();
        assert!(matches!(error, KernelError::NotOwned { .. }), "{error}");
        assert!(error.to_string().contains("not_ours"), "{error}");
        let error = kernel.reconcile(&foreign_rule).await.unwrap_err();
        assert!(error.to_string().contains("pref 100"), "{error}");
    });
    assert!(our_rules(&ns).is_empty());
    assert!(nft_table(&ns, "not_ours").is_none() && nft_table(&ns, "tether").is_none());
}

#[test]
fn teardown_after_restart_removes_everything_and_is_idempotent() {
    if !require_root_or_skip() {
        return;
    }
    let ns = gateway_ns("k-teardown", &["tether-b", "tether-c"]);
    let input = two_peers();
    let desired = plan(&input);
    ns.run_async(|| async {
        assert_clean(&kernel_reconcile(&input, &desired).await);
        // A new adapter (a restarted gateway) knows nothing but its ownership.
        let mut fresh = kernel(&input);
        let report = fresh.teardown().await.unwrap();
        assert_clean(&report);
        let deleted = |pred: fn(&Op) -> bool| report.applied.iter().filter(|op| pred(op)).count();
        assert_eq!(deleted(|op| matches!(op, Op::DeleteRuleset(_))), 1);
        // Two fwmark rules and our copy of the local lookup, after the original came back.
        assert_eq!(deleted(|op| matches!(op, Op::DelRule(_))), 3);
        assert_eq!(deleted(|op| matches!(op, Op::RestoreLocalRule)), 1);
        // A tunnel route and a catch-all per peer.
        assert_eq!(deleted(|op| matches!(op, Op::DelRoute(_))), 4);
        assert_eq!(deleted(|op| matches!(op, Op::DelAddress(_))), 2);
        let observed = fresh.observe(None).await.unwrap();
        assert_eq!(observed, tether_netplan::Observed::default());
        assert!(fresh.teardown().await.unwrap().is_noop());
    });
    assert!(our_rules(&ns).is_empty());
    assert!(nft_table(&ns, "tether").is_none());
}

#[test]
fn tunnel_devices_are_prepared() {
    if !require_root_or_skip() {
        return;
    }
    let ns = Netns::new("k-link").unwrap();
    ns.ip(&["tuntap", "add", "dev", "tether-b", "mode", "tun"])
        .unwrap();
    let input = two_peers();
    ns.run_async(|| async {
        let kernel = kernel(&input);
        let index = kernel
            .prepare_tunnel("tether-b", 1420, Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(kernel.link_index("tether-b").await.unwrap(), Some(index));
        assert_eq!(kernel.link_index("nope0").await.unwrap(), None);
        assert_eq!(
            kernel
                .sysctl("net/ipv6/conf/tether-b/disable_ipv6")
                .unwrap(),
            "1"
        );

        let started = tokio::time::Instant::now();
        let error = kernel
            .wait_for_link("nope0", Duration::from_millis(200))
            .await
            .unwrap_err();
        assert!(matches!(error, KernelError::LinkTimeout { .. }), "{error}");
        assert!(started.elapsed() >= Duration::from_millis(200));

        assert!(
            kernel
                .add_address("tether-b", net("169.254.20.1/30"))
                .await
                .unwrap()
        );
        assert!(
            !kernel
                .add_address("tether-b", net("169.254.20.1/30"))
                .await
                .unwrap(),
            "idempotent"
        );
        let error = kernel
            .add_address("nope0", net("169.254.21.1/30"))
            .await
            .unwrap_err();
        assert!(error.to_string().contains("nope0"), "{error}");

        let settings = LinkSettings {
            mtu: Some(1380),
            ..LinkSettings::default()
        };
        kernel.configure_link("tether-b", settings).await.unwrap();
    });
    let link = ns.ip(&["link", "show", "tether-b"]).unwrap();
    assert!(link.contains("mtu 1380"), "{link}");
    assert!(link.contains("qlen 5000"), "{link}");
    assert!(link.contains(",UP"), "{link}");
    let addrs = ns.ip(&["addr", "show", "dev", "tether-b"]).unwrap();
    assert!(
        addrs.contains("inet 169.254.20.1/30") && !addrs.contains("inet6"),
        "{addrs}"
    );
}

#[test]
fn the_run_loop_follows_the_desired_plan() {
    if !require_root_or_skip() {
        return;
    }
    let ns = gateway_ns("k-run", &["tether-b", "tether-c"]);
    let input = two_peers();
    let desired = plan(&input);
    ns.run_async(|| async {
        let (tx, rx) = tokio::sync::watch::channel(None);
        let (reports_tx, mut reports) = tokio::sync::mpsc::unbounded_channel();
        let runner = tokio::spawn(
            kernel(&input).run(rx, Duration::from_millis(100), move |r| {
                let summary = r
                    .map(|r| (r.applied.len(), r.drift_detected))
                    .map_err(|e| e.to_string());
                let _ = reports_tx.send(summary);
            }),
        );
        tx.send(Some(desired.clone())).unwrap();
        let mut next = async || {
            let report = tokio::time::timeout(Duration::from_secs(5), reports.recv()).await;
            report
                .expect("a report within 5 s")
                .expect("the loop is running")
                .unwrap()
        };
        let (applied, _) = next().await;
        assert!(applied > 0);
        // The periodic resync repairs drift without a new plan.
        ns.ip(&["route", "del", "10.0.0.0/16", "table", "7700"])
            .unwrap();
        // Resyncs every 100 ms: the repair must come within a few of them.
        let mut repaired = None;
        for _ in 0..30 {
            let (applied, drift) = next().await;
            if applied > 0 {
                repaired = Some(drift);
                break;
            }
        }
        let repaired = repaired.expect("a resync repaired the deleted route");
        assert!(repaired, "resync reported the drift it repaired");
        drop(tx);
        let mut kernel = runner.await.unwrap();
        assert_clean(&kernel.teardown().await.unwrap());
    });
    assert!(our_rules(&ns).is_empty());
}
