//! The `simkube-node` command: run a simulated node agent, or one of its built-in workloads
//! (`simkube-node __builtin echo|sleeper|traffic`, which is how built-in images run).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use simkube_node::images::{BUILTIN_ARG, ImageTable};
use simkube_node::node_status::NodeIdentity;
use simkube_node::{Agent, AgentConfig};

#[derive(Debug, Parser)]
#[command(
    name = "simkube-node",
    version,
    about = "Run a simulated Kubernetes node whose pods are processes in network namespaces"
)]
struct Cli {
    /// Kubeconfig of the API server to join.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: PathBuf,
    /// Node name.
    #[arg(long)]
    name: String,
    /// The node's pod CIDR (IPv4), e.g. 10.244.1.0/24.
    #[arg(long)]
    pod_cidr: ipnet::Ipv4Net,
    /// The node's InternalIP (an address of the namespace the agent runs in).
    #[arg(long)]
    internal_ip: IpAddr,
    /// Port of the kubelet endpoint reported in the Node.
    #[arg(long, default_value_t = 10250)]
    kubelet_port: u16,
    /// CPU capacity.
    #[arg(long, default_value = "4")]
    cpu: String,
    /// Memory capacity.
    #[arg(long, default_value = "8Gi")]
    memory: String,
    /// Most pods the node runs.
    #[arg(long, default_value_t = 110)]
    max_pods: u32,
    /// Extra node labels, `key=value` (repeatable).
    #[arg(long = "label", value_parser = parse_label)]
    labels: Vec<(String, String)>,
    /// Image table (YAML: `images: [{image, entrypoint, cmd}]`).
    #[arg(long)]
    images: Option<PathBuf>,
    /// Where container logs are kept.
    #[arg(long, default_value = "/var/lib/simkube-node")]
    state_dir: PathBuf,
    /// Run inside this named network namespace (`/run/netns/NAME`), which becomes the node.
    #[arg(long)]
    netns: Option<String>,
    /// API server address as pods reach it (host:port); default: the node IP and port 443.
    #[arg(long)]
    pod_api_server: Option<String>,
    /// First restart back-off in milliseconds (doubles per crash).
    #[arg(long, default_value_t = 10_000)]
    backoff_initial_ms: u64,
    /// Largest restart back-off in milliseconds.
    #[arg(long, default_value_t = 300_000)]
    backoff_max_ms: u64,
    /// Log filter (RUST_LOG syntax).
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    log: String,
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("label {s:?} must be key=value"))
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(BUILTIN_ARG) {
        std::process::exit(simkube_node::builtin::run(&args[2..]));
    }
    let cli = Cli::parse();
    let filter =
        tracing_subscriber::EnvFilter::try_new(&cli.log).context("invalid --log filter")?;
    tracing_subscriber::fmt().with_env_filter(filter).init();
    if let Some(name) = &cli.netns {
        // Before the runtime exists: threads inherit the namespace of the thread creating them.
        let path = PathBuf::from(simkube_node::sandbox::NETNS_DIR).join(name);
        let file = std::fs::File::open(&path)
            .with_context(|| format!("--netns {name}: cannot open {}", path.display()))?;
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
            .with_context(|| format!("--netns {name}: cannot enter the namespace"))?;
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(run(cli))
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("locating the node binary for built-in images")?;
    let mut images = ImageTable::new(exe);
    if let Some(path) = &cli.images {
        images = images.with_file(path)?;
    }
    let kubeconfig = kube::config::Kubeconfig::read_from(&cli.kubeconfig)
        .with_context(|| format!("reading kubeconfig {}", cli.kubeconfig.display()))?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .context("loading the kubeconfig")?;
    let api_port = config.cluster_url.port_u16().unwrap_or(443);
    let client = kube::Client::try_from(config).context("building the API client")?;
    let identity = NodeIdentity {
        name: cli.name,
        pod_cidr: cli.pod_cidr,
        internal_ip: cli.internal_ip,
        kubelet_port: cli.kubelet_port,
        cpu: cli.cpu,
        memory: cli.memory,
        max_pods: cli.max_pods,
        labels: cli.labels.into_iter().collect::<BTreeMap<_, _>>(),
    };
    let mut config = AgentConfig::new(identity, images, cli.state_dir);
    config.pod_api_port = api_port;
    if let Some(server) = &cli.pod_api_server {
        let (host, port) = server
            .rsplit_once(':')
            .with_context(|| format!("--pod-api-server {server:?} must be host:port"))?;
        config.pod_api_host = host.trim_matches(['[', ']']).to_owned();
        config.pod_api_port = port
            .parse()
            .with_context(|| format!("--pod-api-server {server:?}: bad port"))?;
    }
    config.backoff.initial = Duration::from_millis(cli.backoff_initial_ms);
    config.backoff.max = Duration::from_millis(cli.backoff_max_ms);
    let agent = Agent::new(client, config)?;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let trigger = shutdown.clone();
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
        trigger.cancel();
    });
    agent.run(shutdown).await?;
    Ok(())
}
