//! ExternalIPRemapping decisions (pure): which host of the external CIDR each IP object gets,
//! which IP objects are refused and why, and the list of addresses every gateway publishes.
//!
//! Hosts are handed out lowest first from host 3: host 0 (the network address), hosts 1 and 2
//! (the API server and the authentication Service, [`in_band`]) and the broadcast address are
//! never given. A host, once in an IP's status, stays with it while the object lives, even
//! when its address is refused later, so a peer's configuration that names it never points
//! at another address. Claims are taken in creation order, so when two objects ask for the
//! same address the older one keeps it.
//!
//! `spec.ip` is immutable once published, as upstream immutable fields are (the CRD says so
//! with a CEL rule, which API servers that do not evaluate CEL skip): a changed `spec.ip` is
//! refused and the host keeps standing for the address it was given for, because peers may
//! be talking to it, until the object is deleted and created again.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use tether_api::names::{in_band, network, objects};
use tether_api::networking::PublishedAddress;

/// The lowest host of the external CIDR an IP object can get.
pub const FIRST_HOST: u32 = in_band::AUTH_HOST + 1;

/// This cluster's networks, as the decisions need them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Networks {
    /// The external CIDR the hosts come from; `None` refuses every IP.
    pub external: Option<Ipv4Net>,
    /// Pod CIDRs: their addresses are reached directly.
    pub pod: Vec<Ipv4Net>,
    /// Service CIDRs: Services follow offloaded namespaces instead.
    pub service: Vec<Ipv4Net>,
}

/// One IP object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// `namespace/name`.
    pub key: String,
    /// `spec.ip` as written.
    pub ip: String,
    /// `status.ip` and `status.cidr`, when both are set.
    pub assigned: Option<(Ipv4Addr, Ipv4Net)>,
    /// `status.localIP`: the address the assigned host was published for.
    pub served: Option<String>,
    /// `metadata.creationTimestamp` as written (RFC 3339 sorts as text); the older claim wins.
    pub created: String,
}

/// What an IP object's status should say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Published as `external` (a host of `cidr`).
    Published {
        /// The host of the external CIDR.
        external: Ipv4Addr,
        /// The external CIDR.
        cidr: Ipv4Net,
        /// The local address it stands for (`spec.ip`).
        local: Ipv4Addr,
    },
    /// `spec.ip` changed after the host was published: the host stays published for the
    /// address it was given for, and the change is refused.
    Changed {
        /// The host of the external CIDR.
        external: Ipv4Addr,
        /// The external CIDR.
        cidr: Ipv4Net,
        /// The address it still stands for.
        local: Ipv4Addr,
        /// What is wrong and what to do.
        message: String,
    },
    /// Not published.
    Refused {
        /// A CamelCase reason for the `Ready` condition.
        reason: &'static str,
        /// What is wrong and what to do.
        message: String,
        /// The host it keeps (assigned earlier), if any.
        keep: Option<(Ipv4Addr, Ipv4Net)>,
    },
}

