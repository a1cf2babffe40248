//! Issue #10 resilience end to end, on one pair of peered simulated clusters that both use pod
//! CIDR 10.244.0.0/16: a deleted gateway pod (on the server's side, then the client's) is
//! replaced and cross-cluster traffic resumes; a restart of both controllers keeps the remaps,
//! the tunnel and the traffic; an upgrade (`tether install` again with another image tag) rolls
//! the controller, the fabric and the gateways and keeps the remaps and the traffic. Traffic is
//! TCP between pods through the remap, probed from inside a pod's network namespace; the gaps
//! are printed (`--nocapture`), not asserted. Needs root; in CI it must run.

mod e2e;

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use e2e::net::{echo_pod, nodes, pod_ip, remapped, talk, view_of};
use e2e::{Env, Sim};

const GATEWAY: &str = "tether.dev/component=gateway";
const CONTROLLER: &str = "app.kubernetes.io/name=tether-controller";
const FABRIC: &str = "app.kubernetes.io/name=tether-fabric";
const UPGRADE_IMAGE: &str = "ghcr.io/tether-dev/tetherd:v0.1.1";
/// How long traffic may take to come back after a disruption; generous, as CI machines are slow.
const RESUME_WITHIN: Duration = Duration::from_secs(60);
/// How long traffic must flow uninterrupted to count as back.
const STEADY: Duration = Duration::from_secs(2);

/// One side of the peering: its cluster, its ID and the peer's, and the probe it sends.
struct Side {
    sim: Sim,
    id: &'static str,
    remote: &'static str,
    /// The network namespace of this side's echo pod, where its probes start.
    netns: String,
    /// The peer's echo pod through this side's remap.
    target: SocketAddr,
    /// The peer's echo pod's name, which its answers carry.
    target_pod: String,
    /// How the peer addresses this side's pods: the source its answers must report.
    seen_as: ipnet::Ipv4Net,
}

