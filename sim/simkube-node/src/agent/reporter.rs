//! Writes a pod's status whenever the agent's record of it changes.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::pod_status::{self, ContainerPhase, ContainerRecord, PodRecord};

use super::Ctx;

/// Writes the pod's status whenever the agent's record of it changes.
pub(super) struct Reporter {
    api: Api<Pod>,
    name: String,
    pub(super) record: PodRecord,
    last: Option<PodStatus>,
}

impl Reporter {
    pub(super) fn new(ctx: &Ctx, pod: &Pod) -> Self {
        let spec = pod.spec.as_ref();
        let mut reporter = Self {
            api: Api::namespaced(
                ctx.client.clone(),
                pod.metadata.namespace.as_deref().unwrap_or_default(),
            ),
            name: pod.metadata.name.clone().unwrap_or_default(),
            record: PodRecord {
                restart_policy: spec
                    .and_then(|s| s.restart_policy.clone())
                    .unwrap_or_else(|| "Always".to_owned()),
                pod_ip: None,
                host_ip: ctx.config.identity.internal_ip.to_string(),
                start_time: Timestamp::now(),
                init_containers: spec
                    .and_then(|s| s.init_containers.as_ref())
                    .map(|list| {
                        list.iter()
                            .map(|c| {
                                ContainerRecord::new(&c.name, c.image.as_deref().unwrap_or(""))
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                containers: spec
                    .map(|s| {
                        s.containers
                            .iter()
                            .map(|c| {
                                ContainerRecord::new(&c.name, c.image.as_deref().unwrap_or(""))
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            },
            last: None,
        };
        if !reporter.record.init_containers.is_empty() {
            for c in &mut reporter.record.containers {
                c.phase = ContainerPhase::Waiting {
                    reason: "PodInitializing".to_owned(),
                    message: None,
                };
            }
        }
        reporter
    }

    pub(super) async fn report(&mut self) {
        let status = pod_status::pod_status(&self.record, self.last.as_ref(), Timestamp::now());
        self.write(status).await;
    }

    pub(super) async fn sandbox_error(&mut self, message: &str) {
        let mut status = pod_status::pod_status(&self.record, self.last.as_ref(), Timestamp::now());
        status.message = Some(format!("cannot create the pod sandbox: {message}"));
        status.reason = Some("SandboxCreateFailed".to_owned());
        self.write(status).await;
    }

    async fn write(&mut self, status: PodStatus) {
        if self.last.as_ref() == Some(&status) {
            return;
        }
        let mut body = json!({ "status": status });
        // A merge patch keeps fields it does not mention: clear a past sandbox error explicitly.
        if let Some(fields) = body["status"].as_object_mut() {
            for field in ["reason", "message"] {
                fields.entry(field).or_insert(serde_json::Value::Null);
            }
        }
        let patch = Patch::Merge(body);
        match self
            .api
            .patch_status(&self.name, &PatchParams::default(), &patch)
            .await
        {
            Ok(_) => self.last = Some(status),
            Err(error) => tracing::warn!(pod = %self.name, %error, "cannot update pod status"),
        }
    }
}
