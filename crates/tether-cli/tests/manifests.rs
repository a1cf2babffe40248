//! What `tether install` renders: every object in dependency order (snapshots of the YAML), the
//! flags that change it, and the RBAC it grants (a readable listing of what the controller may
//! do, and no wildcard anywhere).

use expect_test::{expect, expect_file};
use tether_api::ClusterId;
use tether_cli::manifests::{self, AuthServiceType, InstallOptions, Manifest};

fn options() -> InstallOptions {
    let mut opts = InstallOptions::new(ClusterId::new("west-1").expect("valid"));
    opts.image = "ghcr.io/tether-dev/tetherd:v0.1.0".to_owned();
    opts
}

#[test]
fn objects_come_in_dependency_order() {
    let order: Vec<String> = manifests::render(&options())
        .iter()
        .map(Manifest::describe)
        .collect();
    expect![[r#"
        Namespace tether-system
        CustomResourceDefinition foreignclusters.core.tether.dev
        CustomResourceDefinition tenants.authentication.tether.dev
        CustomResourceDefinition resourceslices.authentication.tether.dev
        CustomResourceDefinition configurations.networking.tether.dev
        CustomResourceDefinition gatewayservers.networking.tether.dev
        CustomResourceDefinition gatewayclients.networking.tether.dev
        CustomResourceDefinition connections.networking.tether.dev
        CustomResourceDefinition ips.networking.tether.dev
        CustomResourceDefinition virtualnodes.offloading.tether.dev
        CustomResourceDefinition namespaceoffloadings.offloading.tether.dev
        CustomResourceDefinition shadowpods.offloading.tether.dev
        ServiceAccount tether-system/tether-controller
        ServiceAccount tether-system/tether-fabric
        ClusterRole tether-controller
        ClusterRole tether-controller-tenant
        ClusterRole tether-tenant
        ClusterRole tether-tenant-offloaded
        ClusterRole tether-gateway
        ClusterRole tether-gateway-nodes
        ClusterRole tether-fabric
        ClusterRoleBinding tether-controller
        ClusterRoleBinding tether-fabric
        Role tether-system/tether-controller
        Role default/tether-controller-apiserver
        Role kube-node-lease/tether-controller-node-leases
        Role kube-system/tether-controller-client-ca
        RoleBinding tether-system/tether-controller
        RoleBinding default/tether-controller-apiserver
        RoleBinding kube-node-lease/tether-controller-node-leases
        RoleBinding kube-system/tether-controller-client-ca
        ConfigMap tether-system/tether-cluster-id
        Deployment tether-system/tether-controller
        DaemonSet tether-system/tether-fabric
        Service tether-system/tether-auth
        Service tether-system/tether-webhook
        MutatingWebhookConfiguration tether-pods
        StorageClass tether
    "#]]
    .assert_eq(&(order.join("\n") + "\n"));
}

#[test]
fn the_crds_are_tether_apis_own() {
    let rendered: Vec<_> = manifests::render(&options())
        .into_iter()
        .filter_map(|m| match m {
            Manifest::CustomResourceDefinition(c) => Some(c),
            _ => None,
        })
        .collect();
    assert_eq!(rendered, tether_api::crds::all());
}

#[test]
fn every_object_carries_the_part_of_label() {
    for m in manifests::render(&options()) {
        let labels = m.metadata().labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get("app.kubernetes.io/part-of").map(String::as_str),
            Some("tether"),
            "{}",
            m.describe()
        );
    }
}

#[test]
fn the_default_objects_render_as_expected() {
    let non_crds: Vec<Manifest> = manifests::render(&options())
        .into_iter()
        .filter(|m| !matches!(m, Manifest::CustomResourceDefinition(_)))
        .collect();
    expect_file!["snapshots/install-default.yaml"].assert_eq(&manifests::to_yaml(&non_crds));
}

#[test]
fn flags_change_the_service_type_replicas_image_and_controller_args() {
    let mut opts = options();
    opts.auth_service_type = AuthServiceType::NodePort;
    opts.replicas = 2;
    opts.image = "registry.example/tetherd@sha256:0123".to_owned();
    opts.api_server_url = Some("https://203.0.113.10:6443".to_owned());
    opts.auth_url = Some("https://203.0.113.10:30443".to_owned());
    opts.identity_lifetime = Some("1h".to_owned());
    let rendered = manifests::render(&opts);
    let deployment = rendered
        .iter()
        .find_map(|m| match m {
            Manifest::Deployment(d) => Some(d.clone()),
            _ => None,
        })
        .expect("a Deployment");
    let service = rendered
        .iter()
        .find_map(|m| match m {
            Manifest::Service(s) => Some(s.clone()),
            _ => None,
        })
        .expect("a Service");
    let spec = deployment.spec.expect("spec");
    let container = &spec.template.spec.expect("pod spec").containers[0];
    let summary = format!(
        "replicas: {:?}\nimage: {:?}\nargs: {:#?}\nservice type: {:?}\n",
        spec.replicas,
        container.image,
        container.args.clone().unwrap_or_default(),
        service.spec.expect("spec").type_,
    );
    expect![[r#"
        replicas: Some(2)
        image: Some("registry.example/tetherd@sha256:0123")
        args: [
            "controller",
            "--auth-listen=0.0.0.0:8443",
            "--admin-addr=0.0.0.0:9090",
            "--log-format=json",
            "--gateway-image=registry.example/tetherd@sha256:0123",
            "--api-server-url=https://203.0.113.10:6443",
            "--auth-url=https://203.0.113.10:30443",
            "--identity-lifetime=1h",
            "--resource-enforcement=soft",
        ]
        service type: Some("NodePort")
    "#]]
    .assert_eq(&summary);
}

#[test]
fn the_default_image_is_tagged_with_the_cli_version() {
    let opts = InstallOptions::new(ClusterId::new("c").expect("valid"));
    assert_eq!(
        opts.image,
        format!("ghcr.io/tether-dev/tetherd:v{}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn rendering_is_deterministic() {
    let a = manifests::to_yaml(&manifests::render(&options()));
    let b = manifests::to_yaml(&manifests::render(&options()));
    assert_eq!(a, b);
    let json: serde_json::Value =
        serde_json::from_str(&manifests::to_json(&manifests::render(&options()))).expect("json");
    assert_eq!(json["kind"], "List");
    assert_eq!(json["items"].as_array().map(Vec::len), Some(38));
}

/// The whole of what Tether's roles allow. A change here is a change of the controller's
/// privileges (or of what consumers may do on a provider): review it as such.
#[test]
fn what_the_controller_and_tenants_may_do_and_nothing_more() {
    expect_file!["snapshots/rbac.txt"]
        .assert_eq(&manifests::rbac_listing(&manifests::render(&options())));
}

#[test]
fn no_role_has_a_wildcard() {
    let rendered = manifests::render(&options());
    assert_eq!(manifests::wildcards(&rendered), Vec::<String>::new());
    // The check itself finds wildcards.
    let mut tampered = rendered;
    for m in &mut tampered {
        if let Manifest::ClusterRole(r) = m
            && let Some(rule) = r.rules.as_mut().and_then(|rules| rules.first_mut())
        {
            rule.verbs.push("*".to_owned());
        }
    }
    assert_eq!(manifests::wildcards(&tampered).len(), 7);
}

/// The controller's arguments as `tetherd controller` parses them: the shared admin and log
/// flags come from tether-runtime, and its durations are one number with one unit.
#[test]
fn the_controller_arguments_parse_with_the_daemons_flag_types() {
    #[derive(clap::Parser)]
    struct Shared {
        #[command(flatten)]
        admin: tether_runtime::AdminArgs,
        #[command(flatten)]
        log: tether_runtime::LogArgs,
        #[arg(long)]
        auth_listen: std::net::SocketAddr,
        #[arg(long, value_parser = tether_runtime::parse_duration)]
        identity_lifetime: Option<std::time::Duration>,
        #[arg(long)]
        api_server_url: Option<String>,
        #[arg(long)]
        auth_url: Option<String>,
        #[arg(long)]
        gateway_image: String,
        #[arg(long)]
        resource_enforcement: tether_resources::Enforcement,
    }
    let mut opts = options();
    opts.identity_lifetime = Some(tether_cli::text::format_duration_one_unit(
        tether_cli::text::parse_duration("1h30m").expect("duration"),
    ));
    opts.auth_url = Some("https://203.0.113.10:30443".to_owned());
    opts.resource_enforcement = tether_resources::Enforcement::Hard;
    let args = manifests::render(&opts)
        .into_iter()
        .find_map(|m| match m {
            Manifest::Deployment(d) => d.spec?.template.spec?.containers[0].args.clone(),
            _ => None,
        })
        .expect("args");
    assert_eq!(args[0], "controller");
    let parsed = <Shared as clap::Parser>::try_parse_from(
        std::iter::once("tetherd-controller".to_owned()).chain(args[1..].iter().cloned()),
    )
    .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert_eq!(parsed.admin.admin_addr.port(), 9090);
    assert_eq!(parsed.auth_listen.port(), 8443);
    assert_eq!(
        parsed.identity_lifetime,
        Some(std::time::Duration::from_secs(5400))
    );
    assert_eq!(
        parsed.auth_url.as_deref(),
        Some("https://203.0.113.10:30443")
    );
    assert!(parsed.api_server_url.is_none());
    assert_eq!(
        parsed.resource_enforcement,
        tether_resources::Enforcement::Hard
    );
    let _ = parsed.log;
}
