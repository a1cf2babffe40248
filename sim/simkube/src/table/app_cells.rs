//! Cells of workloads, volumes, quotas, ingresses, storage classes and role bindings, after kube-apiserver's printers.

#[allow(clippy::wildcard_imports)]
use super::*;

pub(super) fn template_summary(obj: &Value) -> (String, String) {
    let containers = arr(obj, &["spec", "template", "spec", "containers"]);
    let names: Vec<&str> = containers.iter().map(|c| str_at(c, &["name"])).collect();
    let images: Vec<&str> = containers.iter().map(|c| str_at(c, &["image"])).collect();
    (names.join(","), images.join(","))
}

pub(super) fn deployment_cells(d: &Value, now: Timestamp) -> Vec<Value> {
    let desired = d
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let (names, images) = template_summary(d);
    vec![
        json!(format!(
            "{}/{desired}",
            int_at(d, &["status", "readyReplicas"])
        )),
        json!(int_at(d, &["status", "updatedReplicas"])),
        json!(int_at(d, &["status", "availableReplicas"])),
        age(d, now),
        json!(names),
        json!(images),
        json!(format_label_selector(at(d, &["spec", "selector"]))),
    ]
}

pub(super) fn replicaset_cells(rs: &Value, now: Timestamp) -> Vec<Value> {
    let desired = rs
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let (names, images) = template_summary(rs);
    vec![
        json!(desired),
        json!(int_at(rs, &["status", "replicas"])),
        json!(int_at(rs, &["status", "readyReplicas"])),
        age(rs, now),
        json!(names),
        json!(images),
        json!(format_label_selector(at(rs, &["spec", "selector"]))),
    ]
}

pub(super) fn daemonset_cells(ds: &Value, now: Timestamp) -> Vec<Value> {
    let (names, images) = template_summary(ds);
    vec![
        json!(int_at(ds, &["status", "desiredNumberScheduled"])),
        json!(int_at(ds, &["status", "currentNumberScheduled"])),
        json!(int_at(ds, &["status", "numberReady"])),
        json!(int_at(ds, &["status", "updatedNumberScheduled"])),
        json!(int_at(ds, &["status", "numberAvailable"])),
        json!(or_none(format_labels(at(
            ds,
            &["spec", "template", "spec", "nodeSelector"]
        )))),
        age(ds, now),
        json!(names),
        json!(images),
        json!(format_label_selector(at(ds, &["spec", "selector"]))),
    ]
}

pub(super) fn statefulset_cells(sts: &Value, now: Timestamp) -> Vec<Value> {
    let desired = sts
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let (names, images) = template_summary(sts);
    vec![
        json!(format!(
            "{}/{desired}",
            int_at(sts, &["status", "readyReplicas"])
        )),
        age(sts, now),
        json!(names),
        json!(images),
    ]
}

pub(super) fn condition_true(obj: &Value, ty: &str) -> bool {
    arr(obj, &["status", "conditions"])
        .iter()
        .any(|c| str_at(c, &["type"]) == ty && str_at(c, &["status"]) == "True")
}

pub(super) fn job_cells(job: &Value, now: Timestamp) -> Vec<Value> {
    let succeeded = int_at(job, &["status", "succeeded"]);
    let completions = match job.pointer("/spec/completions").and_then(Value::as_i64) {
        Some(c) => format!("{succeeded}/{c}"),
        None => match job.pointer("/spec/parallelism").and_then(Value::as_i64) {
            Some(p) if p > 1 => format!("{succeeded}/1 of {p}"),
            _ => format!("{succeeded}/1"),
        },
    };
    let status = if condition_true(job, "Complete") {
        "Complete"
    } else if condition_true(job, "Failed") {
        "Failed"
    } else if job
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
    {
        "Terminating"
    } else if condition_true(job, "FailureTarget") {
        "FailureTarget"
    } else if condition_true(job, "SuccessCriteriaMet") {
        "SuccessCriteriaMet"
    } else if condition_true(job, "Suspended") {
        "Suspended"
    } else {
        "Running"
    };
    let duration = match parse_time(str_at(job, &["status", "startTime"])) {
        Some(start) => {
            let end = parse_time(str_at(job, &["status", "completionTime"])).unwrap_or(now);
            human_duration(end.as_second() - start.as_second())
        }
        None => String::new(),
    };
    let (names, images) = template_summary(job);
    vec![
        json!(status),
        json!(completions),
        json!(duration),
        age(job, now),
        json!(names),
        json!(images),
        json!(format_label_selector(at(job, &["spec", "selector"]))),
    ]
}

