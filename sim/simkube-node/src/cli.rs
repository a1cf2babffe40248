//! The node agent's command line, shared by the `simkube-node` binary and `simkube node`:
//! the flags ([`NodeArgs`]), entering the node namespace before any thread exists
//! ([`enter_netns`]), and running the agent until SIGTERM or Ctrl-C ([`run`]).
//!
//! ```no_run
//! use clap::Parser as _;
//!
//! #[derive(clap::Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     node: simkube_node::cli::NodeArgs,
//! }
//!
//! fn main() -> Result<(), simkube_node::Error> {
//!     let args: Vec<String> = std::env::args().collect();
//!     if let Some(code) = simkube_node::cli::builtin_dispatch(&args) {
//!         std::process::exit(code);
//!     }
//!     simkube_node::cli::run_blocking(Cli::parse().node)
//! }
//! ```

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::images::{BUILTIN_ARG, ImageEntry, ImageTable};
use crate::node_status::NodeIdentity;
use crate::{Agent, AgentConfig, Error};

/// The flags of a node agent.
#[derive(Debug, Clone, clap::Args)]
pub struct NodeArgs {
    /// Kubeconfig of the API server to join.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: PathBuf,
    /// Node name.
    #[arg(long)]
    pub name: String,
    /// The node's pod CIDR (IPv4), e.g. 10.244.1.0/24.
    #[arg(long)]
    pub pod_cidr: ipnet::Ipv4Net,
    /// The node's InternalIP (an address of the namespace the agent runs in).
    #[arg(long)]
    pub internal_ip: IpAddr,
    /// Port of the kubelet endpoint reported in the Node.
    #[arg(long, default_value_t = 10250)]
    pub kubelet_port: u16,
    /// CPU capacity.
    #[arg(long, default_value = "4")]
    pub cpu: String,
    /// Memory capacity.
    #[arg(long, default_value = "8Gi")]
    pub memory: String,
    /// Most pods the node runs.
    #[arg(long, default_value_t = 110)]
    pub max_pods: u32,
    /// Extra node labels, `key=value` (repeatable).
    #[arg(long = "label", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// Image table (YAML: `images: [{image, entrypoint, cmd}]`).
    #[arg(long)]
    pub images: Option<PathBuf>,
    /// One image-table entry, `REFERENCE=PROGRAM` (repeatable; a reference without a tag serves
    /// every tag). Entries given here win over `--images`.
    #[arg(long = "image", value_parser = parse_image)]
    pub image: Vec<(String, PathBuf)>,
    /// Where container logs are kept.
    #[arg(long, default_value = "/var/lib/simkube-node")]
    pub state_dir: PathBuf,
    /// Run inside this named network namespace (`/run/netns/NAME`), which becomes the node.
    #[arg(long)]
    pub netns: Option<String>,
    /// Names of pod sandbox namespaces start with this (default `sk-<node name>-`); every
    /// namespace with this prefix belongs to this node and is removed at start.
    #[arg(long)]
    pub netns_prefix: Option<String>,
    /// API server address as pods reach it (host:port); default: the node IP and the port of
    /// the kubeconfig's server.
    #[arg(long)]
    pub pod_api_server: Option<String>,
    /// Nameserver written into containers' /etc/resolv.conf (repeatable); none: containers
    /// see the host's resolv.conf.
    #[arg(long = "cluster-dns")]
    pub cluster_dns: Vec<IpAddr>,
    /// The cluster's DNS domain (search path of containers).
    #[arg(long, default_value = "cluster.local")]
    pub cluster_domain: String,
    /// Run the service proxy (ClusterIP, NodePort and LoadBalancer rules in the node
    /// namespace) for a cluster whose pod addresses are in this CIDR, e.g. 10.244.0.0/16.
    #[arg(long)]
    pub cluster_cidr: Option<ipnet::Ipv4Net>,
    /// The cluster's Service CIDR, for the service proxy (unallocated addresses in it are
    /// dropped at the node).
    #[arg(long, requires = "cluster_cidr")]
    pub service_cidr: Option<ipnet::Ipv4Net>,
    /// Duration of the node's heartbeat Lease in seconds; it is renewed every quarter of it
    /// (the kubelet's 40 s and 10 s by default). Keep it at most the control plane's node
    /// monitor grace period.
    #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u64).range(4..=3600))]
    pub lease_duration: u64,
    /// First restart back-off in milliseconds (doubles per crash).
    #[arg(long, default_value_t = 10_000)]
    pub backoff_initial_ms: u64,
    /// Largest restart back-off in milliseconds.
    #[arg(long, default_value_t = 300_000)]
    pub backoff_max_ms: u64,
    /// Log filter (RUST_LOG syntax).
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    pub log: String,
    /// Stop (as on SIGTERM) when the process with this PID, the agent's parent, exits: for
    /// supervisors that start agents as children.
    #[arg(long, hide = true)]
    pub exit_with_parent: Option<u32>,
    /// Keep a JSON report here for a supervisor: the service proxy's health, or why the agent
    /// could not run (see `simkube_node::status`).
    #[arg(long)]
    pub status_file: Option<PathBuf>,
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("label {s:?} must be key=value"))
}

