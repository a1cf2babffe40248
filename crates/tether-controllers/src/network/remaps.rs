//! Which CIDR this cluster uses for each peer's CIDRs (pure): persisted remaps are kept as
//! they are, new peers get theirs from tether-ipam. Live traffic depends on a remap, so one is
//! never moved while its peering lives.

use std::collections::BTreeMap;

use ipnet::Ipv4Net;
use tether_ipam::{CidrKind, Ipam, IpamConfig, IpamError, IpamState, Mapping};

use super::local::LocalNetwork;

/// One peer's real CIDRs and the local views persisted for them earlier, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The peer's cluster ID.
    pub peer: String,
    /// The peer's real pod CIDRs (exactly one is supported).
    pub pod: Vec<Ipv4Net>,
    /// The peer's real external CIDR.
    pub external: Option<Ipv4Net>,
    /// Local views recorded in the status: pod, then external.
    pub persisted: Option<Views>,
}

/// How this cluster addresses one peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Views {
    /// The local view of the peer's pod CIDR.
    pub pod: Ipv4Net,
    /// The local view of the peer's external CIDR.
    pub external: Option<Ipv4Net>,
}

/// The local views of every peer, or why a peer has none. Deterministic: peers are taken in
/// ID order, persisted views first.
pub fn plan(local: &LocalNetwork, requests: &[Request]) -> BTreeMap<String, Result<Views, String>> {
    let mut out = BTreeMap::new();
    let config = IpamConfig {
        pools: match local.remap_pool {
            Some(pool) => vec![pool],
            None => IpamConfig::rfc1918_pools(),
        },
        reserved: local.reserved(),
    };
    let mut ipam = match Ipam::new(config) {
        Ok(i) => i,
        Err(e) => {
            for r in requests {
                out.insert(
                    r.peer.clone(),
                    Err(format!("this cluster's CIDRs are unusable: {e}")),
                );
            }
            return out;
        }
    };
    let mut sorted: Vec<&Request> = requests.iter().collect();
    sorted.sort_by(|a, b| a.peer.cmp(&b.peer));
    let mut fresh = Vec::new();
    for r in &sorted {
        let real_pod = match r.pod.as_slice() {
            [one] => *one,
            [] => {
                out.insert(r.peer.clone(), Err("the peer announced no pod CIDR".into()));
                continue;
            }
            _ => {
                out.insert(
                    r.peer.clone(),
                    Err(format!(
                        "the peer announced {} pod CIDRs; Tether supports one per cluster",
                        r.pod.len()
                    )),
                );
                continue;
            }
        };
        match r.persisted.and_then(|v| restore(&ipam, r, real_pod, v)) {
            Some(next) => {
                ipam = next;
                out.insert(r.peer.clone(), Ok(r.persisted.expect("restored from it")));
            }
            None => fresh.push((*r, real_pod)),
        }
    }
    for (r, real_pod) in fresh {
        let mut attempt = ipam.clone();
        let mut map = |kind, real| {
            attempt
                .map_peer_cidr(&r.peer, kind, real)
                .map_err(|e| match e {
                    IpamError::Exhausted { prefix_len, .. } => {
                        exhausted(local.remap_pool, kind, real, prefix_len)
                    }
                    other => other.to_string(),
                })
        };
        let result = map(CidrKind::Pod, real_pod).and_then(|pod| {
            let external = r.external.map(|e| map(CidrKind::External, e)).transpose()?;
            Ok(Views {
                pod: pod.local_view,
                external: external.map(|m| m.local_view),
            })
        });
        match result {
            Ok(views) => {
                ipam = attempt;
                out.insert(r.peer.clone(), Ok(views));
            }
            Err(e) => {
                out.insert(r.peer.clone(), Err(format!("no local view available: {e}")));
            }
        }
    }
    out
}

