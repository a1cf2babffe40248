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
use tether_netplan::{Address, Route, Rule};

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
        .filter(|m| m.header.kind == RouteType::Unicast)
        .filter_map(|m| route_from_message(m, links))
        .filter(|r| (tables.0..=tables.1).contains(&r.table))
        .collect();
    routes.sort();
    Ok(routes)
}

fn route_from_message(message: &RouteMessage, links: &Links) -> Option<Route> {
    let mut table = u32::from(message.header.table);
    let mut dst = Ipv4Addr::UNSPECIFIED;
    let mut dev = None;
    let mut src = None;
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
            _ => {}
        }
    }
    let dst = Ipv4Net::new(dst, message.header.destination_prefix_length).ok()?;
    Some(Route {
        table,
        dst,
        dev: dev?,
        src,
    })
}

fn route_message(route: &Route, index: u32, protocol: u8) -> RouteMessage {
    let mut builder = RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(route.dst.network(), route.dst.prefix_len())
        .output_interface(index)
        .table_id(route.table)
        .protocol(RouteProtocol::from(protocol))
        // A device route without a gateway reaches hosts on the link (like `ip route add … dev`).
        .scope(RouteScope::Link);
    if let Some(src) = route.src {
        builder = builder.pref_source(src);
    }
    builder.build()
}

pub(crate) async fn add_route(
    handle: &Handle,
    links: &Links,
    route: &Route,
    protocol: u8,
) -> Result<(), KernelError> {
    let object = || format!("add route {route}");
    let index = links.require(&route.dev, object)?;
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
    let Some(index) = links.index(&route.dev) else {
        return Ok(());
    };
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

/// IPv4 rules at `priority` carrying `protocol`.
pub(crate) async fn owned_rules(
    handle: &Handle,
    priority: u32,
    protocol: u8,
) -> Result<Vec<Rule>, KernelError> {
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
        .filter(|r| r.priority == priority)
        .collect();
    rules.sort();
    Ok(rules)
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
                dev: "tether-b".to_owned(),
                src: Some("169.254.18.1".parse().unwrap()),
            };
            let message = route_message(&route, 7, 116);
            assert_eq!(u8::from(message.header.protocol), 116);
            assert_eq!(message.header.scope, RouteScope::Link);
            assert_eq!(route_from_message(&message, &links()), Some(route));
        }
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
