//! `tetherd controller`: flags, start-up checks and the leader-election loop around
//! `tether_controllers::run`.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use clap::{ArgAction, Args};
use prometheus_client::registry::Registry;
use tether_api::ClusterId;
use tether_api::names::{SYSTEM_NAMESPACE, objects};
use tether_controllers::context::Settings;
use tether_controllers::metrics::Metrics;
use tether_runtime::{
    AdminArgs, AdminServer, Health, KubeArgs, LeaderElector, LeaseParams, LogArgs, Readiness,
    Shutdown, parse_duration,
};

/// The shortest certificate lifetime Kubernetes signs (`expirationSeconds` >= 600).
const MIN_IDENTITY_LIFETIME: Duration = Duration::from_secs(600);

#[derive(Debug, Args)]
pub(crate) struct ControllerArgs {
    /// This cluster's ID (a DNS-1123 label); `tether install` sets it from its ConfigMap.
    #[arg(long, env = "TETHER_CLUSTER_ID")]
    cluster_id: String,
    /// The namespace Tether runs in.
    #[arg(long, env = "POD_NAMESPACE", default_value = SYSTEM_NAMESPACE)]
    namespace: String,
    /// The controller's ServiceAccount, bound in tenant namespaces.
    #[arg(long, default_value = objects::CONTROLLER)]
    service_account: String,
    /// Where the authentication service listens (HTTPS).
    #[arg(long, default_value = "0.0.0.0:8443")]
    auth_listen: SocketAddr,
    /// The Service in front of the authentication service (its address is published).
    #[arg(long, default_value = objects::AUTH_SERVICE)]
    auth_service: String,
    /// Publish this authentication URL instead of the Service's address.
    #[arg(long)]
    auth_url: Option<String>,
    /// Give consumers this API server URL instead of the `kubernetes` endpoint's address.
    #[arg(long)]
    api_server_url: Option<String>,
    /// Lifetime of the client certificates issued to consumers (at least 10m).
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    identity_lifetime: Duration,
    /// How often a consumer checks its providers' API servers.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    ping_interval: Duration,
    /// The image of the gateway Deployments the networking module creates (normally the
    /// controller's own; `tether install` sets it).
    #[arg(long, env = "TETHER_GATEWAY_IMAGE", default_value = objects::IMAGE)]
    gateway_image: String,
    /// Where the admission webhook listens (HTTPS), which places pods of offloaded
    /// namespaces.
    #[arg(long, default_value = "0.0.0.0:9443")]
    webhook_listen: SocketAddr,
    /// Where the virtual nodes' kubelet API listens (HTTPS): the API server sends `kubectl
    /// logs`, `exec`, `attach` and `port-forward` on offloaded pods here.
    #[arg(long, default_value = "0.0.0.0:10250")]
    kubelet_listen: SocketAddr,
    /// This pod's IP: the address virtual nodes publish for their kubelet API (the
    /// Deployment sets it from the downward API).
    #[arg(long, env = "POD_IP")]
    pod_ip: Option<String>,
    /// How strictly consumers' offloaded pods are held to the resources granted to them:
    /// `none` (admit every pod), `soft` (pods must request cpu and memory, within the grant),
    /// `hard` (as soft, and limits must equal requests).
    #[arg(long, default_value = "soft", value_name = "none|soft|hard")]
    resource_enforcement: tether_resources::Enforcement,
    /// Elect a leader through a Lease, so several replicas are safe.
    #[arg(long, default_value_t = true, action = ArgAction::Set)]
    leader_election: bool,
    #[command(flatten)]
    admin: AdminArgs,
    #[command(flatten)]
    kube: KubeArgs,
    #[command(flatten)]
    log: LogArgs,
}