/// The decision for every claim, by key.
pub fn decide(networks: &Networks, claims: &[Claim]) -> BTreeMap<String, Decision> {
    let mut order: Vec<&Claim> = claims.iter().collect();
    order.sort_by(|a, b| (&a.created, &a.key).cmp(&(&b.created, &b.key)));
    let mut out = BTreeMap::new();
    let Some(cidr) = networks.external else {
        for c in order {
            let message = format!(
                "this cluster has no external CIDR (ConfigMap {} has no {}), so there is no \
                 address to publish {} under: run `tether install --external-cidr CIDR` again",
                objects::NETWORK_CONFIGMAP,
                network::EXTERNAL_CIDR,
                c.ip
            );
            out.insert(
                c.key.clone(),
                Decision::Refused {
                    reason: "NoExternalCIDR",
                    message,
                    keep: c.assigned,
                },
            );
        }
        return out;
    };

    // Hosts already in a status are kept first, whatever happens to their address.
    let mut taken: BTreeSet<Ipv4Addr> = BTreeSet::new();
    let mut held: BTreeMap<&str, Ipv4Addr> = BTreeMap::new();
    for c in &order {
        if let Some((addr, net)) = c.assigned
            && net == cidr
            && assignable(cidr, addr)
            && taken.insert(addr)
        {
            held.insert(&c.key, addr);
        }
    }

    let mut next = FIRST_HOST;
    let mut owners: BTreeMap<Ipv4Addr, &str> = BTreeMap::new();
    for c in order {
        let keep = held.get(c.key.as_str()).map(|a| (*a, cidr));
        let refuse = |reason, message| Decision::Refused {
            reason,
            message,
            keep,
        };
        // Only a host still held stands for an address; without one a new spec.ip is free.
        let served: Option<Ipv4Addr> = keep
            .and(c.served.as_deref())
            .and_then(|s| s.trim().parse().ok());
        let address = served.map_or_else(|| c.ip.clone(), |s| s.to_string());
        let decision = match check(networks, cidr, &address) {
            Err((reason, message)) => refuse(reason, message),
            Ok(real) => match owners.get(&real) {
                Some(owner) => refuse(
                    "AlreadyPublished",
                    format!(
                        "{real} is already published by IP {owner}: use that one and delete \
                         this IP"
                    ),
                ),
                None => {
                    let external = match keep {
                        Some((addr, _)) => Some(addr),
                        None => lowest_free(cidr, &mut next, &taken),
                    };
                    match external {
                        Some(external) => {
                            taken.insert(external);
                            owners.insert(real, &c.key);
                            if c.ip.trim().parse::<Ipv4Addr>().ok() == Some(real) {
                                Decision::Published {
                                    external,
                                    cidr,
                                    local: real,
                                }
                            } else {
                                Decision::Changed {
                                    external,
                                    cidr,
                                    local: real,
                                    message: changed_message(real, &c.ip, external, &c.key),
                                }
                            }
                        }
                        None => refuse(
                            "ExternalCIDRFull",
                            format!(
                                "every host of the external CIDR {cidr} is taken ({} IPs hold \
                                 one; hosts 1 and 2 are the control plane's): delete IPs that \
                                 are no longer needed, or reinstall with a larger `tether \
                                 install --external-cidr`",
                                taken.len()
                            ),
                        ),
                    }
                }
            },
        };
        out.insert(c.key.clone(), decision);
    }
    out
}

/// Whether `addr` is a host of `cidr` an IP object may hold.
fn assignable(cidr: Ipv4Net, addr: Ipv4Addr) -> bool {
    let host = u32::from(addr).wrapping_sub(u32::from(cidr.network()));
    cidr.contains(&addr) && host >= FIRST_HOST && addr != cidr.broadcast()
}

fn lowest_free(cidr: Ipv4Net, next: &mut u32, taken: &BTreeSet<Ipv4Addr>) -> Option<Ipv4Addr> {
    let size = 1u64 << (32 - u32::from(cidr.prefix_len()));
    while u64::from(*next) < size {
        let addr = Ipv4Addr::from(u32::from(cidr.network()) + *next);
        *next += 1;
        if assignable(cidr, addr) && !taken.contains(&addr) {
            return Some(addr);
        }
    }
    None
}

/// The address of `spec.ip`, or why it cannot be published and what to do.
fn check(
    networks: &Networks,
    external: Ipv4Net,
    text: &str,
) -> Result<Ipv4Addr, (&'static str, String)> {
    let ip: Ipv4Addr = text.trim().parse().map_err(|_| {
        (
            "InvalidAddress",
            format!("spec.ip {text:?} is not an IPv4 address: set it to the address to publish"),
        )
    })?;
    if ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() || ip.is_broadcast() {
        return Err((
            "InvalidAddress",
            format!(
                "spec.ip {ip} is not a unicast address another host can reach: set it to the \
                 address to publish"
            ),
        ));
    }
    if let Some(c) = networks.pod.iter().find(|c| c.contains(&ip)) {
        return Err((
            "InsidePodCIDR",
            format!(
                "spec.ip {ip} is inside this cluster's pod CIDR {c}: peers reach pods directly \
                 through the tunnel, so delete this IP, or set spec.ip to an address outside \
                 the cluster's CIDRs"
            ),
        ));
    }
    if let Some(c) = networks.service.iter().find(|c| c.contains(&ip)) {
        return Err((
            "InsideServiceCIDR",
            format!(
                "spec.ip {ip} is inside this cluster's Service CIDR {c}: Services follow \
                 offloaded namespaces to the peers; publish an address outside the cluster's \
                 CIDRs (an endpoint's), or delete this IP"
            ),
        ));
    }
    if external.contains(&ip) {
        return Err((
            "InsideExternalCIDR",
            format!(
                "spec.ip {ip} is inside the external CIDR {external}, whose hosts stand for \
                 published addresses: set spec.ip to the real address"
            ),
        ));
    }
    Ok(ip)
}

