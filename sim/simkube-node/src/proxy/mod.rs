//! The node's service proxy and pod routes: watches Services, EndpointSlices and Nodes, keeps
//! one nftables table of its own in the node namespace (kube-proxy's nftables mode, see
//! [`plan`]) and the host-gw routes to other nodes' pod CIDRs (`ip route ... proto`
//! [`DEFAULT_ROUTE_PROTO`]), and removes both when the agent stops. UDP conntrack entries the
//! new rules would never see again are deleted after each apply ([`conntrack`]).
//!
//! It runs on the agent's threads, which are in the node namespace; the `nft` and `ip` child
//! processes inherit that namespace. The table is replaced in one `nft -f -` transaction, and
//! only when the rendered script changed (or the table vanished), so an idle cluster costs one
//! `nft list table` and one `ip route show` per resync.

pub mod conntrack;
pub mod model;
pub mod plan;

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use futures::stream::{BoxStream, SelectAll};
use futures::{Stream, StreamExt as _};
use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::io::AsyncWriteExt as _;
use tokio::process::Command;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use self::model::{NodeInfo, ServiceInfo, SliceInfo};
use self::plan::{PodRoute, ProxyInput};

/// The longest pause between retries of a failed apply.
const MAX_RETRY: Duration = Duration::from_secs(30);

/// Default name of the proxy's table (family `ip`).
pub const DEFAULT_TABLE: &str = "simkube-proxy";

/// Routing protocol number marking the pod routes this proxy owns (unassigned in iproute2's
/// `rt_protos`; Tether's own kernel routes use 116).
pub const DEFAULT_ROUTE_PROTO: u8 = 245;

/// How the service proxy behaves.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// The cluster's pod CIDR (all nodes' pod CIDRs): sources in it are pods, and pod traffic
    /// leaving it is masqueraded.
    pub cluster_cidr: Ipv4Net,
    /// The service CIDR, if known: unallocated addresses in it are dropped at the node.
    pub service_cidr: Option<Ipv4Net>,
    /// The nftables table (family `ip`) the proxy owns; default [`DEFAULT_TABLE`].
    pub table: String,
    /// The `proto` of the pod routes the proxy owns; default [`DEFAULT_ROUTE_PROTO`].
    pub route_proto: u8,
    /// Keep routes to other nodes' pod CIDRs (host-gw). Default on.
    pub routes: bool,
    /// Masquerade pod traffic leaving `cluster_cidr` (ip-masq-agent). Default on.
    pub egress_masquerade: bool,
    /// The node's uplink: egress is masqueraded only out of this interface. `None` (the
    /// default): the device of the node's default route, found when the proxy starts (without
    /// one, egress is masqueraded out of any interface).
    pub uplink: Option<String>,
    /// The mark bit asking for masquerading; default kube-proxy's `0x4000`.
    pub masquerade_mark: u32,
    /// Quiet time after a change before re-planning (default 100 ms), so a burst of changes
    /// costs one apply.
    pub debounce: Duration,
    /// How often the table's presence and the routes are checked (default 10 s).
    pub resync: Duration,
    /// Counters; clone it before handing the configuration over to read them.
    pub stats: ProxyStats,
}

impl ProxyConfig {
    /// Defaults for a cluster whose pods live in `cluster_cidr`.
    pub fn new(cluster_cidr: Ipv4Net) -> Self {
        Self {
            cluster_cidr: cluster_cidr.trunc(),
            service_cidr: None,
            table: DEFAULT_TABLE.to_owned(),
            route_proto: DEFAULT_ROUTE_PROTO,
            routes: true,
            egress_masquerade: true,
            uplink: None,
            masquerade_mark: plan::DEFAULT_MASQUERADE_MARK,
            debounce: Duration::from_millis(100),
            resync: Duration::from_secs(10),
            stats: ProxyStats::default(),
        }
    }

