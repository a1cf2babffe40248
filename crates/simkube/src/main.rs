//! The `simkube` command: run a simulated Kubernetes API server for humans and scripts.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use simkube::controllers::Controllers;

#[derive(Debug, Parser)]
#[command(
    name = "simkube",
    version,
    about = "An in-memory Kubernetes API server for tests and playgrounds"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start one simulated cluster and serve until Ctrl-C.
    Serve(ServeArgs),
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// Cluster name (kubeconfig cluster, context and user names).
    #[arg(long, default_value = "simkube")]
    name: String,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// Serve HTTPS with a generated CA (written into the kubeconfig).
    #[arg(long)]
    tls: bool,
    /// Enforce RBAC (the kubeconfig's admin user is in system:masters).
    #[arg(long)]
    rbac: bool,
    /// Run the built-in controllers (namespace cleanup, garbage collection, default service
    /// accounts, CSR signing).
    #[arg(long)]
    controllers: bool,
    /// Where to write the admin kubeconfig (default: <name>.kubeconfig in the current directory).
    #[arg(long)]
    kubeconfig_out: Option<PathBuf>,
    /// Log filter (RUST_LOG syntax).
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    log: String,
    /// Log as JSON lines.
    #[arg(long)]
    log_json: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve(args).await,
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let filter =
        tracing_subscriber::EnvFilter::try_new(&args.log).context("invalid --log filter")?;
    if args.log_json {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .json()
            .init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
    let controllers = if args.controllers {
        Controllers::all()
    } else {
        Controllers::none()
    };
    let cluster = simkube::Cluster::builder()
        .name(&args.name)
        .tls(args.tls)
        .rbac(args.rbac)
        .bind(args.listen)
        .controllers(controllers)
        .start()
        .await
        .with_context(|| format!("starting cluster {:?}", args.name))?;
    let path = args
        .kubeconfig_out
        .unwrap_or_else(|| PathBuf::from(format!("{}.kubeconfig", args.name)));
    cluster
        .write_kubeconfig(&path)
        .with_context(|| format!("writing kubeconfig to {}", path.display()))?;
    println!(
        "simkube cluster {:?} serving at {}",
        args.name,
        cluster.url()
    );
    println!("admin kubeconfig written to {}", path.display());
    println!(
        "use it with:\n  export KUBECONFIG={}\n  kubectl get ns",
        path.display()
    );
    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")?;
    tracing::info!("shutting down");
    cluster.shutdown().await;
    Ok(())
}
