//! Mutating admission of new pods, as kube-apiserver's ServiceAccount plugin does it: the pod
//! runs as `default` unless it names a ServiceAccount, and, unless token automounting is off
//! (on the pod, or else on its ServiceAccount), every container and init container gets the
//! projected `kube-api-access-<5 chars>` volume (a bound token, the cluster CA and the
//! namespace) at `/var/run/secrets/kubernetes.io/serviceaccount`.
//!
//! One deliberate difference: kube-apiserver rejects a pod whose ServiceAccount does not exist;
//! here such a pod is admitted without the token volume, because many tests create pods in
//! clusters that run no ServiceAccount controller.

pub mod webhooks;

use serde_json::{Value, json};

/// Where in-cluster clients look for the token, CA and namespace.
pub const TOKEN_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The name prefix of the injected volume.
pub const VOLUME_PREFIX: &str = "kube-api-access-";
/// The token lifetime the injected projection asks for (kube-apiserver's
/// `WarnOnlyBoundTokenExpirationSeconds`).
pub const TOKEN_EXPIRATION_SECONDS: i64 = 3607;
/// Mirror pods (from static manifests) are left alone, as upstream does.
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// The projected volume kube-apiserver injects, named `name`.
pub fn api_access_volume(name: &str) -> Value {
    // Keys in the order kube-apiserver serialises them (Go struct order).
    json!({
        "name": name,
        "projected": {
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": TOKEN_EXPIRATION_SECONDS, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
            ],
            "defaultMode": 420
        }
    })
}