    fn validate(&self) -> Result<(), String> {
        let table_ok = !self.table.is_empty()
            && self.table.len() <= 64
            && self.table.starts_with(|c: char| c.is_ascii_alphabetic())
            && self
                .table
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !table_ok {
            return Err(format!(
                "proxy table name {:?} must start with a letter and hold at most 64 letters, \
                 digits, '-' or '_'",
                self.table
            ));
        }
        if self.masquerade_mark.count_ones() != 1 {
            return Err(format!(
                "proxy masquerade mark {:#x} must be a single bit",
                self.masquerade_mark
            ));
        }
        if let Some(dev) = &self.uplink
            && (dev.is_empty()
                || dev.len() > 15
                || dev
                    .chars()
                    .any(|c| c.is_whitespace() || matches!(c, '/' | '"' | ':')))
        {
            return Err(format!(
                "uplink {dev:?} is not an interface name (1 to 15 characters, no '/', ':', \
                 quotes or spaces)"
            ));
        }
        if self.route_proto <= 4 {
            return Err(format!(
                "route proto {} is reserved by the kernel; choose 5..=255",
                self.route_proto
            ));
        }
        Ok(())
    }
}

/// Whether the proxy's rules and routes are in place, for the agent's supervisor.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "state", rename_all = "camelCase")]
pub enum ProxyHealth {
    /// Waiting for the first lists of Services, EndpointSlices and Nodes.
    Starting,
    /// The last apply of rules and routes succeeded.
    Ready,
    /// The last `failures` applies in a row failed; `error` is the latest reason.
    Failing {
        /// Failed attempts in a row.
        failures: u32,
        /// Why the latest one failed.
        error: String,
    },
}

/// The proxy's counters and gauges, shared by clones (register them once with
/// [`ProxyStats::register`]), and its health.
#[derive(Debug, Clone)]
pub struct ProxyStats {
    applies: Counter,
    apply_failures: Counter,
    table_restores: Counter,
    route_changes: Counter,
    route_failures: Counter,
    conntrack_cleared: Counter,
    service_ports: Gauge,
    endpoints: Gauge,
    routes: Gauge,
    last_apply_seconds: Gauge<f64, AtomicU64>,
    health: Arc<watch::Sender<ProxyHealth>>,
}

impl Default for ProxyStats {
    fn default() -> Self {
        Self {
            applies: Counter::default(),
            apply_failures: Counter::default(),
            table_restores: Counter::default(),
            route_changes: Counter::default(),
            route_failures: Counter::default(),
            conntrack_cleared: Counter::default(),
            service_ports: Gauge::default(),
            endpoints: Gauge::default(),
            routes: Gauge::default(),
            last_apply_seconds: Gauge::default(),
            health: Arc::new(watch::channel(ProxyHealth::Starting).0),
        }
    }
}

impl ProxyStats {
    /// The proxy's health now.
    pub fn health(&self) -> ProxyHealth {
        self.health.borrow().clone()
    }

    /// Follows the proxy's health as it changes.
    pub fn watch_health(&self) -> watch::Receiver<ProxyHealth> {
        self.health.subscribe()
    }

    fn set_health(&self, health: ProxyHealth) {
        self.health.send_if_modified(|current| {
            let changed = *current != health;
            *current = health;
            changed
        });
    }

    /// Successful `nft -f` applies.
    pub fn applies(&self) -> u64 {
        self.applies.get()
    }

    /// Failed `nft -f` applies.
    pub fn apply_failures(&self) -> u64 {
        self.apply_failures.get()
    }

    /// Times the table was found missing and put back.
    pub fn table_restores(&self) -> u64 {
        self.table_restores.get()
    }

    /// Routes added, replaced or removed.
    pub fn route_changes(&self) -> u64 {
        self.route_changes.get()
    }

    /// Failed route commands.
    pub fn route_failures(&self) -> u64 {
        self.route_failures.get()
    }

    /// UDP conntrack entries removed because their endpoint left the rules.
    pub fn conntrack_cleared(&self) -> u64 {
        self.conntrack_cleared.get()
    }

    /// Registers every metric under `simkube_proxy_*`.
    pub fn register(&self, registry: &mut Registry) {
        let sub = registry.sub_registry_with_prefix("simkube_proxy");
        sub.register(
            "applies",
            "nftables rule sets applied",
            self.applies.clone(),
        );
        sub.register(
            "apply_failures",
            "nftables rule sets the kernel refused",
            self.apply_failures.clone(),
        );
        sub.register(
            "table_restores",
            "times the proxy table was missing and re-applied",
            self.table_restores.clone(),
        );
        sub.register(
            "route_changes",
            "pod routes added, replaced or removed",
            self.route_changes.clone(),
        );
        sub.register(
            "route_failures",
            "pod route commands that failed",
            self.route_failures.clone(),
        );
        sub.register(
            "conntrack_cleared",
            "UDP conntrack entries removed with their endpoint",
            self.conntrack_cleared.clone(),
        );
        sub.register(
            "service_ports",
            "service ports in the applied rules",
            self.service_ports.clone(),
        );
        sub.register(
            "endpoints",
            "endpoint chains in the applied rules",
            self.endpoints.clone(),
        );
        sub.register(
            "routes",
            "routes to other nodes' pod CIDRs",
            self.routes.clone(),
        );
        sub.register(
            "last_apply_seconds",
            "duration of the last nft apply",
            self.last_apply_seconds.clone(),
        );
    }
}

