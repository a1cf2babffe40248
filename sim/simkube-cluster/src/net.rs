//! The cluster's network plumbing with iproute2: the underlay namespace, the cluster bridge,
//! node namespaces with their veths, the LoadBalancer route; and their removal, which tolerates
//! anything already gone (it also runs after crashes).

use std::path::Path;
use std::process::{Command, Stdio};

use crate::Error;
use crate::topology::{NodePlan, Plan};

/// Where `ip netns` keeps named namespaces.
pub const NETNS_DIR: &str = "/run/netns";

/// Runs `ip <args>`; its stderr becomes the error.
pub fn ip(args: &[&str]) -> Result<String, Error> {
    run("ip", args)
}

fn run(program: &str, args: &[&str]) -> Result<String, Error> {
    let command = format!("{program} {}", args.join(" "));
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::Command {
            command: command.clone(),
            message: e.to_string(),
        })?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(Error::Command {
            command,
            message: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}

/// Whether the named namespace exists.
pub fn netns_exists(name: &str) -> bool {
    Path::new(NETNS_DIR).join(name).exists()
}

/// Named namespaces whose name starts with `prefix`.
pub fn netns_with_prefix(prefix: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(NETNS_DIR) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(prefix))
        .collect();
    names.sort();
    names
}

/// Deletes a named namespace; a missing one is fine.
pub fn delete_netns(name: &str) -> Result<(), Error> {
    if !netns_exists(name) {
        return Ok(());
    }
    match ip(&["netns", "delete", name]) {
        Ok(_) => Ok(()),
        Err(_) if !netns_exists(name) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Creates the underlay namespace if missing, with loopback up and forwarding on.
pub fn ensure_underlay(underlay: &str) -> Result<(), Error> {
    if !netns_exists(underlay) {
        ip(&["netns", "add", underlay])?;
    }
    ip(&["-n", underlay, "link", "set", "lo", "up"])?;
    run(
        "ip",
        &[
            "netns",
            "exec",
            underlay,
            "sysctl",
            "-qw",
            "net.ipv4.ip_forward=1",
        ],
    )?;
    Ok(())
}

/// Creates a `--behind-nat` cluster's router namespace, joined to the underlay by a veth
/// (`skr<X>` there, `uplink` inside) on its transit /31, with forwarding on, a default route
/// to the underlay and the masquerading rules.
pub fn create_router(underlay: &str, plan: &Plan) -> Result<(), Error> {
    let rtr = crate::topology::router_netns(&plan.name);
    let veth = crate::topology::router_veth(plan.index);
    let (outer, inner) = crate::topology::router_transit(plan.index);
    ip(&["netns", "add", &rtr])?;
    ip(&["-n", &rtr, "link", "set", "lo", "up"])?;
    run(
        "ip",
        &[
            "netns",
            "exec",
            &rtr,
            "sysctl",
            "-qw",
            "net.ipv4.ip_forward=1",
        ],
    )?;
    ip(&[
        "-n", underlay, "link", "add", &veth, "type", "veth", "peer", "name", "uplink", "netns",
        &rtr,
    ])?;
    ip(&[
        "-n",
        underlay,
        "addr",
        "add",
        &format!("{outer}/31"),
        "dev",
        &veth,
    ])?;
    ip(&["-n", underlay, "link", "set", &veth, "up"])?;
    ip(&[
        "-n",
        &rtr,
        "addr",
        "add",
        &format!("{inner}/31"),
        "dev",
        "uplink",
    ])?;
    ip(&["-n", &rtr, "link", "set", "uplink", "up"])?;
    ip(&[
        "-n",
        &rtr,
        "route",
        "add",
        "default",
        "via",
        &outer.to_string(),
    ])?;
    apply_nft(&rtr, &crate::topology::router_rules())
}

/// Creates the cluster's bridge (with the gateway address) in the underlay.
pub fn create_bridge(underlay: &str, plan: &Plan) -> Result<(), Error> {
    let bridge = plan.bridge();
    let gateway = format!("{}/24", plan.gateway());
    ip(&["-n", underlay, "link", "add", &bridge, "type", "bridge"])?;
    ip(&["-n", underlay, "addr", "add", &gateway, "dev", &bridge])?;
    ip(&["-n", underlay, "link", "set", &bridge, "up"])?;
    Ok(())
}

/// Creates node `node`'s namespace, its `eth0` on the cluster bridge, address and default route.
pub fn create_node(underlay: &str, plan: &Plan, node: &NodePlan) -> Result<(), Error> {
    ip(&["netns", "add", &node.netns])?;
    let ns = node.netns.as_str();
    ip(&["-n", ns, "link", "set", "lo", "up"])?;
    ip(&[
        "-n",
        underlay,
        "link",
        "add",
        &node.underlay_veth,
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        ns,
    ])?;
    ip(&[
        "-n",
        underlay,
        "link",
        "set",
        &node.underlay_veth,
        "master",
        &plan.bridge(),
        "up",
    ])?;
    let addr = format!("{}/24", node.ip);
    ip(&["-n", ns, "addr", "add", &addr, "dev", "eth0"])?;
    ip(&["-n", ns, "link", "set", "eth0", "up"])?;
    ip(&[
        "-n",
        ns,
        "route",
        "add",
        "default",
        "via",
        &plan.gateway().to_string(),
    ])?;
    Ok(())
}

/// Routes the cluster's LoadBalancer pool from the underlay to its nodes (ECMP).
pub fn route_lb_pool(underlay: &str, plan: &Plan) -> Result<(), Error> {
    let net = plan.lb_net().to_string();
    let mut args = vec!["-n", underlay, "route", "replace", net.as_str()];
    let hops: Vec<String> = plan.node_plans().iter().map(|n| n.ip.to_string()).collect();
    if hops.len() == 1 {
        args.extend(["via", hops[0].as_str()]);
    } else {
        for hop in &hops {
            args.extend(["nexthop", "via", hop.as_str()]);
        }
    }
    ip(&args)?;
    Ok(())
}

/// Applies an nftables script inside the underlay (one transaction, read from stdin).
pub fn apply_nft(underlay: &str, script: &str) -> Result<(), Error> {
    use std::io::Write as _;
    let command = format!("ip netns exec {underlay} nft -f -");
    let failed = |message: String| Error::Command {
        command: command.clone(),
        message,
    };
    let mut child = Command::new("ip")
        .args(["netns", "exec", underlay, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| failed(e.to_string()))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .map_err(|e| failed(e.to_string()))?;
    }
    let output = child
        .wait_with_output()
        .map_err(|e| failed(e.to_string()))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(failed(
            String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        ))
    }
}

/// Removes everything of cluster `plan` from the underlay and every `sk.<name>.` namespace.
/// Returns what could not be removed (as errors to report), after trying all of it.
pub fn remove_cluster(underlay: &str, plan: &Plan) -> Vec<Error> {
    let mut errors = Vec::new();
    if netns_exists(underlay) {
        // Deleting the bridge detaches its ports; the veths go with the node namespaces. The
        // route goes with its nexthops, but a leftover one is removed explicitly.
        let _ = ip(&["-n", underlay, "route", "del", &plan.lb_net().to_string()]);
        // A `--private-api` cluster's table; absent otherwise, so a failure means nothing.
        let table = crate::topology::firewall_table(&plan.name);
        let _ = run(
            "ip",
            &[
                "netns", "exec", underlay, "nft", "delete", "table", "ip", &table,
            ],
        );
        if link_exists(underlay, &plan.bridge())
            && let Err(e) = ip(&["-n", underlay, "link", "del", &plan.bridge()])
        {
            errors.push(e);
        }
        for node in plan.node_plans() {
            if link_exists(underlay, &node.underlay_veth) {
                let _ = ip(&["-n", underlay, "link", "del", &node.underlay_veth]);
            }
        }
        // A `--behind-nat` cluster's uplink: it would go with the router namespace, but the
        // kernel frees a deleted namespace's devices asynchronously, so `down` could return
        // while it is still listed here.
        let router_veth = crate::topology::router_veth(plan.index);
        if link_exists(underlay, &router_veth) {
            let _ = ip(&["-n", underlay, "link", "del", &router_veth]);
        }
    }
    errors.extend(remove_cluster_namespaces(&plan.name));
    errors
}

/// Removes every namespace of cluster `name` (nodes and leftover pod sandboxes).
pub fn remove_cluster_namespaces(name: &str) -> Vec<Error> {
    let prefix = crate::topology::cluster_netns_prefix(name);
    // Sandboxes (`sk.<name>.nI.<uid>`) sort after their node and go first.
    let mut names = netns_with_prefix(&prefix);
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    names
        .iter()
        .filter_map(|ns| delete_netns(ns).err())
        .collect()
}

/// Whether interface `link` exists in namespace `ns`.
pub fn link_exists(ns: &str, link: &str) -> bool {
    ip(&["-n", ns, "link", "show", "dev", link]).is_ok()
}

/// Removes the underlay namespace when no cluster bridge is left in it.
pub fn remove_underlay_if_unused(underlay: &str) -> Result<bool, Error> {
    if !netns_exists(underlay) {
        return Ok(false);
    }
    let links = ip(&["-n", underlay, "-o", "link", "show", "type", "bridge"])?;
    if links.lines().any(|l| !l.trim().is_empty()) {
        return Ok(false);
    }
    // A `--behind-nat` cluster's bridge is in its router; its uplink veth is here.
    let veths = ip(&["-n", underlay, "-o", "link", "show", "type", "veth"])?;
    if veths.lines().any(|l| l.contains(": skr")) {
        return Ok(false);
    }
    delete_netns(underlay)?;
    Ok(true)
}
