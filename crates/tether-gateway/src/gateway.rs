//! The gateway's life cycle: validate and plan everything first, then create the TUN devices,
//! apply the plan, start the packet loops, repair drift periodically, and tear down on
//! shutdown.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::registry::Registry;
use tether_kernel::{Kernel, KernelConfig, KernelError, ReconcileReport};
use tether_netplan::Plan;
use tether_runtime::{Health, Shutdown};
use tether_wg::{AllowedIps, Device, PeerConfig};
use tun_rs::{DeviceBuilder, SyncDevice};

use crate::config::{Config, ConfigError};
use crate::dataplane::{Dataplane, Socket};
use crate::metrics::{KernelMetrics, PeerCollector, ResultLabels};
use crate::probe::Probes;
use crate::remap;

/// How long to wait for a freshly created TUN device to show up over netlink.
const LINK_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the gateway stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The configuration cannot work; nothing was applied.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The UDP port could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// A TUN device could not be created.
    #[error(
        "cannot create tunnel device {name}: {source} (the gateway needs CAP_NET_ADMIN and /dev/net/tun)"
    )]
    Tun {
        /// Interface name.
        name: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The kernel adapter failed in a way a retry cannot fix.
    #[error("kernel: {0}")]
    Kernel(#[from] KernelError),
    /// The packet loops could not start.
    #[error("cannot start the packet loops: {0}")]
    Dataplane(#[source] std::io::Error),
}

impl GatewayError {
    /// Process exit code: 2 for configuration errors (nothing applied), 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Config(_) => 2,
            _ => 1,
        }
    }
}

/// A validated, planned gateway, ready to [`Prepared::run`].
pub struct Prepared {
    config: Config,
    plan: Plan,
    input: tether_netplan::GatewayInput,
    device: Arc<Device>,
    probes: Arc<Probes>,
    ip_mappings: Option<tokio::sync::watch::Receiver<Vec<tether_netplan::IpMapping>>>,
}

/// What a running gateway exposes to its status reporter: the WireGuard device (handshakes,
/// counters) and the probe results, both indexed like [`Config::peers`].
#[derive(Clone, Debug)]
pub struct Observer {
    /// The WireGuard device.
    pub device: Arc<Device>,
    /// Round-trip probe results.
    pub probes: Arc<Probes>,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("peers", &self.config.peers.len())
            .finish_non_exhaustive()
    }
}

impl Prepared {
    /// Validates and plans without touching the system; every error here is a config error.
    /// The rules that span peers are checked here by the crates that own them: the planner
    /// (ids, interfaces, prefix lengths, overlaps) and the WireGuard device (keys).
    pub fn new(config: Config) -> Result<Self, ConfigError> {
        let (input, plan) = remap::plan(&config)?;
        let device = Device::new(config.private_key.clone(), peer_configs(&config))
            .map_err(|e| ConfigError::from_device(&config, e))?;
        let probes = Arc::new(Probes::new(config.peers.len()));
        Ok(Self {
            config,
            plan,
            input,
            device: Arc::new(device),
            probes,
            ip_mappings: None,
        })
    }

    /// Makes the running gateway follow `updates` for its published addresses
    /// ([`Config::ip_mappings`]): each new list is planned and applied to nftables in place,
    /// without touching the tunnel, so publishing an address costs no gap in the traffic. A
    /// list the planner refuses is logged and the previous one stays.
    pub fn follow_ip_mappings(
        mut self,
        updates: tokio::sync::watch::Receiver<Vec<tether_netplan::IpMapping>>,
    ) -> Self {
        self.ip_mappings = Some(updates);
        self
    }

    /// The configuration it was prepared from.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Handles on the device and the probes, valid for the whole run.
    pub fn observer(&self) -> Observer {
        Observer {
            device: self.device.clone(),
            probes: self.probes.clone(),
        }
    }

    /// The kernel plan (for `--dry-run` style output and logs).
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The netplan input, with the chosen local views.
    pub fn input(&self) -> &tether_netplan::GatewayInput {
        &self.input
    }

