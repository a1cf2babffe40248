//! The `simkube-node` command: run a simulated node agent, or one of its built-in workloads
//! (`simkube-node __builtin echo|sleeper|traffic`, which is how built-in images run).

use std::io::IsTerminal as _;

use anyhow::Context as _;
use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "simkube-node",
    version,
    about = "Run a simulated Kubernetes node whose pods are processes in network namespaces"
)]
struct Cli {
    #[command(flatten)]
    node: simkube_node::cli::NodeArgs,
}

// No #[tokio::main]: `--netns` must be entered while the process has a single thread.
fn main() -> anyhow::Result<()> {
    let argv: Vec<String> = std::env::args().collect();
    if let Some(code) = simkube_node::cli::builtin_dispatch(&argv) {
        std::process::exit(code);
    }
    let cli = Cli::parse();
    let filter =
        tracing_subscriber::EnvFilter::try_new(&cli.node.log).context("invalid --log filter")?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    simkube_node::cli::run_blocking(cli.node)?;
    Ok(())
}
