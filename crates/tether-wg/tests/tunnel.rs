//! Two in-memory devices talk through a simulated network: handshakes, data both ways, wrong
//! keys, roaming, allowed IPs and recovery after a restart.

use std::net::SocketAddr;
use std::time::Instant;

use tether_wg::{
    AllowedIps, Decapsulated, Device, DropReason, Encapsulated, MessageKind, PeerConfig, PeerIndex,
    PrivateKey,
};

const A_ADDR: &str = "198.18.0.1:51820";
const B_ADDR: &str = "198.18.0.2:51820";

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("test address")
}

fn ipv4(src: [u8; 4], dst: [u8; 4], payload: &[u8]) -> Vec<u8> {
    let total = 20 + payload.len();
    let mut p = vec![0u8; total];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&src);
    p[16..20].copy_from_slice(&dst);
    p[20..].copy_from_slice(payload);
    p
}

fn peer(id: &str, key: &PrivateKey, endpoint: Option<&str>, allowed: &str) -> PeerConfig {
    PeerConfig {
        id: id.into(),
        public_key: key.public(),
        endpoint: endpoint.map(addr),
        persistent_keepalive: None,
        allowed_ips: AllowedIps::new([allowed.parse().expect("cidr")]),
    }
}

struct Pair {
    a: Device,
    b: Device,
    ka: PrivateKey,
    kb: PrivateKey,
}

/// A is the client (knows B's endpoint), B the server (learns A's). A's pods are
/// 10.1.0.0/16, B's 10.2.0.0/16.
fn pair() -> Pair {
    let ka = PrivateKey::generate();
    let kb = PrivateKey::generate();
    let a = Device::new(
        ka.clone(),
        vec![peer("b", &kb, Some(B_ADDR), "10.2.0.0/16")],
    )
    .expect("valid config");
    let b = Device::new(kb.clone(), vec![peer("a", &ka, None, "10.1.0.0/16")]).expect("valid");
    Pair { a, b, ka, kb }
}

/// Sends `packet` from `src` through `dev`'s only peer, runs the exchange to completion on the
/// simulated wire, and returns every inner packet each side delivered to its tunnel.
fn deliver(
    from: &Device,
    from_addr: SocketAddr,
    to: &Device,
    to_addr: SocketAddr,
    packet: &[u8],
) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let now = Instant::now();
    let mut out = vec![0u8; 2048];
    // (sender device is "from"?, destination address, bytes)
    let mut wire: Vec<(bool, SocketAddr, Vec<u8>)> = Vec::new();
    match from.encapsulate(PeerIndex(0), packet, &mut out, now) {
        Encapsulated::Send { to, len, .. } => wire.push((true, to, out[..len].to_vec())),
        Encapsulated::Queued => {}
        Encapsulated::Dropped(r) => panic!("dropped on send: {r:?}"),
    }
    let (mut at_from, mut at_to) = (Vec::new(), Vec::new());
    let mut steps = 0;
    while let Some((sent_by_from, dest, bytes)) = wire.pop() {
        steps += 1;
        assert!(steps < 50, "exchange did not settle");
        let (dev, src, dst_addr, inbox) = if sent_by_from {
            assert_eq!(dest, to_addr, "sent to the wrong place");
            (to, from_addr, to_addr, &mut at_to)
        } else {
            assert_eq!(dest, from_addr, "reply to the wrong place");
            (from, to_addr, from_addr, &mut at_from)
        };
        let _ = dst_addr;
        match dev.decapsulate(src, &bytes, &mut out, now) {
            Decapsulated::ToTunnel { len, .. } => inbox.push(out[..len].to_vec()),
            Decapsulated::ToNetwork {
                peer,
                to: dest,
                len,
            } => {
                let reply_from_from = !sent_by_from;
                wire.push((reply_from_from, dest, out[..len].to_vec()));
                if let Some(p) = peer {
                    while let Some((d, len)) = dev.flush(p, &mut out, now) {
                        wire.push((reply_from_from, d, out[..len].to_vec()));
                    }
                }
            }
            Decapsulated::Consumed(_) | Decapsulated::Dropped(..) | Decapsulated::Rejected => {}
        }
    }
    (at_from, at_to)
}

