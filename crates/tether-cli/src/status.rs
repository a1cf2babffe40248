//! `tether status`: the local cluster and one row per peer, then every failing condition
//! explained. The report is built and rendered by pure functions; `gather` does the reading.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::ListParams;
use serde::Serialize;
use tether_api::conditions::{self, types};
use tether_api::core::{ForeignCluster, Phase, Role};
use tether_api::names::{SYSTEM_NAMESPACE, TENANT_NAMESPACE_PREFIX, objects};
use tether_api::networking::{Configuration, Connection, ConnectionState};

use crate::cluster::{self, Conn};
use crate::error::{Error, Result, is_not_found};
use crate::install::rollout_status;
use crate::manifests::CONTAINER;
use crate::text;
use crate::tokens::{rfc3339, since};

/// What `tether status` shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusReport {
    /// The local cluster.
    pub cluster: LocalCluster,
    /// One entry per ForeignCluster, by cluster ID.
    pub peers: Vec<PeerStatus>,
}

/// The local cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LocalCluster {
    /// The cluster ID.
    #[serde(rename = "clusterID")]
    pub cluster_id: String,
    /// The controller's version (its image tag).
    pub version: Option<String>,
    /// The controller's image.
    pub image: Option<String>,
    /// Whether the controller Deployment has rolled out.
    pub controller_ready: bool,
    /// The rollout in words.
    pub controller: String,
    /// The authentication URL peers use.
    #[serde(rename = "authURL")]
    pub auth_url: Option<String>,
    /// The authentication certificate fingerprint.
    pub auth_fingerprint: Option<String>,
}

/// One peer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PeerStatus {
    /// The remote cluster's ID.
    #[serde(rename = "clusterID")]
    pub cluster_id: String,
    /// What the remote cluster is to this one.
    pub role: String,
    /// Where the peering stands.
    pub phase: String,
    /// The Authentication condition's status.
    pub authentication: String,
    /// The Networking condition's status.
    pub networking: String,
    /// The Offloading condition's status.
    pub offloading: String,
    /// The APIServerReachable condition's status.
    pub api_server: String,
    /// Whether the provider's API server is reached through the tunnel (`tether peer
    /// --in-band`); the table shows it beside the API server's status.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub in_band: bool,
    /// When the ForeignCluster was created (RFC 3339).
    pub created: Option<String>,
    /// Age at the time of the report.
    pub age: String,
    /// The tunnel to the peer, when the local gateway reports one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunnel: Option<TunnelView>,
    /// How this cluster addresses the peer's CIDRs, once the exchange has settled them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remaps: Vec<RemapView>,
    /// Every condition.
    pub conditions: Vec<ConditionView>,
}

/// A condition, flattened for output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConditionView {
    /// Condition type.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Machine-readable reason.
    pub reason: String,
    /// What is wrong and what to do.
    pub message: String,
}

/// The tunnel to one peer, as its Connection reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TunnelView {
    /// `Connected`, `Connecting`, `Error`, or `-` before the gateway first reports.
    pub state: String,
    /// The last measured round trip, such as `1.2ms`.
    pub latency: Option<String>,
    /// When the last WireGuard handshake completed (RFC 3339).
    pub last_handshake: Option<String>,
}

/// One of the peer's CIDRs and the range this cluster reaches it through.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RemapView {
    /// `pod`, `service` or `external`.
    pub kind: String,
    /// The CIDR as the peer uses it.
    pub remote: String,
    /// The CIDR as this cluster addresses it; equal to `remote` when nothing collided.
    pub local: String,
}

/// The networking objects of one peer's tenant namespace, for the report.
#[derive(Debug, Clone, Default)]
pub struct PeerNetwork {
    /// The Connection `tether-gateway`.
    pub connection: Option<Connection>,
    /// The Configuration named after the peer.
    pub configuration: Option<Configuration>,
}

fn tunnel_view(conn: &Connection) -> TunnelView {
    let status = conn.status.clone().unwrap_or_default();
    TunnelView {
        state: status
            .value
            .map_or("-", |s| match s {
                ConnectionState::Connected => "Connected",
                ConnectionState::Connecting => "Connecting",
                ConnectionState::Error => "Error",
            })
            .to_owned(),
        latency: status.latency.map(|l| l.value),
        last_handshake: status.last_handshake.map(|t| rfc3339(t.0)),
    }
}

/// Pairs each real CIDR of the spec with its view in the status; index-aligned by contract,
/// so a status that lags the spec yields only the pairs both sides already have.
fn remap_views(conf: &Configuration) -> Vec<RemapView> {
    let Some(view) = conf.status.as_ref().and_then(|s| s.remote.as_ref()) else {
        return Vec::new();
    };
    let real = &conf.spec.remote.cidr;
    let pairs = |kind: &str, real: &[String], seen: &[String]| -> Vec<RemapView> {
        real.iter()
            .zip(seen)
            .map(|(r, l)| RemapView {
                kind: kind.to_owned(),
                remote: r.clone(),
                local: l.clone(),
            })
            .collect()
    };
    let mut out = pairs("pod", &real.pod, &view.cidr.pod);
    out.extend(pairs("service", &real.service, &view.cidr.service));
    out.extend(pairs("external", &real.external, &view.cidr.external));
    out
}