pub(crate) fn main(args: ControllerArgs) -> ExitCode {
    if let Err(e) = tether_runtime::telemetry::init(&args.log) {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let cluster_id = match ClusterId::new(args.cluster_id.clone()) {
        Ok(id) => id,
        Err(e) => {
            eprintln!("error: --cluster-id: {e}");
            return ExitCode::from(2);
        }
    };
    if args.identity_lifetime < MIN_IDENTITY_LIFETIME {
        eprintln!(
            "error: --identity-lifetime {}s is too short: Kubernetes signs client certificates \
             for at least 10m",
            args.identity_lifetime.as_secs()
        );
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args, cluster_id)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "controller failed");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: ControllerArgs, cluster_id: ClusterId) -> anyhow::Result<()> {
    let shutdown = Shutdown::on_signals().context("installing signal handlers")?;
    let mut registry = Registry::with_prefix("tether");
    let metrics = Metrics::register(&mut registry);
    let health = Health::new();
    let readiness = Readiness::new();
    readiness.register("identity", "loading the cluster identity");
    readiness.register(
        "addresses",
        "discovering the API server and authentication addresses",
    );
    let client = tether_runtime::kube_client(&args.kube)
        .await
        .context("connecting to the Kubernetes API")?;
    let elector = if args.leader_election {
        let e = LeaderElector::new(
            client.clone(),
            &args.namespace,
            objects::LEADER_LEASE,
            tether_runtime::default_identity(),
            LeaseParams::default(),
        )?;
        e.register_metrics(&mut registry);
        Some(e)
    } else {
        None
    };
    let registry = Arc::new(Mutex::new(registry));
    let admin = AdminServer::new(registry, health.clone()).with_readiness(readiness.clone());
    let (admin_addr, serve_admin) = admin.bind(args.admin.admin_addr, shutdown.clone()).await?;
    tracing::info!(%admin_addr, "admin server listening (/metrics, /healthz, /readyz)");
    let admin_task = tokio::spawn(serve_admin);

    let settings = Settings {
        namespace: args.namespace.clone(),
        service_account: args.service_account.clone(),
        auth_service: args.auth_service.clone(),
        identity_lifetime: args.identity_lifetime,
        api_server_url: args.api_server_url.clone(),
        auth_url: args.auth_url.clone(),
        ping_interval: args.ping_interval,
        gateway_image: args.gateway_image.clone(),
        pod_ip: args.pod_ip.clone(),
        resource_enforcement: args.resource_enforcement,
        webhook_listen: Some(args.webhook_listen),
        kubelet_listen: Some(args.kubelet_listen),
    };
    let (replica, tasks) = tether_controllers::run::start(
        client,
        cluster_id,
        settings,
        args.auth_listen,
        metrics,
        shutdown.token(),
    )
    .await
    .context("starting the controller")?;
    readiness.set_ready("identity");
    let replica = Arc::new(replica);
    {
        let replica = replica.clone();
        let readiness = readiness.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            while !shutdown.is_triggered() {
                if replica.addresses_known() {
                    readiness.set_ready("addresses");
                } else {
                    readiness.set_not_ready(
                        "addresses",
                        "the authentication Service or the API server has no address yet",
                    );
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
    }

    match elector {
        None => replica.lead(shutdown.token()).await,
        Some(elector) => {
            while let Some(leadership) = elector.acquire(&shutdown).await {
                let stop = leadership.lost_token().child_token();
                let lead = replica.lead(stop.clone());
                tokio::pin!(lead);
                tokio::select! {
                    () = &mut lead => {}
                    () = shutdown.cancelled() => {
                        stop.cancel();
                        lead.await;
                    }
                    () = leadership.lost() => {
                        tracing::warn!(reason = ?leadership.lost_reason(), "leadership lost; reconcilers stop");
                        stop.cancel();
                        lead.await;
                    }
                }
                if shutdown.is_triggered() {
                    if let Err(e) = leadership.release().await {
                        tracing::warn!(error = %e, "releasing the leader lease failed");
                    }
                    break;
                }
            }
        }
    }
    shutdown.trigger();
    for t in tasks {
        let _ = t.await;
    }
    let _ = admin_task.await;
    tracing::info!("controller stopped");
    Ok(())
}