/// Why a proxy step failed.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The configuration is invalid.
    #[error("invalid proxy configuration: {0}")]
    Config(String),
    /// A command could not run or failed.
    #[error("`{command}` failed: {message}")]
    Command {
        /// The command line (without the script).
        command: String,
        /// Its stderr or the OS error.
        message: String,
    },
    /// Stale UDP conntrack entries could not be removed.
    #[error("conntrack: {0}")]
    Conntrack(String),
}

/// Which node the proxy serves.
#[derive(Debug, Clone)]
pub struct ProxyNode {
    /// The Node's name: endpoints with this `nodeName` are local.
    pub name: String,
    /// The node's own pod CIDR (never routed away).
    pub pod_cidr: Option<Ipv4Net>,
}

/// Checks `config` before the agent starts, so a bad value fails the start with a clear error.
pub fn validate(config: &ProxyConfig) -> Result<(), ProxyError> {
    config.validate().map_err(ProxyError::Config)
}

enum Change {
    Event,
    Listed(usize),
    Failed(usize, String),
}

fn watch_kind<K>(api: Api<K>, index: usize) -> (Store<K>, BoxStream<'static, Change>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(
        writer,
        watcher::watcher(api, watcher::Config::default()).default_backoff(),
    )
    .map(move |event| match event {
        Ok(Event::InitDone) => Change::Listed(index),
        Ok(_) => Change::Event,
        Err(error) => Change::Failed(index, error.to_string()),
    });
    (reader, stream.boxed())
}

struct State {
    config: ProxyConfig,
    node: ProxyNode,
    services: Store<Service>,
    slices: Store<EndpointSlice>,
    nodes: Store<Node>,
    applied: Option<String>,
    /// UDP endpoints of the applied rules (`None` before the first apply of this run).
    udp_targets: Option<BTreeSet<(Ipv4Addr, u16)>>,
    /// UDP frontends with endpoints in the applied rules.
    udp_frontends: BTreeSet<(Option<Ipv4Addr>, u16)>,
    warnings: BTreeSet<String>,
    /// The route planner's warnings, logged when they first appear.
    route_warnings: BTreeSet<String>,
    /// Why the latest apply of rules or routes failed, for [`ProxyHealth::Failing`].
    last_error: Option<String>,
}

impl State {
    fn input(&self) -> ProxyInput {
        ProxyInput {
            table: self.config.table.clone(),
            node_name: self.node.name.clone(),
            cluster_cidr: self.config.cluster_cidr,
            service_cidr: self.config.service_cidr,
            masquerade_mark: self.config.masquerade_mark,
            egress_masquerade: self.config.egress_masquerade,
            uplink: self.config.uplink.clone(),
            services: self
                .services
                .state()
                .iter()
                .filter_map(|s| ServiceInfo::from_service(s))
                .collect(),
            slices: self
                .slices
                .state()
                .iter()
                .filter_map(|s| SliceInfo::from_slice(s))
                .collect(),
        }
    }

    fn note_warnings(&mut self, warnings: Vec<String>) {
        let now: BTreeSet<String> = warnings.into_iter().collect();
        for warning in now.difference(&self.warnings) {
            tracing::warn!(%warning, "service proxy");
        }
        self.warnings = now;
    }