pub(super) fn cronjob_cells(cj: &Value, now: Timestamp) -> Vec<Value> {
    let suspend = match cj.pointer("/spec/suspend").and_then(Value::as_bool) {
        Some(true) => "True",
        Some(false) => "False",
        None => "<unset>",
    };
    let last = match parse_time(str_at(cj, &["status", "lastScheduleTime"])) {
        Some(t) => human_duration(now.as_second() - t.as_second()),
        None => "<none>".to_owned(),
    };
    let containers = arr(
        cj,
        &[
            "spec",
            "jobTemplate",
            "spec",
            "template",
            "spec",
            "containers",
        ],
    );
    let names: Vec<&str> = containers.iter().map(|c| str_at(c, &["name"])).collect();
    let images: Vec<&str> = containers.iter().map(|c| str_at(c, &["image"])).collect();
    vec![
        json!(str_at(cj, &["spec", "schedule"])),
        json!(or_none(str_at(cj, &["spec", "timeZone"]).to_owned())),
        json!(suspend),
        json!(len_at(cj, &["status", "active"])),
        json!(last),
        age(cj, now),
        json!(names.join(",")),
        json!(images.join(",")),
        json!(format_label_selector(at(
            cj,
            &["spec", "jobTemplate", "spec", "selector"]
        ))),
    ]
}

/// `RWO,ROX,RWX,RWOP`, as kubectl abbreviates access modes.
pub(super) fn access_modes(modes: &[Value]) -> String {
    let has = |m: &str| modes.iter().any(|v| v.as_str() == Some(m));
    let mut out = Vec::new();
    for (long, short) in [
        ("ReadWriteOnce", "RWO"),
        ("ReadOnlyMany", "ROX"),
        ("ReadWriteMany", "RWX"),
        ("ReadWriteOncePod", "RWOP"),
    ] {
        if has(long) {
            out.push(short);
        }
    }
    out.join(",")
}

