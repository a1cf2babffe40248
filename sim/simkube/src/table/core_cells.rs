//! Cells of the core kinds (pods, services, nodes, endpoints, events) and CSRs, after kube-apiserver's `pkg/printers/internalversion`.

#[allow(clippy::wildcard_imports)]
use super::*;

// ---------------------------------------------------------------------------------------------
// Per-kind cells, after kube-apiserver's `pkg/printers/internalversion`.

pub(super) fn pod_cells(pod: &Value, now: Timestamp) -> Vec<Value> {
    let containers = arr(pod, &["spec", "containers"]);
    let mut total = containers.len();
    let mut ready = 0usize;
    let mut restarts = 0i64;
    let mut last_restart: Option<Timestamp> = None;
    let mut reason = str_at(pod, &["status", "phase"]).to_owned();
    if !str_at(pod, &["status", "reason"]).is_empty() {
        reason = str_at(pod, &["status", "reason"]).to_owned();
    }
    let note_restart = |cs: &Value, restarts: &mut i64, last: &mut Option<Timestamp>| {
        *restarts += int_at(cs, &["restartCount"]);
        if let Some(t) = parse_time(str_at(cs, &["lastState", "terminated", "finishedAt"]))
            && last.is_none_or(|l| t > l)
        {
            *last = Some(t);
        }
    };

    // Sidecars (restartable init containers) count as containers.
    let sidecars: Vec<&str> = arr(pod, &["spec", "initContainers"])
        .iter()
        .filter(|c| str_at(c, &["restartPolicy"]) == "Always")
        .map(|c| str_at(c, &["name"]))
        .collect();
    total += sidecars.len();

    let init_statuses = arr(pod, &["status", "initContainerStatuses"]);
    let init_total = arr(pod, &["spec", "initContainers"]).len();
    let mut initializing = false;
    for (i, cs) in init_statuses.iter().enumerate() {
        note_restart(cs, &mut restarts, &mut last_restart);
        let is_sidecar = sidecars.contains(&str_at(cs, &["name"]));
        if is_sidecar && cs.get("started").and_then(Value::as_bool) == Some(true) {
            if cs.get("ready").and_then(Value::as_bool) == Some(true) {
                ready += 1;
            }
            continue;
        }
        let term = at(cs, &["state", "terminated"]);
        if let Some(t) = term
            && int_at(t, &["exitCode"]) == 0
        {
            continue;
        }
        if let Some(t) = term {
            reason = if !str_at(t, &["reason"]).is_empty() {
                format!("Init:{}", str_at(t, &["reason"]))
            } else if int_at(t, &["signal"]) != 0 {
                format!("Init:Signal:{}", int_at(t, &["signal"]))
            } else {
                format!("Init:ExitCode:{}", int_at(t, &["exitCode"]))
            };
        } else if let Some(w) = at(cs, &["state", "waiting"])
            && !str_at(w, &["reason"]).is_empty()
            && str_at(w, &["reason"]) != "PodInitializing"
        {
            reason = format!("Init:{}", str_at(w, &["reason"]));
        } else {
            reason = format!("Init:{i}/{init_total}");
        }
        initializing = true;
        break;
    }

    if !initializing {
        restarts = 0;
        last_restart = None;
        for cs in init_statuses {
            if sidecars.contains(&str_at(cs, &["name"])) {
                note_restart(cs, &mut restarts, &mut last_restart);
            }
        }
        let mut has_running = false;
        for cs in arr(pod, &["status", "containerStatuses"]).iter().rev() {
            note_restart(cs, &mut restarts, &mut last_restart);
            if let Some(w) = at(cs, &["state", "waiting"])
                && !str_at(w, &["reason"]).is_empty()
            {
                reason = str_at(w, &["reason"]).to_owned();
            } else if let Some(t) = at(cs, &["state", "terminated"]) {
                reason = if !str_at(t, &["reason"]).is_empty() {
                    str_at(t, &["reason"]).to_owned()
                } else if int_at(t, &["signal"]) != 0 {
                    format!("Signal:{}", int_at(t, &["signal"]))
                } else {
                    format!("ExitCode:{}", int_at(t, &["exitCode"]))
                };
            } else if at(cs, &["state", "running"]).is_some()
                && cs.get("ready").and_then(Value::as_bool) == Some(true)
            {
                has_running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && has_running {
            let pod_ready = arr(pod, &["status", "conditions"])
                .iter()
                .any(|c| str_at(c, &["type"]) == "Ready" && str_at(c, &["status"]) == "True");
            reason = if pod_ready {
                "Running".to_owned()
            } else {
                "NotReady".to_owned()
            };
        }
    }

    if pod
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
    {
        reason = if str_at(pod, &["status", "reason"]) == "NodeLost" {
            "Unknown".to_owned()
        } else {
            "Terminating".to_owned()
        };
    }

    let restarts_cell = match last_restart {
        Some(t) if restarts > 0 => {
            format!(
                "{restarts} ({} ago)",
                human_duration(now.as_second() - t.as_second())
            )
        }
        _ => restarts.to_string(),
    };

    let gates = arr(pod, &["spec", "readinessGates"]);
    let gates_cell = if gates.is_empty() {
        "<none>".to_owned()
    } else {
        let conditions = arr(pod, &["status", "conditions"]);
        let true_gates = gates
            .iter()
            .filter(|g| {
                conditions.iter().any(|c| {
                    str_at(c, &["type"]) == str_at(g, &["conditionType"])
                        && str_at(c, &["status"]) == "True"
                })
            })
            .count();
        format!("{true_gates}/{}", gates.len())
    };

    vec![
        json!(format!("{ready}/{total}")),
        json!(reason),
        json!(restarts_cell),
        age(pod, now),
        json!(or_none(str_at(pod, &["status", "podIP"]).to_owned())),
        json!(or_none(str_at(pod, &["spec", "nodeName"]).to_owned())),
        json!(or_none(
            str_at(pod, &["status", "nominatedNodeName"]).to_owned()
        )),
        json!(gates_cell),
    ]
}

pub(super) fn service_cells(svc: &Value, now: Timestamp) -> Vec<Value> {
    let type_ = match str_at(svc, &["spec", "type"]) {
        "" => "ClusterIP",
        t => t,
    };
    let external_ips: Vec<&str> = arr(svc, &["spec", "externalIPs"])
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let external = match type_ {
        "ClusterIP" | "NodePort" => or_none(external_ips.join(",")),
        "LoadBalancer" => {
            let mut ips: Vec<String> = arr(svc, &["status", "loadBalancer", "ingress"])
                .iter()
                .map(|i| {
                    let ip = str_at(i, &["ip"]);
                    if ip.is_empty() {
                        str_at(i, &["hostname"]).to_owned()
                    } else {
                        ip.to_owned()
                    }
                })
                .filter(|s| !s.is_empty())
                .collect();
            ips.extend(external_ips.iter().map(|s| (*s).to_owned()));
            if ips.is_empty() {
                "<pending>".to_owned()
            } else {
                ips.join(",")
            }
        }
        "ExternalName" => str_at(svc, &["spec", "externalName"]).to_owned(),
        _ => "<unknown>".to_owned(),
    };
    let ports: Vec<String> = arr(svc, &["spec", "ports"])
        .iter()
        .map(|p| {
            let proto = match str_at(p, &["protocol"]) {
                "" => "TCP",
                x => x,
            };
            let port = int_at(p, &["port"]);
            match int_at(p, &["nodePort"]) {
                0 => format!("{port}/{proto}"),
                np => format!("{port}:{np}/{proto}"),
            }
        })
        .collect();
    vec![
        json!(type_),
        json!(or_none(str_at(svc, &["spec", "clusterIP"]).to_owned())),
        json!(external),
        json!(or_none(ports.join(","))),
        age(svc, now),
        json!(or_none(format_labels(at(svc, &["spec", "selector"])))),
    ]
}

pub(super) fn node_cells(node: &Value, now: Timestamp) -> Vec<Value> {
    let mut status: Vec<String> = Vec::new();
    match arr(node, &["status", "conditions"])
        .iter()
        .find(|c| str_at(c, &["type"]) == "Ready")
    {
        Some(c) if str_at(c, &["status"]) == "True" => status.push("Ready".into()),
        Some(c) if str_at(c, &["status"]) == "False" => status.push("NotReady".into()),
        _ => status.push("Unknown".into()),
    }
    if node.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
        status.push("SchedulingDisabled".into());
    }
    let mut roles: Vec<String> = Vec::new();
    if let Some(Value::Object(labels)) = node.pointer("/metadata/labels") {
        for (k, v) in labels {
            if let Some(role) = k.strip_prefix("node-role.kubernetes.io/") {
                if !role.is_empty() {
                    roles.push(role.to_owned());
                }
            } else if k == "kubernetes.io/role" && v.as_str().is_some_and(|s| !s.is_empty()) {
                roles.push(v.as_str().unwrap_or_default().to_owned());
            }
        }
    }
    roles.sort();
    roles.dedup();
    let address = |kind: &str| {
        or_none(
            arr(node, &["status", "addresses"])
                .iter()
                .find(|a| str_at(a, &["type"]) == kind)
                .map(|a| str_at(a, &["address"]).to_owned())
                .unwrap_or_default(),
        )
    };
    let info = |field: &str| {
        let v = str_at(node, &["status", "nodeInfo", field]);
        if v.is_empty() {
            "<unknown>".to_owned()
        } else {
            v.to_owned()
        }
    };
    vec![
        json!(status.join(",")),
        json!(or_none(roles.join(","))),
        age(node, now),
        json!(str_at(node, &["status", "nodeInfo", "kubeletVersion"])),
        json!(address("InternalIP")),
        json!(address("ExternalIP")),
        json!(info("osImage")),
        json!(info("kernelVersion")),
        json!(info("containerRuntimeVersion")),
    ]
}

/// The first three endpoints then `+ N more...`, as kube-apiserver shortens them.
pub(super) fn summarize(list: Vec<String>) -> String {
    const MAX: usize = 3;
    if list.is_empty() {
        return "<none>".to_owned();
    }
    if list.len() > MAX {
        return format!("{} + {} more...", list[..MAX].join(","), list.len() - MAX);
    }
    list.join(",")
}

pub(super) fn endpoints_summary(ep: &Value) -> String {
    let mut list = Vec::new();
    for subset in arr(ep, &["subsets"]) {
        let ports = arr(subset, &["ports"]);
        for addr in arr(subset, &["addresses"]) {
            let ip = str_at(addr, &["ip"]);
            if ports.is_empty() {
                list.push(ip.to_owned());
            }
            for p in ports {
                list.push(format!("{ip}:{}", int_at(p, &["port"])));
            }
        }
    }
    summarize(list)
}

pub(super) fn endpointslice_cells(slice: &Value, now: Timestamp) -> Vec<Value> {
    let ports: Vec<String> = arr(slice, &["ports"])
        .iter()
        .map(|p| match p.get("port").and_then(Value::as_i64) {
            Some(n) => n.to_string(),
            None => "<unset>".to_owned(),
        })
        .collect();
    let addresses: Vec<String> = arr(slice, &["endpoints"])
        .iter()
        .flat_map(|e| {
            arr(e, &["addresses"])
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
        })
        .collect();
    let ports_cell = if arr(slice, &["ports"]).is_empty() {
        "<unset>".to_owned()
    } else if ports.len() > 3 {
        format!("{} + {} more...", ports[..3].join(","), ports.len() - 3)
    } else {
        ports.join(",")
    };
    vec![
        json!(str_at(slice, &["addressType"])),
        json!(ports_cell),
        json!(summarize(addresses)),
        age(slice, now),
    ]
}

/// Cells of an Event in either API: `regarding`/`note`/`reportingController` (events.k8s.io) or
/// `involvedObject`/`message`/`source` (core).
pub(super) struct EventView<'a> {
    obj: &'a Value,
    target: &'a Value,
    message: &'a str,
    first: &'a str,
    last: &'a str,
    count: Option<i64>,
    source: String,
}

