//! Routes, policy rules, addresses and links over rtnetlink, translated to and from netplan's
//! plain types. Everything we create carries our protocol number (routes: `RTM_PROTOCOL`,
//! rules: `FRA_PROTOCOL`, addresses: `IFA_PROTO`), and reading back keeps only objects with it,
//! so foreign objects in the same namespace are never seen, let alone changed.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use futures::TryStreamExt as _;
use ipnet::Ipv4Net;
use netlink_packet_route::AddressFamily;
use netlink_packet_route::address::{AddressAttribute, AddressMessage, AddressProtocol};
use netlink_packet_route::link::{LinkAttribute, LinkMessage};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use rtnetlink::{Handle, IpVersion, RouteMessageBuilder};
use tether_netplan::{Address, LOCAL_TABLE, Ownership, Route, RouteKind, Rule};

/// `RTPROT_KERNEL`: what the kernel tags its own default rules with.
const RTPROT_KERNEL: u8 = 2;

use crate::error::{KernelError, netlink_errno};

/// Interface names by index and back, read in one dump.
#[derive(Debug, Default, Clone)]
pub(crate) struct Links {
    by_index: BTreeMap<u32, String>,
}

impl Links {
    pub(crate) async fn dump(handle: &Handle) -> Result<Self, KernelError> {
        let messages: Vec<LinkMessage> = handle
            .link()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(|e| KernelError::netlink("list interfaces", e))?;
        let by_index = messages
            .iter()
            .filter_map(|m| Some((m.header.index, link_name(m)?)))
            .collect();
        Ok(Self { by_index })
    }

    pub(crate) fn name(&self, index: u32) -> Option<&str> {
        self.by_index.get(&index).map(String::as_str)
    }

    pub(crate) fn index(&self, name: &str) -> Option<u32> {
        self.by_index
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(i, _)| *i)
    }

    pub(crate) fn require(
        &self,
        name: &str,
        object: impl FnOnce() -> String,
    ) -> Result<u32, KernelError> {
        self.index(name).ok_or_else(|| KernelError::NoSuchLink {
            object: object(),
            interface: name.to_owned(),
        })
    }
}

pub(crate) fn link_name(message: &LinkMessage) -> Option<String> {
    message.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(name) => Some(name.clone()),
        _ => None,
    })
}

// ---- routes ----------------------------------------------------------------------------------

/// Routes in tables `tables.0..=tables.1` carrying `protocol`.
pub(crate) async fn owned_routes(
    handle: &Handle,
    links: &Links,
    tables: (u32, u32),
    protocol: u8,
) -> Result<Vec<Route>, KernelError> {
    let request = RouteMessageBuilder::<Ipv4Addr>::new().build();
    let messages: Vec<RouteMessage> = handle
        .route()
        .get(request)
        .execute()
        .try_collect()
        .await
        .map_err(|e| KernelError::netlink("list IPv4 routes", e))?;
    let mut routes: Vec<Route> = messages
        .iter()
        .filter(|m| u8::from(m.header.protocol) == protocol)
        .filter_map(|m| route_from_message(m, links))
        .filter(|r| (tables.0..=tables.1).contains(&r.table))
        .collect();
    routes.sort();
    Ok(routes)
}

/// The netplan kind of a kernel route type; `None` for types we never create.
fn route_kind(kind: RouteType) -> Option<RouteKind> {
    match kind {
        RouteType::Unicast => Some(RouteKind::Unicast),
        RouteType::Unreachable => Some(RouteKind::Unreachable),
        RouteType::BlackHole => Some(RouteKind::Blackhole),
        _ => None,
    }
}

fn route_type(kind: RouteKind) -> RouteType {
    match kind {
        RouteKind::Unicast => RouteType::Unicast,
        RouteKind::Unreachable => RouteType::Unreachable,
        RouteKind::Blackhole => RouteType::BlackHole,
    }
}

