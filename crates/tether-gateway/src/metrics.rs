//! Gateway metrics: per-peer counters read from the WireGuard device at scrape time (no
//! bookkeeping on the packet path), IO loop errors, and kernel reconcile outcomes.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use tether_wg::Device;

use crate::dataplane::IoCounters;

/// Labels of reconcile outcomes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `success` or `failure`.
    pub result: &'static str,
}

/// Kernel reconcile counters, updated by the reconcile loop.
#[derive(Clone, Debug, Default)]
pub struct KernelMetrics {
    /// Reconciles by result.
    pub reconciles: Family<ResultLabels, Counter>,
    /// Kernel operations applied.
    pub ops_applied: Counter,
    /// Kernel operations that failed.
    pub ops_failed: Counter,
    /// Reconciles that found our objects changed from outside.
    pub drift: Counter,
}

impl KernelMetrics {
    /// Registers the families under `registry` (already prefixed by the caller).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kernel_reconciles",
            "Kernel reconciles by result",
            self.reconciles.clone(),
        );
        registry.register(
            "kernel_ops_applied",
            "Kernel operations applied",
            self.ops_applied.clone(),
        );
        registry.register(
            "kernel_ops_failed",
            "Kernel operations that failed",
            self.ops_failed.clone(),
        );
        registry.register(
            "kernel_drift",
            "Reconciles that found owned kernel objects changed from outside and repaired them",
            self.drift.clone(),
        );
    }
}

/// Reads per-peer state from the device on each scrape.
#[derive(Debug)]
pub struct PeerCollector {
    device: Arc<Device>,
    io: Arc<IoCounters>,
}

impl PeerCollector {
    /// A collector over `device` and the loops' `io` counters.
    pub fn new(device: Arc<Device>, io: Arc<IoCounters>) -> Self {
        Self { device, io }
    }
}

fn counter(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    series: &[(Vec<(&'static str, String)>, u64)],
) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in series {
        ConstCounter::new(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

fn gauge(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    series: &[(Vec<(&'static str, String)>, f64)],
) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in series {
        ConstGauge::new(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

impl Collector for PeerCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let now = Instant::now();
        let stats: Vec<_> = self
            .device
            .peers()
            .map(|p| self.device.stats(p, now))
            .collect();
        let peer = |id: &str| vec![("peer", id.to_owned())];
        macro_rules! per_peer {
            ($name:literal, $help:literal, $field:ident) => {{
                let s: Vec<_> = stats.iter().map(|s| (peer(&s.id), s.$field)).collect();
                counter(&mut enc, $name, $help, &s)?;
            }};
        }
        per_peer!(
            "peer_rx_bytes",
            "Bytes received from the peer (UDP payload)",
            rx_bytes
        );
        per_peer!(
            "peer_rx_packets",
            "Authenticated datagrams received from the peer",
            rx_packets
        );
        per_peer!(
            "peer_tx_bytes",
            "Bytes sent to the peer (UDP payload)",
            tx_bytes
        );
        per_peer!("peer_tx_packets", "Datagrams sent to the peer", tx_packets);
        per_peer!(
            "peer_handshakes",
            "WireGuard handshakes completed with the peer",
            handshakes
        );
        per_peer!(
            "peer_handshake_failures",
            "Handshakes that failed: unanswered initiations (wrong key or peer down) or messages that did not verify",
            handshake_failures
        );
        let drops: Vec<_> = stats
            .iter()
            .flat_map(|s| {
                s.drops.iter().map(|(r, n)| {
                    (
                        vec![("peer", s.id.clone()), ("reason", r.as_str().to_owned())],
                        *n,
                    )
                })
            })
            .collect();
        counter(
            &mut enc,
            "peer_drops",
            "Packets of the peer dropped, by reason",
            &drops,
        )?;
        let up: Vec<_> = stats
            .iter()
            .map(|s| (peer(&s.id), if s.has_session { 1.0 } else { 0.0 }))
            .collect();
        gauge(
            &mut enc,
            "peer_session_up",
            "1 when a WireGuard session with the peer is usable",
            &up,
        )?;
        let age: Vec<_> = stats
            .iter()
            .filter_map(|s| s.last_handshake_age.map(|a| (peer(&s.id), a.as_secs_f64())))
            .collect();
        gauge(
            &mut enc,
            "peer_last_handshake_age_seconds",
            "Seconds since the last completed handshake",
            &age,
        )?;
        let rtt: Vec<_> = stats
            .iter()
            .filter_map(|s| s.handshake_rtt.map(|r| (peer(&s.id), r.as_secs_f64())))
            .collect();
        gauge(
            &mut enc,
            "peer_rtt_seconds",
            "Round-trip time through the underlay, measured on the last handshake this gateway initiated",
            &rtt,
        )?;
        let d = self.device.counters();
        let rejected = [
            ("invalid_mac", d.invalid_mac()),
            ("unknown_key", d.unknown_key()),
            ("unknown_index", d.unknown_index()),
            ("malformed", d.malformed()),
        ]
        .map(|(r, n)| (vec![("reason", r.to_owned())], n));
        counter(
            &mut enc,
            "rejected_datagrams",
            "Datagrams not attributable to a configured peer (invalid_mac: sender has a wrong public key for us; unknown_key: sender's key is not a configured peer)",
            &rejected,
        )?;
        let io = [
            ("udp_send", self.io.udp_send_errors.load(Relaxed)),
            ("udp_recv", self.io.udp_recv_errors.load(Relaxed)),
            ("tun_read", self.io.tun_read_errors.load(Relaxed)),
            ("tun_write", self.io.tun_write_errors.load(Relaxed)),
        ]
        .map(|(r, n)| (vec![("op", r.to_owned())], n));
        counter(&mut enc, "io_errors", "IO errors of the packet loops", &io)?;
        let batching = [
            ("tun_reads", self.io.tun_reads.load(Relaxed)),
            ("tun_read_packets", self.io.tun_read_packets.load(Relaxed)),
            ("tun_write_packets", self.io.tun_write_packets.load(Relaxed)),
            ("udp_recv_calls", self.io.udp_recv_calls.load(Relaxed)),
            (
                "udp_recv_datagrams",
                self.io.udp_recv_datagrams.load(Relaxed),
            ),
        ]
        .map(|(r, n)| (vec![("what", r.to_owned())], n));
        counter(
            &mut enc,
            "io_batching",
            "Calls and packets of the batched IO paths (packets per call shows how well offload and GRO batch)",
            &batching,
        )?;
        counter(
            &mut enc,
            "udp_gso_segments",
            "Datagrams sent in multi-segment GSO batches",
            &[(Vec::new(), self.io.gso_segments.load(Relaxed))],
        )?;
        Ok(())
    }
}
