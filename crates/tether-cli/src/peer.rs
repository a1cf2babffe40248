//! `tether peer` and `tether unpeer` on the consumer: checks that change nothing, then the token
//! Secret and the ForeignCluster, then a wait that prints every phase and condition change. A
//! failed peering removes what this run created.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::WatchStreamExt as _;
use tether_api::ClusterId;
use tether_api::authentication::Tenant;
use tether_api::conditions::{self, types};
use tether_api::core::{
    ForeignCluster, ForeignClusterSpec, GatewayServerChoice, GatewayServerSide, LocalObjectRef,
    ModuleSpec, Modules, NetworkingOptions, Phase, ProviderAccess,
};
use tether_api::names::{self, SYSTEM_NAMESPACE, labels, objects};
use tether_api::networking::ServiceType;
use tether_api::peering::{self, PeeringToken};

use crate::cluster::{self, Conn, Target};
use crate::error::{Error, Result, is_not_found};
use crate::install::{FIELD_MANAGER, rollout_status};
use crate::progress::Progress;
use crate::tokens;

const POLL: Duration = Duration::from_millis(250);

/// The modules this release can turn on.
pub const AVAILABLE_MODULES: &[&str] = &["authentication", "networking", "offloading"];

/// How `tether peer` reaches the provider.
#[derive(Debug, Clone)]
pub enum Provider {
    /// An admin kubeconfig of the provider: the CLI reads its identity and makes a short-lived
    /// token there.
    Kubeconfig(Target),
    /// What `tether generate peer-command` printed on the provider.
    Token {
        /// The authentication URL.
        auth_url: String,
        /// The token.
        token: PeeringToken,
        /// The certificate fingerprint, normalised.
        fingerprint: String,
    },
}

/// Checks the modules list: `authentication` is required; later modules are refused for now.
pub fn check_modules(modules: &[String]) -> Result<Modules> {
    let mut out = Modules {
        authentication: ModuleSpec { enabled: false },
        networking: ModuleSpec { enabled: false },
        offloading: ModuleSpec { enabled: false },
    };
    for m in modules.iter().map(|m| m.trim()).filter(|m| !m.is_empty()) {
        match m {
            "authentication" => out.authentication = ModuleSpec::on(),
            "networking" => out.networking = ModuleSpec::on(),
            "offloading" => out.offloading = ModuleSpec::on(),
            _ => {
                return Err(Error::Usage(format!(
                    "unknown module {m:?}: the modules are authentication, networking and \
                     offloading"
                )));
            }
        }
    }
    if !out.authentication.enabled {
        return Err(Error::Usage(
            "--modules must include authentication: every other module builds on it".to_owned(),
        ));
    }
    Ok(out)
}

/// The networking options from the flags.
pub fn networking_options(args: &crate::cli::PeerArgs) -> Result<NetworkingOptions> {
    if let Some(a) = &args.gateway_address
        && (a.trim().is_empty() || a.contains(char::is_whitespace) || a.len() > 253)
    {
        return Err(Error::Usage(format!(
            "--gateway-address {a:?} is not an address or host name"
        )));
    }
    if args.gateway_server == crate::cli::GatewaySide::Consumer
        && (args.gateway_address.is_some() || args.gateway_port.is_some())
    {
        return Err(Error::Usage(
            "--gateway-address and --gateway-port say how to dial the provider's gateway server, \
             but --gateway-server consumer makes the consumer listen: drop them, or use \
             --gateway-server provider (or auto)"
                .to_owned(),
        ));
    }
    Ok(NetworkingOptions {
        gateway_server: match args.gateway_server {
            crate::cli::GatewaySide::Auto => GatewayServerSide::Auto,
            crate::cli::GatewaySide::Provider => GatewayServerSide::Provider,
            crate::cli::GatewaySide::Consumer => GatewayServerSide::Consumer,
        },
        service_type: match args.gateway_service_type {
            crate::cli::GatewayServiceType::LoadBalancer => ServiceType::LoadBalancer,
            crate::cli::GatewayServiceType::NodePort => ServiceType::NodePort,
        },
        address: args.gateway_address.clone(),
        dial_port: args.gateway_port,
        mtu: args.mtu,
        ..NetworkingOptions::default()
    })
}

/// Checks an authentication URL: `https://HOST[:PORT]`, as the ForeignCluster schema requires.
pub fn check_auth_url(url: &str) -> Result<String> {
    let bad = |why: &str| {
        Error::Usage(format!(
            "invalid --auth-url {url:?}: {why}; use the URL `tether generate peer-command` \
             printed on the provider, like https://198.51.100.7:443"
        ))
    };
    let rest = url
        .strip_prefix("https://")
        .ok_or_else(|| bad("it must start with https://"))?;
    let host_port = rest.strip_suffix('/').unwrap_or(rest);
    if host_port.is_empty() || host_port.contains(['/', ' ', '\t', '?', '#', '@']) {
        return Err(bad(
            "it must be https:// followed by a host and an optional port, nothing else",
        ));
    }
    if let Some((_, port)) = host_port.rsplit_once(':')
        && !host_port.ends_with(']')
        && (port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(bad("its port is not a number"));
    }
    if host_port.len() > 2000 {
        return Err(bad("it is too long"));
    }
    Ok(host_port.to_owned()).map(|hp| format!("https://{hp}"))
}

