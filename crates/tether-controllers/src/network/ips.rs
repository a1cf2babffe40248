//! The IP reconciler (ExternalIPRemapping): gives each IP object a host of the external CIDR
//! in its status, or a `Ready` False condition saying what to do. One lock serialises the
//! decisions, and every one is made over all IP objects at once, so two never share a host.
//! The Configuration reconciler turns the assigned ones into the list the gateways publish.
//! A `spec.ip` changed after it was published is refused (`Ready` False, [`IMMUTABLE`]) while
//! the host keeps being published for the address in `status.localIP`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::controller::Action;
use tether_api::conditions::{self, Status, Time, types};
use tether_api::networking::{IP, IPStatus, PublishedAddress};

use super::configuration::NetCtx;
use super::external_ips::{self, Assigned, Claim, Decision, Networks};
use super::local;
use crate::Error;
use crate::context::Ctx;

/// The `Ready` reason of an IP whose `spec.ip` changed after it was published; it stays
/// published for its old address.
pub const IMMUTABLE: &str = "IPImmutable";

fn key(ip: &IP) -> String {
    format!("{}/{}", ip.namespace().unwrap_or_default(), ip.name_any())
}

/// Reconciles one IP.
pub async fn reconcile(ip: Arc<IP>, nctx: Arc<NetCtx>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = apply(&ip, &nctx).await;
    nctx.ctx
        .metrics
        .reconciled("ip", result.as_ref().err(), started.elapsed());
    match result {
        Err(e) if e.api_status() == Some(409) => Ok(Action::requeue(Duration::from_millis(200))),
        other => other,
    }
}

async fn apply(ip: &IP, nctx: &NetCtx) -> Result<Action, Error> {
    if ip.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ctx = &nctx.ctx;
    let networks = match local::load(ctx).await? {
        Ok(l) => Networks {
            external: l.external,
            pod: l.pod,
            service: l.service,
        },
        Err(message) => {
            let keep = ip.status.clone().unwrap_or_default();
            let held = Held {
                external: keep.ip,
                cidr: keep.cidr,
                local: keep.local_ip,
            };
            write_status(ctx, ip, held, Status::False, "NetworkUnknown", message).await?;
            return Ok(Action::requeue(Duration::from_secs(30)));
        }
    };
    let decision = {
        let _serial = nctx.ip_lock.lock().await;
        let claims: Vec<Claim> = live(ctx).await?.iter().map(claim).collect();
        let decision = external_ips::decide(&networks, &claims).remove(&key(ip));
        // Written under the lock: the next decision must see this host as taken.
        match decision {
            Some(Decision::Published {
                external,
                cidr,
                local,
            }) => {
                let message = external_ips::published_message(&ip.spec.ip, external, cidr);
                let held = Held::new(external, cidr, local);
                write_status(ctx, ip, held, Status::True, "Published", message).await?;
                true
            }
            Some(Decision::Changed {
                external,
                cidr,
                local,
                message,
            }) => {
                let held = Held::new(external, cidr, local);
                write_status(ctx, ip, held, Status::False, IMMUTABLE, message).await?;
                false
            }
            Some(Decision::Refused {
                reason,
                message,
                keep,
            }) => {
                // A kept host still stands for the address it was published for.
                let local = ip.status.as_ref().and_then(|s| s.local_ip.clone());
                let held = Held {
                    external: keep.map(|(a, _)| a.to_string()),
                    cidr: keep.map(|(_, c)| c.to_string()),
                    local: keep.and(local),
                };
                write_status(ctx, ip, held, Status::False, reason, message).await?;
                false
            }
            // Deleted between the event and the list.
            None => return Ok(Action::await_change()),
        }
    };
    Ok(Action::requeue(if decision {
        Duration::from_secs(300)
    } else {
        Duration::from_secs(30)
    }))
}

fn claim(ip: &IP) -> Claim {
    let st = ip.status.as_ref();
    let assigned = st.and_then(|s| {
        let addr = s.ip.as_deref()?.parse().ok()?;
        let cidr = s.cidr.as_deref()?.parse().ok()?;
        Some((addr, cidr))
    });
    Claim {
        key: key(ip),
        ip: ip.spec.ip.clone(),
        assigned,
        served: st.and_then(|s| s.local_ip.clone()),
        created: ip
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_default(),
    }
}

/// The host an IP holds: `status.ip`, `status.cidr` and `status.localIP`.
#[derive(Debug, Default)]
struct Held {
    external: Option<String>,
    cidr: Option<String>,
    local: Option<String>,
}

impl Held {
    fn new(external: std::net::Ipv4Addr, cidr: ipnet::Ipv4Net, local: std::net::Ipv4Addr) -> Self {
        Self {
            external: Some(external.to_string()),
            cidr: Some(cidr.to_string()),
            local: Some(local.to_string()),
        }
    }
}