/// Parses `REFERENCE=PROGRAM` of `--image`.
pub fn parse_image(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((image, program)) if !image.trim().is_empty() && !program.is_empty() => {
            Ok((image.trim().to_owned(), PathBuf::from(program)))
        }
        _ => Err(format!(
            "image {s:?} must be REFERENCE=PROGRAM, e.g. ghcr.io/acme/app=/usr/local/bin/app"
        )),
    }
}

/// When `argv` asks for a built-in workload (`<exe> __builtin <name> ...`), runs it and returns
/// its exit code. Call it before parsing flags: built-in images run the node's own executable.
pub fn builtin_dispatch(argv: &[String]) -> Option<i32> {
    (argv.get(1).map(String::as_str) == Some(BUILTIN_ARG)).then(|| crate::builtin::run(&argv[2..]))
}

/// Moves the calling thread into `--netns` when given. Call it before any other thread (the
/// async runtime) exists: threads inherit the namespace of the thread that creates them.
pub fn enter_netns(args: &NodeArgs) -> Result<(), Error> {
    let Some(name) = &args.netns else {
        return Ok(());
    };
    let path = PathBuf::from(crate::sandbox::NETNS_DIR).join(name);
    let file = std::fs::File::open(&path).map_err(|source| Error::Io {
        action: format!("--netns {name}: opening {}", path.display()),
        source,
    })?;
    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|errno| Error::Io {
        action: format!("--netns {name}: entering the namespace"),
        source: errno.into(),
    })
}

/// Asks the kernel for SIGTERM when the parent exits; when `parent` is already gone (the
/// agent was reparented before asking), stops right away.
fn exit_with_parent(parent: u32) -> Result<(), Error> {
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM).map_err(|errno| {
        Error::Io {
            action: "asking for a signal when the parent exits".into(),
            source: errno.into(),
        }
    })?;
    if u32::try_from(nix::unistd::getppid().as_raw()).ok() != Some(parent) {
        return Err(Error::Config(format!(
            "--exit-with-parent {parent}: the parent has already exited"
        )));
    }
    Ok(())
}

/// The system programs an agent with these flags runs: `ip` for sandboxes, and `nft` for the
/// service proxy when there is one.
pub fn required_tools(args: &NodeArgs) -> Vec<tether_runtime::tools::Tool> {
    let mut tools = vec![tether_runtime::tools::IP];
    if args.cluster_cidr.is_some() {
        tools.push(tether_runtime::tools::NFT);
    }
    tools
}

/// Checks the system programs, enters `--netns`, builds the async runtime and runs the agent
/// until SIGTERM or Ctrl-C. Tracing is the caller's business (set it up first, with
/// [`NodeArgs::log`]). When the agent cannot run, the reason also goes to `--status-file`.
pub fn run_blocking(args: NodeArgs) -> Result<(), Error> {
    let status_file = args.status_file.clone();
    let result = start_blocking(args);
    if let (Err(error), Some(path)) = (&result, status_file) {
        let status = crate::status::AgentStatus {
            fatal: Some(error_chain(error)),
            ..crate::status::AgentStatus::own()
        };
        if let Err(write) = crate::status::write(&path, &status) {
            tracing::warn!(error = %write, path = %path.display(), "cannot write the status file");
        }
    }
    result
}