/// Parses the token-form flags, before anything is contacted.
pub fn parse_token_form(auth_url: &str, token: &str, fingerprint: &str) -> Result<Provider> {
    let auth_url = check_auth_url(auth_url)?;
    let token = PeeringToken::parse(token).map_err(|e| Error::Usage(e.to_string()))?;
    let fingerprint = peering::normalize_fingerprint(fingerprint)
        .map_err(|e| Error::Usage(format!("invalid --ca-fingerprint: {e}")))?;
    Ok(Provider::Token {
        auth_url,
        token,
        fingerprint,
    })
}

/// How a `tether peer` run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerOutcome {
    /// The peering was already established with the same provider access; nothing changed.
    AlreadyPeered {
        /// The provider.
        provider: ClusterId,
        /// The resources granted, if this run asked for some.
        granted: Option<crate::offload::Granted>,
    },
    /// Authentication is now True.
    Peered {
        /// The provider.
        provider: ClusterId,
        /// The resources granted, if this run asked for some.
        granted: Option<crate::offload::Granted>,
    },
}

/// The consumer-side ForeignCluster `tether peer` applies.
pub fn foreign_cluster(
    provider: &ClusterId,
    auth_url: &str,
    fingerprint: &str,
    token: &PeeringToken,
) -> ForeignCluster {
    let mut fc = ForeignCluster::new(
        provider.as_str(),
        ForeignClusterSpec {
            cluster_id: provider.to_string(),
            provider: Some(ProviderAccess {
                auth_url: auth_url.to_owned(),
                ca_fingerprint: fingerprint.to_owned(),
                token_secret_ref: Some(LocalObjectRef {
                    name: peering::consumer_token_secret_name(token),
                }),
                in_band: false,
            }),
            modules: Modules {
                authentication: ModuleSpec::on(),
                networking: ModuleSpec { enabled: false },
                offloading: ModuleSpec { enabled: false },
            },
            networking: NetworkingOptions::default(),
        },
    );
    fc.metadata.labels = Some(BTreeMap::from([(
        labels::PART_OF.to_owned(),
        labels::MANAGED_BY_VALUE.to_owned(),
    )]));
    fc
}

/// The consumer-side Secret holding the token until the first identity is issued.
pub fn consumer_token_secret(provider: &ClusterId, token: &PeeringToken) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(peering::consumer_token_secret_name(token)),
            namespace: Some(SYSTEM_NAMESPACE.to_owned()),
            labels: Some(BTreeMap::from([
                (
                    labels::PART_OF.to_owned(),
                    labels::MANAGED_BY_VALUE.to_owned(),
                ),
                (labels::REMOTE_CLUSTER_ID.to_owned(), provider.to_string()),
            ])),
            ..Default::default()
        },
        type_: Some("Opaque".to_owned()),
        data: Some(BTreeMap::from([(
            peering::TOKEN_KEY.to_owned(),
            ByteString(token.expose().into_bytes()),
        )])),
        ..Default::default()
    }
}

/// A one-line summary of a ForeignCluster's state, for change detection and progress.
pub fn fc_summary(fc: &ForeignCluster) -> Vec<String> {
    let Some(status) = &fc.status else {
        return vec!["no status yet".to_owned()];
    };
    let mut out = vec![format!(
        "phase {}",
        status.phase.map_or("(none)", Phase::as_str)
    )];
    for c in &status.conditions {
        let mut line = format!("{} {}", c.type_, c.status);
        if !c.reason.is_empty() {
            line.push_str(&format!(" ({})", c.reason));
        }
        if c.status == "False" && !c.message.is_empty() {
            line.push_str(&format!(": {}", c.message));
        }
        out.push(line);
    }
    out
}

/// Which cluster runs the gateway server and why, from `status.networking`, once the
/// consumer's controller has chosen.
pub fn gateway_server_line(fc: &ForeignCluster) -> Option<String> {
    let n = fc.status.as_ref()?.networking.as_ref()?;
    let side = match n.gateway_server? {
        GatewayServerSide::Provider => "provider",
        GatewayServerSide::Consumer => "consumer",
        GatewayServerSide::Auto => return None,
    };
    let why = match (
        n.gateway_server_choice?,
        n.gateway_server,
        n.switches,
        n.connected,
    ) {
        (GatewayServerChoice::Requested, ..) => "as requested".to_owned(),
        (GatewayServerChoice::AddressGiven, ..) => {
            "--gateway-address/--gateway-port say how to dial it".to_owned()
        }
        (GatewayServerChoice::Automatic, _, 0, true) => {
            "chosen automatically: the provider's gateway was reachable".to_owned()
        }
        (GatewayServerChoice::Automatic, _, 0, false) => {
            "chosen automatically: trying the provider's gateway first".to_owned()
        }
        (GatewayServerChoice::Automatic, Some(GatewayServerSide::Consumer), 1, _) => {
            "chosen automatically: the provider's gateway was not reachable".to_owned()
        }
        (GatewayServerChoice::Automatic, _, n, true) => {
            format!("chosen automatically after {n} switches of side")
        }
        (GatewayServerChoice::Automatic, _, n, false) => format!(
            "chosen automatically: neither side's gateway was reachable yet ({n} switches); \
             trying the {side}'s"
        ),
    };
    Some(format!("gateway server: {side} ({why})"))
}

