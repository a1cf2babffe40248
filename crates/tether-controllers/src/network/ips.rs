//! The IP reconciler (ExternalIPRemapping): gives each IP object a host of the external CIDR
//! in its status, or a `Ready` False condition saying what to do. One lock serialises the
//! decisions, and every one is made over all IP objects at once, so two never share a host.
//! The Configuration reconciler turns the assigned ones into the list the gateways publish.

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
            let keep = ip.status.as_ref().map(|s| (s.ip.clone(), s.cidr.clone()));
            let (addr, cidr) = keep.unwrap_or_default();
            write_status(
                ctx,
                ip,
                addr,
                cidr,
                Status::False,
                "NetworkUnknown",
                message,
            )
            .await?;
            return Ok(Action::requeue(Duration::from_secs(30)));
        }
    };
    let decision = {
        let _serial = nctx.ip_lock.lock().await;
        let all = Api::<IP>::all(ctx.client.clone())
            .list(&ListParams::default())
            .await
            .map_err(Error::kube("listing IPs"))?;
        let claims: Vec<Claim> = all
            .items
            .iter()
            .filter(|i| i.metadata.deletion_timestamp.is_none())
            .map(claim)
            .collect();
        let decision = external_ips::decide(&networks, &claims).remove(&key(ip));
        // Written under the lock: the next decision must see this host as taken.
        match decision {
            Some(Decision::Published { external, cidr }) => {
                let message = external_ips::published_message(&ip.spec.ip, external, cidr);
                write_status(
                    ctx,
                    ip,
                    Some(external.to_string()),
                    Some(cidr.to_string()),
                    Status::True,
                    "Published",
                    message,
                )
                .await?;
                true
            }
            Some(Decision::Refused {
                reason,
                message,
                keep,
            }) => {
                write_status(
                    ctx,
                    ip,
                    keep.map(|(a, _)| a.to_string()),
                    keep.map(|(_, c)| c.to_string()),
                    Status::False,
                    reason,
                    message,
                )
                .await?;
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
        created: ip
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_default(),
    }
}

async fn write_status(
    ctx: &Ctx,
    ip: &IP,
    addr: Option<String>,
    cidr: Option<String>,
    status: Status,
    reason: &str,
    message: String,
) -> Result<(), Error> {
    let mut st: IPStatus = ip.status.clone().unwrap_or_default();
    st.ip = addr;
    st.cidr = cidr;
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

/// What every gateway of this cluster publishes now: the assigned IPs, read afresh.
pub async fn published(
    ctx: &Ctx,
    external: Option<ipnet::Ipv4Net>,
) -> Result<Vec<PublishedAddress>, Error> {
    let all = Api::<IP>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("listing IPs"))?;
    let assigned: Vec<Assigned> = all
        .items
        .iter()
        .filter(|i| i.metadata.deletion_timestamp.is_none())
        .map(|i| {
            let st = i.status.as_ref();
            Assigned {
                key: key(i),
                ip: i.spec.ip.clone(),
                external: st.and_then(|s| s.ip.clone()),
                cidr: st.and_then(|s| s.cidr.clone()),
                ready: st
                    .and_then(|s| conditions::find(&s.conditions, types::READY))
                    .is_some_and(|c| c.status == Status::True.as_str()),
            }
        })
        .collect();
    Ok(external_ips::published(external, &assigned))
}