/// `error` and its sources, joined by ": ".
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text = format!("{text}: {cause_text}");
        }
        source = cause.source();
    }
    text
}

fn start_blocking(args: NodeArgs) -> Result<(), Error> {
    tether_runtime::tools::require("the node agent", &required_tools(&args))?;
    if let Some(parent) = args.exit_with_parent {
        exit_with_parent(parent)?;
    }
    enter_netns(&args)?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|source| Error::Io {
            action: "starting the async runtime".into(),
            source,
        })?
        .block_on(run(args))
}

/// The agent configuration the flags describe, with the image table's built-ins served by
/// `builtin_exe`, and `api_port` (the kubeconfig server's port) as the default pod API port.
pub fn agent_config(
    args: &NodeArgs,
    builtin_exe: PathBuf,
    api_port: u16,
) -> Result<AgentConfig, Error> {
    let mut images = ImageTable::new(builtin_exe);
    // Resolution prefers an exact tag, then the first tagless entry: the command-line entries
    // go first so that they win over the file's.
    for (image, program) in &args.image {
        images = images.with_entry(ImageEntry {
            image: image.clone(),
            entrypoint: vec![program.display().to_string()],
            cmd: Vec::new(),
        });
    }
    if let Some(path) = &args.images {
        images = images
            .with_file(path)
            .map_err(|e| Error::Config(format!("--images: {e}")))?;
    }
    let identity = NodeIdentity {
        name: args.name.clone(),
        pod_cidr: args.pod_cidr,
        internal_ip: args.internal_ip,
        kubelet_port: args.kubelet_port,
        cpu: args.cpu.clone(),
        memory: args.memory.clone(),
        max_pods: args.max_pods,
        labels: args.labels.iter().cloned().collect::<BTreeMap<_, _>>(),
    };
    let mut config = AgentConfig::new(identity, images, args.state_dir.clone());
    config.pod_api_port = api_port;
    if let Some(server) = &args.pod_api_server {
        let bad = || Error::Config(format!("--pod-api-server {server:?} must be host:port"));
        let (host, port) = server.rsplit_once(':').ok_or_else(bad)?;
        config.pod_api_host = host.trim_matches(['[', ']']).to_owned();
        config.pod_api_port = port.parse().map_err(|_| bad())?;
    }
    if let Some(prefix) = &args.netns_prefix {
        if prefix.is_empty() || prefix.contains('/') {
            return Err(Error::Config(format!(
                "--netns-prefix {prefix:?} must be a non-empty namespace name prefix without '/'"
            )));
        }
        config.netns_prefix = prefix.clone();
    }
    config.cluster_dns = args.cluster_dns.clone();
    if args.cluster_domain.is_empty() || args.cluster_domain.starts_with('.') {
        return Err(Error::Config(format!(
            "--cluster-domain {:?} must be a DNS name such as cluster.local",
            args.cluster_domain
        )));
    }
    config.cluster_domain = args.cluster_domain.trim_end_matches('.').to_owned();
    config.proxy = args.cluster_cidr.map(|cidr| {
        let mut proxy = crate::proxy::ProxyConfig::new(cidr);
        proxy.service_cidr = args.service_cidr;
        proxy
    });
    config.lease_duration = Duration::from_secs(args.lease_duration);
    config.lease_renew = config.lease_duration / 4;
    config.backoff.initial = Duration::from_millis(args.backoff_initial_ms);
    config.backoff.max = Duration::from_millis(args.backoff_max_ms);
    config.status_file = args.status_file.clone();
    Ok(config)
}

