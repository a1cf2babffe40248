//! What every reconciler and the authentication service share: the client, this cluster's
//! identity, settings, published facts and metrics.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tether_api::ClusterId;

use crate::identity::Identity;
use crate::metrics::Metrics;

/// Field manager of every server-side apply the controller does.
pub const FIELD_MANAGER: &str = "tether-controller";

/// Settings from the command line.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The namespace Tether runs in.
    pub namespace: String,
    /// The controller's ServiceAccount (bound in tenant namespaces).
    pub service_account: String,
    /// The authentication Service's name.
    pub auth_service: String,
    /// Lifetime asked for consumers' certificates.
    pub identity_lifetime: Duration,
    /// API server URL given to consumers, overriding discovery.
    pub api_server_url: Option<String>,
    /// Authentication URL to publish, overriding discovery.
    pub auth_url: Option<String>,
    /// How often a consumer checks its provider's API server.
    pub ping_interval: Duration,
    /// The image of gateway Deployments.
    pub gateway_image: String,
    /// This pod's IP, which virtual nodes publish as their address.
    pub pod_ip: Option<String>,
    /// How strictly consumers' ShadowPods are held to their grants here.
    pub resource_enforcement: tether_resources::Enforcement,
    /// Where the admission webhook listens; not served when absent.
    pub webhook_listen: Option<std::net::SocketAddr>,
    /// Where the virtual nodes' kubelet API (logs, exec, attach, port-forward) listens; not
    /// served when absent.
    pub kubelet_listen: Option<std::net::SocketAddr>,
}

/// Facts the publisher discovers and the authentication service hands out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Published {
    /// The API server URL peers should use.
    pub api_server_url: Option<String>,
    /// The authentication service's URL.
    pub auth_url: Option<String>,
}

/// Shared state.
pub struct Ctx {
    /// The Kubernetes client.
    pub client: kube::Client,
    /// This cluster's identity.
    pub identity: Arc<Identity>,
    /// Settings.
    pub settings: Settings,
    /// The authentication certificate's fingerprint.
    pub auth_fingerprint: String,
    /// Metrics.
    pub metrics: Metrics,
    published: Mutex<Published>,
}

impl Ctx {
    /// Shared state for one controller process.
    pub fn new(
        client: kube::Client,
        identity: Arc<Identity>,
        settings: Settings,
        auth_fingerprint: String,
        metrics: Metrics,
    ) -> Self {
        Self {
            client,
            identity,
            settings,
            auth_fingerprint,
            metrics,
            published: Mutex::new(Published::default()),
        }
    }

    /// This cluster's ID.
    pub fn cluster_id(&self) -> &ClusterId {
        &self.identity.cluster_id
    }

    /// The current published facts.
    pub fn published(&self) -> Published {
        self.published
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Replaces the published facts.
    pub fn set_published(&self, p: Published) {
        *self
            .published
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = p;
    }
}
