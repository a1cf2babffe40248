//! In-band peering end to end: the provider is brought up with `--private-api`, so the
//! consumer's nodes and pods cannot open TCP to its API server nor to its authentication
//! Service. `tether peer --in-band` builds the tunnel first; the consumer's controller then
//! authenticates and uses its identity through the tunnel only; pods talk both ways; `tether
//! unpeer` leaves nothing on either side. Needs root (pods are processes in network
//! namespaces); in CI it must run.

mod e2e;

use std::net::Ipv4Addr;
use std::process::Command;
use std::time::Duration;

use e2e::net::{echo_pod, nodes, pod_ip, remapped, talk, view_of};
use e2e::{Env, Sim};

/// Whether a TCP connection from node 1 of `from` to `host:port` opens within 3 s.
fn tcp_opens(from: &Sim, host: &str, port: u16) -> bool {
    let script = format!("exec 3<>/dev/tcp/{host}/{port}");
    Command::new("ip")
        .args([
            "netns",
            "exec",
            &format!("sk.{}.n1", from.name),
            "timeout",
            "3",
            "bash",
            "-c",
            &script,
        ])
        .status()
        .expect("ip netns exec runs")
        .success()
}

/// `https://HOST:PORT` split into host and port.
fn host_port(url: &str) -> (String, u16) {
    let rest = url.trim_start_matches("https://").trim_end_matches('/');
    let (host, port) = rest.rsplit_once(':').expect("a port in the URL");
    (host.to_owned(), port.parse().expect("port"))
}

/// Host `n` of a CIDR.
fn host(cidr: &str, n: u32) -> Ipv4Addr {
    let net: ipnet::Ipv4Net = cidr.parse().expect("CIDR");
    Ipv4Addr::from(u32::from(net.network()) + n)
}