fn route_from_message(message: &RouteMessage, links: &Links) -> Option<Route> {
    let kind = route_kind(message.header.kind)?;
    let mut table = u32::from(message.header.table);
    let mut dst = Ipv4Addr::UNSPECIFIED;
    let mut dev = None;
    let mut src = None;
    let mut metric = 0;
    for attribute in &message.attributes {
        match attribute {
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::Destination(RouteAddress::Inet(a)) => dst = *a,
            RouteAttribute::Oif(index) => {
                dev = Some(
                    links
                        .name(*index)
                        .map_or_else(|| format!("if{index}"), str::to_owned),
                );
            }
            RouteAttribute::PrefSource(RouteAddress::Inet(a)) => src = Some(*a),
            RouteAttribute::Priority(p) => metric = *p,
            _ => {}
        }
    }
    let dst = Ipv4Net::new(dst, message.header.destination_prefix_length).ok()?;
    // A unicast route without an output interface (a gateway or multipath route) is nothing we
    // create; the kernel reports the loopback device on unreachable routes, which we drop.
    let dev = match kind {
        RouteKind::Unicast => Some(dev?),
        RouteKind::Unreachable | RouteKind::Blackhole => None,
    };
    Some(Route {
        table,
        dst,
        kind,
        dev,
        src,
        metric,
    })
}

/// The netlink message for `route`; `index` is its output interface (unicast routes only).
fn route_message(route: &Route, index: Option<u32>, protocol: u8) -> RouteMessage {
    let mut builder = RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(route.dst.network(), route.dst.prefix_len())
        .table_id(route.table)
        .protocol(RouteProtocol::from(protocol))
        .kind(route_type(route.kind));
    builder = match index {
        // A device route without a gateway reaches hosts on the link (like `ip route add … dev`).
        Some(index) => builder.output_interface(index).scope(RouteScope::Link),
        None => builder.scope(RouteScope::Universe),
    };
    if let Some(src) = route.src {
        builder = builder.pref_source(src);
    }
    if route.metric != 0 {
        builder = builder.priority(route.metric);
    }
    builder.build()
}

/// The output interface index of `route`: required for unicast routes, absent otherwise.
fn route_index(
    links: &Links,
    route: &Route,
    object: impl Fn() -> String,
) -> Result<Option<u32>, KernelError> {
    match (&route.kind, &route.dev) {
        (RouteKind::Unicast, Some(dev)) => links.require(dev, object).map(Some),
        (RouteKind::Unicast, None) => Err(KernelError::InvalidRoute {
            object: object(),
            why: "a unicast route needs an output interface".to_owned(),
        }),
        (_, None) => Ok(None),
        (_, Some(dev)) => Err(KernelError::InvalidRoute {
            object: object(),
            why: format!(
                "an {} route has no output interface, got {dev}",
                route.kind.keyword()
            ),
        }),
    }
}

pub(crate) async fn add_route(
    handle: &Handle,
    links: &Links,
    route: &Route,
    protocol: u8,
) -> Result<(), KernelError> {
    let object = || format!("add route {route}");
    let index = route_index(links, route, object)?;
    handle
        .route()
        .add(route_message(route, index, protocol))
        .execute()
        .await
        .map_err(|e| KernelError::netlink(object(), e))
}

pub(crate) async fn del_route(
    handle: &Handle,
    links: &Links,
    route: &Route,
    protocol: u8,
) -> Result<(), KernelError> {
    let object = || format!("delete route {route}");
    // Without the device the kernel removed the route together with it: nothing left to do.
    if let Some(dev) = &route.dev
        && links.index(dev).is_none()
    {
        return Ok(());
    }
    let index = route_index(links, route, object)?;
    match handle
        .route()
        .del(route_message(route, index, protocol))
        .execute()
        .await
    {
        Err(e) if netlink_errno(&e) == Some(libc::ESRCH) => Ok(()),
        result => result.map_err(|e| KernelError::netlink(object(), e)),
    }
}

// ---- rules -----------------------------------------------------------------------------------