/// Runs the agent the flags describe until SIGTERM or Ctrl-C (in the namespace the calling
/// thread's runtime was created in).
pub async fn run(args: NodeArgs) -> Result<(), Error> {
    let exe = std::env::current_exe().map_err(|source| Error::Io {
        action: "locating the node binary for built-in images".into(),
        source,
    })?;
    let kubeconfig = kube::config::Kubeconfig::read_from(&args.kubeconfig).map_err(|e| {
        Error::Config(format!(
            "reading kubeconfig {}: {e}",
            args.kubeconfig.display()
        ))
    })?;
    let mut client_config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .map_err(|e| Error::Config(format!("loading kubeconfig: {e}")))?;
    let api_port = client_config.cluster_url.port_u16().unwrap_or(443);
    // The part before the `/` names the agent's writes in `managedFields`, as a kubelet's are.
    client_config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static("kubelet/simkube"),
    ));
    let client =
        kube::Client::try_from(client_config).map_err(Error::api("building the API client"))?;
    let config = agent_config(&args, exe, api_port)?;
    let agent = Agent::new(client, config)?;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let trigger = shutdown.clone();
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|source| Error::Io {
        action: "installing the SIGTERM handler".into(),
        source,
    })?;
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
        trigger.cancel();
    });
    agent.run(shutdown).await
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        node: NodeArgs,
    }

    fn parse(extra: &[&str]) -> Result<NodeArgs, clap::Error> {
        let mut argv = vec![
            "simkube-node",
            "--kubeconfig",
            "/k",
            "--name",
            "c1-node-1",
            "--pod-cidr",
            "10.244.1.0/24",
            "--internal-ip",
            "198.18.1.11",
        ];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).map(|c| c.node)
    }

    #[test]
    fn image_flags_come_before_the_builtins() {
        let args = parse(&[
            "--image",
            "ghcr.io/tether-dev/tetherd=/opt/tetherd",
            "--netns-prefix",
            "sk.c1.n1.",
            "--pod-api-server",
            "10.96.0.1:443",
            "--cluster-dns",
            "10.96.0.10",
            "--cluster-cidr",
            "10.244.0.0/16",
            "--service-cidr",
            "10.96.0.0/12",
            "--lease-duration",
            "8",
        ])
        .expect("valid flags");
        let config = agent_config(&args, "/opt/simkube".into(), 6443).expect("valid config");
        let tetherd = config
            .images
            .resolve("ghcr.io/tether-dev/tetherd:v1")
            .expect("mapped");
        assert_eq!(tetherd.entrypoint, vec!["/opt/tetherd".to_owned()]);
        let echo = config.images.resolve("simkube.dev/echo").expect("builtin");
        assert_eq!(echo.entrypoint[0], "/opt/simkube");
        assert_eq!(config.netns_prefix, "sk.c1.n1.");
        assert_eq!(config.pod_api_host, "10.96.0.1");
        assert_eq!(config.pod_api_port, 443);
        assert_eq!(config.cluster_dns, vec![IpAddr::from([10, 96, 0, 10])]);
        assert_eq!(config.cluster_domain, "cluster.local");
        assert_eq!(config.lease_renew, Duration::from_secs(2));
        let proxy = config.proxy.expect("--cluster-cidr turns the proxy on");
        assert_eq!(proxy.cluster_cidr.to_string(), "10.244.0.0/16");
        assert_eq!(
            proxy.service_cidr.map(|c| c.to_string()).as_deref(),
            Some("10.96.0.0/12")
        );
        let plain = parse(&[]).expect("valid flags");
        let config = agent_config(&plain, "/x".into(), 1).expect("valid config");
        assert!(config.proxy.is_none() && config.cluster_dns.is_empty());
    }

    #[test]
    fn bad_flags_are_named() {
        let error = parse(&["--image", "no-program"]).expect_err("invalid");
        assert!(error.to_string().contains("REFERENCE=PROGRAM"), "{error}");
        let args = parse(&["--pod-api-server", "nohostport"]).expect("parses");
        let error = agent_config(&args, "/x".into(), 1).expect_err("invalid");
        assert!(error.to_string().contains("--pod-api-server"), "{error}");
        let args = parse(&["--netns-prefix", "a/b"]).expect("parses");
        let error = agent_config(&args, "/x".into(), 1).expect_err("invalid");
        assert!(error.to_string().contains("--netns-prefix"), "{error}");
    }
}