async fn write_status(
    ctx: &Ctx,
    ip: &IP,
    held: Held,
    status: Status,
    reason: &str,
    message: String,
) -> Result<(), Error> {
    let mut st: IPStatus = ip.status.clone().unwrap_or_default();
    st.ip = held.external;
    st.cidr = held.cidr;
    st.local_ip = held.local;
    conditions::set(
        &mut st.conditions,
        types::READY,
        status,
        reason,
        message,
        ip.metadata.generation,
        Time(k8s_openapi::jiff::Timestamp::now()),
    );
    if ip.status.as_ref() == Some(&st) {
        return Ok(());
    }
    let mut next = ip.clone();
    next.status = Some(st);
    let ns = ip.namespace().unwrap_or_default();
    Api::<IP>::namespaced(ctx.client.clone(), &ns)
        .replace_status(&ip.name_any(), &PostParams::default(), &next)
        .await
        .map_err(Error::kube(format!("updating IP {} status", key(ip))))?;
    Ok(())
}

/// Every IP of this cluster that is not being deleted, read afresh.
async fn live(ctx: &Ctx) -> Result<Vec<IP>, Error> {
    let all = Api::<IP>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("listing IPs"))?;
    Ok(all
        .items
        .into_iter()
        .filter(|i| i.metadata.deletion_timestamp.is_none())
        .collect())
}

/// What every gateway of this cluster publishes now: the assigned IPs, read afresh.
pub async fn published(
    ctx: &Ctx,
    external: Option<ipnet::Ipv4Net>,
) -> Result<Vec<PublishedAddress>, Error> {
    let assigned: Vec<Assigned> = live(ctx).await?.iter().map(assigned).collect();
    Ok(external_ips::published(external, &assigned))
}

/// An IP as the published list reads it: a refused change of `spec.ip` leaves the host
/// published for `status.localIP`.
fn assigned(ip: &IP) -> Assigned {
    let st = ip.status.as_ref();
    let ready = st.and_then(|s| conditions::find(&s.conditions, types::READY));
    Assigned {
        key: key(ip),
        ip: st
            .and_then(|s| s.local_ip.clone())
            .unwrap_or_else(|| ip.spec.ip.clone()),
        external: st.and_then(|s| s.ip.clone()),
        cidr: st.and_then(|s| s.cidr.clone()),
        ready: ready.is_some_and(|c| {
            c.status == Status::True.as_str()
                || (c.status == Status::False.as_str() && c.reason == IMMUTABLE)
        }),
    }
}

#[cfg(test)]
mod tests {
    use tether_api::networking::IPSpec;

    use super::*;

    fn ip(spec: &str, status: Option<(&str, &str, Option<&str>, &str, &str)>) -> IP {
        let mut ip = IP::new(
            "db",
            IPSpec {
                ip: spec.to_owned(),
            },
        );
        ip.metadata.namespace = Some("a".to_owned());
        ip.status = status.map(|(external, cidr, local, state, reason)| {
            let mut st = IPStatus {
                ip: Some(external.to_owned()),
                cidr: Some(cidr.to_owned()),
                local_ip: local.map(str::to_owned),
                conditions: Vec::new(),
            };
            let state = if state == "True" {
                Status::True
            } else {
                Status::False
            };
            conditions::set(
                &mut st.conditions,
                types::READY,
                state,
                reason,
                String::new(),
                None,
                Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            );
            st
        });
        ip
    }

    #[test]
    fn a_refused_change_keeps_the_old_address_published_and_claimed() {
        let changed = ip(
            "192.168.1.20",
            Some((
                "10.70.0.7",
                "10.70.0.0/16",
                Some("192.168.1.10"),
                "False",
                IMMUTABLE,
            )),
        );
        let a = assigned(&changed);
        assert_eq!((a.ip.as_str(), a.ready), ("192.168.1.10", true));
        let c = claim(&changed);
        assert_eq!(
            (c.ip.as_str(), c.served.as_deref()),
            ("192.168.1.20", Some("192.168.1.10"))
        );
        let list = external_ips::published(Some("10.70.0.0/16".parse().expect("cidr")), &[a]);
        assert_eq!(
            list.iter()
                .map(|p| format!("{} -> {}", p.external, p.ip))
                .collect::<Vec<_>>(),
            ["10.70.0.7 -> 192.168.1.10"]
        );
        // Any other refusal is not published, and a status from before localIP serves spec.ip.
        let refused = ip(
            "192.168.1.20",
            Some((
                "10.70.0.7",
                "10.70.0.0/16",
                Some("192.168.1.10"),
                "False",
                "InsidePodCIDR",
            )),
        );
        assert!(!assigned(&refused).ready);
        let legacy = ip(
            "192.168.1.20",
            Some(("10.70.0.7", "10.70.0.0/16", None, "True", "Published")),
        );
        assert_eq!(assigned(&legacy).ip, "192.168.1.20");
    }
}
