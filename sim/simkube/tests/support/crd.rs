//! Installing a CustomResourceDefinition in a test cluster and addressing its objects.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, ApiResource, GroupVersionKind, PostParams};

/// Creates the CRD that `definition` describes and returns how to address the objects of its
/// first version.
pub(crate) async fn install(client: &Client, definition: serde_json::Value) -> ApiResource {
    let crd: CustomResourceDefinition = serde_json::from_value(definition).expect("crd");
    Api::<CustomResourceDefinition>::all(client.clone())
        .create(&PostParams::default(), &crd)
        .await
        .expect("create CRD");
    let version = &crd.spec.versions.first().expect("a version").name;
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(&crd.spec.group, version, &crd.spec.names.kind),
        &crd.spec.names.plural,
    )
}
