//! The provider's twin namespaces: a consumer asks, with a NamespaceOffloading in its tenant
//! namespace here, for a namespace of this cluster that stands for one of its own; this
//! reconciler creates it, binds the consumer's identity there, reports the name, and deletes
//! it (and with it the pods it holds) when the request goes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{RoleBinding, RoleRef, Subject};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event, finalizer};
use tether_api::ClusterId;
use tether_api::authentication::{Tenant, TenantCondition};
use tether_api::conditions::{self, Status, Time, types};
use tether_api::names::{self, SYSTEM_NAMESPACE, TENANT_NAMESPACE_PREFIX, finalizers, labels};
use tether_api::offloading::{
    NamespaceMappingStrategy, NamespaceOffloading, NamespaceOffloadingSpec,
    NamespaceOffloadingStatus,
};

use super::OffCtx;
use crate::Error;
use crate::context::FIELD_MANAGER;

/// `status.offloadingPhase` of a request whose twin exists and is bound.
pub const PHASE_READY: &str = "Ready";
/// `status.offloadingPhase` of a request that cannot be served as it is.
pub const PHASE_FAILED: &str = "Failed";
/// `status.offloadingPhase` while an earlier twin of the same name is still being deleted.
pub const PHASE_IN_PROGRESS: &str = "InProgress";

/// The longest namespace name Kubernetes accepts (a DNS-1123 label).
const MAX_NAME: usize = 63;

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// Why a request cannot get a twin: a condition reason and a message for the consumer's user.
pub type Refusal = (&'static str, String);

/// How often a refused request is looked at again when the refusal rests on this cluster's
/// state rather than on the request: nothing that could lift it (a provider's own namespace
/// deleted, a tenant peering again) is an event of the request, and a consumer re-sending an
/// unchanged request is no event either.
pub const RETRY_REFUSED: Duration = Duration::from_secs(10);

/// When to look at a request refused for `reason` again; `None` when only a change of the
/// request itself can lift the refusal.
pub fn retry_refused(reason: &str) -> Option<Duration> {
    match reason {
        "NamespaceTaken" | "UnknownConsumer" | "TenantNotActive" => Some(RETRY_REFUSED),
        _ => None,
    }
}

/// The twin's name for the consumer namespace `origin` of `consumer`, as `spec` asks.
pub fn twin_name(
    origin: &str,
    consumer: &ClusterId,
    spec: &NamespaceOffloadingSpec,
) -> Result<String, Refusal> {
    let name = match spec.namespace_mapping_strategy {
        NamespaceMappingStrategy::DefaultName => shortened(&format!("{origin}-{consumer}")),
        NamespaceMappingStrategy::EnforceSameName => origin.to_owned(),
        NamespaceMappingStrategy::SelectedName => match spec.remote_namespace_name.as_deref() {
            Some(n) if !n.is_empty() => n.to_owned(),
            _ => {
                return Err((
                    "MissingRemoteNamespaceName",
                    "namespaceMappingStrategy SelectedName needs spec.remoteNamespaceName; set it \
                     or choose DefaultName"
                        .to_owned(),
                ));
            }
        },
    };
    if !is_label(&name) {
        return Err((
            "InvalidName",
            format!(
                "{name:?} is not a valid namespace name (lowercase letters, digits and '-', at \
                 most {MAX_NAME}, starting and ending with a letter or digit); choose \
                 SelectedName with a valid spec.remoteNamespaceName"
            ),
        ));
    }
    // Names this cluster's own machinery gives meaning to: a consumer must never get one, even
    // while it does not exist yet (a tenant namespace made early would be taken over later).
    if name.starts_with(TENANT_NAMESPACE_PREFIX)
        || name.starts_with("kube-")
        || name == "default"
        || name == SYSTEM_NAMESPACE
    {
        return Err((
            "InvalidName",
            format!(
                "namespace {name} is reserved on the provider; choose SelectedName with another \
                 spec.remoteNamespaceName"
            ),
        ));
    }
    Ok(name)
}

/// `name` itself when it fits a namespace name; else cut, ending in `-` and 8 hex digits of
/// the SHA-256 of the whole name, so that long names stay distinct.
pub fn shortened(name: &str) -> String {
    if name.len() <= MAX_NAME {
        return name.to_owned();
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, name.as_bytes());
    let hex: String = digest.as_ref()[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    // Names are ASCII here (anything else fails the label check later), so bytes are chars.
    let keep = name.get(..MAX_NAME - 9).unwrap_or(name);
    format!("{}-{hex}", keep.trim_end_matches('-'))
}

/// Whether `s` is a DNS-1123 label, which every namespace name is.
fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// The labels of `consumer`'s twin of its namespace `origin`.
pub fn twin_labels(consumer: &ClusterId, origin: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::REMOTE_CLUSTER_ID.to_owned(), consumer.to_string()),
        (labels::ORIGIN_NAMESPACE.to_owned(), origin.to_owned()),
        (
            labels::MANAGED_BY.to_owned(),
            labels::MANAGED_BY_VALUE.to_owned(),
        ),
    ])
}

