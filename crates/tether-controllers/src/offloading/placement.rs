//! Pure placement of a new pod of an offloaded namespace, as the pod admission webhook
//! applies it: the toleration of the virtual nodes' taint and, where the strategy or the
//! cluster selector restricts where the pod may go, required node affinity. The result is a
//! JSON patch (RFC 6902) against the pod as it was admitted.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod,
    Toleration,
};
use serde_json::{Value, json};
use tether_api::names::{labels, taints};
use tether_api::offloading::PodOffloadingStrategy;

fn toleration() -> Toleration {
    Toleration {
        key: Some(taints::NOT_ALLOWED.to_owned()),
        operator: Some("Exists".to_owned()),
        effect: Some("NoExecute".to_owned()),
        ..Default::default()
    }
}

fn requirement(key: &str, operator: &str, values: &[&str]) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.to_owned(),
        operator: operator.to_owned(),
        values: Some(values.iter().map(|v| (*v).to_owned()).collect()),
    }
}

/// Each existing term (or one empty term) extended with `extra`: the pod keeps every
/// constraint it had, and gains ours in every alternative.
fn extend_terms(
    terms: &[NodeSelectorTerm],
    extra: &[NodeSelectorRequirement],
) -> Vec<NodeSelectorTerm> {
    let base = if terms.is_empty() {
        vec![NodeSelectorTerm::default()]
    } else {
        terms.to_vec()
    };
    base.into_iter()
        .map(|mut t| {
            t.match_expressions
                .get_or_insert_with(Vec::new)
                .extend(extra.iter().cloned());
            t
        })
        .collect()
}

