//! A container's environment: literal values, the downward API, ConfigMap and Secret keys,
//! `envFrom`, the service-discovery variables, and `$(VAR)` expansion (pure: the agent fetches
//! the referenced ConfigMaps and Secrets first).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// ConfigMap and Secret data the container may reference, keyed by object name.
#[derive(Debug, Default, Clone)]
pub struct Sources {
    /// ConfigMap name → data.
    pub config_maps: BTreeMap<String, BTreeMap<String, String>>,
    /// Secret name → decoded data. Values are secrets: never log them.
    pub secrets: BTreeMap<String, BTreeMap<String, String>>,
}

/// What the downward API exposes besides the pod object itself.
#[derive(Debug, Clone, Default)]
pub struct Runtime {
    /// The pod's IP.
    pub pod_ip: String,
    /// The node's IP.
    pub host_ip: String,
    /// `KUBERNETES_SERVICE_HOST` as seen from the pod.
    pub api_host: String,
    /// `KUBERNETES_SERVICE_PORT`.
    pub api_port: u16,
}

/// Why the environment could not be built (the kubelet's `CreateContainerConfigError`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    /// A referenced ConfigMap or Secret does not exist.
    #[error("{kind} {name:?} not found")]
    MissingObject {
        /// `configmap` or `secret`.
        kind: &'static str,
        /// Its name.
        name: String,
    },
    /// A referenced key does not exist.
    #[error("couldn't find key {key} in {kind} {namespace}/{name}")]
    MissingKey {
        /// `ConfigMap` or `Secret`.
        kind: &'static str,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Key.
        key: String,
    },
    /// A downward-API field this agent does not expose.
    #[error(
        "unsupported fieldRef {0:?} (supported: metadata.name, metadata.namespace, metadata.uid, metadata.labels['k'], metadata.annotations['k'], spec.nodeName, spec.serviceAccountName, status.podIP, status.hostIP)"
    )]
    UnsupportedField(String),
}

/// Names of the ConfigMaps and Secrets a container references: `(config_maps, secrets)`.
pub fn referenced(container: &Container) -> (Vec<String>, Vec<String>) {
    let mut cms = Vec::new();
    let mut secrets = Vec::new();
    for var in container.env.iter().flatten() {
        if let Some(from) = &var.value_from {
            if let Some(r) = &from.config_map_key_ref {
                cms.push(r.name.clone());
            }
            if let Some(r) = &from.secret_key_ref {
                secrets.push(r.name.clone());
            }
        }
    }
    for from in container.env_from.iter().flatten() {
        if let Some(r) = &from.config_map_ref {
            cms.push(r.name.clone());
        }
        if let Some(r) = &from.secret_ref {
            secrets.push(r.name.clone());
        }
    }
    cms.sort();
    cms.dedup();
    secrets.sort();
    secrets.dedup();
    (cms, secrets)
}

/// The container's environment, in the order a process sees it (later entries win).
pub fn resolve(
    pod: &Pod,
    container: &Container,
    runtime: &Runtime,
    sources: &Sources,
) -> Result<Vec<(String, String)>, EnvError> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let mut vars: Vec<(String, String)> = vec![
        ("KUBERNETES_SERVICE_HOST".into(), runtime.api_host.clone()),
        (
            "KUBERNETES_SERVICE_PORT".into(),
            runtime.api_port.to_string(),
        ),
        (
            "KUBERNETES_SERVICE_PORT_HTTPS".into(),
            runtime.api_port.to_string(),
        ),
        (
            "HOSTNAME".into(),
            pod.metadata.name.clone().unwrap_or_default(),
        ),
    ];
    let set = |vars: &mut Vec<(String, String)>, name: String, value: String| {
        vars.retain(|(n, _)| *n != name);
        vars.push((name, value));
    };
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        let (data, optional, kind, name) = if let Some(r) = &from.config_map_ref {
            (
                sources.config_maps.get(&r.name),
                r.optional,
                "configmap",
                &r.name,
            )
        } else if let Some(r) = &from.secret_ref {
            (sources.secrets.get(&r.name), r.optional, "secret", &r.name)
        } else {
            continue;
        };
        match data {
            Some(data) => {
                for (k, v) in data {
                    set(&mut vars, format!("{prefix}{k}"), v.clone());
                }
            }
            None if optional == Some(true) => {}
            None => {
                return Err(EnvError::MissingObject {
                    kind,
                    name: name.clone(),
                });
            }
        }
    }
    for var in container.env.iter().flatten() {
        let value = if let Some(from) = &var.value_from {
            if let Some(r) = &from.config_map_key_ref {
                lookup(
                    &sources.config_maps,
                    "ConfigMap",
                    &namespace,
                    &r.name,
                    &r.key,
                    r.optional,
                )?
            } else if let Some(r) = &from.secret_key_ref {
                lookup(
                    &sources.secrets,
                    "Secret",
                    &namespace,
                    &r.name,
                    &r.key,
                    r.optional,
                )?
            } else if let Some(r) = &from.field_ref {
                Some(field(pod, runtime, &r.field_path)?)
            } else {
                // resourceFieldRef: the simulated node enforces no limits, so report none.
                Some(String::new())
            }
        } else {
            Some(expand(var.value.as_deref().unwrap_or(""), &vars))
        };
        if let Some(value) = value {
            set(&mut vars, var.name.clone(), value);
        }
    }
    Ok(vars)
}

