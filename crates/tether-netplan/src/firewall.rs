//! The nftables half of the plan: which rules implement the per-peer zones, guards, marks,
//! prefix NAT, published addresses and MSS clamping (the packet walk is in the crate docs).

use std::fmt;

use ipnet::Ipv4Net;

use crate::nft::{Chain, ChainKind, Hook, NftRule, Priority, Ruleset};
use crate::plan::peer_mappings;
use crate::{CidrMapping, GatewayInput, PeerInput};

/// Rules collected per chain while walking the peers, in chain order.
#[derive(Default)]
struct Rules {
    zone: Vec<NftRule>,
    guard: Vec<NftRule>,
    restore: Vec<NftRule>,
    classify: Vec<NftRule>,
    dstnat: Vec<NftRule>,
    srcnat: Vec<NftRule>,
}

/// Matchers shared by every peer's rules.
struct Context<'a> {
    input: &'a GatewayInput,
    /// Matches local traffic: the pod interfaces, or anything that is not a tunnel.
    from_local: String,
    /// Our pod and external CIDRs: what peers may address.
    local_destinations: Vec<Ipv4Net>,
}

/// Builds our table from a validated input.
pub(crate) fn ruleset(input: &GatewayInput) -> Ruleset {
    if input.peers.is_empty() {
        return Ruleset::empty(input.table.clone());
    }
    let tunnels = nft_set(input.peers.iter().map(|peer| quoted(&peer.interface)));
    let from_local = if input.pod_interfaces.is_empty() {
        format!("iifname != {tunnels}")
    } else {
        let mut names: Vec<String> = input.pod_interfaces.iter().map(|n| quoted(n)).collect();
        names.sort();
        format!("iifname {}", nft_set(names))
    };
    let mut local_destinations = input.local.pod_cidrs.clone();
    local_destinations.extend(input.local.external_cidr);
    let context = Context {
        input,
        from_local,
        local_destinations,
    };

    let mut rules = Rules::default();
    for (index, peer) in input.peers.iter().enumerate() {
        peer_rules(&context, index, peer, &mut rules);
    }
    ip_mapping_rules(input, &tunnels, &context.from_local, &mut rules);
    unknown_source_rule(input, &tunnels, &context.from_local, &mut rules);

    let mut prerouting = rules.guard;
    prerouting.extend(rules.restore);
    prerouting.extend(rules.classify);
    let chains = [
        chain(
            "zone",
            ChainKind::Filter,
            Hook::Prerouting,
            Priority::Raw,
            rules.zone,
        ),
        chain(
            "prerouting",
            ChainKind::Filter,
            Hook::Prerouting,
            Priority::Mangle,
            prerouting,
        ),
        chain(
            "dstnat",
            ChainKind::Nat,
            Hook::Prerouting,
            Priority::Dstnat,
            rules.dstnat,
        ),
        chain(
            "forward",
            ChainKind::Filter,
            Hook::Forward,
            Priority::Filter,
            mss_clamp(input, &tunnels),
        ),
        chain(
            "srcnat",
            ChainKind::Nat,
            Hook::Postrouting,
            Priority::Srcnat,
            rules.srcnat,
        ),
    ];
    Ruleset {
        table: input.table.clone(),
        // A chain without rules would only cost a hook traversal per packet.
        chains: chains
            .into_iter()
            .filter(|chain| !chain.rules.is_empty())
            .collect(),
    }
}

fn chain(
    name: &str,
    kind: ChainKind,
    hook: Hook,
    priority: Priority,
    rules: Vec<NftRule>,
) -> Chain {
    Chain {
        name: name.to_owned(),
        kind,
        hook,
        priority,
        rules,
    }
}

