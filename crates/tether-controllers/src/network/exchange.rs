//! The consumer's side of the networking module: it exchanges CIDRs with its provider
//! through the tenant namespace there, asks for the gateway at the chosen side, copies the
//! public keys and the server's endpoint across, and reports the tunnel's state.

use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tether_api::ClusterId;
use tether_api::conditions::Status;
use tether_api::core::{GatewayServerSide, NetworkingOptions, NetworkingStatus};
use tether_api::names::{self, annotations, objects};
use tether_api::networking::{
    ClusterCidrs, Configuration, Connection, ConnectionState, Endpoint, GatewayClient,
    GatewayServer, GatewayType,
};

use super::local;
use super::server_side::{self, Seen};
use crate::Error;
use crate::context::Ctx;
use crate::namespaces::peer_labels;
use crate::offloading::watched::Watchable;
use crate::providers::Remote;

/// The field manager of what the consumer writes in its provider's cluster.
const CONSUMER_MANAGER: &str = "tether-consumer";

/// The field manager of the consumer's Configuration in the provider's cluster. In a two-way
/// peering that object is also the provider's own copy, which the provider's consumer step
/// applies with `spec.local`: a manager of its own keeps the two applies from removing each
/// other's fields.
const PEER_MANAGER: &str = "tether-peer";

/// Who manages the tunnel to a peer, from this direction's point of view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TunnelRole {
    /// This cluster's consumer step applies (and switches) the gateway pair.
    Manage,
    /// The other direction of a two-way peering created the tunnel: this direction only
    /// exchanges Configurations and reports that tunnel's Connection.
    Share {
        /// The consumer cluster that manages the tunnel.
        managed_by: String,
    },
}

/// Decides the [`TunnelRole`] from the `tether.dev/tunnel-consumer` annotations of the
/// gateways found in both tenant namespaces (`None` for a gateway without one, made before
/// the annotation existed, which counts as this direction's). When both directions started a
/// tunnel at once, the smaller cluster ID keeps managing so that exactly one pair remains.
pub fn tunnel_role(own: &str, found: &[Option<&str>]) -> TunnelRole {
    let ours = found.iter().any(|o| o.is_none_or(|o| o == own));
    let other = found.iter().flatten().filter(|o| **o != own).min().copied();
    match other {
        Some(o) if !ours || o < own => TunnelRole::Share {
            managed_by: o.to_owned(),
        },
        _ => TunnelRole::Manage,
    }
}

/// Where the networking module stands, for the ForeignCluster's `Networking` condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetOutcome {
    /// True once the tunnel is connected.
    pub status: Status,
    /// A CamelCase reason.
    pub reason: &'static str,
    /// What is happening or wrong, and what to do.
    pub message: String,
}

impl NetOutcome {
    fn waiting(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            status: Status::False,
            reason,
            message: message.into(),
        }
    }
}

/// The API of one kind in one namespace of either cluster.
fn api<K>(client: &kube::Client, ns: &str) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    <K as kube::Resource>::DynamicType: Default,
{
    Api::namespaced(client.clone(), ns)
}

fn apply_params() -> PatchParams {
    PatchParams::apply(CONSUMER_MANAGER).force()
}

/// The consumer's side of one exchange: a client of this cluster and what the exchange needs
/// to know about it. The controller builds it from its context ([`Consumer::of`]); `tether
/// peer --in-band` builds it from the admin client, so that the exchange has one
/// implementation whoever runs it.
#[derive(Clone)]
pub struct Consumer {
    /// A client of this (the consumer's) cluster.
    pub client: kube::Client,
    /// This cluster's ID.
    pub id: ClusterId,
    /// The namespace Tether runs in here (where the `tether-network` ConfigMap is).
    pub namespace: String,
    /// In-band peering: the provider-side gateway publishes the provider's control plane.
    pub in_band: bool,
}

impl Consumer {
    /// The controller's own view.
    pub fn of(ctx: &Ctx, in_band: bool) -> Self {
        Self {
            client: ctx.client.clone(),
            id: ctx.cluster_id().clone(),
            namespace: ctx.settings.namespace.clone(),
            in_band,
        }
    }

    fn cluster_id(&self) -> &ClusterId {
        &self.id
    }
}

