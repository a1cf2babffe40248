//! The Node object of the agent: registration, status posts and the heartbeat Lease.

use std::sync::Arc;
use std::time::Instant;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::node_status;

use super::{Ctx, FIELD_MANAGER};

pub(super) async fn register(ctx: &Ctx) -> Result<(), Error> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let node = node_status::node_object(&ctx.config.identity);
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {
            tracing::info!(node = %ctx.node(), "node already registered; taking it over");
        }
        Err(e) => return Err(Error::api(format!("register node {}", ctx.node()))(e)),
    }
    post_node_status(ctx, None).await.map(drop)
}

async fn post_node_status(
    ctx: &Ctx,
    previous: Option<&k8s_openapi::api::core::v1::NodeStatus>,
) -> Result<k8s_openapi::api::core::v1::NodeStatus, Error> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let status =
        node_status::node_status(&ctx.config.identity, previous, true, "", Timestamp::now());
    nodes
        .patch_status(
            ctx.node(),
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .map_err(Error::api(format!("update status of node {}", ctx.node())))?;
    Ok(status)
}

pub(super) async fn heartbeat(ctx: Arc<Ctx>, shutdown: CancellationToken) {
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), node_status::LEASE_NAMESPACE);
    let duration = i32::try_from(ctx.config.lease_duration.as_secs()).unwrap_or(i32::MAX);
    let mut status: Option<k8s_openapi::api::core::v1::NodeStatus> = None;
    let mut last_status = Instant::now();
    loop {
        let lease = node_status::lease(ctx.node(), duration, Timestamp::now());
        let params = PatchParams::apply(FIELD_MANAGER).force();
        if let Err(error) = leases
            .patch(ctx.node(), &params, &Patch::Apply(&lease))
            .await
        {
            tracing::warn!(node = %ctx.node(), %error, "cannot renew the node lease");
        }
        if status.is_none() || last_status.elapsed() >= ctx.config.status_interval {
            match post_node_status(&ctx, status.as_ref()).await {
                Ok(s) => {
                    status = Some(s);
                    last_status = Instant::now();
                }
                Err(Error::Api {
                    source: kube::Error::Api(s),
                    ..
                }) if s.code == 404 => {
                    // Someone deleted the Node: register again, as the kubelet does.
                    tracing::warn!(node = %ctx.node(), "node object deleted; registering again");
                    if let Err(error) = register(&ctx).await {
                        tracing::warn!(%error, "cannot register the node again");
                    }
                }
                Err(error) => tracing::warn!(%error, "cannot post node status"),
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(ctx.config.lease_renew) => {}
        }
    }
}
