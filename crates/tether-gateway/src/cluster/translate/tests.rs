//! Data tests of the translation: one complete set of objects, then every way of breaking it,
//! each rendered as one line of the expected table.

use expect_test::expect;
use k8s_openapi::ByteString;

use super::*;

const NS: &str = "tether-tenant-b";
const SERVER_PRIVATE: &str = "mHs8b5GoMQEMp4DUX8ZQ0R4DRj9UyA2Uj5j4zTb7xGk=";
const CLIENT_PRIVATE: &str = "wA4bsh8Dm2vk6dPt3cUzCnqYp+k4YkhaxJxmG/k3N3U=";

fn client_public() -> String {
    CLIENT_PRIVATE
        .parse::<PrivateKey>()
        .expect("key")
        .public()
        .to_string()
}

fn server_public() -> String {
    SERVER_PRIVATE
        .parse::<PrivateKey>()
        .expect("key")
        .public()
        .to_string()
}

fn server() -> Gateway {
    Gateway::Server(
        serde_json::from_value(serde_json::json!({
            "apiVersion": "networking.tether.dev/v1alpha1", "kind": "GatewayServer",
            "metadata": {"name": "tether-gateway", "namespace": NS},
            "spec": {"remoteClusterID": "b", "endpoint": {"port": 51840},
                     "clientPublicKey": client_public()}
        }))
        .expect("server"),
    )
}

fn client() -> Gateway {
    Gateway::Client(
        serde_json::from_value(serde_json::json!({
            "apiVersion": "networking.tether.dev/v1alpha1", "kind": "GatewayClient",
            "metadata": {"name": "tether-gateway", "namespace": NS},
            "spec": {"remoteClusterID": "b", "endpoint": {"addresses": ["198.18.0.11"], "port": 51840},
                     "serverPublicKey": server_public()}
        }))
        .expect("client"),
    )
}

fn secret(key: &str) -> Secret {
    Secret {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(objects::GATEWAY_KEY_SECRET.into()),
            ..Default::default()
        },
        data: Some(
            [(
                gateway_key::PRIVATE_KEY.to_owned(),
                ByteString(key.as_bytes().to_vec()),
            )]
            .into(),
        ),
        ..Default::default()
    }
}

fn configuration() -> Configuration {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "networking.tether.dev/v1alpha1", "kind": "Configuration",
        "metadata": {"name": "b", "namespace": NS},
        "spec": {
            "local": {"clusterID": "a", "cidr": {"pod": ["10.0.0.0/16"], "service": ["10.96.0.0/12"]}},
            "remote": {"clusterID": "b", "cidr": {"pod": ["10.0.0.0/16"]}}
        },
        "status": {"remote": {"clusterID": "b", "cidr": {"pod": ["10.71.0.0/16"]}}}
    }))
    .expect("configuration")
}

fn settings() -> Settings {
    Settings {
        metrics_address: SocketAddr::from(([0, 0, 0, 0], 9090)),
        pod_interfaces: vec![tether_api::names::fabric::DEVICE.to_owned()],
        underlay_mtu: Some(1500),
        reconcile_interval: Duration::from_secs(10),
        fabric_ip: None,
        publish: Vec::new(),
    }
}

/// One line per result: the essentials of a config, or why there is none.
fn render(
    gateway: &Gateway,
    secret: Option<&Secret>,
    confs: &[Configuration],
    s: &Settings,
) -> String {
    let objects = Objects {
        namespace: NS,
        gateway,
        secret,
        configurations: confs,
    };
    match translate(&objects, s) {
        Ok(c) => {
            let p = &c.peers[0];
            let planned = match crate::Prepared::new(c.clone()) {
                Ok(_) => "plans".to_owned(),
                Err(e) => format!("plan error -> {}", planning_error(&objects, &e)),
            };
            format!(
                "ok listen={} mtu={} local={:?} ext={:?} reserved={:?} ifaces={:?} peer={} key={} endpoint={:?} keepalive={:?} pod={}->{} ext={:?}->{:?} tun={} [{planned}]",
                c.listen,
                c.mtu,
                c.pod_cidrs,
                c.external_cidr,
                c.reserved_cidrs,
                c.pod_interfaces,
                p.id,
                if p.public_key.to_string() == client_public() {
                    "client"
                } else {
                    "server"
                },
                p.endpoint,
                p.persistent_keepalive,
                p.pod_cidr,
                p.pod_local_view.map(|v| v.to_string()).unwrap_or_default(),
                p.external_cidr,
                p.external_local_view,
                p.interface,
            )
        }
        Err(NotReady::Waiting { reason, message }) => format!("waiting {reason}: {message}"),
        Err(e @ NotReady::Invalid { .. }) => format!("invalid: {e}"),
    }
}