/// One pass of the consumer's networking step. `provider` reaches the provider with the
/// identity it issued (or, from `tether peer --in-band`, with an admin client there);
/// `remote_ns` is this cluster's tenant namespace there. `record` is the ForeignCluster's
/// `status.networking` (which side listens, and why), updated in place.
pub async fn consumer_step(
    ctx: &Consumer,
    provider: Remote<'_>,
    remote: &ClusterId,
    remote_ns: &str,
    options: &NetworkingOptions,
    record: &mut Option<NetworkingStatus>,
) -> Result<NetOutcome, Error> {
    let local = match local::load_in(&ctx.client, &ctx.namespace).await? {
        Ok(l) => l,
        Err(message) => return Ok(NetOutcome::waiting("NetworkUnknown", message)),
    };
    let own = ctx.cluster_id();
    let local_ns = names::tenant_namespace(remote);
    let ours = local.to_cluster_cidrs(own);

    // 1. Our CIDRs into the provider's copy; its CIDRs come back in that copy's spec.local.
    let there: Configuration = provider
        .apply(
            remote_ns,
            own.as_str(),
            &PatchParams::apply(PEER_MANAGER).force(),
            &configuration_there(own, &ours),
        )
        .await
        .map_err(Error::kube(format!(
            "applying Configuration {remote_ns}/{own} at {remote}"
        )))?;
    let Some(theirs) = there.spec.local.clone() else {
        return Ok(NetOutcome::waiting(
            "ExchangingCIDRs",
            format!("waiting for {remote} to publish its CIDRs"),
        ));
    };
    if let Some(problem) = refused(&there) {
        return Ok(NetOutcome::waiting(
            "RemapFailed",
            format!("{remote} cannot address this cluster: {problem}"),
        ));
    }

    // 2. Our own copy, which our Configuration reconciler remaps.
    let here = api::<Configuration>(&ctx.client, &local_ns)
        .patch(
            remote.as_str(),
            &apply_params(),
            &Patch::Apply(json!({
                "apiVersion": "networking.tether.dev/v1alpha1",
                "kind": "Configuration",
                "metadata": { "name": remote.as_str(), "labels": peer_labels(remote) },
                "spec": { "local": ours, "remote": theirs },
            })),
        )
        .await
        .map_err(Error::kube(format!(
            "applying Configuration {local_ns}/{remote}"
        )))?;
    if let Some(problem) = refused(&here) {
        return Ok(NetOutcome::waiting("RemapFailed", problem));
    }
    if super::configuration::local_view(&here).is_none() {
        return Ok(NetOutcome::waiting(
            "Remapping",
            format!("choosing how this cluster addresses {remote}'s pods"),
        ));
    }

    // 3. The gateways, unless the other direction of a two-way peering runs the tunnel.
    let found = [
        tunnel_consumer::<GatewayServer>(Remote::Direct(&ctx.client), &local_ns).await?,
        tunnel_consumer::<GatewayClient>(Remote::Direct(&ctx.client), &local_ns).await?,
        tunnel_consumer::<GatewayServer>(provider, remote_ns).await?,
        tunnel_consumer::<GatewayClient>(provider, remote_ns).await?,
    ];
    let found: Vec<Option<&str>> = found.iter().flatten().map(|o| o.as_deref()).collect();
    let side = (tunnel_role(own.as_str(), &found) == TunnelRole::Manage)
        .then(|| server_side::current(options, record.as_ref()));
    let gateway = match side.as_ref().map(|s| s.gateway_server) {
        None => None,
        Some(Some(GatewayServerSide::Consumer)) => {
            server_here(ctx, provider, remote, remote_ns, &local_ns, options).await?
        }
        Some(_) => server_there(ctx, provider, remote, remote_ns, &local_ns, options).await?,
    };
    let Some(side) = side else {
        // The other direction's record says which side listens.
        *record = None;
        return match gateway {
            Some(waiting) => Ok(waiting),
            None => Ok(connection_outcome(
                remote,
                own_connection(ctx, &local_ns).await?.as_ref(),
            )),
        };
    };

    // 4. The tunnel, as our gateway sees it; it decides the automatic choice of the side.
    let (outcome, seen) = match gateway {
        Some(waiting) => (waiting, Seen::Starting),
        None => {
            let ours = match side.gateway_server {
                Some(GatewayServerSide::Consumer) => GatewayType::Server,
                _ => GatewayType::Client,
            };
            // Right after a switch the Connection of the old gateway may still be there
            // until it is collected with its owner: it says nothing about the new pair.
            let conn = own_connection(ctx, &local_ns)
                .await?
                .filter(|c| c.spec.type_ == ours);
            let seen = match conn.as_ref().and_then(|c| c.status.as_ref()?.value) {
                Some(ConnectionState::Connected) => Seen::Connected,
                Some(_) => Seen::Down,
                None => Seen::Starting,
            };
            (connection_outcome(remote, conn.as_ref()), seen)
        }
    };
    let now = tether_api::conditions::Time(k8s_openapi::jiff::Timestamp::now());
    let next = server_side::advance(&side, seen, &now);
    Ok(side_outcome(&side, next, record, outcome, options))
}

