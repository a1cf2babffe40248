//! Kubernetes-style conditions: the types Tether reports and an update rule that keeps
//! `lastTransitionTime` when the status does not change.

pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Condition types on a ForeignCluster.
pub mod types {
    /// The authentication module: identity issued (consumer) or tenant active (provider).
    pub const AUTHENTICATION: &str = "Authentication";
    /// The networking module: tunnel up.
    pub const NETWORKING: &str = "Networking";
    /// The offloading module: resources granted and virtual node ready.
    pub const OFFLOADING: &str = "Offloading";
    /// The remote API server answers with the issued identity.
    pub const API_SERVER_REACHABLE: &str = "APIServerReachable";
    /// Generic readiness, used by kinds with a single condition.
    pub const READY: &str = "Ready";
    /// A ResourceSlice's answer: True (`Accepted`) or False (`Denied`, with why).
    pub const RESOURCES: &str = "Resources";
}

/// A condition's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// The condition holds.
    True,
    /// It does not.
    False,
    /// Not known yet, or the module is off.
    Unknown,
}

impl Status {
    /// The wire form.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }
}

/// Sets condition `type_` in `conditions` and reports whether anything changed.
/// `lastTransitionTime` moves only when the status changes, as Kubernetes conventions require;
/// reason, message and observed generation are updated in place.
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: Status,
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
    now: Time,
) -> bool {
    let message = message.into();
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            let changed = c.status != status.as_str()
                || c.reason != reason
                || c.message != message
                || c.observed_generation != observed_generation;
            if c.status != status.as_str() {
                c.status = status.as_str().to_owned();
                c.last_transition_time = now;
            }
            c.reason = reason.to_owned();
            c.message = message;
            c.observed_generation = observed_generation;
            changed
        }
        None => {
            conditions.push(Condition {
                type_: type_.to_owned(),
                status: status.as_str().to_owned(),
                reason: reason.to_owned(),
                message,
                observed_generation,
                last_transition_time: now,
            });
            true
        }
    }
}

/// The condition `type_`, if present.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether condition `type_` is present and `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).expect("valid"))
    }

    #[test]
    fn transition_time_moves_only_with_the_status() {
        let mut cs = Vec::new();
        assert!(set(
            &mut cs,
            "Ready",
            Status::False,
            "Pending",
            "waiting",
            Some(1),
            t(10)
        ));
        assert!(set(
            &mut cs,
            "Ready",
            Status::False,
            "Pending",
            "still",
            Some(1),
            t(20)
        ));
        assert_eq!(cs[0].last_transition_time, t(10));
        assert_eq!(cs[0].message, "still");
        assert!(!set(
            &mut cs,
            "Ready",
            Status::False,
            "Pending",
            "still",
            Some(1),
            t(30)
        ));
        assert!(set(
            &mut cs,
            "Ready",
            Status::True,
            "Established",
            "ok",
            Some(2),
            t(40)
        ));
        assert_eq!(cs[0].last_transition_time, t(40));
        assert_eq!(cs.len(), 1);
        assert!(is_true(&cs, "Ready"));
        assert!(!is_true(&cs, "Other"));
    }
}
