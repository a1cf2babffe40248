//! The fabric adapter: applies a netplan [`FabricPlan`] (the VXLAN device, its FDB entries and
//! permanent neighbours, our routes in the main table, our nftables table) to the current
//! network namespace, and removes exactly that on teardown.
//!
//! What is ours: the device by name (and what the kernel keeps on it), the IPv4 routes in the
//! main table carrying our route protocol, and our table. A route without our protocol is never
//! read or changed, even one through our device.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

use futures::TryStreamExt as _;
use ipnet::Ipv4Net;
use netlink_packet_route::AddressFamily;
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteMessage, RouteMetric, RouteProtocol, RouteScope, RouteType,
};
use rtnetlink::{Handle, LinkUnspec, LinkVxlan, RouteMessageBuilder};
use tether_netplan::fabric::MAIN_TABLE;
use tether_netplan::{
    FabricObserved, FabricOp, FabricPlan, FabricRoute, FdbEntry, Mac, Neighbour, ObservedLink,
    VxlanLink,
};
use tokio::task::JoinHandle;

use crate::error::{KernelError, netlink_errno};
use crate::netlink::link_name;
use crate::nft::Nft;

/// Default tag on the fabric's routes (`ip route` shows `proto 117`); distinct from the
/// gateway's [`crate::DEFAULT_PROTOCOL`], so the two adapters in one gateway pod never see each
/// other's routes.
pub const FABRIC_PROTOCOL: u8 = 117;

/// Which device, table and route protocol the fabric adapter owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FabricConfig {
    /// The VXLAN device's name.
    pub device: String,
    /// Our nftables table (family `ip`).
    pub table: String,
    /// Tag on our routes.
    pub protocol: u8,
    /// The `nft` binary.
    pub nft_program: PathBuf,
}

impl FabricConfig {
    /// A configuration with [`FABRIC_PROTOCOL`] and `nft` from `PATH`.
    pub fn new(device: impl Into<String>, table: impl Into<String>) -> Self {
        Self {
            device: device.into(),
            table: table.into(),
            protocol: FABRIC_PROTOCOL,
            nft_program: PathBuf::from("nft"),
        }
    }
}

/// A fabric operation that failed.
#[derive(Debug)]
pub struct FabricOpFailure {
    /// The operation.
    pub op: FabricOp,
    /// Why it failed.
    pub error: KernelError,
}

/// What one [`FabricKernel::reconcile`] or [`FabricKernel::teardown`] did.
#[derive(Debug, Default)]
pub struct FabricReport {
    /// Operations that succeeded, in order.
    pub applied: Vec<FabricOp>,
    /// Operations that failed; the next reconcile retries them.
    pub failed: Vec<FabricOpFailure>,
}

impl FabricReport {
    /// Whether every operation succeeded.
    pub fn is_success(&self) -> bool {
        self.failed.is_empty()
    }

    /// Whether nothing had to change.
    pub fn is_noop(&self) -> bool {
        self.applied.is_empty() && self.failed.is_empty()
    }
}

/// Programs the fabric of one network namespace: the one of the thread that called
/// [`FabricKernel::new`] (the netlink socket is bound there) and that runs `nft`.
#[derive(Debug)]
pub struct FabricKernel {
    handle: Handle,
    connection: JoinHandle<()>,
    config: FabricConfig,
    nft: Nft,
}

impl Drop for FabricKernel {
    fn drop(&mut self) {
        self.connection.abort();
    }
}

impl FabricKernel {
    /// Opens the rtnetlink socket in the calling thread's namespace (within a tokio runtime).
    pub fn new(config: FabricConfig) -> Result<Self, KernelError> {
        let (connection, handle, _) = rtnetlink::new_connection().map_err(KernelError::Connect)?;
        let connection = tokio::spawn(connection);
        let nft = Nft::new(&config.nft_program);
        Ok(Self {
            handle,
            connection,
            config,
            nft,
        })
    }

    /// The configuration this adapter was built with.
    pub fn config(&self) -> &FabricConfig {
        &self.config
    }

    /// The MTU of the interface that holds `address` (the uplink the VXLAN packets leave by).
    pub async fn uplink_mtu(&self, address: Ipv4Addr) -> Result<u32, KernelError> {
        let object = || format!("find the interface of underlay address {address}");
        let addresses: Vec<AddressMessage> = self
            .handle
            .address()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(|e| KernelError::netlink(object(), e))?;
        let index = addresses
            .iter()
            .find(|m| {
                m.attributes.iter().any(|a| {
                    matches!(a, AddressAttribute::Local(IpAddr::V4(a)) | AddressAttribute::Address(IpAddr::V4(a)) if *a == address)
                })
            })
            .map(|m| m.header.index)
            .ok_or_else(|| KernelError::NoSuchLink {
                object: object(),
                interface: format!("<with address {address}>"),
            })?;
        let links = self.links().await?;
        links
            .iter()
            .find(|l| l.header.index == index)
            .and_then(|l| {
                l.attributes.iter().find_map(|a| match a {
                    LinkAttribute::Mtu(mtu) => Some(*mtu),
                    _ => None,
                })
            })
            .ok_or_else(|| KernelError::NoSuchLink {
                object: object(),
                interface: format!("if{index}"),
            })
    }