/// Records `next` and adds to the condition what the automatic choice of the side is doing.
fn side_outcome(
    side: &NetworkingStatus,
    next: NetworkingStatus,
    record: &mut Option<NetworkingStatus>,
    mut outcome: NetOutcome,
    options: &NetworkingOptions,
) -> NetOutcome {
    if next.gateway_server != side.gateway_server {
        tracing::info!(
            from = server_side::side_name(side.gateway_server),
            to = server_side::side_name(next.gateway_server),
            switches = next.switches,
            "the tunnel did not connect in time; switching the gateway server"
        );
        outcome.reason = "SwitchingGatewayServer";
        outcome.message = format!(
            "the tunnel did not connect within {}s with the {}'s gateway listening ({}): the {}'s \
             gateway listens next",
            server_side::ATTEMPT_WINDOW.as_secs(),
            server_side::side_name(side.gateway_server),
            outcome.message,
            server_side::side_name(next.gateway_server),
        );
    }
    if outcome.status != Status::True
        && let Some(note) = server_side::explain(&next, options.port)
    {
        outcome.message = format!("{}; {note}", outcome.message);
    }
    *record = Some(next);
    outcome
}

/// The Connection our gateway writes in the tenant namespace of the remote.
async fn own_connection(ctx: &Consumer, local_ns: &str) -> Result<Option<Connection>, Error> {
    api::<Connection>(&ctx.client, local_ns)
        .get_opt(objects::GATEWAY)
        .await
        .map_err(Error::kube(format!(
            "reading Connection {local_ns}/{}",
            objects::GATEWAY
        )))
}

/// A Configuration's `Ready=False` message, if its reconciler refused it.
fn refused(conf: &Configuration) -> Option<String> {
    let st = conf.status.as_ref()?;
    let c = tether_api::conditions::find(&st.conditions, tether_api::conditions::types::READY)?;
    (c.status == Status::False.as_str() && c.reason != "NetworkUnknown").then(|| c.message.clone())
}

/// The `Networking` condition from our gateway's Connection.
pub fn connection_outcome(remote: &ClusterId, conn: Option<&Connection>) -> NetOutcome {
    let Some(st) = conn.and_then(|c| c.status.as_ref()) else {
        return NetOutcome::waiting(
            "GatewayStarting",
            format!("the gateway to {remote} has not reported yet"),
        );
    };
    let detail = st
        .conditions
        .iter()
        .find(|c| c.status != Status::True.as_str())
        .map(|c| c.message.clone());
    match st.value {
        Some(ConnectionState::Connected) => NetOutcome {
            status: Status::True,
            reason: "Connected",
            message: match &st.latency {
                Some(l) => format!("the tunnel to {remote} is up (round trip {})", l.value),
                None => format!("the tunnel to {remote} is up"),
            },
        },
        Some(ConnectionState::Error) => NetOutcome::waiting(
            "TunnelError",
            detail.unwrap_or_else(|| format!("the tunnel to {remote} failed")),
        ),
        Some(ConnectionState::Connecting) | None => NetOutcome::waiting(
            "Connecting",
            detail.unwrap_or_else(|| format!("the tunnel to {remote} is connecting")),
        ),
    }
}

fn dial(options: &NetworkingOptions, published: &Endpoint) -> Endpoint {
    Endpoint {
        addresses: match &options.address {
            Some(a) => vec![a.clone()],
            None => published.addresses.clone(),
        },
        port: options.dial_port.unwrap_or(published.port),
    }
}