/// The consumer a namespace is a twin for: one Tether made, which is not a tenant namespace.
pub fn twin_consumer(ns: &Namespace) -> Option<&str> {
    let l = ns.metadata.labels.as_ref()?;
    if l.contains_key(labels::TENANT_NAMESPACE)
        || !l.contains_key(labels::ORIGIN_NAMESPACE)
        || l.get(labels::MANAGED_BY).map(String::as_str) != Some(labels::MANAGED_BY_VALUE)
    {
        return None;
    }
    l.get(labels::REMOTE_CLUSTER_ID).map(String::as_str)
}

/// Whether `ns` is `consumer`'s twin of `origin`.
fn is_twin_of(ns: &Namespace, consumer: &ClusterId, origin: &str) -> bool {
    twin_consumer(ns) == Some(consumer.as_str())
        && ns
            .labels()
            .get(labels::ORIGIN_NAMESPACE)
            .map(String::as_str)
            == Some(origin)
}

/// Why `consumer` may not use this cluster now, if it may not: no Tenant, or one being
/// revoked. `cordoned_too` also refuses a cordoned or drained Tenant (no new workloads).
/// It reads the watched Tenants, since a burst of pods asks once per pod.
pub(super) async fn tenant_refusal(
    octx: &OffCtx,
    consumer: &str,
    cordoned_too: bool,
) -> Result<Option<Refusal>, Error> {
    let unknown = || {
        Some((
            "UnknownConsumer",
            format!(
                "{consumer} is not an active tenant of this cluster; peer with it (again) first"
            ),
        ))
    };
    let Ok(id) = ClusterId::new(consumer) else {
        return Ok(unknown());
    };
    let tenant = octx.local.get::<Tenant>(None, id.as_str()).await?;
    Ok(match tenant.as_deref() {
        None => unknown(),
        Some(t) if t.metadata.deletion_timestamp.is_some() => unknown(),
        Some(t) if cordoned_too && t.spec.tenant_condition != TenantCondition::Active => Some((
            "TenantNotActive",
            format!(
                "tenant {id} is {:?} on this cluster: it takes no new pods until an admin \
                 makes it Active again",
                t.spec.tenant_condition
            ),
        )),
        Some(_) => None,
    })
}

/// Reconciles one NamespaceOffloading; only those in tenant namespaces are requests to this
/// cluster as a provider.
pub async fn reconcile(req: Arc<NamespaceOffloading>, octx: Arc<OffCtx>) -> Result<Action, Error> {
    let started = Instant::now();
    let ns = req.namespace().unwrap_or_default();
    let Some(consumer) = ns
        .strip_prefix(TENANT_NAMESPACE_PREFIX)
        .and_then(|c| ClusterId::new(c).ok())
    else {
        return Ok(Action::await_change());
    };
    let result = reconcile_request(req, &octx, &consumer, &ns).await;
    octx.ctx
        .metrics
        .reconciled("twinnamespace", result.as_ref().err(), started.elapsed());
    match result {
        Err(e) if e.api_status() == Some(409) => Ok(Action::requeue(Duration::from_millis(200))),
        other => other,
    }
}