    async fn links(&self) -> Result<Vec<LinkMessage>, KernelError> {
        self.handle
            .link()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(|e| KernelError::netlink("list interfaces", e))
    }

    async fn device_index(&self) -> Result<Option<u32>, KernelError> {
        let device = &self.config.device;
        Ok(self
            .links()
            .await?
            .iter()
            .find(|l| link_name(l).as_deref() == Some(device))
            .map(|l| l.header.index))
    }

    /// Reads back what the fabric owns.
    pub async fn observe(&self) -> Result<FabricObserved, KernelError> {
        let device = &self.config.device;
        let links = self.links().await?;
        let link = links
            .iter()
            .find(|l| link_name(l).as_deref() == Some(device.as_str()));
        let mut observed = FabricObserved {
            link: link.map(observed_link),
            ..FabricObserved::default()
        };
        let index = link.map(|l| l.header.index);
        if let Some(index) = index {
            // An unspecified-family dump leaves the bridge FDB out: ask for each family.
            for family in [AddressFamily::Bridge, AddressFamily::Inet] {
                let messages: Vec<NeighbourMessage> = self
                    .handle
                    .neighbours()
                    .get()
                    .set_address_family(family)
                    .execute()
                    .try_collect()
                    .await
                    .map_err(|e| KernelError::netlink("list neighbours and FDB entries", e))?;
                for message in messages.iter().filter(|m| m.header.ifindex == index) {
                    let Some((ip, mac)) = neighbour_parts(message) else {
                        continue;
                    };
                    match message.header.family {
                        AddressFamily::Bridge => observed.fdb.push(FdbEntry { mac, dst: ip }),
                        AddressFamily::Inet
                            if message.header.state == NeighbourState::Permanent =>
                        {
                            observed.neighbours.push(Neighbour { ip, mac });
                        }
                        _ => {}
                    }
                }
            }
        }
        let request = RouteMessageBuilder::<Ipv4Addr>::new().build();
        let routes: Vec<RouteMessage> = self
            .handle
            .route()
            .get(request)
            .execute()
            .try_collect()
            .await
            .map_err(|e| KernelError::netlink("list IPv4 routes", e))?;
        observed.routes = routes
            .iter()
            .filter(|m| u8::from(m.header.protocol) == self.config.protocol)
            .filter_map(fabric_route)
            .collect();
        observed.ruleset_fingerprint = self
            .nft
            .list(&self.config.table)
            .await?
            .map(|listing| listing.fingerprint);
        observed.fdb.sort();
        observed.neighbours.sort();
        observed.routes.sort();
        Ok(observed)
    }

    /// Makes the namespace match `desired`: observe, diff, apply. `Err` only when the kernel
    /// could not be read or the plan names a device or table that is not ours; nothing was
    /// changed then.
    pub async fn reconcile(&mut self, desired: &FabricPlan) -> Result<FabricReport, KernelError> {
        if desired.link.name != self.config.device || desired.nft.table != self.config.table {
            return Err(KernelError::NotOwned {
                object: format!(
                    "fabric plan for device {} and table {}",
                    desired.link.name, desired.nft.table
                ),
                why: format!(
                    "this adapter owns device {} and table {}",
                    self.config.device, self.config.table
                ),
            });
        }
        let observed = self.observe().await?;
        let ops = tether_netplan::diff_fabric(desired, &observed);
        Ok(self.apply(ops).await)
    }

    /// Removes everything the fabric owns: the table, our routes and the device.
    pub async fn teardown(&mut self) -> Result<FabricReport, KernelError> {
        let observed = self.observe().await?;
        let ops =
            tether_netplan::teardown_fabric(&self.config.device, &self.config.table, &observed);
        Ok(self.apply(ops).await)
    }

    /// Applies `ops` in order; every one is attempted and failures are collected.
    pub async fn apply(&mut self, ops: Vec<FabricOp>) -> FabricReport {
        let mut report = FabricReport::default();
        for op in ops {
            match self.apply_one(&op).await {
                Ok(()) => {
                    tracing::debug!(%op, "applied");
                    report.applied.push(op);
                }
                Err(error) => {
                    tracing::warn!(%op, %error, "fabric operation failed");
                    report.failed.push(FabricOpFailure { op, error });
                }
            }
        }
        report
    }