impl Side {
    /// `local` and `peer` are (cluster, ID, echo pod); `view` is how the local side addresses
    /// the peer's pods, `back` how the peer addresses the local side's.
    fn new(
        local: (&Sim, &'static str, &str),
        peer: (&Sim, &'static str, &str),
        view: &str,
        back: &str,
    ) -> Side {
        let (sim, id, own_pod) = local;
        pod_ip(sim, own_pod);
        Side {
            sim: sim.clone(),
            id,
            remote: peer.1,
            netns: sandbox(sim, own_pod),
            target: SocketAddr::from((remapped(view, pod_ip(peer.0, peer.2)), 7000)),
            target_pod: peer.2.to_owned(),
            seen_as: back
                .parse()
                .unwrap_or_else(|e| panic!("remap {back:?}: {e}")),
        }
    }
}

#[test]
fn gateway_loss_controller_restart_and_upgrade_keep_peered_traffic_flowing() {
    let Some(mut env) = Env::new("resil") else {
        return;
    };
    let a = env.up_nodes("a", 2, &[]);
    let b = env.up_nodes("b", 2, &[]);
    a.install("alpha", &[]);
    b.install("beta", &[]);
    a.tether(&[
        "peer",
        "--remote-kubeconfig",
        b.kubeconfig(),
        "--timeout",
        "4m",
    ])
    .ok();

    // An echo pod on the last node of each cluster, so traffic crosses the fabric as well.
    for (sim, pod) in [(&a, "echo-a"), (&b, "echo-b")] {
        let node = nodes(sim).pop().expect("a node");
        sim.apply_as(
            std::path::Path::new(sim.kubeconfig()),
            &echo_pod(pod, &node),
        )
        .ok();
    }
    let (a_view, b_view) = (view_of(&a, "beta"), view_of(&b, "alpha"));
    let sides = [
        Side::new(
            (&a, "alpha", "echo-a"),
            (&b, "beta", "echo-b"),
            &a_view,
            &b_view,
        ),
        Side::new(
            (&b, "beta", "echo-b"),
            (&a, "alpha", "echo-a"),
            &b_view,
            &a_view,
        ),
    ];
    for s in &sides {
        wait_connected(s);
    }
    measure(
        &sides,
        "after peering",
        RESUME_WITHIN,
        &std::thread::spawn(|| ()),
    );
    let before = remaps(&sides);

    // 1. The gateway pod dies, on the server's side and then on the client's.
    let server = sides
        .iter()
        .position(|s| {
            !s.sim
                .names(&["gatewayservers.networking.tether.dev", "-A"])
                .is_empty()
        })
        .expect("one side runs the gateway server");
    for (role, s) in [("server", &sides[server]), ("client", &sides[1 - server])] {
        let (ns, old) = gateway_pod(&s.sim);
        let deleted = Instant::now();
        s.sim
            .kubectl(&["delete", "pod", "-n", &ns, &old, "--wait=false"])
            .ok();
        let ready = watch_ready(&s.sim, &ns, &old);
        let gap = measure(
            &sides,
            &format!("{role} gateway pod {old} deleted"),
            RESUME_WITHIN,
            &ready,
        );
        let ready = finish(ready).expect("the new gateway pod was seen Ready");
        report(
            &format!("{role} gateway deleted ({})", s.id),
            deleted,
            Some(ready),
            &gap,
        );
        for s in &sides {
            wait_connected(s);
        }
        talk_across(&sides, &format!("after-{role}"));
    }
    assert_eq!(remaps(&sides), before, "a gateway's loss changed a remap");

    // 2. Both controllers restart: nothing of the data path is redone.
    let gateways: Vec<String> = sides.iter().map(|s| gateway_pod(&s.sim).1).collect();
    let started = Instant::now();
    let restarted = {
        let clusters: Vec<(Sim, &'static str)> =
            sides.iter().map(|s| (s.sim.clone(), s.id)).collect();
        std::thread::spawn(move || {
            let old: Vec<Vec<u32>> = clusters
                .iter()
                .map(|(sim, id)| sim.controller_pids(id))
                .collect();
            for ((sim, _), old) in clusters.iter().zip(&old) {
                assert!(!old.is_empty(), "no controller process on {}", sim.name);
                sim.kubectl(&[
                    "delete",
                    "pod",
                    "-n",
                    "tether-system",
                    "-l",
                    CONTROLLER,
                    "--wait=false",
                ])
                .ok();
            }
            for ((sim, id), old) in clusters.iter().zip(&old) {
                sim.wait(
                    "a new controller process, Ready",
                    Duration::from_secs(60),
                    || {
                        let now = sim.controller_pids(id);
                        !now.is_empty()
                            && now.iter().all(|p| !old.contains(p))
                            && deployment_ready(sim, "tether-system", "tether-controller")
                    },
                );
            }
        })
    };
    let gap = measure(&sides, "controllers restarted", RESUME_WITHIN, &restarted);
    finish(restarted);
    report("controllers restarted (both)", started, None, &gap);
    for s in &sides {
        wait_connected(s);
    }
    assert_eq!(
        remaps(&sides),
        before,
        "a controller restart changed a remap"
    );
    let after: Vec<String> = sides.iter().map(|s| gateway_pod(&s.sim).1).collect();
    assert_eq!(
        after, gateways,
        "a controller restart replaced a gateway pod"
    );
    talk_across(&sides, "after-restart");

    // 3. An upgrade: install again with another tag; everything running that image rolls.
    let started = Instant::now();
    let upgraded = {
        let clusters: Vec<(Sim, &'static str, &'static str)> = sides
            .iter()
            .map(|s| (s.sim.clone(), s.id, s.remote))
            .collect();
        std::thread::spawn(move || {
            for (sim, id, _) in &clusters {
                let run = sim.install(id, &["--image", UPGRADE_IMAGE]);
                assert!(run.stdout.contains(id), "{}", run.stdout);
            }
            for (sim, _, remote) in &clusters {
                let ns = format!("tether-tenant-{remote}");
                sim.wait(
                    &format!("every Tether pod on {UPGRADE_IMAGE} and Ready"),
                    Duration::from_secs(120),
                    || {
                        all_on(sim, "tether-system", CONTROLLER)
                            && all_on(sim, "tether-system", FABRIC)
                            && all_on(sim, &ns, GATEWAY)
                    },
                );
            }
        })
    };
    // The upgrade itself takes a while (two installs, then the rollouts): traffic must be
    // steady within the usual bound of its end.
    let gap = measure(
        &sides,
        "upgraded",
        Duration::from_secs(240) + RESUME_WITHIN,
        &upgraded,
    );
    finish(upgraded);
    report(&format!("upgrade to {UPGRADE_IMAGE}"), started, None, &gap);
    for s in &sides {
        wait_connected(s);
    }
    assert_eq!(remaps(&sides), before, "the upgrade changed a remap");
    talk_across(&sides, "after-upgrade");
}

/// The result of a finished background step, its panic re-raised here.
fn finish<T>(handle: std::thread::JoinHandle<T>) -> T {
    handle
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// The sandbox network namespace of `pod` (pods are processes in namespaces here).
fn sandbox(sim: &Sim, pod: &str) -> String {
    let uid = sim.jsonpath(&["pod", pod], "{.metadata.uid}");
    simkube_cluster::net::netns_with_prefix(&format!("sk.{}.", sim.name))
        .into_iter()
        .find(|ns| ns.ends_with(&uid))
        .unwrap_or_else(|| panic!("no sandbox namespace for pod {pod} ({uid}) on {}", sim.name))
}

/// One TCP exchange from inside `netns`: the echo's answer, or why there was none. Timeouts are
/// short: the path is local, and a lost SYN should count as a failed probe, not wait for TCP's
/// one-second retransmission.
fn exchange(netns: &str, target: SocketAddr) -> Result<String, String> {
    let file =
        std::fs::File::open(std::path::Path::new(simkube_cluster::net::NETNS_DIR).join(netns))
            .map_err(|e| format!("open namespace {netns}: {e}"))?;
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(|e| format!("enter {netns}: {e}"))?;
                let timeout = Duration::from_millis(250);
                let err = |e: std::io::Error| e.to_string();
                let mut s = TcpStream::connect_timeout(&target, timeout).map_err(err)?;
                s.set_read_timeout(Some(timeout)).map_err(err)?;
                writeln!(s, "probe").map_err(err)?;
                let mut line = String::new();
                BufReader::new(s).read_line(&mut line).map_err(err)?;
                Ok(line)
            })
            .join()
            .unwrap_or_else(|_| Err("the probe thread panicked".to_owned()))
    })
}

