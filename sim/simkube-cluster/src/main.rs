//! The `simkube` command: simulated Kubernetes clusters for humans and scripts: a bare API
//! server (`serve`), a node agent (`node`), and whole clusters of network namespaces
//! (`cluster up|down|list|stop-node|start-node`).

use std::io::IsTerminal as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use simkube::controllers::Controllers;
use simkube_cluster::ops;
use simkube_cluster::state::{DEFAULT_STATE_DIR, DEFAULT_UNDERLAY};

#[derive(Debug, Parser)]
#[command(
    name = "simkube",
    version,
    about = "Simulated Kubernetes clusters: API server, node agents and their networks"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start one simulated API server and serve until Ctrl-C.
    Serve(ServeArgs),
    /// Run a node agent (pods as processes in network namespaces).
    Node(Box<simkube_node::cli::NodeArgs>),
    /// Bring whole simulated clusters up and down.
    #[command(subcommand)]
    Cluster(ClusterCommand),
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

#[derive(Debug, clap::Args)]
struct StateArgs {
    /// State directory (cluster records, kubeconfigs, logs).
    #[arg(long, env = "SIMKUBE_STATE_DIR", default_value = DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
}

/// Which node of which cluster a node command acts on.
#[derive(Debug, clap::Args)]
struct NodeArgs {
    /// Cluster name.
    #[arg(long)]
    name: String,
    /// Node name (<cluster>-node-<I>).
    #[arg(long)]
    node: String,
    #[command(flatten)]
    state: StateArgs,
}

#[derive(Debug, Subcommand)]
enum ClusterCommand {
    /// Create a cluster: namespaces, API server daemon, node agents; wait until every node is
    /// Ready and write the admin kubeconfig.
    Up {
        /// Cluster name (a DNS label; node names are <name>-node-<I>).
        #[arg(long)]
        name: String,
        /// Number of nodes.
        #[arg(long, default_value_t = 2)]
        nodes: u8,
        /// Where to write the admin kubeconfig.
        #[arg(long)]
        kubeconfig_out: PathBuf,
        /// Underlay network namespace, shared by the clusters on it.
        #[arg(long, default_value = DEFAULT_UNDERLAY)]
        underlay: String,
        #[command(flatten)]
        state: StateArgs,
        /// Pod CIDR of the cluster (node I gets its I-th /24).
        #[arg(long, default_value = "10.244.0.0/16")]
        pod_cidr: ipnet::Ipv4Net,
        /// Service CIDR of the cluster.
        #[arg(long, default_value = "10.96.0.0/12")]
        service_cidr: ipnet::Ipv4Net,
        /// Image-table entry REFERENCE=PROGRAM for every node (repeatable).
        #[arg(long = "image", value_parser = simkube_node::cli::parse_image)]
        images: Vec<(String, PathBuf)>,
        /// How long to wait for every node to be Ready, in seconds.
        #[arg(long, default_value_t = 120)]
        timeout: u64,
        /// Seconds a node may miss heartbeats before it turns NotReady (the node monitor grace
        /// period; the agents' Lease duration follows it).
        #[arg(long, default_value_t = simkube_cluster::state::DEFAULT_NODE_GRACE_SECONDS)]
        node_grace_period: u64,
        /// The longest client certificate the cluster's CSR signer issues, in seconds (as
        /// kube-controller-manager's `--cluster-signing-duration`; one year by default).
        #[arg(long, default_value_t = simkube_cluster::state::DEFAULT_CLUSTER_SIGNING_SECONDS)]
        cluster_signing_duration: u64,
        /// Keep the API server private: other clusters (their nodes and pods) cannot open TCP
        /// connections to this cluster's API server nor to any of its TCP Services (NodePorts,
        /// LoadBalancer IPs) or node addresses; UDP Services stay reachable from other
        /// clusters (so a WireGuard gateway can be reached), replies to this cluster's own
        /// connections come back, and the host still reaches the API server through the
        /// kubeconfig.
        #[arg(long)]
        private_api: bool,
        /// Put the cluster behind NAT: its nodes reach the shared underlay only through a
        /// masquerading router (namespace `sk.<name>.rtr`), so nothing in the underlay or in
        /// other clusters can open a connection in (not to nodes, NodePorts, LoadBalancer IPs,
        /// nor the API server address on the bridge), while replies to outbound connections
        /// (TCP and UDP) come back, from the router's address. The host still reaches the API
        /// server through the kubeconfig.
        #[arg(long)]
        behind_nat: bool,
    },
    /// Remove a cluster: daemon, agents, pods, namespaces, bridge, state.
    Down {
        /// Cluster name.
        #[arg(long)]
        name: String,
        #[command(flatten)]
        state: StateArgs,
    },
    /// List the clusters of the state directory.
    List {
        #[command(flatten)]
        state: StateArgs,
    },
    /// Stop one node's agent and keep it stopped (its Node turns NotReady after the grace
    /// period).
    StopNode(NodeArgs),
    /// Start a node agent stopped by stop-node again.
    StartNode(NodeArgs),
    /// Run a cluster's daemon (started by `cluster up`).
    #[command(hide = true)]
    Daemon {
        /// Cluster name.
        #[arg(long)]
        name: String,
        #[command(flatten)]
        state: StateArgs,
    },
}