/// The `Ready` message of an IP whose `spec.ip` changed from `local` to `wanted`.
fn changed_message(local: Ipv4Addr, wanted: &str, external: Ipv4Addr, key: &str) -> String {
    let (ns, name) = key.split_once('/').unwrap_or(("", key));
    format!(
        "spec.ip is immutable: it was {local} when {external} was published for it, and {local} \
         stays published until this IP is deleted; to publish {wanted:?} instead, delete this IP \
         and create it again (`kubectl delete ip {name} -n {ns}`, then apply it with the new \
         spec.ip), or create another IP for it"
    )
}

/// The `Ready` message of a published IP.
pub fn published_message(real: &str, external: Ipv4Addr, cidr: Ipv4Net) -> String {
    let host = u32::from(external) - u32::from(cidr.network());
    format!(
        "{real} is published to every peer as {external} (host {host} of the external CIDR \
         {cidr}); a peer's pods reach it at host {host} of their view of this cluster's \
         external CIDR"
    )
}

/// One IP object as the published list reads it: its key, the local address its host stands
/// for, `status.ip`, `status.cidr`, and whether it is published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assigned {
    /// `namespace/name`.
    pub key: String,
    /// `status.localIP`, else `spec.ip` (statuses written before `localIP` existed).
    pub ip: String,
    /// `status.ip`.
    pub external: Option<String>,
    /// `status.cidr`.
    pub cidr: Option<String>,
    /// `Ready` is True, or False only because `spec.ip` changed.
    pub ready: bool,
}