/// IPv4 rules at a priority `ownership` owns carrying `protocol`, and whether the kernel's
/// `pref 0 lookup local` rule is missing.
pub(crate) async fn owned_rules(
    handle: &Handle,
    ownership: &Ownership,
    protocol: u8,
) -> Result<(Vec<Rule>, bool), KernelError> {
    let messages: Vec<RuleMessage> = handle
        .rule()
        .get(IpVersion::V4)
        .execute()
        .try_collect()
        .await
        .map_err(|e| KernelError::netlink("list IPv4 policy rules", e))?;
    let mut rules: Vec<Rule> = messages
        .iter()
        .filter(|m| rule_protocol(m) == Some(protocol))
        .filter_map(rule_from_message)
        .filter(|r| ownership.owns_rule_priority(r.priority))
        .collect();
    rules.sort();
    let local_hidden = !messages
        .iter()
        .filter_map(rule_from_message)
        .any(|r| r.priority == 0 && r.table == LOCAL_TABLE && r.fwmark.is_none());
    Ok((rules, local_hidden))
}

/// The kernel's own local-table rule, as `ip rule` shows it at boot.
fn kernel_local_rule() -> RuleMessage {
    let rule = Rule {
        priority: 0,
        fwmark: None,
        iif: None,
        dst: None,
        table: LOCAL_TABLE,
    };
    rule_message(&rule, RTPROT_KERNEL)
}

/// `ip rule del pref 0 lookup local`.
pub(crate) async fn hide_local_rule(handle: &Handle) -> Result<(), KernelError> {
    match handle.rule().del(kernel_local_rule()).execute().await {
        Err(e) if netlink_errno(&e) == Some(libc::ENOENT) => Ok(()),
        result => result.map_err(|e| KernelError::netlink("delete rule pref 0 lookup local", e)),
    }
}

/// `ip rule add pref 0 lookup local`, tagged `proto kernel` like the original.
pub(crate) async fn restore_local_rule(handle: &Handle) -> Result<(), KernelError> {
    let mut request = handle.rule().add();
    *request.message_mut() = kernel_local_rule();
    match request.execute().await {
        Err(e) if netlink_errno(&e) == Some(libc::EEXIST) => Ok(()),
        result => result.map_err(|e| KernelError::netlink("add rule pref 0 lookup local", e)),
    }
}

fn rule_protocol(message: &RuleMessage) -> Option<u8> {
    message.attributes.iter().find_map(|a| match a {
        RuleAttribute::Protocol(p) => Some(u8::from(*p)),
        _ => None,
    })
}

fn rule_from_message(message: &RuleMessage) -> Option<Rule> {
    if message.header.action != RuleAction::ToTable {
        return None;
    }
    let mut priority = 0;
    let mut table = u32::from(message.header.table);
    let (mut mark, mut mask) = (None, None);
    let mut iif = None;
    let mut dst = None;
    for attribute in &message.attributes {
        match attribute {
            RuleAttribute::Priority(p) => priority = *p,
            RuleAttribute::Table(t) => table = *t,
            RuleAttribute::FwMark(m) => mark = Some(*m),
            RuleAttribute::FwMask(m) => mask = Some(*m),
            RuleAttribute::Iifname(name) => iif = Some(name.clone()),
            RuleAttribute::Destination(IpAddr::V4(a)) => {
                dst = Some(Ipv4Net::new(*a, message.header.dst_len).ok()?);
            }
            _ => {}
        }
    }
    // The kernel reports a mark without an explicit mask as mask 0xffffffff.
    let fwmark = mark.map(|m| (m, mask.unwrap_or(u32::MAX)));
    Some(Rule {
        priority,
        fwmark,
        iif,
        dst,
        table,
    })
}

