//! `tetherd`: the one Tether daemon binary. `tetherd controller` runs the control plane,
//! `tetherd gateway` the WireGuard gateway, `tetherd fabric` the per-node overlay to the
//! gateway pods.

mod controller;
mod fabric;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use clap::{Args, Parser, Subcommand};
use prometheus_client::registry::Registry;
use tether_gateway::{Config, Prepared};
use tether_runtime::{AdminServer, Health, LogArgs, Shutdown};

/// After a burst of offloaded pods, glibc's malloc kept the controller's peak resident for
/// good (its heaps, fragmented by short-lived list responses and request buffers, are
/// trimmed only at their top); mimalloc hands freed pages back to the system.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(
    name = "tetherd",
    version,
    about = "Tether daemons (one binary, several roles)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the control plane of this cluster (in the cluster, as the tether-controller pod).
    Controller(Box<controller::ControllerArgs>),
    /// Run the WireGuard gateway of this cluster.
    Gateway(Box<GatewayArgs>),
    /// Run this node's end of the fabric overlay to the gateway pods (DaemonSet, host network).
    Fabric(Box<fabric::FabricArgs>),
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["config", "namespace"])))]
struct GatewayArgs {
    /// Gateway configuration file (YAML or JSON).
    #[arg(long, env = "TETHER_GATEWAY_CONFIG")]
    config: Option<PathBuf>,
    /// Read the configuration from the objects of this (tenant) namespace instead of a file.
    #[arg(long, env = "TETHER_GATEWAY_NAMESPACE", requires = "object")]
    namespace: Option<String>,
    /// With --namespace: serve this GatewayServer.
    #[arg(
        long,
        value_name = "NAME",
        group = "object",
        conflicts_with = "gateway_client"
    )]
    gateway_server: Option<String>,
    /// With --namespace: serve this GatewayClient.
    #[arg(long, value_name = "NAME", group = "object")]
    gateway_client: Option<String>,
    /// With --namespace: an interface local traffic enters through (repeatable; none: every
    /// interface but the tunnels). The fabric device is `tether-fabric`.
    #[arg(long = "pod-interface", value_name = "NAME")]
    pod_interfaces: Vec<String>,
    /// With --namespace: this pod's IP, the local end of the fabric to the nodes (the
    /// Deployment sets it from `status.podIP`); without it the gateway runs no fabric.
    #[arg(long, env = "POD_IP", requires = "namespace")]
    pod_ip: Option<std::net::Ipv4Addr>,
    /// With --namespace: publish the local address REAL to the peer under EXTERNAL, an
    /// address of this cluster's external CIDR (repeatable; the controller sets it for an
    /// in-band peering's API server and authentication Service).
    #[arg(long, value_name = "EXTERNAL=REAL", value_parser = parse_publish, requires = "namespace")]
    publish: Vec<tether_netplan::IpMapping>,
    /// Override the admin (metrics/health) address from the file (with --namespace, default
    /// 0.0.0.0:9090).
    #[arg(long)]
    metrics_addr: Option<SocketAddr>,
    /// Validate the configuration, print the kernel plan and exit without changing anything.
    #[arg(long, requires = "config")]
    check: bool,
    #[command(flatten)]
    kube: tether_runtime::KubeArgs,
    #[command(flatten)]
    log: LogArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Controller(args) => controller::main(*args),
        Command::Gateway(args) => gateway(*args),
        Command::Fabric(args) => fabric::main(*args),
    }
}

fn gateway(args: GatewayArgs) -> ExitCode {
    if let Err(e) = tether_runtime::telemetry::init(&args.log) {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let Some(config) = args.config else {
        return gateway_from_objects(args);
    };
    let GatewayArgs {
        metrics_addr,
        check,
        ..
    } = args;
    // Everything that can be wrong with the file is found here, before any side effect.
    let prepared = match Config::load(&config).and_then(Prepared::new) {
        Ok(p) => p,
        Err(e) => {
            eprintln!(
                "error: invalid gateway configuration {}: {e}",
                config.display()
            );
            return ExitCode::from(2);
        }
    };
    if check {
        for p in &prepared.input().peers {
            println!(
                "# peer {}: pod {} seen as {}",
                p.id, p.pod.real, p.pod.local_view
            );
        }
        print!("{}", prepared.plan());
        return ExitCode::SUCCESS;
    }
    if let Err(e) = tether_runtime::tools::require("tetherd gateway", &[tether_runtime::tools::NFT])
    {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let admin_addr = metrics_addr.unwrap_or_else(|| admin_address(&config));
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
    match runtime.block_on(run_gateway(prepared, admin_addr)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "gateway failed");
            eprintln!("error: {e:#}");
            let code = e
                .downcast_ref::<tether_gateway::GatewayError>()
                .map_or(1, |g| g.exit_code());
            ExitCode::from(u8::try_from(code).unwrap_or(1))
        }
    }
}

