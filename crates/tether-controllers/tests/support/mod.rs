//! What the crate's in-process controller tests share: the settings of a controller replica
//! started against an in-process simkube.

use std::time::Duration;

use tether_api::names::objects;
use tether_controllers::context::Settings;

/// A replica's settings in `namespace`, giving peers `api_server_url`, with no webhook or
/// kubelet listener and a 2 s API-server check.
pub(crate) fn settings(namespace: &str, api_server_url: String) -> Settings {
    Settings {
        namespace: namespace.into(),
        service_account: objects::CONTROLLER.into(),
        auth_service: objects::AUTH_SERVICE.into(),
        identity_lifetime: Duration::from_secs(600),
        api_server_url: Some(api_server_url),
        auth_url: Some("https://127.0.0.1:1".into()),
        ping_interval: Duration::from_secs(2),
        gateway_image: objects::IMAGE.into(),
        pod_ip: None,
        webhook_listen: None,
        kubelet_listen: None,
        resource_enforcement: tether_resources::Enforcement::Soft,
    }
}