fn role_str(role: Option<Role>) -> &'static str {
    match role {
        Some(Role::Consumer) => "Consumer",
        Some(Role::Provider) => "Provider",
        Some(Role::ConsumerAndProvider) => "ConsumerAndProvider",
        Some(Role::Unknown) | None => "Unknown",
    }
}

/// One ForeignCluster as a row of the report.
pub fn peer_status(fc: &ForeignCluster, net: &PeerNetwork, now: Timestamp) -> PeerStatus {
    let status = fc.status.clone().unwrap_or_default();
    let cond = |t: &str| {
        conditions::find(&status.conditions, t).map_or_else(|| "-".to_owned(), |c| c.status.clone())
    };
    let created = fc.metadata.creation_timestamp.as_ref().map(|t| t.0);
    PeerStatus {
        cluster_id: fc.spec.cluster_id.clone(),
        role: role_str(status.role).to_owned(),
        phase: status.phase.map_or("-", Phase::as_str).to_owned(),
        authentication: cond(types::AUTHENTICATION),
        networking: cond(types::NETWORKING),
        offloading: cond(types::OFFLOADING),
        api_server: cond(types::API_SERVER_REACHABLE),
        in_band: fc.spec.provider.as_ref().is_some_and(|p| p.in_band),
        created: created.map(rfc3339),
        age: created.map_or_else(|| "<unknown>".to_owned(), |c| text::age(since(c, now))),
        tunnel: net.connection.as_ref().map(tunnel_view),
        remaps: net
            .configuration
            .as_ref()
            .map(remap_views)
            .unwrap_or_default(),
        conditions: status
            .conditions
            .iter()
            .map(|c| ConditionView {
                type_: c.type_.clone(),
                status: c.status.clone(),
                reason: c.reason.clone(),
                message: c.message.clone(),
            })
            .collect(),
    }
}

/// Builds the report from what was read, without networking objects.
pub fn report(local: LocalCluster, fcs: &[ForeignCluster], now: Timestamp) -> StatusReport {
    report_with_network(local, fcs, &BTreeMap::new(), now)
}

/// Builds the report from what was read; `nets` holds each peer's networking objects by
/// cluster ID.
pub fn report_with_network(
    local: LocalCluster,
    fcs: &[ForeignCluster],
    nets: &BTreeMap<String, PeerNetwork>,
    now: Timestamp,
) -> StatusReport {
    let none = PeerNetwork::default();
    let mut peers: Vec<PeerStatus> = fcs
        .iter()
        .map(|fc| peer_status(fc, nets.get(&fc.spec.cluster_id).unwrap_or(&none), now))
        .collect();
    peers.sort_by(|a, b| a.cluster_id.cmp(&b.cluster_id));
    StatusReport {
        cluster: local,
        peers,
    }
}