/// `EXTERNAL=REAL`, two IPv4 addresses.
fn parse_publish(text: &str) -> Result<tether_netplan::IpMapping, String> {
    let (external, real) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not EXTERNAL=REAL"))?;
    let parse = |what: &str, s: &str| {
        s.parse()
            .map_err(|_| format!("{what} {s:?} in {text:?} is not an IPv4 address"))
    };
    Ok(tether_netplan::IpMapping {
        external: parse("EXTERNAL", external)?,
        real: parse("REAL", real)?,
    })
}

/// `tetherd gateway --namespace NS --gateway-server|--gateway-client NAME`.
fn gateway_from_objects(args: GatewayArgs) -> ExitCode {
    use tether_gateway::cluster::run::{self, Target};
    let namespace = args.namespace.clone().unwrap_or_default();
    let target = match (args.gateway_server.clone(), args.gateway_client.clone()) {
        (Some(n), _) => Target::Server(n),
        (None, Some(n)) => Target::Client(n),
        (None, None) => {
            eprintln!("error: --namespace needs --gateway-server NAME or --gateway-client NAME");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = tether_runtime::tools::require("tetherd gateway", &[tether_runtime::tools::NFT])
    {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let admin_addr = args
        .metrics_addr
        .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 9090)));
    let settings = tether_gateway::cluster::translate::Settings {
        metrics_address: admin_addr,
        pod_interfaces: args.pod_interfaces.clone(),
        underlay_mtu: None,
        reconcile_interval: tether_gateway::config::DEFAULT_RECONCILE_INTERVAL,
        fabric_ip: args.pod_ip,
        publish: args.publish.clone(),
    };
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
    let local = tokio::task::LocalSet::new();
    let result = local.block_on(&runtime, async move {
        let shutdown = Shutdown::on_signals()?;
        let client = tether_runtime::kube_client(&args.kube).await?;
        let registry = Arc::new(Mutex::new(Registry::with_prefix("tether")));
        let health = Health::new();
        let admin = AdminServer::new(registry.clone(), health.clone());
        let (bound, serve) = admin.bind(admin_addr, shutdown.clone()).await?;
        tracing::info!(%bound, %namespace, ?target, "admin server listening; gateway driven by objects");
        let server = tokio::spawn(serve);
        let result = run::run(
            client,
            namespace,
            target,
            settings,
            registry,
            health,
            shutdown.clone(),
        )
        .await;
        shutdown.trigger();
        let _ = server.await;
        result.map_err(anyhow::Error::from)
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "gateway failed");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The admin address from the file (it was validated already; fall back to the default).
fn admin_address(path: &std::path::Path) -> SocketAddr {
    Config::load(path).map_or_else(
        |_| SocketAddr::from(([0, 0, 0, 0], 9090)),
        |c| c.metrics_address,
    )
}

async fn run_gateway(prepared: Prepared, admin_addr: SocketAddr) -> anyhow::Result<()> {
    let shutdown = Shutdown::on_signals()?;
    let registry = Arc::new(Mutex::new(Registry::with_prefix("tether")));
    let health = Health::new();
    health.set_unhealthy("kernel", "not reconciled yet");
    let admin = AdminServer::new(registry.clone(), health.clone());
    let (bound, serve) = admin.bind(admin_addr, shutdown.clone()).await?;
    tracing::info!(%bound, "admin server listening (/metrics, /healthz)");
    let server = tokio::spawn(serve);
    let result = prepared.run(registry, health, shutdown.clone()).await;
    shutdown.trigger();
    let _ = server.await;
    result.map_err(anyhow::Error::from)
}
