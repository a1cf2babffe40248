//! Reconciliation: the minimal, ordered operations that turn the observed kernel state into a
//! plan, and the operations that remove everything a gateway owns.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::plan::moves_local_rule;
use crate::{Address, Plan, Route, Rule, Ruleset, Sysctl};

/// One change to the kernel. [`diff`] and [`teardown`] emit them in the order they must be
/// applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// `ip route add`.
    AddRoute(Route),
    /// `ip route del`.
    DelRoute(Route),
    /// `ip rule add`.
    AddRule(Rule),
    /// `ip rule del`.
    DelRule(Rule),
    /// `nft -f -` with [`Ruleset::render`] (atomic replace of our table).
    ReplaceRuleset(Ruleset),
    /// `delete table ip <name>` (absent counts as done).
    DeleteRuleset(String),
    /// Write a sysctl.
    SetSysctl(Sysctl),
    /// `ip addr add`.
    AddAddress(Address),
    /// `ip addr del`.
    DelAddress(Address),
    /// `ip rule del pref 0 lookup local`: the kernel's local lookup goes, once our copy after
    /// the fwmark rules exists.
    HideLocalRule,
    /// `ip rule add pref 0 lookup local` (protocol `kernel`): the kernel's rule comes back,
    /// before our copy is deleted, so no lookup ever misses the local table.
    RestoreLocalRule,
}

/// What the kernel adapter read back: only our own objects (routes in our tables, rules at our
/// priority, addresses on our tunnel interfaces, our sysctls, our nftables table).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observed {
    /// Routes found in our route tables ([`crate::Ownership::route_tables`]).
    pub routes: Vec<Route>,
    /// Rules found at our priority.
    pub rules: Vec<Rule>,
    /// `Some` when our table exists: the fingerprint from its comment (see
    /// [`crate::fingerprint_from_comment`]), or an empty string if the comment is missing or
    /// foreign. `None` when the table does not exist.
    pub ruleset_fingerprint: Option<String>,
    /// Current values of the plan's sysctl keys (missing keys are treated as different).
    pub sysctls: Vec<Sysctl>,
    /// Addresses found on the tunnel interfaces.
    pub addresses: Vec<Address>,
    /// The kernel's `pref 0 lookup local` rule is absent (we moved it, or a teardown did not
    /// finish).
    #[serde(default)]
    pub local_rule_hidden: bool,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AddRoute(route) => write!(f, "ip route add {route}"),
            Self::DelRoute(route) => write!(f, "ip route del {route}"),
            Self::AddRule(rule) => write!(f, "ip rule add {rule}"),
            Self::DelRule(rule) => write!(f, "ip rule del {rule}"),
            Self::ReplaceRuleset(ruleset) => {
                write!(
                    f,
                    "nft replace table ip {} ({})",
                    ruleset.table,
                    ruleset.fingerprint()
                )
            }
            Self::DeleteRuleset(table) => write!(f, "nft delete table ip {table}"),
            Self::SetSysctl(sysctl) => write!(f, "sysctl -w {sysctl}"),
            Self::AddAddress(address) => write!(f, "ip addr add {address}"),
            Self::DelAddress(address) => write!(f, "ip addr del {address}"),
            Self::HideLocalRule => f.write_str("ip rule del pref 0 lookup local"),
            Self::RestoreLocalRule => f.write_str("ip rule add pref 0 lookup local"),
        }
    }
}

/// The operations that make `observed` equal to `desired`, in apply order:
/// rule, route and address deletions, then sysctls, address, route and rule additions, then
/// the ruleset. Deletions first keep the kernel from refusing an add that collides with a stale
/// object; routes exist before the rules that point at them, and rules before the marks that
/// select them. The ruleset is replaced only when its fingerprint differs. Each group is sorted,
/// so the result is deterministic.
///
/// Observed rules at another priority and routes outside our tables are not ours
/// ([`Plan::ownership`]): they are ignored, never deleted. The kernel's local rule is the one
/// exception: a plan with peers replaces it by a copy after the fwmark rules (added first,
/// then the original goes); a plan without restores it before the copy is deleted.
pub fn diff(desired: &Plan, observed: &Observed) -> Vec<Op> {
    let ownership = &desired.ownership;
    let (first_table, last_table) = ownership.route_tables;
    let observed_rules: Vec<Rule> = observed
        .rules
        .iter()
        .filter(|rule| ownership.owns_rule_priority(rule.priority))
        .cloned()
        .collect();
    let observed_routes: Vec<Route> = observed
        .routes
        .iter()
        .filter(|route| (first_table..=last_table).contains(&route.table))
        .cloned()
        .collect();
    let mut ops = Vec::new();
    let move_local = moves_local_rule(desired);
    if !move_local && observed.local_rule_hidden {
        ops.push(Op::RestoreLocalRule);
    }
    let (del_rules, add_rules) = set_diff(&desired.rules, &observed_rules);
    let (del_routes, add_routes) = set_diff(&desired.routes, &observed_routes);
    let (del_addresses, add_addresses) = set_diff(&desired.addresses, &observed.addresses);
    ops.extend(del_rules.into_iter().map(Op::DelRule));
    ops.extend(del_routes.into_iter().map(Op::DelRoute));
    ops.extend(del_addresses.into_iter().map(Op::DelAddress));
    for sysctl in &desired.sysctls {
        let current = observed.sysctls.iter().find(|seen| seen.key == sysctl.key);
        if current.is_none_or(|seen| seen.value.trim() != sysctl.value) {
            ops.push(Op::SetSysctl(sysctl.clone()));
        }
    }
    ops.extend(add_addresses.into_iter().map(Op::AddAddress));
    ops.extend(add_routes.into_iter().map(Op::AddRoute));
    ops.extend(add_rules.into_iter().map(Op::AddRule));
    if move_local && !observed.local_rule_hidden {
        ops.push(Op::HideLocalRule);
    }
    if observed.ruleset_fingerprint.as_deref() != Some(desired.nft.fingerprint().as_str()) {
        ops.push(Op::ReplaceRuleset(desired.nft.clone()));
    }
    ops
}

/// The operations that remove everything we own that `observed` shows: our table, our rules,
/// our routes and our tunnel addresses, after putting the kernel's local rule back. Sysctls are left alone: they belong to the namespace,
/// which outlives no gateway.
pub fn teardown(table: &str, observed: &Observed) -> Vec<Op> {
    let mut ops = Vec::new();
    if observed.local_rule_hidden {
        ops.push(Op::RestoreLocalRule);
    }
    if observed.ruleset_fingerprint.is_some() {
        ops.push(Op::DeleteRuleset(table.to_owned()));
    }
    let (del_rules, _) = set_diff(&[], &observed.rules);
    let (del_routes, _) = set_diff(&[], &observed.routes);
    let (del_addresses, _) = set_diff(&[], &observed.addresses);
    ops.extend(del_rules.into_iter().map(Op::DelRule));
    ops.extend(del_routes.into_iter().map(Op::DelRoute));
    ops.extend(del_addresses.into_iter().map(Op::DelAddress));
    ops
}

/// (observed − desired, desired − observed), each sorted and without duplicates.
fn set_diff<T: Ord + Clone>(desired: &[T], observed: &[T]) -> (Vec<T>, Vec<T>) {
    let desired: BTreeSet<&T> = desired.iter().collect();
    let observed: BTreeSet<&T> = observed.iter().collect();
    let delete = observed
        .difference(&desired)
        .map(|item| (*item).clone())
        .collect();
    let add = desired
        .difference(&observed)
        .map(|item| (*item).clone())
        .collect();
    (delete, add)
}