    /// Re-plans and applies if the script changed (or `force`); `false` if the apply failed.
    async fn sync_rules(&mut self, force: bool) -> bool {
        let plan = plan::plan(&self.input());
        let mut warnings = plan.warnings.clone();
        if !force && self.applied.as_deref() == Some(plan.script.as_str()) {
            self.note_warnings(warnings);
            return true;
        }
        let stats = &self.config.stats;
        let started = Instant::now();
        let result = nft_apply(&plan.script).await;
        let elapsed = started.elapsed();
        stats.last_apply_seconds.set(elapsed.as_secs_f64());
        let ok = match result {
            Ok(()) => {
                stats.applies.inc();
                stats
                    .service_ports
                    .set(i64::try_from(plan.service_ports).unwrap_or(i64::MAX));
                stats
                    .endpoints
                    .set(i64::try_from(plan.endpoints).unwrap_or(i64::MAX));
                tracing::info!(
                    table = %self.config.table,
                    service_ports = plan.service_ports,
                    endpoints = plan.endpoints,
                    bytes = plan.script.len(),
                    elapsed_ms = elapsed.as_millis(),
                    "service proxy rules applied"
                );
                self.applied = Some(plan.script);
                self.clear_stale_udp(plan.udp_targets, plan.udp_frontends);
                true
            }
            Err(error) => {
                stats.apply_failures.inc();
                tracing::error!(%error, table = %self.config.table, "cannot apply service proxy rules");
                self.last_error = Some(format!("applying its nftables rules: {error}"));
                self.applied = None;
                false
            }
        };
        warnings.sort();
        self.note_warnings(warnings);
        ok
    }

    async fn sync_routes(&mut self) -> bool {
        if !self.config.routes {
            return true;
        }
        let nodes: Vec<NodeInfo> = self
            .nodes
            .state()
            .iter()
            .filter_map(|n| NodeInfo::from_node(n))
            .collect();
        let (desired, warnings) = plan::plan_routes(&self.node.name, self.node.pod_cidr, &nodes);
        let warnings: BTreeSet<String> = warnings.into_iter().collect();
        for warning in warnings.difference(&self.route_warnings) {
            tracing::warn!(%warning, "pod routes");
        }
        self.route_warnings = warnings;
        let proto = self.config.route_proto;
        let stats = &self.config.stats;
        let current = match routes_with_proto(proto).await {
            Ok(current) => current,
            Err(error) => {
                stats.route_failures.inc();
                tracing::warn!(%error, "cannot list pod routes");
                self.last_error = Some(format!("listing its pod routes: {error}"));
                return false;
            }
        };
        let mut ok = true;
        for route in &current {
            if desired.iter().any(|d| d.cidr == route.cidr) {
                continue;
            }
            let cidr = route.cidr.to_string();
            let proto = proto.to_string();
            match ip(&["-4", "route", "del", &cidr, "proto", &proto]).await {
                Ok(_) => {
                    stats.route_changes.inc();
                    tracing::info!(%cidr, "pod route removed");
                }
                Err(error) => {
                    ok = false;
                    stats.route_failures.inc();
                    tracing::warn!(%error, "cannot remove pod route");
                    self.last_error = Some(format!("removing a pod route: {error}"));
                }
            }
        }
        for route in &desired {
            if current.contains(route) {
                continue;
            }
            let (cidr, via, proto) = (
                route.cidr.to_string(),
                route.via.to_string(),
                proto.to_string(),
            );
            match ip(&[
                "-4", "route", "replace", &cidr, "via", &via, "proto", &proto,
            ])
            .await
            {
                Ok(_) => {
                    stats.route_changes.inc();
                    tracing::info!(%cidr, %via, "pod route set");
                }
                Err(error) => {
                    ok = false;
                    stats.route_failures.inc();
                    tracing::warn!(%error, "cannot set pod route");
                    self.last_error = Some(format!("setting a pod route: {error}"));
                }
            }
        }
        stats
            .routes
            .set(i64::try_from(desired.len()).unwrap_or(i64::MAX));
        ok
    }

    /// Removes the UDP conntrack entries the new rules would never see again (synchronously:
    /// the netlink socket must be opened on this thread, in the node namespace): flows DNATed
    /// to endpoints the rules dropped, and flows that reached a frontend untranslated before it
    /// had endpoints (or before this agent's rules existed).
    fn clear_stale_udp(
        &mut self,
        targets: BTreeSet<(Ipv4Addr, u16)>,
        frontends: BTreeSet<(Option<Ipv4Addr>, u16)>,
    ) {
        let gone: Vec<(Ipv4Addr, u16)> = match &self.udp_targets {
            Some(before) => before.difference(&targets).copied().collect(),
            None => Vec::new(),
        };
        let new: Vec<(Option<Ipv4Addr>, u16)> =
            frontends.difference(&self.udp_frontends).copied().collect();
        self.udp_targets = Some(targets);
        self.udp_frontends = frontends;
        if gone.is_empty() && new.is_empty() {
            return;
        }
        let stale = |flow: &conntrack::Flow| {
            gone.iter().any(|t| flow.udp_nat_to(*t))
                || new.iter().any(|f| flow.udp_untranslated_to(*f))
        };
        match conntrack::clear_flows(stale) {
            Ok(n) => {
                self.config
                    .stats
                    .conntrack_cleared
                    .inc_by(u64::try_from(n).unwrap_or(0));
                if n > 0 {
                    tracing::info!(flows = n, "stale UDP flows removed");
                }
            }
            Err(error) => tracing::warn!(%error, "cannot remove stale UDP flows"),
        }
    }