pub(super) fn event_cells(e: EventView<'_>, now: Timestamp) -> Vec<Value> {
    let obj = e.obj;
    let micro = str_at(obj, &["eventTime"]);
    let first = if e.first.is_empty() {
        since(micro, now)
    } else {
        since(e.first, now)
    };
    let mut last = if e.last.is_empty() {
        first.clone()
    } else {
        since(e.last, now)
    };
    let mut count = e.count.filter(|c| *c != 0).unwrap_or(1);
    if let Some(series) = obj.get("series").filter(|s| s.is_object()) {
        last = since(str_at(series, &["lastObservedTime"]), now);
        count = int_at(series, &["count"]);
    }
    let kind = str_at(e.target, &["kind"]).to_ascii_lowercase();
    let name = str_at(e.target, &["name"]);
    let target = if name.is_empty() {
        kind
    } else {
        format!("{kind}/{name}")
    };
    vec![
        json!(last),
        json!(str_at(obj, &["type"])),
        json!(str_at(obj, &["reason"])),
        json!(target),
        json!(str_at(e.target, &["fieldPath"])),
        json!(e.source),
        json!(e.message.trim()),
        json!(first),
        json!(count),
        json!(str_at(obj, &["metadata", "name"])),
    ]
}

pub(super) fn event_source(component: &str, host: &str) -> String {
    if host.is_empty() {
        component.to_owned()
    } else {
        format!("{component}, {host}")
    }
}

