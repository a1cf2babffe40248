//! Namespace lifecycle controller: empties a terminating namespace, then finalizes it.
//!
//! A namespace being deleted (`deletionTimestamp` set, phase `Terminating`, `spec.finalizers`
//! holding `kubernetes`) has every object of every served namespaced type deleted, custom
//! resources included (the types come from discovery). Objects with finalizers are waited for.
//! Progress is reported in the same five `status.conditions` kube-controller-manager writes;
//! when nothing is left the `kubernetes` finalizer is removed through
//! `PUT /api/v1/namespaces/{name}/finalize` and the API server removes the namespace.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, NamespaceCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{ServedResource, deletable, discover, is_status};

/// The finalizer the namespace controller owns.
pub const KUBERNETES_FINALIZER: &str = "kubernetes";

/// How soon a namespace whose content is not gone yet is looked at again.
const REQUEUE: Duration = Duration::from_millis(500);

/// Errors of one reconcile pass.
#[derive(Debug, thiserror::Error)]
pub enum NamespaceError {
    /// The API server refused or failed a request.
    #[error("namespace controller: {0}")]
    Kube(#[from] kube::Error),
}

/// What a pass over a terminating namespace found, per resource type.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ContentReport {
    /// Types whose discovery failed (`group/version: error`).
    pub discovery_failures: Vec<String>,
    /// Types whose listing or deletion failed (`resource.group: error`).
    pub deletion_failures: Vec<String>,
    /// Objects still present, by `resource.group`.
    pub remaining: BTreeMap<String, usize>,
    /// Objects still present, by finalizer.
    pub finalizers: BTreeMap<String, usize>,
}

impl ContentReport {
    /// Whether the namespace may be finalized.
    pub fn done(&self) -> bool {
        self.discovery_failures.is_empty()
            && self.deletion_failures.is_empty()
            && self.remaining.is_empty()
    }
}

/// The conditions kube-controller-manager's namespace controller sets, in its order, with its
/// reasons and messages. `lastTransitionTime` is kept from `previous` when a condition's status
/// did not change.
pub fn conditions(
    report: &ContentReport,
    previous: &[NamespaceCondition],
    now: &Time,
) -> Vec<NamespaceCondition> {
    let mut out = Vec::new();
    let mut push = |type_: &str, failing: bool, reason: (&str, &str), message: String| {
        let status = if failing { "True" } else { "False" };
        let last = previous
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .and_then(|c| c.last_transition_time.clone())
            .unwrap_or_else(|| now.clone());
        out.push(NamespaceCondition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: Some(if failing { reason.0 } else { reason.1 }.to_owned()),
            message: Some(message),
            last_transition_time: Some(last),
        });
    };
    let discovery = &report.discovery_failures;
    push(
        "NamespaceDeletionDiscoveryFailure",
        !discovery.is_empty(),
        ("DiscoveryFailed", "ResourcesDiscovered"),
        if discovery.is_empty() {
            "All resources successfully discovered".to_owned()
        } else {
            format!(
                "Discovery failed for some groups, {} failing: {}",
                discovery.len(),
                discovery.join(", ")
            )
        },
    );
    push(
        "NamespaceDeletionGroupVersionParsingFailure",
        false,
        ("GroupVersionParsingFailed", "ParsedGroupVersions"),
        "All legacy kube types successfully parsed".to_owned(),
    );
    let failures = &report.deletion_failures;
    push(
        "NamespaceDeletionContentFailure",
        !failures.is_empty(),
        ("ContentDeletionFailed", "ContentDeleted"),
        if failures.is_empty() {
            "All content successfully deleted, may be waiting on finalization".to_owned()
        } else {
            format!(
                "Failed to delete all resource types, {} remaining: {}",
                failures.len(),
                failures.join(", ")
            )
        },
    );
    push(
        "NamespaceContentRemaining",
        !report.remaining.is_empty(),
        ("SomeResourcesRemain", "ContentRemoved"),
        if report.remaining.is_empty() {
            "All content successfully removed".to_owned()
        } else {
            let parts: Vec<String> = report
                .remaining
                .iter()
                .map(|(resource, n)| format!("{resource} has {n} resource instances"))
                .collect();
            format!("Some resources are remaining: {}", parts.join(", "))
        },
    );
    push(
        "NamespaceFinalizersRemaining",
        !report.finalizers.is_empty(),
        ("SomeFinalizersRemain", "ContentHasNoFinalizers"),
        if report.finalizers.is_empty() {
            "All content-preserving finalizers finished".to_owned()
        } else {
            let parts: Vec<String> = report
                .finalizers
                .iter()
                .map(|(finalizer, n)| format!("{finalizer} in {n} resource instances"))
                .collect();
            format!(
                "Some content in the namespace has finalizers remaining: {}",
                parts.join(", ")
            )
        },
    );
    out
}

