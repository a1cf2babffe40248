//! hostNetwork pods (root): no sandbox, the node's address as podIP and hostIP, reached at the
//! node's address from another node's namespace, gone without a trace when deleted; and a
//! privileged host-network container can program links in the node namespace, as a network
//! fabric DaemonSet does.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;
use simkube_node::images::ImageEntry;
use simkube_node::sandbox;
use tether_testkit::{Netns, patience, require_root_or_skip};

mod support;
use support::{Fixture, container_status, fast_backoff, phase, pod, wait_pod};

/// The node address the fixture gives its node.
const NODE_IP: &str = "198.18.0.10";

/// Connects from `ns` to `addr`, sends a line and returns the answer.
fn tcp_exchange(ns: &Netns, addr: SocketAddr) -> std::io::Result<String> {
    ns.run(|| {
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        stream.write_all(b"hello\n")?;
        stream.shutdown(std::net::Shutdown::Write)?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer)?;
        Ok(answer)
    })
}

/// A second namespace standing for another node, linked to the fixture's node namespace by a
/// veth pair and routed to the node's address.
fn other_node(fixture: &Fixture) -> Netns {
    let other = Netns::new("skn-peer").expect("peer namespace");
    fixture
        .netns
        .ip(&[
            "link",
            "add",
            "skpeer0",
            "type",
            "veth",
            "peer",
            "name",
            "skpeer1",
            "netns",
            other.name(),
        ])
        .expect("veth");
    fixture
        .netns
        .ip(&["addr", "add", "198.19.0.1/30", "dev", "skpeer0"])
        .expect("node side address");
    fixture
        .netns
        .ip(&["link", "set", "skpeer0", "up"])
        .expect("node side up");
    other
        .ip(&["addr", "add", "198.19.0.2/30", "dev", "skpeer1"])
        .expect("peer address");
    other
        .ip(&["link", "set", "skpeer1", "up"])
        .expect("peer up");
    other
        .ip(&[
            "route",
            "add",
            &format!("{NODE_IP}/32"),
            "via",
            "198.19.0.1",
        ])
        .expect("route to the node");
    other
}

#[test]
fn host_network_pod_is_reached_at_the_node_address_and_leaves_nothing_behind() {
    if !require_root_or_skip() {
        return;
    }
    let fixture = Fixture::new("skn-hostnet-peer");
    let other = other_node(&fixture);
    let prefix = fixture.prefix.clone();
    let other = &other;
    fixture.run(fast_backoff(), |client, node| async move {
        let pods: Api<Pod> = Api::namespaced(client, "default");
        let mut spec = pod(
            "hostecho",
            &node,
            "simkube.dev/echo",
            &["--tcp", "7111"],
            "Always",
        );
        spec.spec.as_mut().expect("spec").host_network = Some(true);
        pods.create(&PostParams::default(), &spec)
            .await
            .expect("create");
        let running = wait_pod(&pods, "hostecho", Duration::from_secs(20), "Ready", |p| {
            container_status(p).is_some_and(|c| c.ready)
        })
        .await;
        let status = running.status.expect("status");
        let ips: Vec<String> = status
            .pod_ips
            .unwrap_or_default()
            .into_iter()
            .map(|ip| ip.ip)
            .collect();
        assert_eq!(
            (status.pod_ip.as_deref(), status.host_ip.as_deref()),
            (Some(NODE_IP), Some(NODE_IP))
        );
        assert_eq!(ips, [NODE_IP]);
        assert!(sandbox::list(&prefix).is_empty(), "a sandbox was created");

        // From the other node: the server sees the other node's address as the peer.
        let addr: SocketAddr = format!("{NODE_IP}:7111").parse().expect("addr");
        let deadline = Instant::now() + patience(Duration::from_secs(5));
        let answer = loop {
            match tcp_exchange(other, addr) {
                Ok(answer) => break answer,
                Err(e) => assert!(Instant::now() < deadline, "no TCP echo: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(answer.contains("peer=198.19.0.2:"), "{answer}");

        pods.delete("hostecho", &DeleteParams::default())
            .await
            .expect("delete");
        let deadline = Instant::now() + patience(Duration::from_secs(15));
        while pods.get_opt("hostecho").await.expect("get").is_some() {
            assert!(Instant::now() < deadline, "the pod was not removed");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Nothing listens any more, and no namespace was ever made for it.
        let refused = tcp_exchange(other, addr).expect_err("still answering after deletion");
        assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
        assert!(sandbox::list(&prefix).is_empty());
    });
}

#[test]
fn a_privileged_host_network_container_creates_links_in_the_node_namespace() {
    if !require_root_or_skip() {
        return;
    }
    let fixture = Fixture::new("skn-hostnet-link");
    let ip_program = ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect("iproute2's ip");
    fixture.run_with(
        fast_backoff(),
        |b| b,
        |config| {
            config.images = config.images.clone().with_entry(ImageEntry {
                image: "local/iproute2".into(),
                entrypoint: vec![ip_program.into()],
                cmd: Vec::new(),
            });
        },
        |client, node| async move {
            let pods: Api<Pod> = Api::namespaced(client, "default");
            let mut spec = pod(
                "fabric",
                &node,
                "local/iproute2",
                &[
                    "link", "add", "fabric0", "type", "vxlan", "id", "42", "dstport", "4789",
                ],
                "Never",
            );
            let pod_spec = spec.spec.as_mut().expect("spec");
            pod_spec.host_network = Some(true);
            pod_spec.containers[0].security_context =
                serde_json::from_value(json!({"privileged": true})).expect("securityContext");
            pods.create(&PostParams::default(), &spec)
                .await
                .expect("create");
            let done = wait_pod(&pods, "fabric", Duration::from_secs(20), "finished", |p| {
                matches!(phase(p), Some("Succeeded" | "Failed"))
            })
            .await;
            assert_eq!(
                phase(&done),
                Some("Succeeded"),
                "{:?}",
                container_status(&done)
            );
        },
    );
    // The link lives in the node's namespace, not in a pod's.
    let shown = fixture
        .netns
        .ip(&["-d", "link", "show", "fabric0"])
        .expect("fabric0 in the node namespace");
    assert!(shown.contains("vxlan id 42"), "{shown}");
}