fn server_spec(
    own_or_remote: &ClusterId,
    options: &NetworkingOptions,
    client_key: Option<String>,
) -> serde_json::Value {
    let mut spec = json!({
        "remoteClusterID": own_or_remote.as_str(),
        "endpoint": { "port": options.port, "serviceType": options.service_type },
    });
    if let Some(mtu) = options.mtu {
        spec["mtu"] = json!(mtu);
    }
    if let Some(k) = client_key {
        spec["clientPublicKey"] = json!(k);
    }
    spec
}

fn client_spec(
    remote_of_it: &ClusterId,
    options: &NetworkingOptions,
    endpoint: &Endpoint,
    server_key: &str,
) -> serde_json::Value {
    let mut spec = json!({
        "remoteClusterID": remote_of_it.as_str(),
        "endpoint": endpoint,
        "serverPublicKey": server_key,
    });
    if let Some(mtu) = options.mtu {
        spec["mtu"] = json!(mtu);
    }
    spec
}

/// Marks the provider-side gateway of an in-band peering (absent otherwise, so that an
/// out-of-band peering's objects stay as they were).
fn in_band(mut spec: serde_json::Value, on: bool) -> serde_json::Value {
    if on {
        spec["inBand"] = json!(true);
    }
    spec
}

/// This cluster's CIDRs, for the copy of the Configuration in the provider's cluster.
fn configuration_there(own: &ClusterId, ours: &ClusterCidrs) -> serde_json::Value {
    json!({
        "apiVersion": "networking.tether.dev/v1alpha1",
        "kind": "Configuration",
        "metadata": { "name": own.as_str(), "labels": peer_labels(own) },
        "spec": { "remote": ours },
    })
}

fn object(
    kind: &str,
    labels_for: &ClusterId,
    consumer: &ClusterId,
    spec: serde_json::Value,
) -> serde_json::Value {
    json!({
        "apiVersion": "networking.tether.dev/v1alpha1",
        "kind": kind,
        "metadata": {
            "name": objects::GATEWAY,
            "labels": peer_labels(labels_for),
            "annotations": { annotations::TUNNEL_CONSUMER: consumer.as_str() },
        },
        "spec": spec,
    })
}

/// The gateway of kind `K` in `ns`, if any: `Some(annotation)`, the annotation being the
/// consumer that manages its tunnel. A namespace the identity cannot read counts as empty.
async fn tunnel_consumer<K: Watchable>(
    cluster: Remote<'_>,
    ns: &str,
) -> Result<Option<Option<String>>, Error> {
    match cluster.get::<K>(ns, objects::GATEWAY).await {
        Ok(found) => Ok(found
            .filter(|g| g.meta().deletion_timestamp.is_none())
            .map(|g| {
                g.meta()
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(annotations::TUNNEL_CONSUMER).cloned())
            })),
        Err(kube::Error::Api(e)) if e.code == 403 => Ok(None),
        Err(e) => Err(Error::kube(format!(
            "reading the gateway {ns}/{}",
            objects::GATEWAY
        ))(e)),
    }
}

/// Deletes a leftover gateway of the other kind (the side was switched).
async fn delete_other<K: Watchable>(cluster: Remote<'_>, ns: &str) -> Result<(), Error> {
    cluster
        .delete::<K>(ns, objects::GATEWAY)
        .await
        .map_err(Error::kube(format!("deleting the old gateway in {ns}")))
}