#[test]
fn handshake_then_packets_both_ways() {
    let Pair { a, b, .. } = pair();
    let p1 = ipv4([10, 1, 0, 5], [10, 2, 0, 7], b"hello b");
    let (_, at_b) = deliver(&a, addr(A_ADDR), &b, addr(B_ADDR), &p1);
    assert_eq!(
        at_b,
        vec![p1],
        "the queued packet arrives once the handshake completes"
    );

    let now = Instant::now();
    let sa = a.stats(PeerIndex(0), now);
    let sb = b.stats(PeerIndex(0), now);
    assert_eq!((sa.handshakes, sb.handshakes), (1, 1));
    assert!(sa.has_session && sb.has_session);
    assert!(
        sa.handshake_rtt.is_some(),
        "the initiator measures the handshake RTT"
    );
    assert_eq!(
        sb.endpoint,
        Some(addr(A_ADDR)),
        "the server learned the client's endpoint"
    );

    let p2 = ipv4([10, 2, 0, 7], [10, 1, 0, 5], b"hello a");
    let (_, at_a) = deliver(&b, addr(B_ADDR), &a, addr(A_ADDR), &p2);
    assert_eq!(at_a, vec![p2]);
    assert!(b.stats(PeerIndex(0), now).tx_packets >= 2);
    assert!(a.stats(PeerIndex(0), now).rx_packets >= 2);
}

#[test]
fn wrong_public_key_gets_nothing_through() {
    let Pair { a: _, b, ka, kb: _ } = pair();
    // A believes B's key is some other key: its initiation carries a MAC1 B cannot verify.
    let impostor = PrivateKey::generate();
    let a = Device::new(ka, vec![peer("b", &impostor, Some(B_ADDR), "10.2.0.0/16")]).expect("ok");
    let p = ipv4([10, 1, 0, 5], [10, 2, 0, 7], b"x");
    let (_, at_b) = deliver(&a, addr(A_ADDR), &b, addr(B_ADDR), &p);
    assert!(at_b.is_empty());
    assert_eq!(b.counters().invalid_mac(), 1);
    assert_eq!(b.stats(PeerIndex(0), Instant::now()).handshakes, 0);
    assert_eq!(a.stats(PeerIndex(0), Instant::now()).handshakes, 0);
}

#[test]
fn unknown_initiator_key_is_rejected() {
    let Pair { a: _, b, .. } = pair();
    // A stranger that knows B's public key but is not configured on B.
    let stranger = PrivateKey::generate();
    let kb_pub = b.public_key();
    let s = Device::new(
        stranger,
        vec![PeerConfig {
            id: "b".into(),
            public_key: kb_pub,
            endpoint: Some(addr(B_ADDR)),
            persistent_keepalive: None,
            allowed_ips: AllowedIps::new(["10.2.0.0/16".parse().expect("cidr")]),
        }],
    )
    .expect("ok");
    let p = ipv4([10, 1, 0, 5], [10, 2, 0, 7], b"x");
    let (_, at_b) = deliver(&s, addr(A_ADDR), &b, addr(B_ADDR), &p);
    assert!(at_b.is_empty());
    assert_eq!(b.counters().unknown_key(), 1);
}

