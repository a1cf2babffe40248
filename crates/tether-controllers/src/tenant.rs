//! The provider side of a peering: a Tenant per consumer owns the consumer's access (its
//! tenant namespace and the RoleBinding that confines its identity there) and a ForeignCluster
//! that shows the consumer to this cluster's admins. Deleting the Tenant revokes everything.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::rbac::v1::{RoleBinding, RoleRef, Subject};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event, finalizer};
use tether_api::ClusterId;
use tether_api::authentication::{Tenant, TenantStatus};
use tether_api::conditions::{self, Status, Time, types};
use tether_api::core::{ForeignCluster, ForeignClusterSpec, Modules};
use tether_api::names::{self, finalizers, objects};

use crate::context::{Ctx, FIELD_MANAGER};
use crate::{Error, namespaces};

/// Gives `consumer` its namespace and binds its username to the tenant role there.
pub async fn grant(ctx: &Ctx, consumer: &ClusterId) -> Result<String, Error> {
    let ns = namespaces::ensure(ctx, consumer).await?;
    let binding = RoleBinding {
        metadata: ObjectMeta {
            name: Some(objects::TENANT_ROLE.to_owned()),
            namespace: Some(ns.clone()),
            labels: Some(namespaces::peer_labels(consumer)),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".to_owned(),
            kind: "ClusterRole".to_owned(),
            name: objects::TENANT_ROLE.to_owned(),
        },
        subjects: Some(vec![Subject {
            kind: "User".to_owned(),
            name: names::consumer_username(consumer),
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            namespace: None,
        }]),
    };
    Api::<RoleBinding>::namespaced(ctx.client.clone(), &ns)
        .patch(
            objects::TENANT_ROLE,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&binding),
        )
        .await
        .map_err(Error::kube(format!("binding consumer {consumer} in {ns}")))?;
    Ok(ns)
}

/// Removes `consumer`'s access: its RoleBinding first (its certificate is refused from then
/// on), then the namespace unless this cluster also consumes from it.
pub async fn revoke(ctx: &Ctx, consumer: &ClusterId) -> Result<(), Error> {
    let ns = names::tenant_namespace(consumer);
    match Api::<RoleBinding>::namespaced(ctx.client.clone(), &ns)
        .delete(objects::TENANT_ROLE, &DeleteParams::default())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => {
            return Err(Error::kube(format!(
                "unbinding consumer {consumer} in {ns}"
            ))(e));
        }
    }
    namespaces::release(ctx, consumer).await
}

/// Makes sure a ForeignCluster shows the consumer; an existing one (this cluster may also
/// consume from it) is left as it is.
async fn ensure_foreign_cluster(ctx: &Ctx, consumer: &ClusterId) -> Result<(), Error> {
    let api: Api<ForeignCluster> = Api::all(ctx.client.clone());
    let fc = ForeignCluster {
        metadata: ObjectMeta {
            name: Some(consumer.to_string()),
            labels: Some(namespaces::peer_labels(consumer)),
            ..Default::default()
        },
        spec: ForeignClusterSpec {
            cluster_id: consumer.to_string(),
            provider: None,
            modules: Modules::default(),
            networking: tether_api::core::NetworkingOptions::default(),
        },
        status: None,
    };
    match api.create(&PostParams::default(), &fc).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(Error::kube(format!("creating ForeignCluster {consumer}"))(
            e,
        )),
    }
}

/// Deletes the consumer's ForeignCluster when it exists only because of the Tenant.
async fn remove_foreign_cluster(ctx: &Ctx, consumer: &ClusterId) -> Result<(), Error> {
    let api: Api<ForeignCluster> = Api::all(ctx.client.clone());
    let Some(fc) = api
        .get_opt(consumer.as_str())
        .await
        .map_err(Error::kube(format!("reading ForeignCluster {consumer}")))?
    else {
        return Ok(());
    };
    if fc.spec.provider.is_some() {
        return Ok(());
    }
    match api
        .delete(consumer.as_str(), &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(format!("deleting ForeignCluster {consumer}"))(
            e,
        )),
    }
}

/// Reconciles one Tenant.
pub async fn reconcile(tenant: Arc<Tenant>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let started = Instant::now();
    let api: Api<Tenant> = Api::all(ctx.client.clone());
    let result = finalizer(&api, finalizers::TENANT, tenant, |event| async {
        match event {
            Event::Apply(t) => apply(&t, &ctx).await,
            Event::Cleanup(t) => cleanup(&t, &ctx).await,
        }
    })
    .await;
    let result = result.map_err(Error::finalizer("Tenant"));
    ctx.metrics
        .reconciled("tenant", result.as_ref().err(), started.elapsed());
    result
}

fn tenant_id(t: &Tenant) -> Result<ClusterId, Error> {
    let id = ClusterId::new(t.spec.cluster_id.clone())
        .map_err(|e| Error::Invalid(format!("Tenant {:?}: {e}", t.metadata.name)))?;
    if t.metadata.name.as_deref() != Some(id.as_str()) {
        return Err(Error::Invalid(format!(
            "Tenant {:?} must be named after its spec.clusterID {id}",
            t.metadata.name
        )));
    }
    Ok(id)
}

async fn apply(t: &Tenant, ctx: &Ctx) -> Result<Action, Error> {
    let id = tenant_id(t)?;
    let ns = grant(ctx, &id).await?;
    ensure_foreign_cluster(ctx, &id).await?;
    let user = names::consumer_username(&id);
    let generation = t.metadata.generation;
    update_status(ctx, &id, |status| {
        status.namespace = Some(ns.clone());
        status.username = Some(user.clone());
        conditions::set(
            &mut status.conditions,
            types::READY,
            Status::True,
            "Granted",
            format!(
                "namespace {ns} exists and the consumer's identity is bound to the tenant role there"
            ),
            generation,
            Time(k8s_openapi::jiff::Timestamp::now()),
        );
    })
    .await?;
    Ok(Action::requeue(Duration::from_secs(600)))
}

async fn cleanup(t: &Tenant, ctx: &Ctx) -> Result<Action, Error> {
    let id = tenant_id(t)?;
    revoke(ctx, &id).await?;
    remove_foreign_cluster(ctx, &id).await?;
    tracing::info!(consumer = %id, "tenant revoked");
    Ok(Action::await_change())
}

/// Changes a Tenant's status with `change`, reading it fresh and writing it with its
/// resourceVersion, so concurrent writers (the reconciler and the authentication service)
/// never lose each other's updates; retried on conflict.
pub async fn update_status(
    ctx: &Ctx,
    id: &ClusterId,
    change: impl Fn(&mut TenantStatus),
) -> Result<(), Error> {
    let api: Api<Tenant> = Api::all(ctx.client.clone());
    let context = format!("updating Tenant {id} status");
    for _ in 0..5 {
        let mut tenant = api
            .get_status(id.as_str())
            .await
            .map_err(Error::kube(context.clone()))?;
        let before = tenant.status.clone();
        change(tenant.status.get_or_insert_with(Default::default));
        if tenant.status == before {
            return Ok(());
        }
        match api
            .replace_status(id.as_str(), &PostParams::default(), &tenant)
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(Error::kube(context)(e)),
        }
    }
    Err(Error::Invalid(format!(
        "{context}: it kept changing; retrying"
    )))
}
