//! The provider's all-or-nothing answer to a consumer's resource request.

use std::fmt;

use crate::{Amount, Resources};

/// The provider's answer to one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Granted in full.
    Accept {
        /// Exactly the request's positive entries.
        grant: Resources,
    },
    /// Nothing granted.
    Deny {
        /// Why, as a condition reason.
        reason: DenyReason,
        /// For the consumer's user: what is wrong and what to change.
        message: String,
    },
}

/// Why a request was denied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DenyReason {
    /// No resource with a positive amount.
    EmptyRequest,
    /// A negative amount.
    InvalidRequest,
    /// A resource the provider has none of.
    UnknownResource,
    /// More than is free of at least one resource.
    Insufficient,
}

impl DenyReason {
    /// The reason as a Kubernetes condition reason (`EmptyRequest`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            DenyReason::EmptyRequest => "EmptyRequest",
            DenyReason::InvalidRequest => "InvalidRequest",
            DenyReason::UnknownResource => "UnknownResource",
            DenyReason::Insufficient => "Insufficient",
        }
    }
}

impl fmt::Display for DenyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Decides one request against the provider's `capacity` and what it already granted to
/// other consumers. All or nothing: a grant is exactly the request, never a part of it.
///
/// Checked in this order, each naming every offending resource: negative amounts
/// (`InvalidRequest`), nothing asked (`EmptyRequest`), resources the provider has none of
/// (`UnknownResource`), resources where the request exceeds what is free, i.e. capacity minus
/// the others' grants and never below zero (`Insufficient`).
pub fn decide(
    request: &Resources,
    capacity: &Resources,
    granted_to_others: &Resources,
) -> Decision {
    let deny = |reason, message| Decision::Deny { reason, message };

    let negative: Vec<String> = request
        .0
        .iter()
        .filter(|(_, amount)| amount.0 < 0)
        .map(|(name, amount)| format!("{name}={amount}"))
        .collect();
    if !negative.is_empty() {
        return deny(
            DenyReason::InvalidRequest,
            format!(
                "the request has negative amounts ({}); ask for positive amounts only",
                negative.join(", ")
            ),
        );
    }
    if request.is_empty() {
        return deny(
            DenyReason::EmptyRequest,
            "the request asks for nothing; ask for at least one of cpu, memory, pods".to_owned(),
        );
    }

    let asked = || request.0.iter().filter(|(_, amount)| amount.0 > 0);
    let unknown: Vec<&str> = asked()
        .filter(|(name, _)| capacity.get(name).0 <= 0)
        .map(|(name, _)| name.as_str())
        .collect();
    if !unknown.is_empty() {
        let offered: Vec<&str> = capacity
            .0
            .iter()
            .filter(|(_, amount)| amount.0 > 0)
            .map(|(name, _)| name.as_str())
            .collect();
        let offered = if offered.is_empty() {
            "nothing".to_owned()
        } else {
            offered.join(", ")
        };
        return deny(
            DenyReason::UnknownResource,
            format!(
                "the provider has no {}; it offers {offered}",
                unknown.join(", ")
            ),
        );
    }

    let short: Vec<String> = asked()
        .filter_map(|(name, &amount)| {
            let allocatable = capacity.get(name);
            let others = granted_to_others.get(name);
            let free = Amount(allocatable.0.saturating_sub(others.0).max(0));
            (amount > free).then(|| {
                format!(
                    "{name}: asked {amount}, free {free} (allocatable {allocatable}, \
                     granted to other consumers {others})"
                )
            })
        })
        .collect();
    if !short.is_empty() {
        return deny(DenyReason::Insufficient, short.join("; "));
    }

    Decision::Accept {
        grant: asked()
            .map(|(name, &amount)| (name.clone(), amount))
            .collect(),
    }
}