pub(super) fn deleting(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

pub(super) fn pvc_cells(pvc: &Value, now: Timestamp) -> Vec<Value> {
    let phase = if deleting(pvc) {
        "Terminating"
    } else {
        str_at(pvc, &["status", "phase"])
    };
    let bound = !str_at(pvc, &["spec", "volumeName"]).is_empty();
    let (capacity, modes) = if bound {
        (
            str_at(pvc, &["status", "capacity", "storage"]).to_owned(),
            access_modes(arr(pvc, &["status", "accessModes"])),
        )
    } else {
        (String::new(), String::new())
    };
    let vac = match str_at(pvc, &["status", "currentVolumeAttributesClassName"]) {
        "" => "<unset>",
        v => v,
    };
    let mode = match str_at(pvc, &["spec", "volumeMode"]) {
        "" => "<unset>",
        m => m,
    };
    vec![
        json!(phase),
        json!(str_at(pvc, &["spec", "volumeName"])),
        json!(capacity),
        json!(modes),
        json!(str_at(pvc, &["spec", "storageClassName"])),
        json!(vac),
        age(pvc, now),
        json!(mode),
    ]
}

pub(super) fn pv_cells(pv: &Value, now: Timestamp) -> Vec<Value> {
    let claim = match at(pv, &["spec", "claimRef"]) {
        Some(c) if c.is_object() => {
            format!("{}/{}", str_at(c, &["namespace"]), str_at(c, &["name"]))
        }
        _ => String::new(),
    };
    let phase = if deleting(pv) {
        "Terminating"
    } else {
        str_at(pv, &["status", "phase"])
    };
    let vac = match str_at(pv, &["spec", "volumeAttributesClassName"]) {
        "" => "<unset>",
        v => v,
    };
    let mode = match str_at(pv, &["spec", "volumeMode"]) {
        "" => "<unset>",
        m => m,
    };
    vec![
        json!(str_at(pv, &["spec", "capacity", "storage"])),
        json!(access_modes(arr(pv, &["spec", "accessModes"]))),
        json!(str_at(pv, &["spec", "persistentVolumeReclaimPolicy"])),
        json!(phase),
        json!(claim),
        json!(str_at(pv, &["spec", "storageClassName"])),
        json!(vac),
        json!(str_at(pv, &["status", "reason"])),
        age(pv, now),
        json!(mode),
    ]
}

pub(super) fn quota_cells(q: &Value, now: Timestamp) -> Vec<Value> {
    let mut requests = Vec::new();
    let mut limits = Vec::new();
    if let Some(Value::Object(hard)) = q.pointer("/status/hard") {
        let mut keys: Vec<&String> = hard.keys().collect();
        keys.sort();
        for k in keys {
            let used = q
                .pointer(&format!(
                    "/status/used/{}",
                    k.replace('~', "~0").replace('/', "~1")
                ))
                .map(quantity_text)
                .unwrap_or_else(|| "0".to_owned());
            let entry = format!("{k}: {used}/{}", quantity_text(&hard[k]));
            if k.starts_with("limits.") {
                limits.push(entry);
            } else {
                requests.push(entry);
            }
        }
    }
    vec![
        age(q, now),
        json!(requests.join(", ")),
        json!(limits.join(", ")),
    ]
}

pub(super) fn quantity_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

pub(super) fn ingress_cells(ing: &Value, now: Timestamp) -> Vec<Value> {
    let class = or_none(str_at(ing, &["spec", "ingressClassName"]).to_owned());
    let hosts: Vec<String> = arr(ing, &["spec", "rules"])
        .iter()
        .map(|r| match str_at(r, &["host"]) {
            "" => "*".to_owned(),
            h => h.to_owned(),
        })
        .collect();
    let hosts = if hosts.is_empty() {
        "*".to_owned()
    } else if hosts.len() > 4 {
        format!("{} + {} more...", hosts[..4].join(","), hosts.len() - 4)
    } else {
        hosts.join(",")
    };
    let address: Vec<String> = arr(ing, &["status", "loadBalancer", "ingress"])
        .iter()
        .map(|i| match str_at(i, &["ip"]) {
            "" => str_at(i, &["hostname"]).to_owned(),
            ip => ip.to_owned(),
        })
        .filter(|s| !s.is_empty())
        .collect();
    let ports = if arr(ing, &["spec", "tls"]).is_empty() {
        "80"
    } else {
        "80, 443"
    };
    vec![
        json!(class),
        json!(hosts),
        json!(address.join(",")),
        json!(ports),
        age(ing, now),
    ]
}

pub(super) fn storageclass_cells(sc: &Value, now: Timestamp) -> Vec<Value> {
    let reclaim = match str_at(sc, &["reclaimPolicy"]) {
        "" => "Delete",
        r => r,
    };
    let binding = match str_at(sc, &["volumeBindingMode"]) {
        "" => "Immediate",
        b => b,
    };
    vec![
        json!(str_at(sc, &["provisioner"])),
        json!(reclaim),
        json!(binding),
        json!(
            sc.get("allowVolumeExpansion")
                .and_then(Value::as_bool)
                .unwrap_or(false)
                .to_string()
        ),
        age(sc, now),
    ]
}

pub(super) fn binding_cells(b: &Value, now: Timestamp) -> Vec<Value> {
    let subjects = arr(b, &["subjects"]);
    let of_kind = |kind: &str| -> String {
        subjects
            .iter()
            .filter(|s| str_at(s, &["kind"]) == kind)
            .map(|s| {
                let ns = str_at(s, &["namespace"]);
                let name = str_at(s, &["name"]);
                if kind == "ServiceAccount" {
                    format!("{ns}/{name}")
                } else {
                    name.to_owned()
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    vec![
        json!(format!(
            "{}/{}",
            str_at(b, &["roleRef", "kind"]),
            str_at(b, &["roleRef", "name"])
        )),
        age(b, now),
        json!(of_kind("User")),
        json!(of_kind("Group")),
        json!(of_kind("ServiceAccount")),
    ]
}
