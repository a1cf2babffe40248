//! Link helpers for the gateway's tunnel devices: find, wait for, configure and address them.
//! The gateway creates each TUN device itself (it belongs to the process), then asks the
//! adapter to prepare it before routes through it can exist.

use std::time::Duration;

use futures::TryStreamExt as _;
use ipnet::Ipv4Net;
use rtnetlink::LinkUnspec;
use tether_netplan::Address;

use crate::error::{KernelError, netlink_errno};
use crate::kernel::Kernel;
use crate::netlink::{self, Links};
use crate::sysctl;

/// Transmit queue length for tunnel devices. The kernel's TUN default of 500 dropped thousands
/// of packets per second at ~0.8 Gbit/s in our measurements; 5000 dropped none.
pub const TUNNEL_TXQUEUELEN: u32 = 5000;

const LINK_POLL: Duration = Duration::from_millis(20);

/// Settings for [`Kernel::configure_link`]; `None` leaves a setting alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkSettings {
    /// MTU in bytes.
    pub mtu: Option<u32>,
    /// Transmit queue length in packets.
    pub txqueuelen: Option<u32>,
    /// Bring the link up (`Some(true)`) or down (`Some(false)`).
    pub up: Option<bool>,
}

impl Kernel {
    /// The index of interface `name`, or `None` if there is no such interface.
    pub async fn link_index(&self, name: &str) -> Result<Option<u32>, KernelError> {
        let mut links = self
            .handle
            .link()
            .get()
            .match_name(name.to_owned())
            .execute();
        match links.try_next().await {
            Ok(link) => Ok(link.map(|l| l.header.index)),
            Err(e) if netlink_errno(&e) == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(KernelError::netlink(format!("look up interface {name}"), e)),
        }
    }

    /// Waits until interface `name` exists (polling every 20 ms) and returns its index.
    pub async fn wait_for_link(&self, name: &str, timeout: Duration) -> Result<u32, KernelError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(index) = self.link_index(name).await? {
                return Ok(index);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(KernelError::LinkTimeout {
                    interface: name.to_owned(),
                    waited: timeout,
                });
            }
            tokio::time::sleep(LINK_POLL).await;
        }
    }

    /// Sets MTU, transmit queue length and state of interface `name` in one request.
    pub async fn configure_link(
        &self,
        name: &str,
        settings: LinkSettings,
    ) -> Result<(), KernelError> {
        let object = || format!("configure interface {name} ({settings:?})");
        let index = self
            .link_index(name)
            .await?
            .ok_or_else(|| KernelError::NoSuchLink {
                object: object(),
                interface: name.to_owned(),
            })?;
        let mut builder = LinkUnspec::new_with_index(index);
        if let Some(mtu) = settings.mtu {
            builder = builder.mtu(mtu);
        }
        if let Some(len) = settings.txqueuelen {
            builder = builder.txqueuelen(len);
        }
        builder = match settings.up {
            Some(true) => builder.up(),
            Some(false) => builder.down(),
            None => builder,
        };
        self.handle
            .link()
            .set(builder.build())
            .execute()
            .await
            .map_err(|e| KernelError::netlink(object(), e))
    }

    /// Prepares a tunnel device the gateway just created: waits for it, disables IPv6 on it
    /// (otherwise router solicitations and MLD reports leak into the tunnel at start-up), sets
    /// `mtu` and a transmit queue of [`TUNNEL_TXQUEUELEN`], and brings it up. Returns its index.
    pub async fn prepare_tunnel(
        &self,
        name: &str,
        mtu: u32,
        timeout: Duration,
    ) -> Result<u32, KernelError> {
        let index = self.wait_for_link(name, timeout).await?;
        sysctl::write(&format!("net/ipv6/conf/{name}/disable_ipv6"), "1")?;
        let settings = LinkSettings {
            mtu: Some(mtu),
            txqueuelen: Some(TUNNEL_TXQUEUELEN),
            up: Some(true),
        };
        self.configure_link(name, settings).await?;
        Ok(index)
    }

    /// Adds `addr` to interface `dev`, tagged as ours. Returns `false` if it was already there.
    pub async fn add_address(&self, dev: &str, addr: Ipv4Net) -> Result<bool, KernelError> {
        let links = Links::dump(&self.handle).await?;
        let address = Address {
            dev: dev.to_owned(),
            addr,
        };
        match netlink::add_address(&self.handle, &links, &address, self.config().protocol).await {
            Ok(()) => Ok(true),
            Err(error) if error.errno() == Some(libc::EEXIST) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Writes a sysctl in this namespace (`key` below `/proc/sys`, `/`-separated).
    pub fn set_sysctl(&self, key: &str, value: &str) -> Result<(), KernelError> {
        sysctl::write(key, value)
    }

    /// Reads a sysctl in this namespace.
    pub fn sysctl(&self, key: &str) -> Result<String, KernelError> {
        sysctl::read(key)
    }
}