    async fn apply_one(&mut self, op: &FabricOp) -> Result<(), KernelError> {
        let object = || op.to_string();
        let needs_device = || KernelError::NoSuchLink {
            object: op.to_string(),
            interface: self.config.device.clone(),
        };
        match op {
            FabricOp::CreateLink(link) => self
                .handle
                .link()
                .add(vxlan_message(link))
                .execute()
                .await
                .map_err(|e| KernelError::netlink(object(), e)),
            FabricOp::DeleteLink(_) => {
                let Some(index) = self.device_index().await? else {
                    return Ok(());
                };
                match self.handle.link().del(index).execute().await {
                    Err(e) if netlink_errno(&e) == Some(libc::ENODEV) => Ok(()),
                    result => result.map_err(|e| KernelError::netlink(object(), e)),
                }
            }
            FabricOp::ConfigureLink(link) => {
                let index = self.device_index().await?.ok_or_else(needs_device)?;
                let message = LinkUnspec::new_with_index(index)
                    .mtu(link.mtu)
                    .address(link.mac.0.to_vec())
                    .up()
                    .build();
                self.handle
                    .link()
                    .set(message)
                    .execute()
                    .await
                    .map_err(|e| KernelError::netlink(object(), e))
            }
            FabricOp::AddFdb(entry) => {
                let index = self.device_index().await?.ok_or_else(needs_device)?;
                self.handle
                    .neighbours()
                    .add_bridge(index, &entry.mac.0)
                    .destination(IpAddr::V4(entry.dst))
                    .flags(NeighbourFlags::Own)
                    .replace()
                    .execute()
                    .await
                    .map_err(|e| KernelError::netlink(object(), e))
            }
            FabricOp::DelFdb(entry) => {
                let Some(index) = self.device_index().await? else {
                    return Ok(());
                };
                let mut message = NeighbourMessage::default();
                message.header.family = AddressFamily::Bridge;
                message.header.ifindex = index;
                message.header.flags = NeighbourFlags::Own;
                message.attributes = vec![
                    NeighbourAttribute::LinkLayerAddress(entry.mac.0.to_vec()),
                    NeighbourAttribute::Destination(NeighbourAddress::Inet(entry.dst)),
                ];
                self.delete_neighbour(message, object).await
            }
            FabricOp::AddNeighbour(neighbour) => {
                let index = self.device_index().await?.ok_or_else(needs_device)?;
                self.handle
                    .neighbours()
                    .add(index, IpAddr::V4(neighbour.ip))
                    .link_layer_address(&neighbour.mac.0)
                    .state(NeighbourState::Permanent)
                    .replace()
                    .execute()
                    .await
                    .map_err(|e| KernelError::netlink(object(), e))
            }
            FabricOp::DelNeighbour(neighbour) => {
                let Some(index) = self.device_index().await? else {
                    return Ok(());
                };
                let mut message = NeighbourMessage::default();
                message.header.family = AddressFamily::Inet;
                message.header.ifindex = index;
                message.attributes = vec![NeighbourAttribute::Destination(NeighbourAddress::Inet(
                    neighbour.ip,
                ))];
                self.delete_neighbour(message, object).await
            }
            FabricOp::AddRoute(route) => {
                let index = match route.via {
                    Some(_) => Some(self.device_index().await?.ok_or_else(needs_device)?),
                    None => None,
                };
                self.handle
                    .route()
                    .add(route_message(route, index, self.config.protocol))
                    .execute()
                    .await
                    .map_err(|e| KernelError::netlink(object(), e))
            }
            FabricOp::DelRoute(route) => {
                let index = match route.via {
                    // Without the device the kernel removed the route with it.
                    Some(_) => match self.device_index().await? {
                        Some(index) => Some(index),
                        None => return Ok(()),
                    },
                    None => None,
                };
                match self
                    .handle
                    .route()
                    .del(route_message(route, index, self.config.protocol))
                    .execute()
                    .await
                {
                    Err(e) if netlink_errno(&e) == Some(libc::ESRCH) => Ok(()),
                    result => result.map_err(|e| KernelError::netlink(object(), e)),
                }
            }
            FabricOp::ReplaceRuleset(ruleset) => self.nft.apply(ruleset).await,
            FabricOp::DeleteRuleset(table) => self.nft.delete(table).await,
        }
    }

    async fn delete_neighbour(
        &self,
        message: NeighbourMessage,
        object: impl Fn() -> String,
    ) -> Result<(), KernelError> {
        match self.handle.neighbours().del(message).execute().await {
            Err(e) if netlink_errno(&e) == Some(libc::ENOENT) => Ok(()),
            result => result.map_err(|e| KernelError::netlink(object(), e)),
        }
    }
}

fn vxlan_message(link: &VxlanLink) -> LinkMessage {
    LinkVxlan::new(&link.name, link.vni)
        .port(link.port)
        .local(link.local)
        .learning(false)
        .mtu(link.mtu)
        .address(link.mac.0.to_vec())
        .up()
        .build()
}