/// Whether a ForeignCluster's peering failed for good, and why.
pub fn failure(fc: &ForeignCluster) -> Option<String> {
    let status = fc.status.as_ref()?;
    if status.phase != Some(Phase::Failed) {
        return None;
    }
    let why = status
        .conditions
        .iter()
        .filter(|c| c.status == "False")
        .map(|c| format!("{}: {}: {}", c.type_, c.reason, c.message))
        .collect::<Vec<_>>();
    Some(if why.is_empty() {
        "phase Failed (no condition says why)".to_owned()
    } else {
        why.join("; ")
    })
}

fn connected(fc: &ForeignCluster) -> bool {
    current_and_true(fc, types::NETWORKING)
}

fn authenticated(fc: &ForeignCluster) -> bool {
    current_and_true(fc, types::AUTHENTICATION)
}

/// Whether condition `type_` is True for the spec as it is now. A ForeignCluster that showed
/// the remote as a tenant already says authenticated and connected (for the other direction)
/// before the controller has looked at the provider access `tether peer` just added.
fn current_and_true(fc: &ForeignCluster, type_: &str) -> bool {
    let Some(c) = fc
        .status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, type_))
    else {
        return false;
    };
    let stale = matches!(
        (c.observed_generation, fc.metadata.generation),
        (Some(seen), Some(now)) if seen < now
    );
    c.status == "True" && !stale
}

/// Whether the Deployment of the controller in `conn` has rolled out.
async fn check_controller_ready(conn: &Conn) -> Result<()> {
    let api: Api<Deployment> = Api::namespaced(conn.client.clone(), SYSTEM_NAMESPACE);
    let d = api
        .get_opt(objects::CONTROLLER)
        .await
        .map_err(Error::api(format!(
            "reading the {} controller Deployment",
            conn.role
        )))?;
    let line = match d {
        Some(d) => match rollout_status(&d) {
            (true, _) => return Ok(()),
            (false, line) => line,
        },
        None => "its Deployment does not exist".to_owned(),
    };
    Err(Error::Check(format!(
        "the Tether controller in the {} cluster ({}) is not ready: {line}; run `tether status` \
         there, or `tether install` again",
        conn.role, conn.url
    )))
}

/// What `tether peer` asks for, from its flags.
#[derive(Debug, Clone)]
pub struct PeerOptions<'a> {
    /// The modules to turn on.
    pub modules: &'a Modules,
    /// The networking options.
    pub networking: &'a NetworkingOptions,
    /// Whether control traffic rides the tunnel.
    pub in_band: bool,
    /// The resources to ask for (none: no request).
    pub amounts: crate::offload::Amounts<'a>,
    /// Their class.
    pub resource_class: &'a str,
}

