//! What one pod costs, and whether a provider admits it within a consumer's grant.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::{Amount, EnforcementParseError, QuantityError, Resources};

/// The resources [`admit`] requires every container to request.
const REQUIRED: [&str; 2] = ["cpu", "memory"];

/// A pod's effective requests as the scheduler counts them, plus `pods: 1`.
///
/// Per resource: the larger of the running phase (app containers plus restartable init
/// containers, i.e. sidecars) and the peak of the init phase (each ordinary init container
/// plus the sidecars started before it); then `spec.overhead` on top. Without sidecars this is
/// max(sum of containers, max of init containers) + overhead. A resource a container limits
/// but does not request counts at its limit, as the API server defaults it.
pub fn pod_requests(spec: &PodSpec) -> Result<Resources, QuantityError> {
    let mut running = Resources::default();
    for container in &spec.containers {
        running.add(&effective_requests(container, "container")?);
    }
    let mut sidecars = Resources::default();
    let mut init_peak = Resources::default();
    for init in spec.init_containers.iter().flatten() {
        let requests = effective_requests(init, "init container")?;
        let during = if init.restart_policy.as_deref() == Some("Always") {
            running.add(&requests);
            sidecars.add(&requests);
            sidecars.clone()
        } else {
            Resources::sum([&requests, &sidecars])
        };
        raise_to(&mut init_peak, &during);
    }
    raise_to(&mut running, &init_peak);
    if let Some(overhead) = &spec.overhead {
        running.add(&parse_list(overhead, "spec.overhead")?);
    }
    running.add(&Resources([("pods".to_owned(), Amount(1000))].into()));
    Ok(running)
}

/// How strictly a provider holds a consumer's pods to its grant (Liqo's three levels).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub enum Enforcement {
    /// Every pod is admitted; the grant is only advertised.
    #[default]
    None,
    /// Pods must request cpu and memory, and their requests must fit the grant.
    Soft,
    /// As `Soft`, and limits must equal requests, so pods cannot use more than was counted.
    Hard,
}

impl FromStr for Enforcement {
    type Err = EnforcementParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "none" => Ok(Enforcement::None),
            "soft" => Ok(Enforcement::Soft),
            "hard" => Ok(Enforcement::Hard),
            _ => Err(EnforcementParseError {
                input: s.to_owned(),
            }),
        }
    }
}

impl fmt::Display for Enforcement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Enforcement::None => "none",
            Enforcement::Soft => "soft",
            Enforcement::Hard => "hard",
        })
    }
}

/// Whether one more pod is admitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Admitted.
    Allow,
    /// Refused.
    Deny {
        /// A condition/event reason: `MissingRequests`, `LimitsNotEqualRequests`,
        /// `QuotaExceeded`, or `InvalidQuantity` when the pod spec has an unreadable quantity.
        reason: &'static str,
        /// For the user: what is wrong and what to change.
        message: String,
    },
}

/// Whether a provider admits one more pod of a consumer, given what the consumer's admitted
/// pods already request (`in_use`) and its granted resources (`grant`).
///
/// `None` always allows. `Soft` requires every container (init containers included) to request
/// cpu and memory, then requires `in_use + pod_requests <= grant` for every granted resource
/// the pod asks for (a pod asking none of a resource cannot push it over, even if a shrunk
/// grant is already overrun). `Hard` also requires limits equal to requests for cpu and memory,
/// checked before the quota.
pub fn admit(pod: &PodSpec, in_use: &Resources, grant: &Resources, mode: Enforcement) -> Admission {
    if mode == Enforcement::None {
        return Admission::Allow;
    }
    check(pod, in_use, grant, mode).unwrap_or_else(|error| Admission::Deny {
        reason: "InvalidQuantity",
        message: format!("{error}; fix the pod's resources"),
    })
}

