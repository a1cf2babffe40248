//! `tether peer --in-band`: the CLI, holding admin kubeconfigs of both clusters, carries the
//! networking exchange (CIDRs, keys, the server's endpoint) before authentication, so that the
//! tunnel exists before the consumer's controller first talks to the provider, which it then
//! reaches through the tunnel only. The exchange is the controller's own
//! (`tether_controllers::network::exchange`), run with the admin clients.

use std::time::Instant;

use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::Api;
use kube::api::DeleteParams;
use tether_api::ClusterId;
use tether_api::conditions::Status;
use tether_api::core::{GatewayServerSide, NetworkingOptions, NetworkingStatus};
use tether_api::names::{self, SYSTEM_NAMESPACE, in_band, objects};
use tether_api::networking::Configuration;
use tether_controllers::namespaces;
use tether_controllers::network::exchange::{self, Consumer};

use crate::cluster::Conn;
use crate::error::{Error, Result};
use crate::progress::Progress;

/// What the tunnel built for an in-band peering gives the ForeignCluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tunnel {
    /// The provider's authentication service through the tunnel.
    pub auth_url: String,
    /// The networking options, with the listening side the exchange settled on (so that the
    /// controller keeps the tunnel where it is rather than choosing again).
    pub networking: NetworkingOptions,
}

/// The tenant namespaces this run created, to remove if the peering fails.
#[derive(Debug, Default)]
pub struct Created {
    /// On the consumer: the namespace of the provider.
    pub consumer_ns: Option<String>,
    /// On the provider: the namespace of the consumer.
    pub provider_ns: Option<String>,
}

impl Created {
    /// Deletes what this run created (the gateways and Configurations go with them).
    pub async fn undo(&self, consumer: &Conn, provider: &Conn) -> Vec<String> {
        let mut removed = Vec::new();
        for (conn, ns) in [(consumer, &self.consumer_ns), (provider, &self.provider_ns)] {
            let Some(ns) = ns else { continue };
            if Api::<Namespace>::all(conn.client.clone())
                .delete(ns, &DeleteParams::default())
                .await
                .is_ok()
            {
                removed.push(format!("namespace {ns} in the {} cluster", conn.role));
            }
        }
        removed
    }
}

async fn exists(conn: &Conn, ns: &str) -> Result<bool> {
    Ok(Api::<Namespace>::all(conn.client.clone())
        .get_opt(ns)
        .await
        .map_err(Error::api(format!("reading namespace {ns}")))?
        .is_some_and(|n| n.metadata.deletion_timestamp.is_none()))
}

