//! This cluster's own CIDRs, as `tether install` recorded them in the `tether-network`
//! ConfigMap.

use std::collections::BTreeMap;

use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use tether_api::ClusterId;
use tether_api::names::{network, objects};
use tether_api::networking::{Cidrs, ClusterCidrs};

use crate::Error;
use crate::context::Ctx;

/// This cluster's CIDRs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalNetwork {
    /// Pod CIDRs.
    pub pod: Vec<Ipv4Net>,
    /// Service CIDRs.
    pub service: Vec<Ipv4Net>,
    /// The external CIDR, if one is set.
    pub external: Option<Ipv4Net>,
    /// Where colliding peer CIDRs are remapped (`tether install --remap-pool`); RFC 1918 when
    /// absent.
    pub remap_pool: Option<Ipv4Net>,
}

impl LocalNetwork {
    /// Reads the ConfigMap's data. Names the key and value that are wrong.
    pub fn from_data(data: &BTreeMap<String, String>) -> Result<Self, String> {
        let list = |key: &str| -> Result<Vec<Ipv4Net>, String> {
            data.get(key)
                .map(String::as_str)
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| parse_cidr(key, s))
                .collect()
        };
        let pod = list(network::POD_CIDRS)?;
        if pod.is_empty() {
            return Err(format!(
                "ConfigMap {}: {} is empty; reinstall with `tether install --pod-cidr CIDR`",
                objects::NETWORK_CONFIGMAP,
                network::POD_CIDRS
            ));
        }
        let external = match list(network::EXTERNAL_CIDR)?.as_slice() {
            [] => None,
            [one] => Some(*one),
            _ => {
                return Err(format!(
                    "ConfigMap {}: {} holds more than one CIDR",
                    objects::NETWORK_CONFIGMAP,
                    network::EXTERNAL_CIDR
                ));
            }
        };
        let service = list(network::SERVICE_CIDRS)?;
        let remap_pool = match list(network::REMAP_POOL)?.as_slice() {
            [] => None,
            [one] => Some(*one),
            _ => {
                return Err(format!(
                    "ConfigMap {}: {} holds more than one CIDR; reinstall with `tether install \
                     --remap-pool CIDR`",
                    objects::NETWORK_CONFIGMAP,
                    network::REMAP_POOL
                ));
            }
        };
        // `tether install` refuses this; a hand-edited ConfigMap would remap peers onto
        // addresses of this cluster's own pods or Services.
        if let Some(pool) = remap_pool
            && let Some(own) = pod
                .iter()
                .chain(&service)
                .chain(&external)
                .find(|c| overlaps(**c, pool))
        {
            return Err(format!(
                "ConfigMap {}: {} {pool} overlaps this cluster's CIDR {own}; reinstall with \
                 `tether install --remap-pool CIDR` and a CIDR apart from it",
                objects::NETWORK_CONFIGMAP,
                network::REMAP_POOL
            ));
        }
        Ok(Self {
            pod,
            service,
            external,
            remap_pool,
        })
    }

    /// The CIDRs as a Configuration carries them.
    pub fn to_cluster_cidrs(&self, id: &ClusterId) -> ClusterCidrs {
        ClusterCidrs {
            cluster_id: id.to_string(),
            cidr: Cidrs {
                pod: self.pod.iter().map(ToString::to_string).collect(),
                service: self.service.iter().map(ToString::to_string).collect(),
                external: self.external.iter().map(ToString::to_string).collect(),
            },
        }
    }

    /// Everything a peer's local view must not overlap.
    pub fn reserved(&self) -> Vec<Ipv4Net> {
        self.pod
            .iter()
            .chain(&self.service)
            .chain(&self.external)
            .copied()
            .collect()
    }
}

fn overlaps(a: Ipv4Net, b: Ipv4Net) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

