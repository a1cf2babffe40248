//! The `tether` command (also `kubectl tether`): install Tether into a cluster, peer clusters,
//! manage peering tokens and show status.
//!
//! [`run`] is the whole command behind an argument list, for the binaries and for tests.
//! The modules are usable on their own: [`manifests`] renders what `install` applies (pure),
//! [`install`], [`peer`], [`tokens`] and [`status`] do the work against a cluster.

pub mod cli;
pub mod cluster;
pub mod error;
pub mod in_band;
pub mod install;
pub mod manifests;
pub mod offload;
pub mod peer;
pub mod progress;
pub mod status;
pub mod text;
pub mod tokens;

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory as _, FromArgMatches as _};
use k8s_openapi::jiff::Timestamp;
use tether_api::ClusterId;

pub use crate::cli::Cli;
use crate::cli::{
    Command, CompletionArgs, GenerateCommand, InstallArgs, ManifestFormat, MappingStrategy,
    OffloadCommand, OffloadNamespaceArgs, PeerArgs, PeerCommandArgs, PodStrategy, ResourcesAddArgs,
    ResourcesCommand, ResourcesRemoveArgs, Shell, StatusArgs, StatusFormat, TextOrJson,
    TokenCommand, UninstallArgs, UnoffloadCommand, UnpeerArgs, VersionArgs,
};
use crate::cluster::Target;
pub use crate::error::{Error, Result};
use crate::manifests::InstallOptions;
use crate::progress::Progress;

/// The shortest identity lifetime the controller accepts.
pub const MIN_IDENTITY_LIFETIME: Duration = Duration::from_secs(600);

/// Runs the command line `args` (the first item is the program name) and returns its exit
/// code: 0 ok, 1 other error, 2 usage, 3 unreachable cluster, 4 failed check.
pub fn run<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    run_as("tether", args)
}

/// [`run`] under another program name (`kubectl tether` for the kubectl plugin), which help
/// and completion show.
pub fn run_as<I, T>(bin_name: &str, args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let matches = match Cli::command()
        .bin_name(bin_name.to_owned())
        .try_get_matches_from(args)
    {
        Ok(m) => m,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(error::EXIT_USAGE));
        }
    };
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(error::EXIT_USAGE);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(execute(cli, bin_name)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            e.to_exit_code()
        }
    }
}

/// Runs a parsed command line.
pub async fn execute(cli: Cli, bin_name: &str) -> Result<()> {
    let local = Target::new(
        cli.global.kubeconfig.as_deref(),
        cli.global.context.as_deref(),
    );
    match cli.command {
        Command::Install(args) => install_cmd(&local, args).await,
        Command::Uninstall(args) => uninstall_cmd(&local, args).await,
        Command::Peer(args) => peer_cmd(&local, args).await,
        Command::Unpeer(args) => unpeer_cmd(&local, args).await,
        Command::Generate(GenerateCommand::PeerCommand(args)) => {
            peer_command_cmd(&local, args).await
        }
        Command::Token(TokenCommand::List(args)) => {
            let conn = cluster::connect(&local, "local").await?;
            cluster::installed_cluster_id(&conn).await?;
            let list = tokens::list(&conn.client).await?;
            match args.output {
                TextOrJson::Text => print!("{}", tokens::render_list(&list, Timestamp::now())),
                TextOrJson::Json => println!("{}", to_json(&list)?),
            }
            Ok(())
        }
        Command::Token(TokenCommand::Revoke(args)) => {
            let conn = cluster::connect(&local, "local").await?;
            cluster::installed_cluster_id(&conn).await?;
            tokens::revoke(&conn.client, &args.id).await?;
            println!(
                "Token {} revoked. Consumers that already peered with it keep their identity; \
                 unpeer them to cut them off.",
                args.id
            );
            Ok(())
        }
        Command::Offload(OffloadCommand::Resources(ResourcesCommand::Add(args))) => {
            resources_add_cmd(&local, args).await
        }
        Command::Offload(OffloadCommand::Resources(ResourcesCommand::Remove(args))) => {
            resources_remove_cmd(&local, args).await
        }
        Command::Offload(OffloadCommand::Namespace(args)) => {
            offload_namespace_cmd(&local, args).await
        }
        Command::Unoffload(UnoffloadCommand::Namespace(args)) => {
            let timeout = parse_timeout("timeout", &args.timeout)?;
            let deadline = std::time::Instant::now() + timeout;
            let conn = cluster::connect(&local, "local").await?;
            cluster::installed_cluster_id(&conn).await?;
            let mut progress = Progress::new();
            offload::unoffload_namespace(&conn, &args.namespace, deadline, &mut progress).await?;
            drop(progress);
            println!(
                "Namespace {} is no longer offloaded: its pods run here and the providers removed the twins.",
                args.namespace
            );
            Ok(())
        }
        Command::Status(args) => status_cmd(&local, args).await,
        Command::Version(args) => version_cmd(&local, args).await,
        Command::Completion(CompletionArgs { shell }) => {
            completion(shell, bin_name);
            Ok(())
        }
    }
}