/// The provider listens: its GatewayServer (through the tenant identity), our GatewayClient.
async fn server_there(
    ctx: &Consumer,
    provider: Remote<'_>,
    remote: &ClusterId,
    remote_ns: &str,
    local_ns: &str,
    options: &NetworkingOptions,
) -> Result<Option<NetOutcome>, Error> {
    let own = ctx.cluster_id();
    delete_other::<GatewayClient>(provider, remote_ns).await?;
    delete_other::<GatewayServer>(Remote::Direct(&ctx.client), local_ns).await?;
    let our_client = api::<GatewayClient>(&ctx.client, local_ns)
        .get_opt(objects::GATEWAY)
        .await
        .map_err(Error::kube(format!(
            "reading GatewayClient {local_ns}/{}",
            objects::GATEWAY
        )))?;
    let client_key = our_client
        .as_ref()
        .and_then(|c| c.status.as_ref()?.public_key.clone());
    let server: GatewayServer = provider
        .apply(
            remote_ns,
            objects::GATEWAY,
            &apply_params(),
            &object(
                "GatewayServer",
                own,
                own,
                in_band(server_spec(own, options, client_key.clone()), ctx.in_band),
            ),
        )
        .await
        .map_err(Error::kube(format!(
            "applying GatewayServer {remote_ns}/{} at {remote}",
            objects::GATEWAY
        )))?;
    let st = server.status.clone().unwrap_or_default();
    let (Some(endpoint), Some(server_key)) = (st.endpoint, st.public_key) else {
        return Ok(Some(NetOutcome::waiting(
            "GatewayServerStarting",
            match tether_api::conditions::find(&st.conditions, tether_api::conditions::types::READY)
            {
                Some(c) => format!("{remote}'s gateway server: {}", c.message),
                None => format!("waiting for {remote} to start its gateway server"),
            },
        )));
    };
    api::<GatewayClient>(&ctx.client, local_ns)
        .patch(
            objects::GATEWAY,
            &apply_params(),
            &Patch::Apply(object(
                "GatewayClient",
                remote,
                own,
                client_spec(remote, options, &dial(options, &endpoint), &server_key),
            )),
        )
        .await
        .map_err(Error::kube(format!(
            "applying GatewayClient {local_ns}/{}",
            objects::GATEWAY
        )))?;
    if client_key.is_none() {
        return Ok(Some(NetOutcome::waiting(
            "GatewayClientStarting",
            "starting this cluster's gateway client",
        )));
    }
    Ok(None)
}