/// Peers the local cluster (`local`, the consumer) with `provider`.
pub async fn peer(
    local: &Target,
    provider: &Provider,
    opts: &PeerOptions<'_>,
    timeout: Duration,
    progress: &mut Progress,
) -> Result<PeerOutcome> {
    let PeerOptions {
        modules,
        networking,
        in_band,
        amounts,
        resource_class: class,
    } = opts;
    let (modules, networking, in_band) = (*modules, *networking, *in_band);
    let deadline = Instant::now() + timeout;
    progress.phase("checking the clusters");
    let consumer = cluster::connect(local, "local").await?;
    let consumer_id = cluster::installed_cluster_id(&consumer).await?;
    let remote = match provider {
        Provider::Kubeconfig(target) => {
            let conn = cluster::connect(target, "remote").await?;
            let id = cluster::installed_cluster_id(&conn).await?;
            Some((conn, id))
        }
        Provider::Token { .. } => None,
    };
    let provider_id = match (&remote, provider) {
        (Some((_, id)), _) => id.clone(),
        (None, Provider::Token { token, .. }) => token.provider().clone(),
        (None, Provider::Kubeconfig(_)) => unreachable!("a kubeconfig provider was connected"),
    };
    if provider_id == consumer_id {
        return Err(same_id_error(
            &consumer,
            remote.as_ref().map(|(c, _)| c),
            provider,
            &consumer_id,
        )
        .await?);
    }
    let request = crate::offload::request(&provider_id, None, amounts, class)?;
    let resources = request.as_ref();
    check_controller_ready(&consumer).await?;
    let (auth_url, fingerprint) = match (&remote, provider) {
        (Some((conn, _)), _) => {
            check_controller_ready(conn).await?;
            let identity = cluster::public_identity(&conn.client)
                .await?
                .filter(cluster::PublicIdentity::is_complete)
                .ok_or_else(|| {
                    Error::Check(format!(
                        "the remote cluster ({}) has not published its authentication URL and \
                         fingerprint yet; wait for `tether install` there to finish",
                        conn.url
                    ))
                })?;
            let fp = peering::normalize_fingerprint(
                identity.auth_fingerprint.as_deref().unwrap_or_default(),
            )
            .map_err(|e| {
                Error::Check(format!(
                    "the remote cluster publishes a bad fingerprint: {e}"
                ))
            })?;
            (identity.auth_url.unwrap_or_default(), fp)
        }
        (
            None,
            Provider::Token {
                auth_url,
                fingerprint,
                ..
            },
        ) => (auth_url.clone(), fingerprint.clone()),
        (None, Provider::Kubeconfig(_)) => unreachable!("a kubeconfig provider was connected"),
    };
    progress.done(format!(
        "local cluster {consumer_id} and provider {provider_id} checked"
    ));

    let fcs: Api<ForeignCluster> = Api::all(consumer.client.clone());
    let mut existing = fcs
        .get_opt(provider_id.as_str())
        .await
        .map_err(Error::api(format!("reading ForeignCluster {provider_id}")))?;
    if existing
        .as_ref()
        .is_some_and(|fc| fc.metadata.deletion_timestamp.is_some())
    {
        // An earlier peering (or a failed run) is still being torn down: peering again is
        // what the user asked for, so wait for it to go rather than fail.
        progress.phase(format!(
            "waiting for the earlier peering with {provider_id} to be torn down"
        ));
        while existing
            .as_ref()
            .is_some_and(|fc| fc.metadata.deletion_timestamp.is_some())
        {
            if Instant::now() >= deadline {
                progress.failed("timed out");
                return Err(Error::Check(format!(
                    "the peering with {provider_id} is still being torn down; wait until `tether \
                     status` no longer lists it, then peer again"
                )));
            }
            tokio::time::sleep(POLL).await;
            existing = fcs
                .get_opt(provider_id.as_str())
                .await
                .map_err(Error::api(format!("reading ForeignCluster {provider_id}")))?;
        }
        progress.done("the earlier peering is gone");
    }
    if let Some(fc) = &existing {
        let same_access = fc
            .spec
            .provider
            .as_ref()
            .is_some_and(|p| p.auth_url == auth_url && p.ca_fingerprint == fingerprint);
        if same_access
            && authenticated(fc)
            && fc.spec.modules == *modules
            && fc.spec.networking == *networking
            && (!modules.networking.enabled || connected(fc))
        {
            progress.note(format!(
                "already peered with {provider_id} with these modules and options"
            ));
            let granted = match resources {
                Some(r) => Some(
                    crate::offload::ask(
                        &consumer,
                        &consumer_id,
                        &provider_id,
                        r,
                        deadline,
                        progress,
                    )
                    .await?,
                ),
                None => None,
            };
            return Ok(PeerOutcome::AlreadyPeered {
                provider: provider_id,
                granted,
            });
        }
    }

    let mut cleanup = Cleanup::default();
    let mut created = crate::in_band::Created::default();
    // In-band: the tunnel first (carried by this process), then authentication through it.
    let tunnel = match (&remote, in_band) {
        (Some((conn, _)), true) => Some(
            crate::in_band::build_tunnel(
                &consumer,
                conn,
                &consumer_id,
                &provider_id,
                networking,
                deadline,
                &mut created,
                progress,
            )
            .await,
        ),
        _ => None,
    };
    let result = match &tunnel {
        Some(Err(_)) => Ok(()),
        Some(Ok(t)) => {
            write_and_wait(
                &consumer,
                remote.as_ref().map(|(c, _)| c),
                provider,
                &consumer_id,
                &provider_id,
                &t.auth_url,
                &fingerprint,
                (modules, &t.networking, true),
                existing.is_none(),
                deadline,
                &mut cleanup,
                progress,
            )
            .await
        }
        None => {
            write_and_wait(
                &consumer,
                remote.as_ref().map(|(c, _)| c),
                provider,
                &consumer_id,
                &provider_id,
                &auth_url,
                &fingerprint,
                (modules, networking, false),
                existing.is_none(),
                deadline,
                &mut cleanup,
                progress,
            )
            .await
        }
    };
    let result = match tunnel {
        Some(Err(e)) => Err(e),
        _ => result,
    };
    // Offloading comes last: the grant is asked for with the identity just issued.
    let result = match (result, resources) {
        (Ok(()), Some(r)) => {
            crate::offload::ask(&consumer, &consumer_id, &provider_id, r, deadline, progress)
                .await
                .map(Some)
        }
        (Ok(()), None) => Ok(None),
        (Err(e), _) => Err(e),
    };
    if result.is_err()
        && let Some((conn, _)) = &remote
    {
        let removed = created.undo(&consumer, conn).await;
        if !removed.is_empty() {
            progress.note(format!("removed {}", removed.join(", ")));
        }
    }
    if let Some((conn, _)) = &remote
        && let Some(id) = &cleanup.provider_token
    {
        // The short-lived token has done its job (or failed); it must not outlive this run.
        let _ = tokens::revoke(&conn.client, id).await;
    }
    match result {
        Ok(granted) => Ok(PeerOutcome::Peered {
            provider: provider_id,
            granted,
        }),
        Err(e) => {
            progress.phase("removing what this run created");
            let removed = cleanup.undo(&consumer).await;
            progress.done(if removed.is_empty() {
                "nothing to remove".to_owned()
            } else {
                format!("removed {}", removed.join(", "))
            });
            Err(e)
        }
    }
}