fn check(
    pod: &PodSpec,
    in_use: &Resources,
    grant: &Resources,
    mode: Enforcement,
) -> Result<Admission, QuantityError> {
    let asked = pod_requests(pod)?;
    let containers = pod
        .init_containers
        .iter()
        .flatten()
        .map(|c| ("init container", c))
        .chain(pod.containers.iter().map(|c| ("container", c)));

    let mut missing = Vec::new();
    let mut unequal = Vec::new();
    for (kind, container) in containers {
        let requests = effective_requests(container, kind)?;
        let absent: Vec<&str> = REQUIRED
            .into_iter()
            .filter(|name| !requests.0.contains_key(*name))
            .collect();
        if !absent.is_empty() {
            missing.push(format!(
                "{kind} {:?} does not request {}",
                container.name,
                absent.join(", ")
            ));
        }
        let limits = match container.resources.as_ref().and_then(|r| r.limits.as_ref()) {
            Some(limits) => parse_list(limits, &format!("{kind} {:?} limits", container.name))?,
            None => Resources::default(),
        };
        let differences: Vec<String> = REQUIRED
            .into_iter()
            .filter(|name| requests.0.contains_key(*name))
            .filter_map(|name| {
                let request = requests.get(name);
                match limits.0.get(name) {
                    None => Some(format!("{name} limit unset (request {request})")),
                    Some(&limit) if limit != request => {
                        Some(format!("{name} limit {limit} != request {request}"))
                    }
                    Some(_) => None,
                }
            })
            .collect();
        if !differences.is_empty() {
            unequal.push(format!(
                "{kind} {:?}: {}",
                container.name,
                differences.join(", ")
            ));
        }
    }
    if !missing.is_empty() {
        return Ok(Admission::Deny {
            reason: "MissingRequests",
            message: format!(
                "{}; with {mode} enforcement every container must set resources.requests for \
                 cpu and memory",
                missing.join("; ")
            ),
        });
    }
    if mode == Enforcement::Hard && !unequal.is_empty() {
        return Ok(Admission::Deny {
            reason: "LimitsNotEqualRequests",
            message: format!(
                "{}; with hard enforcement every container's limits must equal its requests for \
                 cpu and memory",
                unequal.join("; ")
            ),
        });
    }

    let exceeded: Vec<String> = grant
        .0
        .iter()
        .filter_map(|(name, &granted)| {
            let wanted = asked.get(name);
            let used = in_use.get(name);
            (wanted.0 > 0 && used.0.saturating_add(wanted.0) > granted.0)
                .then(|| format!("{name}: asked {wanted}, in use {used}, granted {granted}"))
        })
        .collect();
    if !exceeded.is_empty() {
        return Ok(Admission::Deny {
            reason: "QuotaExceeded",
            message: format!(
                "{}; wait for the consumer's pods to finish or ask the provider for a larger grant",
                exceeded.join("; ")
            ),
        });
    }
    Ok(Admission::Allow)
}

/// A container's requests after the API server's defaulting: a resource it limits but does not
/// request is requested at its limit.
fn effective_requests(container: &Container, kind: &str) -> Result<Resources, QuantityError> {
    let Some(resources) = &container.resources else {
        return Ok(Resources::default());
    };
    let mut requests = match &resources.requests {
        Some(list) => parse_list(list, &format!("{kind} {:?} requests", container.name))?,
        None => Resources::default(),
    };
    if let Some(list) = &resources.limits {
        let limits = parse_list(list, &format!("{kind} {:?} limits", container.name))?;
        for (name, limit) in limits.0 {
            requests.0.entry(name).or_insert(limit);
        }
    }
    Ok(requests)
}

/// Reads a resource list of a pod spec; errors name `field` (e.g. `container "app" limits`).
fn parse_list(list: &BTreeMap<String, Quantity>, field: &str) -> Result<Resources, QuantityError> {
    Resources::from_quantities(list).map_err(|error| match error {
        QuantityError::Resource { resource, error } => QuantityError::Pod {
            field: field.to_owned(),
            resource,
            error,
        },
        other => other,
    })
}

/// Raises every entry of `target` to at least its value in `floor`.
fn raise_to(target: &mut Resources, floor: &Resources) {
    for (name, &amount) in &floor.0 {
        let entry = target.0.entry(name.clone()).or_default();
        *entry = (*entry).max(amount);
    }
}