/// Whether the namespace is waiting for this controller.
pub fn needs_cleanup(ns: &Namespace) -> bool {
    ns.metadata.deletion_timestamp.is_some()
        && ns
            .spec
            .as_ref()
            .and_then(|s| s.finalizers.as_ref())
            .is_some_and(|f| f.iter().any(|f| f == KUBERNETES_FINALIZER))
}

struct Context {
    client: Client,
}

/// Runs the namespace controller until `shutdown`.
pub async fn run(client: Client, shutdown: CancellationToken) {
    let api: Api<Namespace> = Api::all(client.clone());
    let context = Arc::new(Context { client });
    Controller::new(api, watcher::Config::default())
        .graceful_shutdown_on(shutdown.cancelled_owned())
        .run(reconcile, error_policy, context)
        .for_each(|_| async {})
        .await;
}

fn error_policy(_ns: Arc<Namespace>, error: &NamespaceError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "namespace controller pass failed; retrying");
    Action::requeue(Duration::from_secs(1))
}

async fn reconcile(ns: Arc<Namespace>, ctx: Arc<Context>) -> Result<Action, NamespaceError> {
    if !needs_cleanup(&ns) {
        return Ok(Action::await_change());
    }
    let name = ns.name_any();
    let report = delete_content(&ctx.client, &name).await;
    let api: Api<Namespace> = Api::all(ctx.client.clone());
    let previous = ns
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let now = Time(jiff::Timestamp::now());
    let wanted = conditions(&report, &previous, &now);
    if !same_conditions(&previous, &wanted) {
        let patch = json!({"status": {"conditions": wanted}});
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            Err(e) if is_status(&e, 404) => return Ok(Action::await_change()),
            Err(e) => return Err(e.into()),
        }
    }
    if !report.done() {
        return Ok(Action::requeue(REQUEUE));
    }
    finalize(&api, &name).await?;
    tracing::info!(namespace = %name, "namespace content removed; finalized");
    Ok(Action::await_change())
}

fn same_conditions(a: &[NamespaceCondition], b: &[NamespaceCondition]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.type_ == y.type_
                && x.status == y.status
                && x.reason == y.reason
                && x.message == y.message
        })
}