fn lookup(
    objects: &BTreeMap<String, BTreeMap<String, String>>,
    kind: &'static str,
    namespace: &str,
    name: &str,
    key: &str,
    optional: Option<bool>,
) -> Result<Option<String>, EnvError> {
    let optional = optional == Some(true);
    match objects.get(name) {
        None if optional => Ok(None),
        None => Err(EnvError::MissingObject {
            kind: if kind == "Secret" {
                "secret"
            } else {
                "configmap"
            },
            name: name.to_owned(),
        }),
        Some(data) => match data.get(key) {
            Some(v) => Ok(Some(v.clone())),
            None if optional => Ok(None),
            None => Err(EnvError::MissingKey {
                kind,
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                key: key.to_owned(),
            }),
        },
    }
}

fn field(pod: &Pod, runtime: &Runtime, path: &str) -> Result<String, EnvError> {
    let spec = pod.spec.as_ref();
    Ok(match path {
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.podIP" | "status.podIPs" => runtime.pod_ip.clone(),
        "status.hostIP" | "status.hostIPs" => runtime.host_ip.clone(),
        _ => metadata_field(&pod.metadata, path)
            .ok_or_else(|| EnvError::UnsupportedField(path.to_owned()))?,
    })
}

/// The downward-API value of a metadata field path both env vars and downward-API volumes
/// accept: name, namespace, uid, or one label or annotation as `metadata.labels['key']`. `None`
/// when `path` is none of these. A missing label or annotation reads as empty, as in Kubernetes.
pub fn metadata_field(meta: &ObjectMeta, path: &str) -> Option<String> {
    let map_key = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix("['"))
            .and_then(|rest| rest.strip_suffix("']"))
    };
    let entry = |map: Option<&BTreeMap<String, String>>, key: &str| {
        map.and_then(|m| m.get(key).cloned()).unwrap_or_default()
    };
    Some(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        _ => {
            if let Some(key) = map_key("metadata.labels") {
                entry(meta.labels.as_ref(), key)
            } else if let Some(key) = map_key("metadata.annotations") {
                entry(meta.annotations.as_ref(), key)
            } else {
                return None;
            }
        }
    })
}

/// Expands `$(NAME)` references to variables defined so far; `$$` escapes a `$`; unknown
/// references stay as written (Kubernetes semantics).
pub fn expand(input: &str, vars: &[(String, String)]) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('(') {
            match body.find(')') {
                Some(end) => {
                    let name = &body[..end];
                    match vars.iter().rev().find(|(n, _)| n == name) {
                        Some((_, v)) => out.push_str(v),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &body[end + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = body;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-1", "namespace": "shop", "uid": "u1", "labels": {"app": "web"}},
            "spec": {"nodeName": "n1", "containers": [{
                "name": "c", "image": "simkube.dev/echo",
                "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "CFG_"}],
                "env": [
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                    {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode"}}},
                    {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}},
                    {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "x", "optional": true}}},
                    {"name": "GREETING", "value": "hi $(POD_NAME) at $(POD_IP):$(UNKNOWN) $$(POD_NAME)"}
                ]
            }]}
        }))
        .expect("pod")
    }

    fn sources() -> Sources {
        Sources {
            config_maps: BTreeMap::from([(
                "cfg".to_owned(),
                BTreeMap::from([("mode".to_owned(), "fast".to_owned())]),
            )]),
            secrets: BTreeMap::from([(
                "db".to_owned(),
                BTreeMap::from([("password".to_owned(), "s3cret".to_owned())]),
            )]),
        }
    }

    fn runtime() -> Runtime {
        Runtime {
            pod_ip: "10.244.1.2".into(),
            host_ip: "198.18.0.2".into(),
            api_host: "198.18.0.1".into(),
            api_port: 6443,
        }
    }

    #[test]
    fn resolves_every_kind_of_source() {
        let pod = pod();
        let container = &pod.spec.as_ref().expect("spec").containers[0];
        assert_eq!(
            referenced(container),
            (
                vec!["cfg".to_owned()],
                vec!["db".to_owned(), "nope".to_owned()]
            )
        );
        let env = resolve(&pod, container, &runtime(), &sources()).expect("resolves");
        let text: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        expect_test::expect![[r#"
            [
                "KUBERNETES_SERVICE_HOST=198.18.0.1",
                "KUBERNETES_SERVICE_PORT=6443",
                "KUBERNETES_SERVICE_PORT_HTTPS=6443",
                "HOSTNAME=web-1",
                "CFG_mode=fast",
                "POD_NAME=web-1",
                "POD_NAMESPACE=shop",
                "POD_IP=10.244.1.2",
                "APP=web",
                "MODE=fast",
                "PASSWORD=s3cret",
                "GREETING=hi web-1 at 10.244.1.2:$(UNKNOWN) $(POD_NAME)",
            ]
        "#]]
        .assert_debug_eq(&text);
    }

    #[test]
    fn missing_required_references_are_config_errors() {
        let pod = pod();
        let container = &pod.spec.as_ref().expect("spec").containers[0];
        let mut s = sources();
        s.secrets.clear();
        let err = resolve(&pod, container, &runtime(), &s).expect_err("secret missing");
        assert_eq!(err.to_string(), "secret \"db\" not found");
        let mut s = sources();
        s.config_maps.get_mut("cfg").expect("cfg").clear();
        s.config_maps
            .get_mut("cfg")
            .expect("cfg")
            .insert("other".into(), "x".into());
        let err = resolve(&pod, container, &runtime(), &s).expect_err("key missing");
        assert_eq!(
            err.to_string(),
            "couldn't find key mode in ConfigMap shop/cfg"
        );
    }

    #[test]
    fn expansion_edge_cases() {
        let vars = vec![("A".to_owned(), "1".to_owned())];
        assert_eq!(expand("$(A)$(A)", &vars), "11");
        assert_eq!(expand("$A $( $(A", &vars), "$A $( $(A");
        assert_eq!(expand("$$$(A)", &vars), "$1");
        assert_eq!(expand("", &vars), "");
    }
}