    /// Puts the table back if something deleted it.
    async fn check_table(&mut self) -> bool {
        if self.applied.is_none() {
            return self.sync_rules(true).await;
        }
        match table_exists(&self.config.table).await {
            Ok(true) => true,
            Ok(false) => {
                tracing::warn!(table = %self.config.table, "service proxy table vanished; applying it again");
                self.config.stats.table_restores.inc();
                self.sync_rules(true).await
            }
            Err(error) => {
                tracing::warn!(%error, "cannot check the service proxy table");
                self.last_error = Some(format!("checking its nftables table: {error}"));
                false
            }
        }
    }

    async fn cleanup(&self) {
        let table = &self.config.table;
        match table_exists(table).await {
            Ok(true) => match nft(&["delete", "table", "ip", table]).await {
                Ok(_) => tracing::info!(%table, "service proxy table removed"),
                Err(error) => tracing::warn!(%error, "cannot remove the service proxy table"),
            },
            Ok(false) => {}
            Err(error) => tracing::warn!(%error, "cannot check the service proxy table"),
        }
        if self.config.routes {
            let proto = self.config.route_proto.to_string();
            if let Err(error) = ip(&["-4", "route", "flush", "proto", &proto]).await {
                tracing::warn!(%error, "cannot remove pod routes");
            }
        }
    }
}

/// Runs the proxy for `node` until `shutdown` fires, then removes its table and routes.
///
/// Nothing is applied before Services, EndpointSlices and Nodes have all been listed once, so
/// a restarted agent never briefly serves an empty rule set.
pub async fn run(
    client: Client,
    node: ProxyNode,
    config: ProxyConfig,
    shutdown: CancellationToken,
) -> Result<(), ProxyError> {
    validate(&config)?;
    if let Some(own) = node.pod_cidr
        && !config.cluster_cidr.contains(&own)
    {
        // Its pods would count as outsiders: masqueraded when leaving, masqueraded to services.
        tracing::warn!(
            pod_cidr = %own,
            cluster_cidr = %config.cluster_cidr,
            "this node's pod CIDR is outside the cluster CIDR the service proxy was given"
        );
    }
    let mut config = config;
    if config.egress_masquerade && config.uplink.is_none() {
        match default_route_device().await {
            Ok(Some(dev)) => {
                tracing::info!(uplink = %dev, "pod egress is masqueraded out of the uplink only");
                config.uplink = Some(dev);
            }
            Ok(None) => tracing::warn!(
                "no default route to tell the uplink by: pod egress is masqueraded out of any \
                 interface"
            ),
            Err(error) => tracing::warn!(
                %error,
                "cannot read the default route: pod egress is masqueraded out of any interface"
            ),
        }
    }
    let (services, s1) = watch_kind::<Service>(Api::all(client.clone()), 0);
    let (slices, s2) = watch_kind::<EndpointSlice>(Api::all(client.clone()), 1);
    let (nodes, s3) = watch_kind::<Node>(Api::all(client), 2);
    let mut changes: SelectAll<BoxStream<'static, Change>> =
        futures::stream::select_all([s1, s2, s3]);
    let mut state = State {
        config,
        node,
        services,
        slices,
        nodes,
        applied: None,
        udp_targets: None,
        udp_frontends: BTreeSet::new(),
        warnings: BTreeSet::new(),
        route_warnings: BTreeSet::new(),
        last_error: None,
    };
    let debounce = state.config.debounce;
    let mut listed = [false; 3];
    let mut due: Option<tokio::time::Instant> = None;
    let mut resync = tokio::time::interval(state.config.resync);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Failed applies and route changes are retried with a doubling delay (1 s to 30 s), so a
    // missing `nft` does not flood the log.
    let mut failures: u32 = 0;
    let retry = |failures: u32| Duration::from_secs(1u64 << failures.min(5)).min(MAX_RETRY);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            change = next(&mut changes) => match change {
                Some(Change::Listed(i)) => {
                    listed[i] = true;
                    due.get_or_insert_with(|| tokio::time::Instant::now() + debounce);
                }
                Some(Change::Event) => {
                    due.get_or_insert_with(|| tokio::time::Instant::now() + debounce);
                }
                Some(Change::Failed(i, error)) => {
                    let kind = ["services", "endpointslices", "nodes"][i];
                    tracing::warn!(%error, kind, "service proxy watch failed; retrying");
                }
                None => break,
            },
            () = sleep_until(due) => {
                due = None;
                if listed.iter().all(|l| *l) {
                    let rules = state.sync_rules(false).await;
                    let routes = state.sync_routes().await;
                    if rules && routes {
                        failures = 0;
                        state.config.stats.set_health(ProxyHealth::Ready);
                    } else {
                        due = Some(tokio::time::Instant::now() + retry(failures));
                        failures = failures.saturating_add(1);
                        let error = state.last_error.take().unwrap_or_default();
                        state.config.stats.set_health(ProxyHealth::Failing { failures, error });
                    }
                }
            }
            _ = resync.tick() => {
                if listed.iter().all(|l| *l) {
                    let rules = state.check_table().await;
                    let routes = state.sync_routes().await;
                    if !(rules && routes) {
                        due.get_or_insert_with(|| tokio::time::Instant::now() + retry(failures));
                    }
                }
            }
        }
    }
    state.cleanup().await;
    Ok(())
}