/// What every gateway publishes: the Ready IPs whose host lies in the current external CIDR,
/// sorted by external address. An address or host that two objects claim at once (a status
/// not yet corrected) is left out rather than handed to the gateway, which would refuse the
/// whole list.
pub fn published(external: Option<Ipv4Net>, ips: &[Assigned]) -> Vec<PublishedAddress> {
    let Some(cidr) = external else {
        return Vec::new();
    };
    let mut candidates: Vec<(Ipv4Addr, Ipv4Addr, &str)> = ips
        .iter()
        .filter(|a| a.ready && a.cidr.as_deref() == Some(cidr.to_string().as_str()))
        .filter_map(|a| {
            let external: Ipv4Addr = a.external.as_deref()?.parse().ok()?;
            let real: Ipv4Addr = a.ip.trim().parse().ok()?;
            assignable(cidr, external).then_some((external, real, a.key.as_str()))
        })
        .collect();
    candidates.sort();
    let count = |f: &dyn Fn(&(Ipv4Addr, Ipv4Addr, &str)) -> Ipv4Addr, v: Ipv4Addr| {
        candidates.iter().filter(|c| f(c) == v).count()
    };
    candidates
        .iter()
        .filter(|c| count(&|x| x.0, c.0) == 1 && count(&|x| x.1, c.1) == 1)
        .map(|(external, real, key)| PublishedAddress {
            external: external.to_string(),
            ip: real.to_string(),
            source: Some((*key).to_owned()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    fn net(s: &str) -> Ipv4Net {
        s.parse().expect("test CIDR")
    }

    fn networks(external: &str) -> Networks {
        Networks {
            external: Some(net(external)),
            pod: vec![net("10.244.0.0/16")],
            service: vec![net("10.96.0.0/12")],
        }
    }

    fn claim(key: &str, ip: &str, created: &str) -> Claim {
        Claim {
            key: key.to_owned(),
            ip: ip.to_owned(),
            assigned: None,
            served: None,
            created: created.to_owned(),
        }
    }

    fn show(d: &BTreeMap<String, Decision>) -> String {
        d.iter()
            .map(|(k, d)| match d {
                Decision::Published {
                    external,
                    cidr,
                    local,
                } => format!("{k}: {external} of {cidr} for {local}\n"),
                Decision::Changed {
                    external,
                    cidr,
                    local,
                    message,
                } => format!("{k}: still {external} of {cidr} for {local}: {message}\n"),
                Decision::Refused {
                    reason,
                    message,
                    keep,
                } => format!(
                    "{k}: {reason} (keeps {}): {message}\n",
                    keep.map_or("nothing".to_owned(), |(a, _)| a.to_string())
                ),
            })
            .collect()
    }

    #[test]
    fn hosts_start_at_three_and_bad_addresses_say_what_to_do() {
        let claims = [
            claim("a/first", "192.168.1.10", "2026-01-01T00:00:01Z"),
            claim("a/second", "198.18.0.11", "2026-01-01T00:00:02Z"),
            claim("b/pod", "10.244.3.4", "2026-01-01T00:00:03Z"),
            claim("b/svc", "10.96.0.1", "2026-01-01T00:00:04Z"),
            claim("b/ext", "10.70.0.9", "2026-01-01T00:00:05Z"),
            claim("b/typo", "192.168.1", "2026-01-01T00:00:06Z"),
            claim("b/loop", "127.0.0.1", "2026-01-01T00:00:07Z"),
            claim("c/again", "192.168.1.10", "2026-01-01T00:00:08Z"),
        ];
        expect![[r#"
            a/first: 10.70.0.3 of 10.70.0.0/16 for 192.168.1.10
            a/second: 10.70.0.4 of 10.70.0.0/16 for 198.18.0.11
            b/ext: InsideExternalCIDR (keeps nothing): spec.ip 10.70.0.9 is inside the external CIDR 10.70.0.0/16, whose hosts stand for published addresses: set spec.ip to the real address
            b/loop: InvalidAddress (keeps nothing): spec.ip 127.0.0.1 is not a unicast address another host can reach: set it to the address to publish
            b/pod: InsidePodCIDR (keeps nothing): spec.ip 10.244.3.4 is inside this cluster's pod CIDR 10.244.0.0/16: peers reach pods directly through the tunnel, so delete this IP, or set spec.ip to an address outside the cluster's CIDRs
            b/svc: InsideServiceCIDR (keeps nothing): spec.ip 10.96.0.1 is inside this cluster's Service CIDR 10.96.0.0/12: Services follow offloaded namespaces to the peers; publish an address outside the cluster's CIDRs (an endpoint's), or delete this IP
            b/typo: InvalidAddress (keeps nothing): spec.ip "192.168.1" is not an IPv4 address: set it to the address to publish
            c/again: AlreadyPublished (keeps nothing): 192.168.1.10 is already published by IP a/first: use that one and delete this IP
        "#]]
        .assert_eq(&show(&decide(&networks("10.70.0.0/16"), &claims)));
    }

    #[test]
    fn an_assigned_host_never_moves_and_is_never_given_twice() {
        let cidr = net("10.70.0.0/16");
        let mut old = claim("a/old", "192.168.1.10", "2026-01-01T00:00:01Z");
        old.assigned = Some(("10.70.0.7".parse().expect("addr"), cidr));
        // A newer object whose status names the same host (a restored backup, say) loses it.
        let mut copy = claim("a/copy", "192.168.1.11", "2026-01-01T00:00:02Z");
        copy.assigned = old.assigned;
        // Hosts 1 and 2 are the control plane's: a status naming one is not honoured.
        let mut api = claim("a/api", "192.168.1.12", "2026-01-01T00:00:03Z");
        api.assigned = Some(("10.70.0.1".parse().expect("addr"), cidr));
        let new = claim("a/new", "192.168.1.13", "2026-01-01T00:00:04Z");
        let first = decide(&networks("10.70.0.0/16"), &[new, api, copy, old]);
        expect![[r#"
            a/api: 10.70.0.4 of 10.70.0.0/16 for 192.168.1.12
            a/copy: 10.70.0.3 of 10.70.0.0/16 for 192.168.1.11
            a/new: 10.70.0.5 of 10.70.0.0/16 for 192.168.1.13
            a/old: 10.70.0.7 of 10.70.0.0/16 for 192.168.1.10
        "#]]
        .assert_eq(&show(&first));
        // Later, its address refused: it keeps the host, and no new IP gets it.
        let mut old = claim("a/old", "10.244.0.9", "2026-01-01T00:00:01Z");
        old.assigned = Some(("10.70.0.7".parse().expect("addr"), cidr));
        let d = decide(
            &networks("10.70.0.0/16"),
            &[
                old,
                claim("b/x", "192.168.2.1", "2026-01-01T00:00:05Z"),
                claim("b/y", "192.168.2.2", "2026-01-01T00:00:06Z"),
                claim("b/z", "192.168.2.3", "2026-01-01T00:00:07Z"),
                claim("b/w", "192.168.2.4", "2026-01-01T00:00:08Z"),
                claim("b/v", "192.168.2.5", "2026-01-01T00:00:09Z"),
            ],
        );
        let hosts: Vec<String> = d
            .values()
            .filter_map(|d| match d {
                Decision::Published { external, .. } | Decision::Changed { external, .. } => {
                    Some(external.to_string())
                }
                Decision::Refused { keep, .. } => keep.map(|(a, _)| format!("kept {a}")),
            })
            .collect();
        assert_eq!(
            hosts,
            [
                "kept 10.70.0.7",
                "10.70.0.8",
                "10.70.0.6",
                "10.70.0.3",
                "10.70.0.4",
                "10.70.0.5"
            ]
        );
    }

    #[test]
    fn a_full_external_cidr_refuses_with_what_to_do_and_a_new_cidr_reassigns() {
        // A /29 has hosts 1 to 6; 1 and 2 are the control plane's, so four IPs fit.
        let claims: Vec<Claim> = (1..=5)
            .map(|i| {
                claim(
                    &format!("n/ip{i}"),
                    &format!("192.168.9.{i}"),
                    &format!("2026-01-01T00:00:0{i}Z"),
                )
            })
            .collect();
        let d = decide(&networks("10.70.0.0/29"), &claims);
        expect![[r#"
            n/ip1: 10.70.0.3 of 10.70.0.0/29 for 192.168.9.1
            n/ip2: 10.70.0.4 of 10.70.0.0/29 for 192.168.9.2
            n/ip3: 10.70.0.5 of 10.70.0.0/29 for 192.168.9.3
            n/ip4: 10.70.0.6 of 10.70.0.0/29 for 192.168.9.4
            n/ip5: ExternalCIDRFull (keeps nothing): every host of the external CIDR 10.70.0.0/29 is taken (4 IPs hold one; hosts 1 and 2 are the control plane's): delete IPs that are no longer needed, or reinstall with a larger `tether install --external-cidr`
        "#]]
        .assert_eq(&show(&d));
        // A host of an external CIDR no longer in use is not kept.
        let mut moved = claim("n/ip1", "192.168.9.1", "2026-01-01T00:00:01Z");
        moved.assigned = Some(("10.70.0.3".parse().expect("addr"), net("10.70.0.0/29")));
        let d = decide(&networks("10.77.0.0/24"), &[moved]);
        assert_eq!(
            show(&d),
            "n/ip1: 10.77.0.3 of 10.77.0.0/24 for 192.168.9.1\n"
        );
        let none = Networks {
            external: None,
            ..networks("10.70.0.0/16")
        };
        let d = show(&decide(&none, &claims[..1]));
        assert!(
            d.contains("NoExternalCIDR") && d.contains("tether install --external-cidr"),
            "{d}"
        );
    }

    #[test]
    fn a_changed_address_is_refused_and_the_host_keeps_standing_for_the_old_one() {
        let cidr = net("10.70.0.0/16");
        let host = "10.70.0.7".parse().expect("addr");
        let mut moved = claim("a/db", "192.168.1.20", "2026-01-01T00:00:01Z");
        moved.assigned = Some((host, cidr));
        moved.served = Some("192.168.1.10".to_owned());
        // The new address is free for another object, which gets its own host.
        let other = claim("a/other", "192.168.1.20", "2026-01-01T00:00:02Z");
        // The old address stays taken: another object asking for it is refused.
        let thief = claim("a/thief", "192.168.1.10", "2026-01-01T00:00:03Z");
        let d = decide(&networks("10.70.0.0/16"), &[moved.clone(), other, thief]);
        expect![[r#"
            a/db: still 10.70.0.7 of 10.70.0.0/16 for 192.168.1.10: spec.ip is immutable: it was 192.168.1.10 when 10.70.0.7 was published for it, and 192.168.1.10 stays published until this IP is deleted; to publish "192.168.1.20" instead, delete this IP and create it again (`kubectl delete ip db -n a`, then apply it with the new spec.ip), or create another IP for it
            a/other: 10.70.0.3 of 10.70.0.0/16 for 192.168.1.20
            a/thief: AlreadyPublished (keeps nothing): 192.168.1.10 is already published by IP a/db: use that one and delete this IP
        "#]]
        .assert_eq(&show(&d));
        // Changed back, it is published again as before; the same text written differently
        // is no change.
        for same in ["192.168.1.10", " 192.168.1.10"] {
            let mut back = moved.clone();
            back.ip = same.to_owned();
            let d = decide(&networks("10.70.0.0/16"), &[back]);
            assert_eq!(
                show(&d),
                "a/db: 10.70.0.7 of 10.70.0.0/16 for 192.168.1.10\n"
            );
        }
        // A host lost with its external CIDR stands for nothing: the new address is taken.
        let d = decide(&networks("10.77.0.0/24"), &[moved.clone()]);
        assert_eq!(
            show(&d),
            "a/db: 10.77.0.3 of 10.77.0.0/24 for 192.168.1.20\n"
        );
        // A status without localIP (written before it existed) serves spec.ip.
        let mut legacy = moved;
        legacy.served = None;
        let d = decide(&networks("10.70.0.0/16"), &[legacy]);
        assert_eq!(
            show(&d),
            "a/db: 10.70.0.7 of 10.70.0.0/16 for 192.168.1.20\n"
        );
    }

    fn assigned(key: &str, ip: &str, external: &str, cidr: &str, ready: bool) -> Assigned {
        Assigned {
            key: key.to_owned(),
            ip: ip.to_owned(),
            external: Some(external.to_owned()),
            cidr: Some(cidr.to_owned()),
            ready,
        }
    }

    #[test]
    fn the_published_list_holds_ready_unambiguous_hosts_of_the_current_cidr() {
        let list = published(
            Some(net("10.70.0.0/16")),
            &[
                assigned("a/b", "192.168.1.11", "10.70.0.4", "10.70.0.0/16", true),
                assigned("a/a", "192.168.1.10", "10.70.0.3", "10.70.0.0/16", true),
                assigned(
                    "a/refused",
                    "10.244.0.1",
                    "10.70.0.5",
                    "10.70.0.0/16",
                    false,
                ),
                assigned("a/stale", "192.168.1.12", "10.71.0.3", "10.71.0.0/16", true),
                assigned("a/api", "192.168.1.13", "10.70.0.1", "10.70.0.0/16", true),
                assigned("a/twin1", "192.168.1.14", "10.70.0.9", "10.70.0.0/16", true),
                assigned("a/twin2", "192.168.1.15", "10.70.0.9", "10.70.0.0/16", true),
            ],
        );
        let shown: Vec<String> = list
            .iter()
            .map(|p| format!("{} -> {} ({:?})", p.external, p.ip, p.source))
            .collect();
        assert_eq!(
            shown,
            [
                "10.70.0.3 -> 192.168.1.10 (Some(\"a/a\"))",
                "10.70.0.4 -> 192.168.1.11 (Some(\"a/b\"))"
            ]
        );
        assert!(published(None, &[]).is_empty());
    }
}
