//! Measures how long the kernel adapter takes to apply, re-check, repair and tear down a gateway
//! plan with 1, 16 and 64 peers, in a throwaway network namespace (root required).
//!
//! Run with `cargo run --release -p tether-kernel --example reconcile_bench`.

use std::error::Error;
use std::time::{Duration, Instant};

use ipnet::Ipv4Net;
use tether_kernel::{Kernel, KernelConfig};
use tether_netplan::{CidrMapping, GatewayInput, LocalNetworks, PeerInput};
use tether_testkit::Netns;

const NOOP_ROUNDS: usize = 20;

fn input(peers: usize) -> Result<GatewayInput, Box<dyn Error>> {
    let mut list = Vec::with_capacity(peers);
    for i in 0..peers {
        let tunnel: Ipv4Net = format!("169.254.{}.{}/30", i / 64, (i % 64) * 4 + 1).parse()?;
        list.push(PeerInput {
            id: format!("cluster-{i}"),
            interface: format!("tether-{i}"),
            tunnel_address: Some(tunnel),
            // Every peer overlaps with us and with each other: the worst case for remapping.
            pod: CidrMapping::remapped(
                "10.0.0.0/16".parse()?,
                format!("10.{}.0.0/16", 100 + i).parse()?,
            ),
            external: None,
        });
    }
    Ok(GatewayInput {
        pod_interfaces: vec!["pods0".to_owned()],
        local: LocalNetworks {
            pod_cidrs: vec!["10.0.0.0/16".parse()?],
            external_cidr: None,
        },
        peers: list,
        ..GatewayInput::default()
    })
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn bench(peers: usize) -> Result<(), Box<dyn Error>> {
    let ns = Netns::new(&format!("bench-{peers}"))?;
    ns.ip(&[
        "link", "add", "pods0", "type", "veth", "peer", "name", "pods1",
    ])?;
    ns.ip(&["link", "set", "pods0", "up"])?;
    for i in 0..peers {
        let name = format!("tether-{i}");
        ns.ip(&["tuntap", "add", "dev", &name, "mode", "tun"])?;
        ns.ip(&["link", "set", &name, "up"])?;
    }
    let input = input(peers)?;
    let plan = tether_netplan::plan(&input)?;
    let objects = plan.routes.len() + plan.rules.len() + plan.addresses.len() + plan.sysctls.len();
    let result: Result<_, String> = ns.run_async(|| async {
        let mut kernel =
            Kernel::new(KernelConfig::new(input.ownership())).map_err(|e| e.to_string())?;
        let started = Instant::now();
        let first = kernel.reconcile(&plan).await.map_err(|e| e.to_string())?;
        let apply = started.elapsed();
        if !first.is_success() {
            return Err(format!("apply failed: {:?}", first.failed));
        }
        let mut noop = Vec::with_capacity(NOOP_ROUNDS);
        for _ in 0..NOOP_ROUNDS {
            let started = Instant::now();
            let report = kernel.reconcile(&plan).await.map_err(|e| e.to_string())?;
            noop.push(started.elapsed());
            if !report.is_noop() {
                return Err(format!(
                    "steady state was not a no-op: {:?}",
                    report.applied
                ));
            }
        }
        ns.ip(&["route", "del", "10.0.0.0/16", "table", "7700"])
            .map_err(|e| e.to_string())?;
        ns.exec_ok(&["nft", "delete", "table", "ip", "tether"])
            .map_err(|e| e.to_string())?;
        let started = Instant::now();
        let repair = kernel.reconcile(&plan).await.map_err(|e| e.to_string())?;
        let repair_time = started.elapsed();
        if !repair.drift_detected || repair.applied.len() != 2 {
            return Err(format!("unexpected repair: {:?}", repair.applied));
        }
        let started = Instant::now();
        let down = kernel.teardown().await.map_err(|e| e.to_string())?;
        let teardown = started.elapsed();
        Ok((
            apply,
            first.applied.len(),
            median(noop),
            repair_time,
            teardown,
            down.applied.len(),
        ))
    });
    let (apply, ops, noop, repair, teardown, removed) = result?;
    println!(
        "{peers:>3} peers ({objects} kernel objects + {} nft lines): apply {ops} ops in {}, \
         no-op reconcile {} (median of {NOOP_ROUNDS}), repair route+table {}, \
         teardown {removed} ops in {}",
        plan.nft.render().lines().count(),
        ms(apply),
        ms(noop),
        ms(repair),
        ms(teardown),
    );
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    if let Some(reason) = tether_testkit::missing_requirement(&[]) {
        return Err(format!("cannot run the benchmark: {reason}").into());
    }
    for peers in [1, 16, 64] {
        bench(peers)?;
    }
    Ok(())
}
