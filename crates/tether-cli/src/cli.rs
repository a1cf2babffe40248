//! The command line: every subcommand and flag of `tether` (and `kubectl tether`).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::manifests::AuthServiceType;

/// The CLI's version string.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Tether: peer Kubernetes clusters.
#[derive(Debug, Parser)]
#[command(
    name = "tether",
    version = VERSION,
    about = "Install Tether and peer Kubernetes clusters",
    long_about = "Install Tether into a cluster, peer it with others, and see how the peerings are doing.\n\nTypical flow: `tether install` in both clusters, `tether peer` from the consumer, `tether status`.",
    propagate_version = true
)]
pub struct Cli {
    /// Flags every command accepts.
    #[command(flatten)]
    pub global: GlobalArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Flags every command accepts.
#[derive(Debug, Clone, Default, Args)]
pub struct GlobalArgs {
    /// Kubeconfig of the (local) cluster [default: $KUBECONFIG, then ~/.kube/config]
    #[arg(long, global = true, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Context in the kubeconfig [default: its current context]
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Install (or upgrade) Tether in a cluster and wait until its controller is ready.
    Install(InstallArgs),
    /// Remove Tether from a cluster.
    Uninstall(UninstallArgs),
    /// Peer this cluster (the consumer) with a provider cluster.
    Peer(PeerArgs),
    /// Tear down the peering with a provider.
    Unpeer(UnpeerArgs),
    /// Offload to providers: ask for resources (virtual nodes), extend namespaces.
    #[command(subcommand)]
    Offload(OffloadCommand),
    /// Stop offloading a namespace.
    #[command(subcommand)]
    Unoffload(UnoffloadCommand),
    /// Generate things for other clusters' admins.
    #[command(subcommand)]
    Generate(GenerateCommand),
    /// List and revoke this cluster's peering tokens.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Show this cluster and its peerings, and explain every failing condition.
    Status(StatusArgs),
    /// Print the CLI's version (and, given a cluster, the controller's image).
    Version(VersionArgs),
    /// Print a shell completion script.
    Completion(CompletionArgs),
}

/// Output formats of `--dry-run`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ManifestFormat {
    /// A multi-document YAML stream.
    Yaml,
    /// A `v1 List`.
    Json,
}

/// `tether install`.
#[derive(Debug, Clone, Args)]
pub struct InstallArgs {
    /// This cluster's ID (a DNS-1123 label of at most 49 characters) [default: the stored one,
    /// or a generated one on a first install]
    #[arg(long, value_name = "ID")]
    pub cluster_id: Option<String>,
    /// The controller image [default: ghcr.io/tether-dev/tetherd:v<CLI version>]
    #[arg(long, value_name = "REF")]
    pub image: Option<String>,
    /// How the authentication service is exposed to peers.
    #[arg(long, value_enum, default_value_t = AuthServiceType::LoadBalancer, value_name = "TYPE")]
    pub auth_service_type: AuthServiceType,
    /// Controller replicas (leader election keeps one active).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i32).range(1..=10))]
    pub replicas: i32,
    /// API server URL peers should use [default: learned from the `kubernetes` EndpointSlice]
    #[arg(long, value_name = "URL")]
    pub api_server_url: Option<String>,
    /// Authentication URL peers should use [default: from the tether-auth Service]
    #[arg(long, value_name = "URL")]
    pub auth_url: Option<String>,
    /// Lifetime of the identities this cluster issues to consumers (at least 10m) [default: 24h]
    #[arg(long, value_name = "DURATION")]
    pub identity_lifetime: Option<String>,
    /// This cluster's pod CIDR [default: the stored one, else detected from the
    /// `kube-system/kubeadm-config` ConfigMap]
    #[arg(long, value_name = "CIDR")]
    pub pod_cidr: Option<String>,
    /// This cluster's Service CIDR [default: as for --pod-cidr]
    #[arg(long, value_name = "CIDR")]
    pub service_cidr: Option<String>,
    /// Where peers' pod CIDRs that collide with this cluster's are remapped: one IPv4 CIDR
    /// apart from this cluster's pod and Service CIDRs, holding a block as large as each
    /// peer's pod CIDR [default: the stored one, else the RFC 1918 ranges]
    #[arg(long, value_name = "CIDR")]
    pub remap_pool: Option<String>,
    /// This cluster's external CIDR: addresses under which its gateways publish local
    /// non-pod addresses to peers (the API server and authentication service of an in-band
    /// peering, at hosts 1 and 2) [default: the stored one, else 10.70.0.0/16]
    #[arg(long, value_name = "CIDR")]
    pub external_cidr: Option<String>,
    /// How strictly consumers' offloaded pods are held to the resources granted to them:
    /// none (every pod runs), soft (pods must request cpu and memory, within the grant) or
    /// hard (as soft, and limits must equal requests) [default: the stored one, else soft]
    #[arg(long, value_name = "MODE")]
    pub resource_enforcement: Option<tether_resources::Enforcement>,
    /// How long to wait for the controller.
    #[arg(long, default_value = "5m", value_name = "DURATION")]
    pub timeout: String,
    /// Print every object instead of applying it; changes nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Format of `--dry-run` output.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = ManifestFormat::Yaml, requires = "dry_run")]
    pub output: ManifestFormat,
    /// Apply the objects but do not wait for the controller.
    #[arg(long, conflicts_with = "dry_run")]
    pub no_wait: bool,
}

