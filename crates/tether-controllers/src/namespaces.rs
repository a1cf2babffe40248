//! Tenant namespaces: one per remote cluster, shared by both directions of a peering, created
//! by whichever direction needs it first and removed when neither does.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{RoleBinding, RoleRef, Subject};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams};
use tether_api::ClusterId;
use tether_api::authentication::Tenant;
use tether_api::core::ForeignCluster;
use tether_api::names::{self, labels, objects};

use crate::Error;
use crate::context::{Ctx, FIELD_MANAGER};

/// Labels every per-peer object carries.
pub fn peer_labels(remote: &ClusterId) -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::REMOTE_CLUSTER_ID.to_owned(), remote.to_string()),
        (
            labels::MANAGED_BY.to_owned(),
            labels::MANAGED_BY_VALUE.to_owned(),
        ),
    ])
}

/// Creates (or keeps) the tenant namespace for `remote` and lets the controller manage
/// Secrets and Tether objects in it. Returns the namespace's name.
pub async fn ensure(ctx: &Ctx, remote: &ClusterId) -> Result<String, Error> {
    ensure_in(
        &ctx.client,
        remote,
        &ctx.settings.service_account,
        &ctx.settings.namespace,
    )
    .await
}

/// [`ensure`] with any client allowed to (`tether peer --in-band` prepares the namespaces of
/// both clusters with admin clients), binding the controller's ServiceAccount
/// `service_account` of namespace `controller_ns`. It applies as the controller does (same
/// field manager), so the controller later adopts what it finds without a change.
pub async fn ensure_in(
    client: &kube::Client,
    remote: &ClusterId,
    service_account: &str,
    controller_ns: &str,
) -> Result<String, Error> {
    let name = names::tenant_namespace(remote);
    let mut ns_labels = peer_labels(remote);
    ns_labels.insert(labels::TENANT_NAMESPACE.to_owned(), "true".to_owned());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(ns_labels),
            ..Default::default()
        },
        ..Default::default()
    };
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    Api::<Namespace>::all(client.clone())
        .patch(&name, &pp, &Patch::Apply(&ns))
        .await
        .map_err(Error::kube(format!("creating namespace {name}")))?;
    let binding = RoleBinding {
        metadata: ObjectMeta {
            name: Some(objects::CONTROLLER.to_owned()),
            namespace: Some(name.clone()),
            labels: Some(peer_labels(remote)),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".to_owned(),
            kind: "ClusterRole".to_owned(),
            name: objects::CONTROLLER_TENANT_ROLE.to_owned(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".to_owned(),
            name: service_account.to_owned(),
            namespace: Some(controller_ns.to_owned()),
            api_group: None,
        }]),
    };
    Api::<RoleBinding>::namespaced(client.clone(), &name)
        .patch(objects::CONTROLLER, &pp, &Patch::Apply(&binding))
        .await
        .map_err(Error::kube(format!(
            "binding the controller in namespace {name}"
        )))?;
    Ok(name)
}

/// Deletes the tenant namespace of `remote` unless a direction still uses it: a Tenant (the
/// remote consumes here) or a ForeignCluster with `spec.provider` that is not being deleted
/// (this cluster consumes there).
pub async fn release(ctx: &Ctx, remote: &ClusterId) -> Result<(), Error> {
    let tenant = Api::<Tenant>::all(ctx.client.clone())
        .get_opt(remote.as_str())
        .await
        .map_err(Error::kube(format!("reading Tenant {remote}")))?;
    let tenant_alive = tenant.is_some_and(|t| t.metadata.deletion_timestamp.is_none());
    let fc = Api::<ForeignCluster>::all(ctx.client.clone())
        .get_opt(remote.as_str())
        .await
        .map_err(Error::kube(format!("reading ForeignCluster {remote}")))?;
    let consuming =
        fc.is_some_and(|f| f.metadata.deletion_timestamp.is_none() && f.spec.provider.is_some());
    if tenant_alive || consuming {
        return Ok(());
    }
    let name = names::tenant_namespace(remote);
    match Api::<Namespace>::all(ctx.client.clone())
        .delete(&name, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(format!("deleting namespace {name}"))(e)),
    }
}