async fn same_id_error(
    consumer: &Conn,
    remote: Option<&Conn>,
    provider: &Provider,
    id: &ClusterId,
) -> Result<Error> {
    let same_cluster = match (remote, provider) {
        (Some(remote), _) => {
            let a = cluster::kube_system_uid(&consumer.client).await?;
            let b = cluster::kube_system_uid(&remote.client).await?;
            a.is_some() && a == b
        }
        (None, Provider::Token { fingerprint, .. }) => cluster::public_identity(&consumer.client)
            .await?
            .and_then(|i| i.auth_fingerprint)
            .is_some_and(|own| {
                peering::normalize_fingerprint(&own).ok().as_deref() == Some(fingerprint.as_str())
            }),
        (None, Provider::Kubeconfig(_)) => false,
    };
    Ok(if same_cluster {
        Error::Usage(format!(
            "cannot peer cluster {id} with itself: the provider given is this same cluster; use \
             the provider's kubeconfig, or the command `tether generate peer-command` printed there"
        ))
    } else {
        Error::Check(format!(
            "both clusters have the cluster ID {id}, but cluster IDs must be unique among peers; \
             reinstall one of them with another ID (`tether uninstall`, then `tether install \
             --cluster-id NEW-ID`)"
        ))
    })
}

/// What one `tether peer` run created, to undo on failure.
#[derive(Debug, Default)]
struct Cleanup {
    foreign_cluster: Option<String>,
    consumer_secret: Option<String>,
    provider_token: Option<String>,
}

impl Cleanup {
    async fn undo(&self, consumer: &Conn) -> Vec<String> {
        let mut removed = Vec::new();
        if let Some(name) = &self.foreign_cluster {
            let api: Api<ForeignCluster> = Api::all(consumer.client.clone());
            if api.delete(name, &DeleteParams::default()).await.is_ok() {
                // The controller's finalizer undoes what the peering reached first: the run
                // ends once that is done, so what it reports removed is gone.
                let gone = cluster::gone_within(&api, name, cluster::UNDO_PATIENCE).await;
                removed.push(if gone {
                    format!("ForeignCluster {name}")
                } else {
                    format!(
                        "ForeignCluster {name} (deleted, but the controller had not released it \
                         after {} s; `kubectl get foreignclusters` shows why)",
                        cluster::UNDO_PATIENCE.as_secs()
                    )
                });
            }
        }
        if let Some(name) = &self.consumer_secret {
            let api: Api<Secret> = Api::namespaced(consumer.client.clone(), SYSTEM_NAMESPACE);
            if api.delete(name, &DeleteParams::default()).await.is_ok() {
                removed.push(format!("Secret {SYSTEM_NAMESPACE}/{name}"));
            }
        }
        if let Some(id) = &self.provider_token {
            removed.push(format!("the temporary token {id} on the provider"));
        }
        removed
    }
}