/// `tether uninstall`.
#[derive(Debug, Clone, Args)]
pub struct UninstallArgs {
    /// Uninstall even while peerings exist, removing finalizers that would block.
    #[arg(long)]
    pub force: bool,
    /// Keep the CRDs (and so the custom resources that remain).
    #[arg(long)]
    pub keep_crds: bool,
    /// How long to wait until everything is gone.
    #[arg(long, default_value = "2m", value_name = "DURATION")]
    pub timeout: String,
}

/// `tether peer`.
#[derive(Debug, Clone, Args)]
#[command(group(clap::ArgGroup::new("provider").required(true).args(["remote_kubeconfig", "auth_url"])))]
pub struct PeerArgs {
    /// Admin kubeconfig of the provider (the CLI makes a short-lived token there itself).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["auth_url", "token", "ca_fingerprint"])]
    pub remote_kubeconfig: Option<PathBuf>,
    /// Context in the provider's kubeconfig.
    #[arg(long, value_name = "NAME", requires = "remote_kubeconfig")]
    pub remote_context: Option<String>,
    /// The provider's authentication URL (from `tether generate peer-command` there).
    #[arg(long, value_name = "URL", requires_all = ["token", "ca_fingerprint"])]
    pub auth_url: Option<String>,
    /// The peering token (from `tether generate peer-command` on the provider).
    #[arg(long, value_name = "TOKEN", requires = "auth_url")]
    pub token: Option<String>,
    /// The provider's authentication certificate fingerprint, `sha256:<64 hex digits>`.
    #[arg(long, value_name = "FINGERPRINT", requires = "auth_url")]
    pub ca_fingerprint: Option<String>,
    /// Peering modules to turn on (comma-separated): `authentication`, `networking` and
    /// `offloading` (which --cpu, --memory or --pods turn on too).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "authentication,networking",
        value_name = "LIST"
    )]
    pub modules: Vec<String>,
    /// Which cluster runs the listening end of the tunnel. `auto` tries the provider first
    /// and the consumer if the tunnel does not connect in time; --gateway-address or
    /// --gateway-port fix the provider.
    #[arg(long, value_enum, default_value_t = GatewaySide::Auto, value_name = "SIDE")]
    pub gateway_server: GatewaySide,
    /// How the gateway server's Service is exposed.
    #[arg(long, value_enum, default_value_t = GatewayServiceType::LoadBalancer, value_name = "TYPE")]
    pub gateway_service_type: GatewayServiceType,
    /// Address the gateway client dials instead of the server Service's (an address mapped
    /// on a NAT, for example).
    #[arg(long, value_name = "ADDRESS")]
    pub gateway_address: Option<String>,
    /// Port the gateway client dials instead of the server Service's.
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub gateway_port: Option<u16>,
    /// Tunnel MTU [default: derived from the path]
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u32).range(1280..=9000))]
    pub mtu: Option<u32>,
    /// Reach the provider's API server and authentication service through the tunnel only
    /// (for a provider whose control plane this cluster cannot reach): this command builds
    /// the tunnel first, with admin access to both clusters (needs --remote-kubeconfig).
    #[arg(long)]
    pub in_band: bool,
    /// Resources to ask the provider for (any of them turns on offloading: the grant appears
    /// here as a virtual node).
    #[command(flatten)]
    pub resources: ResourceFlags,
    /// How long to wait for the peering.
    #[arg(long, default_value = "2m", value_name = "DURATION")]
    pub timeout: String,
}

