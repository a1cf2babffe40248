//! Clients for providers' API servers, built from the identity each provider issued (the
//! kubeconfig Secret in the consumer's tenant namespace) and shared by the peering,
//! networking and offloading modules, so one provider has one connection pool.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde::Serialize;
use tether_api::ClusterId;
use tether_api::names::{self, objects};
use tether_runtime::transport::{self, Protocols};

use crate::kubeconfig::Stored;
use crate::offloading::watched::{Watchable, Watched};
use crate::{Error, applied};

/// Clients for providers' API servers, rebuilt when the kubeconfig Secret changes.
#[derive(Default)]
pub struct ProviderClients {
    by_cluster: Mutex<HashMap<String, (String, Clients)>>,
    /// The last answer of [`ProviderClients::access`] per provider, with when it was read.
    recent: Mutex<HashMap<String, (Instant, Option<Access>)>>,
}

/// How long [`ProviderClients::recent_access`] reuses an answer.
const RECENT: Duration = Duration::from_secs(2);

/// The two clients of one identity at a provider.
#[derive(Clone)]
pub struct Clients {
    /// Requests and watches, over HTTP/2 where the provider offers it.
    pub api: kube::Client,
    /// Requests upgraded to a stream (exec, attach, port-forward), over HTTP/1.1.
    pub upgrades: kube::Client,
}

/// What this cluster may reach at one provider: a client with the identity the provider
/// issued, and the tenant namespace that identity is confined to there.
#[derive(Clone)]
pub struct Access {
    /// The client.
    pub client: kube::Client,
    /// The client for upgraded requests, with the same identity.
    pub upgrades: kube::Client,
    /// The tenant namespace at the provider.
    pub namespace: String,
    /// Which identity the client holds (the kubeconfig Secret's resource version): what was
    /// opened with an older one is opened again.
    pub version: String,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl ProviderClients {
    /// The client for `cluster` whose kubeconfig Secret is at `version`; built once per
    /// version.
    pub async fn get(
        &self,
        cluster: &str,
        version: &str,
        kubeconfig: &str,
    ) -> Result<kube::Client, String> {
        Ok(self.clients(cluster, version, kubeconfig).await?.api)
    }

    /// Both clients for `cluster` whose kubeconfig Secret is at `version`; built once per
    /// version.
    pub async fn clients(
        &self,
        cluster: &str,
        version: &str,
        kubeconfig: &str,
    ) -> Result<Clients, String> {
        if let Some((v, c)) = self
            .by_cluster
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(cluster)
            && v == version
        {
            return Ok(c.clone());
        }
        let parsed = kube::config::Kubeconfig::from_yaml(kubeconfig)
            .map_err(|e| format!("the stored kubeconfig is unreadable: {e}"))?;
        let config = kube::Config::from_custom_kubeconfig(
            parsed,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .map_err(|e| format!("the stored kubeconfig is unusable: {e}"))?;
        let build = |protocols| {
            transport::client(&config, protocols).map_err(|e| format!("building a client: {e}"))
        };
        let clients = Clients {
            api: build(Protocols::Negotiated)?,
            upgrades: build(Protocols::Http1)?,
        };
        self.by_cluster
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(cluster.to_owned(), (version.to_owned(), clients.clone()));
        Ok(clients)
    }

    /// Drops the client of `cluster` (its identity was replaced or revoked).
    pub fn forget(&self, cluster: &str) {
        self.by_cluster
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(cluster);
        self.recent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(cluster);
    }

    /// [`ProviderClients::access`], read again at most every two seconds: for the passes
    /// over every pod of a virtual node, where a burst would otherwise read the same Secret
    /// once per pod. A new identity is in use two seconds later at most.
    pub async fn recent_access(
        &self,
        local: &kube::Client,
        provider: &ClusterId,
    ) -> Result<Option<Access>, Error> {
        if let Some((at, access)) = self
            .recent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(provider.as_str())
            && at.elapsed() < RECENT
        {
            return Ok(access.clone());
        }
        let access = self.access(local, provider).await?;
        self.recent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                provider.as_str().to_owned(),
                (Instant::now(), access.clone()),
            );
        Ok(access)
    }

    /// The access to `provider` from its stored identity; `None` while there is none (not
    /// authenticated yet, or unpeered: the tenant namespace holding it is gone).
    pub async fn access(
        &self,
        local: &kube::Client,
        provider: &ClusterId,
    ) -> Result<Option<Access>, Error> {
        let ns = names::tenant_namespace(provider);
        let secret = match Api::<Secret>::namespaced(local.clone(), &ns)
            .get_opt(objects::PROVIDER_KUBECONFIG_SECRET)
            .await
        {
            Ok(s) => s,
            // Access to a tenant namespace is bound inside it: none once it is going away.
            Err(kube::Error::Api(e)) if e.code == 403 => None,
            Err(e) => {
                return Err(Error::kube(format!(
                    "reading the kubeconfig Secret for {provider}"
                ))(e));
            }
        };
        let Some(secret) = secret else {
            return Ok(None);
        };
        let version = secret.metadata.resource_version.clone().unwrap_or_default();
        let Some(stored) = Stored::from_secret(&secret) else {
            return Ok(None);
        };
        let clients = self
            .clients(provider.as_str(), &version, &stored.kubeconfig)
            .await
            .map_err(|e| Error::Invalid(format!("the identity issued by {provider}: {e}")))?;
        Ok(Some(Access {
            client: clients.api,
            upgrades: clients.upgrades,
            namespace: stored.remote_namespace,
            version,
        }))
    }
}

/// How a pass reaches a provider's objects.
#[derive(Clone, Copy)]
pub enum Remote<'a> {
    /// Reads each object with a request: a one-off pass (`tether peer --in-band`, with an
    /// admin client of the provider).
    Direct(&'a kube::Client),
    /// Reads the controller's watched copies and writes only what differs from them, so that
    /// the passes of a steady peering, which re-assert the same intent every few seconds,
    /// send nothing over the link.
    Watched {
        /// The open watches.
        watched: &'a Watched,
        /// The provider.
        id: &'a ClusterId,
        /// The identity it issued, and the tenant namespace there.
        access: &'a Access,
    },
}

impl Remote<'_> {
    /// The client the writes go through.
    pub fn client(&self) -> &kube::Client {
        match self {
            Self::Direct(c) => c,
            Self::Watched { access, .. } => &access.client,
        }
    }