/// Removes the `kubernetes` finalizer through the `finalize` subresource.
async fn finalize(api: &Api<Namespace>, name: &str) -> Result<(), NamespaceError> {
    let Some(mut latest) = api.get_opt(name).await? else {
        return Ok(());
    };
    if !needs_cleanup(&latest) {
        return Ok(());
    }
    if let Some(spec) = latest.spec.as_mut() {
        let kept: Vec<String> = spec
            .finalizers
            .iter()
            .flatten()
            .filter(|f| f.as_str() != KUBERNETES_FINALIZER)
            .cloned()
            .collect();
        spec.finalizers = Some(kept);
    }
    match api
        .replace_subresource("finalize", name, &PostParams::default(), &latest)
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if is_status(&e, 404) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Deletes every namespaced object in `namespace` that is not already being deleted, and
/// reports what is left.
async fn delete_content(client: &Client, namespace: &str) -> ContentReport {
    let mut report = ContentReport::default();
    let resources = match discover(client).await {
        Ok(resources) => resources,
        Err(e) => {
            report.discovery_failures.push(e.to_string());
            return report;
        }
    };
    for resource in deletable(&resources).iter().filter(|r| r.namespaced) {
        if let Err(e) = delete_type(client, namespace, resource, &mut report).await {
            report
                .deletion_failures
                .push(format!("{}: {e}", resource_label(resource)));
        }
    }
    report
}

fn resource_label(resource: &ServedResource) -> String {
    format!("{}.{}", resource.api.plural, resource.api.group)
}

async fn delete_type(
    client: &Client,
    namespace: &str,
    resource: &ServedResource,
    report: &mut ContentReport,
) -> Result<(), kube::Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource.api);
    let listed = api.list_metadata(&ListParams::default()).await?;
    let mut touched = false;
    for item in &listed.items {
        if item.metadata.deletion_timestamp.is_some() {
            touched = true;
            continue;
        }
        let Some(name) = item.metadata.name.as_deref() else {
            continue;
        };
        touched = true;
        let params = DeleteParams {
            propagation_policy: Some(kube::api::PropagationPolicy::Background),
            ..DeleteParams::default()
        };
        match api.delete(name, &params).await {
            Ok(_) => {}
            Err(e) if is_status(&e, 404) || is_status(&e, 409) => {}
            Err(e) => return Err(e),
        }
    }
    if !touched {
        return Ok(());
    }
    let left = api.list_metadata(&ListParams::default()).await?;
    if !left.items.is_empty() {
        report
            .remaining
            .insert(resource_label(resource), left.items.len());
    }
    for item in &left.items {
        for finalizer in item.metadata.finalizers.iter().flatten() {
            *report.finalizers.entry(finalizer.clone()).or_default() += 1;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Time {
        Time(s.parse().expect("test timestamp"))
    }

    #[test]
    fn clean_namespace_reports_all_false() {
        let got = conditions(&ContentReport::default(), &[], &at("2025-01-01T00:00:00Z"));
        let summary: Vec<String> = got
            .iter()
            .map(|c| {
                format!(
                    "{} {} {} {}",
                    c.type_,
                    c.status,
                    c.reason.as_deref().unwrap_or(""),
                    c.message.as_deref().unwrap_or("")
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                "NamespaceDeletionDiscoveryFailure False ResourcesDiscovered All resources successfully discovered",
                "NamespaceDeletionGroupVersionParsingFailure False ParsedGroupVersions All legacy kube types successfully parsed",
                "NamespaceDeletionContentFailure False ContentDeleted All content successfully deleted, may be waiting on finalization",
                "NamespaceContentRemaining False ContentRemoved All content successfully removed",
                "NamespaceFinalizersRemaining False ContentHasNoFinalizers All content-preserving finalizers finished",
            ]
        );
    }

    #[test]
    fn remaining_content_and_finalizers_are_reported_like_the_real_controller() {
        let report = ContentReport {
            remaining: [
                ("configmaps.".to_owned(), 2),
                ("widgets.example.com".to_owned(), 1),
            ]
            .into_iter()
            .collect(),
            finalizers: [("example.com/hold".to_owned(), 1)].into_iter().collect(),
            ..ContentReport::default()
        };
        assert!(!report.done());
        let got = conditions(&report, &[], &at("2025-01-01T00:00:00Z"));
        assert_eq!(got[3].status, "True");
        assert_eq!(got[3].reason.as_deref(), Some("SomeResourcesRemain"));
        assert_eq!(
            got[3].message.as_deref(),
            Some(
                "Some resources are remaining: configmaps. has 2 resource instances, \
                 widgets.example.com has 1 resource instances"
            )
        );
        assert_eq!(got[4].reason.as_deref(), Some("SomeFinalizersRemain"));
        assert_eq!(
            got[4].message.as_deref(),
            Some(
                "Some content in the namespace has finalizers remaining: example.com/hold in 1 \
                 resource instances"
            )
        );
    }

    #[test]
    fn transition_time_is_kept_while_status_is_unchanged() {
        let report = ContentReport {
            remaining: [("pods.".to_owned(), 1)].into_iter().collect(),
            ..ContentReport::default()
        };
        let first = conditions(&report, &[], &at("2025-01-01T00:00:00Z"));
        let second = conditions(&report, &first, &at("2025-01-01T00:01:00Z"));
        assert_eq!(
            second[3].last_transition_time,
            Some(at("2025-01-01T00:00:00Z"))
        );
        let cleared = conditions(
            &ContentReport::default(),
            &second,
            &at("2025-01-01T00:02:00Z"),
        );
        assert_eq!(
            cleared[3].last_transition_time,
            Some(at("2025-01-01T00:02:00Z"))
        );
        assert_eq!(
            cleared[0].last_transition_time,
            Some(at("2025-01-01T00:00:00Z"))
        );
    }

    #[test]
    fn failures_block_finalization() {
        let report = ContentReport {
            deletion_failures: vec!["widgets.example.com: 500 boom".to_owned()],
            ..ContentReport::default()
        };
        assert!(!report.done());
        let got = conditions(&report, &[], &at("2025-01-01T00:00:00Z"));
        assert_eq!(
            got[2].message.as_deref(),
            Some("Failed to delete all resource types, 1 remaining: widgets.example.com: 500 boom")
        );
    }
}