/// The amounts a request to a provider asks for.
#[derive(Debug, Clone, Args)]
pub struct ResourceFlags {
    /// CPU, e.g. `2` or `500m`.
    #[arg(long, value_name = "QUANTITY")]
    pub cpu: Option<String>,
    /// Memory, e.g. `4Gi`.
    #[arg(long, value_name = "QUANTITY")]
    pub memory: Option<String>,
    /// Number of pods.
    #[arg(long, value_name = "N")]
    pub pods: Option<String>,
    /// The class of resources; the provider decides what a class means.
    #[arg(long, default_value = "default", value_name = "NAME")]
    pub resource_class: String,
}

impl ResourceFlags {
    /// The amounts, as the offload module takes them.
    pub fn amounts(&self) -> crate::offload::Amounts<'_> {
        crate::offload::Amounts {
            cpu: self.cpu.as_deref(),
            memory: self.memory.as_deref(),
            pods: self.pods.as_deref(),
        }
    }
}

/// `tether offload ...`.
#[derive(Debug, Subcommand)]
pub enum OffloadCommand {
    /// Resources asked of providers, each shown here as a virtual node.
    #[command(subcommand)]
    Resources(ResourcesCommand),
    /// Extend a namespace into providers: its pods may run on virtual nodes, in a twin
    /// namespace at each selected provider; waits until every twin is ready.
    Namespace(OffloadNamespaceArgs),
}

/// `tether unoffload ...`.
#[derive(Debug, Subcommand)]
pub enum UnoffloadCommand {
    /// Stop extending a namespace: its pods leave the virtual nodes and the twins are removed.
    Namespace(UnoffloadNamespaceArgs),
}

/// Where the pods of an offloaded namespace may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PodStrategy {
    /// Only on this cluster's own nodes.
    #[value(name = "Local")]
    Local,
    /// Only on virtual nodes.
    #[value(name = "Remote")]
    Remote,
    /// On both.
    #[value(name = "LocalAndRemote")]
    LocalAndRemote,
}

/// How twin namespaces are named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MappingStrategy {
    /// `<namespace>-<this cluster's ID>`.
    #[value(name = "DefaultName")]
    DefaultName,
    /// The same name as here (fails where a provider already has one).
    #[value(name = "EnforceSameName")]
    EnforceSameName,
    /// The name given with --remote-namespace-name.
    #[value(name = "SelectedName")]
    SelectedName,
}

/// `tether offload namespace`.
#[derive(Debug, Args)]
pub struct OffloadNamespaceArgs {
    /// The namespace.
    #[arg(value_name = "NAMESPACE")]
    pub namespace: String,
    /// Where its pods may run.
    #[arg(long, value_enum, default_value_t = PodStrategy::LocalAndRemote, value_name = "STRATEGY")]
    pub pod_offloading_strategy: PodStrategy,
    /// How the twin namespaces at the providers are named.
    #[arg(long, value_enum, default_value_t = MappingStrategy::DefaultName, value_name = "STRATEGY")]
    pub namespace_mapping_strategy: MappingStrategy,
    /// The twin namespaces' name, with --namespace-mapping-strategy SelectedName.
    #[arg(long, value_name = "NAME")]
    pub remote_namespace_name: Option<String>,
    /// Only providers whose virtual nodes carry these labels (`key=value`, comma-separated);
    /// every provider when absent.
    #[arg(long, short = 'l', value_delimiter = ',', value_name = "KEY=VALUE")]
    pub selector: Vec<String>,
    /// How long to wait for the twins.
    #[arg(long, default_value = "2m", value_name = "DURATION")]
    pub timeout: String,
}

/// `tether unoffload namespace`.
#[derive(Debug, Args)]
pub struct UnoffloadNamespaceArgs {
    /// The namespace.
    #[arg(value_name = "NAMESPACE")]
    pub namespace: String,
    /// How long to wait until its pods and twins are gone.
    #[arg(long, default_value = "2m", value_name = "DURATION")]
    pub timeout: String,
}

/// `tether offload resources ...`.
#[derive(Debug, Subcommand)]
pub enum ResourcesCommand {
    /// Ask a provider for resources (a new virtual node), or change what a request asks for;
    /// waits until the virtual node is Ready.
    Add(ResourcesAddArgs),
    /// Withdraw a request: its virtual node is removed and the provider releases the grant.
    Remove(ResourcesRemoveArgs),
}