/// One probe from `s`: the peer's echo pod answers, and saw it through its remap of this side.
fn probe(s: &Side) -> Result<(), String> {
    let answer =
        exchange(&s.netns, s.target).map_err(|e| format!("{} → {}: {e}", s.id, s.target))?;
    let seen = answer
        .split_whitespace()
        .find_map(|w| w.strip_prefix("peer="))
        .and_then(|p| p.parse::<SocketAddr>().ok());
    let through_remap = matches!(seen, Some(SocketAddr::V4(a)) if s.seen_as.contains(a.ip()));
    if answer.starts_with(&format!("pod={} ", s.target_pod)) && through_remap {
        Ok(())
    } else {
        Err(format!(
            "{} → {}: unexpected answer {:?} (wanted {} seeing an address of {})",
            s.id,
            s.target,
            answer.trim(),
            s.target_pod,
            s.seen_as
        ))
    }
}

/// What [`measure`] saw: how often traffic failed, when first, and since when it has flowed.
struct Gap {
    failures: u32,
    first_failure: Option<Instant>,
    /// The first probe of the final unbroken run of successes.
    resumed: Instant,
}

/// Probes both ways every 20 ms until `background` has finished and both ways have answered
/// since without a break for [`STEADY`]; panics (with `what`) unless that happens within
/// `limit`.
fn measure<T>(
    sides: &[Side],
    what: &str,
    limit: Duration,
    background: &std::thread::JoinHandle<T>,
) -> Gap {
    let start = Instant::now();
    let mut gap = Gap {
        failures: 0,
        first_failure: None,
        resumed: start,
    };
    let mut done: Option<Instant> = None;
    let mut streak: Option<Instant> = None;
    let mut last_error = String::new();
    loop {
        let now = Instant::now();
        if done.is_none() && background.is_finished() {
            done = Some(now);
        }
        match sides.iter().try_for_each(probe) {
            Ok(()) => {
                let since = *streak.get_or_insert(now);
                if let Some(done) = done
                    && now.duration_since(since.max(done)) >= STEADY
                {
                    gap.resumed = since;
                    return gap;
                }
            }
            Err(e) => {
                gap.failures += 1;
                gap.first_failure.get_or_insert(now);
                streak = None;
                last_error = e;
            }
        }
        assert!(
            start.elapsed() < tether_testkit::patience(limit),
            "{what}: cross-cluster traffic did not flow steadily within {limit:?} ({} failed \
             probes; last: {last_error})",
            gap.failures
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Prints the figures of one disruption (visible with `--nocapture`).
fn report(what: &str, start: Instant, ready: Option<Instant>, gap: &Gap) {
    let ms = |d: Duration| d.as_millis();
    let signed = |from: Instant, to: Instant| {
        if to >= from {
            format!("{} ms", ms(to - from))
        } else {
            format!("-{} ms", ms(from - to))
        }
    };
    let mut line = match gap.first_failure {
        Some(first) => format!(
            "{what}: traffic down from +{} to +{} ms ({} failed probes); resumed {} after the \
             disruption began",
            ms(first - start),
            ms(gap.resumed - start),
            gap.failures,
            signed(start, gap.resumed)
        ),
        None => format!("{what}: no probe failed"),
    };
    if let Some(ready) = ready {
        line.push_str(&format!(
            ", {} after the new pod was seen Ready (+{} ms)",
            signed(ready, gap.resumed),
            ms(ready - start)
        ));
    }
    eprintln!("RESILIENCE {line}");
}

/// A traffic pod each way, as [`talk`] runs it: the peer answered every message and saw the
/// caller through its remap.
fn talk_across(sides: &[Side], label: &str) {
    for s in sides {
        let node = nodes(&s.sim).pop().expect("a node");
        let seen = talk(
            &s.sim,
            &format!("{label}-{}", s.id),
            &node,
            "tcp",
            &s.target.to_string(),
        );
        assert_eq!(seen.len(), 3, "{label}: {} → {}: {seen:?}", s.id, s.target);
        for addr in &seen {
            let addr: Ipv4Addr = addr.parse().expect("peer address");
            assert!(
                s.seen_as.contains(&addr),
                "{label}: the receiver saw {addr}"
            );
        }
    }
}

/// The remapped CIDRs each side holds for the other.
fn remaps(sides: &[Side]) -> Vec<String> {
    sides
        .iter()
        .map(|s| {
            let cidr = s.sim.jsonpath(
                &[
                    "configurations.networking.tether.dev",
                    "-n",
                    &format!("tether-tenant-{}", s.remote),
                    s.remote,
                ],
                "{.status.remote.cidr}",
            );
            assert!(!cidr.is_empty(), "{} has no remap of {}", s.id, s.remote);
            cidr
        })
        .collect()
}

fn wait_connected(s: &Side) {
    s.sim
        .wait("the Connection Connected", Duration::from_secs(60), || {
            s.sim.jsonpath(
                &[
                    "connections.networking.tether.dev",
                    "-n",
                    &format!("tether-tenant-{}", s.remote),
                    "tether-gateway",
                ],
                "{.status.value}",
            ) == "Connected"
        });
}

/// The namespace and name of the cluster's one gateway pod.
fn gateway_pod(sim: &Sim) -> (String, String) {
    let mut found = String::new();
    sim.wait("one gateway pod", Duration::from_secs(30), || {
        found = sim.jsonpath(
            &["pods", "-A", "-l", GATEWAY],
            "{range .items[*]}{.metadata.namespace} {.metadata.name}{\"\\n\"}{end}",
        );
        found.lines().count() == 1
    });
    let (ns, name) = found.trim().split_once(' ').expect("namespace and name");
    (ns.to_owned(), name.to_owned())
}

/// Watches, on a thread, for a gateway pod in `ns` other than `old` to be Ready;
/// gives the moment it was first seen so (polling every 50 ms), or `None` after a minute.
fn watch_ready(sim: &Sim, ns: &str, old: &str) -> std::thread::JoinHandle<Option<Instant>> {
    let (sim, ns, old) = (sim.clone(), ns.to_owned(), old.to_owned());
    std::thread::spawn(move || {
        let deadline = Instant::now() + tether_testkit::patience(RESUME_WITHIN);
        while Instant::now() < deadline {
            let pods = sim.jsonpath(
                &["pods", "-n", &ns, "-l", GATEWAY],
                "{range .items[*]}{.metadata.name} \
                 {.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
            );
            let ready = pods.lines().any(|l| {
                l.split_once(' ')
                    .is_some_and(|(name, status)| name != old && status == "True")
            });
            if ready {
                return Some(Instant::now());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    })
}

fn deployment_ready(sim: &Sim, ns: &str, name: &str) -> bool {
    let status = sim.jsonpath(
        &["deployment", "-n", ns, name],
        "{.status.replicas} {.status.updatedReplicas} {.status.readyReplicas}",
    );
    let fields: Vec<&str> = status.split_whitespace().collect();
    fields.len() == 3 && fields.iter().all(|f| *f == fields[0]) && fields[0] != "0"
}

/// Whether every pod matching `selector` in `ns` runs [`UPGRADE_IMAGE`] and is Ready (and
/// there is at least one).
fn all_on(sim: &Sim, ns: &str, selector: &str) -> bool {
    let pods = sim.jsonpath(
        &["pods", "-n", ns, "-l", selector],
        "{range .items[*]}{.spec.containers[0].image} \
         {.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
    );
    pods.lines().count() > 0
        && pods
            .lines()
            .all(|l| l.trim() == format!("{UPGRADE_IMAGE} True"))
}