#[test]
fn roaming_follows_authenticated_packets_only() {
    let Pair { a, b, .. } = pair();
    let p = ipv4([10, 1, 0, 5], [10, 2, 0, 7], b"x");
    deliver(&a, addr(A_ADDR), &b, addr(B_ADDR), &p);
    let now = Instant::now();
    let mut out = vec![0u8; 2048];

    // A genuine packet from a new source (A's NAT mapping changed): B follows it.
    let len = match a.encapsulate(PeerIndex(0), &p, &mut out, now) {
        Encapsulated::Send { len, .. } => len,
        other => panic!("expected a data packet, got {other:?}"),
    };
    let genuine = out[..len].to_vec();
    let moved = addr("198.18.7.7:40000");
    assert!(matches!(
        b.decapsulate(moved, &genuine, &mut out, now),
        Decapsulated::ToTunnel { .. }
    ));
    assert_eq!(b.stats(PeerIndex(0), now).endpoint, Some(moved));
    assert_eq!(b.find_by_endpoint(moved), Some(PeerIndex(0)));

    // A forged packet (valid header and index, garbage ciphertext) from an attacker: no roam.
    let mut forged = genuine;
    forged[8..16].copy_from_slice(&u64::MAX.to_le_bytes()[..8]);
    let last = forged.len() - 1;
    forged[last] ^= 0xff;
    let attacker = addr("198.18.9.9:1234");
    let r = b.decapsulate(attacker, &forged, &mut out, now);
    assert!(
        matches!(r, Decapsulated::Dropped(_, DropReason::Decrypt)),
        "{r:?}"
    );
    assert_eq!(b.stats(PeerIndex(0), now).endpoint, Some(moved));
}

#[test]
fn allowed_ips_violations_are_dropped_and_counted() {
    let Pair { a, b, .. } = pair();
    let ok = ipv4([10, 1, 0, 5], [10, 2, 0, 7], b"fine");
    deliver(&a, addr(A_ADDR), &b, addr(B_ADDR), &ok);
    let spoofed = ipv4([10, 2, 0, 99], [10, 2, 0, 7], b"spoof");
    let (_, at_b) = deliver(&a, addr(A_ADDR), &b, addr(B_ADDR), &spoofed);
    assert!(
        at_b.is_empty(),
        "a source outside A's allowed IPs must not reach B's pods"
    );
    let drops = b.stats(PeerIndex(0), Instant::now()).drops;
    let n = drops
        .iter()
        .find(|(r, _)| *r == DropReason::AllowedIps)
        .map(|(_, n)| *n);
    assert_eq!(n, Some(1));
}

#[test]
fn restarted_server_recovers_on_the_next_data_packet() {
    let Pair { a, b, ka, kb } = pair();
    let p = ipv4([10, 1, 0, 5], [10, 2, 0, 7], b"before");
    deliver(&a, addr(A_ADDR), &b, addr(B_ADDR), &p);
    drop(b);
    // Same keys, fresh state: the old session is gone, and B does not know A's endpoint.
    let b2 = Device::new(kb, vec![peer("a", &ka, None, "10.1.0.0/16")]).expect("ok");
    let now = Instant::now();
    let mut out = vec![0u8; 2048];
    let len = match a.encapsulate(PeerIndex(0), &p, &mut out, now) {
        Encapsulated::Send { len, .. } => len,
        other => panic!("A still has its session: {other:?}"),
    };
    let stale = out[..len].to_vec();
    // B attributes the stale index to A (deterministic slots) and answers with an initiation.
    let init = match b2.decapsulate(addr(A_ADDR), &stale, &mut out, now) {
        Decapsulated::ToNetwork { to, len, .. } => {
            assert_eq!(to, addr(A_ADDR));
            out[..len].to_vec()
        }
        other => panic!("expected a reactive handshake, got {other:?}"),
    };
    // A answers it; B completes and learns A's endpoint; data flows again.
    let resp = match a.decapsulate(addr(B_ADDR), &init, &mut out, now) {
        Decapsulated::ToNetwork { len, .. } => out[..len].to_vec(),
        other => panic!("A must accept the new handshake at once, got {other:?}"),
    };
    assert!(matches!(
        b2.decapsulate(addr(A_ADDR), &resp, &mut out, now),
        Decapsulated::ToNetwork { .. }
    ));
    let back = ipv4([10, 2, 0, 7], [10, 1, 0, 5], b"after");
    let (_, at_a) = deliver(&b2, addr(B_ADDR), &a, addr(A_ADDR), &back);
    assert_eq!(at_a, vec![back]);
}

