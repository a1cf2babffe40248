//! The Configuration reconciler: keeps `spec.local` equal to this cluster's CIDRs and records
//! in the status how this cluster addresses the remote one (its remaps). One lock serialises
//! the remap decisions, so two new peers never get the same block. The status also lists the
//! addresses this cluster's gateway publishes (the assigned IP objects), which the gateway
//! reads from here, so an IP coming or going needs no new gateway pod.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::Ipv4Net;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use tether_api::conditions::{self, Status, Time, types};
use tether_api::names::{self, TENANT_NAMESPACE_PREFIX};
use tether_api::networking::{
    Cidrs, ClusterCidrs, Configuration, ConfigurationStatus, PublishedAddress,
};

use super::remaps::{self, Request, Views};
use super::{ips, local};
use crate::Error;
use crate::context::{Ctx, FIELD_MANAGER};

/// State of the networking reconcilers.
pub struct NetCtx {
    /// Shared controller state.
    pub ctx: Arc<Ctx>,
    remap_lock: tokio::sync::Mutex<()>,
    /// Serialises the IP objects' host decisions.
    pub(super) ip_lock: tokio::sync::Mutex<()>,
}

impl NetCtx {
    /// State for one controller.
    pub fn new(ctx: Arc<Ctx>) -> Self {
        Self {
            ctx,
            remap_lock: tokio::sync::Mutex::new(()),
            ip_lock: tokio::sync::Mutex::new(()),
        }
    }
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// Reconciles one Configuration.
pub async fn reconcile(conf: Arc<Configuration>, nctx: Arc<NetCtx>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = apply(&conf, &nctx).await;
    nctx.ctx
        .metrics
        .reconciled("configuration", result.as_ref().err(), started.elapsed());
    match result {
        Err(e) if e.api_status() == Some(409) => Ok(Action::requeue(Duration::from_millis(200))),
        other => other,
    }
}

async fn apply(conf: &Configuration, nctx: &NetCtx) -> Result<Action, Error> {
    let ctx = &nctx.ctx;
    let ns = conf.namespace().unwrap_or_default();
    let name = conf.name_any();
    if !ns.starts_with(TENANT_NAMESPACE_PREFIX) || conf.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let api: Api<Configuration> = Api::namespaced(ctx.client.clone(), &ns);
    let local = match local::load(ctx).await? {
        Ok(l) => l,
        Err(message) => {
            let published = conf
                .status
                .as_ref()
                .map(|s| s.published.clone())
                .unwrap_or_default();
            write_status(
                &api,
                conf,
                None,
                published,
                Status::False,
                "NetworkUnknown",
                message,
            )
            .await?;
            return Ok(Action::requeue(Duration::from_secs(30)));
        }
    };
    let ours = local.to_cluster_cidrs(ctx.cluster_id());
    if conf.spec.local.as_ref() != Some(&ours) {
        // A merge patch of `spec.local` alone: the consumer owns `spec.remote` of the copy it
        // created here, and this must not take it over.
        let patch = serde_json::json!({ "spec": { "local": ours } });
        api.patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(Error::kube(format!(
            "setting spec.local of Configuration {ns}/{name}"
        )))?;
        // The update triggers another reconcile with the new object.
        return Ok(Action::await_change());
    }
    let published = ips::published(ctx, local.external).await?;
    let peer = conf.spec.remote.cluster_id.clone();
    let views = {
        let _serial = nctx.remap_lock.lock().await;
        let all = Api::<Configuration>::all(ctx.client.clone())
            .list(&ListParams::default())
            .await
            .map_err(Error::kube("listing Configurations"))?;
        let requests = requests(&all.items);
        remaps::plan(&local, &requests.map_err_for(&peer)?)
            .remove(&peer)
            .unwrap_or_else(|| Err("the peer's CIDRs are not in the plan".into()))
    };
    match views {
        Ok(v) => {
            let real = &conf.spec.remote.cidr;
            let message = describe(&peer, real, &v);
            let view = ClusterCidrs {
                cluster_id: peer.clone(),
                cidr: Cidrs {
                    pod: vec![v.pod.to_string()],
                    service: Vec::new(),
                    external: v.external.iter().map(ToString::to_string).collect(),
                },
            };
            write_status(
                &api,
                conf,
                Some(view),
                published,
                Status::True,
                "Remapped",
                message,
            )
            .await?;
            Ok(Action::requeue(Duration::from_secs(300)))
        }
        Err(message) => {
            let keep = conf.status.as_ref().and_then(|s| s.remote.clone());
            write_status(
                &api,
                conf,
                keep,
                published,
                Status::False,
                "NoLocalView",
                message,
            )
            .await?;
            Ok(Action::requeue(Duration::from_secs(30)))
        }
    }
}

fn describe(peer: &str, real: &Cidrs, v: &Views) -> String {
    let pod = real.pod.first().map(String::as_str).unwrap_or_default();
    let mut m = if pod == v.pod.to_string() {
        format!("pods of {peer} ({pod}) are addressed here as they are")
    } else {
        format!("pods of {peer} ({pod}) are addressed here as {}", v.pod)
    };
    if let (Some(e), Some(view)) = (real.external.first(), v.external) {
        m.push_str(&format!("; its external CIDR {e} as {view}"));
    }
    m
}

/// Remap requests from every Configuration in a tenant namespace, with the CIDRs parsed.
struct Requests {
    ok: Vec<Request>,
    bad: Vec<(String, String)>,
}

impl Requests {
    /// The requests, or this peer's own parse error.
    fn map_err_for(self, peer: &str) -> Result<Vec<Request>, Error> {
        match self.bad.into_iter().find(|(p, _)| p == peer) {
            Some((_, message)) => Err(Error::Invalid(message)),
            None => Ok(self.ok),
        }
    }
}

fn requests(all: &[Configuration]) -> Requests {
    let mut ok: Vec<Request> = Vec::new();
    let mut bad = Vec::new();
    for c in all {
        let ns = c.namespace().unwrap_or_default();
        if !ns.starts_with(TENANT_NAMESPACE_PREFIX) || c.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let peer = c.spec.remote.cluster_id.clone();
        // One Configuration per peer counts: the one in the peer's own tenant namespace.
        if let Ok(id) = tether_api::ClusterId::new(peer.clone())
            && names::tenant_namespace(&id) != ns
        {
            continue;
        }
        let what = format!("Configuration {ns}/{}", c.name_any());
        let parsed =
            parse_all(&what, "spec.remote.cidr.pod", &c.spec.remote.cidr.pod).and_then(|pod| {
                let external = parse_all(
                    &what,
                    "spec.remote.cidr.external",
                    &c.spec.remote.cidr.external,
                )?;
                let persisted = c
                    .status
                    .as_ref()
                    .and_then(|s| s.remote.as_ref())
                    .and_then(|r| {
                        let pod = r.cidr.pod.first()?.parse().ok()?;
                        let external = r.cidr.external.first().and_then(|e| e.parse().ok());
                        Some(Views { pod, external })
                    });
                Ok(Request {
                    peer: peer.clone(),
                    pod,
                    external: external.first().copied(),
                    persisted,
                })
            });
        match parsed {
            Ok(r) => ok.push(r),
            Err(message) => bad.push((peer, message)),
        }
    }
    Requests { ok, bad }
}

fn parse_all(what: &str, field: &str, cidrs: &[String]) -> Result<Vec<Ipv4Net>, String> {
    cidrs
        .iter()
        .map(|c| {
            let net: Ipv4Net = c
                .parse()
                .map_err(|_| format!("{what}: {field} holds {c:?}, which is not an IPv4 CIDR"))?;
            if net.trunc() != net {
                return Err(format!(
                    "{what}: {field} holds {c}, which has host bits set (did you mean {}?)",
                    net.trunc()
                ));
            }
            Ok(net)
        })
        .collect()
}

async fn write_status(
    api: &Api<Configuration>,
    conf: &Configuration,
    remote: Option<ClusterCidrs>,
    published: Vec<PublishedAddress>,
    status: Status,
    reason: &str,
    message: String,
) -> Result<(), Error> {
    let mut st: ConfigurationStatus = conf.status.clone().unwrap_or_default();
    st.remote = remote;
    st.published = published;
    conditions::set(
        &mut st.conditions,
        types::READY,
        status,
        reason,
        message,
        conf.metadata.generation,
        now(),
    );
    if conf.status.as_ref() == Some(&st) {
        return Ok(());
    }
    let mut next = conf.clone();
    next.status = Some(st);
    let name = conf.name_any();
    api.replace_status(&name, &PostParams::default(), &next)
        .await
        .map_err(Error::kube(format!("updating Configuration {name} status")))?;
    Ok(())
}

/// This cluster's CIDRs and the local view of a peer, for callers outside the reconciler.
pub fn local_view(conf: &Configuration) -> Option<&ClusterCidrs> {
    let st = conf.status.as_ref()?;
    conditions::find(&st.conditions, types::READY)
        .filter(|c| c.status == Status::True.as_str())
        .and(st.remote.as_ref())
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    fn conf(peer: &str, pod: &[&str], external: &[&str]) -> Configuration {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "networking.tether.dev/v1alpha1",
            "kind": "Configuration",
            "metadata": {"name": peer, "namespace": format!("tether-tenant-{peer}")},
            "spec": {"remote": {"clusterID": peer, "cidr": {"pod": pod, "external": external}}},
        }))
        .expect("fixture Configuration")
    }

    #[test]
    fn a_bad_cidr_names_its_field_and_fails_only_its_own_peer() {
        let all = [
            conf("good", &["10.244.0.0/16"], &[]),
            conf("host-bits", &["10.244.1.7/16"], &[]),
            conf("garbage", &["10.244.0.0/16"], &["not-a-cidr"]),
        ];
        let r = requests(&all);
        let ok: Vec<&str> = r.ok.iter().map(|q| q.peer.as_str()).collect();
        assert_eq!(ok, ["good"]);
        let bad: String = r.bad.iter().map(|(p, m)| format!("{p}: {m}\n")).collect();
        expect![[r#"
            host-bits: Configuration tether-tenant-host-bits/host-bits: spec.remote.cidr.pod holds 10.244.1.7/16, which has host bits set (did you mean 10.244.0.0/16?)
            garbage: Configuration tether-tenant-garbage/garbage: spec.remote.cidr.external holds "not-a-cidr", which is not an IPv4 CIDR
        "#]].assert_eq(&bad);
        assert!(requests(&all).map_err_for("good").is_ok());
        let err = requests(&all)
            .map_err_for("host-bits")
            .expect_err("host bits");
        assert!(err.to_string().contains("spec.remote.cidr.pod"), "{err}");
    }
}
