//! The error type of this crate: a quantity that cannot be read, and where it was found.

/// A Kubernetes quantity that could not be turned into an [`crate::Amount`].
///
/// The wrapping variants keep the inner error as a plain field (not a `source`) and print it
/// inline, so that `anyhow`'s `{:#}` does not repeat it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// The text does not follow the quantity grammar.
    #[error(
        "{input:?} is not a quantity: {problem}; use a number with a suffix such as 500m, 2, 4Gi"
    )]
    Malformed {
        /// The text as given.
        input: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The value is well formed but does not fit the arithmetic (about 1.7e35 base units, counted in thousandths).
    #[error("{input:?} is out of range: quantities must stay below 1.7e35 base units")]
    OutOfRange {
        /// The text as given.
        input: String,
    },
    /// A quantity in a resource list, e.g. a request.
    #[error("resource {resource:?}: {error}")]
    Resource {
        /// The resource name (`cpu`, `memory`, ...).
        resource: String,
        /// What is wrong with its quantity.
        error: Box<QuantityError>,
    },
    /// A node's allocatable quantity; that node cannot be counted in the capacity.
    #[error(
        "node {node:?}: allocatable {resource:?}: {error}; fix the node status or cordon the node"
    )]
    Node {
        /// The node name.
        node: String,
        /// The resource name.
        resource: String,
        /// What is wrong with its quantity.
        error: Box<QuantityError>,
    },
    /// A quantity in a pod spec.
    #[error("{field}[{resource:?}]: {error}")]
    Pod {
        /// Where in the pod, e.g. `container "app" resources.requests` or `spec.overhead`.
        field: String,
        /// The resource name.
        resource: String,
        /// What is wrong with its quantity.
        error: Box<QuantityError>,
    },
}

/// A string that is none of the [`crate::Enforcement`] modes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{input:?} is not a resource enforcement mode; use one of none, soft, hard")]
pub struct EnforcementParseError {
    /// The text as given.
    pub input: String,
}