#[allow(clippy::too_many_arguments)]
async fn write_and_wait(
    consumer: &Conn,
    remote: Option<&Conn>,
    provider: &Provider,
    consumer_id: &ClusterId,
    provider_id: &ClusterId,
    auth_url: &str,
    fingerprint: &str,
    (modules, networking, in_band): (&Modules, &NetworkingOptions, bool),
    fc_is_new: bool,
    deadline: Instant,
    cleanup: &mut Cleanup,
    progress: &mut Progress,
) -> Result<()> {
    let token = match (remote, provider) {
        (Some(conn), _) => {
            progress.phase("creating a short-lived token on the provider");
            let ttl = deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(600);
            let (token, _) = tokens::create(
                &conn.client,
                provider_id,
                ttl,
                Some(&format!("tether peer from {consumer_id} (temporary)")),
            )
            .await?;
            cleanup.provider_token = Some(token.id().to_owned());
            progress.done(format!("token {} created on the provider", token.id()));
            token
        }
        (None, Provider::Token { token, .. }) => token.clone(),
        (None, Provider::Kubeconfig(_)) => unreachable!("a kubeconfig provider was connected"),
    };

    progress.phase(format!(
        "writing the token Secret and ForeignCluster {provider_id}"
    ));
    let secret = consumer_token_secret(provider_id, &token);
    let secrets: Api<Secret> = Api::namespaced(consumer.client.clone(), SYSTEM_NAMESPACE);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let secret_name = peering::consumer_token_secret_name(&token);
    cleanup.consumer_secret = Some(secret_name.clone());
    secrets
        .patch(&secret_name, &params, &Patch::Apply(&secret))
        .await
        .map_err(Error::api(format!(
            "writing Secret {SYSTEM_NAMESPACE}/{secret_name}"
        )))?;
    let mut fc = foreign_cluster(provider_id, auth_url, fingerprint, &token);
    if let Some(access) = fc.spec.provider.as_mut() {
        access.in_band = in_band;
    }
    fc.spec.modules = modules.clone();
    fc.spec.networking = networking.clone();
    let fcs: Api<ForeignCluster> = Api::all(consumer.client.clone());
    if fc_is_new {
        cleanup.foreign_cluster = Some(provider_id.to_string());
    }
    let value = serde_json::json!({
        "apiVersion": "core.tether.dev/v1alpha1",
        "kind": "ForeignCluster",
        "metadata": {"name": provider_id.as_str(), "labels": fc.metadata.labels},
        "spec": fc.spec,
    });
    fcs.patch(provider_id.as_str(), &params, &Patch::Apply(&value))
        .await
        .map_err(Error::api(format!("writing ForeignCluster {provider_id}")))?;
    progress.done(format!("ForeignCluster {provider_id} written"));

    progress.phase(format!(
        "waiting for the provider {provider_id} to authenticate this cluster"
    ));
    let mut last: Vec<String> = Vec::new();
    let mut tunnel_phase = false;
    let mut last_side: Option<String> = None;
    // Every change of the ForeignCluster wakes the loop at once; the poll is only a fallback.
    let mut changes = kube::runtime::watcher(
        fcs.clone(),
        kube::runtime::watcher::Config::default()
            .fields(&format!("metadata.name={provider_id}")),
    )
    // A failing watch must not spin the loop: back off between its errors.
    .default_backoff()
    .boxed();
    loop {
        let fc = fcs
            .get_opt(provider_id.as_str())
            .await
            .map_err(Error::api(format!("reading ForeignCluster {provider_id}")))?
            .ok_or_else(|| {
                Error::Check(format!(
                    "ForeignCluster {provider_id} disappeared while peering (deleted by someone \
                     else?); run `tether peer` again"
                ))
            })?;
        let summary = fc_summary(&fc);
        for line in summary.iter().filter(|l| !last.contains(l)) {
            progress.note(line);
        }
        last = summary;
        if authenticated(&fc) && !tunnel_phase {
            progress.done(format!("authenticated to {provider_id}"));
            if !modules.networking.enabled {
                return Ok(());
            }
            tunnel_phase = true;
            progress.phase(format!(
                "building the tunnel to {provider_id} (gateway server {})",
                match networking.gateway_server {
                    GatewayServerSide::Auto => "chosen automatically",
                    GatewayServerSide::Provider => "on the provider",
                    GatewayServerSide::Consumer => "on the consumer",
                }
            ));
        }
        let side = gateway_server_line(&fc);
        if tunnel_phase && connected(&fc) {
            progress.done(match side {
                Some(side) => format!("tunnel to {provider_id} up; {side}"),
                None => format!("tunnel to {provider_id} up"),
            });
            return Ok(());
        }
        if tunnel_phase && side.is_some() && side != last_side {
            progress.note(side.as_deref().unwrap_or_default());
            last_side = side;
        }
        if let Some(why) = failure(&fc) {
            progress.failed("peering failed");
            return Err(Error::Check(format!(
                "peering with {provider_id} failed: {why}"
            )));
        }
        if Instant::now() >= deadline {
            progress.failed("timed out");
            return Err(Error::Check(format!(
                "peering with {provider_id} did not complete in time (at {auth_url}); last state: \
                 {}. Check that this cluster's controller can reach {auth_url}, then run `tether \
                 peer` again (with a longer --timeout if the provider is slow)",
                last.join("; ")
            )));
        }
        let _ = tokio::time::timeout(POLL, changes.next()).await;
    }
}