fn peer_rules(context: &Context<'_>, index: usize, peer: &PeerInput, rules: &mut Rules) {
    let input = context.input;
    let from_local = &context.from_local;
    let id = &peer.id;
    let mask = input.fwmark_mask;
    let mark = input.peer_mark(index);
    let iif = format!("iifname {}", quoted(&peer.interface));
    let mut views: Vec<Ipv4Net> = peer_mappings(peer).map(|m| m.local_view).collect();
    views.sort();
    let views = nft_set(&views);

    // Peers may share real CIDRs, so two peers' connections can have identical tuples (same
    // pod addresses and ports). A conntrack zone per peer keeps them apart; it is chosen the
    // same way in both directions (in from the tunnel, or addressed to the peer's views).
    let zone = index + 1;
    let zone_comment = format!("peer {id}: own conntrack zone");
    rules.zone.push(NftRule::new(
        format!("{iif} ct zone set {zone}"),
        &zone_comment,
    ));
    rules.zone.push(NftRule::new(
        format!("{from_local} ip daddr {views} ct zone set {zone}"),
        zone_comment,
    ));

    // The tunnel is authenticated, but boringtun does not check inner addresses: accept only
    // the peer's own CIDRs (and tunnel network), and only towards what we publish.
    let mut sources: Vec<Ipv4Net> = peer_mappings(peer).map(|m| m.real).collect();
    sources.extend(peer.tunnel_address.map(|address| address.trunc()));
    sources.sort();
    rules.guard.push(NftRule::new(
        format!("{iif} ip saddr != {} counter drop", nft_set(&sources)),
        format!("peer {id}: source outside its CIDRs"),
    ));
    let mut destinations = context.local_destinations.clone();
    destinations.extend(
        peer.tunnel_address
            .map(|address| Ipv4Net::from(address.addr())),
    );
    destinations.sort();
    rules.guard.push(NftRule::new(
        format!("{iif} ip daddr != {} counter drop", nft_set(&destinations)),
        format!("peer {id}: destination outside local CIDRs"),
    ));
    // Only the conntrack mark: a meta mark on incoming packets would route them by the peer's
    // table, and the peer's real CIDR may be our own pod CIDR.
    rules.guard.push(NftRule::new(
        format!("{iif} {}", set_mark("ct", mark, mask)),
        format!("peer {id}: remember the peer of this connection"),
    ));

    rules.restore.push(NftRule::new(
        format!(
            "{from_local} ct mark and {mask:#x} == {mark:#x} {}",
            set_mark("meta", mark, mask)
        ),
        format!("peer {id}: replies follow their connection"),
    ));
    rules.classify.push(NftRule::new(
        format!(
            "{from_local} ip daddr {views} {} {}",
            set_mark("meta", mark, mask),
            set_mark("ct", mark, mask)
        ),
        format!("peer {id}: to the peer"),
    ));

    for CidrMapping { real, local_view } in peer_mappings(peer).filter(CidrMapping::is_remapped) {
        rules.dstnat.push(NftRule::new(
            format!(
                "meta mark and {mask:#x} == {mark:#x} ip daddr {local_view} \
                 dnat ip prefix to ip daddr map {{ {local_view} : {real} }}"
            ),
            format!("peer {id}: local view to real"),
        ));
        rules.srcnat.push(NftRule::new(
            format!(
                "{iif} ip saddr {real} snat ip prefix to ip saddr map {{ {real} : {local_view} }}"
            ),
            format!("peer {id}: real to local view"),
        ));
    }
}