#[test]
fn in_band_peering_reaches_a_private_control_plane_through_the_tunnel() {
    let Some(mut env) = Env::new("inband") else {
        return;
    };
    let a = env.up_nodes("a", 1, &[]);
    let b = env.up_nodes("b", 1, &["--private-api"]);
    a.install("alpha", &[]);
    b.install("beta", &[]);

    // Outside the tunnel the consumer cannot reach the provider's control plane: neither the
    // API server nor the authentication Service, at the addresses the provider publishes for
    // peers, accept a TCP connection from its nodes; the provider's own nodes can (so the
    // check itself works).
    let published = |key: &str| {
        b.jsonpath(
            &["configmap", "-n", "tether-system", "tether-public-identity"],
            &format!("{{.data.{key}}}"),
        )
    };
    for url in [published("apiServerURL"), published("authURL")] {
        assert!(url.starts_with("https://"), "{url:?}");
        let (h, p) = host_port(&url);
        assert!(
            tcp_opens(&b, &h, p),
            "the provider's own node reaches {url}"
        );
        assert!(
            !tcp_opens(&a, &h, p),
            "a node of the consumer reaches {url} outside the tunnel"
        );
        eprintln!("{url}: closed to the consumer's nodes");
    }

    let peer = a.tether(&[
        "peer",
        "--in-band",
        "--remote-kubeconfig",
        b.kubeconfig(),
        "--timeout",
        "4m",
    ]);
    peer.ok();
    assert!(peer.stderr.contains("tunnel to beta up"), "{}", peer.stderr);

    // The ForeignCluster is in-band, established, and its API server check passes (through
    // the tunnel: nothing else reaches it).
    let fc = |path: &str| a.jsonpath(&["foreignclusters.core.tether.dev", "beta"], path);
    a.wait("the peering established", Duration::from_secs(60), || {
        fc("{.status.phase}") == "Established"
    });
    assert_eq!(fc("{.spec.provider.inBand}"), "true");
    assert_eq!(
        fc("{.status.conditions[?(@.type==\"APIServerReachable\")].status}"),
        "True",
        "{}",
        fc("{.status.conditions}")
    );
    let external_view = a.jsonpath(
        &[
            "configurations.networking.tether.dev",
            "-n",
            "tether-tenant-beta",
            "beta",
        ],
        "{.status.remote.cidr.external[0]}",
    );
    assert!(
        !external_view.is_empty() && external_view != "10.70.0.0/16",
        "both clusters use 10.70.0.0/16 as their external CIDR, so alpha remaps beta's: \
         {external_view:?}"
    );
    let status = a.tether(&["status"]);
    status.ok();
    assert!(
        status.stdout.contains("True (in-band)"),
        "{}",
        status.stdout
    );
    let (auth_host, _) = host_port(&fc("{.spec.provider.authURL}"));
    assert_eq!(auth_host, host(&external_view, 2).to_string());

    // The kubeconfig alpha keeps for beta points at host 1 of that view and verifies the
    // certificate as kubernetes.default.svc.
    let b64 = a.jsonpath(
        &[
            "secret",
            "-n",
            "tether-tenant-beta",
            "tether-provider-kubeconfig",
        ],
        "{.data.kubeconfig}",
    );
    use base64::Engine as _;
    let kubeconfig = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .expect("base64"),
    )
    .expect("utf-8");
    let server = format!("https://{}:443", host(&external_view, 1));
    assert!(
        kubeconfig.contains(&format!("server: {server}")),
        "{kubeconfig}"
    );
    assert!(
        kubeconfig.contains("tls-server-name: kubernetes.default.svc"),
        "{kubeconfig}"
    );

    // Pods talk both ways over TCP and UDP.
    let (a_node, b_node) = (nodes(&a)[0].clone(), nodes(&b)[0].clone());
    a.apply_as(
        std::path::Path::new(a.kubeconfig()),
        &echo_pod("echo-a", &a_node),
    )
    .ok();
    b.apply_as(
        std::path::Path::new(b.kubeconfig()),
        &echo_pod("echo-b", &b_node),
    )
    .ok();
    let (a_ip, b_ip) = (pod_ip(&a, "echo-a"), pod_ip(&b, "echo-b"));
    let (a_view, b_view) = (view_of(&a, "beta"), view_of(&b, "alpha"));
    let mut n = 0;
    for (from, node, to) in [
        (&a, &a_node, remapped(&a_view, b_ip)),
        (&b, &b_node, remapped(&b_view, a_ip)),
    ] {
        for proto in ["tcp", "udp"] {
            n += 1;
            let seen = talk(
                from,
                &format!("traffic-{n}"),
                node,
                proto,
                &format!("{to}:7000"),
            );
            assert_eq!(seen.len(), 3, "{proto} to {to}: {seen:?}");
        }
    }

    // Unpeer (revocation runs through the tunnel, before it goes): nothing left either side.
    a.tether(&["unpeer", "--remote-kubeconfig", b.kubeconfig()])
        .ok();
    for sim in [&a, &b] {
        sim.wait("gateway pods gone", Duration::from_secs(60), || {
            sim.names(&["pods", "-A", "-l", "tether.dev/component=gateway"])
                .is_empty()
        });
        for kind in [
            "foreignclusters.core.tether.dev",
            "tenants.authentication.tether.dev",
            "configurations.networking.tether.dev",
            "gatewayservers.networking.tether.dev",
            "gatewayclients.networking.tether.dev",
            "connections.networking.tether.dev",
        ] {
            let args: &[&str] = if kind.starts_with("foreign") || kind.starts_with("tenants") {
                &[kind]
            } else {
                &[kind, "-A"]
            };
            sim.wait(
                &format!("no {kind} on {}", sim.name),
                Duration::from_secs(30),
                || sim.names(args).is_empty(),
            );
        }
        sim.wait(
            &format!("no tenant namespace on {}", sim.name),
            Duration::from_secs(60),
            || {
                sim.names(&["namespaces"])
                    .iter()
                    .all(|n| !n.contains("tether-tenant-"))
            },
        );
        let ns = format!("sk.{}.n1", sim.name);
        let mut routes = String::new();
        sim.wait("fabric routes gone", Duration::from_secs(30), || {
            let out = Command::new("ip")
                .args(["-n", &ns, "route", "show"])
                .output()
                .expect("ip runs");
            routes = String::from_utf8_lossy(&out.stdout).into_owned();
            !routes.contains("tether-fabric") && !routes.contains("unreachable")
        });
    }
}
