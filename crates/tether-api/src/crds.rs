//! Every CustomResourceDefinition Tether installs, and their deterministic YAML form (the files
//! under `deploy/crds/`).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube_core::CustomResourceExt;

use crate::{authentication, core, networking, offloading};

/// Every CRD, in a fixed order (core first, then by group and kind).
pub fn all() -> Vec<CustomResourceDefinition> {
    let mut crds = vec![
        core::ForeignCluster::crd(),
        authentication::Tenant::crd(),
        authentication::ResourceSlice::crd(),
        networking::Configuration::crd(),
        networking::GatewayServer::crd(),
        networking::GatewayClient::crd(),
        networking::Connection::crd(),
        networking::IP::crd(),
        offloading::VirtualNode::crd(),
        offloading::NamespaceOffloading::crd(),
        offloading::ShadowPod::crd(),
    ];
    for crd in &mut crds {
        let labels = crd.metadata.labels.get_or_insert_with(Default::default);
        labels.insert(
            crate::names::labels::PART_OF.to_owned(),
            crate::names::labels::MANAGED_BY_VALUE.to_owned(),
        );
    }
    crds
}

/// The file name of a CRD under `deploy/crds/`: `<plural>.<group>.yaml`.
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}.yaml", crd.metadata.name.as_deref().unwrap_or("unnamed"))
}

/// The YAML form of a CRD, as written under `deploy/crds/`.
pub fn to_yaml(crd: &CustomResourceDefinition) -> Result<String, serde_yaml::Error> {
    let body = serde_yaml::to_string(crd)?;
    Ok(format!(
        "# Generated from crates/tether-api; do not edit. Regenerate with\n# `UPDATE_EXPECT=1 cargo test -p tether-api --test crds`.\n{body}"
    ))
}