/// Builds the tunnel between `consumer` and `provider` with the controller's exchange, run by
/// this process with the admin clients, and returns where the provider's authentication
/// service is reached through it.
#[allow(clippy::too_many_arguments)]
pub async fn build_tunnel(
    consumer: &Conn,
    provider: &Conn,
    consumer_id: &ClusterId,
    provider_id: &ClusterId,
    networking: &NetworkingOptions,
    deadline: Instant,
    created: &mut Created,
    progress: &mut Progress,
) -> Result<Tunnel> {
    progress.phase("preparing the tenant namespaces of both clusters");
    // The same namespaces, labels and controller bindings the controllers make, applied as
    // they apply them: the provider's Tenant reconciler and the consumer's ForeignCluster
    // reconciler adopt them unchanged.
    let consumer_ns = names::tenant_namespace(provider_id);
    let provider_ns = names::tenant_namespace(consumer_id);
    let kube_err =
        |what: String| move |e: tether_controllers::Error| Error::Check(format!("{what}: {e}"));
    for (conn, ns, remote, slot) in [
        (
            consumer,
            &consumer_ns,
            provider_id,
            &mut created.consumer_ns,
        ),
        (
            provider,
            &provider_ns,
            consumer_id,
            &mut created.provider_ns,
        ),
    ] {
        if !exists(conn, ns).await? {
            *slot = Some(ns.clone());
        }
        namespaces::ensure_in(&conn.client, remote, objects::CONTROLLER, SYSTEM_NAMESPACE)
            .await
            .map_err(kube_err(format!(
                "preparing namespace {ns} in the {} cluster",
                conn.role
            )))?;
    }
    progress.done(format!(
        "namespaces {consumer_ns} (here) and {provider_ns} (provider) ready"
    ));

    progress.phase(format!(
        "building the tunnel to {provider_id} before authentication (in-band)"
    ));
    let here = Consumer {
        client: consumer.client.clone(),
        id: consumer_id.clone(),
        namespace: SYSTEM_NAMESPACE.to_owned(),
        in_band: true,
    };
    let mut record: Option<NetworkingStatus> = None;
    let mut last = String::new();
    loop {
        let outcome = exchange::consumer_step(
            &here,
            tether_controllers::providers::Remote::Direct(&provider.client),
            provider_id,
            &provider_ns,
            networking,
            &mut record,
        )
        .await
        .map_err(kube_err("exchanging the networking parameters".to_owned()))?;
        let line = format!(
            "Networking {} ({}): {}",
            outcome.status.as_str(),
            outcome.reason,
            outcome.message
        );
        if line != last {
            progress.note(&line);
            last = line;
        }
        if outcome.status == Status::True {
            break;
        }
        if Instant::now() >= deadline {
            progress.failed("timed out");
            return Err(Error::Check(format!(
                "the tunnel to {provider_id} did not come up in time ({}): an in-band peering \
                 needs it before authentication; check `tether status` and the gateway pods in \
                 {consumer_ns} (here) and {provider_ns} (provider), then run `tether peer` again",
                outcome.message
            )));
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
    progress.done(format!("tunnel to {provider_id} up"));

    let conf = Api::<Configuration>::namespaced(consumer.client.clone(), &consumer_ns)
        .get_opt(provider_id.as_str())
        .await
        .map_err(Error::api(format!(
            "reading Configuration {consumer_ns}/{provider_id}"
        )))?;
    let view = conf
        .and_then(|c| c.status?.remote?.cidr.external.into_iter().next())
        .ok_or_else(|| {
            Error::Check(format!(
                "{provider_id} publishes no external CIDR, so its control plane has no in-band \
                 address: run `tether install` there again (it sets --external-cidr, default {})",
                in_band::DEFAULT_EXTERNAL_CIDR
            ))
        })?;
    let port = auth_port(provider).await?;
    let auth_url = in_band::auth_url(&view, port).ok_or_else(|| {
        Error::Check(format!(
            "{provider_id}'s external CIDR (seen here as {view}) has no room for the in-band \
             addresses (hosts 1 and 2)"
        ))
    })?;
    let mut networking = networking.clone();
    if networking.gateway_server == GatewayServerSide::Auto
        && let Some(side) = record.and_then(|r| r.gateway_server)
    {
        networking.gateway_server = side;
    }
    Ok(Tunnel {
        auth_url,
        networking,
    })
}

/// The port of the provider's authentication Service (its ClusterIP is what the provider's
/// gateway publishes).
async fn auth_port(provider: &Conn) -> Result<u16> {
    let svc = Api::<Service>::namespaced(provider.client.clone(), SYSTEM_NAMESPACE)
        .get(objects::AUTH_SERVICE)
        .await
        .map_err(Error::api(format!(
            "reading Service {SYSTEM_NAMESPACE}/{} on the provider",
            objects::AUTH_SERVICE
        )))?;
    svc.spec
        .and_then(|s| s.ports?.first().map(|p| p.port))
        .and_then(|p| u16::try_from(p).ok())
        .ok_or_else(|| {
            Error::Check(format!(
                "the provider's Service {SYSTEM_NAMESPACE}/{} has no port; run `tether install` \
                 there again",
                objects::AUTH_SERVICE
            ))
        })
}