fn rule_message(rule: &Rule, protocol: u8) -> RuleMessage {
    let mut message = RuleMessage::default();
    message.header.family = AddressFamily::Inet;
    message.header.action = RuleAction::ToTable;
    // Tables above 255 travel in FRA_TABLE only; the header field then says "see attribute".
    message.header.table = u8::try_from(rule.table).unwrap_or(RouteHeader::RT_TABLE_UNSPEC);
    let attributes = &mut message.attributes;
    attributes.push(RuleAttribute::Table(rule.table));
    attributes.push(RuleAttribute::Priority(rule.priority));
    attributes.push(RuleAttribute::Protocol(RouteProtocol::from(protocol)));
    if let Some((mark, mask)) = rule.fwmark {
        attributes.push(RuleAttribute::FwMark(mark));
        attributes.push(RuleAttribute::FwMask(mask));
    }
    if let Some(iif) = &rule.iif {
        attributes.push(RuleAttribute::Iifname(iif.clone()));
    }
    if let Some(dst) = rule.dst {
        message.header.dst_len = dst.prefix_len();
        message
            .attributes
            .push(RuleAttribute::Destination(IpAddr::V4(dst.network())));
    }
    message
}

pub(crate) async fn add_rule(
    handle: &Handle,
    rule: &Rule,
    protocol: u8,
) -> Result<(), KernelError> {
    let mut request = handle.rule().add();
    *request.message_mut() = rule_message(rule, protocol);
    request
        .execute()
        .await
        .map_err(|e| KernelError::netlink(format!("add rule {rule}"), e))
}

pub(crate) async fn del_rule(
    handle: &Handle,
    rule: &Rule,
    protocol: u8,
) -> Result<(), KernelError> {
    match handle
        .rule()
        .del(rule_message(rule, protocol))
        .execute()
        .await
    {
        Err(e) if netlink_errno(&e) == Some(libc::ENOENT) => Ok(()),
        result => result.map_err(|e| KernelError::netlink(format!("delete rule {rule}"), e)),
    }
}

// ---- addresses -------------------------------------------------------------------------------

/// IPv4 addresses carrying `protocol`, on any interface.
pub(crate) async fn owned_addresses(
    handle: &Handle,
    links: &Links,
    protocol: u8,
) -> Result<Vec<Address>, KernelError> {
    let messages: Vec<AddressMessage> = handle
        .address()
        .get()
        .execute()
        .try_collect()
        .await
        .map_err(|e| KernelError::netlink("list addresses", e))?;
    let mut addresses: Vec<Address> = messages
        .iter()
        .filter(|m| m.header.family == AddressFamily::Inet)
        .filter(|m| address_protocol(m) == Some(protocol))
        .filter_map(|m| {
            let local = m.attributes.iter().find_map(|a| match a {
                AddressAttribute::Local(IpAddr::V4(a)) => Some(*a),
                _ => None,
            })?;
            let dev = links.name(m.header.index)?.to_owned();
            Some(Address {
                dev,
                addr: Ipv4Net::new(local, m.header.prefix_len).ok()?,
            })
        })
        .collect();
    addresses.sort();
    Ok(addresses)
}

fn address_protocol(message: &AddressMessage) -> Option<u8> {
    message.attributes.iter().find_map(|a| match a {
        AddressAttribute::Protocol(p) => Some(u8::from(*p)),
        _ => None,
    })
}

pub(crate) async fn add_address(
    handle: &Handle,
    links: &Links,
    address: &Address,
    protocol: u8,
) -> Result<(), KernelError> {
    let object = || format!("add address {address}");
    let index = links.require(&address.dev, object)?;
    let mut request = handle.address().add(
        index,
        IpAddr::V4(address.addr.addr()),
        address.addr.prefix_len(),
    );
    request
        .message_mut()
        .attributes
        .push(AddressAttribute::Protocol(AddressProtocol::from(protocol)));
    request
        .execute()
        .await
        .map_err(|e| KernelError::netlink(object(), e))
}