async fn reconcile_request(
    req: Arc<NamespaceOffloading>,
    octx: &OffCtx,
    consumer: &ClusterId,
    ns: &str,
) -> Result<Action, Error> {
    let client = &octx.ctx.client;
    // The finalizer goes only once the twin is gone: its pods must not outlive the request.
    if req.metadata.deletion_timestamp.is_some()
        && req
            .finalizers()
            .iter()
            .any(|f| f == finalizers::TWIN_NAMESPACE)
        && twin_still_there(client, &req, consumer).await?
    {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let api: Api<NamespaceOffloading> = Api::namespaced(client.clone(), ns);
    finalizer(&api, finalizers::TWIN_NAMESPACE, req, |event| async {
        match event {
            Event::Apply(r) => apply(&r, octx, consumer).await,
            Event::Cleanup(r) => {
                tracing::info!(request = %r.name_any(), %consumer, "twin namespace released");
                Ok(Action::await_change())
            }
        }
    })
    .await
    .map_err(Error::finalizer("NamespaceOffloading"))
}

/// Deletes the request's twin if it is still there (and this consumer's); whether it is.
async fn twin_still_there(
    client: &kube::Client,
    req: &NamespaceOffloading,
    consumer: &ClusterId,
) -> Result<bool, Error> {
    let origin = req.name_any();
    let recorded = req
        .status
        .as_ref()
        .and_then(|s| s.remote_namespace_name.clone());
    let Some(name) = recorded.or_else(|| twin_name(&origin, consumer, &req.spec).ok()) else {
        return Ok(false);
    };
    delete_twin(client, &name, consumer, &origin).await
}

/// Deletes `name` if it is `consumer`'s twin of `origin` (never anyone else's namespace);
/// whether it still exists.
async fn delete_twin(
    client: &kube::Client,
    name: &str,
    consumer: &ClusterId,
    origin: &str,
) -> Result<bool, Error> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let Some(twin) = namespaces
        .get_opt(name)
        .await
        .map_err(Error::kube(format!("reading namespace {name}")))?
    else {
        return Ok(false);
    };
    if !is_twin_of(&twin, consumer, origin) {
        return Ok(false);
    }
    if twin.metadata.deletion_timestamp.is_none() {
        match namespaces.delete(name, &DeleteParams::default()).await {
            Ok(_) => tracing::info!(namespace = %name, %consumer, "deleting twin namespace"),
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(false),
            Err(e) => return Err(Error::kube(format!("deleting namespace {name}"))(e)),
        }
    }
    Ok(true)
}