    /// The `K` named `name` in `ns` there. Through watches, the first read of a kind in a
    /// namespace waits for the watch's first listing.
    pub async fn get<K: Watchable>(&self, ns: &str, name: &str) -> Result<Option<K>, kube::Error> {
        match self {
            Self::Direct(c) => Api::<K>::namespaced((*c).clone(), ns).get_opt(name).await,
            Self::Watched {
                watched,
                id,
                access,
            } => match watched.get::<K>(id, access, ns, name).await {
                Ok(found) => Ok(found.map(|k| (*k).clone())),
                Err(e) => Err(kube::Error::Service(Box::new(e))),
            },
        }
    }

    /// Server-side applies `body` to the `K` named `name` in `ns` there, unless the watched
    /// copy already holds all of it ([`applied::holds`]); the object as it now stands.
    pub async fn apply<K: Watchable + Serialize>(
        &self,
        ns: &str,
        name: &str,
        params: &PatchParams,
        body: &impl Serialize,
    ) -> Result<K, kube::Error> {
        let body = serde_json::to_value(body).map_err(kube::Error::SerdeError)?;
        if matches!(self, Self::Watched { .. })
            && let Some(current) = self.get::<K>(ns, name).await?
            && applied::holds_in(&body, &current)
        {
            return Ok(current);
        }
        Api::<K>::namespaced(self.client().clone(), ns)
            .patch(name, params, &Patch::Apply(&body))
            .await
    }

    /// Deletes the `K` named `name` in `ns` there, if it is there (a 404 is success).
    /// Through watches, one the copy does not show is not asked for.
    pub async fn delete<K: Watchable>(&self, ns: &str, name: &str) -> Result<(), kube::Error> {
        if matches!(self, Self::Watched { .. }) && self.get::<K>(ns, name).await?.is_none() {
            return Ok(());
        }
        match Api::<K>::namespaced(self.client().clone(), ns)
            .delete(name, &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(e),
        }
    }
}
