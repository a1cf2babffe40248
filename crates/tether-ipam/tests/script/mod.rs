//! A tiny command language for IPAM tests, so allocation sequences read as data:
//! `pools`, `reserved`, `map <peer> <pod|external> <cidr>`, `external <len>`,
//! `claim-external <cidr>`, `external-ip <owner>`, `release-ip <owner>`, `unknown-source`,
//! `release <peer> [kind]`, `release-external`, `state`, `restore`.

#![allow(dead_code, unreachable_pub)]

use std::fmt::Write as _;

use ipnet::Ipv4Net;
use tether_ipam::{CidrKind, Ipam, IpamConfig, IpamState};

pub fn net(text: &str) -> Ipv4Net {
    text.parse()
        .unwrap_or_else(|_| panic!("bad CIDR literal {text:?}"))
}

fn kind(text: &str) -> CidrKind {
    match text {
        "pod" => CidrKind::Pod,
        "external" => CidrKind::External,
        other => panic!("unknown kind {other:?}"),
    }
}

/// Runs the script and returns one line per command with its outcome.
pub fn run(script: &str) -> String {
    let mut config = IpamConfig::default();
    let mut ipam: Option<Ipam> = None;
    let mut out = String::new();
    for line in script
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let words: Vec<&str> = line.split_whitespace().collect();
        if let ["pools", pools @ ..] = words.as_slice() {
            config.pools = pools.iter().map(|p| net(p)).collect();
            continue;
        }
        if let ["reserved", reserved @ ..] = words.as_slice() {
            config.reserved = reserved.iter().map(|p| net(p)).collect();
            continue;
        }
        if ipam.is_none() {
            match Ipam::new(config.clone()) {
                Ok(fresh) => ipam = Some(fresh),
                Err(error) => {
                    let _ = writeln!(out, "new: error: {error}");
                    return out;
                }
            }
        }
        let ipam = ipam.as_mut().expect("created above");
        let result = match words.as_slice() {
            ["map", peer, k, cidr] => {
                // `''` stands for the empty peer name.
                let peer = if *peer == "''" { "" } else { peer };
                ipam.map_peer_cidr(peer, kind(k), net(cidr))
                    .map(|m| m.to_string())
            }
            ["external", len] => ipam
                .allocate_external(len.parse().expect("prefix length"))
                .map(|n| n.to_string()),
            ["claim-external", cidr] => ipam.claim_external(net(cidr)).map(|n| n.to_string()),
            ["release", peer] => Ok(format!("released {}", ipam.release_peer(peer).len())),
            ["release", peer, k] => Ok(format!(
                "released {}",
                ipam.release(peer, kind(k)).map_or(0, |_| 1)
            )),
            ["external-ip", owner] => ipam.allocate_external_ip(owner).map(|a| a.to_string()),
            ["release-ip", owner] => Ok(format!("released {:?}", ipam.release_external_ip(owner))),
            ["unknown-source"] => Ok(format!("{:?}", ipam.unknown_source_ip())),
            ["release-external"] => Ok(format!("released {:?}", ipam.release_external())),
            ["state"] => Ok(format_state(&ipam.state())),
            ["restore"] => {
                let state = ipam.state();
                Ipam::restore(ipam.config().clone(), &state).map(|restored| {
                    let same = restored == *ipam;
                    format!("restored, identical: {same}")
                })
            }
            _ => panic!("unknown command {line:?}"),
        };
        let _ = match result {
            Ok(text) => writeln!(out, "{line}: {text}"),
            Err(error) => writeln!(out, "{line}: error: {error}"),
        };
    }
    out
}

fn format_state(state: &IpamState) -> String {
    let mut parts: Vec<String> = state.mappings.iter().map(ToString::to_string).collect();
    if let Some(external) = state.external {
        parts.push(format!("external {external}"));
    }
    for ip in &state.external_ips {
        parts.push(format!("ip {} {}", ip.owner, ip.address));
    }
    format!("[{}]", parts.join("; "))
}