/// `tether offload resources add`.
#[derive(Debug, Args)]
pub struct ResourcesAddArgs {
    /// The provider's cluster ID.
    #[arg(value_name = "PROVIDER")]
    pub provider: String,
    /// A further request to the same provider, named `<provider>-<name>` (also the virtual
    /// node's name); without it, the provider's main request.
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// What to ask for.
    #[command(flatten)]
    pub resources: ResourceFlags,
    /// How long to wait for the grant and the virtual node.
    #[arg(long, default_value = "2m", value_name = "DURATION")]
    pub timeout: String,
}

/// `tether offload resources remove`.
#[derive(Debug, Args)]
pub struct ResourcesRemoveArgs {
    /// The provider's cluster ID.
    #[arg(value_name = "PROVIDER")]
    pub provider: String,
    /// The further request's name, as given to `add --name`; without it, the main request.
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// How long to wait until the virtual node is gone.
    #[arg(long, default_value = "2m", value_name = "DURATION")]
    pub timeout: String,
}

/// Which cluster listens for the tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GatewaySide {
    /// Chosen from which side's gateway can be reached (the provider's first).
    #[value(name = "auto")]
    Auto,
    /// The provider listens; the consumer dials it.
    #[value(name = "provider")]
    Provider,
    /// The consumer listens; the provider dials it (a provider behind NAT).
    #[value(name = "consumer")]
    Consumer,
}

/// How the gateway server's Service is exposed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GatewayServiceType {
    /// A load-balancer address (needs a load-balancer implementation).
    #[value(name = "LoadBalancer")]
    LoadBalancer,
    /// A port on every node.
    #[value(name = "NodePort")]
    NodePort,
}

/// `tether unpeer`.
#[derive(Debug, Clone, Args)]
#[command(group(clap::ArgGroup::new("remote").required(true).args(["remote_cluster_id", "remote_kubeconfig"])))]
pub struct UnpeerArgs {
    /// The provider's cluster ID.
    #[arg(long, value_name = "ID")]
    pub remote_cluster_id: Option<String>,
    /// Admin kubeconfig of the provider (also checks that its side is gone).
    #[arg(long, value_name = "FILE")]
    pub remote_kubeconfig: Option<PathBuf>,
    /// Context in the provider's kubeconfig.
    #[arg(long, value_name = "NAME", requires = "remote_kubeconfig")]
    pub remote_context: Option<String>,
    /// The provider is unreachable: remove the local side only.
    #[arg(long)]
    pub force: bool,
    /// How long to wait until the peering is gone.
    #[arg(long, default_value = "2m", value_name = "DURATION")]
    pub timeout: String,
}

/// `tether generate ...`.
#[derive(Debug, Subcommand)]
pub enum GenerateCommand {
    /// Create a peering token and print the `tether peer` command a consumer runs.
    PeerCommand(PeerCommandArgs),
}

/// Output formats of short commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TextOrJson {
    /// Human text.
    Text,
    /// JSON.
    Json,
}

/// `tether generate peer-command`.
#[derive(Debug, Clone, Args)]
pub struct PeerCommandArgs {
    /// How long the token is valid.
    #[arg(long, default_value = "24h", value_name = "DURATION")]
    pub ttl: String,
    /// A note shown by `tether token list` (who the token is for).
    #[arg(long, value_name = "TEXT")]
    pub description: Option<String>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = TextOrJson::Text)]
    pub output: TextOrJson,
}

/// `tether token ...`.
#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// List this cluster's peering tokens.
    List(TokenListArgs),
    /// Revoke a peering token (consumers that already peered keep their identity).
    Revoke(TokenRevokeArgs),
}

/// `tether token list`.
#[derive(Debug, Clone, Args)]
pub struct TokenListArgs {
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = TextOrJson::Text)]
    pub output: TextOrJson,
}

/// `tether token revoke`.
#[derive(Debug, Clone, Args)]
pub struct TokenRevokeArgs {
    /// The token's ID (the middle part of the token, as `tether token list` shows it).
    pub id: String,
}

/// Output formats of `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusFormat {
    /// Tables and explanations.
    Table,
    /// JSON.
    Json,
    /// YAML.
    Yaml,
}

/// `tether status`.
#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = StatusFormat::Table)]
    pub output: StatusFormat,
}

/// `tether version`.
#[derive(Debug, Clone, Args)]
pub struct VersionArgs {
    /// Only the CLI's version; do not contact a cluster.
    #[arg(long)]
    pub client: bool,
}

/// Shells `tether completion` supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Shell {
    /// Bash.
    Bash,
    /// Zsh.
    Zsh,
    /// Fish.
    Fish,
}

/// `tether completion`.
#[derive(Debug, Clone, Args)]
pub struct CompletionArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: Shell,
}