fn parse_cidr(key: &str, text: &str) -> Result<Ipv4Net, String> {
    let net: Ipv4Net = text.parse().map_err(|_| {
        format!(
            "ConfigMap {}: {key} holds {text:?}, which is not an IPv4 CIDR",
            objects::NETWORK_CONFIGMAP
        )
    })?;
    if net.trunc() != net {
        return Err(format!(
            "ConfigMap {}: {key} holds {text}, which has host bits set (did you mean {}?)",
            objects::NETWORK_CONFIGMAP,
            net.trunc()
        ));
    }
    Ok(net)
}

/// Reads this cluster's CIDRs. `Ok(Err(message))` when the ConfigMap is missing or wrong: a
/// condition to show, not a reason to retry fast.
pub async fn load(ctx: &Ctx) -> Result<Result<LocalNetwork, String>, Error> {
    load_in(&ctx.client, &ctx.settings.namespace).await
}

/// [`load`] with a client and Tether's namespace.
pub async fn load_in(
    client: &kube::Client,
    namespace: &str,
) -> Result<Result<LocalNetwork, String>, Error> {
    let cm = Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .get_opt(objects::NETWORK_CONFIGMAP)
        .await
        .map_err(Error::kube(format!(
            "reading ConfigMap {}",
            objects::NETWORK_CONFIGMAP
        )))?;
    Ok(match cm {
        None => Err(format!(
            "ConfigMap {}/{} is missing: this cluster's pod CIDR is unknown; run `tether install` \
             again (it detects the CIDR or takes --pod-cidr)",
            namespace,
            objects::NETWORK_CONFIGMAP
        )),
        Some(cm) => LocalNetwork::from_data(&cm.data.unwrap_or_default()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn reads_lists_and_names_what_is_wrong() {
        let ok = LocalNetwork::from_data(&data(&[
            ("podCIDRs", "10.244.0.0/16, 10.245.0.0/16"),
            ("serviceCIDRs", "10.96.0.0/12"),
        ]))
        .unwrap();
        assert_eq!(ok.pod.len(), 2);
        assert_eq!(ok.reserved().len(), 3);
        assert_eq!(ok.external, None);
        assert_eq!(ok.remap_pool, None);
        let pooled = LocalNetwork::from_data(&data(&[
            ("podCIDRs", "10.244.0.0/16"),
            ("remapPool", "10.200.0.0/14"),
        ]))
        .unwrap();
        assert_eq!(pooled.remap_pool, Some("10.200.0.0/14".parse().unwrap()));
        let cases = [
            (vec![("serviceCIDRs", "10.96.0.0/12")], "podCIDRs is empty"),
            (vec![("podCIDRs", "10.244.0.0/33")], "not an IPv4 CIDR"),
            (
                vec![("podCIDRs", "10.244.1.0/16")],
                "did you mean 10.244.0.0/16",
            ),
            (
                vec![
                    ("podCIDRs", "10.244.0.0/16"),
                    ("externalCIDR", "10.70.0.0/16,10.71.0.0/16"),
                ],
                "more than one",
            ),
            (
                vec![("podCIDRs", "10.244.0.0/16"), ("remapPool", "10.0.0.0/8")],
                "remapPool 10.0.0.0/8 overlaps this cluster's CIDR 10.244.0.0/16",
            ),
            (
                vec![
                    ("podCIDRs", "10.244.0.0/16"),
                    ("serviceCIDRs", "10.96.0.0/12"),
                    ("remapPool", "10.100.0.0/16"),
                ],
                "overlaps this cluster's CIDR 10.96.0.0/12",
            ),
            (
                vec![("podCIDRs", "10.244.0.0/16"), ("remapPool", "10.7.0.1/16")],
                "did you mean 10.7.0.0/16",
            ),
        ];
        for (pairs, want) in cases {
            let err = LocalNetwork::from_data(&data(&pairs)).unwrap_err();
            assert!(err.contains(want), "{err}");
        }
    }
}