#[test]
fn configuration_errors() {
    let k = PrivateKey::generate();
    let other = PrivateKey::generate();
    let err = Device::new(k.clone(), vec![peer("self", &k, None, "10.0.0.0/8")]).expect_err("own");
    assert!(err.to_string().contains("own public key"));
    let err = Device::new(
        k,
        vec![
            peer("x", &other, None, "10.0.0.0/8"),
            peer("y", &other, None, "10.0.0.0/8"),
        ],
    )
    .expect_err("dup");
    assert!(err.to_string().contains("\"x\" and \"y\""), "{err}");
}

#[test]
fn receiver_indices_map_back_to_peers() {
    let k = PrivateKey::generate();
    let peers: Vec<_> = (0..20u8)
        .map(|i| {
            let ep = format!("198.18.1.{i}:51820");
            peer(
                &format!("p{i}"),
                &PrivateKey::generate(),
                Some(&ep),
                "10.0.0.0/8",
            )
        })
        .collect();
    let d = Device::new(k, peers).expect("ok");
    let mut out = vec![0u8; 256];
    let mut seen = Vec::new();
    d.initiate_all(&mut out, Instant::now(), |to, bytes| {
        let sender = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
        seen.push((to, sender));
    });
    assert_eq!(seen.len(), 20, "one initiation per peer with an endpoint");
    for (to, sender) in seen {
        let p = d
            .find_by_receiver_index(sender)
            .expect("index belongs to a peer");
        assert_eq!(
            d.config(p).endpoint,
            Some(to),
            "index {sender:#x} resolved to the wrong peer"
        );
    }
}

#[test]
fn messages_are_classified_by_the_protocol_parser() {
    let now = Instant::now();
    let mut out = vec![0u8; 2048];
    let p1 = ipv4([10, 1, 0, 5], [10, 2, 0, 7], b"first");
    // Without a session the packet waits and an initiation goes out instead.
    let fresh = pair();
    let Encapsulated::Send { len, kind, .. } =
        fresh.a.encapsulate(PeerIndex(0), &p1, &mut out, now)
    else {
        panic!("an initiation must be sent");
    };
    assert_eq!(kind, MessageKind::HandshakeInit);
    assert_eq!(
        MessageKind::of(&out[..len]),
        Some(MessageKind::HandshakeInit)
    );
    assert_eq!(
        fresh.b.data_message_peer(&out[..len]),
        None,
        "an initiation names no receiver"
    );

    let Pair { a, b, .. } = pair();
    deliver(&a, addr(A_ADDR), &b, addr(B_ADDR), &p1);
    let p2 = ipv4([10, 1, 0, 5], [10, 2, 0, 7], b"second");
    let Encapsulated::Send { len, kind, .. } = a.encapsulate(PeerIndex(0), &p2, &mut out, now)
    else {
        panic!("a data message must be sent once the session exists");
    };
    assert_eq!(kind, MessageKind::Data);
    let data = out[..len].to_vec();
    assert_eq!(b.data_message_peer(&data), Some(PeerIndex(0)));
    assert_eq!(
        a.data_message_peer(&data),
        None,
        "the receiver index is B's, unknown to A"
    );

    // The parser checks the reserved bytes and exact lengths a type byte alone would not.
    let mut reserved = data.clone();
    reserved[1] = 1;
    assert_eq!(MessageKind::of(&reserved), None);
    assert_eq!(b.data_message_peer(&reserved), None);
    assert_eq!(
        MessageKind::of(&data[..31]),
        None,
        "shorter than a keepalive"
    );
    assert_eq!(
        MessageKind::of(&[1, 0, 0, 0, 9]),
        None,
        "a truncated initiation"
    );
}
