//! Measuring instruments the benchmarks share: byte counters as an nftables table in a network
//! namespace, a process's memory and CPU from /proc, the tetherd controller of a cluster, the
//! network namespace of a pod, and the request counters of a simulated API server.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::process::{Command, Stdio};

use super::{Cluster, Result, kubectl, ok};

/// Byte counters in table `inet <table>` of network namespace `netns`: one rule per match in
/// each of the input, output and forward hooks, so a packet is counted once whichever way it
/// passes (matches must be direction-specific, such as `ip daddr X` and `ip saddr X`).
pub(crate) struct NftCounters {
    netns: String,
    table: String,
    rules: usize,
}

impl NftCounters {
    pub(crate) fn install(netns: &str, table: &str, matches: &[String]) -> Result<Self> {
        let mut script = format!("table inet {table} {{\n");
        for hook in ["input", "output", "forward"] {
            script.push_str(&format!(
                "chain {hook}_counted {{\n type filter hook {hook} priority -300; policy accept;\n"
            ));
            for m in matches {
                script.push_str(&format!("{m} counter\n"));
            }
            script.push_str("}\n");
        }
        script.push_str("}\n");
        let mut child = Command::new("ip")
            .args(["netns", "exec", netns, "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .spawn()
            .map_err(|e| format!("running nft: {e}"))?;
        child
            .stdin
            .take()
            .ok_or("nft stdin")?
            .write_all(script.as_bytes())
            .map_err(|e| format!("writing to nft: {e}"))?;
        let status = child.wait().map_err(|e| format!("nft: {e}"))?;
        if !status.success() {
            return Err(format!("installing byte counters in {netns} failed"));
        }
        Ok(Self {
            netns: netns.to_owned(),
            table: table.to_owned(),
            rules: matches.len() * 3,
        })
    }

    /// Bytes counted so far by every rule.
    pub(crate) fn read(&self) -> Result<u64> {
        Ok(self.by_match()?.iter().map(|c| c.bytes).sum())
    }

    /// What each match given to [`NftCounters::install`] counted so far, over every hook,
    /// in the order the matches were given.
    pub(crate) fn by_match(&self) -> Result<Vec<Counted>> {
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.netns,
                "nft",
                "list",
                "table",
                "inet",
                &self.table,
            ])
            .output()
            .map_err(|e| format!("reading counters: {e}"))?;
        ok(&out, &format!("nft list table in {}", self.netns))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let matches = self.rules / 3;
        let mut counted = vec![Counted::default(); matches];
        let mut found = 0;
        for line in text.lines() {
            let Some(rest) = line.split("counter packets ").nth(1) else {
                continue;
            };
            let mut words = rest.split_whitespace();
            let packets = words.next().and_then(|v| v.parse::<u64>().ok());
            let bytes = (words.next() == Some("bytes"))
                .then(|| words.next().and_then(|v| v.parse::<u64>().ok()))
                .flatten();
            let (Some(packets), Some(bytes)) = (packets, bytes) else {
                return Err(format!("unreadable counter line: {line}"));
            };
            // Rules are listed chain by chain, each chain with every match in order.
            let c = &mut counted[found % matches.max(1)];
            c.packets += packets;
            c.bytes += bytes;
            found += 1;
        }
        if found != self.rules {
            return Err(format!(
                "expected {} counters in {}, found {found}:\n{text}",
                self.rules, self.netns
            ));
        }
        Ok(counted)
    }
}

/// Packets and bytes one match counted.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Counted {
    pub(crate) packets: u64,
    pub(crate) bytes: u64,
}

impl std::ops::Sub for Counted {
    type Output = Self;
    fn sub(self, earlier: Self) -> Self {
        Self {
            packets: self.packets - earlier.packets,
            bytes: self.bytes - earlier.bytes,
        }
    }
}

/// `VmRSS` and `VmHWM` of a process, in KiB.
pub(crate) fn memory_kib(pid: u32) -> Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("reading /proc/{pid}/status: {e}"))?;
    let field = |name: &str| -> Result<u64> {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("{name} unreadable for process {pid}"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// CPU time a process used so far (user + system), in clock ticks (USER_HZ, 100 on Linux).
pub(crate) fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| format!("reading /proc/{pid}/stat: {e}"))?;
    let after = stat.rsplit_once(')').ok_or("malformed stat")?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| -> Result<u64> {
        f.get(i)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("stat field {i} unreadable"))
    };
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after the command.
    Ok(ticks(11)? + ticks(12)?)
}

