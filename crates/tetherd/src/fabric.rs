//! `tetherd fabric`: flags, start-up checks and the admin server around
//! `tether_fabric::run_node`, on every node as a DaemonSet pod with the host's network.

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use prometheus_client::registry::Registry;
use tether_api::names::fabric;
use tether_fabric::{FabricMetrics, NodeConfig, Settings};
use tether_netplan::DEFAULT_FABRIC_TABLE;
use tether_runtime::tools::{IP, NFT};
use tether_runtime::{
    AdminArgs, AdminServer, ControllerMetrics, Health, KubeArgs, LogArgs, Readiness, Shutdown,
    parse_duration,
};

#[derive(Debug, Args)]
pub(crate) struct FabricArgs {
    /// This node's name (from the downward API's `spec.nodeName`).
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// A fixed MTU for the VXLAN device instead of the uplink's minus 50.
    #[arg(long, value_parser = clap::value_parser!(u32).range(576..=9000))]
    mtu: Option<u32>,
    /// Reconcile at least this often, repairing changes made behind our back.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    resync: Duration,
    #[command(flatten)]
    admin: AdminArgs,
    #[command(flatten)]
    kube: KubeArgs,
    #[command(flatten)]
    log: LogArgs,
}

pub(crate) fn main(args: FabricArgs) -> ExitCode {
    if let Err(e) = tether_runtime::telemetry::init(&args.log) {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    if let Err(e) = tether_runtime::tools::require("tetherd fabric", &[IP, NFT]) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "fabric failed");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: FabricArgs) -> anyhow::Result<()> {
    let shutdown = Shutdown::on_signals().context("installing signal handlers")?;
    let mut registry = Registry::with_prefix("tether");
    let reconciles = ControllerMetrics::register(&mut registry);
    let metrics = FabricMetrics::register(&mut registry, reconciles);
    let health = Health::new();
    let readiness = Readiness::new();
    let client = tether_runtime::kube_client(&args.kube)
        .await
        .context("connecting to the Kubernetes API")?;
    let registry = Arc::new(Mutex::new(registry));
    let admin = AdminServer::new(registry, health).with_readiness(readiness.clone());
    let (admin_addr, serve_admin) = admin.bind(args.admin.admin_addr, shutdown.clone()).await?;
    tracing::info!(%admin_addr, "admin server listening (/metrics, /healthz, /readyz)");
    let admin_task = tokio::spawn(serve_admin);
    let config = NodeConfig {
        node_name: args.node_name,
        // The address and MTU come from the Node and its uplink at every reconcile.
        template: Settings {
            device: fabric::DEVICE.to_owned(),
            vni: fabric::VNI,
            port: fabric::PORT,
            table: DEFAULT_FABRIC_TABLE.to_owned(),
            local_ip: std::net::Ipv4Addr::UNSPECIFIED,
            mtu: 0,
        },
        mtu: args.mtu,
        resync: args.resync,
        debounce: Duration::from_millis(200),
    };
    let result = tether_fabric::run_node(client, config, metrics, readiness, shutdown.token())
        .await
        .context("running the fabric");
    shutdown.trigger();
    let _ = admin_task.await;
    tracing::info!("fabric stopped");
    result
}
