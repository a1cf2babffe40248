//! Named amounts (`cpu`, `memory`, `pods`, ...) and what a provider's nodes can offer.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::{Amount, QuantityError};

/// Amounts by resource name (`cpu`, `memory`, `pods`, `ephemeral-storage`, extended resources
/// such as `nvidia.com/gpu`). A missing name counts as zero.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resources(pub BTreeMap<String, Amount>);

impl Resources {
    /// Reads a Kubernetes resource list; the error names the resource whose quantity is bad.
    pub fn from_quantities(q: &BTreeMap<String, Quantity>) -> Result<Self, QuantityError> {
        q.iter()
            .map(|(name, quantity)| {
                Amount::parse(&quantity.0)
                    .map(|amount| (name.clone(), amount))
                    .map_err(|error| QuantityError::Resource {
                        resource: name.clone(),
                        error: Box::new(error),
                    })
            })
            .collect::<Result<_, _>>()
            .map(Resources)
    }

    /// A Kubernetes resource list with every amount in canonical form.
    pub fn to_quantities(&self) -> BTreeMap<String, Quantity> {
        self.0
            .iter()
            .map(|(name, amount)| (name.clone(), Quantity(amount.render())))
            .collect()
    }

    /// Adds `other` entry by entry.
    pub fn add(&mut self, other: &Resources) {
        // Saturating: no real cluster gets near i128, and a panic in a controller would be
        // worse than a clamped total.
        self.combine(other, i128::saturating_add);
    }

    /// Takes `other` away entry by entry, undoing an [`Resources::add`] of it: a running
    /// total can then follow items that come and go without adding them all up again.
    pub fn subtract(&mut self, other: &Resources) {
        self.combine(other, i128::saturating_sub);
    }

    /// Sets each entry of `other`'s names to `op(entry, other's amount)`, a missing entry
    /// counting as zero.
    fn combine(&mut self, other: &Resources, op: fn(i128, i128) -> i128) {
        for (name, amount) in &other.0 {
            // A name is copied only the first time: admission adds up every pod of a grant.
            let entry = match self.0.get_mut(name) {
                Some(entry) => entry,
                None => self.0.entry(name.clone()).or_default(),
            };
            entry.0 = op(entry.0, amount.0);
        }
    }

    /// The entry-by-entry total of `items`.
    pub fn sum<'a>(items: impl IntoIterator<Item = &'a Resources>) -> Resources {
        let mut total = Resources::default();
        for item in items {
            total.add(item);
        }
        total
    }

    /// The amount of `name`, zero when absent.
    pub fn get(&self, name: &str) -> Amount {
        self.0.get(name).copied().unwrap_or_default()
    }

    /// Whether no resource has a positive amount.
    pub fn is_empty(&self) -> bool {
        self.0.values().all(|amount| amount.0 <= 0)
    }
}

impl FromIterator<(String, Amount)> for Resources {
    fn from_iter<I: IntoIterator<Item = (String, Amount)>>(iter: I) -> Self {
        Resources(iter.into_iter().collect())
    }
}

/// `cpu=2, memory=4Gi, pods=10`, sorted by name; `none` when there are no entries.
impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        for (i, (name, amount)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{name}={amount}")?;
        }
        Ok(())
    }
}

/// The facts about one provider node that decide whether, and how much, it counts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeFacts {
    /// The node name, for errors.
    pub name: String,
    /// `status.allocatable`.
    pub allocatable: BTreeMap<String, Quantity>,
    /// The `Ready` condition is `True`.
    pub ready: bool,
    /// `spec.unschedulable` (cordoned).
    pub unschedulable: bool,
    /// A virtual node standing for another cluster; counting it would re-offer a peer's
    /// resources as our own.
    pub virtual_node: bool,
}

/// What a provider can offer: the total allocatable of its Ready, schedulable, non-virtual
/// nodes. A counted node with an unreadable allocatable is an error naming node and resource.
pub fn capacity(nodes: &[NodeFacts]) -> Result<Resources, QuantityError> {
    let mut total = Resources::default();
    for node in nodes
        .iter()
        .filter(|n| n.ready && !n.unschedulable && !n.virtual_node)
    {
        for (resource, quantity) in &node.allocatable {
            let amount = Amount::parse(&quantity.0).map_err(|error| QuantityError::Node {
                node: node.name.clone(),
                resource: resource.clone(),
                error: Box::new(error),
            })?;
            total.add(&Resources(BTreeMap::from([(resource.clone(), amount)])));
        }
    }
    Ok(total)
}
