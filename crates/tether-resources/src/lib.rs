//! Pure resource arithmetic for offloading: Kubernetes quantities as exact integers, what a
//! provider's nodes can offer, the provider's all-or-nothing decision on a consumer's request
//! (Liqo's ResourceSlice), and per-pod admission within the grant (Liqo's quota enforcement).
//! No IO: callers pass plain facts and act on the answers.
//!
//! # Model
//!
//! ```text
//!  consumer                         provider
//!  request (Resources) ──────────► decide(request, capacity(nodes), granted_to_others)
//!                                     │ Accept { grant = request }  │ Deny { reason, message }
//!  virtual node capacity = grant ◄────┘
//!  offloaded pod ────────────────► admit(pod, in_use, grant, enforcement)
//! ```
//!
//! Every amount is an [`Amount`]: thousandths of the base unit, so cpu, memory and extended
//! resources share one exact integer arithmetic.
//!
//! # Example
//!
//! ```
//! use std::collections::BTreeMap;
//! use tether_resources::{Amount, Decision, Resources, decide};
//!
//! let r = |cpu: &str, mem: &str| -> Resources {
//!     BTreeMap::from([
//!         ("cpu".to_owned(), Amount::parse(cpu).unwrap()),
//!         ("memory".to_owned(), Amount::parse(mem).unwrap()),
//!     ])
//!     .into_iter()
//!     .collect()
//! };
//! let decision = decide(&r("1500m", "2Gi"), &r("4", "8Gi"), &r("2", "1Gi"));
//! assert_eq!(decision, Decision::Accept { grant: r("1.5", "2048Mi") });
//! ```

mod decide;
mod error;
mod pod;
mod quantity;
mod resources;

pub use decide::{Decision, DenyReason, decide};
pub use error::{EnforcementParseError, QuantityError};
pub use pod::{Admission, Enforcement, admit, pod_requests};
pub use quantity::Amount;
pub use resources::{NodeFacts, Resources, capacity};