async fn apply(
    req: &NamespaceOffloading,
    octx: &OffCtx,
    consumer: &ClusterId,
) -> Result<Action, Error> {
    let client = &octx.ctx.client;
    let origin = req.name_any();
    if let Some(refusal) = tenant_refusal(octx, consumer.as_str(), false).await? {
        return failed(octx, req, None, refusal).await;
    }
    let name = match twin_name(&origin, consumer, &req.spec) {
        Ok(n) => n,
        Err(refusal) => return failed(octx, req, None, refusal).await,
    };
    // A changed mapping leaves the earlier twin behind: it goes, with its pods.
    if let Some(old) = req
        .status
        .as_ref()
        .and_then(|s| s.remote_namespace_name.as_deref())
        && old != name
        && delete_twin(client, old, consumer, &origin).await?
    {
        return in_progress(
            octx,
            req,
            &name,
            format!("the earlier twin namespace {old} is being deleted"),
        )
        .await;
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let existing = namespaces
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!("reading namespace {name}")))?;
    match existing {
        Some(ns) if !is_twin_of(&ns, consumer, &origin) => {
            let refusal = (
                "NamespaceTaken",
                format!(
                    "namespace {name} already exists on this cluster and is not the twin of \
                     {consumer}'s namespace {origin}; choose namespaceMappingStrategy \
                     SelectedName with a free spec.remoteNamespaceName"
                ),
            );
            return failed(octx, req, None, refusal).await;
        }
        Some(ns) if ns.metadata.deletion_timestamp.is_some() => {
            return in_progress(
                octx,
                req,
                &name,
                format!("the twin namespace {name} of an earlier request is still being deleted"),
            )
            .await;
        }
        Some(_) => {}
        None => {
            let twin = Namespace {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    labels: Some(twin_labels(consumer, &origin)),
                    ..Default::default()
                },
                ..Default::default()
            };
            // A create, not an apply: an apply would adopt a namespace made in between.
            match namespaces.create(&PostParams::default(), &twin).await {
                Ok(_) => {
                    tracing::info!(namespace = %name, %consumer, %origin, "twin namespace created");
                }
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    return Ok(Action::requeue(Duration::from_millis(200)));
                }
                Err(e) => return Err(Error::kube(format!("creating namespace {name}"))(e)),
            }
        }
    }
    bind_consumer(client, &name, consumer).await?;
    let message = format!(
        "namespace {name} stands for {consumer}'s namespace {origin}; {consumer}'s identity is \
         bound to {} there",
        names::objects::TENANT_OFFLOADED_ROLE
    );
    report(
        octx,
        req,
        Some(&name),
        PHASE_READY,
        Status::True,
        "TwinReady",
        message,
    )
    .await?;
    Ok(Action::await_change())
}

/// Binds the consumer's username to the offloaded-tenant role inside its twin.
async fn bind_consumer(client: &kube::Client, ns: &str, consumer: &ClusterId) -> Result<(), Error> {
    let binding = RoleBinding {
        metadata: ObjectMeta {
            name: Some(names::objects::TENANT_ROLE.to_owned()),
            namespace: Some(ns.to_owned()),
            labels: Some(crate::namespaces::peer_labels(consumer)),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".to_owned(),
            kind: "ClusterRole".to_owned(),
            name: names::objects::TENANT_OFFLOADED_ROLE.to_owned(),
        },
        subjects: Some(vec![Subject {
            kind: "User".to_owned(),
            name: names::consumer_username(consumer),
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            namespace: None,
        }]),
    };
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .patch(
            names::objects::TENANT_ROLE,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&binding),
        )
        .await
        .map_err(Error::kube(format!("binding consumer {consumer} in {ns}")))?;
    Ok(())
}

async fn failed(
    octx: &OffCtx,
    req: &NamespaceOffloading,
    name: Option<&str>,
    (reason, message): Refusal,
) -> Result<Action, Error> {
    let shown = message.clone();
    // Logged when it is news, not at every retry.
    if report(
        octx,
        req,
        name,
        PHASE_FAILED,
        Status::False,
        reason,
        message,
    )
    .await?
    {
        tracing::info!(request = %req.name_any(), namespace = ?req.namespace(), %reason, message = %shown, "twin namespace refused");
    }
    Ok(retry_refused(reason).map_or_else(Action::await_change, Action::requeue))
}

async fn in_progress(
    octx: &OffCtx,
    req: &NamespaceOffloading,
    name: &str,
    message: String,
) -> Result<Action, Error> {
    report(
        octx,
        req,
        Some(name),
        PHASE_IN_PROGRESS,
        Status::False,
        "Terminating",
        format!("{message}; retrying"),
    )
    .await?;
    Ok(Action::requeue(Duration::from_secs(1)))
}