/// Tears down the peering with `remote_id` from the consumer `local`. With `force` the local
/// side is removed even if the provider cannot be told. With `remote` (the provider's
/// kubeconfig) it also checks that the provider's side is gone.
pub async fn unpeer(
    local: &Target,
    remote_id: Option<&ClusterId>,
    remote: Option<&Target>,
    force: bool,
    timeout: Duration,
    progress: &mut Progress,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    progress.phase("checking the clusters");
    let consumer = cluster::connect(local, "local").await?;
    let consumer_id = cluster::installed_cluster_id(&consumer).await?;
    let remote_conn = match remote {
        Some(target) => {
            match cluster::connect(target, "remote").await {
                Ok(conn) => Some(conn),
                Err(e @ Error::Unreachable { .. }) if !force => {
                    progress.failed("the provider is unreachable");
                    progress.note("pass --force to remove the local side only");
                    return Err(e);
                }
                Err(Error::Unreachable { url, .. }) => {
                    progress.note(format!("the provider at {url} is unreachable; --force: removing the local side only"));
                    None
                }
                Err(e) => return Err(e),
            }
        }
        None => None,
    };
    let provider_id = match (remote_id, &remote_conn) {
        (Some(id), _) => id.clone(),
        (None, Some(conn)) => cluster::installed_cluster_id(conn).await?,
        (None, None) => {
            return Err(Error::Usage(
                "the provider is unreachable and no --remote-cluster-id was given: pass \
                 --remote-cluster-id ID with --force"
                    .to_owned(),
            ));
        }
    };
    progress.done(format!(
        "local cluster {consumer_id}, provider {provider_id}"
    ));

    let fcs: Api<ForeignCluster> = Api::all(consumer.client.clone());
    let existing = fcs
        .get_opt(provider_id.as_str())
        .await
        .map_err(Error::api(format!("reading ForeignCluster {provider_id}")))?;
    if existing.is_none() {
        progress.note(format!(
            "this cluster does not peer with {provider_id}; nothing to delete here"
        ));
    } else {
        progress.phase(format!("deleting ForeignCluster {provider_id}"));
        match fcs
            .delete(provider_id.as_str(), &DeleteParams::default())
            .await
        {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(Error::api(format!("deleting ForeignCluster {provider_id}"))(e)),
        }
        progress.done("deletion requested");
        wait_fc_gone(&consumer, &provider_id, deadline, force, progress).await?;
    }
    if force {
        // Tokens kept for this provider (named after their token IDs) go with the peering.
        let secrets: Api<Secret> = Api::namespaced(consumer.client.clone(), SYSTEM_NAMESPACE);
        let _ = secrets
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().labels(&format!(
                    "{}={provider_id},{}={}",
                    labels::REMOTE_CLUSTER_ID,
                    labels::PART_OF,
                    labels::MANAGED_BY_VALUE
                )),
            )
            .await;
    }
    if let Some(conn) = &remote_conn {
        wait_provider_side_gone(conn, &consumer_id, deadline, progress).await?;
    } else if force {
        progress.note(format!(
            "removed the local side only: the provider {provider_id} may still hold a Tenant for \
             {consumer_id}; run `tether uninstall` there or delete Tenant {consumer_id} with kubectl"
        ));
    }
    Ok(())
}