fn json_edit<T: serde::Serialize + serde::de::DeserializeOwned>(
    v: &T,
    f: impl FnOnce(&mut serde_json::Value),
) -> T {
    let mut j = serde_json::to_value(v).expect("to json");
    f(&mut j);
    serde_json::from_value(j).expect("from json")
}

fn edit_gateway(g: &Gateway, f: impl FnOnce(&mut serde_json::Value)) -> Gateway {
    match g {
        Gateway::Server(s) => Gateway::Server(json_edit(s, f)),
        Gateway::Client(c) => Gateway::Client(json_edit(c, f)),
    }
}

#[test]
fn objects_translate_to_a_config_or_say_what_is_missing() {
    let conf = configuration();
    let key = secret(SERVER_PRIVATE);
    let ckey = secret(CLIENT_PRIVATE);
    let s = settings();
    let one = std::slice::from_ref(&conf);
    let edit = |f: fn(&mut serde_json::Value)| vec![json_edit(&conf, f)];
    let cases: Vec<(&str, String)> = vec![
        ("server", render(&server(), Some(&key), one, &s)),
        ("client", render(&client(), Some(&ckey), one, &s)),
        (
            "client, spec.mtu",
            render(
                &edit_gateway(&client(), |j| j["spec"]["mtu"] = 1300.into()),
                Some(&ckey),
                one,
                &s,
            ),
        ),
        (
            "client, unknown underlay",
            render(
                &client(),
                Some(&ckey),
                one,
                &Settings {
                    underlay_mtu: None,
                    ..settings()
                },
            ),
        ),
        (
            "configuration found by label",
            render(
                &server(),
                Some(&key),
                &edit(|j| {
                    j["metadata"]["name"] = "other".into();
                    j["metadata"]["labels"] =
                        serde_json::json!({"tether.dev/remote-cluster-id": "b"});
                }),
                &s,
            ),
        ),
        (
            "external CIDRs",
            render(
                &server(),
                Some(&key),
                &edit(|j| {
                    j["spec"]["local"]["cidr"]["external"] = serde_json::json!(["10.200.0.0/16"]);
                    j["spec"]["remote"]["cidr"]["external"] = serde_json::json!(["10.200.0.0/16"]);
                    j["status"]["remote"]["cidr"]["external"] = serde_json::json!(["10.72.0.0/16"]);
                }),
                &s,
            ),
        ),
        ("no secret", render(&server(), None, one, &s)),
        (
            "secret without the key",
            render(&server(), Some(&Secret::default()), one, &s),
        ),
        (
            "secret with a bad key",
            render(&server(), Some(&secret("not-a-key")), one, &s),
        ),
        ("no configuration", render(&server(), Some(&key), &[], &s)),
        (
            "configuration of another cluster",
            render(
                &server(),
                Some(&key),
                &edit(|j| j["spec"]["remote"]["clusterID"] = "c".into()),
                &s,
            ),
        ),
        (
            "no local CIDRs yet",
            render(
                &server(),
                Some(&key),
                &edit(|j| {
                    j["spec"].as_object_mut().expect("spec").remove("local");
                }),
                &s,
            ),
        ),
        (
            "no remote pod CIDR yet",
            render(
                &server(),
                Some(&key),
                &edit(|j| j["spec"]["remote"]["cidr"]["pod"] = serde_json::json!([])),
                &s,
            ),
        ),
        (
            "no remap yet",
            render(
                &server(),
                Some(&key),
                &edit(|j| {
                    j.as_object_mut().expect("obj").remove("status");
                }),
                &s,
            ),
        ),
        (
            "external without its remap",
            render(
                &server(),
                Some(&key),
                &edit(|j| {
                    j["spec"]["remote"]["cidr"]["external"] = serde_json::json!(["10.200.0.0/16"]);
                }),
                &s,
            ),
        ),
        (
            "invalid remote CIDR",
            render(
                &server(),
                Some(&key),
                &edit(|j| j["spec"]["remote"]["cidr"]["pod"] = serde_json::json!(["10.0.0.0/33"])),
                &s,
            ),
        ),
        (
            "remote CIDR with host bits",
            render(
                &server(),
                Some(&key),
                &edit(|j| j["spec"]["remote"]["cidr"]["pod"] = serde_json::json!(["10.0.0.1/16"])),
                &s,
            ),
        ),
        (
            "invalid remap",
            render(
                &server(),
                Some(&key),
                &edit(|j| j["status"]["remote"]["cidr"]["pod"] = serde_json::json!(["ten"])),
                &s,
            ),
        ),
        (
            "remap of another size",
            render(
                &server(),
                Some(&key),
                &edit(|j| {
                    j["status"]["remote"]["cidr"]["pod"] = serde_json::json!(["10.71.0.0/24"])
                }),
                &s,
            ),
        ),
        (
            "server without the client key",
            render(
                &edit_gateway(&server(), |j| {
                    j["spec"]
                        .as_object_mut()
                        .expect("spec")
                        .remove("clientPublicKey");
                }),
                Some(&key),
                one,
                &s,
            ),
        ),
        (
            "server with its own key as the peer's",
            render(
                &edit_gateway(&server(), |j| {
                    j["spec"]["clientPublicKey"] = server_public().into()
                }),
                Some(&key),
                one,
                &s,
            ),
        ),
        (
            "client without an address",
            render(
                &edit_gateway(&client(), |j| {
                    j["spec"]["endpoint"]["addresses"] = serde_json::json!([])
                }),
                Some(&ckey),
                one,
                &s,
            ),
        ),
        (
            "client with a host name",
            render(
                &edit_gateway(&client(), |j| {
                    j["spec"]["endpoint"]["addresses"] = serde_json::json!(["gw.example"])
                }),
                Some(&ckey),
                one,
                &s,
            ),
        ),
    ];
    let table: String = cases
        .iter()
        .map(|(name, line)| format!("{name}: {line}\n"))
        .collect();
    expect![[r#"
        server: ok listen=0.0.0.0:51840 mtu=1440 local=[10.0.0.0/16] ext=None reserved=[10.96.0.0/12] ifaces=["tether-fabric"] peer=b key=client endpoint=None keepalive=None pod=10.0.0.0/16->10.71.0.0/16 ext=None->None tun=tth-b [plans]
        client: ok listen=0.0.0.0:0 mtu=1440 local=[10.0.0.0/16] ext=None reserved=[10.96.0.0/12] ifaces=["tether-fabric"] peer=b key=server endpoint=Some(198.18.0.11:51840) keepalive=Some(10) pod=10.0.0.0/16->10.71.0.0/16 ext=None->None tun=tth-b [plans]
        client, spec.mtu: ok listen=0.0.0.0:0 mtu=1300 local=[10.0.0.0/16] ext=None reserved=[10.96.0.0/12] ifaces=["tether-fabric"] peer=b key=server endpoint=Some(198.18.0.11:51840) keepalive=Some(10) pod=10.0.0.0/16->10.71.0.0/16 ext=None->None tun=tth-b [plans]
        client, unknown underlay: ok listen=0.0.0.0:0 mtu=1420 local=[10.0.0.0/16] ext=None reserved=[10.96.0.0/12] ifaces=["tether-fabric"] peer=b key=server endpoint=Some(198.18.0.11:51840) keepalive=Some(10) pod=10.0.0.0/16->10.71.0.0/16 ext=None->None tun=tth-b [plans]
        configuration found by label: ok listen=0.0.0.0:51840 mtu=1440 local=[10.0.0.0/16] ext=None reserved=[10.96.0.0/12] ifaces=["tether-fabric"] peer=b key=client endpoint=None keepalive=None pod=10.0.0.0/16->10.71.0.0/16 ext=None->None tun=tth-b [plans]
        external CIDRs: ok listen=0.0.0.0:51840 mtu=1440 local=[10.0.0.0/16] ext=Some(10.200.0.0/16) reserved=[10.96.0.0/12] ifaces=["tether-fabric"] peer=b key=client endpoint=None keepalive=None pod=10.0.0.0/16->10.71.0.0/16 ext=Some(10.200.0.0/16)->Some(10.72.0.0/16) tun=tth-b [plans]
        no secret: waiting KeyPending: waiting for Secret tether-tenant-b/tether-gateway-key with the gateway's WireGuard key (the controller creates it)
        secret without the key: waiting KeyPending: waiting for Secret tether-tenant-b/tether-gateway-key to hold data.privateKey
        secret with a bad key: invalid: Secret tether-tenant-b/tether-gateway-key: data.privateKey: is not a base64 WireGuard private key (32 bytes)
        no configuration: waiting ConfigurationPending: waiting for the Configuration of cluster b in tether-tenant-b (named b or labelled tether.dev/remote-cluster-id=b)
        configuration of another cluster: invalid: Configuration tether-tenant-b/b: spec.remote.clusterID: is "c", but GatewayServer tether-tenant-b/tether-gateway is for cluster "b"
        no local CIDRs yet: waiting LocalCidrsPending: waiting for Configuration tether-tenant-b/b spec.local.cidr.pod (this cluster's pod CIDRs)
        no remote pod CIDR yet: waiting RemoteCidrsPending: waiting for Configuration tether-tenant-b/b spec.remote.cidr.pod (the remote cluster's pod CIDRs)
        no remap yet: waiting RemapPending: waiting for the controller to choose how this cluster addresses b's pods (Configuration tether-tenant-b/b status.remote.cidr.pod)
        external without its remap: waiting RemapPending: waiting for the controller to choose how this cluster addresses b's external CIDR (Configuration tether-tenant-b/b status.remote.cidr.external)
        invalid remote CIDR: invalid: Configuration tether-tenant-b/b: spec.remote.cidr.pod[0]: "10.0.0.0/33" is not an IPv4 CIDR (expected e.g. 10.0.0.0/16)
        remote CIDR with host bits: invalid: Configuration tether-tenant-b/b: spec.remote.cidr.pod[0]: CIDR 10.0.0.1/16 has host bits set: did you mean 10.0.0.0/16?
        invalid remap: invalid: Configuration tether-tenant-b/b: status.remote.cidr.pod[0]: "ten" is not an IPv4 CIDR (expected e.g. 10.0.0.0/16)
        remap of another size: ok listen=0.0.0.0:51840 mtu=1440 local=[10.0.0.0/16] ext=None reserved=[10.96.0.0/12] ifaces=["tether-fabric"] peer=b key=client endpoint=None keepalive=None pod=10.0.0.0/16->10.71.0.0/24 ext=None->None tun=tth-b [plan error -> Configuration tether-tenant-b/b: status.remote.cidr.pod[0]: peer "b": pod local view 10.71.0.0/24 must have the prefix length of its real CIDR 10.0.0.0/16 (peers[0].podLocalView)]
        server without the client key: waiting PeerKeyPending: waiting for GatewayServer tether-tenant-b/tether-gateway spec.clientPublicKey (the controller copies it from the client cluster)
        server with its own key as the peer's: ok listen=0.0.0.0:51840 mtu=1440 local=[10.0.0.0/16] ext=None reserved=[10.96.0.0/12] ifaces=["tether-fabric"] peer=b key=server endpoint=None keepalive=None pod=10.0.0.0/16->10.71.0.0/16 ext=None->None tun=tth-b [plan error -> GatewayServer tether-tenant-b/tether-gateway: spec.clientPublicKey: peer "b" has this gateway's own public key (peers[0].publicKey)]
        client without an address: waiting EndpointPending: waiting for GatewayClient tether-tenant-b/tether-gateway spec.endpoint.addresses (the server's address)
        client with a host name: invalid: GatewayClient tether-tenant-b/tether-gateway: spec.endpoint.addresses[0]: "gw.example" is not an IP address (host names are not resolved)
    "#]].assert_eq(&table);
}

#[test]
fn a_changed_remap_or_key_is_named() {
    let s = settings();
    let key = secret(SERVER_PRIVATE);
    let objects = |g: &Gateway, confs: &[Configuration]| -> Config {
        translate(
            &Objects {
                namespace: NS,
                gateway: g,
                secret: Some(&key),
                configurations: confs,
            },
            &s,
        )
        .expect("config")
    };
    let before = objects(&server(), &[configuration()]);
    let remapped = json_edit(&configuration(), |j| {
        j["status"]["remote"]["cidr"]["pod"] = serde_json::json!(["10.72.0.0/16"])
    });
    let after = objects(&server(), &[remapped]);
    assert_eq!(
        changed_fields(&before, &after),
        ["Configuration status.remote.cidr.pod (remap)"]
    );
    let rekeyed = edit_gateway(&server(), |j| {
        j["spec"]["clientPublicKey"] = server_public().into()
    });
    let after = objects(&rekeyed, &[configuration()]);
    assert_eq!(changed_fields(&before, &after), ["peer public key"]);
    assert!(changed_fields(&before, &before).is_empty());
}

#[test]
fn published_addresses_come_from_the_configuration_and_change_no_tunnel_field() {
    let key = secret(SERVER_PRIVATE);
    let mut s = settings();
    // The control plane, as the Deployment's `--publish` gives it.
    s.publish = vec![tether_netplan::IpMapping {
        external: "10.70.0.1".parse().expect("addr"),
        real: "10.96.0.1".parse().expect("addr"),
    }];
    let with_external = |published: serde_json::Value| {
        json_edit(&configuration(), |j| {
            j["spec"]["local"]["cidr"]["external"] = serde_json::json!(["10.70.0.0/16"]);
            j["status"]["published"] = published;
        })
    };
    let config = |conf: &Configuration| -> Config {
        translate(
            &Objects {
                namespace: NS,
                gateway: &server(),
                secret: Some(&key),
                configurations: std::slice::from_ref(conf),
            },
            &s,
        )
        .expect("config")
    };
    let before = config(&with_external(serde_json::json!([])));
    let conf = with_external(serde_json::json!([
        {"external": "10.70.0.3", "ip": "198.18.0.11", "source": "default/node"},
        // Each of these would make the planner refuse the whole list: left out.
        {"external": "10.70.0.1", "ip": "192.168.7.7"},
        {"external": "10.70.0.4", "ip": "10.96.0.1"},
        {"external": "10.99.0.5", "ip": "192.168.7.8"},
        {"external": "10.70.0.6", "ip": "10.0.3.4"},
        {"external": "10.70.0.7", "ip": "not-an-address"},
        {"external": "10.70.0.8", "ip": "198.18.0.11"},
    ]));
    let after = config(&conf);
    let shown: Vec<String> = after
        .ip_mappings
        .iter()
        .map(|m| format!("{}={}", m.external, m.real))
        .collect();
    assert_eq!(shown, ["10.70.0.1=10.96.0.1", "10.70.0.3=198.18.0.11"]);
    crate::Prepared::new(after.clone()).expect("the list plans");
    // No field that rebuilds the tunnel changed: the gateway applies the list in place.
    assert!(changed_fields(&before, &after).is_empty());
    assert_ne!(before.ip_mappings, after.ip_mappings);
}