/// The request's status: the twin's name (kept from before when `name` is `None`), the
/// phase, and the `Ready` condition.
pub fn status(
    previous: Option<&NamespaceOffloadingStatus>,
    name: Option<&str>,
    phase: &str,
    (ready, reason, message): (Status, &str, String),
    generation: Option<i64>,
    at: Time,
) -> NamespaceOffloadingStatus {
    let mut next = previous.cloned().unwrap_or_default();
    if let Some(n) = name {
        next.remote_namespace_name = Some(n.to_owned());
    }
    next.offloading_phase = Some(phase.to_owned());
    conditions::set(
        &mut next.conditions,
        types::READY,
        ready,
        reason,
        message,
        generation,
        at,
    );
    next
}

/// Writes the request's status; whether it changed.
async fn report(
    octx: &OffCtx,
    req: &NamespaceOffloading,
    name: Option<&str>,
    phase: &str,
    ready: Status,
    reason: &str,
    message: String,
) -> Result<bool, Error> {
    let next = status(
        req.status.as_ref(),
        name,
        phase,
        (ready, reason, message),
        req.metadata.generation,
        now(),
    );
    if req.status.as_ref() == Some(&next) {
        return Ok(false);
    }
    let ns = req.namespace().unwrap_or_default();
    let mut obj = req.clone();
    obj.status = Some(next);
    Api::<NamespaceOffloading>::namespaced(octx.ctx.client.clone(), &ns)
        .replace_status(&req.name_any(), &PostParams::default(), &obj)
        .await
        .map_err(Error::kube(format!(
            "writing the status of NamespaceOffloading {ns}/{}",
            req.name_any()
        )))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(strategy: NamespaceMappingStrategy, selected: Option<&str>) -> NamespaceOffloadingSpec {
        NamespaceOffloadingSpec {
            pod_offloading_strategy: Default::default(),
            namespace_mapping_strategy: strategy,
            remote_namespace_name: selected.map(str::to_owned),
            cluster_selector: BTreeMap::new(),
        }
    }

    fn id(s: &str) -> ClusterId {
        ClusterId::new(s).expect("id")
    }

    #[test]
    fn twins_are_named_by_strategy() {
        let c = id("consumer-1");
        let name = |s, sel, origin| twin_name(origin, &c, &spec(s, sel));
        assert_eq!(
            name(NamespaceMappingStrategy::DefaultName, None, "shop"),
            Ok("shop-consumer-1".to_owned())
        );
        assert_eq!(
            name(NamespaceMappingStrategy::EnforceSameName, None, "shop"),
            Ok("shop".to_owned())
        );
        assert_eq!(
            name(
                NamespaceMappingStrategy::SelectedName,
                Some("there"),
                "shop"
            ),
            Ok("there".to_owned())
        );
        let missing = name(NamespaceMappingStrategy::SelectedName, None, "shop").unwrap_err();
        assert_eq!(missing.0, "MissingRemoteNamespaceName");
        for reserved in ["tether-tenant-x", "kube-system", "default", "tether-system"] {
            let refused = name(
                NamespaceMappingStrategy::SelectedName,
                Some(reserved),
                "shop",
            )
            .unwrap_err();
            assert_eq!(refused.0, "InvalidName", "{reserved}");
            assert!(refused.1.contains(reserved), "{refused:?}");
        }
        let bad = name(
            NamespaceMappingStrategy::SelectedName,
            Some("Not_A-Label"),
            "shop",
        )
        .unwrap_err();
        assert_eq!(bad.0, "InvalidName");
    }

    #[test]
    fn long_default_names_are_cut_and_stay_distinct() {
        let c = id("consumer-1");
        let origin_a = format!("{}a", "n".repeat(55));
        let origin_b = format!("{}b", "n".repeat(55));
        let a = twin_name(
            &origin_a,
            &c,
            &spec(NamespaceMappingStrategy::DefaultName, None),
        )
        .expect("named");
        let b = twin_name(
            &origin_b,
            &c,
            &spec(NamespaceMappingStrategy::DefaultName, None),
        )
        .expect("named");
        assert_eq!(a.len(), MAX_NAME);
        assert_ne!(a, b, "the hash keeps cut names apart");
        assert_eq!(a[..54], b[..54], "the cut prefix is the same");
        let full = format!("{origin_a}-consumer-1");
        let digest = ring::digest::digest(&ring::digest::SHA256, full.as_bytes());
        let want: String = digest.as_ref()[..4]
            .iter()
            .map(|x| format!("{x:02x}"))
            .collect();
        assert_eq!(&a[MAX_NAME - 9..], format!("-{want}"));
        assert!(is_label(&a));
        // Exactly at the limit nothing is cut.
        let at_limit = "x".repeat(MAX_NAME);
        assert_eq!(shortened(&at_limit), at_limit);
        // A cut landing on '-' does not make a double dash before the hash.
        let dashy = format!("{}-{}", "y".repeat(53), "z".repeat(20));
        let cut = shortened(&dashy);
        assert!(!cut.contains("--"), "{cut}");
        assert!(is_label(&cut));
    }

    #[test]
    fn only_tether_made_twins_count_as_twins() {
        let c = id("consumer-1");
        let ns = |l: BTreeMap<String, String>| Namespace {
            metadata: ObjectMeta {
                name: Some("shop-consumer-1".into()),
                labels: Some(l),
                ..Default::default()
            },
            ..Default::default()
        };
        let twin = ns(twin_labels(&c, "shop"));
        assert!(is_twin_of(&twin, &c, "shop"));
        assert!(!is_twin_of(&twin, &c, "other"));
        assert!(!is_twin_of(&twin, &id("consumer-2"), "shop"));
        let mut tenant = twin_labels(&c, "shop");
        tenant.insert(labels::TENANT_NAMESPACE.into(), "true".into());
        assert_eq!(twin_consumer(&ns(tenant)), None);
        let mut foreign = twin_labels(&c, "shop");
        foreign.remove(labels::MANAGED_BY);
        assert_eq!(twin_consumer(&ns(foreign)), None);
    }

    #[test]
    fn refusals_resting_on_this_cluster_are_retried() {
        // A namespace of the provider's own may go; a tenant may come (back).
        for reason in ["NamespaceTaken", "UnknownConsumer", "TenantNotActive"] {
            assert_eq!(retry_refused(reason), Some(RETRY_REFUSED), "{reason}");
        }
        // Only a new spec can fix these, and a new spec is an event.
        for reason in ["InvalidName", "MissingRemoteNamespaceName"] {
            assert_eq!(retry_refused(reason), None, "{reason}");
        }
        let c = id("consumer-1");
        let invalid = twin_name(
            "Bad",
            &c,
            &spec(NamespaceMappingStrategy::EnforceSameName, None),
        )
        .unwrap_err();
        assert_eq!(retry_refused(invalid.0), None, "{invalid:?}");
    }

    #[test]
    fn status_keeps_the_name_and_the_transition_time() {
        let t = |s| Time(k8s_openapi::jiff::Timestamp::from_second(s).expect("time"));
        let ready = status(
            None,
            Some("shop-c"),
            PHASE_READY,
            (Status::True, "TwinReady", "ok".into()),
            Some(1),
            t(10),
        );
        assert_eq!(ready.remote_namespace_name.as_deref(), Some("shop-c"));
        assert_eq!(ready.offloading_phase.as_deref(), Some("Ready"));
        let again = status(
            Some(&ready),
            None,
            PHASE_READY,
            (Status::True, "TwinReady", "ok".into()),
            Some(1),
            t(20),
        );
        assert_eq!(again, ready, "nothing changed, nothing to write");
        let failed = status(
            Some(&ready),
            None,
            PHASE_FAILED,
            (Status::False, "NamespaceTaken", "taken".into()),
            Some(2),
            t(30),
        );
        assert_eq!(failed.remote_namespace_name.as_deref(), Some("shop-c"));
        let c = conditions::find(&failed.conditions, types::READY).expect("ready");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "NamespaceTaken")
        );
        assert_eq!(c.last_transition_time, t(30));
    }
}
