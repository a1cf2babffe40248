//! The [`Kernel`] adapter: observe our objects, diff against a netplan [`Plan`], apply the
//! operations, report what happened.

use std::path::PathBuf;
use std::time::Duration;

use rtnetlink::Handle;
use tether_netplan::{Observed, Op, Ownership, Plan, Sysctl};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::error::KernelError;
use crate::netlink::{self, Links};
use crate::nft::{Nft, TableListing};
use crate::sysctl;

/// Default tag on every route, rule and address we create (the netlink "protocol" field;
/// `ip route` shows it as `proto 116`). Unassigned in iproute2's `rt_protos`.
pub const DEFAULT_PROTOCOL: u8 = 116;

/// How the adapter recognises its own objects and where it finds `nft`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelConfig {
    /// Our nftables table, route tables and rule priority (from netplan's
    /// `GatewayInput::ownership`).
    pub ownership: Ownership,
    /// Tag on our routes, rules and addresses; objects without it are never read or changed.
    pub protocol: u8,
    /// The `nft` binary (default: `nft`, looked up on `PATH`).
    pub nft_program: PathBuf,
}

impl KernelConfig {
    /// A configuration with the default protocol tag and `nft` from `PATH`.
    pub fn new(ownership: Ownership) -> Self {
        Self {
            ownership,
            protocol: DEFAULT_PROTOCOL,
            nft_program: PathBuf::from("nft"),
        }
    }
}

/// An operation that failed, with the error naming the object.
#[derive(Debug)]
pub struct OpFailure {
    /// The operation.
    pub op: Op,
    /// Why it failed.
    pub error: KernelError,
}

/// What one [`Kernel::reconcile`] or [`Kernel::teardown`] did, for logs and metrics.
#[derive(Debug, Default)]
pub struct ReconcileReport {
    /// Operations that succeeded, in order.
    pub applied: Vec<Op>,
    /// Operations that failed; the next reconcile retries them.
    pub failed: Vec<OpFailure>,
    /// The kernel no longer matched a plan we had fully applied: something outside changed or
    /// removed our objects, and this reconcile repaired what it could.
    pub drift_detected: bool,
}

impl ReconcileReport {
    /// Whether every operation succeeded (also when there was nothing to do).
    pub fn is_success(&self) -> bool {
        self.failed.is_empty()
    }

    /// Whether nothing had to change.
    pub fn is_noop(&self) -> bool {
        self.applied.is_empty() && self.failed.is_empty()
    }
}

/// Programs one network namespace: the one of the thread that called [`Kernel::new`] (the
/// netlink socket is bound there) and of the threads that run its methods (sysctls and `nft`
/// act on the caller's namespace). Construct and use it inside that namespace.
///
/// It owns only what its [`KernelConfig`] says (one nftables table, a range of route tables,
/// one rule priority, objects tagged with its protocol) and never reads or changes anything
/// else, so it coexists with other software in the namespace.
#[derive(Debug)]
pub struct Kernel {
    pub(crate) handle: Handle,
    connection: JoinHandle<()>,
    config: KernelConfig,
    nft: Nft,
    /// The plan most recently applied without a failure; a later diff against the same plan
    /// means somebody else changed the kernel (drift).
    last_applied: Option<Plan>,
    /// Our table as listed right after we wrote it.
    written_table: Option<TableListing>,
}

impl Drop for Kernel {
    fn drop(&mut self) {
        self.connection.abort();
    }
}

impl Kernel {
    /// Opens the rtnetlink socket in the calling thread's network namespace. Must be called
    /// within a tokio runtime (the netlink connection runs as a task on it).
    pub fn new(config: KernelConfig) -> Result<Self, KernelError> {
        let (connection, handle, _) = rtnetlink::new_connection().map_err(KernelError::Connect)?;
        let connection = tokio::spawn(connection);
        let nft = Nft::new(&config.nft_program);
        Ok(Self {
            handle,
            connection,
            config,
            nft,
            last_applied: None,
            written_table: None,
        })
    }