pub(crate) async fn del_address(
    handle: &Handle,
    links: &Links,
    address: &Address,
) -> Result<(), KernelError> {
    let Some(index) = links.index(&address.dev) else {
        return Ok(()); // gone with its interface
    };
    let mut message = AddressMessage::default();
    message.header.family = AddressFamily::Inet;
    message.header.index = index;
    message.header.prefix_len = address.addr.prefix_len();
    message
        .attributes
        .push(AddressAttribute::Local(IpAddr::V4(address.addr.addr())));
    match handle.address().del(message).execute().await {
        Err(e) if netlink_errno(&e) == Some(libc::EADDRNOTAVAIL) => Ok(()),
        result => result.map_err(|e| KernelError::netlink(format!("delete address {address}"), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn links() -> Links {
        Links {
            by_index: BTreeMap::from([(7, "tether-b".to_owned())]),
        }
    }

    #[test]
    fn routes_round_trip_through_messages() {
        for table in [100, 7700] {
            let route = Route {
                table,
                dst: "10.0.0.0/16".parse().unwrap(),
                kind: RouteKind::Unicast,
                dev: Some("tether-b".to_owned()),
                src: Some("169.254.18.1".parse().unwrap()),
                metric: 0,
            };
            let message = route_message(&route, Some(7), 116);
            assert_eq!(u8::from(message.header.protocol), 116);
            assert_eq!(message.header.scope, RouteScope::Link);
            assert_eq!(route_from_message(&message, &links()), Some(route));
        }
    }

    #[test]
    fn catch_all_routes_round_trip_without_an_interface() {
        for kind in [RouteKind::Unreachable, RouteKind::Blackhole] {
            let route = Route {
                table: 7700,
                dst: Ipv4Net::default(),
                kind,
                dev: None,
                src: None,
                metric: u32::MAX,
            };
            let message = route_message(&route, None, 116);
            assert_eq!(message.header.kind, route_type(kind));
            assert_eq!(message.header.scope, RouteScope::Universe);
            assert!(
                !message
                    .attributes
                    .iter()
                    .any(|a| matches!(a, RouteAttribute::Oif(_)))
            );
            // The kernel reports the loopback device on such routes; it is not part of them.
            let mut dumped = message.clone();
            dumped.attributes.push(RouteAttribute::Oif(7));
            assert_eq!(route_from_message(&dumped, &links()), Some(route));
        }
    }

    #[test]
    fn kind_and_interface_must_agree() {
        let mut route = Route {
            table: 7700,
            dst: Ipv4Net::default(),
            kind: RouteKind::Unreachable,
            dev: Some("tether-b".to_owned()),
            src: None,
            metric: 0,
        };
        let error = route_index(&links(), &route, || "add route".to_owned()).unwrap_err();
        assert!(error.to_string().contains("unreachable"), "{error}");
        route.kind = RouteKind::Unicast;
        assert_eq!(route_index(&links(), &route, String::new).unwrap(), Some(7));
        route.dev = None;
        assert!(route_index(&links(), &route, String::new).is_err());
    }

    #[test]
    fn rules_round_trip_through_messages() {
        let rules = [
            Rule {
                priority: 7700,
                fwmark: Some((0x7701, 0xffff)),
                iif: None,
                dst: None,
                table: 7701,
            },
            Rule {
                priority: 100,
                fwmark: None,
                iif: Some("pods0".to_owned()),
                dst: Some("10.0.0.0/16".parse().unwrap()),
                table: 100,
            },
        ];
        for rule in rules {
            let message = rule_message(&rule, 116);
            assert_eq!(rule_protocol(&message), Some(116));
            assert_eq!(rule_from_message(&message), Some(rule));
        }
    }

    #[test]
    fn a_mark_without_mask_reads_as_a_full_mask() {
        let mut message = rule_message(
            &Rule {
                priority: 1,
                fwmark: None,
                iif: None,
                dst: None,
                table: 5,
            },
            116,
        );
        message.attributes.push(RuleAttribute::FwMark(0x10));
        assert_eq!(
            rule_from_message(&message).unwrap().fwmark,
            Some((0x10, u32::MAX))
        );
    }
}