/// Why a colliding peer CIDR found no block, naming the pool and how to widen it.
fn exhausted(pool: Option<Ipv4Net>, kind: CidrKind, real: Ipv4Net, prefix_len: u8) -> String {
    let need = format!(
        "the peer's {kind} CIDR {real} collides with this cluster's CIDRs or another peer's view, \
         so it needs a free /{prefix_len} block"
    );
    match pool {
        Some(pool) if pool.prefix_len() > prefix_len => format!(
            "remap pool {pool} is exhausted: {need}, and the pool is smaller than that; widen it \
             with `tether install --remap-pool CIDR` (a /{prefix_len} or larger)"
        ),
        Some(pool) => format!(
            "remap pool {pool} is exhausted: {need}, and other peers hold every such block; \
             widen it with `tether install --remap-pool CIDR` or unpeer a cluster"
        ),
        None => format!(
            "the default remap pool (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, minus this \
             cluster's CIDRs) is exhausted: {need}, and none is left; set a separate pool with \
             `tether install --remap-pool CIDR` or unpeer a cluster"
        ),
    }
}

/// The IPAM with `r`'s persisted views added, if they still fit: same real CIDRs, same sizes,
/// no overlap with this cluster or another peer.
fn restore(ipam: &Ipam, r: &Request, real_pod: Ipv4Net, views: Views) -> Option<Ipam> {
    if views.external.is_some() != r.external.is_some() {
        return None;
    }
    let mut state: IpamState = ipam.state();
    state.mappings.push(Mapping {
        peer: r.peer.clone(),
        kind: CidrKind::Pod,
        real: real_pod,
        local_view: views.pod,
    });
    if let (Some(real), Some(view)) = (r.external, views.external) {
        state.mappings.push(Mapping {
            peer: r.peer.clone(),
            kind: CidrKind::External,
            real,
            local_view: view,
        });
    }
    state.mappings.sort();
    Ipam::restore(ipam.config().clone(), &state).ok()
}

#[cfg(test)]
mod tests {
    use std::fmt::Write;

    use expect_test::expect;
    use proptest::prelude::*;

    use super::*;

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    fn local() -> LocalNetwork {
        LocalNetwork {
            pod: vec![net("10.244.0.0/16")],
            service: vec![net("10.96.0.0/12")],
            external: None,
            remap_pool: None,
        }
    }

    fn req(peer: &str, pod: &[&str], persisted: Option<&str>) -> Request {
        Request {
            peer: peer.into(),
            pod: pod.iter().map(|p| net(p)).collect(),
            external: None,
            persisted: persisted.map(|p| Views {
                pod: net(p),
                external: None,
            }),
        }
    }

    fn show(plan: &BTreeMap<String, Result<Views, String>>) -> String {
        let mut s = String::new();
        for (peer, r) in plan {
            match r {
                Ok(v) => writeln!(s, "{peer}: {}", v.pod).unwrap(),
                Err(e) => writeln!(s, "{peer}: error: {e}").unwrap(),
            }
        }
        s
    }