async fn next<S: Stream + Unpin>(stream: &mut S) -> Option<S::Item> {
    stream.next().await
}

async fn sleep_until(due: Option<tokio::time::Instant>) {
    match due {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn run_command(
    program: &str,
    args: &[&str],
    input: Option<&str>,
) -> Result<String, ProxyError> {
    let line = format!("{program} {}", args.join(" "));
    let failed = |message: String| ProxyError::Command {
        command: line.clone(),
        message,
    };
    let mut child = Command::new(program)
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| failed(e.to_string()))?;
    // A program that exits before reading its whole script breaks the pipe: its own error
    // output, read below, says why, so the write error only counts when there is nothing else.
    let mut write_error = None;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        write_error = stdin.write_all(text.as_bytes()).await.err();
    }
    let output = child
        .wait_with_output()
        .await
        .map_err(|e| failed(e.to_string()))?;
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_owned();
    match write_error {
        None if output.status.success() => Ok(String::from_utf8_lossy(&output.stdout).into_owned()),
        Some(error) if stderr.is_empty() => Err(failed(format!("writing the script: {error}"))),
        _ if stderr.is_empty() => Err(failed(output.status.to_string())),
        _ => Err(failed(stderr)),
    }
}

async fn nft(args: &[&str]) -> Result<String, ProxyError> {
    run_command("nft", args, None).await
}

async fn nft_apply(script: &str) -> Result<(), ProxyError> {
    run_command("nft", &["-f", "-"], Some(script))
        .await
        .map(drop)
}

async fn ip(args: &[&str]) -> Result<String, ProxyError> {
    run_command("ip", args, None).await
}

async fn table_exists(table: &str) -> Result<bool, ProxyError> {
    // `list tables` never fails for a missing table, so absence is told from presence.
    let tables = nft(&["list", "tables", "ip"]).await?;
    Ok(tables
        .lines()
        .any(|l| l.trim() == format!("table ip {table}")))
}

/// The device of the main table's IPv4 default route, if there is one.
async fn default_route_device() -> Result<Option<String>, ProxyError> {
    let json = ip(&["-j", "-4", "route", "show", "default"]).await?;
    Ok(parse_default_device(&json))
}

fn parse_default_device(json: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Entry {
        dev: Option<String>,
    }
    let entries: Vec<Entry> = serde_json::from_str(json.trim()).unwrap_or_default();
    entries.into_iter().find_map(|e| e.dev)
}

/// The routes of the main table carrying `proto`, as `(cidr, gateway)`.
async fn routes_with_proto(proto: u8) -> Result<Vec<PodRoute>, ProxyError> {
    let proto = proto.to_string();
    let json = ip(&["-j", "-4", "route", "show", "proto", &proto]).await?;
    Ok(parse_routes(&json))
}