/// The `tetherd controller` process of the cluster whose ID is `id` (pods are processes here,
/// and the controller's environment names its cluster).
pub(crate) fn tetherd_controller(id: &str) -> Option<u32> {
    let wanted = format!("TETHER_CLUSTER_ID={id}");
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_string_lossy().parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let mut args = cmdline.split(|b| *b == 0);
            let program = args.next()?;
            if !program.ends_with(b"tetherd") || args.next()? != b"controller" {
                return None;
            }
            let environ = std::fs::read(entry.path().join("environ")).ok()?;
            environ
                .split(|b| *b == 0)
                .any(|v| v == wanted.as_bytes())
                .then_some(pid)
        })
}

/// The sandbox network namespace of the first pod of `c` that `selector` picks in `ns`.
pub(crate) fn pod_netns(c: &Cluster, ns: &str, selector: &str) -> Result<String> {
    let uid = kubectl(
        c,
        &[
            "get",
            "pods",
            "-n",
            ns,
            "-l",
            selector,
            "-o",
            "jsonpath={.items[0].metadata.uid}",
        ],
    )?;
    if uid.is_empty() {
        return Err(format!("no pod {selector} in {ns} of {}", c.0));
    }
    simkube_cluster::net::netns_with_prefix(&format!("sk.{}.", c.0))
        .into_iter()
        .find(|n| n.ends_with(&uid))
        .ok_or_else(|| format!("no sandbox namespace for pod {selector} ({uid}) of {}", c.0))
}

/// `apiserver_request_total` of `c`'s API server by `VERB resource[/subresource]` (codes
/// summed): every client's requests, so a difference between two readings is what all of
/// them asked in between.
pub(crate) fn api_requests(c: &Cluster) -> Result<BTreeMap<String, u64>> {
    let text = kubectl(c, &["get", "--raw", "/metrics"])?;
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{name}=\"")))
                .map(|v| v.trim_end_matches('"').to_owned())
                .unwrap_or_default()
        };
        let resource = label("resource");
        let resource = if resource.is_empty() {
            "(non-resource)".to_owned()
        } else {
            resource
        };
        let mut key = format!("{} {resource}", label("verb"));
        let sub = label("subresource");
        if !sub.is_empty() {
            key = format!("{key}/{sub}");
        }
        let n = value.trim().parse::<f64>().unwrap_or(0.0) as u64;
        *out.entry(key).or_insert(0) += n;
    }
    if out.is_empty() {
        return Err(format!("no apiserver_request_total in {}'s /metrics", c.0));
    }
    Ok(out)
}

/// The `top` largest increases from `before` to `after`, largest first.
pub(crate) fn top_increases(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
    top: usize,
) -> Vec<(String, u64)> {
    let mut d: Vec<(String, u64)> = after
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.saturating_sub(before.get(k).copied().unwrap_or(0)),
            )
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    d.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    d.truncate(top);
    d
}

/// CPU ticks used so far by every live process, summed per group: the command name, with the
/// first of `tags` that its command line or environment mentions (a cluster's name or ID), so
/// two clusters' API servers or controllers count apart. A difference between two readings is
/// where the CPU went in between (a process that ended meanwhile is missing from the second).
pub(crate) fn cpu_by_group(tags: &[&str]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let comm = stat
            .split_once('(')
            .and_then(|(_, r)| r.rsplit_once(')'))
            .map_or("?", |(c, _)| c)
            .to_owned();
        let Ok(ticks) = cpu_ticks(pid) else { continue };
        let mut seen = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        seen.extend(std::fs::read(entry.path().join("environ")).unwrap_or_default());
        let text = String::from_utf8_lossy(&seen);
        let key = match tags.iter().find(|t| text.contains(*t)) {
            Some(t) => format!("{comm}[{t}]"),
            None => comm,
        };
        *out.entry(key).or_insert(0) += ticks;
    }
    out
}

/// Busy and total CPU ticks of the whole machine so far, from /proc/stat.
pub(crate) fn machine_ticks() -> Result<(u64, u64)> {
    let stat =
        std::fs::read_to_string("/proc/stat").map_err(|e| format!("reading /proc/stat: {e}"))?;
    let line = stat.lines().next().ok_or("empty /proc/stat")?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal: idle and iowait are not busy.
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    Ok((total - idle, total))
}