fn observed_link(message: &LinkMessage) -> ObservedLink {
    let mut link = ObservedLink {
        up: message.header.flags.contains(LinkFlags::Up),
        // The kernel's default; a VXLAN device reports its real setting below.
        learning: true,
        ..ObservedLink::default()
    };
    for attribute in &message.attributes {
        match attribute {
            LinkAttribute::Mtu(mtu) => link.mtu = *mtu,
            LinkAttribute::Address(bytes) => link.mac = mac(bytes),
            LinkAttribute::LinkInfo(infos) => {
                for info in infos {
                    match info {
                        LinkInfo::Kind(InfoKind::Vxlan) => link.is_vxlan = true,
                        LinkInfo::Data(InfoData::Vxlan(data)) => {
                            for item in data {
                                match item {
                                    InfoVxlan::Id(vni) => link.vni = Some(*vni),
                                    InfoVxlan::Port(port) => link.port = Some(*port),
                                    InfoVxlan::Local(local) => link.local = Some(*local),
                                    InfoVxlan::Learning(learning) => link.learning = *learning,
                                    _ => {}
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    link
}

fn mac(bytes: &[u8]) -> Option<Mac> {
    <[u8; 6]>::try_from(bytes).ok().map(Mac)
}

/// The IPv4 destination and MAC of a neighbour or FDB entry, if it has both.
fn neighbour_parts(message: &NeighbourMessage) -> Option<(Ipv4Addr, Mac)> {
    let mut ip = None;
    let mut lladdr = None;
    for attribute in &message.attributes {
        match attribute {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => ip = Some(*a),
            // In bridge-family (FDB) messages the parser cannot know the address family of
            // the destination and hands over its bytes.
            NeighbourAttribute::Destination(NeighbourAddress::Other(bytes)) => {
                ip = <[u8; 4]>::try_from(bytes.as_slice())
                    .ok()
                    .map(Ipv4Addr::from);
            }
            NeighbourAttribute::LinkLayerAddress(bytes) => lladdr = mac(bytes),
            _ => {}
        }
    }
    Some((ip?, lladdr?))
}

/// A route of ours as netplan sees it; `None` for routes outside the main table or of a kind
/// we never create.
fn fabric_route(message: &RouteMessage) -> Option<FabricRoute> {
    let mut table = u32::from(message.header.table);
    let mut dst = Ipv4Addr::UNSPECIFIED;
    let mut via = None;
    let mut mtu = None;
    for attribute in &message.attributes {
        match attribute {
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::Destination(RouteAddress::Inet(a)) => dst = *a,
            RouteAttribute::Gateway(RouteAddress::Inet(a)) => via = Some(*a),
            RouteAttribute::Metrics(metrics) => {
                for metric in metrics {
                    if let RouteMetric::Mtu(m) = metric {
                        mtu = Some(*m);
                    }
                }
            }
            _ => {}
        }
    }
    if table != MAIN_TABLE {
        return None;
    }
    let via = match message.header.kind {
        RouteType::Unicast => Some(via?),
        RouteType::Unreachable => None,
        _ => return None,
    };
    Some(FabricRoute {
        dst: Ipv4Net::new(dst, message.header.destination_prefix_length).ok()?,
        via,
        mtu,
    })
}

fn route_message(route: &FabricRoute, index: Option<u32>, protocol: u8) -> RouteMessage {
    let mut builder = RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(route.dst.network(), route.dst.prefix_len())
        .table_id(MAIN_TABLE)
        .protocol(RouteProtocol::from(protocol))
        .scope(RouteScope::Universe);
    builder = match (route.via, index) {
        // `onlink`: the next hop is on the device although the device has no address in its
        // network; the permanent neighbour resolves it.
        (Some(via), Some(index)) => builder
            .kind(RouteType::Unicast)
            .gateway(via)
            .output_interface(index)
            .onlink(),
        _ => builder.kind(RouteType::Unreachable),
    };
    let mut message = builder.build();
    if let Some(mtu) = route.mtu {
        message
            .attributes
            .push(RouteAttribute::Metrics(vec![RouteMetric::Mtu(mtu)]));
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_round_trip_through_messages() {
        let routes = [
            FabricRoute {
                dst: "10.71.0.0/16".parse().unwrap(),
                via: Some("203.0.113.3".parse().unwrap()),
                mtu: Some(1400),
            },
            FabricRoute {
                dst: "10.72.0.0/16".parse().unwrap(),
                via: None,
                mtu: None,
            },
        ];
        for route in routes {
            let message = route_message(&route, route.via.map(|_| 7), 117);
            assert_eq!(u8::from(message.header.protocol), 117);
            assert_eq!(fabric_route(&message), Some(route));
        }
    }
}