    /// The configuration this adapter was built with.
    pub fn config(&self) -> &KernelConfig {
        &self.config
    }

    /// Reads back our objects: routes in our tables, rules at our priority (both with our
    /// protocol tag), our addresses, our nftables table, and the current values of the sysctls
    /// `desired` names (none without a plan).
    pub async fn observe(&self, desired: Option<&Plan>) -> Result<Observed, KernelError> {
        let ownership = &self.config.ownership;
        let protocol = self.config.protocol;
        let links = Links::dump(&self.handle).await?;
        let routes =
            netlink::owned_routes(&self.handle, &links, ownership.route_tables, protocol).await?;
        let (rules, local_rule_hidden) =
            netlink::owned_rules(&self.handle, ownership, protocol).await?;
        let addresses = netlink::owned_addresses(&self.handle, &links, protocol).await?;
        let sysctls = desired
            .map(|plan| {
                plan.sysctls
                    .iter()
                    // An unreadable key (interface not there yet) counts as different.
                    .filter_map(|s| Some(Sysctl::new(s.key.clone(), sysctl::read(&s.key).ok()?)))
                    .collect()
            })
            .unwrap_or_default();
        let ruleset_fingerprint = self.nft.list(&ownership.table).await?.map(|listing| {
            match &self.written_table {
                // Same comment but other content: edited behind our back. An empty fingerprint
                // makes the diff rewrite the table.
                Some(written)
                    if written.fingerprint == listing.fingerprint
                        && written.text != listing.text =>
                {
                    let table = &ownership.table;
                    tracing::warn!(%table, "nftables table edited by someone else");
                    String::new()
                }
                _ => listing.fingerprint,
            }
        });
        Ok(Observed {
            routes,
            rules,
            ruleset_fingerprint,
            sysctls,
            addresses,
            local_rule_hidden,
        })
    }

    /// Makes the namespace match `desired`: observe, diff, apply. Returns what was done;
    /// `Err` only when the kernel could not be read or the plan reaches outside our ownership,
    /// in which case nothing was changed.
    pub async fn reconcile(&mut self, desired: &Plan) -> Result<ReconcileReport, KernelError> {
        self.check_ownership(desired)?;
        let observed = self.observe(Some(desired)).await?;
        let ops = tether_netplan::diff(desired, &observed);
        let drift_detected = !ops.is_empty() && self.last_applied.as_ref() == Some(desired);
        if drift_detected {
            tracing::warn!(
                ops = ops.len(),
                "kernel state drifted from the applied plan; repairing"
            );
        }
        let mut report = self.apply(ops).await;
        report.drift_detected = drift_detected;
        self.last_applied = report.is_success().then(|| desired.clone());
        Ok(report)
    }

    /// Removes everything we own: our nftables table, our rules, the routes in our tables and
    /// our addresses. Sysctls stay (they belong to the namespace).
    pub async fn teardown(&mut self) -> Result<ReconcileReport, KernelError> {
        let observed = self.observe(None).await?;
        let ops = tether_netplan::teardown(&self.config.ownership.table, &observed);
        self.last_applied = None;
        let report = self.apply(ops).await;
        self.written_table = None;
        Ok(report)
    }

    /// Applies `ops` in order. Every operation is attempted; failures are collected, so one
    /// missing interface does not hold back the other peers. nftables changes are atomic.
    pub async fn apply(&mut self, ops: Vec<Op>) -> ReconcileReport {
        let mut report = ReconcileReport::default();
        if ops.is_empty() {
            return report;
        }
        // One link dump for the whole batch; ops here never create or delete interfaces.
        let links = match Links::dump(&self.handle).await {
            Ok(links) => links,
            Err(error) => {
                tracing::warn!(%error, "cannot list interfaces; route and address ops will fail");
                Links::default()
            }
        };
        for op in ops {
            match self.apply_one(&op, &links).await {
                Ok(()) => {
                    tracing::debug!(%op, "applied");
                    report.applied.push(op);
                }
                Err(error) => {
                    tracing::warn!(%op, %error, "kernel operation failed");
                    report.failed.push(OpFailure { op, error });
                }
            }
        }
        report
    }