    #[test]
    fn overlapping_peers_get_distinct_blocks_and_persisted_ones_stay() {
        let cases = [
            (
                "two peers on the same CIDR as ours",
                vec![
                    req("b", &["10.244.0.0/16"], None),
                    req("a", &["10.244.0.0/16"], None),
                ],
            ),
            (
                "a free CIDR is kept as it is",
                vec![req("a", &["172.20.0.0/16"], None)],
            ),
            (
                "a persisted remap survives even where a lower block is free",
                vec![
                    req("a", &["10.244.0.0/16"], Some("10.7.0.0/16")),
                    req("b", &["10.244.0.0/16"], None),
                ],
            ),
            (
                "a persisted remap that now overlaps ours is replaced",
                vec![req("a", &["10.244.0.0/16"], Some("10.244.0.0/16"))],
            ),
            (
                "bad announcements",
                vec![
                    req("a", &[], None),
                    req("b", &["10.1.0.0/16", "10.2.0.0/16"], None),
                ],
            ),
        ];
        let mut out = String::new();
        for (name, requests) in cases {
            writeln!(out, "## {name}\n{}", show(&plan(&local(), &requests))).unwrap();
        }
        expect![[r#"
            ## two peers on the same CIDR as ours
            a: 10.0.0.0/16
            b: 10.1.0.0/16

            ## a free CIDR is kept as it is
            a: 172.20.0.0/16

            ## a persisted remap survives even where a lower block is free
            a: 10.7.0.0/16
            b: 10.0.0.0/16

            ## a persisted remap that now overlaps ours is replaced
            a: 10.0.0.0/16

            ## bad announcements
            a: error: the peer announced no pod CIDR
            b: error: the peer announced 2 pod CIDRs; Tether supports one per cluster

        "#]]
        .assert_eq(&out);
    }

    #[test]
    fn an_exhausted_pool_is_an_error_for_that_peer_only() {
        // /10 blocks of 10.0.0.0/8: ours (10.244/16) and the Services (10.96/12) take two of
        // the four, and 172.16/12 and 192.168/16 are too small, so the third peer gets none.
        let requests = vec![
            req("a", &["10.0.0.0/10"], None),
            req("b", &["10.0.0.0/10"], None),
            req("c", &["10.0.0.0/10"], None),
        ];
        let out = plan(&local(), &requests);
        assert_eq!(out["a"].as_ref().unwrap().pod, net("10.0.0.0/10"));
        assert_eq!(out["b"].as_ref().unwrap().pod, net("10.128.0.0/10"));
        let err = out["c"].as_ref().unwrap_err();
        assert!(err.contains("no local view available"), "{err}");
    }

    #[test]
    fn a_configured_pool_is_the_only_source_and_its_exhaustion_says_how_to_widen_it() {
        let pooled = |pool: &str| LocalNetwork {
            remap_pool: Some(net(pool)),
            ..local()
        };
        // Two /16 in a /15; the third colliding peer finds none; a peer that collides with
        // nothing keeps its CIDR whatever the pool.
        let requests = vec![
            req("a", &["10.244.0.0/16"], None),
            req("b", &["10.244.0.0/16"], None),
            req("c", &["10.244.0.0/16"], None),
            req("d", &["172.20.0.0/16"], None),
        ];
        let out = plan(&pooled("100.64.0.0/15"), &requests);
        assert_eq!(out["a"].as_ref().unwrap().pod, net("100.64.0.0/16"));
        assert_eq!(out["b"].as_ref().unwrap().pod, net("100.65.0.0/16"));
        assert_eq!(out["d"].as_ref().unwrap().pod, net("172.20.0.0/16"));
        let err = out["c"].as_ref().unwrap_err();
        for want in [
            "remap pool 100.64.0.0/15 is exhausted",
            "pod CIDR 10.244.0.0/16",
            "other peers hold every such block",
            "--remap-pool",
        ] {
            assert!(err.contains(want), "{want:?} in {err}");
        }
        // A pool smaller than the peer's CIDR can never hold it.
        let out = plan(&pooled("100.64.0.0/17"), &requests[..1]);
        let err = out["a"].as_ref().unwrap_err();
        for want in [
            "remap pool 100.64.0.0/17 is exhausted",
            "smaller than that",
            "--remap-pool CIDR` (a /16 or larger)",
        ] {
            assert!(err.contains(want), "{want:?} in {err}");
        }
    }

    proptest! {
        #[test]
        fn views_never_overlap_each_other_or_ours(
            prefixes in proptest::collection::vec(12u8..=24, 1..12),
            persisted_first in any::<bool>(),
        ) {
            let requests: Vec<Request> = prefixes
                .iter()
                .enumerate()
                .map(|(i, p)| req(&format!("p{i}"), &[&format!("10.0.0.0/{p}")], None))
                .collect();
            let first = plan(&local(), &requests);
            // Feeding the answers back as persisted state changes nothing.
            let again: Vec<Request> = requests
                .iter()
                .map(|r| Request {
                    persisted: first[&r.peer].as_ref().ok().copied().filter(|_| persisted_first),
                    ..r.clone()
                })
                .collect();
            let second = plan(&local(), &again);
            prop_assert_eq!(&first, &second);
            let views: Vec<Ipv4Net> = first.values().filter_map(|r| r.as_ref().ok()).map(|v| v.pod).collect();
            for (i, a) in views.iter().enumerate() {
                for r in local().reserved() {
                    prop_assert!(!a.contains(&r.network()) && !r.contains(&a.network()));
                }
                for b in &views[i + 1..] {
                    prop_assert!(!a.contains(&b.network()) && !b.contains(&a.network()));
                }
            }
        }
    }
}