fn parse_timeout(flag: &str, value: &str) -> Result<Duration> {
    let d = text::parse_duration(value).map_err(|e| Error::Usage(format!("--{flag}: {e}")))?;
    if d.is_zero() {
        return Err(Error::Usage(format!("--{flag} must be longer than 0s")));
    }
    Ok(d)
}

fn parse_cluster_id(flag: &str, value: &str) -> Result<ClusterId> {
    ClusterId::new(value).map_err(|e| Error::Usage(format!("--{flag}: {e}")))
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<String> {
    serde_json::to_string_pretty(value).map_err(|e| Error::Output(e.to_string()))
}

/// Validates the install flags into options (the cluster ID is decided later).
fn install_options(args: &InstallArgs, cluster_id: ClusterId) -> Result<InstallOptions> {
    let mut opts = InstallOptions::new(cluster_id);
    if let Some(image) = &args.image {
        if image.trim().is_empty() || image.contains(char::is_whitespace) {
            return Err(Error::Usage(format!(
                "--image {image:?} is not an image reference; use e.g. ghcr.io/tether-dev/tetherd:v0.1.0"
            )));
        }
        opts.image = image.clone();
    }
    opts.auth_service_type = args.auth_service_type;
    opts.replicas = args.replicas;
    if let Some(mode) = args.resource_enforcement {
        opts.resource_enforcement = mode;
    }
    if let Some(url) = &args.api_server_url {
        if !url.starts_with("https://") || url.len() <= "https://".len() {
            return Err(Error::Usage(format!(
                "--api-server-url {url:?} must be an https:// URL of the API server peers reach"
            )));
        }
        opts.api_server_url = Some(url.clone());
    }
    if let Some(url) = &args.auth_url {
        opts.auth_url = Some(peer::check_auth_url(url).map_err(|_| {
            Error::Usage(format!(
                "--auth-url {url:?} must be https://HOST[:PORT], the address peers reach the \
                 authentication service at"
            ))
        })?);
    }
    if let Some(lifetime) = &args.identity_lifetime {
        let d = text::parse_duration(lifetime)
            .map_err(|e| Error::Usage(format!("--identity-lifetime: {e}")))?;
        if d < MIN_IDENTITY_LIFETIME {
            return Err(Error::Usage(format!(
                "--identity-lifetime {lifetime} is too short: identities live at least 10m"
            )));
        }
        opts.identity_lifetime = Some(text::format_duration_one_unit(d));
    }
    if let Some(pod) = &args.pod_cidr {
        let pod = vec![install::check_cidr("pod-cidr", pod)?];
        let service: Vec<String> = args
            .service_cidr
            .iter()
            .map(|s| install::check_cidr("service-cidr", s))
            .collect::<Result<_>>()?;
        let remap_pool = args
            .remap_pool
            .as_deref()
            .map(|p| install::check_remap_pool(p, &pod, &service))
            .transpose()?;
        let external = install::check_external_cidr(
            args.external_cidr
                .as_deref()
                .unwrap_or(tether_api::names::in_band::DEFAULT_EXTERNAL_CIDR),
            &pod,
            &service,
            remap_pool.as_deref(),
        )?;
        opts.network = Some(manifests::NetworkCidrs {
            pod,
            service,
            remap_pool,
            external: Some(external),
        });
    } else {
        if let Some(s) = &args.service_cidr {
            install::check_cidr("service-cidr", s)?;
        }
        // The overlap check waits for the detected or stored CIDRs.
        if let Some(p) = &args.remap_pool {
            install::check_cidr("remap-pool", p)?;
        }
        if let Some(e) = &args.external_cidr {
            install::check_cidr("external-cidr", e)?;
        }
    }
    Ok(opts)
}

async fn install_cmd(local: &Target, args: InstallArgs) -> Result<()> {
    let timeout = parse_timeout("timeout", &args.timeout)?;
    let requested = args
        .cluster_id
        .as_deref()
        .map(|id| parse_cluster_id("cluster-id", id))
        .transpose()?;
    // Validate every flag before contacting anything.
    install_options(&args, ClusterId::generate())?;
    if args.dry_run
        && let Some(id) = &requested
    {
        let opts = install_options(&args, id.clone())?;
        if opts.network.is_none() {
            eprintln!(
                "note: without --pod-cidr the ConfigMap {}/{} is left out: `tether install` \
                 detects the CIDRs from the cluster",
                tether_api::names::SYSTEM_NAMESPACE,
                tether_api::names::objects::NETWORK_CONFIGMAP
            );
        }
        print_manifests(&opts, args.output);
        return Ok(());
    }
    let conn = cluster::connect(local, "local").await.map_err(|e| match e {
        Error::Unreachable { role, url, message } if args.dry_run => Error::Unreachable {
            role,
            url,
            message: format!(
                "{message} (--dry-run without --cluster-id reads the stored ID; pass --cluster-id \
                 to render without a cluster)"
            ),
        },
        other => other,
    })?;
    let (cluster_id, source) =
        install::resolve_cluster_id(&conn.client, requested.as_ref()).await?;
    let mut opts = install_options(&args, cluster_id.clone())?;
    if args.resource_enforcement.is_none()
        && let Some(stored) = install::stored_enforcement(&conn.client).await?
    {
        opts.resource_enforcement = stored;
    }
    let (network, network_source) = install::resolve_network(
        &conn.client,
        opts.network.as_ref().map(|n| n.pod[0].clone()),
        opts.network
            .as_ref()
            .and_then(|n| n.service.first().cloned()),
        args.remap_pool.clone(),
        args.external_cidr.clone(),
    )
    .await?;
    let network_note = format!(
        "pod CIDR {}{} ({})",
        network.pod.join(","),
        if network.service.is_empty() {
            String::new()
        } else {
            format!(", Service CIDR {}", network.service.join(","))
        },
        match network_source {
            install::NetworkSource::Flags => "from the flags",
            install::NetworkSource::Stored => "kept from the existing install",
            install::NetworkSource::Kubeadm =>
                "detected from kube-system/kubeadm-config; override with --pod-cidr",
        }
    );
    let network_note = match &network.remap_pool {
        Some(pool) => format!("{network_note}; peers remapped into {pool}"),
        None => network_note,
    };
    opts.network = Some(network);
    if args.dry_run {
        print_manifests(&opts, args.output);
        return Ok(());
    }
    let mut progress = Progress::new();
    match source {
        IdSourceNote::Generated => progress.note(format!(
            "cluster ID {cluster_id} (generated; pass --cluster-id to choose one)"
        )),
        IdSourceNote::Stored => progress.note(format!(
            "cluster ID {cluster_id} (kept from the existing install)"
        )),
        IdSourceNote::Flag => progress.note(format!("cluster ID {cluster_id}")),
    }
    progress.note(network_note);
    opts.webhook_ca = install::webhook_ca(&conn.client).await?;
    let manifests = manifests::render(&opts);
    install::apply(&conn.client, &manifests, timeout, &mut progress).await?;
    if opts.webhook_ca.is_none() {
        // A first install: the webhook's CA is made now that its namespace exists, and goes
        // into the configuration under this command's own field manager, so that installing
        // again with the same flags changes nothing.
        opts.webhook_ca = Some(install::ensure_webhook_tls(&conn.client).await?);
        for m in manifests::render(&opts) {
            if matches!(m, manifests::Manifest::MutatingWebhookConfiguration(_)) {
                install::apply_one(&conn.client, &m).await?;
            }
        }
    }
    if args.no_wait {
        drop(progress);
        println!(
            "Tether applied to {} (cluster ID {cluster_id}); not waiting for the controller (--no-wait).",
            conn.url
        );
        return Ok(());
    }
    let identity = install::wait_ready(&conn.client, &cluster_id, timeout, &mut progress).await?;
    drop(progress);
    println!("Tether is installed.");
    println!("  cluster ID:          {cluster_id}");
    println!(
        "  authentication URL:  {}",
        identity.auth_url.as_deref().unwrap_or_default()
    );
    println!(
        "  fingerprint:         {}",
        identity.auth_fingerprint.as_deref().unwrap_or_default()
    );
    println!();
    println!("Next:");
    println!("  - to let another cluster consume from this one, run here:");
    println!("      tether generate peer-command");
    println!("    and run the printed `tether peer ...` line against the other cluster;");
    println!("  - or, with admin kubeconfigs of both clusters, run from the consumer:");
    println!("      tether peer --kubeconfig CONSUMER --remote-kubeconfig PROVIDER");
    println!("  - `tether status` shows this cluster and its peers.");
    Ok(())
}

use install::IdSource as IdSourceNote;

fn print_manifests(opts: &InstallOptions, format: ManifestFormat) {
    let objects = manifests::render(opts);
    match format {
        ManifestFormat::Yaml => print!("{}", manifests::to_yaml(&objects)),
        ManifestFormat::Json => print!("{}", manifests::to_json(&objects)),
    }
}

async fn uninstall_cmd(local: &Target, args: UninstallArgs) -> Result<()> {
    let timeout = parse_timeout("timeout", &args.timeout)?;
    let conn = cluster::connect(local, "local").await?;
    let mut progress = Progress::new();
    install::uninstall(
        &conn,
        install::UninstallOptions {
            force: args.force,
            keep_crds: args.keep_crds,
            timeout,
        },
        &mut progress,
    )
    .await?;
    drop(progress);
    if args.keep_crds {
        println!(
            "Tether is uninstalled from {}; the CRDs were kept (--keep-crds).",
            conn.url
        );
    } else {
        println!("Tether is uninstalled from {}.", conn.url);
    }
    Ok(())
}

async fn peer_cmd(local: &Target, args: PeerArgs) -> Result<()> {
    let timeout = parse_timeout("timeout", &args.timeout)?;
    let mut modules = peer::check_modules(&args.modules)?;
    let amounts = args.resources.amounts();
    if amounts.any() {
        modules.offloading.enabled = true;
    } else if modules.offloading.enabled {
        return Err(Error::Usage(
            "offloading asks the provider for resources: say how much with --cpu, --memory or \
             --pods (for example --cpu 2 --memory 4Gi --pods 20)"
                .to_owned(),
        ));
    }
    let networking = peer::networking_options(&args)?;
    let provider = match (
        &args.remote_kubeconfig,
        &args.auth_url,
        &args.token,
        &args.ca_fingerprint,
    ) {
        (Some(path), _, _, _) => {
            peer::Provider::Kubeconfig(Target::new(Some(path), args.remote_context.as_deref()))
        }
        (None, Some(url), Some(token), Some(fp)) => peer::parse_token_form(url, token, fp)?,
        _ => {
            return Err(Error::Usage(
                "give the provider either as --remote-kubeconfig FILE or as --auth-url URL \
                 --token TOKEN --ca-fingerprint FINGERPRINT (from `tether generate peer-command` \
                 on the provider)"
                    .to_owned(),
            ));
        }
    };
    if args.in_band && args.remote_kubeconfig.is_none() {
        return Err(Error::Usage(
            "--in-band needs --remote-kubeconfig: before authentication nothing but the tunnel \
             connects the clusters, so this command itself exchanges the tunnel's CIDRs, keys and \
             endpoint, which takes admin access to both clusters"
                .to_owned(),
        ));
    }
    if args.in_band && !modules.networking.enabled {
        return Err(Error::Usage(
            "--in-band reaches the provider through the tunnel, which the networking module \
             builds: keep `networking` in --modules"
                .to_owned(),
        ));
    }
    // The request is named after the provider, whose ID a kubeconfig gives only once
    // connected: the amounts are checked now, before anything connects, with a stand-in.
    let stand_in = ClusterId::new("provider").map_err(|e| Error::Usage(e.to_string()))?;
    offload::request(&stand_in, None, &amounts, &args.resources.resource_class)?;
    let mut progress = Progress::new();
    let outcome = peer::peer(
        local,
        &provider,
        &peer::PeerOptions {
            modules: &modules,
            networking: &networking,
            in_band: args.in_band,
            amounts,
            resource_class: &args.resources.resource_class,
        },
        timeout,
        &mut progress,
    )
    .await?;
    drop(progress);
    match outcome {
        peer::PeerOutcome::AlreadyPeered { provider, granted } => match granted {
            Some(g) => println!(
                "Already peered with {provider}; it granted {} and virtual node {} is Ready.",
                g.resources, g.node
            ),
            None => println!("Already peered with {provider}; nothing changed."),
        },
        peer::PeerOutcome::Peered { provider, granted } => {
            if let Some(g) = granted {
                println!(
                    "{provider} granted {}: virtual node {} is Ready.",
                    g.resources, g.node
                );
            }
            if modules.networking.enabled {
                println!(
                    "Peered with {provider}: this cluster is authenticated as its consumer and the tunnel is up."
                );
            } else {
                println!("Peered with {provider}: this cluster is authenticated as its consumer.");
            }
            println!("`tether status` shows the peering.");
        }
    }
    Ok(())
}

async fn resources_add_cmd(local: &Target, args: ResourcesAddArgs) -> Result<()> {
    let timeout = parse_timeout("timeout", &args.timeout)?;
    let provider = parse_cluster_id("PROVIDER", &args.provider)?;
    let amounts = args.resources.amounts();
    let request = offload::request(
        &provider,
        args.name.as_deref(),
        &amounts,
        &args.resources.resource_class,
    )?
    .ok_or_else(|| {
        Error::Usage(
            "say what to ask for with --cpu, --memory or --pods (for example --cpu 2 \
                 --memory 4Gi --pods 20)"
                .to_owned(),
        )
    })?;
    let deadline = std::time::Instant::now() + timeout;
    let conn = cluster::connect(local, "local").await?;
    let consumer = cluster::installed_cluster_id(&conn).await?;
    let mut progress = Progress::new();
    let granted = offload::ask(
        &conn,
        &consumer,
        &provider,
        &request,
        deadline,
        &mut progress,
    )
    .await?;
    drop(progress);
    println!(
        "{provider} granted {}: virtual node {} is Ready.",
        granted.resources, granted.node
    );
    Ok(())
}

async fn offload_namespace_cmd(local: &Target, args: OffloadNamespaceArgs) -> Result<()> {
    use tether_api::offloading::{NamespaceMappingStrategy, PodOffloadingStrategy};
    let timeout = parse_timeout("timeout", &args.timeout)?;
    let pods = match args.pod_offloading_strategy {
        PodStrategy::Local => PodOffloadingStrategy::Local,
        PodStrategy::Remote => PodOffloadingStrategy::Remote,
        PodStrategy::LocalAndRemote => PodOffloadingStrategy::LocalAndRemote,
    };
    let mapping = match args.namespace_mapping_strategy {
        MappingStrategy::DefaultName => NamespaceMappingStrategy::DefaultName,
        MappingStrategy::EnforceSameName => NamespaceMappingStrategy::EnforceSameName,
        MappingStrategy::SelectedName => NamespaceMappingStrategy::SelectedName,
    };
    let request = offload::namespace_request(
        &args.namespace,
        pods,
        mapping,
        args.remote_namespace_name.as_deref(),
        &args.selector,
    )?;
    let deadline = std::time::Instant::now() + timeout;
    let conn = cluster::connect(local, "local").await?;
    cluster::installed_cluster_id(&conn).await?;
    let mut progress = Progress::new();
    let status = offload::offload_namespace(&conn, &request, deadline, &mut progress).await?;
    drop(progress);
    let providers: Vec<&str> = status
        .remote_namespaces_conditions
        .keys()
        .map(String::as_str)
        .collect();
    println!(
        "Namespace {} is offloaded to {} as {}.",
        args.namespace,
        providers.join(", "),
        status.remote_namespace_name.as_deref().unwrap_or("-")
    );
    Ok(())
}

async fn resources_remove_cmd(local: &Target, args: ResourcesRemoveArgs) -> Result<()> {
    let timeout = parse_timeout("timeout", &args.timeout)?;
    let provider = parse_cluster_id("PROVIDER", &args.provider)?;
    let name = offload::slice_name(&provider, args.name.as_deref())?;
    let deadline = std::time::Instant::now() + timeout;
    let conn = cluster::connect(local, "local").await?;
    cluster::installed_cluster_id(&conn).await?;
    let mut progress = Progress::new();
    offload::withdraw(&conn, &provider, &name, deadline, &mut progress).await?;
    drop(progress);
    println!("Withdrew {name} from {provider}: its virtual node is gone.");
    Ok(())
}

async fn unpeer_cmd(local: &Target, args: UnpeerArgs) -> Result<()> {
    let timeout = parse_timeout("timeout", &args.timeout)?;
    let remote_id = args
        .remote_cluster_id
        .as_deref()
        .map(|id| parse_cluster_id("remote-cluster-id", id))
        .transpose()?;
    let remote = args
        .remote_kubeconfig
        .as_deref()
        .map(|p| Target::new(Some(p), args.remote_context.as_deref()));
    let mut progress = Progress::new();
    peer::unpeer(
        local,
        remote_id.as_ref(),
        remote.as_ref(),
        args.force,
        timeout,
        &mut progress,
    )
    .await?;
    drop(progress);
    println!("Unpeered.");
    Ok(())
}

async fn peer_command_cmd(local: &Target, args: PeerCommandArgs) -> Result<()> {
    let ttl = parse_timeout("ttl", &args.ttl)?;
    let conn = cluster::connect(local, "local").await?;
    let cluster_id = cluster::installed_cluster_id(&conn).await?;
    let identity = cluster::public_identity(&conn.client)
        .await?
        .filter(cluster::PublicIdentity::is_complete)
        .ok_or_else(|| {
            Error::Check(
                "the controller has not published this cluster's authentication URL and \
                 fingerprint yet (ConfigMap tether-system/tether-public-identity); wait for \
                 `tether install` to finish, and see `tether status`"
                    .to_owned(),
            )
        })?;
    let auth_url = identity.auth_url.clone().unwrap_or_default();
    let fingerprint = identity.auth_fingerprint.clone().unwrap_or_default();
    let (token, expires) =
        tokens::create(&conn.client, &cluster_id, ttl, args.description.as_deref()).await?;
    let command = tokens::peer_command(&auth_url, &token, &fingerprint);
    match args.output {
        TextOrJson::Text => {
            eprintln!(
                "# Token {} for cluster {cluster_id}, valid until {}. Run this against the consumer cluster (add --kubeconfig):",
                token.id(),
                tokens::rfc3339(expires)
            );
            println!("{command}");
        }
        TextOrJson::Json => {
            let value = serde_json::json!({
                "clusterID": cluster_id.as_str(),
                "tokenID": token.id(),
                "token": token.expose(),
                "authURL": auth_url,
                "caFingerprint": fingerprint,
                "expiresAt": tokens::rfc3339(expires),
                "command": command,
            });
            println!("{}", to_json(&value)?);
        }
    }
    Ok(())
}

async fn status_cmd(local: &Target, args: StatusArgs) -> Result<()> {
    let conn = cluster::connect(local, "local").await?;
    let report = status::gather(&conn).await?;
    match args.output {
        StatusFormat::Table => print!("{}", status::render_table(&report)),
        StatusFormat::Json => println!("{}", to_json(&report)?),
        StatusFormat::Yaml => print!(
            "{}",
            serde_yaml::to_string(&report).map_err(|e| Error::Output(e.to_string()))?
        ),
    }
    Ok(())
}

async fn version_cmd(local: &Target, args: VersionArgs) -> Result<()> {
    println!("tether CLI: {}", manifests::cli_version());
    let has_cluster = local.kubeconfig.is_some()
        || local.context.is_some()
        || std::env::var_os("KUBECONFIG").is_some_and(|v| !v.is_empty());
    if args.client || !has_cluster {
        return Ok(());
    }
    let conn = cluster::connect(local, "local").await?;
    let deployments: kube::Api<k8s_openapi::api::apps::v1::Deployment> =
        kube::Api::namespaced(conn.client.clone(), tether_api::names::SYSTEM_NAMESPACE);
    match deployments
        .get_opt(tether_api::names::objects::CONTROLLER)
        .await
        .map_err(Error::api("reading the controller Deployment"))?
        .as_ref()
        .and_then(status::controller_image)
    {
        Some(image) => println!("controller image: {image}"),
        None => println!("controller: not installed in {}", conn.url),
    }
    Ok(())
}

fn completion(shell: Shell, bin_name: &str) {
    let mut cmd = Cli::command();
    let name = bin_name.replace(' ', "-");
    let mut out = std::io::stdout();
    match shell {
        Shell::Bash => {
            clap_complete::generate(clap_complete::Shell::Bash, &mut cmd, name, &mut out)
        }
        Shell::Zsh => clap_complete::generate(clap_complete::Shell::Zsh, &mut cmd, name, &mut out),
        Shell::Fish => {
            clap_complete::generate(clap_complete::Shell::Fish, &mut cmd, name, &mut out)
        }
    }
}