/// The JSON patch that places `pod` under `strategy` and `selector` (labels of the virtual
/// nodes allowed; any when empty). Empty when nothing changes: `Local`, or a pod already
/// bound to a node.
pub fn patch(
    pod: &Pod,
    strategy: PodOffloadingStrategy,
    selector: &BTreeMap<String, String>,
) -> Vec<Value> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    if strategy == PodOffloadingStrategy::Local || spec.node_name.is_some() {
        return Vec::new();
    }
    let mut ops = Vec::new();
    let tolerated = spec.tolerations.iter().flatten().any(|t| {
        t.key.as_deref() == Some(taints::NOT_ALLOWED)
            && t.operator.as_deref() == Some("Exists")
            && t.effect.as_deref().is_none_or(|e| e == "NoExecute")
    });
    if !tolerated {
        let mut ts = spec.tolerations.clone().unwrap_or_default();
        ts.push(toleration());
        ops.push(json!({
            "op": if spec.tolerations.is_some() { "replace" } else { "add" },
            "path": "/spec/tolerations",
            "value": ts,
        }));
    }
    let selected: Vec<NodeSelectorRequirement> = selector
        .iter()
        .map(|(k, v)| requirement(k, "In", &[v]))
        .collect();
    let virtual_only = requirement(labels::TYPE, "In", &[labels::TYPE_VIRTUAL_NODE]);
    let real_only = requirement(labels::TYPE, "NotIn", &[labels::TYPE_VIRTUAL_NODE]);
    let existing: Vec<NodeSelectorTerm> = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| r.node_selector_terms.clone())
        .unwrap_or_default();
    let terms = match strategy {
        PodOffloadingStrategy::Remote => {
            let mut extra = vec![virtual_only];
            extra.extend(selected);
            Some(extend_terms(&existing, &extra))
        }
        // Anywhere, but on virtual nodes only those selected: the pod's own terms twice, once
        // for this cluster's nodes and once for the selected virtual nodes.
        PodOffloadingStrategy::LocalAndRemote if !selected.is_empty() => {
            let mut extra = vec![virtual_only];
            extra.extend(selected);
            let mut t = extend_terms(&existing, &[real_only]);
            t.extend(extend_terms(&existing, &extra));
            Some(t)
        }
        _ => None,
    };
    if let Some(terms) = terms {
        let mut affinity: Affinity = spec.affinity.clone().unwrap_or_default();
        let node: &mut NodeAffinity = affinity.node_affinity.get_or_insert_with(Default::default);
        node.required_during_scheduling_ignored_during_execution = Some(NodeSelector {
            node_selector_terms: terms,
        });
        ops.push(json!({
            "op": if spec.affinity.is_some() { "replace" } else { "add" },
            "path": "/spec/affinity",
            "value": affinity,
        }));
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;
    use k8s_openapi::api::core::v1::{Container, PodSpec};

    fn pod(affinity: Option<Affinity>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "app".into(),
                    ..Default::default()
                }],
                affinity,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn show(ops: &[Value]) -> String {
        serde_json::to_string(ops).expect("json")
    }

    #[test]
    fn local_pods_and_bound_pods_are_left_alone() {
        assert!(patch(&pod(None), PodOffloadingStrategy::Local, &BTreeMap::new()).is_empty());
        let mut bound = pod(None);
        bound.spec.as_mut().unwrap().node_name = Some("n1".into());
        assert!(patch(&bound, PodOffloadingStrategy::Remote, &BTreeMap::new()).is_empty());
    }

    #[test]
    fn local_and_remote_only_tolerates_the_virtual_nodes() {
        expect![[r#"[{"op":"add","path":"/spec/tolerations","value":[{"effect":"NoExecute","key":"virtual-node.tether.dev/not-allowed","operator":"Exists"}]}]"#]]
            .assert_eq(&show(&patch(
                &pod(None),
                PodOffloadingStrategy::LocalAndRemote,
                &BTreeMap::new(),
            )));
    }

    #[test]
    fn remote_requires_a_virtual_node_in_every_term_the_pod_had() {
        let own = Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: vec![
                        NodeSelectorTerm {
                            match_expressions: Some(vec![requirement("disk", "In", &["ssd"])]),
                            ..Default::default()
                        },
                        NodeSelectorTerm {
                            match_expressions: Some(vec![requirement("gpu", "Exists", &[])]),
                            ..Default::default()
                        },
                    ],
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let ops = patch(
            &pod(Some(own)),
            PodOffloadingStrategy::Remote,
            &BTreeMap::from([("region".to_owned(), "eu".to_owned())]),
        );
        expect![[r#"[{"op":"add","path":"/spec/tolerations","value":[{"effect":"NoExecute","key":"virtual-node.tether.dev/not-allowed","operator":"Exists"}]},{"op":"replace","path":"/spec/affinity","value":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"disk","operator":"In","values":["ssd"]},{"key":"tether.dev/type","operator":"In","values":["virtual-node"]},{"key":"region","operator":"In","values":["eu"]}]},{"matchExpressions":[{"key":"gpu","operator":"Exists","values":[]},{"key":"tether.dev/type","operator":"In","values":["virtual-node"]},{"key":"region","operator":"In","values":["eu"]}]}]}}}}]"#]]
            .assert_eq(&show(&ops));
    }

    #[test]
    fn local_and_remote_with_a_selector_allows_local_nodes_or_the_selected_virtual_ones() {
        let ops = patch(
            &pod(None),
            PodOffloadingStrategy::LocalAndRemote,
            &BTreeMap::from([("region".to_owned(), "eu".to_owned())]),
        );
        expect![[r#"[{"op":"add","path":"/spec/tolerations","value":[{"effect":"NoExecute","key":"virtual-node.tether.dev/not-allowed","operator":"Exists"}]},{"op":"add","path":"/spec/affinity","value":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"tether.dev/type","operator":"NotIn","values":["virtual-node"]}]},{"matchExpressions":[{"key":"tether.dev/type","operator":"In","values":["virtual-node"]},{"key":"region","operator":"In","values":["eu"]}]}]}}}}]"#]]
            .assert_eq(&show(&ops));
    }

    #[test]
    fn an_already_tolerating_pod_gets_no_second_toleration() {
        let mut p = pod(None);
        p.spec.as_mut().unwrap().tolerations = Some(vec![toleration()]);
        assert!(patch(&p, PodOffloadingStrategy::LocalAndRemote, &BTreeMap::new()).is_empty());
    }
}