// No #[tokio::main]: `node --netns` and the daemon must change namespace single-threaded.
fn main() -> std::process::ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    if let Some(code) = simkube_node::cli::builtin_dispatch(&argv) {
        std::process::exit(code);
    }
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            // The whole chain on one line, without a backtrace: these are user-facing errors.
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => {
            init_tracing(&args.log, args.log_json)?;
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?
                .block_on(serve(args))
        }
        Command::Node(args) => {
            init_tracing(&args.log, false)?;
            simkube_node::cli::run_blocking(*args)?;
            Ok(())
        }
        Command::Cluster(command) => cluster(command),
    }
}

fn init_tracing(filter: &str, json: bool) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(filter).context("invalid --log filter")?;
    if json {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .json()
            .init();
    } else {
        // Node agents and daemons log to files: colours only on a terminal.
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(std::io::stderr().is_terminal())
            .init();
    }
    Ok(())
}

fn progress(line: &str) {
    eprintln!("{line}");
}

fn cluster(command: ClusterCommand) -> anyhow::Result<()> {
    match command {
        ClusterCommand::Up {
            name,
            nodes,
            kubeconfig_out,
            underlay,
            state,
            pod_cidr,
            service_cidr,
            images,
            timeout,
            node_grace_period,
            cluster_signing_duration,
            private_api,
            behind_nat,
        } => {
            let exe = std::env::current_exe().context("locating the simkube executable")?;
            let options = ops::UpOptions {
                name: name.clone(),
                nodes,
                kubeconfig_out,
                underlay,
                state_dir: state.state_dir.clone(),
                pod_cidr,
                service_cidr,
                images,
                timeout: Duration::from_secs(timeout),
                node_grace_seconds: node_grace_period,
                cluster_signing_seconds: cluster_signing_duration,
                private_api,
                behind_nat,
                exe,
            };
            let summary = ops::up(&options, &mut |l| progress(l))
                .with_context(|| format!("bringing cluster {name} up"))?;
            print_summary(&name, &summary, &state.state_dir);
            Ok(())
        }
        ClusterCommand::Down { name, state } => {
            let existed = ops::down(&state.state_dir, &name, &mut |l| progress(l))
                .with_context(|| format!("bringing cluster {name} down"))?;
            if existed {
                println!("cluster {name} is down");
            } else {
                println!(
                    "no cluster named {name} in {} (nothing to do)",
                    state.state_dir.display()
                );
            }
            Ok(())
        }
        ClusterCommand::List { state } => {
            let entries = ops::list(&state.state_dir)?;
            println!(
                "{:<20} {:>5} {:>5} {:<28} {:<12} DAEMON",
                "NAME", "INDEX", "NODES", "API", "TOPOLOGY"
            );
            for e in entries {
                println!(
                    "{:<20} {:>5} {:>5} {:<28} {:<12} {}",
                    e.record.name,
                    e.record.index,
                    e.record.nodes,
                    e.url.as_deref().unwrap_or("-"),
                    e.record.topology(),
                    if e.alive {
                        "running"
                    } else {
                        "dead (bring it down)"
                    }
                );
            }
            Ok(())
        }
        ClusterCommand::StopNode(NodeArgs { name, node, state }) => {
            ops::stop_node(&state.state_dir, &name, &node)?;
            println!("node agent of {node} stopped (it stays stopped until start-node)");
            Ok(())
        }
        ClusterCommand::StartNode(NodeArgs { name, node, state }) => {
            let pid = ops::start_node(&state.state_dir, &name, &node)?;
            println!("node agent of {node} started (PID {pid})");
            Ok(())
        }
        ClusterCommand::Daemon { name, state } => {
            let filter = tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
            tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_ansi(false)
                .init();
            if let Err(error) = simkube_cluster::daemon::run(&state.state_dir, &name) {
                tracing::error!(%error, "the cluster daemon failed");
                return Err(error.into());
            }
            Ok(())
        }
    }
}

/// What `cluster up` prints on stdout once the cluster works.
fn print_summary(name: &str, summary: &ops::UpSummary, state_dir: &std::path::Path) {
    let kubeconfig = summary.kubeconfig.display();
    let state_flag = if state_dir == std::path::Path::new(DEFAULT_STATE_DIR) {
        String::new()
    } else {
        format!(" --state-dir {}", state_dir.display())
    };
    println!("cluster {name} is up (index {})", summary.record.index);
    println!("  API server:  {}", summary.url);
    println!("  nodes:       {}", summary.nodes.join(", "));
    if let Some(metrics) = &summary.metrics_url {
        println!("  daemon:      {metrics}/metrics, {metrics}/healthz");
    }
    println!("  kubeconfig:  {kubeconfig}");
    println!("  logs:        {}", state_dir.join(name).display());
    println!("use it:   kubectl --kubeconfig {kubeconfig} get nodes");
    println!("remove it: simkube cluster down --name {name}{state_flag}");
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
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