fn parse_routes(json: &str) -> Vec<PodRoute> {
    #[derive(serde::Deserialize)]
    struct Entry {
        dst: String,
        gateway: Option<String>,
    }
    let entries: Vec<Entry> = serde_json::from_str(json.trim()).unwrap_or_default();
    entries
        .into_iter()
        .filter_map(|e| {
            let cidr = if e.dst.contains('/') {
                e.dst.parse().ok()?
            } else {
                Ipv4Net::new(e.dst.parse().ok()?, 32).ok()?
            };
            Some(PodRoute {
                cidr,
                // A route without a gateway never matches a desired one, so it is replaced.
                via: e
                    .gateway
                    .and_then(|g| g.parse().ok())
                    .unwrap_or(Ipv4Addr::UNSPECIFIED),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_listing_is_read_from_iproute2_json() {
        let json = r#"[{"dst":"10.244.2.0/24","gateway":"198.18.1.12","dev":"eth0","protocol":"245","flags":[]},
                      {"dst":"10.244.9.9","dev":"eth0","protocol":"245","scope":"link","flags":[]}]"#;
        let routes = parse_routes(json);
        assert_eq!(
            routes,
            vec![
                PodRoute {
                    cidr: "10.244.2.0/24".parse().expect("cidr"),
                    via: Ipv4Addr::new(198, 18, 1, 12)
                },
                PodRoute {
                    cidr: "10.244.9.9/32".parse().expect("cidr"),
                    via: Ipv4Addr::UNSPECIFIED
                },
            ]
        );
        assert!(parse_routes("").is_empty());
    }

    #[test]
    fn the_uplink_is_the_default_route_device() {
        let json = r#"[{"dst":"default","gateway":"198.18.1.1","dev":"eth0","flags":[]}]"#;
        assert_eq!(parse_default_device(json).as_deref(), Some("eth0"));
        assert_eq!(parse_default_device("[]"), None);
        assert_eq!(parse_default_device(""), None);
    }

    #[test]
    fn uplink_names_are_checked() {
        let mut config = ProxyConfig::new("10.244.0.0/16".parse().expect("cidr"));
        config.uplink = Some("eth0".into());
        assert_eq!(config.validate(), Ok(()));
        for bad in ["", "a-name-too-long-1", "eth0\" x", "a/b"] {
            config.uplink = Some(bad.into());
            assert!(config.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn metrics_are_registered_under_their_names() {
        let stats = ProxyStats::default();
        let mut registry = Registry::default();
        stats.register(&mut registry);
        stats.applies.inc();
        stats.routes.set(2);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        for line in [
            "simkube_proxy_applies_total 1",
            "simkube_proxy_apply_failures_total 0",
            "simkube_proxy_table_restores_total 0",
            "simkube_proxy_routes 2",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line:?} missing in:\n{text}"
            );
        }
        assert_eq!(stats.clone().applies(), 1, "clones share the counters");
    }

    #[tokio::test]
    async fn a_program_that_exits_before_reading_its_script_is_reported_by_its_own_words() {
        // More than a pipe holds, so the write fails once the program is gone.
        let script = "x".repeat(1 << 20);
        let error = run_command(
            "sh",
            &["-c", "echo cannot do it >&2; exit 3"],
            Some(&script),
        )
        .await
        .expect_err("the program fails");
        assert_eq!(
            error.to_string(),
            "`sh -c echo cannot do it >&2; exit 3` failed: cannot do it"
        );
        let silent = run_command("sh", &["-c", "exit 4"], Some(&script))
            .await
            .expect_err("the program fails");
        assert!(
            silent.to_string().contains("exit status: 4")
                || silent.to_string().contains("Broken pipe"),
            "{silent}"
        );
    }

    #[test]
    fn bad_configuration_is_named() {
        let mut config = ProxyConfig::new("10.244.0.0/16".parse().expect("cidr"));
        assert!(validate(&config).is_ok());
        config.table = "bad table".into();
        let err = validate(&config).expect_err("space").to_string();
        assert!(err.contains("\"bad table\""), "{err}");
        config.table = DEFAULT_TABLE.into();
        config.masquerade_mark = 0x3;
        assert!(
            validate(&config)
                .expect_err("two bits")
                .to_string()
                .contains("0x3")
        );
        config.masquerade_mark = 0x4000;
        config.route_proto = 2;
        assert!(validate(&config).is_err());
    }
}