pub(super) fn core_event_cells(ev: &Value, now: Timestamp) -> Vec<Value> {
    let component = match str_at(ev, &["source", "component"]) {
        "" => str_at(ev, &["reportingComponent"]),
        c => c,
    };
    let host = match str_at(ev, &["source", "host"]) {
        "" => str_at(ev, &["reportingInstance"]),
        h => h,
    };
    event_cells(
        EventView {
            obj: ev,
            target: ev.get("involvedObject").unwrap_or(&Value::Null),
            message: str_at(ev, &["message"]),
            first: str_at(ev, &["firstTimestamp"]),
            last: str_at(ev, &["lastTimestamp"]),
            count: ev.get("count").and_then(Value::as_i64),
            source: event_source(component, host),
        },
        now,
    )
}

pub(super) fn events_event_cells(ev: &Value, now: Timestamp) -> Vec<Value> {
    let component = match str_at(ev, &["deprecatedSource", "component"]) {
        "" => str_at(ev, &["reportingController"]),
        c => c,
    };
    let host = match str_at(ev, &["deprecatedSource", "host"]) {
        "" => str_at(ev, &["reportingInstance"]),
        h => h,
    };
    event_cells(
        EventView {
            obj: ev,
            target: ev.get("regarding").unwrap_or(&Value::Null),
            message: str_at(ev, &["note"]),
            first: str_at(ev, &["deprecatedFirstTimestamp"]),
            last: str_at(ev, &["deprecatedLastTimestamp"]),
            count: ev.get("deprecatedCount").and_then(Value::as_i64),
            source: event_source(component, host),
        },
        now,
    )
}

pub(super) fn csr_cells(csr: &Value, now: Timestamp) -> Vec<Value> {
    let signer = or_none(str_at(csr, &["spec", "signerName"]).to_owned());
    let duration = match csr
        .pointer("/spec/expirationSeconds")
        .and_then(Value::as_i64)
    {
        Some(s) => human_duration(s),
        None => "<none>".to_owned(),
    };
    let mut conditions: Vec<String> = Vec::new();
    for c in arr(csr, &["status", "conditions"]) {
        let t = str_at(c, &["type"]);
        if !t.is_empty() && str_at(c, &["status"]) != "False" {
            conditions.push(t.to_owned());
        }
    }
    if csr
        .pointer("/status/certificate")
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty())
    {
        conditions.push("Issued".to_owned());
    }
    conditions.sort();
    let condition = if conditions.is_empty() {
        "Pending".to_owned()
    } else {
        conditions.join(",")
    };
    vec![
        age(csr, now),
        json!(signer),
        json!(str_at(csr, &["spec", "username"])),
        json!(duration),
        json!(condition),
    ]
}