    async fn apply_one(&mut self, op: &Op, links: &Links) -> Result<(), KernelError> {
        let protocol = self.config.protocol;
        let handle = &self.handle;
        match op {
            Op::AddRoute(route) => netlink::add_route(handle, links, route, protocol).await,
            Op::DelRoute(route) => netlink::del_route(handle, links, route, protocol).await,
            Op::AddRule(rule) => netlink::add_rule(handle, rule, protocol).await,
            Op::DelRule(rule) => netlink::del_rule(handle, rule, protocol).await,
            Op::HideLocalRule => netlink::hide_local_rule(handle).await,
            Op::RestoreLocalRule => netlink::restore_local_rule(handle).await,
            Op::AddAddress(address) => netlink::add_address(handle, links, address, protocol).await,
            Op::DelAddress(address) => netlink::del_address(handle, links, address).await,
            Op::SetSysctl(s) => sysctl::write(&s.key, &s.value),
            Op::ReplaceRuleset(ruleset) => {
                self.written_table = None;
                self.nft.apply(ruleset).await?;
                // Remember exactly what the kernel holds now, to notice later edits.
                self.written_table = self.nft.list(&ruleset.table).await?;
                Ok(())
            }
            Op::DeleteRuleset(table) => {
                self.written_table = None;
                self.nft.delete(table).await
            }
        }
    }

    fn check_ownership(&self, plan: &Plan) -> Result<(), KernelError> {
        let ownership = &self.config.ownership;
        let (first, last) = ownership.route_tables;
        if plan.ownership != *ownership {
            return Err(KernelError::NotOwned {
                object: format!("plan for {:?}", plan.ownership),
                why: format!("this adapter owns {ownership:?}"),
            });
        }
        if plan.nft.table != ownership.table {
            return Err(KernelError::NotOwned {
                object: format!("nftables table {}", plan.nft.table),
                why: format!("our table is {}", ownership.table),
            });
        }
        if let Some(route) = plan
            .routes
            .iter()
            .find(|r| !(first..=last).contains(&r.table))
        {
            return Err(KernelError::NotOwned {
                object: format!("route {route}"),
                why: format!("our route tables are {first}-{last}"),
            });
        }
        if let Some(rule) = plan
            .rules
            .iter()
            .find(|r| !ownership.owns_rule_priority(r.priority))
        {
            return Err(KernelError::NotOwned {
                object: format!("rule {rule}"),
                why: format!(
                    "our rule priorities are {} and {}",
                    ownership.rule_priority,
                    ownership.local_rule_priority()
                ),
            });
        }
        Ok(())
    }

    /// Keeps the namespace at the latest plan from `desired` until the sender goes away:
    /// reconciles on every change and every `resync` (which repairs drift), and hands each
    /// outcome to `on_report` (for logs and metrics). `None` means "nothing yet". Returns the
    /// adapter so the caller can [`Kernel::teardown`].
    pub async fn run(
        mut self,
        mut desired: watch::Receiver<Option<Plan>>,
        resync: Duration,
        mut on_report: impl FnMut(Result<&ReconcileReport, &KernelError>),
    ) -> Self {
        let mut tick = tokio::time::interval(resync);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await; // the first tick is immediate; the loop reconciles right away anyway
        loop {
            let plan = desired.borrow_and_update().clone();
            if let Some(plan) = plan {
                match self.reconcile(&plan).await {
                    Ok(report) => on_report(Ok(&report)),
                    Err(error) => on_report(Err(&error)),
                }
            }
            tokio::select! {
                changed = desired.changed() => if changed.is_err() { return self },
                _ = tick.tick() => {}
            }
        }
    }
}