    /// Runs the gateway in the current network namespace until `shutdown` fires, then tears
    /// its kernel state down. Metrics go into `registry`, health into `health`.
    pub async fn run(
        self,
        registry: Arc<Mutex<Registry>>,
        health: Health,
        shutdown: Shutdown,
    ) -> Result<(), GatewayError> {
        let Self {
            config,
            mut plan,
            mut input,
            device,
            probes,
            ip_mappings: mut mapping_updates,
        } = self;
        for p in &input.peers {
            tracing::info!(
                peer = %p.id,
                interface = %p.interface,
                real = %p.pod.real,
                local_view = %p.pod.local_view,
                "peer pod CIDR mapping"
            );
        }
        let socket = Socket::bind(config.listen).map_err(|source| GatewayError::Listen {
            addr: config.listen,
            source,
        })?;
        let mut kernel = Kernel::new(KernelConfig::new(input.ownership()))?;

        // The TUN devices belong to this process; routes through them can only exist after
        // they do, and vanish when it exits.
        let mut tuns = Vec::with_capacity(config.peers.len());
        for p in &config.peers {
            let dev = create_tun(&p.interface, config.mtu)?;
            kernel
                .prepare_tunnel(&p.interface, config.mtu, LINK_TIMEOUT)
                .await?;
            tuns.push(Arc::new(dev));
        }

        let kernel_metrics = KernelMetrics::default();
        reconcile_once(&mut kernel, &plan, &kernel_metrics, &health).await;

        let dataplane = Dataplane::start(
            device.clone(),
            Arc::new(socket),
            tuns,
            probes,
            config.mtu as usize,
        )
        .map_err(GatewayError::Dataplane)?;
        {
            let mut reg = registry.lock().unwrap_or_else(PoisonError::into_inner);
            let sub = reg.sub_registry_with_prefix("gateway");
            sub.register_collector(Box::new(PeerCollector::new(
                device.clone(),
                dataplane.counters.clone(),
            )));
            kernel_metrics.register(sub);
        }
        tracing::info!(
            listen = %config.listen,
            public_key = %device.public_key(),
            peers = config.peers.len(),
            mtu = config.mtu,
            "gateway running"
        );

        let mut resync = tokio::time::interval(config.reconcile_interval);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        resync.tick().await;
        loop {
            let mappings_changed = async {
                match mapping_updates.as_mut() {
                    Some(rx) => rx.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => break,
                open = mappings_changed => {
                    let Some(rx) = mapping_updates.as_mut().filter(|_| open) else {
                        // The sender is gone: nothing will change any more.
                        mapping_updates = None;
                        continue;
                    };
                    let wanted = rx.borrow_and_update().clone();
                    if wanted == input.ip_mappings {
                        continue;
                    }
                    let mut next = input.clone();
                    next.ip_mappings = wanted;
                    match tether_netplan::plan(&next) {
                        Ok(p) => {
                            tracing::info!(
                                published = next.ip_mappings.len(),
                                "published addresses changed: applying them in place"
                            );
                            input = next;
                            plan = p;
                            reconcile_once(&mut kernel, &plan, &kernel_metrics, &health).await;
                        }
                        Err(e) => tracing::warn!(
                            error = %e,
                            "the new published addresses cannot be planned; keeping the previous ones"
                        ),
                    }
                }
                _ = resync.tick() => {
                    reconcile_once(&mut kernel, &plan, &kernel_metrics, &health).await;
                    if dataplane.healthy() {
                        health.set_healthy("dataplane");
                    } else {
                        health.set_unhealthy("dataplane", "a packet loop has stopped");
                    }
                }
            }
        }

        tracing::info!("shutting down: stopping packet loops and removing kernel state");
        let stop = tokio::task::spawn_blocking(move || dataplane.stop());
        let _ = stop.await;
        match kernel.teardown().await {
            Ok(report) if report.is_success() => {
                tracing::info!(ops = report.applied.len(), "kernel state removed");
            }
            Ok(report) => {
                for f in &report.failed {
                    tracing::warn!(op = %f.op, error = %f.error, "teardown operation failed");
                }
            }
            Err(e) => tracing::warn!(error = %e, "teardown failed"),
        }
        Ok(())
    }
}

/// The WireGuard peers, in the order of `config.peers` (the TUN devices' order too).
fn peer_configs(config: &Config) -> Vec<PeerConfig> {
    config
        .peers
        .iter()
        .map(|p| {
            let mut allowed: Vec<ipnet::IpNet> = vec![p.pod_cidr.into()];
            allowed.extend(p.external_cidr.map(ipnet::IpNet::from));
            allowed.extend(crate::probe::allowed_ips());
            PeerConfig {
                id: p.id.clone(),
                public_key: p.public_key,
                endpoint: p.endpoint,
                persistent_keepalive: p.persistent_keepalive,
                allowed_ips: AllowedIps::new(allowed),
            }
        })
        .collect()
}

fn create_tun(name: &str, mtu: u32) -> Result<SyncDevice, GatewayError> {
    let err = |source| GatewayError::Tun {
        name: name.to_owned(),
        source,
    };
    let mtu16 = u16::try_from(mtu).map_err(|_| err(std::io::Error::other("MTU above 65535")))?;
    // Created down: IPv6 is switched off before the link comes up (prepare_tunnel), so no
    // router solicitation or MLD report ever enters the tunnel.
    DeviceBuilder::new()
        .name(name)
        .mtu(mtu16)
        .offload(true)
        .enable(false)
        .build_sync()
        .map_err(err)
}

async fn reconcile_once(kernel: &mut Kernel, plan: &Plan, m: &KernelMetrics, health: &Health) {
    let result: Result<ReconcileReport, KernelError> = kernel.reconcile(plan).await;
    match result {
        Ok(report) => {
            m.ops_applied.inc_by(report.applied.len() as u64);
            m.ops_failed.inc_by(report.failed.len() as u64);
            if report.drift_detected {
                m.drift.inc();
            }
            if report.is_success() {
                m.reconciles
                    .get_or_create(&ResultLabels { result: "success" })
                    .inc();
                if !report.is_noop() {
                    tracing::info!(ops = report.applied.len(), "kernel state reconciled");
                }
                health.set_healthy("kernel");
            } else {
                m.reconciles
                    .get_or_create(&ResultLabels { result: "failure" })
                    .inc();
                let first = &report.failed[0];
                tracing::warn!(failed = report.failed.len(), op = %first.op, error = %first.error, "kernel reconcile incomplete; retrying");
                health.set_unhealthy("kernel", format!("{} failed: {}", first.op, first.error));
            }
        }
        Err(e) => {
            m.reconciles
                .get_or_create(&ResultLabels { result: "failure" })
                .inc();
            tracing::warn!(error = %e, "kernel reconcile failed; retrying");
            health.set_unhealthy("kernel", e.to_string());
        }
    }
}