/// The human form: the local cluster, the peers table, then each failing condition as
/// `cluster: condition: reason: message`.
pub fn render_table(r: &StatusReport) -> String {
    let c = &r.cluster;
    let mut out = format!(
        "Cluster {} (Tether {}): controller {} ({})\n",
        c.cluster_id,
        c.version.as_deref().unwrap_or("unknown version"),
        if c.controller_ready {
            "ready"
        } else {
            "NOT ready"
        },
        c.controller
    );
    match (&c.auth_url, &c.auth_fingerprint) {
        (Some(url), Some(fp)) => out.push_str(&format!("Authentication: {url} ({fp})\n")),
        _ => out.push_str("Authentication: not published yet by the controller\n"),
    }
    out.push('\n');
    if r.peers.is_empty() {
        out.push_str("No peers. Peer with `tether peer` (see `tether peer --help`).\n");
        return out;
    }
    let rows: Vec<Vec<String>> = r
        .peers
        .iter()
        .map(|p| {
            vec![
                p.cluster_id.clone(),
                p.role.clone(),
                p.phase.clone(),
                p.authentication.clone(),
                p.networking.clone(),
                p.offloading.clone(),
                if p.in_band {
                    format!("{} (in-band)", p.api_server)
                } else {
                    p.api_server.clone()
                },
                p.tunnel
                    .as_ref()
                    .map_or_else(|| "-".to_owned(), |t| t.state.clone()),
                p.tunnel
                    .as_ref()
                    .and_then(|t| t.latency.clone())
                    .unwrap_or_else(|| "-".to_owned()),
                p.age.clone(),
            ]
        })
        .collect();
    out.push_str(&text::table(
        &[
            "CLUSTER ID",
            "ROLE",
            "PHASE",
            "AUTHENTICATION",
            "NETWORKING",
            "OFFLOADING",
            "API SERVER",
            "TUNNEL",
            "LATENCY",
            "AGE",
        ],
        &rows,
    ));
    let remaps: Vec<String> = r
        .peers
        .iter()
        .flat_map(|p| {
            p.remaps.iter().map(move |m| {
                if m.remote == m.local {
                    format!("  {}: {} {} (not remapped)", p.cluster_id, m.kind, m.remote)
                } else {
                    format!(
                        "  {}: {} {} reached here as {}",
                        p.cluster_id, m.kind, m.remote, m.local
                    )
                }
            })
        })
        .collect();
    if !remaps.is_empty() {
        out.push_str("\nRemaps:\n");
        for line in remaps {
            out.push_str(&line);
            out.push('\n');
        }
    }
    let failing: Vec<String> = r
        .peers
        .iter()
        .flat_map(|p| {
            let mut lines: Vec<String> = p
                .conditions
                .iter()
                .filter(|c| c.status == "False")
                .map(|c| {
                    format!(
                        "  {}: {}: {}: {}",
                        p.cluster_id, c.type_, c.reason, c.message
                    )
                })
                .collect();
            if p.phase == "Failed" && lines.is_empty() {
                lines.push(format!(
                    "  {}: phase Failed, and no condition says why; check the controller's logs",
                    p.cluster_id
                ));
            }
            lines
        })
        .collect();
    if !failing.is_empty() {
        out.push_str("\nFailing conditions:\n");
        for line in failing {
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

/// Reads the local cluster's state.
pub async fn local_cluster(conn: &Conn) -> Result<LocalCluster> {
    let cluster_id = cluster::installed_cluster_id(conn).await?;
    let deployments: Api<Deployment> = Api::namespaced(conn.client.clone(), SYSTEM_NAMESPACE);
    let deployment = deployments
        .get_opt(objects::CONTROLLER)
        .await
        .map_err(Error::api("reading the controller Deployment"))?;
    let image = deployment.as_ref().and_then(controller_image);
    let (controller_ready, controller) = match &deployment {
        Some(d) => rollout_status(d),
        None => (false, "its Deployment does not exist".to_owned()),
    };
    let identity = cluster::public_identity(&conn.client)
        .await?
        .unwrap_or_default();
    Ok(LocalCluster {
        cluster_id: cluster_id.to_string(),
        version: image.as_deref().map(image_tag),
        image,
        controller_ready,
        controller,
        auth_url: identity.auth_url,
        auth_fingerprint: identity.auth_fingerprint,
    })
}

/// The controller container's image in a Deployment.
pub fn controller_image(d: &Deployment) -> Option<String> {
    d.spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == CONTAINER)?
        .image
        .clone()
}

/// The tag (or digest) of an image reference; `unknown` when it has neither.
pub fn image_tag(image: &str) -> String {
    if let Some((_, digest)) = image.split_once('@') {
        return digest.to_owned();
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    last.split_once(':')
        .map_or_else(|| "latest".to_owned(), |(_, t)| t.to_owned())
}

/// Reads everything `tether status` shows.
pub async fn gather(conn: &Conn) -> Result<StatusReport> {
    let local = local_cluster(conn).await?;
    let fcs = match Api::<ForeignCluster>::all(conn.client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(l) => l.items,
        Err(e) if is_not_found(&e) => Vec::new(),
        Err(e) => return Err(Error::api("listing ForeignClusters")(e)),
    };
    let mut nets = BTreeMap::new();
    for fc in &fcs {
        nets.insert(fc.spec.cluster_id.clone(), peer_network(conn, fc).await?);
    }
    Ok(report_with_network(local, &fcs, &nets, Timestamp::now()))
}

/// Reads a peer's Connection and Configuration; absent ones (module off, CRDs not installed,
/// exchange not done yet) are simply missing from the report.
async fn peer_network(conn: &Conn, fc: &ForeignCluster) -> Result<PeerNetwork> {
    let namespace = fc
        .status
        .as_ref()
        .and_then(|s| s.tenant_namespace.as_ref())
        .and_then(|t| t.local.clone())
        .unwrap_or_else(|| format!("{TENANT_NAMESPACE_PREFIX}{}", fc.spec.cluster_id));
    let connections: Api<Connection> = Api::namespaced(conn.client.clone(), &namespace);
    let connection = match connections.get_opt(objects::GATEWAY).await {
        Ok(c) => c,
        Err(e) if is_not_found(&e) => None,
        Err(e) => return Err(Error::api("reading the Connection tether-gateway")(e)),
    };
    let configurations: Api<Configuration> = Api::namespaced(conn.client.clone(), &namespace);
    let configuration = match configurations.get_opt(&fc.spec.cluster_id).await {
        Ok(c) => c,
        Err(e) if is_not_found(&e) => None,
        Err(e) => return Err(Error::api("reading the peer's Configuration")(e)),
    };
    Ok(PeerNetwork {
        connection,
        configuration,
    })
}