/// Admits a new pod (already defaulted). `service_account` looks up a ServiceAccount by
/// namespace and name; `suffix` yields the volume name's random part.
pub fn admit_pod(
    pod: &mut Value,
    service_account: impl Fn(&str, &str) -> Option<Value>,
    suffix: impl FnOnce() -> String,
) {
    if pod
        .pointer(&format!(
            "/metadata/annotations/{}",
            MIRROR_ANNOTATION.replace('/', "~1")
        ))
        .is_some()
    {
        return;
    }
    if !pod["spec"].is_object() {
        return;
    }
    let name = pod["spec"]["serviceAccountName"]
        .as_str()
        .filter(|s| !s.is_empty())
        .unwrap_or("default")
        .to_owned();
    pod["spec"]["serviceAccountName"] = json!(name);
    pod["spec"]["serviceAccount"] = json!(name);
    let namespace = pod["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default")
        .to_owned();
    let Some(account) = service_account(&namespace, &name) else {
        return;
    };
    let automount = pod["spec"]["automountServiceAccountToken"]
        .as_bool()
        .or_else(|| account["automountServiceAccountToken"].as_bool())
        .unwrap_or(true);
    if !automount {
        return;
    }
    let spec = &mut pod["spec"];
    let existing = spec["volumes"].as_array().and_then(|vs| {
        vs.iter()
            .filter_map(|v| v["name"].as_str())
            .find(|n| n.starts_with(VOLUME_PREFIX))
            .map(str::to_owned)
    });
    let volume = existing
        .clone()
        .unwrap_or_else(|| format!("{VOLUME_PREFIX}{}", suffix()));
    let mount = json!({"name": volume, "readOnly": true, "mountPath": TOKEN_MOUNT_PATH});
    let mut needed = false;
    for list in ["initContainers", "containers"] {
        for container in spec[list].as_array_mut().into_iter().flatten() {
            let mounted = container["volumeMounts"]
                .as_array()
                .is_some_and(|ms| ms.iter().any(|m| m["mountPath"] == TOKEN_MOUNT_PATH));
            if mounted {
                continue;
            }
            if !container["volumeMounts"].is_array() {
                container["volumeMounts"] = json!([]);
            }
            if let Some(mounts) = container["volumeMounts"].as_array_mut() {
                mounts.push(mount.clone());
            }
            needed = true;
        }
    }
    if needed && existing.is_none() {
        if !spec["volumes"].is_array() {
            spec["volumes"] = json!([]);
        }
        if let Some(volumes) = spec["volumes"].as_array_mut() {
            volumes.push(api_access_volume(&volume));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admit(pod: Value, account: Option<Value>) -> Value {
        let mut pod = pod;
        admit_pod(&mut pod, |_, _| account.clone(), || "abcde".to_owned());
        pod
    }

    fn pod(spec: Value) -> Value {
        json!({"metadata": {"name": "p", "namespace": "shop"}, "spec": spec})
    }

    #[test]
    fn injects_the_token_volume_like_upstream() {
        let admitted = admit(
            pod(
                json!({"containers": [{"name": "a"}, {"name": "b", "volumeMounts": [
                    {"name": "own", "mountPath": TOKEN_MOUNT_PATH}]}],
                "initContainers": [{"name": "i"}]}),
            ),
            Some(json!({"metadata": {"name": "default"}})),
        );
        expect_test::expect![[r#"
            {
              "metadata": {
                "name": "p",
                "namespace": "shop"
              },
              "spec": {
                "containers": [
                  {
                    "name": "a",
                    "volumeMounts": [
                      {
                        "name": "kube-api-access-abcde",
                        "readOnly": true,
                        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"
                      }
                    ]
                  },
                  {
                    "name": "b",
                    "volumeMounts": [
                      {
                        "name": "own",
                        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"
                      }
                    ]
                  }
                ],
                "initContainers": [
                  {
                    "name": "i",
                    "volumeMounts": [
                      {
                        "name": "kube-api-access-abcde",
                        "readOnly": true,
                        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"
                      }
                    ]
                  }
                ],
                "serviceAccountName": "default",
                "serviceAccount": "default",
                "volumes": [
                  {
                    "name": "kube-api-access-abcde",
                    "projected": {
                      "sources": [
                        {
                          "serviceAccountToken": {
                            "expirationSeconds": 3607,
                            "path": "token"
                          }
                        },
                        {
                          "configMap": {
                            "name": "kube-root-ca.crt",
                            "items": [
                              {
                                "key": "ca.crt",
                                "path": "ca.crt"
                              }
                            ]
                          }
                        },
                        {
                          "downwardAPI": {
                            "items": [
                              {
                                "path": "namespace",
                                "fieldRef": {
                                  "apiVersion": "v1",
                                  "fieldPath": "metadata.namespace"
                                }
                              }
                            ]
                          }
                        }
                      ],
                      "defaultMode": 420
                    }
                  }
                ]
              }
            }"#]]
        .assert_eq(&serde_json::to_string_pretty(&admitted).expect("json"));
    }

    #[test]
    fn automount_opt_outs_and_missing_accounts() {
        let has_volume = |p: &Value| p["spec"]["volumes"].is_array();
        let account = json!({"metadata": {"name": "robot"}});
        let off = json!({"metadata": {"name": "robot"}, "automountServiceAccountToken": false});
        let plain = || pod(json!({"serviceAccountName": "robot", "containers": [{"name": "a"}]}));
        assert!(has_volume(&admit(plain(), Some(account.clone()))));
        assert!(!has_volume(&admit(plain(), Some(off.clone()))));
        assert!(!has_volume(&admit(plain(), None)), "unknown account");
        let mut opt_in = plain();
        opt_in["spec"]["automountServiceAccountToken"] = json!(true);
        assert!(
            has_volume(&admit(opt_in, Some(off))),
            "the pod's own setting wins"
        );
        let mut opt_out = plain();
        opt_out["spec"]["automountServiceAccountToken"] = json!(false);
        assert!(!has_volume(&admit(opt_out, Some(account.clone()))));
        let admitted = admit(plain(), None);
        assert_eq!(admitted["spec"]["serviceAccount"], "robot");
        let mut mirror = plain();
        mirror["metadata"]["annotations"] = json!({MIRROR_ANNOTATION: "x"});
        assert!(!has_volume(&admit(mirror, Some(account))));
    }
}