async fn wait_fc_gone(
    consumer: &Conn,
    provider_id: &ClusterId,
    deadline: Instant,
    force: bool,
    progress: &mut Progress,
) -> Result<()> {
    let fcs: Api<ForeignCluster> = Api::all(consumer.client.clone());
    progress.phase(format!(
        "waiting until ForeignCluster {provider_id} is gone"
    ));
    // With --force the controller gets a short grace to finish normally before the finalizer
    // is taken away.
    let force_at = Instant::now()
        + Duration::from_secs(5).min(deadline.saturating_duration_since(Instant::now()));
    let mut forced = false;
    let mut last: Vec<String> = Vec::new();
    loop {
        let Some(fc) = fcs
            .get_opt(provider_id.as_str())
            .await
            .map_err(Error::api(format!("reading ForeignCluster {provider_id}")))?
        else {
            progress.done(format!("ForeignCluster {provider_id} gone"));
            break;
        };
        let summary = fc_summary(&fc);
        for line in summary.iter().filter(|l| !last.contains(l)) {
            progress.note(line);
        }
        last = summary;
        if force && !forced && Instant::now() >= force_at {
            forced = true;
            progress.note(
                "--force: removing the ForeignCluster's finalizers (the provider is not told)",
            );
            let patch = serde_json::json!({"metadata": {"finalizers": null}});
            match fcs
                .patch(
                    provider_id.as_str(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            {
                Ok(_) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => {
                    return Err(Error::api(format!(
                        "removing the finalizers of ForeignCluster {provider_id}"
                    ))(e));
                }
            }
            let ns = names::tenant_namespace(provider_id);
            let namespaces: Api<Namespace> = Api::all(consumer.client.clone());
            match namespaces.delete(&ns, &DeleteParams::default()).await {
                Ok(_) => progress.note(format!("deleted the local tenant namespace {ns}")),
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(Error::api(format!("deleting Namespace {ns}"))(e)),
            }
        }
        if Instant::now() >= deadline {
            progress.failed(format!("ForeignCluster {provider_id} is still there"));
            return Err(Error::Check(format!(
                "ForeignCluster {provider_id} was not removed in time; last state: {}. If the \
                 provider is unreachable, run `tether unpeer --force` to remove the local side only",
                last.join("; ")
            )));
        }
        tokio::time::sleep(POLL).await;
    }
    Ok(())
}

async fn wait_provider_side_gone(
    provider: &Conn,
    consumer_id: &ClusterId,
    deadline: Instant,
    progress: &mut Progress,
) -> Result<()> {
    progress.phase(format!(
        "checking that the provider removed {consumer_id}'s tenant"
    ));
    let tenants: Api<Tenant> = Api::all(provider.client.clone());
    let fcs: Api<ForeignCluster> = Api::all(provider.client.clone());
    let namespaces: Api<Namespace> = Api::all(provider.client.clone());
    let ns = names::tenant_namespace(consumer_id);
    loop {
        let mut left = Vec::new();
        let tenant = tenants
            .get_opt(consumer_id.as_str())
            .await
            .map_err(Error::api(format!(
                "reading Tenant {consumer_id} on the provider"
            )))?;
        if tenant.is_some() {
            left.push(format!("Tenant {consumer_id}"));
        }
        // When the provider also consumes from this cluster, its ForeignCluster and the shared
        // tenant namespace stay for that direction.
        let fc = fcs
            .get_opt(consumer_id.as_str())
            .await
            .map_err(Error::api(format!(
                "reading ForeignCluster {consumer_id} on the provider"
            )))?;
        let other_direction = fc.as_ref().is_some_and(|f| f.spec.provider.is_some());
        if fc.is_some() && !other_direction {
            left.push(format!("ForeignCluster {consumer_id}"));
        }
        if !other_direction
            && namespaces
                .get_metadata_opt(&ns)
                .await
                .map_err(Error::api(format!(
                    "reading Namespace {ns} on the provider"
                )))?
                .is_some()
        {
            left.push(format!("Namespace {ns}"));
        }
        if left.is_empty() {
            progress.done("the provider's side is gone");
            return Ok(());
        }
        progress.update(format!("left on the provider: {}", left.join(", ")));
        if Instant::now() >= deadline {
            progress.failed("the provider's side is still there");
            return Err(Error::Check(format!(
                "the provider ({}) still has {} after the local side was removed; check its \
                 controller with `tether status` there",
                provider.url,
                left.join(", ")
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fc(generation: i64, observed: Option<i64>, status: &str) -> ForeignCluster {
        let mut fc: ForeignCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "core.tether.dev/v1alpha1",
            "kind": "ForeignCluster",
            "metadata": { "name": "beta" },
            "spec": { "clusterID": "beta" },
        }))
        .expect("a ForeignCluster");
        fc.metadata.generation = Some(generation);
        let mut st = tether_api::core::ForeignClusterStatus::default();
        st.conditions.push(conditions::Condition {
            type_: types::NETWORKING.to_owned(),
            status: status.to_owned(),
            reason: "Connected".to_owned(),
            message: String::new(),
            observed_generation: observed,
            last_transition_time: conditions::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        });
        fc.status = Some(st);
        fc
    }

    #[test]
    fn a_condition_of_an_older_spec_does_not_count() {
        assert!(connected(&fc(2, Some(2), "True")));
        assert!(connected(&fc(2, None, "True")));
        assert!(!connected(&fc(3, Some(2), "True")));
        assert!(!connected(&fc(2, Some(2), "False")));
        assert!(!authenticated(&fc(2, Some(2), "True")));
    }

    /// One line per recorded state: what the progress output says about the gateway server.
    #[test]
    fn the_gateway_server_line_names_the_side_and_why() {
        use tether_api::core::{GatewayServerChoice as C, GatewayServerSide as S};
        let cases = [
            (None, None, 0, false),
            (Some(S::Provider), Some(C::Requested), 0, false),
            (Some(S::Consumer), Some(C::Requested), 0, true),
            (Some(S::Provider), Some(C::AddressGiven), 0, true),
            (Some(S::Provider), Some(C::Automatic), 0, false),
            (Some(S::Provider), Some(C::Automatic), 0, true),
            (Some(S::Consumer), Some(C::Automatic), 1, false),
            (Some(S::Consumer), Some(C::Automatic), 1, true),
            (Some(S::Provider), Some(C::Automatic), 2, false),
            (Some(S::Provider), Some(C::Automatic), 2, true),
            (Some(S::Auto), Some(C::Automatic), 0, false),
        ];
        let mut out = Vec::new();
        for (side, choice, switches, connected) in cases {
            let mut f = fc(1, Some(1), "False");
            if let Some(st) = f.status.as_mut() {
                st.networking = Some(tether_api::core::NetworkingStatus {
                    gateway_server: side,
                    gateway_server_choice: choice,
                    switches,
                    connected,
                    ..Default::default()
                });
            }
            out.push(gateway_server_line(&f).unwrap_or_else(|| "-".to_owned()));
        }
        assert_eq!(
            out,
            [
                "-",
                "gateway server: provider (as requested)",
                "gateway server: consumer (as requested)",
                "gateway server: provider (--gateway-address/--gateway-port say how to dial it)",
                "gateway server: provider (chosen automatically: trying the provider's gateway first)",
                "gateway server: provider (chosen automatically: the provider's gateway was reachable)",
                "gateway server: consumer (chosen automatically: the provider's gateway was not reachable)",
                "gateway server: consumer (chosen automatically: the provider's gateway was not reachable)",
                "gateway server: provider (chosen automatically: neither side's gateway was reachable yet (2 switches); trying the provider's)",
                "gateway server: provider (chosen automatically after 2 switches of side)",
                "-",
            ]
        );
    }
}