/// DNAT for peers connecting to a published address, SNAT for connections it opens to peers.
fn ip_mapping_rules(input: &GatewayInput, tunnels: &str, from_local: &str, rules: &mut Rules) {
    if input.ip_mappings.is_empty() {
        return;
    }
    let mut mappings = input.ip_mappings.clone();
    mappings.sort();
    let externals = nft_set(mappings.iter().map(|m| m.external));
    let reals = nft_set(mappings.iter().map(|m| m.real));
    let to_real: Vec<String> = mappings
        .iter()
        .map(|m| format!("{} : {}", m.external, m.real))
        .collect();
    let to_external: Vec<String> = mappings
        .iter()
        .map(|m| format!("{} : {}", m.real, m.external))
        .collect();
    // Conntrack zones for connections with a published address. One a peer opens gets the
    // peer's zone in the original direction only: its replies come back addressed to the
    // gateway itself (see the masquerade below), which tells no peer apart, so they are looked
    // up in the default zone. One a published address opens stays in the default zone both
    // ways, so that its replies, arriving with the published address as destination like a
    // peer's new connection, are found through the reply-direction lookup. Before the
    // per-peer rules, which would otherwise set the zone both ways.
    let mut zone_rules = vec![NftRule::new(
        format!("{from_local} ip saddr {reals} return"),
        "published address: its own connections in the default zone",
    )];
    for (index, peer) in input.peers.iter().enumerate() {
        zone_rules.push(NftRule::new(
            format!(
                "iifname {} ip daddr {externals} ct original zone set {} return",
                quoted(&peer.interface),
                index + 1
            ),
            format!("peer {}: to a published address, own zone one way", peer.id),
        ));
    }
    rules.zone.splice(0..0, zone_rules);
    rules.dstnat.push(NftRule::new(
        format!(
            "iifname {tunnels} ip daddr {externals} dnat ip to ip daddr map {{ {} }}",
            to_real.join(", ")
        ),
        "external IP to local address",
    ));
    // The one deliberate masquerade: the real address may be outside the pod network (the
    // API server is) and the peer's source may equal a local pod address, so replies would
    // not find their way back. Before the per-peer prefix SNAT, which would otherwise match.
    rules.srcnat.insert(
        0,
        NftRule::new(
            format!("iifname {tunnels} ip daddr {reals} ct status dnat masquerade"),
            "published address: replies return through the gateway",
        ),
    );
    rules.srcnat.push(NftRule::new(
        format!(
            "oifname {tunnels} ip saddr {reals} snat ip to ip saddr map {{ {} }}",
            to_external.join(", ")
        ),
        "local address to external IP",
    ));
}

/// Local traffic towards a peer whose source is neither a pod nor a published address (a node
/// forwarding a NodePort or LoadBalancer connection it masqueraded to its own address, a
/// host-network pod) leaves with the network address of our external CIDR as its source,
/// the unknown-source address: the peer accepts only our pod and external CIDRs as sources
/// and routes only those back to its gateway. Replies come back to that address through the
/// tunnel, and conntrack takes them back to the real source. Last in the chain, so pod
/// traffic and published addresses keep their own translations. No external CIDR, no rule:
/// such traffic is then dropped by the peer.
fn unknown_source_rule(input: &GatewayInput, tunnels: &str, from_local: &str, rules: &mut Rules) {
    let Some(external) = input.local.external_cidr else {
        return;
    };
    let mut own: Vec<Ipv4Net> = input.local.pod_cidrs.clone();
    own.push(external);
    own.sort();
    rules.srcnat.push(NftRule::new(
        format!(
            "{from_local} oifname {tunnels} ip saddr != {} snat ip to {}",
            nft_set(&own),
            external.network()
        ),
        "other local sources to the unknown-source address",
    ));
}

/// Lowers the MSS of SYN and SYN/ACK segments crossing a tunnel to MTU − 40 (IPv4 + TCP
/// headers), so no TCP segment needs fragmenting inside the tunnel.
fn mss_clamp(input: &GatewayInput, tunnels: &str) -> Vec<NftRule> {
    let mss = input.mtu - 40;
    ["iifname", "oifname"]
        .into_iter()
        .map(|direction| {
            NftRule::new(
                format!(
                    "{direction} {tunnels} tcp flags & (syn | rst) == syn \
                     tcp option maxseg size > {mss} tcp option maxseg size set {mss}"
                ),
                "clamp MSS to the tunnel MTU",
            )
        })
        .collect()
}

/// `{ a, b }` for nft, or the single element without braces.
fn nft_set<T: fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    let items: Vec<String> = items.into_iter().map(|item| item.to_string()).collect();
    match items.as_slice() {
        [one] => one.clone(),
        many => format!("{{ {} }}", many.join(", ")),
    }
}

fn quoted(name: &str) -> String {
    format!("\"{name}\"")
}

/// Sets `meta mark` or `ct mark` to `mark`, keeping the bits outside `mask`.
fn set_mark(what: &str, mark: u32, mask: u32) -> String {
    format!(
        "{what} mark set {what} mark and {:#010x} or {mark:#x}",
        !mask
    )
}