/// The consumer listens: our GatewayServer, the provider's GatewayClient.
async fn server_here(
    ctx: &Consumer,
    provider: Remote<'_>,
    remote: &ClusterId,
    remote_ns: &str,
    local_ns: &str,
    options: &NetworkingOptions,
) -> Result<Option<NetOutcome>, Error> {
    let own = ctx.cluster_id();
    delete_other::<GatewayServer>(provider, remote_ns).await?;
    delete_other::<GatewayClient>(Remote::Direct(&ctx.client), local_ns).await?;
    let their_client = provider
        .get::<GatewayClient>(remote_ns, objects::GATEWAY)
        .await
        .map_err(Error::kube(format!(
            "reading GatewayClient {remote_ns}/{} at {remote}",
            objects::GATEWAY
        )))?;
    let client_key = their_client
        .as_ref()
        .and_then(|c| c.status.as_ref()?.public_key.clone());
    let server = api::<GatewayServer>(&ctx.client, local_ns)
        .patch(
            objects::GATEWAY,
            &apply_params(),
            &Patch::Apply(object(
                "GatewayServer",
                remote,
                own,
                server_spec(remote, options, client_key.clone()),
            )),
        )
        .await
        .map_err(Error::kube(format!(
            "applying GatewayServer {local_ns}/{}",
            objects::GATEWAY
        )))?;
    let st = server.status.clone().unwrap_or_default();
    let (Some(endpoint), Some(server_key)) = (st.endpoint, st.public_key) else {
        return Ok(Some(NetOutcome::waiting(
            "GatewayServerStarting",
            match tether_api::conditions::find(&st.conditions, tether_api::conditions::types::READY)
            {
                Some(c) => format!("this cluster's gateway server: {}", c.message),
                None => "starting this cluster's gateway server".to_owned(),
            },
        )));
    };
    provider
        .apply::<GatewayClient>(
            remote_ns,
            objects::GATEWAY,
            &apply_params(),
            &object(
                "GatewayClient",
                own,
                own,
                in_band(
                    client_spec(own, options, &dial(options, &endpoint), &server_key),
                    ctx.in_band,
                ),
            ),
        )
        .await
        .map_err(Error::kube(format!(
            "applying GatewayClient {remote_ns}/{} at {remote}",
            objects::GATEWAY
        )))?;
    if client_key.is_none() {
        return Ok(Some(NetOutcome::waiting(
            "GatewayClientStarting",
            format!("waiting for {remote} to start its gateway client"),
        )));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    /// One line per case: who finds which gateways, and what it decides.
    #[test]
    fn tunnel_role_by_the_gateways_found() {
        let cases: &[(&str, &[Option<&str>])] = &[
            ("alpha", &[]),
            ("alpha", &[Some("alpha"), Some("alpha")]),
            ("alpha", &[None]),
            ("beta", &[Some("alpha"), Some("alpha")]),
            ("beta", &[Some("alpha")]),
            ("alpha", &[Some("alpha"), Some("beta")]),
            ("beta", &[Some("beta"), Some("alpha")]),
            ("beta", &[None, Some("alpha")]),
            ("gamma", &[Some("beta"), Some("alpha")]),
        ];
        let out: String = cases
            .iter()
            .map(|(own, found)| format!("{own} {found:?} -> {:?}\n", tunnel_role(own, found)))
            .collect();
        expect![[r#"
            alpha [] -> Manage
            alpha [Some("alpha"), Some("alpha")] -> Manage
            alpha [None] -> Manage
            beta [Some("alpha"), Some("alpha")] -> Share { managed_by: "alpha" }
            beta [Some("alpha")] -> Share { managed_by: "alpha" }
            alpha [Some("alpha"), Some("beta")] -> Manage
            beta [Some("beta"), Some("alpha")] -> Share { managed_by: "alpha" }
            beta [None, Some("alpha")] -> Share { managed_by: "alpha" }
            gamma [Some("beta"), Some("alpha")] -> Share { managed_by: "alpha" }
        "#]]
        .assert_eq(&out);
    }

    /// What the consumer applies in the provider's cluster reads back, through the typed
    /// objects a watch yields, as already applied: otherwise every pass would write again.
    #[test]
    fn applied_bodies_hold_in_the_objects_they_make() {
        let own = ClusterId::new("alpha").expect("cluster id");
        let options = NetworkingOptions {
            mtu: Some(1380),
            ..NetworkingOptions::default()
        };
        let ours = ClusterCidrs {
            cluster_id: own.to_string(),
            cidr: tether_api::networking::Cidrs {
                pod: vec!["10.0.0.0/16".into()],
                service: vec!["10.96.0.0/12".into()],
                external: vec![],
            },
        };
        let endpoint = Endpoint {
            addresses: vec!["198.18.0.10".into()],
            port: 51820,
        };
        fn round_trip<K: serde::de::DeserializeOwned + serde::Serialize>(
            body: &serde_json::Value,
        ) -> bool {
            let typed: K =
                serde_json::from_value(body.clone()).expect("the body reads as its kind");
            crate::applied::holds_in(body, &typed)
        }
        let bodies = [
            ("Configuration", configuration_there(&own, &ours)),
            (
                "GatewayServer",
                object(
                    "GatewayServer",
                    &own,
                    &own,
                    in_band(server_spec(&own, &options, Some("key".into())), true),
                ),
            ),
            (
                "GatewayClient",
                object(
                    "GatewayClient",
                    &own,
                    &own,
                    client_spec(&own, &options, &endpoint, "key"),
                ),
            ),
        ];
        for (kind, body) in &bodies {
            let holds = match *kind {
                "Configuration" => round_trip::<Configuration>(body),
                "GatewayServer" => round_trip::<GatewayServer>(body),
                _ => round_trip::<GatewayClient>(body),
            };
            assert!(holds, "{kind}: {body}");
        }
        // And a changed intent does not: the pass writes it.
        let before: GatewayServer = serde_json::from_value(bodies[1].1.clone()).expect("server");
        let after = object(
            "GatewayServer",
            &own,
            &own,
            server_spec(&own, &options, Some("new".into())),
        );
        assert!(!crate::applied::holds_in(&after, &before));
    }

    proptest::proptest! {
        /// Whatever both clusters find, at most one of them manages the tunnel, and one does
        /// once it sees its own gateway or none.
        #[test]
        fn at_most_one_direction_manages(
            found in proptest::collection::vec(
                proptest::option::of(proptest::sample::select(vec!["alpha", "beta"])),
                0..4,
            ),
        ) {
            let a = tunnel_role("alpha", &found) == TunnelRole::Manage;
            let b = tunnel_role("beta", &found) == TunnelRole::Manage;
            // Two managers only while nothing is annotated yet (or only legacy gateways).
            let annotated = !found.is_empty() && found.iter().all(Option::is_some);
            proptest::prop_assert!(!(annotated && a && b));
            proptest::prop_assert!(a || b);
        }
    }
}
