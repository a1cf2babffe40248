//! Authentication between clusters: the protocol, the provider's service and issuer, and the
//! consumer's client.

pub mod client;
pub mod csr;
pub mod issuer;
pub mod protocol;
pub mod ratelimit;
pub mod server;
pub mod tls;
