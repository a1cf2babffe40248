//! Wiring of `tetherd controller`: what every replica runs (identity, the authentication
//! service, address discovery) and what only the leader runs (the reconcilers, publishing,
//! token clean-up).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use tether_api::ClusterId;
use tether_api::authentication::{ResourceSlice, Tenant};
use tether_api::core::{ForeignCluster, Phase};
use tether_api::networking::{Configuration, GatewayClient, GatewayServer, IP};
use tether_api::offloading::VirtualNode;
use tokio_util::sync::CancellationToken;

use crate::auth::tls::AuthCert;
use crate::context::{Ctx, Settings};
use crate::foreign_cluster::{self, FcCtx};
use crate::identity::Identity;
use crate::metrics::Metrics;
use crate::network::configuration::{self, NetCtx};
use crate::network::{gateway, ips};
use crate::offloading::OffCtx;
use crate::{Error, publisher, tenant, tokens};

/// A started controller replica: identity loaded, authentication service listening,
/// discovery running.
pub struct Replica {
    /// Shared state.
    pub ctx: Arc<Ctx>,
    /// Where the authentication service listens.
    pub auth_addr: SocketAddr,
    leader: Arc<AtomicBool>,
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica")
            .field("auth_addr", &self.auth_addr)
            .finish_non_exhaustive()
    }
}

/// Starts the parts every replica runs. The returned futures run until `shutdown`.
pub async fn start(
    client: kube::Client,
    cluster_id: ClusterId,
    settings: Settings,
    auth_listen: SocketAddr,
    metrics: Metrics,
    shutdown: CancellationToken,
) -> Result<(Replica, Vec<tokio::task::JoinHandle<()>>), Error> {
    let identity =
        Identity::load_or_create(client.clone(), &settings.namespace, cluster_id).await?;
    let cert =
        AuthCert::load_or_create(client.clone(), &settings.namespace, &identity.cluster_id).await?;
    tracing::info!(cluster_id = %identity.cluster_id, fingerprint = %cert.fingerprint(), "identity loaded");
    let ctx = Arc::new(Ctx::new(
        client,
        Arc::new(identity),
        settings,
        cert.fingerprint(),
        metrics,
    ));
    let (auth_addr, serve) =
        crate::auth::server::serve(ctx.clone(), &cert, auth_listen, shutdown.clone()).await?;
    tracing::info!(%auth_addr, "authentication service listening");
    let leader = Arc::new(AtomicBool::new(false));
    let mut tasks = vec![tokio::spawn(serve)];
    if let Some(listen) = ctx.settings.webhook_listen {
        let cert = crate::webhook::WebhookCert::load_or_create(
            ctx.client.clone(),
            &ctx.settings.namespace,
        )
        .await?;
        let (addr, serve) =
            crate::webhook::serve(ctx.clone(), &cert, listen, shutdown.clone()).await?;
        tracing::info!(%addr, "admission webhook listening");
        tasks.push(tokio::spawn(serve));
        let client = ctx.client.clone();
        let shutdown = shutdown.clone();
        // The configuration is `tether install`'s; its caBundle is ours, and a re-install
        // may drop it, so it is checked again now and then.
        tasks.push(tokio::spawn(async move {
            loop {
                match crate::webhook::publish_ca(&client, &cert).await {
                    Ok(true) => tracing::info!("webhook CA published"),
                    Ok(false) => {}
                    Err(e) => tracing::warn!(error = %e, "publishing the webhook CA failed"),
                }
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_secs(30)) => {}
                }
            }
        }));
    }
    if let Some(listen) = ctx.settings.kubelet_listen {
        // Every replica serves it: the API server calls whichever pod IP the Nodes publish,
        // and each request only reads objects and calls providers.
        let providers = Arc::new(crate::providers::ProviderClients::default());
        let (addr, serve) = crate::offloading::kubelet::serve(
            ctx.clone(),
            providers,
            listen,
            crate::offloading::kubelet::callers::Decisions::default(),
            shutdown.clone(),
        )
        .await?;
        tracing::info!(%addr, "virtual kubelet API listening");
        tasks.push(tokio::spawn(serve));
    }
    {
        let ctx = ctx.clone();
        let leader = leader.clone();
        let shutdown = shutdown.clone();
        tasks.push(tokio::spawn(async move {
            publisher::run(&ctx, || leader.load(Ordering::Relaxed), shutdown).await;
        }));
    }
    Ok((
        Replica {
            ctx,
            auth_addr,
            leader,
        },
        tasks,
    ))
}

impl Replica {
    /// Whether the addresses peers need are known (readiness).
    pub fn addresses_known(&self) -> bool {
        let p = self.ctx.published();
        p.api_server_url.is_some() && p.auth_url.is_some()
    }

