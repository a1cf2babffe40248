//! The networking module of peering: this cluster's CIDRs, the remaps it chooses for each
//! peer (persisted in Configuration statuses), the gateways it runs as Deployments, and the
//! consumer's exchange of all of it with its provider through the tenant namespace.
//!
//! Who writes what, per peering (both sides alike, in the tenant namespace of the remote):
//! - a Configuration named after the remote cluster: `spec.local` (our CIDRs) and
//!   `spec.remote` (theirs); our remaps of theirs in the status. The consumer applies
//!   `spec.remote` of the copy in the provider's tenant namespace; the provider fills
//!   `spec.local` there, which is how the consumer learns the provider's CIDRs.
//! - a GatewayServer or GatewayClient named `tether-gateway`: the consumer creates the
//!   provider's one through its tenant identity and its own locally; each cluster's
//!   controller turns its own into a key Secret, a Deployment (and for a server a Service), and
//!   publishes the public key and endpoint in the status, which the consumer copies across.
//!
//! ExternalIPRemapping: an IP object (any namespace) gets a host of the external CIDR from
//! `ips`; each Configuration's status lists the assigned ones (`status.published`), which the
//! gateway of that namespace publishes to its peer.

pub mod configuration;
pub mod exchange;
pub mod external_ips;
pub mod gateway;
pub mod ips;
pub mod local;
pub mod remaps;
pub mod render;
pub mod server_side;