    /// Runs the leader's work until `stop` is cancelled.
    pub async fn lead(&self, stop: CancellationToken) {
        self.leader.store(true, Ordering::Relaxed);
        tracing::info!("leading: reconcilers started");
        let ctx = self.ctx.clone();
        let client = ctx.client.clone();
        let fctx = Arc::new(FcCtx::new(ctx.clone()));
        let providers = fctx.clients.clone();
        let watched = fctx.watched.clone();
        let fcs: Api<ForeignCluster> = Api::all(client.clone());
        let tenants: Api<Tenant> = Api::all(client.clone());
        let this = ctx.cluster_id().as_str().to_owned();
        // A peering's Offloading condition follows its requests and their virtual nodes.
        let fc_controller = Controller::new(fcs, watcher::Config::default())
            .watches(tenants.clone(), watcher::Config::default(), |t: Tenant| {
                Some(ObjectRef::new(&t.name_any()))
            })
            .watches(
                Api::<ResourceSlice>::all(client.clone()),
                watcher::Config::default(),
                move |s: ResourceSlice| {
                    (s.spec.consumer_cluster_id == this)
                        .then(|| ObjectRef::new(&s.spec.provider_cluster_id))
                },
            )
            .watches(
                Api::<VirtualNode>::all(client.clone()),
                watcher::Config::default(),
                |v: VirtualNode| Some(ObjectRef::new(&v.spec.cluster_id)),
            );
        let store = fc_controller.store();
        let fc_run = fc_controller
            .graceful_shutdown_on(stop.clone().cancelled_owned())
            .run(foreign_cluster::reconcile, fc_error_policy, fctx)
            .for_each(|_| async {});
        let tenant_run = Controller::new(tenants, watcher::Config::default())
            .graceful_shutdown_on(stop.clone().cancelled_owned())
            .run(tenant::reconcile, tenant_error_policy, ctx.clone())
            .for_each(|_| async {});
        let nctx = Arc::new(NetCtx::new(ctx.clone()));
        let conf_controller = Controller::new(
            Api::<Configuration>::all(client.clone()),
            watcher::Config::default(),
        );
        // Every Configuration lists the published IPs, so any IP's change touches them all.
        let confs = conf_controller.store();
        let conf_run = conf_controller
            .watches(
                Api::<IP>::all(client.clone()),
                watcher::Config::default(),
                move |_: IP| {
                    confs
                        .state()
                        .iter()
                        .map(|c| ObjectRef::from_obj(&**c))
                        .collect::<Vec<_>>()
                },
            )
            .graceful_shutdown_on(stop.clone().cancelled_owned())
            .run(configuration::reconcile, net_error_policy, nctx.clone())
            .for_each(|_| async {});
        let ip_run = Controller::new(Api::<IP>::all(client.clone()), watcher::Config::default())
            .graceful_shutdown_on(stop.clone().cancelled_owned())
            .run(ips::reconcile, net_error_policy, nctx.clone())
            .for_each(|_| async {});
        let server_run = Controller::new(
            Api::<GatewayServer>::all(client.clone()),
            watcher::Config::default(),
        )
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .run(gateway::reconcile_server, net_error_policy, nctx.clone())
        .for_each(|_| async {});
        let client_run = Controller::new(
            Api::<GatewayClient>::all(client.clone()),
            watcher::Config::default(),
        )
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .run(gateway::reconcile_client, net_error_policy, nctx.clone())
        .for_each(|_| async {});
        let off_run = crate::offloading::run(
            Arc::new(OffCtx::new(ctx.clone(), providers, watched)),
            stop.clone(),
        );
        let housekeeping = {
            let ctx = ctx.clone();
            let stop = stop.clone();
            async move {
                loop {
                    let counts: Vec<(Phase, i64)> = store
                        .state()
                        .iter()
                        .filter_map(|fc| fc.status.as_ref()?.phase)
                        .map(|p| (p, 1))
                        .collect();
                    ctx.metrics.set_peers(&counts);
                    match tokens::delete_expired(&ctx.client, &ctx.settings.namespace).await {
                        Ok(0) => {}
                        Ok(n) => tracing::info!(deleted = n, "expired peering tokens deleted"),
                        Err(e) => tracing::warn!(error = %e, "deleting expired tokens failed"),
                    }
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(Duration::from_secs(10)) => {}
                    }
                }
            }
        };
        tokio::join!(
            fc_run,
            tenant_run,
            conf_run,
            ip_run,
            server_run,
            client_run,
            off_run,
            housekeeping
        );
        self.leader.store(false, Ordering::Relaxed);
        tracing::info!("reconcilers stopped");
    }
}

fn fc_error_policy(fc: Arc<ForeignCluster>, e: &Error, _: Arc<FcCtx>) -> Action {
    tracing::warn!(foreign_cluster = %fc.name_any(), error = %e, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

fn net_error_policy<K: kube::Resource<DynamicType = ()>>(
    k: Arc<K>,
    e: &Error,
    _: Arc<NetCtx>,
) -> Action {
    tracing::warn!(kind = %K::kind(&()), name = %k.name_any(), error = %e, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

fn tenant_error_policy(t: Arc<Tenant>, e: &Error, _: Arc<Ctx>) -> Action {
    tracing::warn!(tenant = %t.name_any(), error = %e, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}
